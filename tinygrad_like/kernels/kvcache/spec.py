"""A KV cache in an 8-bit float format (nn/lm.py KVCache, inference only). Keys and values
(B, Hkv, L, D) are stored as codes (B, Hkv, L, D) uint8 of fmt, one of KV_FORMATS
(tinygrad_like/formats.py FORMATS), and scales (B, Hkv, L) fp32, one per row of D (a position of a
kv head): the row's max |x| over the format's qmax (1 for an all-zero row), an element being its
code's value x its row's scale, as quant.quantize scales a weight's output channel. kv_quantize
makes the rows of the positions appended; qattention reads the cache's first `length` positions
and decodes each code as it reads it: there is never a dequantized copy.

cpu.py: one (batch, head, query) row per program, each key decoded into a row and dotted, the
online softmax of attention's decode rows (kernels/attention/cpu.py softmax_block); cuda.py +
kvcache.cu: one block per (batch, query head, query).
"""

import numpy as np

from ..record import Out, kernel, like, per_element

KV_FORMATS = ("fp8_e4m3", "fp8_e5m2")


def causal_pairs(Tq, length):
    """(query, key) pairs of a causal attention of Tq queries over `length` keys, query i at
    position length - Tq + i seeing keys 0 ... that position."""
    return Tq * (length - Tq) + Tq * (Tq + 1) // 2


def _kv_scores(q, length):
    """Scores qattention computes for q (B, H, Tq, D): the causal pairs of each query head."""
    return q.shape[0] * q.shape[1] * causal_pairs(q.shape[2], length)


def _kv_read(outs, q, k_codes, k_scales, v_codes, v_scales, fmt, length, scale):
    """q, and the codes and scales of the first `length` positions of K and V."""
    B, Hkv, _, D = k_codes.shape
    return q.nbytes + 2 * B * Hkv * length * (D * k_codes.itemsize + k_scales.itemsize)


@kernel(
    shape=lambda x, fmt: (Out(tuple(x.shape), np.uint8), Out(tuple(x.shape[:-1]), np.float32)),
    flops=per_element(2),
)
def kv_quantize(x, fmt):
    """x (..., D) float -> codes (..., D) uint8 and scales (...) fp32 of fmt (KV_FORMATS), one
    scale per row: max |x| / qmax (1 for an all-zero row); a code is x / scale rounded to fmt
    (to nearest, ties to even) within +-qmax: quant.quantize's codes and scales of the rows as
    a weight of one scale per output channel, bit for bit. In fp32 (fp64 x rounded to it).
    2 FLOPs per element: the max and the divide."""


@kernel(
    shape=lambda q, *args: like(q),
    # per (query head, query, key) pair: q k and p v (2 D each), the online softmax (5) and the
    # two row scales (of the key's score, of the value's weight)
    flops=lambda r, q, kc, ks, vc, vs, fmt, length, scale: (
        (4 * q.shape[-1] + 7) * _kv_scores(q, length)
    ),
    exps=lambda r, q, kc, ks, vc, vs, fmt, length, scale: _kv_scores(q, length),
    reads=_kv_read,
)
def qattention(q, k_codes, k_scales, v_codes, v_scales, fmt, length, scale):
    """Causal attention of q (B, H, Tq, D) over the first `length` positions of an fp8 cache
    (codes (B, Hkv, L, D) uint8, scales (B, Hkv, L) fp32 for K and for V, fmt of KV_FORMATS),
    Tq <= length <= L, H a multiple of Hkv -> out (B, H, Tq, D) in q's dtype =
    softmax(scale q K^T, future keys masked) V, query i at position length - Tq + i, query head
    h against kv head h // (H / Hkv); K and V decoded inside the kernel, fp32 accumulation."""


# ---------------------------------------------------------------- checks both backends run


def check_kv_format(fmt):
    """Raise ValueError unless fmt is one of KV_FORMATS (the kernels' template arguments)."""
    if fmt not in KV_FORMATS:
        raise ValueError(f"a KV cache in {fmt!r}: the quantized ones are {', '.join(KV_FORMATS)}")


def check_kv_attention(q, k_codes, k_scales, v_codes, v_scales, fmt, length):
    """Raise ValueError unless qattention's arguments fit (the kernels index the cache by these
    shapes, with no bounds check): fmt one of KV_FORMATS, q (B, H, Tq, D), codes (B, Hkv, L, D)
    and scales (B, Hkv, L) alike for K and V, H a multiple of Hkv, Tq <= length <= L."""
    check_kv_format(fmt)
    shapes = (
        f"qattention: q {q.shape}, codes {k_codes.shape} and {v_codes.shape}, scales "
        f"{k_scales.shape} and {v_scales.shape}, length {length}"
    )
    if q.ndim != 4 or k_codes.ndim != 4 or k_codes.shape != v_codes.shape:
        raise ValueError(f"{shapes}: need q (B, H, Tq, D) and codes (B, Hkv, L, D) for K and V")
    B, H, Tq, D = q.shape
    _, Hkv, L, _ = k_codes.shape
    if (
        k_codes.shape[0] != B
        or k_codes.shape[3] != D
        or not Hkv
        or H % Hkv
        or k_scales.shape != (B, Hkv, L)
        or v_scales.shape != (B, Hkv, L)
        or not Tq <= length <= L
    ):
        raise ValueError(
            f"{shapes}: need codes (B, Hkv, L, D) with H a multiple of Hkv, scales (B, Hkv, L) "
            "and Tq <= length <= L"
        )
