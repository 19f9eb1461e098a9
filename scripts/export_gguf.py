"""Export a checkpoint to GGUF, llama.cpp's file format, so that a model trained here runs in
llama.cpp (llama-cli, llama-server, llama-cpp-python) with no Hugging Face conversion step.

    python scripts/export_gguf.py --checkpoint out --out model-f16.gguf --type f16
    python scripts/export_gguf.py --checkpoint out-int8 --out model-q8_0.gguf --type q8_0
    llama-cli -m model-f16.gguf -p "First Citizen:" -n 40

--checkpoint: an fp32 GPT-2 or Llama folder (config.json + model.safetensors: a training run's
--out, a save_pretrained folder, a Hugging Face directory), or a quantized one
(scripts/quantize.py). The file holds llama.cpp's architecture "gpt2" or "llama", its
hyper-parameters and tensor names (gguf's own tables), and GPT-2's BPE tokenizer, which every
checkpoint here uses (Llama presets included): a vocab_size above its 50,257 tokens gets unused
padding tokens "[PADi]", a smaller one is refused. GPT-2's LM head is tied: the file has no
"output" tensor, and llama.cpp then uses token_embd as the head.

--type: f32, f16, bf16, q8_0 or q4_0 for the 2-D weights. 1-D tensors (norms, biases) and
GPT-2's position table stay f32, as llama.cpp's converter keeps them; a weight whose rows are
not a multiple of 32 (a q8_0 / q4_0 block) falls back to f16, as that converter does.
- from an fp32 checkpoint: f32 is exact; f16 and bf16 round each value to nearest even;
  q8_0 and q4_0 are gguf-py's own quantization (gguf.quants), not this project's.
- from a quantized checkpoint: int8 and int4 with 32 elements per scale become q8_0 and q4_0
  with their codes unchanged, but GGUF stores the scale in fp16 (fp32 here). Rounding it
  changes each weight by at most 2^-11 of itself (a scale of at least 2^-14, fp16's normal
  range; a smaller one moves by up to 2^-25), and not at all where the scale is an fp16 value;
  a scale beyond fp16's range is refused. Any other format or group size (fp8, fp4, bf16
  codes, per-channel int8, int4 in groups of 64) has no GGUF type with the same codes and is
  refused: export the fp32 checkpoint instead.
llama.cpp itself computes GELU from an fp16 table on CPUs: a GPT-2 file's logits there differ
from this project's by about 1e-3 even in f32 (a Llama's by about 1e-6, with an f32 KV cache).

--out is written to a temporary file beside it, then renamed: a failure leaves --out as it
was. Bad input is one line `error: ...` on stderr and exit code 2.
"""

import contextlib
import json
import os
import uuid
from collections import namedtuple
from pathlib import Path

import numpy as np

from nn import GPT2Config, from_pretrained, hf, tokenizer
from nn.quant_checkpoint import quantized_tensors
from tinygrad_like import formats
from tinygrad_like.files import fsync_dir
from training.args import ArgumentParser, user_errors
from training.checkpoint import find_checkpoint, verify

try:
    import gguf
except ImportError:  # an optional dependency: only this script needs it
    gguf = None

TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")
# a project format -> the GGUF type with the same codes, one scale per BLOCK elements
DIRECT = {"int8": "q8_0", "int4": "q4_0"}
BLOCK = 32

# one GGUF tensor: its name, the checkpoint's, whether it is a GPT-2 Conv1D weight stored (in,
# out) in fp32 (the quantized files hold it as (out, in) already), and a row order (or None)
Entry = namedtuple("Entry", "name source conv1d rows")


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="folder with config.json + weights")
    p.add_argument("--out", required=True, help="the .gguf file to write")
    p.add_argument("--type", required=True, choices=TYPES, help="the 2-D weights' type")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    with user_errors():
        if gguf is None:
            raise RuntimeError("the gguf package is not installed: pip install 'gguf>=0.10'")
        out = check_out(args.out, args.overwrite)
        ckpt = find_checkpoint(args.checkpoint)  # a run's --out: its checkpoint/
        verify(ckpt)  # a training checkpoint's sha256 sums
        config = hf.read_config(ckpt)
        vocabulary = vocab(config.vocab_size)  # before the tensors: a small vocab_size is refused
        tensors = convert(ckpt, config, args.type)
        writer = metadata(config, args.type, Path(ckpt).resolve().name, vocabulary)
        for name, data, qtype in tensors:
            writer.add_tensor(name, data, raw_dtype=qtype)
        write(writer, out)
    print(f"wrote {out}: {len(tensors)} tensors, {os.path.getsize(out):,} bytes")


def check_out(out, overwrite):
    """--out's absolute path, once it can be written: not a folder, in a folder that exists,
    not there already unless overwrite."""
    path = os.path.abspath(out)
    if os.path.isdir(path):
        raise ValueError(f"--out {out} is a folder: name a .gguf file")
    if not os.path.isdir(os.path.dirname(path)):
        raise ValueError(f"--out {out}: the folder {os.path.dirname(path)} does not exist")
    if os.path.lexists(path) and not overwrite:
        raise ValueError(f"--out {out} exists: name another file, or --overwrite to replace it")
    return path


def vocab(n_vocab):
    """GPT-2's tokenizer as llama.cpp's "gpt2" model reads it -> (tokens, their types, merges):
    each token in GPT-2's byte-to-unicode string form (encoder.json's keys), <|endoftext|> a
    control token, rows past the 50,257 tokens padding ("[PADi]", unused, as llama.cpp's
    converter names them), merges the "a b" lines of vocab.bpe by rank."""
    bpe, encoder = map(Path, tokenizer.bpe_files())
    ids = json.loads(encoder.read_text("utf-8"))  # token -> id, ids 0 .. 50256
    if n_vocab < len(ids):
        raise ValueError(
            f"vocab_size {n_vocab} is smaller than GPT-2's tokenizer ({len(ids)} tokens): "
            "llama.cpp needs a token for each embedding row and a row for each token"
        )
    tokens = sorted(ids, key=ids.get) + [f"[PAD{i}]" for i in range(len(ids), n_vocab)]
    types = [gguf.TokenType.NORMAL] * len(ids) + [gguf.TokenType.UNUSED] * (n_vocab - len(ids))
    types[tokenizer.EOT_ID] = gguf.TokenType.CONTROL
    merges = [line for line in bpe.read_text("utf-8").splitlines()[1:] if line]  # 1: #version
    return tokens, types, merges


def metadata(config, kind, name, vocabulary):
    """A GGUFWriter holding the architecture's hyper-parameters (the keys llama.cpp reads) and
    the tokenizer (vocabulary: vocab()'s tokens, types and merges)."""
    is_gpt2 = isinstance(config, GPT2Config)
    w = gguf.GGUFWriter(
        None, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GPT2 if is_gpt2 else gguf.MODEL_ARCH.LLAMA]
    )
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    w.add_file_type(
        getattr(gguf.LlamaFileType, ("ALL_" if kind == "f32" else "MOSTLY_") + kind.upper())
    )
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_block_count(config.n_layer)
    w.add_context_length(config.n_positions)
    w.add_embedding_length(config.n_embd)
    w.add_head_count(config.n_head)
    if is_gpt2:
        w.add_feed_forward_length(4 * config.n_embd)
        w.add_layer_norm_eps(config.layer_norm_epsilon)
    else:
        w.add_feed_forward_length(config.intermediate_size)
        w.add_head_count_kv(config.n_kv_head)  # GQA: each K/V head serves H / Hkv query heads
        w.add_layer_norm_rms_eps(config.rms_norm_eps)
        w.add_rope_freq_base(config.rope_theta)
        w.add_rope_dimension_count(config.head_dim)  # the whole head is rotated
        w.add_vocab_size(config.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_bos_token_id(tokenizer.EOT_ID)
    w.add_eos_token_id(tokenizer.EOT_ID)
    w.add_add_bos_token(False)  # GPT-2 prepends nothing, and nothing here trained with one
    tokens, types, merges = vocabulary
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    return w


def plan(config):
    """The Entries of config's model in llama.cpp's order. Shapes are NumPy's (rows, row
    length); ggml's ne lists them the other way round: ne = [row length, rows]."""
    T = gguf.MODEL_TENSOR

    def entry(tensor, suffix, source, bid=None, conv1d=False, rows=None):
        return Entry(f"{gguf.TENSOR_NAMES[tensor].format(bid=bid)}.{suffix}", source, conv1d, rows)

    def affine(tensor, source, bid=None, conv1d=False):  # weight and bias
        return [
            entry(tensor, "weight", f"{source}.weight", bid, conv1d),
            entry(tensor, "bias", f"{source}.bias", bid),
        ]

    if isinstance(config, GPT2Config):
        # no "output": llama.cpp's gpt2 loader finds none and uses token_embd as the LM head
        # (TENSOR_DUPLICATED), which is GPT-2's tied head
        out = [entry(T.TOKEN_EMBD, "weight", "transformer.wte.weight")]  # (V, C)
        out += [entry(T.POS_EMBD, "weight", "transformer.wpe.weight")]  # (P, C)
        out += affine(T.OUTPUT_NORM, "transformer.ln_f")
        for i in range(config.n_layer):
            p = f"transformer.h.{i}."
            out += affine(T.ATTN_NORM, p + "ln_1", i)
            out += affine(T.ATTN_QKV, p + "attn.c_attn", i, conv1d=True)  # (3C, C): q, k, v rows
            out += affine(T.ATTN_OUT, p + "attn.c_proj", i, conv1d=True)  # (C, C)
            out += affine(T.FFN_NORM, p + "ln_2", i)
            out += affine(T.FFN_UP, p + "mlp.c_fc", i, conv1d=True)  # (4C, C)
            out += affine(T.FFN_DOWN, p + "mlp.c_proj", i, conv1d=True)  # (C, 4C)
        return out
    out = [
        entry(T.TOKEN_EMBD, "weight", "model.embed_tokens.weight"),  # (V, C)
        entry(T.OUTPUT_NORM, "weight", "model.norm.weight"),
        entry(T.OUTPUT, "weight", "lm_head.weight"),  # (V, C)
    ]
    q_rows, k_rows = rope_rows(config, config.n_head), rope_rows(config, config.n_kv_head)
    for i in range(config.n_layer):
        p = f"model.layers.{i}."
        out += [
            entry(T.ATTN_NORM, "weight", p + "input_layernorm.weight", i),
            entry(T.ATTN_Q, "weight", p + "self_attn.q_proj.weight", i, rows=q_rows),  # (H D, C)
            entry(T.ATTN_K, "weight", p + "self_attn.k_proj.weight", i, rows=k_rows),
            entry(T.ATTN_V, "weight", p + "self_attn.v_proj.weight", i),  # (Hkv D, C)
            entry(T.ATTN_OUT, "weight", p + "self_attn.o_proj.weight", i),  # (C, H D)
            entry(T.FFN_NORM, "weight", p + "post_attention_layernorm.weight", i),
            entry(T.FFN_GATE, "weight", p + "mlp.gate_proj.weight", i),  # (F, C)
            entry(T.FFN_UP, "weight", p + "mlp.up_proj.weight", i),  # (F, C)
            entry(T.FFN_DOWN, "weight", p + "mlp.down_proj.weight", i),  # (C, F)
        ]
    return out


def rope_rows(config, heads):
    """The row order that turns a q_proj / k_proj weight (heads D, C) from Hugging Face's
    rotary layout (nn/llama.py's too: channel i of a head pairs with i + D/2, rotate-half) into
    llama.cpp's (pairs of adjacent channels 2i, 2i + 1): new row h D + 2i + j is old row
    h D + j D/2 + i, the permutation llama.cpp's converter applies to Hugging Face Llamas."""
    D = config.head_dim
    return np.arange(heads * D).reshape(heads, 2, D // 2).swapaxes(1, 2).reshape(-1)


def convert(path, config, kind):
    """The checkpoint's tensors as GGUF stores them -> [(name, array, GGMLQuantizationType)]."""
    entry = hf.read_quantization(path)
    if entry is None:
        state = hf.read_state(path)
        return [encode(e.name, laid_out(state[e.source], e), kind) for e in plan(config)]
    fmt = entry["format"]
    group = entry["group_size"] or formats.FORMATS[fmt].group_size
    if fmt not in DIRECT:
        raise ValueError(
            f"{path} holds {fmt} weights: no GGUF type has the same codes (int8 and int4 with "
            "32 elements per scale convert as they are): export the fp32 checkpoint instead"
        )
    if group != BLOCK:
        grouping = f"groups of {group}" if group else "one scale per output channel"
        raise ValueError(
            f"{path} holds {fmt} weights with {grouping}; GGUF's {DIRECT[fmt]} has one scale per "
            f"{BLOCK}: quantize again with --group-size {BLOCK}, or export the fp32 checkpoint"
        )
    if kind != DIRECT[fmt]:
        raise ValueError(
            f"{path} holds {fmt} weights, which convert to --type {DIRECT[fmt]} only ({kind} "
            f"would need the fp32 weights): use --type {DIRECT[fmt]}, or the fp32 checkpoint"
        )
    # loading checks the folder's sums, shapes and values (nn/quant_checkpoint.py)
    stored, names = quantized_tensors(from_pretrained(path, device="cpu"))
    out = []
    for e in plan(config):
        if e.source not in names:
            out.append(encode(e.name, laid_out(stored[e.source], e), kind))
            continue
        codes, scales = stored[e.source + ".codes"], stored[e.source + ".scales"]
        if e.rows is not None:  # a row's codes and its scales move together
            codes, scales = codes[e.rows], scales[e.rows]
        blocks = (q8_0_blocks if fmt == "int8" else q4_0_blocks)(codes, scales, e.source)
        out.append((e.name, blocks, gguf.GGMLQuantizationType[kind.upper()]))
    return out


def laid_out(array, e):
    """An fp32 tensor as GGUF holds it: a Conv1D weight (in, out) transposed to (out, in), the
    rows of a rotary projection reordered."""
    array = array.T if e.conv1d else array
    return np.ascontiguousarray(array if e.rows is None else array[e.rows], dtype=np.float32)


def encode(name, array, kind):
    """-> (name, the bytes gguf.quants makes of array, its type)."""
    T = gguf.GGMLQuantizationType
    qtype = T[kind.upper()]
    if array.ndim == 1 or name.startswith(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.POS_EMBD]):
        qtype = T.F32  # llama.cpp's norms, biases and position table are f32
    elif qtype in (T.Q8_0, T.Q4_0) and array.shape[-1] % BLOCK:
        qtype = T.F16  # a row that is not whole blocks: llama.cpp's converter keeps f16 too
    return name, gguf.quants.quantize(array, qtype), qtype


def fp16_scales(scales, source):
    """scales (N, K/32) fp32 -> their fp16 bytes (N, K/32, 2), little-endian as GGUF's are."""
    half = scales.astype("<f2")  # rounded to nearest even
    if not np.isfinite(half).all():
        raise ValueError(
            f"{source}: a scale beyond fp16's 65,504, which GGUF's blocks store: export the fp32 "
            "checkpoint instead"
        )
    return half.view(np.uint8).reshape(*scales.shape, 2)


def q8_0_blocks(codes, scales, source):
    """int8 codes (N, K) uint8 and scales (N, K/32) -> (N, K/32 * 34) bytes: per block of 32,
    block_q8_0 {fp16 d; int8 qs[32]}, the same codes."""
    N, K = codes.shape
    blocks = [fp16_scales(scales, source), codes.reshape(N, K // BLOCK, BLOCK)]
    return np.concatenate(blocks, axis=2).reshape(N, -1)


def q4_0_blocks(codes, scales, source):
    """int4 codes (N, K/2) uint8 (element 2j low nibble, 2j + 1 high, each q + 8) and scales
    (N, K/32) -> (N, K/32 * 18) bytes: per block of 32, block_q4_0 {fp16 d; uint8 qs[16]}, byte
    i holding element i low and element i + 16 high, each q + 8 too: the same nibbles, moved."""
    N = codes.shape[0]
    nibbles = np.stack([codes & 0xF, codes >> 4], axis=2).reshape(N, -1, BLOCK)  # element order
    qs = nibbles[..., : BLOCK // 2] | (nibbles[..., BLOCK // 2 :] << 4)  # (N, K/32, 16)
    return np.concatenate([fp16_scales(scales, source), qs], axis=2).reshape(N, -1)


def write(writer, out):
    """Write the file to a temporary file beside out, fsync it, rename it over out: a failure
    (a full disk) leaves out as it was, and no temporary file."""
    tmp = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.{uuid.uuid4().hex}.tmp")
    try:
        with contextlib.closing(writer):  # its file, closed on a failure too
            writer.write_header_to_file(path=Path(tmp))
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, out)
    except OSError as e:
        raise ValueError(
            f"could not write --out {out} ({e.strerror or e}); it is as it was"
        ) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    fsync_dir(os.path.dirname(out))


if __name__ == "__main__":
    main()
