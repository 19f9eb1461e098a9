"""Quantized weights on the CPU (quant.cu's twin): a GEMM and a gather that decode the stored
codes as they read them (the layout: backend/contract.py's "quant" section).

qmatmul takes one output channel (a row of W (N, K)) at a time, as quant.cu gives each row a
block: the row's codes are decoded into a K-long fp32 scratch row (in L1), each group of
group_size elements times its scale, then the row is dotted with each of the M rows of x over
LANES lanes (row_dot, a warp's lanes on the GPU). Rows go a block of _BLOCK_ROWS per prange
iteration (the scratch made once per block). The decode functions below are quant.cu's device
functions of the same names: bit operations from the code to the fp32 value, exact (every
format's values are fp32 values), so both backends decode the same bits.
"""

import numpy as np
from numba import prange

from ..contract import check_ids
from .compiled import LANES, device, f32_from_bits, kernel, row_dot
from .runtime import f32, rounded

# The formats the kernels decode, in the order of quant.cu's QuantFormat (tinygrad_like/quant.py
# FORMATS holds what each one is); a kernel branches on the index once per group.
DECODED = ("int8", "int4", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "bf16", "fp16")
INT8, INT4, FP8_E4M3, FP8_E5M2, FP4_E2M1, BF16, FP16 = range(len(DECODED))

# What a small float's largest exponent field means: nothing special (fp4 E2M1), NaN only
# where every other bit is set too (fp8 E4M3 "fn": no infinities), or IEEE infinities and NaNs
# (fp16, fp8 E5M2).
FINITE, NAN_ONLY, IEEE = range(3)

_BLOCK_ROWS = 8  # rows of W per prange iteration


@device
def int8_value(code):
    """The int8 whose two's-complement bits are the byte code, as fp32: code - 256 when the
    sign bit is set."""
    return np.float32((np.int32(code) ^ 0x80) - 0x80)


@device
def int4_value(nibble):
    """The int4 value q in [-8, 7] of a nibble stored as q + 8, as fp32."""
    return np.float32(np.int32(nibble) - 8)


@device
def minifloat_value(code, exp_bits, man_bits, specials):
    """The fp32 value of a small float's bits code (1 sign, exp_bits exponent, man_bits
    mantissa bits, bias 2^(exp_bits - 1) - 1; specials: FINITE, NAN_ONLY or IEEE), exactly.
    The exponent and mantissa are moved to fp32's places and the exponent rebiased; a
    subnormal (exponent 0) is decoded as the normal 2^(1 - bias) (1 + m / 2^man_bits) minus
    2^(1 - bias), which is exact; an IEEE exponent of all ones becomes fp32's (inf, NaN)."""
    c = np.int32(code)
    bias = (1 << (exp_bits - 1)) - 1
    mag = c & ((1 << (exp_bits + man_bits)) - 1)
    e = mag >> man_bits
    bits = (mag << (23 - man_bits)) + ((127 - bias) << 23)
    if e == 0:
        f = f32_from_bits(np.int32(bits + (1 << 23))) - f32_from_bits(np.int32((128 - bias) << 23))
    elif specials == IEEE and e == (1 << exp_bits) - 1:
        f = f32_from_bits(np.int32(bits + ((128 - (1 << (exp_bits - 1))) << 23)))
    elif specials == NAN_ONLY and mag == (1 << (exp_bits + man_bits)) - 1:
        f = np.float32(np.nan)
    else:
        f = f32_from_bits(np.int32(bits))
    return -f if (c >> (exp_bits + man_bits)) & 1 else f


@device
def bf16_value(code):
    """The fp32 of bf16 bits: the top half of its fp32 bits."""
    return f32_from_bits(np.int32(np.int32(code) << 16))


@device
def fp16_value(code):
    """The fp32 of fp16 bits (subnormals, inf and NaN included)."""
    return minifloat_value(code, 5, 10, IEEE)


@device
def decode_row(codes, scales, fmt, group_size, w):
    """w (K,) fp32 = the row whose codes (K,) or (K / 2,) and scales (K / group_size,) (empty
    for the unscaled formats) are given: each group's decoded codes times its scale."""
    K = w.shape[0]
    for group in range(K // group_size):
        s = scales[group] if scales.shape[0] else np.float32(1)
        lo, hi = group * group_size, (group + 1) * group_size
        if fmt == INT4 or fmt == FP4_E2M1:  # two elements a byte: 2j low, 2j + 1 high
            for j in range(lo // 2, hi // 2):
                low, high = codes[j] & 0xF, codes[j] >> 4
                if fmt == INT4:
                    w[2 * j], w[2 * j + 1] = int4_value(low) * s, int4_value(high) * s
                else:
                    w[2 * j] = minifloat_value(low, 2, 1, FINITE) * s
                    w[2 * j + 1] = minifloat_value(high, 2, 1, FINITE) * s
        elif fmt == INT8:
            for k in range(lo, hi):
                w[k] = int8_value(codes[k]) * s
        elif fmt == FP8_E4M3:
            for k in range(lo, hi):
                w[k] = minifloat_value(codes[k], 4, 3, NAN_ONLY) * s
        elif fmt == FP8_E5M2:
            for k in range(lo, hi):
                w[k] = minifloat_value(codes[k], 5, 2, IEEE) * s
        elif fmt == BF16:
            for k in range(lo, hi):
                w[k] = bf16_value(codes[k])
        else:
            for k in range(lo, hi):
                w[k] = fp16_value(codes[k])


@kernel
def _qmatmul(codes, scales, fmt, group_size, x, bias, y):
    # codes (N, *), scales (N, G) or (N, 0), x (M, K) fp32, bias (N,) or (0,), y (M, N) fp32:
    # a block of rows of W per iteration, each row decoded once into w and dotted with every
    # row of x (quant.cu's qmatmul: a block per row). codes first: the kernel runs on one core
    # below SERIAL_BELOW codes (compiled.kernel's rule keys on the first argument).
    M, K = x.shape
    N = codes.shape[0]
    for b in prange(-(-N // _BLOCK_ROWS)):
        w, acc = np.empty(K, np.float32), np.empty(LANES, np.float32)
        for n in range(b * _BLOCK_ROWS, min(N, (b + 1) * _BLOCK_ROWS)):
            decode_row(codes[n], scales[n], fmt, group_size, w)
            for m in range(M):
                dot = row_dot(x[m], w, acc)
                y[m, n] = dot + bias[n] if bias.shape[0] else dot


@kernel
def _qembedding(out, codes, scales, fmt, group_size, idx):
    # out (T, K) fp32, idx (T,): the row of each id decoded straight into its output row
    # (quant.cu's qembedding: a block per id). out first: one core below SERIAL_BELOW elements.
    for t in prange(idx.shape[0]):
        decode_row(codes[idx[t]], scales[idx[t]], fmt, group_size, out[t])


def _kernel_args(codes, scales, fmt, group_size):
    """The compiled kernels' form of a weight: its format's index in DECODED, and scales as an
    (N, 0) array when there are none (one signature for every format)."""
    if fmt not in DECODED:
        raise ValueError(f"unknown weight format {fmt!r}: use one of {', '.join(DECODED)}")
    if scales is None:
        scales, group_size = np.empty((codes.shape[0], 0), np.float32), codes.shape[1]
    return codes, scales, DECODED.index(fmt), group_size


def qmatmul(x, codes, scales, fmt, group_size, bias=None):
    """x (M, K) @ W^T (+ bias (N,)) -> (M, N) in x's dtype: W (N, K) decoded row by row inside
    the kernel, accumulated in fp32 and rounded once (2-byte x: computed in fp32)."""
    codes, scales, fmt_id, group_size = _kernel_args(codes, scales, fmt, group_size)
    xs = np.ascontiguousarray(f32(x), dtype=np.float32)
    b = np.zeros(0, np.float32) if bias is None else np.ascontiguousarray(f32(bias), np.float32)
    y = np.empty((x.shape[0], codes.shape[0]), np.float32)
    _qmatmul(codes, scales, fmt_id, group_size, xs, b, y)
    return rounded(y, x.dtype)


def qembedding(codes, scales, idx, fmt, group_size):
    """Rows idx (...) of W (N, K) -> (..., K) fp32, only the gathered rows decoded."""
    check_ids(idx, codes.shape[0])
    codes, scales, fmt_id, group_size = _kernel_args(codes, scales, fmt, group_size)
    K = codes.shape[1] * (2 if fmt in ("int4", "fp4_e2m1") else 1)
    flat = np.ascontiguousarray(idx.reshape(-1), dtype=np.int64)
    out = np.empty((flat.shape[0], K), np.float32)
    _qembedding(out, codes, scales, fmt_id, group_size, flat)
    return out.reshape(idx.shape + (K,))
