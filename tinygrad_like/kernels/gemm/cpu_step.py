"""A decode step's fp32 GEMVs as ops of a compiled CPU step (backend/cpu/step_runner.py), the
launches cpu_gemv.py's gemv runs from Python, split over the threads the same way:
- matmul (B (K, N) C-contiguous, GPT-2's Conv1D weights): _columns' two halves of K, one a
  thread (both on one thread), then, after the barrier, C = p0 + p1 [+ bias] [+ add] [then=]
  over each thread's columns: the unfused launches' operations in their order, each rounded to
  fp32 (cpu.py's gemv, bias add and epilogue; elementwise/cpu_step.py's apply_epilogue);
- matmul_nt (W (N, K) C-contiguous: the tied LM head, x @ wte^T, and Llama's linear layers):
  quant/cpu_gemv.py's row GEMV on each thread's rows of W, then [+ add] [then=] over its
  columns of C.
The serial twins of the same compiled loops: each element of C the launch's bits."""

import numba
import numpy as np

from ...backend.cpu.step_runner import Unsupported, f32_at, form, op, share
from ..elementwise.cpu_step import apply_epilogue, epilogue
from ..quant.cpu_gemv import _gemv_kernel
from .cpu_gemv import _COLUMNS, COLUMNS, GEMV_BELOW, fp32_rows

_F32 = np.dtype(np.float32)
_columns1, _columns4 = _COLUMNS[_F32, 1].serial, _COLUMNS[_F32, 4].serial
_row_dots = _gemv_kernel(32, 0, 0, 0, 0).serial  # fp32 rows of W: no scales, no groups


@op
def _halves(t, T, a):
    # a: x (M, K), b (K, N), partial (2, M, N), fp32; M, K, N, rows of b a pass (1 or 4)
    M, K, N, rows = a[3], a[4], a[5], a[6]
    x, b = numba.carray(f32_at(a[0]), (M, K)), numba.carray(f32_at(a[1]), (K, N))
    partial = numba.carray(f32_at(a[2]), (2, M, N))
    for p in range(t, 2, T):  # _columns' program p: k in [p K / 2, (p + 1) K / 2)
        k0, k1 = p * K // 2, (p + 1) * K // 2
        if rows == 4:
            _columns4(x[:, k0:k1], b[k0:k1], partial[p : p + 1])
        else:
            _columns1(x[:, k0:k1], b[k0:k1], partial[p : p + 1])


@op
def _sum_halves(t, T, a):
    # a: partial (2, M, N), c (M, N), bias (N,) or 0, fp32; then the epilogue's four
    # (elementwise/cpu_step.py); M, N
    M, N = a[7], a[8]
    partial = numba.carray(f32_at(a[0]), (2, M, N))
    c = numba.carray(f32_at(a[1]), (M, N))
    lo, hi = share(N, t, T)
    for m in range(M):
        for j in range(lo, hi):
            c[m, j] = partial[0, m, j] + partial[1, m, j]
        if a[2]:
            bias = numba.carray(f32_at(a[2]), (N,))
            for j in range(lo, hi):
                c[m, j] = c[m, j] + bias[j]
    apply_epilogue(a, 3, c, lo, hi)


def _gemv_rows(a, b, *unfused):
    """a's rows (M, K) as a C-contiguous fp32 view, where a GEMV of a by b runs as the launch
    from Python runs it (cpu_gemv.gemv, fp32); else Unsupported."""
    M = a.size // a.shape[-1] if a.ndim and a.shape[-1] else 0
    if not 0 < M < GEMV_BELOW or a.dtype != _F32 or b.dtype != _F32 or b.ndim != 2:
        raise Unsupported("a GEMM that is no fp32 GEMV")
    if any(x is not None and x is not False for x in unfused):
        raise Unsupported("a GEMV with scale=, cast=, out= or aux=")
    if not a.flags.c_contiguous:
        raise Unsupported("a GEMV of a strided x")
    return a.reshape(M, a.shape[-1])


def _fp32_add(add, M, N):
    if add is not None and (add.dtype != _F32 or add.size != M * N):
        raise Unsupported("a GEMV with add= other than fp32 of C's shape")


@form("matmul")
def _matmul_form(ops, outs, a, b, bias=None, scale=None, cast=None, add=None, out=None,
                 then=None, aux=False):  # fmt: skip
    x = _gemv_rows(a, b, scale, cast, out, aux)
    (M, K), N = x.shape, b.shape[1]
    if not b.flags.c_contiguous or b.T.flags.c_contiguous or N > COLUMNS or outs[0] is None:
        raise Unsupported("matmul: B (K, N) C-contiguous, N <= COLUMNS")
    if bias is not None and (bias.dtype != _F32 or bias.shape != (N,)):
        raise Unsupported("matmul: an fp32 bias (N,)")
    _fp32_add(add, M, N)
    c, tail = epilogue(ops, outs, M, N, add, then)
    partial = ops.scratch((2, M, N))
    ops.add(_halves, x, b, partial, M, K, N, fp32_rows())
    ops.add(_sum_halves, partial, c, 0 if bias is None else bias, *tail, M, N)


@op
def _rows_of_w(t, T, a):
    # a: x (M, K), w (N, K), y (M, N), no scales (N, 0), no bias (0,), fp32; the epilogue's
    # four (elementwise/cpu_step.py); M, K, N
    M, K, N = a[9], a[10], a[11]
    x, w = numba.carray(f32_at(a[0]), (M, K)), numba.carray(f32_at(a[1]), (N, K))
    y = numba.carray(f32_at(a[2]), (M, N))
    scales, bias = numba.carray(f32_at(a[3]), (N, 0)), numba.carray(f32_at(a[4]), (0,))
    empty = numba.carray(f32_at(a[3]), (M, 0))  # x0, x1: fp32 rows have no nibble pairs
    lo, hi = share(N, t, T)
    if lo < hi:
        _row_dots(w[lo:hi], scales[lo:hi], x, empty, empty, bias, y[:, lo:hi])
        apply_epilogue(a, 5, y, lo, hi)


@form("matmul_nt")
def _matmul_nt_form(ops, outs, a, b, scale=None, cast=None, add=None, out=None, then=None,
                    aux=False):  # fmt: skip
    x = _gemv_rows(a, b, scale, cast, out, aux)
    (M, K), N = x.shape, b.shape[0]
    if not b.flags.c_contiguous or outs[0] is None:
        raise Unsupported("matmul_nt: W (N, K) C-contiguous")
    _fp32_add(add, M, N)
    y, tail = epilogue(ops, outs, M, N, add, then)
    none = ops.scratch(1)  # the address of the empty scales, bias and nibble rows
    ops.add(_rows_of_w, x, b, y, none, none, *tail, M, K, N)
