"""Quantized weights in a compiled CPU step (backend/cpu/step_runner.py):
- qmatmul of a decode step's few rows (cpu.py's, where cpu_gemv.py's GEMV takes the layout; a
  bf16 x widened first, exactly, as cpu.py widens it): the format's GEMV (its serial twin: each
  code decoded as it is read, the same bits) on each thread's rows of W, then [+ add] [then=]
  over its columns of y, the launch's epilogue; a 4-bit W's x split into its even and odd
  elements first, by one thread (gemv's x0, x1);
- with int8 activations (llama.cpp's Q8_0 blocks): quantize_rows on each thread's rows of x
  (cpu_int8x.py's, its serial twin), then qmatmul_int8x's integer dots (its serial twin) on each
  thread's rows of W, each thread making its own copy of the kernel's per-call scratch (each
  block's code sum, a 4-bit W's x split into even and odd codes), then the epilogue as qmatmul's;
- qembedding: the ids' rows of W decoded (cpu.py's _qembedding, its serial twin), the ids split
  over the threads, checked on the host before each run (spec.check_ids, the launch's own check).
Each format's GEMV is a kernel of its own (its fields compiled in: cpu_gemv._gemv_kernel), so
the qmatmul op is compiled once per format (step_runner.variant)."""

import numba
import numpy as np

from ...backend.cpu.halves import _bf16_widened
from ...backend.cpu.runtime import THREADS
from ...backend.cpu.step_runner import (
    Unsupported,
    f32_at,
    form,
    i8_at,
    i32_at,
    i64_at,
    op,
    share,
    u8_at,
    u16_at,
    u32_at,
    variant,
)
from ...dtypes import bfloat16
from ...formats import FORMATS
from ..elementwise.cpu_step import apply_epilogue, epilogue
from ..embedding.spec import check_ids
from .cpu import _kernel_args, _qembedding
from .cpu_gemv import NIBBLE_BYTES, _gemv_kernel
from .cpu_int8x import _QMATMUL_INT8X, _quantize_rows
from .cpu_split import DECODE_ONCE_FROM
from .spec import X_BLOCK, int8x_out

_dots = _codes_at = None  # a format's GEMV and its codes' pointer: bound by variant()
_decoded = _qembedding.serial
_int8_blocks = _quantize_rows.serial
_widened = _bf16_widened.serial  # bf16 bits (n,) -> fp32 bits (n,)


@op
def _widen(t, T, a):
    # a: x (n,) bf16 as its bits (uint16), out (n,) fp32 as its bits (uint32); n
    n = a[2]
    lo, hi = share(n, t, T)
    if lo < hi:
        x, out = numba.carray(u16_at(a[0]), (n,)), numba.carray(u32_at(a[1]), (n,))
        _widened(x[lo:hi], out[lo:hi])


@op
def _pairs(t, T, a):
    # a: x (M, K), x0, x1 (M, K / 2) fp32; M, K: x's even and odd elements (gemv's x0, x1)
    M, K = a[3], a[4]
    if t == 0:
        x = numba.carray(f32_at(a[0]), (M, K))
        x0, x1 = numba.carray(f32_at(a[1]), (M, K // 2)), numba.carray(f32_at(a[2]), (M, K // 2))
        for m in range(M):
            for i in range(K // 2):
                x0[m, i], x1[m, i] = x[m, 2 * i], x[m, 2 * i + 1]


@op
def _qgemv(t, T, a):
    # a: codes (N, W) uint8 or uint16, scales (N, G), x (M, K), x0, x1 (M, K0), bias (N or 0,),
    # y (M, N), all but codes fp32; the epilogue's four (elementwise/cpu_step.py); N, W, G, M,
    # K, K0, the bias's length
    N, W, G, M, K, K0, nb = a[11], a[12], a[13], a[14], a[15], a[16], a[17]
    lo, hi = share(N, t, T)
    if lo == hi:
        return
    codes, scales = numba.carray(_codes_at(a[0]), (N, W)), numba.carray(f32_at(a[1]), (N, G))
    x = numba.carray(f32_at(a[2]), (M, K))
    x0, x1 = numba.carray(f32_at(a[3]), (M, K0)), numba.carray(f32_at(a[4]), (M, K0))
    bias = numba.carray(f32_at(a[5]), (nb,))
    y = numba.carray(f32_at(a[6]), (M, N))
    _dots(codes[lo:hi], scales[lo:hi], x, x0, x1, bias[lo:hi] if nb else bias, y[:, lo:hi])
    apply_epilogue(a, 7, y, lo, hi)


@form("qmatmul")
def _qmatmul_form(
    ops, outs, x, codes, scales, fmt, group_size, bias=None, add=None, then=None, aux=False,
    dtype=None,
):  # fmt: skip
    fp32 = np.dtype(np.float32)
    M, K = x.shape
    if x.dtype not in (fp32, bfloat16) or not M < DECODE_ONCE_FROM or aux:
        raise Unsupported("qmatmul: a decode step's rows of fp32 or bf16 x")
    if (dtype or x.dtype) != fp32:
        raise Unsupported("qmatmul: an fp32 result")
    if outs[0] is None or any(a is not None and a.dtype != fp32 for a in (bias, add)):
        raise Unsupported("qmatmul: an fp32 bias and add=")
    codes, scales, group_size, *fields = _kernel_args(codes, scales, fmt, group_size)
    bits, N = FORMATS[fmt].bits, codes.shape[0]
    group_bytes = group_size // 2 if bits == 4 else 0
    if (bits == 4 and group_bytes % NIBBLE_BYTES) or (
        bits != 4 and (codes.shape[1] != K or scales.shape[1] > 1)
    ):
        raise Unsupported(f"qmatmul: {fmt} in a layout the GEMV does not read")
    key = "_".join(map(str, (bits, *fields, group_bytes)))
    gemv = variant(
        _qgemv,
        key,
        _dots=_gemv_kernel(bits, *fields, group_bytes).serial,
        _codes_at=u16_at if bits == 16 else u8_at,
    )
    y, tail = epilogue(ops, outs, M, N, add, then)
    none = ops.scratch(1)  # the address of what is empty: x0 and x1 but for 4 bits, no bias
    if x.dtype == bfloat16:  # widened first, as cpu.py's f32(x) (exact)
        x16, x = x, ops.scratch((M, K))
        ops.add(_widen, x16.view(np.uint16), x.view(np.uint32), M * K)
    x0 = x1 = none
    if bits == 4:
        x0, x1 = ops.scratch((M, K // 2)), ops.scratch((M, K // 2))
        ops.add(_pairs, x, x0, x1, M, K)
    ops.add(
        gemv,
        codes,
        scales if scales.size else none,
        x,
        x0,
        x1,
        none if bias is None else bias,
        y,
        *tail,
        N,
        codes.shape[1],
        scales.shape[1],
        M,
        K,
        K // 2 if bits == 4 else 0,
        0 if bias is None else N,
    )


@op
def _qembedding_op(t, T, a):
    # a: out (n, K) fp32, codes (V, W) uint8 (or uint16: 16 bits), scales (V, G) fp32, ids (n,)
    # int64; n, K, V, W, G, group size, the format's fields (exp_bits, man_bits, specials), bits
    n, K, V, W, G, group = a[4], a[5], a[6], a[7], a[8], a[9]
    exp_bits, man_bits, specials, bits = a[10], a[11], a[12], a[13]
    lo, hi = share(n, t, T)
    if lo == hi:
        return
    out, ids = numba.carray(f32_at(a[0]), (n, K)), numba.carray(i64_at(a[3]), (n,))
    scales = numba.carray(f32_at(a[2]), (V, G))
    if bits == 16:
        codes16 = numba.carray(u16_at(a[1]), (V, W))
        _decoded(out[lo:hi], codes16, scales, group, exp_bits, man_bits, specials, ids[lo:hi])
    else:
        codes8 = numba.carray(u8_at(a[1]), (V, W))
        _decoded(out[lo:hi], codes8, scales, group, exp_bits, man_bits, specials, ids[lo:hi])


@form("qembedding")
def _qembedding_form(ops, outs, codes, scales, idx, fmt, group_size):
    if idx.dtype != np.int64 or outs[0] is None:
        raise Unsupported("qembedding: int64 ids")
    V = codes.shape[0]
    ops.check(("ids", id(idx), V), lambda: check_ids(idx, V), idx)
    codes, scales, group_size, *fields = _kernel_args(codes, scales, fmt, group_size)
    none = ops.scratch(1)
    K = outs[0].shape[-1]
    ops.add(
        _qembedding_op,
        outs[0].reshape(idx.size, K),
        codes,
        scales if scales.size else none,
        idx,
        idx.size,
        K,
        V,
        codes.shape[1],
        scales.shape[1],
        group_size,
        *fields,
        FORMATS[fmt].bits,
    )


@op
def _quantize(t, T, a):
    # a: x (M, K) fp32, codes (M, K) int8, scales (M, K / X_BLOCK) fp32; M, K
    M, K = a[3], a[4]
    lo, hi = share(M, t, T)
    if lo < hi:
        x, codes = numba.carray(f32_at(a[0]), (M, K)), numba.carray(i8_at(a[1]), (M, K))
        scales = numba.carray(f32_at(a[2]), (M, K // X_BLOCK))
        _int8_blocks(x[lo:hi], codes[lo:hi], scales[lo:hi])


@form("quantize_rows")
def _quantize_rows_form(ops, outs, x):
    if x.dtype != np.float32 or x.ndim != 2 or outs[0] is None or outs[1] is None:
        raise Unsupported("quantize_rows: fp32 rows")
    ops.add(_quantize, x, outs[0], outs[1], *x.shape)


@op
def _int8_dots(t, T, a):
    # a: codes (N, W) uint8, scales (N, G), group_of (nb,) int32, xq (M, K) int8, x0, x1
    # (T', M, K0) int8 (the threads' own; for int8 W unused), xs (M, nb) fp32, xoff (T', M, nb)
    # int32 (the threads' own), bias (N or 0,), y (M, N) fp32; the epilogue's four
    # (elementwise/cpu_step.py); N, W, G, M, K, K0, nb, the bias's length, T' (the threads the
    # scratch is made for)
    N, W, G, M, K, K0 = a[14], a[15], a[16], a[17], a[18], a[19]
    nb, bias_n, kept = a[20], a[21], a[22]
    lo, hi = share(N, t, T)
    if lo == hi:
        return
    codes, scales = numba.carray(u8_at(a[0]), (N, W)), numba.carray(f32_at(a[1]), (N, G))
    group_of, xq = numba.carray(i32_at(a[2]), (nb,)), numba.carray(i8_at(a[3]), (M, K))
    x0, x1 = numba.carray(i8_at(a[4]), (kept, M, K0)), numba.carray(i8_at(a[5]), (kept, M, K0))
    xs, xoff = numba.carray(f32_at(a[6]), (M, nb)), numba.carray(i32_at(a[7]), (kept, M, nb))
    bias, y = numba.carray(f32_at(a[8]), (bias_n,)), numba.carray(f32_at(a[9]), (M, N))
    pairs = (x0[t], x1[t]) if K0 else (xq, xq)  # int8 W: x0 = x1 = xq, as the kernel is called
    _dots(
        codes[lo:hi], scales[lo:hi], group_of, xq, pairs[0], pairs[1], xs, xoff[t],
        bias[lo:hi] if bias_n else bias, y[:, lo:hi],
    )  # fmt: skip
    apply_epilogue(a, 10, y, lo, hi)


@form("qmatmul_int8x")
def _qmatmul_int8x_form(
    ops, outs, xcodes, xscales, codes, scales, fmt, group_size, dtype, bias=None, add=None,
    then=None, aux=False,
):  # fmt: skip
    int8x_out(xcodes, xscales, codes, scales, fmt, group_size, dtype, bias, add)
    fp32 = np.dtype(np.float32)
    M, K = xcodes.shape
    if not M < DECODE_ONCE_FROM or aux or np.dtype(dtype) != fp32 or outs[0] is None:
        raise Unsupported("qmatmul_int8x: a decode step's rows into fp32")
    if any(a is not None and a.dtype != fp32 for a in (bias, add)) or scales.dtype != fp32:
        raise Unsupported("qmatmul_int8x: fp32 scales, bias and add=")
    nb, N = xscales.shape[1], codes.shape[0]
    group_of = np.arange(nb, dtype=np.int32) // np.int32(group_size // X_BLOCK)
    K0 = K // 2 if fmt == "int4" else 0
    x0, x1 = ops.scratch((THREADS, M, K0), np.int8), ops.scratch((THREADS, M, K0), np.int8)
    xoff = ops.scratch((THREADS, M, nb), np.int32)
    none = ops.scratch(1)
    y, tail = epilogue(ops, outs, M, N, add, then)
    dots = variant(_int8_dots, fmt, _dots=_QMATMUL_INT8X[fmt].serial)
    ops.add(
        dots, codes, scales, group_of, xcodes, x0, x1, xscales, xoff,
        none if bias is None else bias, y, *tail,
        N, codes.shape[1], scales.shape[1], M, K, K0, nb, 0 if bias is None else N, THREADS,
    )  # fmt: skip
