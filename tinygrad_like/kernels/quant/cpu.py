"""Quantized weights on the CPU (quant.cu's twin): a GEMM and a gather that decode the stored
codes as they read them (the layout: tinygrad_like/formats.py).

qmatmul takes one output channel (a row of W (N, K)) at a time, as quant.cu gives each row a
block: the row's codes are decoded into a K-long fp32 scratch row (in L1; decode_row: each
group of group_size elements to fp32 times its scale), then the row is dotted with each of the
M rows of x (compiled.vector_dot, reassociated so that LLVM vectorizes it; a warp's lanes and
warp_sum on the GPU); a decode step's few rows of x go to cpu_gemv.py's GEMV instead, each
code decoded as it is read (its IR decodes by these functions' bit operations). Rows go a block
of BLOCK_ROWS per prange iteration (the scratch made once per block). The decode functions
below are quant.cu's device functions of the same names: bit operations from the code to the
fp32 value, exact (every format's values are fp32 values), so both backends decode the same
bits; one function, minifloat_value, serves every small float by its fields
(tinygrad_like/formats.py FORMATS[fmt].fields), through fp16 (compiled.f32_from_f16_bits) where
quant.cu goes straight to fp32's bits: the same values.
"""

import functools

import numpy as np
from numba import prange

from ...backend.cpu.compiled import (
    device,
    f32_from_bits,
    f32_from_f16_bits,
    kernel,
    vector_dot,
)
from ...backend.cpu.halves import f32, rounded
from ...dtypes import bfloat16
from ...formats import FINITE, FORMATS, NAN_ONLY
from ..elementwise import cpu as elementwise
from ..elementwise.cpu import add as elementwise_add
from ..elementwise.spec import then_epilogue
from ..embedding.spec import check_ids
from ..gemm.cpu_bf16 import HAS_DOT, matmul_bf16
from .cpu_gemv import decode_rows, gemv
from .cpu_int8x import qmatmul_int8x, quantize_rows  # noqa: F401 (in their own file)
from .cpu_split import BLOCK_ROWS, DECODE_ONCE_FROM, SERIAL_BELOW, work

# The decode functions compute in int32 throughout (every constant an int32): Numba widens an
# int32 mixed with a Python int to int64, and its loops then do not vectorize.
i32 = np.int32


@device
def int8_value(code):
    """The int8 whose two's-complement bits are the byte code: code - 256 when the sign bit is
    set."""
    return (i32(code) ^ i32(0x80)) - i32(0x80)


@device
def int4_value(nibble):
    """The int4 value q in [-7, 7] of a nibble stored as q + 8."""
    return i32(nibble) - i32(8)


@device
def int4_float(nibble):
    """int4_value(nibble) as fp32, made from bits: the fp32 2^23 + nibble less 2^23 + 8, exact.
    The same value as np.float32(int4_value(nibble)); this form LLVM vectorizes (Numba widens
    the integer one to 64-bit lanes)."""
    return f32_from_bits(i32(nibble) | i32(0x4B000000)) - np.float32(8388616.0)


@device
def minifloat_value(code, exp_bits, man_bits, specials):
    """A small float's value over minifloat_scale(exp_bits), exactly: the fp16 (compiled.
    f32_from_f16_bits) with code's sign, code's exponent as the low bits of fp16's and code's
    mantissa as the top bits of fp16's, so that the multiply by minifloat_scale rebiases the
    exponent; a subnormal (exponent 0) is an fp16 subnormal. fp16 and fp8 E5M2 (exp_bits 5,
    IEEE) are fp16 themselves, their infinities and NaNs fp16's; an E4M3 NaN (NAN_ONLY: every
    bit of the magnitude set) gets fp16's exponent of all ones; no smaller format (fp4 E2M1:
    FINITE) reaches it. bf16 is fp32's top half (its scale 1). (1 sign, exp_bits <= 5 exponent
    and man_bits <= 10 mantissa bits, bias 2^(exp_bits - 1) - 1.) The values of quant.cu's
    minifloat_value and bf16_value, bit for bit (a NaN's payload aside: here E4M3's NaN keeps
    its mantissa). No branch: the loops calling it vectorize."""
    c = i32(code)
    if exp_bits == 8 and man_bits == 7:  # bf16: fp32's top half, its specials included
        return f32_from_bits(c << i32(16))
    sign = i32(1) << i32(exp_bits + man_bits)  # code's sign bit
    unit = i32(1) << (i32(10) - i32(man_bits))  # code's last place in fp16's bits
    # code as a signed integer (as int8_value: a sign extension) times unit: the magnitude in
    # place, the sign in fp16's bit 15 and the bits below it down to the magnitude, cleared
    half = ((c ^ sign) - sign) * unit & (i32(0x8000) | (sign - i32(1)) * unit)
    if specials == NAN_ONLY:  # E4M3: a magnitude of all ones carries into fp16's fifth
        half |= (half + unit) & i32(0x4000)  # exponent bit, the other four set already
    return f32_from_f16_bits(half)


@device
def minifloat_scale(exp_bits):
    """2^(15 - bias), bias = 2^(exp_bits - 1) - 1 (1 for bf16, exp_bits 8): what
    minifloat_value is multiplied by (exactly) to make the value."""
    if exp_bits == 8:
        return np.float32(1)
    return f32_from_bits((i32(143) - (i32(1) << i32(exp_bits - 1))) << i32(23))


@device
def element_value(code, exp_bits, man_bits, specials):
    """An 8- or 16-bit code's value before its scale: int8_value (exp_bits 0) or
    minifloat_value, as fp32 (quant.cu's element_value)."""
    if exp_bits == 0:
        return np.float32(int8_value(code))
    return minifloat_value(code, exp_bits, man_bits, specials)


@device
def nibble_value(nibble, exp_bits, man_bits):
    """A 4-bit code's value before its scale: int4_float (exp_bits 0) or fp4 E2M1's
    minifloat_value."""
    if exp_bits == 0:
        return int4_float(nibble)
    return minifloat_value(nibble, exp_bits, man_bits, FINITE)


@device
def decode_row(codes, scales, group_size, exp_bits, man_bits, specials, w):
    """w (K,) fp32 = the row whose codes (K,) or (K / 2,) and scales (K / group_size,) (empty
    for the unscaled formats) are given, in the format of these fields (Format.fields): each
    group's values (element_value, nibble_value) times its scale times minifloat_scale (a power
    of two: the product is the scaled value, exactly), a loop per group that vectorizes. A
    4-bit byte holds elements 2j (low nibble) and 2j + 1 (high)."""
    rebias = minifloat_scale(exp_bits) if exp_bits else np.float32(1)
    for group in range(w.shape[0] // group_size):
        lo = group * group_size
        factor = (scales[group] if scales.shape[0] else np.float32(1)) * rebias
        values = w[lo : lo + group_size]
        if codes.shape[0] < w.shape[0]:
            pairs = codes[lo // 2 : (lo + group_size) // 2]
            for j in range(group_size // 2):
                values[2 * j] = nibble_value(pairs[j] & 15, exp_bits, man_bits) * factor
                values[2 * j + 1] = nibble_value(pairs[j] >> 4, exp_bits, man_bits) * factor
        else:
            row = codes[lo : lo + group_size]
            for k in range(group_size):
                values[k] = element_value(row[k], exp_bits, man_bits, specials) * factor


@functools.cache
def _qmatmul_kernel(exp_bits, man_bits, specials):
    """The qmatmul of one format, compiled with its fields as constants."""

    @kernel(serial_below=SERIAL_BELOW, work=work, fastmath=True)
    def _qmatmul(codes, scales, group_size, x, bias, y):
        # codes (N, *), scales (N, G) or (N, 0), x (M, K) fp32, bias (N,) or (0,), y (M, N)
        # fp32: a block of rows of W per iteration (quant.cu's qmatmul: a block per row), each
        # row decoded once into w (decode_row) and dotted with every row of x. One core below
        # SERIAL_BELOW's work (work, compiled.kernel's rule).
        M, K = x.shape
        N = codes.shape[0]
        for b in prange(-(-N // BLOCK_ROWS)):
            w = np.empty(K, np.float32)
            for n in range(b * BLOCK_ROWS, min(N, (b + 1) * BLOCK_ROWS)):
                decode_row(codes[n], scales[n], group_size, exp_bits, man_bits, specials, w)
                for m in range(M):
                    d = vector_dot(x[m], w)
                    y[m, n] = d + bias[n] if bias.shape[0] else d

    return _qmatmul


@kernel
def _qembedding(out, codes, scales, group_size, exp_bits, man_bits, specials, idx):
    # out (T, K) fp32, idx (T,): the row of each id decoded straight into its output row
    # (quant.cu's qembedding: a block per id). out first: one core below SERIAL_BELOW elements.
    for t in prange(idx.shape[0]):
        row = idx[t]
        decode_row(codes[row], scales[row], group_size, exp_bits, man_bits, specials, out[t])


def _kernel_args(codes, scales, fmt, group_size):
    """The compiled kernels' form of a weight: codes, scales (an (N, 0) array when there are
    none: one signature for every format), the group size and its format's fields."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}: use one of {', '.join(FORMATS)}")
    if scales is None:
        scales, group_size = np.empty((codes.shape[0], 0), np.float32), codes.shape[1]
    return (codes, scales, group_size) + FORMATS[fmt].fields


def _qmatmul_rows(codes, scales, group_size, fmt, fields, xs, b, y):
    """y (M, N) = xs (M, K) W^T + b: a decode step's few rows of x by cpu_gemv's GEMV (each code
    decoded as it is read) where it takes the layout, else the format's _qmatmul_kernel (each row
    of W decoded once and dotted with every row of x)."""
    bits = FORMATS[fmt].bits
    if xs.shape[0] < DECODE_ONCE_FROM and gemv(codes, scales, group_size, bits, fields, xs, b, y):
        return
    _qmatmul_kernel(*fields)(codes, scales, group_size, xs, b, y)


def qmatmul(
    x, codes, scales, fmt, group_size, bias=None, add=None, then=None, aux=False, dtype=None
):
    """W decoded row by row inside the kernel (a prompt's: a tile of rows at a time, then BLAS),
    accumulated in fp32 and rounded once (2-byte x: computed in fp32); then + add (M, N) by
    elementwise's add, written into y itself: a pass over y while it is in the cache (a decode
    step's M is 1), the bits of the unfused add; or then= (elementwise's then_epilogue). A
    prompt of bf16 x against bf16 weights: gemm/cpu_bf16.py's dot products where the CPU has
    them (W's codes are its bf16 values), no decoding."""
    if fmt == "bf16" and x.dtype == bfloat16 and HAS_DOT and x.shape[0] >= _TILED_FROM:
        y = matmul_bf16(x, codes.view(bfloat16).T)
        if bias is not None:
            y += f32(bias)
    else:
        codes, scales, group_size, *fields = _kernel_args(codes, scales, fmt, group_size)
        xs = np.ascontiguousarray(f32(x), dtype=np.float32)
        b = np.zeros(0, np.float32) if bias is None else np.ascontiguousarray(f32(bias), np.float32)
        y = np.empty((x.shape[0], codes.shape[0]), np.float32)
        if xs.shape[0] >= _TILED_FROM:  # a prompt: tiles of W and BLAS
            _tiled(xs, (codes, scales, group_size, *fields), FORMATS[fmt].bits, b, y)
        else:
            _qmatmul_rows(codes, scales, group_size, fmt, tuple(fields), xs, b, y)
    y = rounded(y, x.dtype if dtype is None else dtype)
    return then_epilogue(
        elementwise, y if add is None else elementwise_add(add, y, out=y), then, aux
    )


# From this many rows of x (a prompt) W is decoded a tile of rows at a time into an fp32 scratch
# of _TILE elements (8 MB, never all of W) and each tile multiplied by BLAS's sgemm: the
# decode is paid once per row of W, as in the decode-once loop, and the products run at the
# GEMM's rate instead of a dot per (row of x, row of W).
_TILED_FROM = 16
_TILE = 1 << 21


def _tiled(xs, args, bits, b, y):
    """y (M, N) = xs (M, K) W^T + b (N,) or (0,), fp32: W's rows decoded a tile at a time into
    one scratch (cpu_gemv.decode_rows, vector by vector, where the groups are whole vectors;
    else _qembedding over the tile's row ids), each tile's products np.matmul's (BLAS), then
    the bias added (fp32, as the kernel adds it)."""
    N, K = y.shape[1], xs.shape[1]
    codes, scales, group_size, *fields = args
    tiles = -(-N // max(1, _TILE // K))
    rows = -(-N // tiles)  # tiles of equal rows: no small last one for BLAS
    tile = np.empty((rows, K), np.float32)
    for n0 in range(0, N, rows):
        n1 = min(N, n0 + rows)
        part, ids = tile[: n1 - n0], np.arange(n0, n1)
        if not decode_rows(part, codes, scales, group_size, bits, tuple(fields), ids):
            _qembedding(part, *args, ids)
        y[:, n0:n1] = xs @ part.T
    if b.shape[0]:
        y += b


def qembedding(codes, scales, idx, fmt, group_size):
    check_ids(idx, codes.shape[0])
    args = _kernel_args(codes, scales, fmt, group_size)
    K = codes.shape[1] * (2 if FORMATS[fmt].bits == 4 else 1)
    flat = np.ascontiguousarray(idx.reshape(-1), dtype=np.int64)
    out = np.empty((flat.shape[0], K), np.float32)
    _qembedding(out, *args, flat)
    return out.reshape(idx.shape + (K,))
