"""Write a quantized checkpoint: load a checkpoint (a training run's --out folder, a
save_pretrained folder, or a Hugging Face GPT-2 or Llama directory) in fp32 as
examples/generate.py does, quantize its GEMM weights to --weights (nn/quant.py: every linear
weight, the token embedding, which GPT-2 ties to its LM head, and Llama's LM head), and write
--out. examples/generate.py --checkpoint OUT (nn.from_pretrained) then loads the codes and
scales as they are stored, never making an fp32 copy of those weights, and decodes the tokens
quantizing on load gives.

    python scripts/quantize.py --checkpoint out --weights int8 --out out-int8
    python scripts/quantize.py --checkpoint ~/models/gpt2 --weights int4 --group-size 64 \\
        --out gpt2-int4
    python examples/generate.py --checkpoint out-int8 --temperature 0

The layout of --out (nn/quant_checkpoint.py):
- config.json: the source's, plus "quantization": {"format": FORMAT, "group_size": G or null
  (the format's default: 32 for int4 / fp4_e2m1, one scale per output channel otherwise),
  "tensors": [the names of the quantized weights]};
- model.safetensors: for each quantized weight NAME (its name in the fp32 checkpoint),
  NAME.codes and, for every format but bf16 / fp16, NAME.scales, in tinygrad_like/formats.py's
  layout: one row per output channel (GPT-2's Conv1D weights, (in, out) in the fp32
  file, are stored transposed), codes (N, K) uint8 for the 8-bit formats, (N, K/2) uint8 for
  int4 / fp4_e2m1 (element 2j in the low nibble, 2j + 1 in the high), (N, K) uint16 bit
  patterns for bf16 / fp16; scales (N, K / G) fp32. The token embedding (and Llama's LM head)
  keeps its vocab_size rows, as in the fp32 file. Every other tensor (norms, biases, GPT-2's
  position table) as in the fp32 checkpoint: fp32, the same name;
- the source's Hugging Face tokenizer files, when it has them as regular files (generation
  itself uses the GPT-2 tokenizer, nn/tokenizer.py, for every checkpoint);
- SHA256SUMS: every file's sha256, verified on load.
It prints what it wrote: the file's bytes before and after, and the bytes per parameter.

--out is written as a training checkpoint is: whole into a staging folder, then swapped in
(OUT.new, renamed to OUT; a folder there before is OUT.old until the swap ends). A folder that
holds a run, a checkpoint or a model is refused without --overwrite (a run in use always), one
that holds anything else always (replacing it would delete those files), and so is a folder
holding the checkpoint being quantized. A write that fails (a full disk, an unwritable
folder) is one line, and leaves --out as it was.
"""

import os

from nn import from_pretrained
from nn.hf import WEIGHTS, read_quantization
from nn.quant import quantize_model
from nn.quant_checkpoint import save_quantized
from tinygrad_like import formats, quant
from training.args import ArgumentParser, user_errors
from training.checkpoint import find_checkpoint, held_folder, lock_run_folder, verify, write_failed

MB = 1e6


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--checkpoint", required=True, help="folder with config.json + model.safetensors"
    )
    p.add_argument("--weights", required=True, help=f"the format: {', '.join(formats.FORMATS)}")
    p.add_argument(
        "--group-size", type=int, help="elements per scale (default: the format's, see --help)"
    )
    p.add_argument("--out", required=True, help="the folder to write (made if missing)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an --out that holds a run, a checkpoint or a model, whole",
    )
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    with user_errors():
        if args.weights == "fp32":
            raise ValueError(
                "--weights fp32 is the checkpoint as it is: name a format to quantize to"
            )
        formats.get_format(args.weights)
        if args.group_size is not None:  # whether it divides each weight's rows: checked below
            formats.check_group_size(args.weights, 2 * abs(args.group_size), args.group_size)
        ckpt = find_checkpoint(args.checkpoint)
        verify(ckpt)  # a training checkpoint's sha256 sums
        done = read_quantization(ckpt)
        if done is not None:
            raise ValueError(
                f"{ckpt} is quantized already ({done['format']}): quantize the fp32 checkpoint "
                "it was made from"
            )
        lock = claim_out(args.out, ckpt, args.overwrite)
        try:
            model = from_pretrained(ckpt, dtype="fp32", device="cpu")
            n_params = model.num_parameters()
            quantize_model(model, args.weights, args.group_size)
            tensors, skipped = save(args, model, ckpt)
        finally:
            if lock is not None:
                lock.close()
    report(ckpt, args, model, tensors, n_params, skipped)


def claim_out(out, ckpt, overwrite):
    """Refuse --out (ValueError) when it is a file, holds the checkpoint ckpt being quantized,
    or holds something else without overwrite (training/checkpoint.py held_folder) -> the lock
    of the run folder it replaces (None for any other folder), held until the swap: a run
    using the folder refuses it, and no run starts in it meanwhile."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out} is a file: name a folder")
    if os.path.isdir(out):
        here = os.path.realpath(out)
        if os.path.commonpath([here, os.path.realpath(ckpt)]) == here:
            raise ValueError(
                f"--out {out} holds the checkpoint being quantized ({ckpt}): name another folder"
            )
    held, run = held_folder(out)
    if held is not None and not overwrite:
        raise ValueError(
            f"--out {out} already holds {held}: name another --out, or --overwrite to replace "
            "the whole folder"
        )
    return lock_run_folder(out) if run and os.path.isdir(out) else None


def save(args, model, ckpt):
    """save_quantized to --out, a write error (a full disk, an unwritable folder) as one line."""
    try:
        return save_quantized(args.out, model, ckpt, args.group_size)
    except OSError as e:
        need = sum(p.nbytes for p in model.parameters())
        what = write_failed(
            args.out, e, f"the {args.weights} checkpoint", f" needs about {need / MB:,.1f} MB"
        )
        raise ValueError(f"{what}; --out {args.out} is as it was") from None


def report(ckpt, args, model, tensors, n_params, skipped):
    """What was written: the files' sizes, the bytes per parameter of the model and of the
    quantized weights alone, and the tokenizer files not copied."""
    quantized = [p for p in model.parameters() if isinstance(p, quant.QuantizedWeight)]
    q_bytes = sum(a.nbytes for k, a in tensors.items() if k.endswith((".codes", ".scales")))
    q_params = sum(p.unpadded_numel() for p in quantized)
    total = sum(a.nbytes for a in tensors.values())
    before = os.path.getsize(os.path.join(ckpt, WEIGHTS))
    after = os.path.getsize(os.path.join(args.out, WEIGHTS))
    group = args.group_size or formats.FORMATS[args.weights].group_size
    grouping = f"group size {group}" if group else "one scale per output channel"
    grouping = grouping if formats.FORMATS[args.weights].scaled else "no scales"
    others = len(model.parameters()) - len(quantized)
    print(
        f"wrote {args.out}: config.json, model.safetensors and SHA256SUMS, {len(quantized)} "
        f"weights in {args.weights} ({grouping}), "
        f"{others} other tensors in fp32"
    )
    print(
        f"  model.safetensors: {before / MB:,.2f} MB -> {after / MB:,.2f} MB "
        f"({after / before:.3f}x)"
    )
    print(
        f"  bytes per parameter: 4.000 -> {total / n_params:.3f} ({n_params:,} parameters); "
        f"the quantized weights alone: {q_bytes / q_params:.3f}"
    )
    if skipped:
        print(f"  not copied (symbolic links or not regular files): {', '.join(skipped)}")


if __name__ == "__main__":
    main()
