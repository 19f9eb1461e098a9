"""The decode step's GEMMs on the CPU (cpu.py's _gemm with fewer than GEMV_BELOW rows of A, fp32
or 2-byte operands): compiled GEMVs instead of BLAS, whose sgemv streamed GPT-2's weights well
below one core's read bandwidth (docs/decode.md: the figures). Two layouts of B (K, N):
- B the transpose of a C-contiguous W (N, K) (matmul_nt: the tied LM head, x @ wte^T): each
  element of C a row of W dotted with a row of A, kernels/quant/cpu_gemv.py's GEMV with fp32
  as its unquantized format (sixteen lanes and four sums, added in a fixed tree), a bf16 or
  fp16 W read as its 2-byte codes;
- B C-contiguous (K, N) (matmul: GPT-2's Conv1D weights, a 2-byte one widened as it is read):
  _columns, K in two fixed halves, one a program, each streaming its rows of B in order into a
  partial C: p[m, n] = (..((a[m, k0] b[k0, n]) + a[m, k0 + 1] b[k0 + 1, n]) + ...), each
  product and sum rounded on its own (its vectors run across n: no lanes to add), then C = p0
  + p1, the same bits for any core count or vector width (two cores each read half of B, one
  long run of memory each).
Either gives each element of C one core's fixed order; neither is BLAS's, so a decode step's
C differs from a prompt's in the last bits, as sgemv's and sgemm's do.
"""

import functools
import time

import numpy as np
from numba import prange

from ... import dtypes
from ...backend.cpu.compiled import device, f32_from_bf16_bits, f32_from_f16_bits, kernel
from ...backend.cpu.halves import f32
from ...formats import FORMATS
from ..quant.cpu_gemv import gemv as row_gemv
from ..quant.cpu_split import SERIAL_BELOW

GEMV_BELOW = 4  # rows of A (a decode step's batch) below which a GEMM is a GEMV
# _columns' widest C: its sums stay in L1 (16 KB a row of A). Blocks of columns of a wider one
# (8 KB of each row of B, then the next row's) ran at a third of BLAS's rate: BLAS takes it.
COLUMNS = 4096
# a 2-byte W's fields for quant's GEMV, which decodes them as its bf16 and fp16 weights
_FIELDS = {
    np.dtype(dtypes.bfloat16): FORMATS["bf16"].fields,
    np.dtype(dtypes.float16): FORMATS["fp16"].fields,
}


def _columns_kernel(code, rows):
    """_columns for b's elements as fp32 (code 0), or as the bits (uint16) of bf16 (1) or fp16
    (2), each widened where it is read: the widened values, the same sums; `rows` (1 or 4) of b
    a pass over the partial sums."""

    @kernel(serial_below=SERIAL_BELOW, work=lambda a, b, partial: b.size)  # qmatmul's rule
    def _columns(a, b, partial):
        # a (M, K), b (K, N), M < GEMV_BELOW, N <= COLUMNS; partial (P, M, N) fp32: the sums
        # over P contiguous ranges of k (gemv's: two halves), one a program, each streaming its
        # rows of b in order (one long run of memory) into its partial rows, which stay in L1;
        # the caller adds them. With rows = 4, four rows of b a pass over the partial rows: each
        # element's sum takes them one by one in k's order, as a pass per row does (the same
        # bits), with a quarter of the partial rows' loads and stores.
        M, K = a.shape
        P = partial.shape[0]
        for p in prange(P):
            acc = partial[p]
            acc[...] = 0
            k, end = p * K // P, (p + 1) * K // P
            while rows == 4 and k + 4 <= end:
                r0, r1, r2, r3 = b[k], b[k + 1], b[k + 2], b[k + 3]
                for m in range(M):
                    x0, x1, x2, x3, sums = a[m, k], a[m, k + 1], a[m, k + 2], a[m, k + 3], acc[m]
                    for j in range(r0.shape[0]):
                        s = sums[j] + x0 * _widened(r0[j], code)
                        s = s + x1 * _widened(r1[j], code)
                        s = s + x2 * _widened(r2[j], code)
                        sums[j] = s + x3 * _widened(r3[j], code)
                k += 4
            for k in range(k, end):
                row = b[k]
                for m in range(M):
                    x, sums = a[m, k], acc[m]
                    for j in range(row.shape[0]):
                        sums[j] += x * _widened(row[j], code)

    return _columns


@device
def _widened(v, code):
    """b's element as fp32: v itself (code 0), or v's bits as bf16 (1) or fp16 (2)."""
    if code == 1:
        return f32_from_bf16_bits(v)
    if code == 2:
        return f32_from_f16_bits(np.int32(v))
    return v


# (dtype, rows a pass) -> _columns. The 2-byte rows take one a pass (four ran their widening
# slower); for fp32 which of one and four streams faster depends on the machine (four on a
# Zen 5 EPYC, one on a Zen 4: docs/decode.md), so it takes whichever fp32_rows measured here.
_COLUMNS = {
    (np.dtype(np.float32), 1): _columns_kernel(0, 1),
    (np.dtype(np.float32), 4): _columns_kernel(0, 4),
    (np.dtype(dtypes.bfloat16), 1): _columns_kernel(1, 1),
    (np.dtype(dtypes.float16), 1): _columns_kernel(2, 1),
}


@functools.cache
def fp32_rows(K=4096, N=2048, layers=4, rounds=3):
    """Rows of b a pass for fp32's _columns on this machine: 1 or 4, whichever streamed `layers`
    (K, N) weights faster (128 MB: read from memory past the L3, as a decode reads its weights),
    each the best of `rounds` taking turns, on the cores this process runs its kernels on.
    Measured once a process, at its first fp32 GEMV: both give the same bits, so a choice that
    differs between runs changes their speed only."""
    ws = [np.full((K, N), 0.5, np.float32) for _ in range(layers)]
    x, partial = np.ones((1, K), np.float32), np.empty((2, 1, N), np.float32)
    best = {rows: float("inf") for rows in (1, 4)}
    for _ in range(rounds):
        for rows in best:
            start = time.perf_counter()
            for w in ws:
                _COLUMNS[np.dtype(np.float32), rows](x, w, partial)
            best[rows] = min(best[rows], time.perf_counter() - start)
    return min(best, key=best.get)


def gemv(a, b):
    """C (..., M, N) = a (..., M, K) @ b (K, N) in fp32, where a has fewer than GEMV_BELOW rows
    in all and b's layout has a compiled GEMV (above; (K, N) up to COLUMNS columns) -> C, else
    None (BLAS's). a and b fp32 or 2-byte floats: a widened (a few rows); a 2-byte b read as it
    is stored, each element widened in registers (quant's bf16 and fp16 weights' decode): the
    fp32 GEMV's bits on the widened values, without a widened copy of b per call."""
    rows = a.size // a.shape[-1] if a.shape[-1] else 0
    floats = (np.float32, dtypes.bfloat16, dtypes.float16)
    if b.ndim != 2 or not 0 < rows < GEMV_BELOW or a.dtype not in floats or b.dtype not in floats:
        return None
    if not (b.T.flags.c_contiguous or (b.flags.c_contiguous and b.shape[1] <= COLUMNS)):
        return None
    x = np.ascontiguousarray(f32(a)).reshape(rows, a.shape[-1])
    c = np.empty((rows, b.shape[1]), np.float32)
    if b.T.flags.c_contiguous:  # W (N, K) read by rows, fp32 or 2-byte codes, no scales
        w, none = b.T, np.empty((b.shape[1], 0), np.float32)
        bits, fields = (32, (0, 0, 0)) if w.dtype == np.float32 else (16, _FIELDS[w.dtype])
        codes = w if bits == 32 else w.view(np.uint16)
        row_gemv(codes, none, b.shape[0], bits, fields, x, np.zeros(0, np.float32), c)
    else:
        halves = np.empty((2, rows, b.shape[1]), np.float32)  # one a core on two cores
        fp32 = b.dtype == np.float32
        _COLUMNS[b.dtype, fp32_rows() if fp32 else 1](x, b if fp32 else b.view(np.uint16), halves)
        np.add(halves[0], halves[1], out=c)
    return c.reshape(a.shape[:-1] + (b.shape[1],))
