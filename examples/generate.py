"""Sample text from a GPT-2 or Llama checkpoint: one written by examples/train_gpt2.py (its --out
folder), by save_pretrained, or a Hugging Face GPT-2 or Llama directory. Streams tokens as they
come, then prints prompt and generation speed. Several --prompt texts of one token length are
decoded as one batch (the attention has no padding mask, so a batch is never padded: prompts of
other lengths are refused, to be run separately); each sequence is printed when all are done.
--stats adds the decode accounting (accounting/decode.py): ms per token, tokens/s, bytes per token
counted by the kernels beside the weights-plus-cache floor, and the fraction of its bound.
--weights quantizes the model's GEMM weights on load (nn/quant.py: int8, int4, fp8, fp4, bf16 or
fp16 codes that the kernels decode as they read them), after loading it in fp32. A quantized
checkpoint (scripts/quantize.py's --out) loads as it is stored, its weights never in fp32; its
format is the model's (--weights may name it, never another). --activations int8 quantizes
the activations too, per block of 32, for int8 and int4 weights: their GEMMs then run on
integer dot products (llama.cpp's Q8_0 activations; nn/quant.py use_activations); bf16 rounds
them to bf16 for bf16 weights (llama.cpp's bf16: a prompt's GEMMs bf16 dot products). --kv-dtype
sets the KV cache's format: fp32, fp16 or bf16, or fp8_e4m3 / fp8_e5m2 (a byte a key or value
and an fp32 scale per position of a head, quantized as each position is appended; the
attention kernel decodes the codes as it reads them). The decode step is captured on its first
two tokens and replayed for the rest (tinygrad_like.compile: the kernels in order, no op layer;
on the CPU one parallel hand-off a token, every thread through the step's compiled ops, where
each kernel has its op: graph/cpu_step.py), the same tokens; --no-compile runs every step
through the op layer (eager)."""

import argparse
import os
import sys

import numpy as np

from accounting import fits
from accounting.decode import StepMeter, stats
from nn import from_pretrained
from nn.hf import WEIGHTS, read_config, read_quantization
from nn.lm import KV_DTYPES
from nn.quant import quantize_model, use_activations
from nn.sampling import check_sampling
from nn.tokenizer import get_tokenizer
from tinygrad_like import backend, formats, peaks
from tinygrad_like.backend.cpu.compiled import use_pool
from tinygrad_like.gemm_library import choose as choose_gemm_library
from tinygrad_like.kernels.quant.spec import INTEGER_FORMATS, check_int8_activations
from tinygrad_like.quant import ACTIVATIONS
from training.args import ArgumentParser, user_errors
from training.checkpoint import find_checkpoint, verify

NO_CHECKPOINT = """error: no --checkpoint given. Either
  train one:   python examples/train_gpt2.py --out out   (then --checkpoint out)
  or point at GPT-2 weights you have: a Hugging Face GPT-2 directory with config.json and
  model.safetensors, e.g. --checkpoint ~/models/gpt2"""


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__)
    p.add_argument("--checkpoint", help="folder with config.json + model.safetensors")
    p.add_argument(
        "--prompt",
        action="append",
        help="text to continue (default a newline); repeat it for a batch of one token length",
    )
    p.add_argument("--max-new-tokens", type=int, default=100, help="tokens to sample (default 100)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=200, help="sample from the k likeliest (200)")
    p.add_argument("--top-p", type=float, help="sample from the smallest set of this mass")
    p.add_argument("--num-samples", type=int, default=1, help="samples, one after another")
    p.add_argument("--seed", type=int, default=1337, help="sampling seed (sample i uses seed + i)")
    p.add_argument("--device", help="cpu or cuda (default: cuda when a GPU is usable)")
    p.add_argument("--dtype", default="fp32", help="fp32, fp16 or bf16 weights (default fp32)")
    p.add_argument(
        "--kv-dtype",
        help="the KV cache: fp32, fp16, bf16, or fp8_e4m3 / fp8_e5m2 (codes and a scale per "
        "position; inference only) (default --dtype)",
    )
    p.add_argument(
        "--weights",
        default="fp32",
        help=f"quantize the weights on load: fp32 (not quantized), {', '.join(formats.FORMATS)}",
    )
    p.add_argument(
        "--group-size",
        type=int,
        help="elements per scale for --weights int4 / fp4_e2m1 (default 32), or any scaled format",
    )
    p.add_argument(
        "--activations",
        default="fp32",
        help="fp32 (default): x as it is against the decoded weights; int8: with --weights "
        "int8 or int4, x quantized per block of 32 elements and the GEMMs integer dot products "
        "(faster on a CPU, logits slightly off the fp32 path's); bf16: with --weights bf16, x "
        "rounded to bf16 (a prompt's GEMMs bf16 dot products where the CPU has them)",
    )
    p.add_argument(
        "--stats",
        action="store_true",
        help="print the decode accounting (each kernel timed: the host time is the rest)",
    )
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="capture the decode step once and replay it without the op layer (the same "
        "tokens; tinygrad_like.compile); --no-compile: every step eager",
    )
    args = p.parse_args(argv)
    args.prompt = args.prompt or ["\n"]
    args.kv_dtype = args.kv_dtype or args.dtype
    return args


def main(argv=None, choose_pool=False):
    """choose_pool: pick the CPU's thread pool for this decode (the command line's run; a test
    calling main leaves its process's pool as it is)."""
    args = parse_args(argv)
    if not args.checkpoint:
        print(NO_CHECKPOINT, file=sys.stderr)
        sys.exit(2)
    with user_errors():
        if args.max_new_tokens <= 0 or args.num_samples <= 0:
            raise ValueError("--max-new-tokens and --num-samples must be positive")
        check_sampling(
            args.temperature, args.top_k, args.top_p, names=("--temperature", "--top-k", "--top-p")
        )
        device = backend.resolve(args.device)
        ckpt = find_checkpoint(args.checkpoint)
        verify(ckpt)  # a training checkpoint's sha256 sums (a flipped byte still loads)
        if args.kv_dtype not in KV_DTYPES:
            raise ValueError(f"--kv-dtype {args.kv_dtype}: use one of {', '.join(KV_DTYPES)}")
        quantized = read_quantization(ckpt)  # None for an fp32 checkpoint
        check_weights(args, quantized, ckpt)
        check_activations(args)
        if choose_pool:
            # a decode step's GEMVs are compiled loops (kernels/quant/cpu_gemv.py, fp32's
            # kernels/gemm/cpu_gemv.py): OpenMP's hand-off lets them use every core
            use_pool("omp")  # backend/cpu/compiled.py
        tok = get_tokenizer()
        prompt = batch([tok.encode(text, allow_special=True) for text in args.prompt])
        # all checked before the model is loaded and the prompt printed: an error never
        # follows half an output
        config, tokens = read_config(ckpt), prompt.shape[1] + args.max_new_tokens
        config.check_context(
            tokens,
            f"--prompt of {prompt.shape[1]} tokens + --max-new-tokens {args.max_new_tokens} =",
        )
        stored = os.path.getsize(os.path.join(ckpt, WEIGHTS)) if quantized else None
        fits.check(
            fits.generation_bytes(
                config, args.dtype, tokens, device, args.kv_dtype, len(prompt), stored
            ),
            device,
            f"loading {ckpt} in {args.dtype} and generating {tokens} positions",
            "use a smaller checkpoint or fewer --max-new-tokens",
        )
        model = from_pretrained(ckpt, dtype=args.dtype, device=device)  # either family
        if quantized is None:  # --weights fp32: as it is
            quantize_model(model, args.weights, args.group_size, args.activations)
        else:
            use_activations(model, args.activations)
        be = backend.get(device)
        if choose_pool and be.HOLDS_VALUES and not be.GPU:  # the prompt's GEMMs on the CPU's
            choose_gemm_library(config, *prompt.shape, args.dtype, prompt=True)  # fastest BLAS
    for i in range(args.num_samples):
        title = f"--- sample {i + 1}" if args.num_samples > 1 else "---"
        with user_errors():  # the dtype's overflow (inf logits) found while sampling
            stream(model, tok, prompt, args, args.seed + i, title)


def check_weights(args, quantized=None, ckpt=None):
    """A ValueError for a --weights format that does not exist, one combined with a narrower
    --dtype (a quantized model computes in fp32), or a --group-size the format cannot take.
    quantized: the quantization entry of the checkpoint ckpt (None: an fp32 one), whose format
    and group size become args.weights and args.group_size; another --weights or --group-size
    is refused."""
    if quantized is not None:
        fmt, group = quantized["format"], quantized["group_size"]
        if args.weights not in ("fp32", fmt):
            raise ValueError(
                f"--weights {args.weights}: {ckpt} is a quantized checkpoint of {fmt} weights; "
                f"leave --weights out, or quantize the fp32 checkpoint to {args.weights} "
                "(scripts/quantize.py)"
            )
        f = formats.FORMATS[fmt]
        stored = group or f.group_size  # None: one scale per output channel, or none
        if args.group_size is not None and args.group_size != stored:
            grouping = f"group size {stored}" if stored else "one scale per output channel"
            raise ValueError(
                f"--group-size {args.group_size}: {ckpt} holds {fmt} weights with "
                f"{grouping if f.scaled else 'no scales'}; leave --group-size out"
            )
        args.weights, args.group_size = fmt, group
    if args.weights == "fp32":
        if args.group_size is not None:
            raise ValueError("--group-size needs a quantized --weights format (e.g. int4)")
        return
    formats.get_format(args.weights)
    if args.group_size is not None:  # whether it divides each weight's rows: checked on load
        formats.check_group_size(args.weights, 2 * abs(args.group_size), args.group_size)
    if args.dtype != "fp32":
        what = f"{ckpt}'s {args.weights} weights" if quantized else f"--weights {args.weights}"
        raise ValueError(
            f"{what} with --dtype {args.dtype}: a quantized model computes in fp32; leave "
            "--dtype at fp32"
        )


def check_activations(args):
    """A ValueError for --activations other than fp32, int8 and bf16, int8 with weights that
    have no integer dot (fp32, a float format, a --group-size that is not whole blocks of 32),
    or bf16 with weights other than bf16."""
    if args.activations not in ACTIVATIONS:
        raise ValueError(f"--activations {args.activations}: use one of {', '.join(ACTIVATIONS)}")
    if args.activations == "bf16" and args.weights != "bf16":
        raise ValueError(
            f"--activations bf16 needs --weights bf16; {args.weights} weights: leave "
            "--activations at fp32"
        )
    if args.activations == "int8":
        if args.weights not in INTEGER_FORMATS:
            raise ValueError(
                f"--activations int8 needs --weights int8 or int4 (an integer dot product); "
                f"{args.weights} weights have none: leave --activations at fp32"
            )
        if args.group_size is not None:
            check_int8_activations(args.weights, args.group_size)


def batch(prompts):
    """Token id lists -> (B, T) ids; the prompts must be of one length T (never padded)."""
    lengths = sorted({len(ids) for ids in prompts})
    if lengths[0] == 0:
        raise ValueError("--prompt is empty: give at least one character")
    if len(lengths) > 1:
        raise ValueError(
            f"--prompt texts of {', '.join(map(str, lengths))} tokens: a batch needs prompts of "
            "one token length (the attention has no padding mask); run the others separately"
        )
    return np.array(prompts)


def stream(model, tok, prompt, args, seed, title):
    """Print the title and the prompt, then each token as it is sampled; then the two speeds
    (the steps' own seconds: no compile, no printing), the kernels compiled on first use on a
    line of their own (and with --stats the decode accounting). The first token comes before
    anything is printed: a forward that fails on the prompt prints only its error, and one that
    fails later ends the line first. A batch (B > 1) prints each sequence when all are done."""
    B, T = prompt.shape
    meter = StepMeter(
        model.generate_stream(
            prompt,
            args.max_new_tokens,
            args.temperature,
            args.top_k,
            args.top_p,
            seed,
            args.kv_dtype,
            args.compile,
        ),
        timing=args.stats,  # each kernel timed: a step's host time is the rest
    )
    tokens = iter(meter)
    first = next(tokens)
    ids = [[int(t)] for t in first]
    if B == 1:
        print(title)
        print(args.prompt[0], end="", flush=True)
        shown = tok.decode(ids[0])
        print(shown, end="", flush=True)
    try:
        for token in tokens:
            for row, t in zip(ids, token):
                row.append(int(t))
            if B == 1:
                text = tok.decode(ids[0])  # decode the whole tail: a character can span tokens
                print(text[len(shown) :], end="", flush=True)
                shown = text
    except ValueError:
        print(flush=True)
        raise
    for b in range(B if B > 1 else 0):
        print(f"{title} (prompt {b + 1} of {B})")
        print(args.prompt[b] + tok.decode(ids[b]))
    n = len(ids[0])
    decode_s = sum(seconds for seconds, _ in meter.steps[1:])  # the meter's: no compiles
    decode_rate = B * (n - 1) / decode_s if n > 1 else float("nan")
    print(
        f"\n--- prompt: {B} x {T} tokens at {B * T / meter.steps[0][0]:,.1f} "
        f"tokens/s; generated: {B} x {n} tokens at {decode_rate:,.1f} tokens/s"
    )
    if meter.compiled.count:  # the first calls' compiles: in neither speed above
        print(f"--- {meter.compiled.describe()}")
    if args.stats:
        weights = model.get_input_embeddings().weight
        peak = peaks.get(weights.device)
        fmt = args.weights if args.weights != "fp32" else weights.dtype
        lines = stats(meter, model.config, fmt, args.kv_dtype, B, T, peak, args.group_size)
        print("\n".join(lines))


if __name__ == "__main__":
    main(choose_pool=True)
