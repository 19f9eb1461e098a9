"""A KV cache's kernels (kernels/kvcache): kv_write, a copy of the rows of some positions into a
cache, bit for bit; kv_attention, against float64 attention over the cache's first positions (a
decode step, a prompt, a prompt after a cache, grouped- and multi-query heads); kv_quantize, bit
for bit quant.quantize's codes and scales of each row (ml_dtypes' rounding, ties to even) on rows
of every magnitude and on random fp32 bit patterns; qattention, against float64 attention over
the dequantized fp8 cache (the cache's values decoded exactly, so only the arithmetic's rounding
differs), on the same shapes and ragged head dims. The caches themselves and decoding through
them: tests/test_kv_fp8.py, tests/test_decode.py.
"""

import re

import numpy as np
import pytest

from tinygrad_like import quant
from tinygrad_like.kernels.kvcache import spec as kvcache

from .check import BF16, F32, FLOATS, cases, cpu, f64, rand

FORMATS = kvcache.KV_FORMATS


def rows_of_every_magnitude(shape, seed=0):
    """fp32 rows whose elements span many binades within a row (the small ones round to fp8
    subnormals or zero), with an all-zero row, a -0.0, an fp32 subnormal and a NaN."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.uniform(-24, 8, shape))
    x = x.astype(np.float32).reshape(-1, shape[-1])
    x[0] = 0
    x[1, :3] = [-0.0, 1e-40, np.nan]
    return x.reshape(shape)


def random_bits(shape):
    """fp32 of random bit patterns (every exponent: subnormal codes, values on the edge of a
    carry into the next binade), the non-finite ones replaced by 1."""
    bits = np.random.default_rng(1).integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    return np.where(np.isfinite(x), x, np.float32(1))


def kv_quantize_ref(x, fmt):
    """quant.quantize's codes and scales of x's rows (read as fp32) as a weight with one scale
    per row (output channel)."""
    D = x.shape[-1]
    qw = quant.quantize(x.astype(np.float32).reshape(-1, D), fmt)
    return qw.codes.reshape(x.shape), qw.scales[:, 0].reshape(x.shape[:-1])


def rows(put, dtype, shape, fmt, values):
    """x of shape: rows of every magnitude, random bit patterns, or normal values."""
    make = {"magnitudes": rows_of_every_magnitude, "bits": random_bits}.get(values)
    x = make(shape) if make else rand(shape, F32)
    return put(x.astype(dtype)), fmt


def dequantized(codes, scales, fmt):
    """The values an fp8 cache (codes (..., D), scales (...)) stands for: quant.dequantize's
    of the rows as a weight of one scale per row."""
    D = codes.shape[-1]
    qw = quant.QuantizedWeight(fmt, codes.reshape(-1, D), scales.reshape(-1, 1), D, (-1, D))
    return quant.dequantize(qw).reshape(codes.shape)


def attention_ref(q, k, v, positions, scale):
    """Causal softmax(scale q k^T) v in float64 of q (B, H, Tq, D) at positions over the
    positions 0 ... positions[-1] of k, v (B, Hkv, L, D), query head h against kv head
    h // (H / Hkv) (Hugging Face's repeat_kv)."""
    Tq, G, length = q.shape[2], q.shape[1] // k.shape[1], int(positions[-1]) + 1
    k, v = (np.repeat(a[:, :, :length].astype(np.float64), G, axis=1) for a in (k, v))
    s = f64(q) @ k.swapaxes(-1, -2) * scale
    seen = np.arange(length)[None, :] <= (length - Tq + np.arange(Tq))[:, None]
    s = np.where(seen, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def qattention_ref(q, k_codes, k_scales, v_codes, v_scales, fmt, positions, scale):
    """attention_ref over the dequantized k, v."""
    k, v = (dequantized(c, s, fmt) for c, s in ((k_codes, k_scales), (v_codes, v_scales)))
    return attention_ref(q, k, v, positions, scale)


def quantized_cache(B, Hkv, L, D, fmt, seed=0):
    """(k_codes, k_scales, v_codes, v_scales) of random keys and values, by the CPU's
    kv_quantize."""
    rng = np.random.default_rng(seed)
    k, v = (rng.standard_normal((B, Hkv, L, D)).astype(np.float32) for _ in range(2))
    return cpu.kv_quantize(k, fmt) + cpu.kv_quantize(v, fmt)


def positions(Tq, length):
    """The positions of Tq queries whose last is length - 1."""
    return np.arange(length - Tq, length)


def attention(put, dtype, fmt, B, H, Hkv, Tq, L, length, D):
    q, at = rand((B, H, Tq, D), dtype, seed=2), positions(Tq, length)
    cache = quantized_cache(B, Hkv, L, D, fmt)
    return (put(q), *map(put, cache), fmt, put(at), 1 / np.sqrt(D))


def plain_attention(put, dtype, B, H, Hkv, Tq, L, length, D):
    q, k, v = (
        rand(shape, dtype, seed=i) for i, shape in enumerate([(B, H, Tq, D)] + [(B, Hkv, L, D)] * 2)
    )
    return put(q), put(k), put(v), put(positions(Tq, length)), 1 / np.sqrt(D)


def write(put, dtype, shape, T, at):
    """A cache of shape (B, Hkv, L, ...) and T new rows for positions at ... at + T - 1."""
    cache = rand(shape, dtype, seed=1)
    new = rand(shape[:2] + (T,) + shape[3:], dtype, seed=2)
    return put(cache), put(new), put(np.arange(at, at + T))


def write_ref(cache, new, at):
    out = f64(cache)
    out[:, :, at] = f64(new)
    return out


# (B, H, Hkv, Tq, L, length, D): a decode step (GQA, past two key blocks, the cache longer than
# what is stored), a prompt (Tq = length, MHA), a prompt after a cache (MQA), a ragged head dim;
# a decode step over a cache longer than what is stored, a prompt whose head dim passes a warp
ATTENTION = [
    (2, 4, 2, 1, 150, 130, 32),
    (1, 3, 3, 20, 20, 20, 64),
    (2, 6, 1, 7, 80, 70, 16),
    (1, 2, 1, 5, 9, 9, 24),
    (2, 4, 2, 1, 40, 33, 24),
    (1, 3, 1, 5, 9, 5, 64),
]
# rows of every magnitude, ragged against a block's 8 warps and a warp's lanes, and more of
# them; one row of normal values, shorter than a warp or two warps long; random bit patterns
ROWS = [(s, "magnitudes") for s in [(3, 2, 13, 40), (2, 3, 50, 40)]]
ROWS += [((1, D), "normal") for D in (24, 64)]
CASES = [
    *cases(
        "kv_write",
        write,
        [(d, (2, 3, 9, 8), 1, 4) for d in FLOATS]
        + [(F32, (1, 2, 7, 5), 7, 0), (np.dtype(np.uint8), (2, 2, 6, 4), 2, 3)]
        + [(F32, (2, 2, 6), 1, 5)],  # an fp8 cache's scales (B, Hkv, L)
        ref=write_ref,
        exact=True,
    ),
    *cases(
        "kv_attention",
        plain_attention,
        [(d, *s) for d in (F32, BF16) for s in ATTENTION],
        ref=attention_ref,
    ),
    *cases(
        "kv_quantize",
        rows,
        [(d, s, f, v) for d in FLOATS for s, v in ROWS for f in FORMATS]
        + [(F32, (2048, 64), f, "bits") for f in FORMATS],
        ref=kv_quantize_ref,
        exact=True,
    ),
    *cases(
        "qattention",
        attention,
        [(d, f, *s) for d in (F32, BF16) for f in FORMATS for s in ATTENTION],
        ref=qattention_ref,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel(case, check):
    check(case)


# ---------------------------------------------------------------- what a case cannot say


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(fmt="int8"), "the quantized ones are fp8_e4m3, fp8_e5m2"),
        (dict(positions=np.arange(4)), "Tq positions"),
        (dict(q=np.zeros((1, 3, 3, 16), F32)), "H a multiple of Hkv"),
        (dict(k_scales=np.zeros((1, 2, 29), F32)), "scales (B, Hkv, L)"),
    ],
)
def test_qattention_refuses_arguments_that_do_not_fit(device, change, words):
    kc, ks, vc, vs = quantized_cache(1, 2, 30, 16, "fp8_e4m3")
    arrays = dict(q=np.zeros((1, 4, 3, 16), F32), k_codes=kc, k_scales=ks, v_codes=vc, v_scales=vs)
    args = {k: device.asarray(a) for k, a in {**arrays, **change}.items() if hasattr(a, "shape")}
    args.setdefault("positions", device.asarray(np.arange(7, 10)))
    kw = dict(fmt="fp8_e4m3", scale=0.25)
    kw.update({k: a for k, a in change.items() if not hasattr(a, "shape")})
    with pytest.raises(ValueError, match=re.escape(words)):
        device.qattention(**args, **kw)


@pytest.mark.parametrize("at", [np.arange(28, 31), np.array([4, 6, 7])], ids=["past L", "a gap"])
def test_cpu_attention_refuses_positions_it_cannot_attend_at(at):
    """The CPU reads the positions on the host and checks them; CUDA never reads them there (so
    that a decode step can be a CUDA graph): nn/lm.py's KVCache.advance raises when it is full."""
    kc, ks, vc, vs = quantized_cache(1, 2, 30, 16, "fp8_e4m3")
    q = np.zeros((1, 4, 3, 16), F32)
    words = re.escape("consecutive positions in [0, L = 30)")
    with pytest.raises(ValueError, match=words):
        cpu.qattention(q, kc, ks, vc, vs, "fp8_e4m3", at, 0.25)
    k = np.zeros((1, 2, 30, 16), F32)
    with pytest.raises(ValueError, match=words):
        cpu.kv_attention(q, k, k, at, 0.25)


def test_cpu_qattention_in_a_two_byte_dtype_is_the_fp32_result_rounded():
    kc, ks, vc, vs = quantized_cache(1, 2, 30, 16, "fp8_e4m3")
    q = rand((1, 4, 3, 16), BF16, seed=2)
    at = np.arange(22, 25)
    out = cpu.qattention(q, kc, ks, vc, vs, "fp8_e4m3", at, 0.25)
    want = cpu.qattention(q.astype(F32), kc, ks, vc, vs, "fp8_e4m3", at, 0.25)
    assert out.dtype == BF16
    np.testing.assert_array_equal(out, want.astype(BF16))


def test_the_spec_counts_the_causal_pairs():
    """qattention's scores: Tq (length - Tq) + Tq (Tq + 1) / 2 per query head, a decode step's
    length, a prompt's triangle."""
    assert kvcache.causal_pairs(1, 9) == 9
    assert kvcache.causal_pairs(4, 4) == 10
    assert kvcache.causal_pairs(2, 5) == 4 + 5
