"""scripts/export_gguf.py: the GGUF file it writes, read back with gguf's own GGUFReader, holds
every tensor where llama.cpp looks for it (its names, its layout, its type) with the values
asked for: f32 bit for bit, f16 / bf16 rounded as ml_dtypes rounds, q8_0 / q4_0 the bytes
gguf.quants makes; a project int8 / int4 checkpoint's codes as they are, under fp16 scales.
Then the metadata llama.cpp reads, and the refusals: one line, exit 2, no file left."""

import contextlib
import errno
import io
import os
import subprocess
import sys
from unittest import mock

import ml_dtypes
import numpy as np
import pytest
from test_faults import REPO, one_line_error, script_main

from nn import GPT2Config, build, from_preset, hf
from nn.quant import quantize_model
from nn.quant_checkpoint import save_quantized
from tinygrad_like.quant import QuantizedWeight

gguf = pytest.importorskip("gguf")  # the test extra: the exporter's only extra dependency
Q = gguf.GGMLQuantizationType

SCRIPT = os.path.join(REPO, "scripts", "export_gguf.py")
EXPORT = script_main("scripts/export_gguf.py")
TYPES = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0}
BLOCK_0 = ("transformer.h.0.", "model.layers.0.")  # block 0's parameters, either family
# Llama's vocabulary padded past GPT-2's 50,257 tokens: 47 padding tokens
CONFIGS = {"gpt2": from_preset("gpt2-tiny"), "llama": from_preset("llama-tiny", vocab_size=50304)}


def read(path):
    """gguf.GGUFReader of path, parsed from the file's bytes in memory: the reader slices its
    buffer once per element of the 150,000 of the vocabulary's arrays, which np.memmap makes
    three times slower."""
    with mock.patch.object(np, "memmap", lambda path, mode: np.fromfile(path, np.uint8)):
        return gguf.GGUFReader(path)


def export(src, out, kind):
    """Run the script in this process -> (GGUFReader of out, what it printed)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        EXPORT(["--checkpoint", str(src), "--out", str(out), "--type", kind])
    return read(out), printed.getvalue()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """family -> an fp32 save_pretrained folder of its tiny preset."""
    out = {}
    for family, config in CONFIGS.items():
        out[family] = tmp_path_factory.mktemp(family)
        build(config, seed=1).save_pretrained(out[family])
    return out


@pytest.fixture(scope="module")
def exported(sources, tmp_path_factory):
    """(family, type) -> the GGUFReader of that export of sources[family], made once."""
    done, folder = {}, tmp_path_factory.mktemp("gguf")

    def get(family, kind):
        if (family, kind) not in done:
            out = folder / f"{family}-{kind}.gguf"
            reader, printed = export(sources[family], out, kind)
            size = os.path.getsize(out)
            assert printed == f"wrote {out}: {len(reader.tensors)} tensors, {size:,} bytes\n"
            done[family, kind] = reader
        return done[family, kind]

    return get


def interleaved(w, heads):
    """HF's rotary rows of a q / k projection (heads D, C), channel i of a head paired with
    i + D/2, -> llama.cpp's, where pairs are adjacent: (i, i + D/2) -> rows (2i, 2i + 1)."""
    out, D = np.empty_like(w), w.shape[0] // heads
    for h in range(heads):
        first, second = w[h * D : h * D + D // 2], w[h * D + D // 2 : (h + 1) * D]
        out[h * D : (h + 1) * D : 2], out[h * D + 1 : (h + 1) * D : 2] = first, second
    return out


def expected(config, state):
    """GGUF name -> the fp32 array llama.cpp must find there, NumPy's (rows, row length)."""
    if isinstance(config, GPT2Config):
        s = {k.removeprefix("transformer."): v for k, v in state.items()}
        e = {"token_embd.weight": s["wte.weight"], "position_embd.weight": s["wpe.weight"]}
        e |= {f"output_norm.{p}": s[f"ln_f.{p}"] for p in ("weight", "bias")}
        for i in range(config.n_layer):
            for ours, theirs in [("ln_1", "attn_norm"), ("ln_2", "ffn_norm")]:
                e |= {f"blk.{i}.{theirs}.{p}": s[f"h.{i}.{ours}.{p}"] for p in ("weight", "bias")}
            for ours, theirs in [
                ("attn.c_attn", "attn_qkv"),
                ("attn.c_proj", "attn_output"),
                ("mlp.c_fc", "ffn_up"),
                ("mlp.c_proj", "ffn_down"),
            ]:
                e[f"blk.{i}.{theirs}.weight"] = s[f"h.{i}.{ours}.weight"].T  # Conv1D (in, out)
                e[f"blk.{i}.{theirs}.bias"] = s[f"h.{i}.{ours}.bias"]
        return e  # and no output.weight: llama.cpp ties the head to token_embd
    e = {
        "token_embd.weight": state["model.embed_tokens.weight"],
        "output_norm.weight": state["model.norm.weight"],
        "output.weight": state["lm_head.weight"],
    }
    for i in range(config.n_layer):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        w = {k.removeprefix(p): v for k, v in state.items() if k.startswith(p)}
        e[b + "attn_norm.weight"] = w["input_layernorm.weight"]
        e[b + "attn_q.weight"] = interleaved(w["self_attn.q_proj.weight"], config.n_head)
        e[b + "attn_k.weight"] = interleaved(w["self_attn.k_proj.weight"], config.n_kv_head)
        e[b + "attn_v.weight"] = w["self_attn.v_proj.weight"]
        e[b + "attn_output.weight"] = w["self_attn.o_proj.weight"]
        e[b + "ffn_norm.weight"] = w["post_attention_layernorm.weight"]
        for ours, theirs in [("gate", "ffn_gate"), ("up", "ffn_up"), ("down", "ffn_down")]:
            e[b + theirs + ".weight"] = w[f"mlp.{ours}_proj.weight"]
    return e


def type_for(name, array, kind):
    """The type llama.cpp's converter would give the tensor for --type kind."""
    if array.ndim == 1 or name.startswith("position_embd"):
        return Q.F32
    if kind in ("q8_0", "q4_0") and array.shape[1] % 32:
        return Q.F16
    return TYPES[kind]


def check_tensor(t, want, qtype):
    """GGUF tensor t holds want (fp32) as qtype, exactly as the type's definition makes it."""
    assert t.tensor_type == qtype, t.name
    assert tuple(int(n) for n in t.shape) == want.shape[::-1], t.name  # ggml's ne: reversed
    data = np.asarray(t.data)
    if qtype == Q.F32:
        np.testing.assert_array_equal(data.view(np.uint32), want.view(np.uint32), t.name)
    elif qtype in (Q.F16, Q.BF16):
        half = want.astype(np.float16 if qtype == Q.F16 else ml_dtypes.bfloat16)
        np.testing.assert_array_equal(data.view(np.uint16), half.view(np.uint16), t.name)
    else:
        assert np.array_equal(data, gguf.quants.quantize(want, qtype)), t.name
        # each element within a block's error: q8_0 half a step (max / 127 / 2), q4_0 a step
        # (max / 8, the far end clipped), both plus the fp16 rounding of the block's scale
        err = np.abs(gguf.quants.dequantize(data, qtype) - want).reshape(-1, 32)
        top = np.abs(want).reshape(-1, 32).max(axis=1, keepdims=True)
        assert (err <= top * ((1 / 254 if qtype == Q.Q8_0 else 1 / 8) + 2**-10)).all(), t.name


# ---------------------------------------------------------------- from an fp32 checkpoint


@pytest.mark.parametrize("kind", list(TYPES))
@pytest.mark.parametrize("family", list(CONFIGS))
def test_every_tensor_of_an_fp32_checkpoint(sources, exported, family, kind):
    reader = exported(family, kind)
    want = expected(CONFIGS[family], hf.read_state(sources[family]))
    assert sorted(t.name for t in reader.tensors) == sorted(want)
    for t in reader.tensors:
        check_tensor(t, want[t.name], type_for(t.name, want[t.name], kind))


def test_rows_that_are_not_whole_blocks_stay_f16(tmp_path):
    """C = 48: every weight with rows of 48 elements falls back to f16 under q4_0; ffn_down's
    rows (192) are whole blocks and quantize."""
    config = GPT2Config(n_layer=1, n_head=2, n_embd=48, n_positions=16)
    build(config).save_pretrained(tmp_path / "src")
    reader, _ = export(tmp_path / "src", tmp_path / "out.gguf", "q4_0")
    want = expected(config, hf.read_state(tmp_path / "src"))
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["token_embd.weight"] == types["blk.0.attn_qkv.weight"] == Q.F16
    assert types["blk.0.ffn_down.weight"] == Q.Q4_0
    for t in reader.tensors:
        check_tensor(t, want[t.name], type_for(t.name, want[t.name], "q4_0"))


def test_rotary_layout_gives_the_same_attention_scores(exported, sources):
    """What the permutation is for: llama.cpp's rope (pairs 2i, 2i + 1) on the exported q / k
    rows gives the attention scores the model's rotate-half rope gives on its own rows."""
    config, reader = CONFIGS["llama"], exported("llama", "f32")
    state = hf.read_state(sources["llama"])
    gg = {t.name: np.asarray(t.data) for t in reader.tensors}
    D, T = config.head_dim, 5
    angles = np.outer(np.arange(T), config.rope_theta ** (-np.arange(0, D, 2) / D))  # (T, D/2)
    cos, sin = np.cos(angles), np.sin(angles)
    x = np.random.default_rng(0).normal(size=(T, config.hidden_size))

    def rotate_half(v):  # (T, heads, D): channel i with i + D/2
        a, b = v[..., : D // 2], v[..., D // 2 :]
        c, s = cos[:, None], sin[:, None]
        return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)

    def adjacent(v):  # (T, heads, D): channel 2i with 2i + 1
        a, b, c, s = v[..., 0::2], v[..., 1::2], cos[:, None], sin[:, None]
        return np.stack([a * c - b * s, b * c + a * s], axis=-1).reshape(v.shape)

    def scores(rope, wq, wk):  # (H, T, T): each query head against its GQA key head
        q = rope((x @ wq.T).reshape(T, config.n_head, D))
        k = rope((x @ wk.T).reshape(T, config.n_kv_head, D))
        k = np.repeat(k, config.n_head // config.n_kv_head, axis=1)
        return np.einsum("thd,shd->hts", q, k)

    p = "model.layers.1.self_attn."
    ours = scores(rotate_half, state[p + "q_proj.weight"], state[p + "k_proj.weight"])
    theirs = scores(adjacent, gg["blk.1.attn_q.weight"], gg["blk.1.attn_k.weight"])
    np.testing.assert_allclose(theirs, ours, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- from a quantized checkpoint


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("family", list(CONFIGS))
def test_quantized_codes_convert_as_they_are(sources, tmp_path, family, fmt):
    """A group-32 int8 / int4 checkpoint -> q8_0 / q4_0: the dequantized GGUF equals the
    model's decoded weights up to the fp16 rounding of each scale (at most 2^-11 of a weight),
    and bit for bit in block 0, whose scales were made fp16 values. The fp32 tensors as they
    are."""
    model = quantize_model(build(CONFIGS[family], seed=1), fmt, 32)
    for name, p in model.named_parameters():  # block 0's scales: fp16 values
        if name.startswith(BLOCK_0) and isinstance(p, QuantizedWeight):
            p.scales[...] = p.scales.astype(np.float16)
    save_quantized(tmp_path / "q", model, sources[family], group_size=32)
    want = expected(CONFIGS[family], model.state_dict())  # quant.dequantize's values
    kind = {"int8": "q8_0", "int4": "q4_0"}[fmt]
    reader, _ = export(tmp_path / "q", tmp_path / "q.gguf", kind)
    assert sorted(t.name for t in reader.tensors) == sorted(want)
    worst = 0.0
    for t in reader.tensors:
        if want[t.name].ndim == 1 or t.name.startswith("position_embd"):
            check_tensor(t, want[t.name], Q.F32)
            continue
        assert t.tensor_type == TYPES[kind], t.name
        got, ref = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type), want[t.name]
        if t.name.startswith("blk.0."):
            np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32), t.name)
        change = np.abs(got - ref) / np.where(ref == 0, 1, np.abs(ref))
        worst = max(worst, float(change.max()))
    assert 0 < worst <= 2**-11, worst  # measured: the scales' fp16 rounding, no more


# ---------------------------------------------------------------- metadata


def field(reader, key):
    return reader.get_field(key).contents()


@pytest.mark.parametrize("family", list(CONFIGS))
def test_metadata_llama_cpp_reads(exported, family):
    c, reader = CONFIGS[family], exported(family, "q8_0")
    arch = field(reader, "general.architecture")
    assert arch == family
    hyper = {
        "block_count": c.n_layer,
        "context_length": c.n_positions,
        "embedding_length": c.n_embd,
        "attention.head_count": c.n_head,
        "feed_forward_length": 4 * c.n_embd if family == "gpt2" else c.intermediate_size,
    }
    if family == "gpt2":
        hyper["attention.layer_norm_epsilon"] = np.float32(c.layer_norm_epsilon)
    else:
        hyper |= {
            "attention.head_count_kv": c.n_kv_head,
            "attention.layer_norm_rms_epsilon": np.float32(c.rms_norm_eps),
            "rope.freq_base": c.rope_theta,
            "rope.dimension_count": c.head_dim,
            "vocab_size": 50304,
        }
    assert {k: field(reader, f"{arch}.{k}") for k in hyper} == hyper
    assert field(reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_Q8_0
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = field(reader, "tokenizer.ggml.merges")
    assert field(reader, "tokenizer.ggml.model") == "gpt2"
    assert field(reader, "tokenizer.ggml.pre") == "gpt-2"
    assert len(tokens) == len(types) == c.vocab_size
    # GPT-2's byte-to-unicode strings: a space is "Ġ", a newline "Ċ"
    assert (tokens[0], tokens[198], tokens[220], tokens[50256]) == ("!", "Ċ", "Ġ", "<|endoftext|>")
    assert (types[0], types[50256]) == (gguf.TokenType.NORMAL, gguf.TokenType.CONTROL)
    assert len(merges) == 50000 and merges[:3] == ["Ġ t", "Ġ a", "h e"]
    assert field(reader, "tokenizer.ggml.bos_token_id") == 50256
    assert field(reader, "tokenizer.ggml.eos_token_id") == 50256
    assert field(reader, "tokenizer.ggml.add_bos_token") is False
    if family == "llama":  # its rows past the tokenizer's: llama.cpp's padding tokens
        assert tokens[50257:] == [f"[PAD{i}]" for i in range(50257, 50304)]
        assert set(types[50257:]) == {gguf.TokenType.UNUSED}


# ---------------------------------------------------------------- refusals


def run_script(*argv):
    """The script as a user runs it -> (exit code, stdout, stderr)."""
    done = subprocess.run([sys.executable, SCRIPT, *map(str, argv)], capture_output=True, text=True)
    return done.returncode, done.stdout, done.stderr


def test_bad_input_is_one_line_and_leaves_no_file(sources, tmp_path):
    """Run as a user runs it: a missing checkpoint, an --out there already (kept as it was)."""
    out = tmp_path / "m.gguf"
    code, stdout, err = run_script("--checkpoint", tmp_path / "no", "--type", "f16", "--out", out)
    assert code == 2 and stdout == "" and one_line_error(err), err
    assert f"{tmp_path / 'no'} is not a checkpoint: expected config.json" in err
    assert os.listdir(tmp_path) == []
    out.write_bytes(b"keep")
    code, _, err = run_script("--checkpoint", sources["gpt2"], "--type", "f32", "--out", out)
    assert code == 2 and one_line_error(err), err
    assert f"--out {out} exists: name another file, or --overwrite" in err
    assert out.read_bytes() == b"keep" and os.listdir(tmp_path) == ["m.gguf"]


def refused(argv, capsys, words):
    """main(argv)'s refusal: exit 2, one line holding words."""
    with pytest.raises(SystemExit) as e:
        EXPORT([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == "" and one_line_error(err) and words in err, err


@pytest.mark.parametrize(
    "fmt, group, kind, words",
    [
        ("int8", None, "q8_0", "int8 weights with one scale per output channel; GGUF's q8_0"),
        ("int4", 16, "q4_0", "int4 weights with groups of 16; GGUF's q4_0 has one scale per 32"),
        ("int4", None, "q8_0", "int4 weights, which convert to --type q4_0 only (q8_0 would"),
        ("int8", 32, "f16", "int8 weights, which convert to --type q8_0 only (f16 would"),
        ("fp8_e4m3", None, "q8_0", "fp8_e4m3 weights: no GGUF type has the same codes"),
    ],
)
def test_a_format_without_a_gguf_twin_is_refused(
    sources, tmp_path, capsys, fmt, group, kind, words
):
    model = quantize_model(build(CONFIGS["gpt2"]), fmt, group)
    save_quantized(tmp_path / "q", model, sources["gpt2"], group)
    argv = ["--checkpoint", tmp_path / "q", "--type", kind, "--out", tmp_path / "m.gguf"]
    refused(argv, capsys, words)
    assert not os.path.exists(tmp_path / "m.gguf")


def test_an_unknown_type_is_refused(sources, tmp_path, capsys):
    argv = ["--checkpoint", sources["gpt2"], "--type", "q5_1", "--out", tmp_path / "m.gguf"]
    refused(argv, capsys, "argument --type: invalid choice: 'q5_1'")
    assert os.listdir(tmp_path) == []


def test_a_vocabulary_smaller_than_the_tokenizer_is_refused(tmp_path, capsys):
    build(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=53)).save_pretrained(tmp_path / "s")
    argv = ["--checkpoint", tmp_path / "s", "--type", "f32", "--out", tmp_path / "m.gguf"]
    refused(argv, capsys, "vocab_size 53 is smaller than GPT-2's tokenizer (50257 tokens)")
    assert sorted(os.listdir(tmp_path)) == ["s"]


def test_a_failed_write_leaves_nothing(sources, tmp_path, capsys, monkeypatch):
    """A full disk while the tensors are written: no --out, no temporary file beside it; an
    --out there before (--overwrite) keeps its bytes."""

    def full(self, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", full)
    argv = ["--checkpoint", sources["gpt2"], "--type", "f16", "--out", tmp_path / "m.gguf"]
    refused(argv, capsys, "could not write --out")
    assert os.listdir(tmp_path) == []
    (tmp_path / "m.gguf").write_bytes(b"old")
    refused(argv + ["--overwrite"], capsys, "No space left on device")
    assert os.listdir(tmp_path) == ["m.gguf"] and (tmp_path / "m.gguf").read_bytes() == b"old"
