"""The fp8 KV cache (nn/lm.py KVCache in fp8_e4m3 / fp8_e5m2, backend/cpu/kvcache.py): the
row quantizer against quant.quantize (ml_dtypes' rounding), the fused attention against a NumPy
dequantize-then-attention reference, the cache's tracked bytes against the prediction, the
launches of a decode step, and greedy decode of GPT-2 and Llama against an fp32 cache. The CUDA
twins are held to the CPU kernels in tests/test_cuda_kernels.py.
"""

import re

import numpy as np
import pytest
from test_decode import prompts
from test_generate import CFG, randomized
from test_llama import GQA
from test_llama import randomized as randomized_llama

import tinygrad_like as tg
from nn import KVCache, from_preset
from nn.lm import KV_FORMATS, kv_bytes_per_element
from tinygrad_like import dtypes, quant
from tinygrad_like.backend import cpu
from tinygrad_like.kernels.kvcache import spec as kvcache
from tinygrad_like.memory import TRACKER
from tinygrad_like.profiler import Profiler

F32, BF16 = dtypes.float32, dtypes.bfloat16


def rows_of_every_magnitude(shape, seed=0):
    """fp32 rows whose elements span many binades within a row (the small ones round to fp8
    subnormals or zero), with an all-zero row, a -0.0, an fp32 subnormal and a NaN."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.uniform(-24, 8, shape))
    x = x.astype(np.float32).reshape(-1, shape[-1])
    x[0] = 0
    x[1, :3] = [-0.0, 1e-40, np.nan]
    return x.reshape(shape)


def dequantized(codes, scales, fmt):
    """The values an fp8 cache (codes (..., D), scales (...)) stands for: quant.dequantize's
    (ml_dtypes) of the rows as a weight of one scale per row."""
    D = codes.shape[-1]
    qw = quant.QuantizedWeight(fmt, codes.reshape(-1, D), scales.reshape(-1, 1), D, (-1, D))
    return quant.dequantize(qw).reshape(codes.shape)


def attention_reference(q, k, v, length, scale):
    """Causal softmax(scale q k^T) v in float64 of q (B, H, Tq, D) over the first `length`
    positions of k, v (B, Hkv, L, D), query i at position length - Tq + i, query head h against
    kv head h // (H / Hkv) (Hugging Face's repeat_kv)."""
    Tq, G = q.shape[2], q.shape[1] // k.shape[1]
    k, v = (np.repeat(a[:, :, :length].astype(np.float64), G, axis=1) for a in (k, v))
    s = q.astype(np.float64) @ k.swapaxes(-1, -2) * scale
    seen = np.arange(length)[None, :] <= (length - Tq + np.arange(Tq))[:, None]
    s = np.where(seen, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def quantized_cache(B, Hkv, L, D, fmt, seed=0):
    """(k_codes, k_scales, v_codes, v_scales) of random keys and values, by cpu.kv_quantize."""
    rng = np.random.default_rng(seed)
    k, v = (rng.standard_normal((B, Hkv, L, D)).astype(np.float32) for _ in range(2))
    return cpu.kv_quantize(k, fmt) + cpu.kv_quantize(v, fmt)


# (B, H, Hkv, Tq, L, length, D): a decode step (GQA, past two key blocks, the cache longer than
# what is stored), a prompt (Tq = length, MHA), a prompt after a cache (MQA), a ragged head dim
ATTENTION_SHAPES = [
    (2, 4, 2, 1, 150, 130, 32),
    (1, 3, 3, 20, 20, 20, 64),
    (2, 6, 1, 7, 80, 70, 16),
    (1, 2, 1, 5, 9, 9, 24),
]


# ---------------------------------------------------------------- the kernels


@pytest.mark.parametrize("fmt", KV_FORMATS)
@pytest.mark.parametrize("dtype", [F32, BF16, dtypes.float64], ids=dtypes.name)
def test_kv_quantize_is_quant_quantize_of_each_row(fmt, dtype):
    """Codes and scales bit for bit those of quant.quantize (ml_dtypes' rounding, ties to even)
    of the rows as a weight with one scale per row, x read as fp32; shapes kept."""
    x = rows_of_every_magnitude((2, 3, 50, 40)).astype(dtype)
    codes, scales = cpu.kv_quantize(x, fmt)
    assert (codes.shape, codes.dtype, scales.shape, scales.dtype) == (
        x.shape,
        np.uint8,
        x.shape[:-1],
        F32,
    )
    want = quant.quantize(x.astype(np.float32).reshape(-1, 40), fmt)
    np.testing.assert_array_equal(codes.reshape(-1, 40), want.codes)
    np.testing.assert_array_equal(scales.reshape(-1), want.scales[:, 0])


@pytest.mark.parametrize("fmt", KV_FORMATS)
def test_kv_quantize_rounds_any_fp32_as_ml_dtypes(fmt):
    """Rows of random fp32 bit patterns (every exponent: subnormal codes, values on the edge of
    a carry into the next binade), quantized bit for bit as quant.quantize."""
    bits = np.random.default_rng(1).integers(0, 2**32, (2048, 64), dtype=np.uint64)
    x = bits.astype(np.uint32).view(np.float32)
    x = np.where(np.isfinite(x), x, np.float32(1))
    codes, scales = cpu.kv_quantize(x, fmt)
    want = quant.quantize(x, fmt)
    np.testing.assert_array_equal(codes, want.codes)
    np.testing.assert_array_equal(scales, want.scales[:, 0])


@pytest.mark.parametrize("fmt", KV_FORMATS)
@pytest.mark.parametrize("B,H,Hkv,Tq,L,length,D", ATTENTION_SHAPES)
def test_qattention_is_dequantize_then_attention(fmt, B, H, Hkv, Tq, L, length, D):
    """The fused kernel against the float64 attention over the dequantized cache: the same
    values (decoded exactly), so only fp32 rounding differs."""
    kc, ks, vc, vs = quantized_cache(B, Hkv, L, D, fmt)
    q = np.random.default_rng(2).standard_normal((B, H, Tq, D)).astype(np.float32)
    scale = 1 / np.sqrt(D)
    out = cpu.qattention(q, kc, ks, vc, vs, fmt, length, scale)
    want = attention_reference(q, dequantized(kc, ks, fmt), dequantized(vc, vs, fmt), length, scale)
    assert (out.shape, out.dtype) == (q.shape, F32)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_qattention_in_a_two_byte_dtype_is_the_fp32_result_rounded():
    kc, ks, vc, vs = quantized_cache(1, 2, 30, 16, "fp8_e4m3")
    q = np.random.default_rng(2).standard_normal((1, 4, 3, 16)).astype(BF16)
    out = cpu.qattention(q, kc, ks, vc, vs, "fp8_e4m3", 25, 0.25)
    want = cpu.qattention(q.astype(F32), kc, ks, vc, vs, "fp8_e4m3", 25, 0.25)
    assert out.dtype == BF16
    np.testing.assert_array_equal(out, want.astype(BF16))


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(fmt="int8"), "the quantized ones are fp8_e4m3, fp8_e5m2"),
        (dict(length=31), "Tq <= length <= L"),
        (dict(length=2), "Tq <= length <= L"),
        (dict(q=np.zeros((1, 3, 3, 16), F32)), "H a multiple of Hkv"),
        (dict(k_scales=np.zeros((1, 2, 29), F32)), "scales (B, Hkv, L)"),
    ],
)
def test_qattention_refuses_arguments_that_do_not_fit(change, words):
    kc, ks, vc, vs = quantized_cache(1, 2, 30, 16, "fp8_e4m3")
    args = dict(
        q=np.zeros((1, 4, 3, 16), F32),
        k_codes=kc,
        k_scales=ks,
        v_codes=vc,
        v_scales=vs,
        fmt="fp8_e4m3",
        length=10,
        scale=0.25,
    )
    with pytest.raises(ValueError, match=re.escape(words)):
        cpu.qattention(**{**args, **change})


# ---------------------------------------------------------------- the cache


@pytest.mark.parametrize("cfg", [CFG, GQA, from_preset("gpt2-tiny")], ids=["gpt2", "gqa", "tiny"])
@pytest.mark.parametrize("fmt", KV_FORMATS)
def test_the_trackers_fp8_cache_bytes_equal_the_prediction(cfg, fmt):
    """Per token per layer: K and V of Hkv heads, D one-byte codes and a 4-byte scale each,
    2 Hkv (D + 4) bytes = kv_cache_bytes_per_token(kv_bytes_per_element) / n_layer; tagged
    kv_cache, released with the cache."""
    B, T = 3, 10
    before = TRACKER.current["kv_cache"]
    cache = KVCache(cfg, B, T, tg.Tensor(np.zeros((2, 2), np.float32)), fmt)
    measured = (TRACKER.current["kv_cache"] - before) / (B * T * cfg.n_layer)
    predicted = 2 * cfg.n_kv_head * (cfg.head_dim + 4)
    assert measured == predicted
    per_token = cfg.kv_cache_bytes_per_token(kv_bytes_per_element(fmt, cfg.head_dim))
    assert per_token / cfg.n_layer == pytest.approx(predicted, rel=1e-12)
    assert (cache.k[0].dtype, cache.k_scales[0].shape) == (np.uint8, (B, cfg.n_kv_head, T))
    del cache
    assert TRACKER.current["kv_cache"] == before


def test_a_decode_step_quantizes_its_position_and_reads_the_codes():
    """Per layer and step: two kv_quantize launches (k and v of the new position), four copies
    into the cache (codes, scales), one qattention that reads q, the codes and scales of the
    positions so far (counted: 2 B Hkv length (D + 4) bytes) and writes out; no cast and no
    other attention kernel."""
    model = randomized_llama(GQA, seed=0)
    cfg, B, T = GQA, 2, 6
    cache = KVCache(cfg, B, T + 1, model.get_input_embeddings().weight, "fp8_e4m3")
    model.eval()
    p = prompts(cfg, B, T)
    with tg.no_grad():
        model(p, cache=cache, last_only=True)
        with Profiler() as prof:
            model(p[:, -1:], cache=cache, last_only=True)
    names = [launch.name for launch in prof.launches]
    L = cfg.n_layer
    assert names.count("kv_quantize") == 2 * L and names.count("qattention") == L
    assert "cast" not in names and not any("flash" in n or "softmax_causal" in n for n in names)
    D, Hkv, H = cfg.head_dim, cfg.n_kv_head, cfg.n_head
    q_bytes = B * H * D * 4
    for launch in prof.launches:
        if launch.name == "qattention":
            assert launch.bytes == 2 * q_bytes + 2 * B * Hkv * (T + 1) * (D + 4)
            assert launch.flops == (4 * D + 7) * B * H * (T + 1)


def test_an_fp8_cache_is_inference_only():
    cache = KVCache(CFG, 1, 4, tg.Tensor(np.zeros((2, 2), np.float32)), "fp8_e5m2")
    q = tg.Tensor(np.zeros((1, 2, 1, 16), np.float32), requires_grad=True)
    kv = tg.Tensor(np.zeros((1, 2, 1, 16), np.float32))
    with pytest.raises(RuntimeError, match="fp8_e5m2 is inference only"):
        cache.attention(0, q, kv, kv)


# ---------------------------------------------------------------- decoding

# The logits bound: an fp8 code holds its value to within half an ulp, a relative 2^-(m + 1)
# (m mantissa bits: 2^-4 for e4m3, 2^-3 for e5m2), every key and value once (the row scales are
# exact fp32), and each layer's attention output is a convex combination of values whose
# weights move with the scores' error of the same relative size. Measured, the teacher-forced
# logits of the random models here move by 0.16 to 0.29 of that relative error times their
# largest magnitude (bf16's 2^-9 gives 0.29 to 0.65 of its own): the bound is that relative
# error, whole, times the fp32 logits' largest magnitude.
ROUNDING = {"fp8_e4m3": 2.0**-4, "fp8_e5m2": 2.0**-3}


def forced_logits(model, want, T, kv_dtype):
    """Teacher forcing: feed the fp32 cache's greedy sequence want (B, T + n) through a cache in
    kv_dtype -> (the last-position logits (B, n, V), whether each step's argmax picks want's
    next token (B, n))."""
    B, n = want.shape[0], want.shape[1] - T
    cache = KVCache(model.config, B, want.shape[1], model.get_input_embeddings().weight, kv_dtype)
    model.eval()
    logits, feed = [], want[:, :T]
    with tg.no_grad():
        for i in range(n):
            step, _ = model(feed, cache=cache, last_only=True)
            logits.append(step.numpy()[:, -1])
            feed = want[:, T + i : T + i + 1]
    logits = np.stack(logits, 1)
    return logits, logits.argmax(-1) == want[:, T:]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("fmt", KV_FORMATS)
def test_an_fp8_cache_decodes_most_of_the_fp32_caches_greedy_tokens(family, fmt):
    """4 prompts x 12 greedy tokens of a random model: teacher-forced from the fp32 cache's own
    prefixes, at least 44 of the 48 choices agree (measured: 45 to 48), and the logits stay
    within ROUNDING's bound of the fp32 cache's. Free-running (generate), the first token is
    the teacher-forced first step's (the same prompt through the same cache); after a flip the
    sequences part (measured: 27 to 48 of 48 agree)."""
    model = randomized(CFG, seed=0) if family == "gpt2" else randomized_llama(GQA, seed=0)
    p = prompts(model.config, 4, 5)
    want = model.generate(p, 12, temperature=0)
    fp32, _ = forced_logits(model, want, 5, None)
    logits, agree = forced_logits(model, want, 5, fmt)
    assert agree.sum() >= 44
    assert np.abs(logits - fp32).max() <= ROUNDING[fmt] * np.abs(fp32).max()
    got = model.generate(p, 12, temperature=0, kv_dtype=fmt)
    np.testing.assert_array_equal(got[:, 5], logits[:, 0].argmax(-1))


def test_contract_counts_the_causal_pairs():
    """qattention's scores: Tq (length - Tq) + Tq (Tq + 1) / 2 per query head, a decode step's
    length, a prompt's triangle."""
    assert kvcache.causal_pairs(1, 9) == 9
    assert kvcache.causal_pairs(4, 4) == 10
    assert kvcache.causal_pairs(2, 5) == 4 + 5
