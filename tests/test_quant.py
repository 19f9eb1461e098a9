"""Quantized weights (tinygrad_like/quant.py, nn/quant.py): the quantizer against ml_dtypes'
roundings for every format, the meta device's shapes, quantized GPT-2 and Llama decoding the
fp32 models' greedy tokens, the bytes a quantized decode step's launches count, and generate.py
--weights. The kernels (qmatmul, qembedding) on every device: tests/kernels/test_quant.py.
"""

import gc

import numpy as np
import pytest
from test_decode import checkpoint, forced_agreement, generate_py  # noqa: F401 (a fixture)
from test_generate import CFG, randomized
from test_llama import GQA
from test_llama import randomized as randomized_llama

import tinygrad_like as tg
import tinygrad_like.functional as F
from nn import build, from_preset
from nn.quant import quantize_model
from tinygrad_like import Tensor, formats, quant
from tinygrad_like.backend import meta
from tinygrad_like.memory import TRACKER
from tinygrad_like.profiler import Profiler

FOUR_BIT = [f for f, spec in formats.FORMATS.items() if spec.bits == 4]


def group_for(fmt, K):
    """A group size that makes several groups of a row for the 4-bit formats (their default
    of 32 being too wide for the small K here); the format's own default otherwise."""
    return 8 if fmt in FOUR_BIT else None


def weight(N, K, seed=0):
    return np.random.default_rng(seed).normal(0, 0.05, (N, K)).astype(np.float32)


# ---------------------------------------------------------------- the quantizer


def representable(fmt):
    """(1, K) values the format holds exactly, every group led by the format's largest
    magnitude (so that every scale is 1), and the codes an 8- or 16-bit format stores for them
    (None for a 4-bit one)."""
    f = formats.FORMATS[fmt]
    if f.decode == "int":
        values = np.arange(-f.qmax, f.qmax + 1, dtype=np.float32)  # -127..127, -7..7
    else:
        every = np.arange(2**f.bits, dtype=np.uint16 if f.bits == 16 else np.uint8)
        values = every.view(f.element).astype(np.float32)
        values = values[np.isfinite(values) & (np.abs(values) <= (f.qmax or np.inf))]
    values = np.resize(values, -(-values.size // 8) * 8)  # whole groups of 8
    if f.scaled:
        values[:: group_for(fmt, values.size) or values.size] = f.qmax
    if f.bits == 4:
        return values[None], None
    element = np.int8 if f.decode == "int" else f.element
    return values[None], values.astype(element).view(np.uint16 if f.bits == 16 else np.uint8)


@pytest.mark.parametrize("fmt", list(formats.FORMATS))
def test_values_the_format_holds_quantize_exactly(fmt):
    W, want_codes = representable(fmt)
    qw = quant.quantize(W, fmt, group_for(fmt, W.shape[1]))
    assert np.array_equal(quant.dequantize(qw), W)
    if formats.FORMATS[fmt].scaled:
        assert np.all(qw.scales == 1)
    if want_codes is not None:
        assert np.array_equal(qw.codes[0], want_codes)


@pytest.mark.parametrize("fmt", list(formats.FORMATS))
def test_other_values_round_as_documented(fmt):
    f, W = formats.FORMATS[fmt], weight(5, 64)
    g = group_for(fmt, 64)
    qw = quant.quantize(W, fmt, g)
    got = quant.dequantize(qw)
    if not f.scaled:  # bf16 / fp16: ml_dtypes' / NumPy's round to nearest even
        assert np.array_equal(got, W.astype(f.element).astype(np.float32))
        return
    g = qw.group_size
    top = np.abs(W.reshape(5, -1, g)).max(axis=2)
    assert np.array_equal(qw.scales, (top / np.float32(f.qmax)).astype(np.float32))
    s = np.repeat(qw.scales, g, axis=1)
    scaled = np.clip(W / s, -f.qmax, f.qmax)
    if f.decode == "int":  # the nearest integer: within half a step of the scale
        want = np.rint(scaled)
        assert np.all(np.abs(got - W) <= s / 2 * (1 + 1e-6))
    else:
        want = scaled.astype(f.element).astype(np.float32)
    assert np.array_equal(got, want * s)


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8_e4m3", "fp4_e2m1"])
def test_a_zero_group_gets_scale_one_and_groups_are_their_own(fmt):
    W = weight(3, 32)
    W[1] = 0  # a zero row
    W[2, 8:16] = 0  # a zero group (of 8) in a 4-bit format; a zero stretch otherwise
    W[0, 24] = 5.0  # one large value: only its group's scale (its row's, per channel) grows
    qw = quant.quantize(W, fmt, 8)
    got = quant.dequantize(qw)
    assert np.all(qw.scales[1] == 1) and np.all(got[1] == 0)
    assert qw.scales[2, 1] == 1 and np.all(got[2, 8:16] == 0)
    assert qw.scales[0, 3] == np.float32(5.0) / np.float32(formats.FORMATS[fmt].qmax)
    assert np.all(qw.scales[0, :3] < qw.scales[0, 3] / 10)


def test_group_sizes_that_do_not_fit_are_refused():
    W = weight(2, 64)
    for fmt, g, words in [
        ("int4", 3, "positive and even"),
        ("int4", 48, "divide the rows' 64"),
        ("int8", 0, "positive"),
        ("bf16", 16, "bf16 has no scales"),
    ]:
        with pytest.raises(ValueError, match=words):
            quant.quantize(W, fmt, g)
    with pytest.raises(ValueError, match="unknown weight format 'int3'"):
        quant.quantize(W, "int3")


def test_a_conv1d_weight_is_stored_transposed():
    W = weight(24, 40)  # (in, out): GPT-2's Conv1D
    qw = quant.quantize(W, "int8", out_axis=1)
    assert qw.codes.shape == (40, 24) and qw.shape == (24, 40)
    assert np.allclose(quant.dequantize(qw), W, atol=0.005)
    assert qw.nbytes == 40 * 24 + 40 * 4


# ---------------------------------------------------------------- the meta device


def test_the_meta_device_gives_the_shapes():
    w = meta.empty((64, 96), np.float32)  # (in, out)
    qw = quant.quantize(w, "int4", 16, out_axis=1)
    assert qw.codes.shape == (96, 32) and qw.scales.shape == (96, 4) and qw.device == "meta"
    x = Tensor(meta.empty((2, 5, 64), np.float32))
    with tg.no_grad():
        assert F.linear(x, qw).shape == (2, 5, 96)
        emb = F.embedding(np.array([[1, 2]]), quant.quantize(w, "fp8_e5m2"))
    assert emb.shape == (1, 2, 96) and emb.dtype == np.float32


# ---------------------------------------------------------------- ops and models


def test_linear_checks_the_layout_and_refuses_gradients():
    qw = quant.quantize(weight(16, 32), "int8")  # (out, in)
    x = Tensor(np.ones((2, 32), np.float32), requires_grad=True)
    with pytest.raises(RuntimeError, match="inference only: run it under no_grad"):
        F.linear(x, qw, transposed=True)
    with tg.no_grad(), pytest.raises(ValueError, match="out_axis 0 used as \\(in, out\\)"):
        F.linear(Tensor(np.ones((2, 16), np.float32)), qw)
    with tg.no_grad():
        y = F.linear(x, qw, transposed=True)
    assert np.allclose(y.numpy(), np.ones((2, 32)) @ quant.dequantize(qw).T, atol=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_quantized_models_decode_the_fp32_greedy_tokens(family):
    """Teacher-forced along the fp32 model's greedy tokens (2 prompts x 8 steps), bf16 and int8
    weights pick the same next token at 15 of 16 steps at least. Measured: GPT-2 15 (bf16)
    and 15 (int8), Llama 16 and 16; decoding freely, a first different pick changes the rest
    (GPT-2: 9 of 16 equal for bf16 and int8, Llama 16)."""
    make = (lambda: randomized(CFG, seed=0)) if family == "gpt2" else lambda: randomized_llama(GQA)
    prompt = np.random.default_rng(3).integers(0, 50, (2, 4))
    want = make().generate(prompt, 8, temperature=0)
    for fmt in ("bf16", "int8"):
        agree = int(forced_agreement(quantize_model(make(), fmt), want, 4, "fp32").sum())
        assert agree >= 15, f"{family} {fmt}: {agree} of 16 tokens agree"


def test_a_quantized_model_is_counted_moved_and_saved():
    model = randomized(CFG, seed=0)
    n, state = model.num_parameters(), model.state_dict()
    before = TRACKER.current["weights"]
    quantize_model(model, "int8")
    wte = model.transformer.wte.weight
    assert isinstance(wte, quant.QuantizedWeight) and wte.rows == CFG.vocab_size
    assert isinstance(model.transformer.h[0].mlp.c_fc.weight, quant.QuantizedWeight)
    assert not isinstance(model.transformer.wpe.weight, quant.QuantizedWeight)
    assert model.num_parameters() == n and TRACKER.current["weights"] < before
    saved = model.state_dict()
    assert saved.keys() == state.keys() and saved["transformer.wte.weight"].shape == (53, 32)
    assert np.allclose(saved["transformer.wte.weight"], state["transformer.wte.weight"], atol=0.05)
    with pytest.raises(ValueError, match="load the weights first, then quantize"):
        model.load_state_dict(state)
    assert model.to("bf16").transformer.wte.weight is wte  # its format stays
    with pytest.raises(ValueError, match="quantized already"):
        quantize_model(model, "int4")


def test_a_group_size_that_does_not_fit_leaves_the_model_as_it_was():
    model = randomized_llama(GQA)  # the MLP's down_proj has rows of 48
    with pytest.raises(ValueError, match="divide the rows' 48 elements"):
        quantize_model(model, "int4", 32)
    assert not any(isinstance(p, quant.QuantizedWeight) for p in model.parameters())


def test_a_quantized_decode_step_counts_its_codes_and_scales():
    """Each decode step's qmatmul launches read x, the codes and scales of every quantized GEMM
    weight once (GPT-2's head: the tied wte), the biases, and write y; qembedding reads one
    row of wte's codes and scales."""
    model = quantize_model(randomized(CFG, seed=0), "int4", 8)
    with Profiler() as prof:
        list(model.generate_stream(np.array([[1, 2, 3]]), 3, temperature=0))
    steps = [[launch for launch in prof.launches if launch.name == "qmatmul"]]
    gemm_weights = [
        m.weight for _, m in model.named_modules() if hasattr(m, "weight") and hasattr(m, "bias")
    ]
    gemm_weights = [w for w in gemm_weights if isinstance(w, quant.QuantizedWeight)]
    wte = model.transformer.wte.weight
    per_step = sum(w.nbytes for w in gemm_weights) + wte.nbytes  # + the tied head
    activations = 0
    for w in gemm_weights:  # x (1, K) read, y (1, N) and bias (N,) fp32
        N, K = w.codes.shape[0], w.shape[1 - w.out_axis]
        activations += 4 * (K + 2 * N)
    activations += 4 * (CFG.n_embd + wte.shape[0])  # the head: x (1, C), logits (1, Vp)
    total = sum(launch.bytes for launch in steps[0])
    assert len(steps[0]) == 3 * (len(gemm_weights) + 1)  # 3 steps (the prompt's: M = 3)
    last = steps[0][-(len(gemm_weights) + 1) :]  # one decode step, B = 1
    assert sum(launch.bytes for launch in last) == per_step + activations
    assert total > 0
    gathers = [launch for launch in prof.launches if launch.name == "qembedding"]
    row = wte.codes[0].nbytes + wte.scales[0].nbytes
    assert gathers[-1].bytes == 8 + row + 4 * CFG.n_embd  # the id, its row, the output


def test_a_quantized_llama_7b_on_the_meta_device_counts_its_bytes():
    """Shapes only, nothing allocated: int4 codes (half a byte) and a scale per 32 weights."""
    config = from_preset("llama-7b")
    gc.collect()  # earlier tests' models die now, not while this one is counted
    before = TRACKER.current["weights"]
    model = quantize_model(build(config, device="meta"), "int4")
    stored = TRACKER.current["weights"] - before
    params = model.parameters()
    assert stored == sum(p.nbytes for p in params)
    quantized = [p for p in params if isinstance(p, quant.QuantizedWeight)]
    assert sum(p.nbytes for p in quantized) == sum(p.numel() for p in quantized) * (0.5 + 4 / 32)
    assert model.lm_head.weight.codes.shape == (config.padded_vocab_size, config.hidden_size // 2)


# ---------------------------------------------------------------- generate.py --weights


def test_generate_py_weights_stats(checkpoint, capsys):  # noqa: F811 (the fixture)
    argv = ["--checkpoint", checkpoint, "--prompt", "!#", "--max-new-tokens", "4"]
    code, out, err = generate_py(
        argv + ["--temperature", "0", "--weights", "int8", "--stats"], capsys
    )
    assert code == 0, err
    assert "weights int8, KV cache fp32, B = 1; 1.125 bytes per weight" in out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--weights", "int3"], "unknown weight format 'int3'"),
        (["--weights", "int4", "--group-size", "3"], "positive and even"),
        (["--weights", "int4", "--group-size", "48"], "divide the rows' 32 elements"),
        (["--weights", "bf16", "--group-size", "8"], "bf16 has no scales"),
        (["--weights", "int8", "--dtype", "bf16"], "leave --dtype at fp32"),
    ],
)
def test_generate_py_weights_refuses_in_one_line(checkpoint, capsys, argv, words):  # noqa: F811
    argv += ["--max-new-tokens", "4"]
    code, out, err = generate_py(["--checkpoint", checkpoint, *argv], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and words in err and len(err.strip().splitlines()) == 1
