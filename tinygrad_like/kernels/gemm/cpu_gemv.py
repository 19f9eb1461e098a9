"""The decode step's fp32 GEMMs on the CPU (cpu.py's _gemm with fewer than GEMV_BELOW rows of
A): compiled GEMVs instead of BLAS, whose sgemv streamed GPT-2's weights well below one core's
read bandwidth (docs/decode.md: the figures). Two layouts of B (K, N):
- B the transpose of a C-contiguous W (N, K) (matmul_nt: the tied LM head, x @ wte^T): each
  element of C a row of W dotted with a row of A, kernels/quant/cpu_gemv.py's GEMV with fp32
  as its unquantized format (sixteen lanes and four sums, added in a fixed tree);
- B C-contiguous (K, N) (matmul: GPT-2's Conv1D weights): _columns, K in two fixed halves, one
  a program, each streaming its rows of B in order into a partial C: p[m, n] = (..((a[m, k0]
  b[k0, n]) + a[m, k0 + 1] b[k0 + 1, n]) + ...), each product and sum rounded on its own (its
  vectors run across n: no lanes to add), then C = p0 + p1, the same bits for any core count or
  vector width (two cores each read half of B, one long run of memory each).
Either gives each element of C one core's fixed order; neither is BLAS's, so a decode step's
C differs from a prompt's in the last bits, as sgemv's and sgemm's do.
"""

import numpy as np
from numba import prange

from ...backend.cpu.compiled import kernel
from ..quant.cpu_gemv import gemv as row_gemv
from ..quant.cpu_split import SERIAL_BELOW

GEMV_BELOW = 4  # rows of A (a decode step's batch) below which a GEMM is a GEMV
# _columns' widest C: its sums stay in L1 (16 KB a row of A). Blocks of columns of a wider one
# (8 KB of each row of B, then the next row's) ran at a third of BLAS's rate: BLAS takes it.
COLUMNS = 4096


@kernel(serial_below=SERIAL_BELOW, work=lambda a, b, partial: b.size)  # qmatmul's GEMV rule
def _columns(a, b, partial):
    # a (M, K), b (K, N) fp32, M < GEMV_BELOW, N <= COLUMNS; partial (P, M, N) fp32: the sums
    # over P contiguous ranges of k (gemv's: two halves), one a program, each streaming its
    # rows of b in order (one long run of memory) into its partial rows, which stay in L1; the
    # caller adds them.
    M, K = a.shape
    P = partial.shape[0]
    for p in prange(P):
        acc = partial[p]
        acc[...] = 0
        for k in range(p * K // P, (p + 1) * K // P):
            row = b[k]
            for m in range(M):
                x, sums = a[m, k], acc[m]
                for j in range(row.shape[0]):
                    sums[j] += x * row[j]


def gemv(a, b):
    """C (..., M, N) = a (..., M, K) @ b (K, N), fp32, where a has fewer than GEMV_BELOW rows
    in all and b's layout has a compiled GEMV (above; (K, N) up to COLUMNS columns) -> C, else
    None (BLAS's)."""
    rows = a.size // a.shape[-1] if a.shape[-1] else 0
    if b.ndim != 2 or not 0 < rows < GEMV_BELOW or (a.dtype, b.dtype) != (np.float32,) * 2:
        return None
    if not (b.T.flags.c_contiguous or (b.flags.c_contiguous and b.shape[1] <= COLUMNS)):
        return None
    x = np.ascontiguousarray(a).reshape(rows, a.shape[-1])
    c = np.empty((rows, b.shape[1]), np.float32)
    if b.T.flags.c_contiguous:  # W (N, K) read by rows: fp32 codes, no scales
        none = np.empty((b.shape[1], 0), np.float32)
        row_gemv(b.T, none, b.shape[0], 32, (0, 0, 0), x, np.zeros(0, np.float32), c)
    else:
        halves = np.empty((2, rows, b.shape[1]), np.float32)  # one a core on two cores
        _columns(x, b, halves)
        np.add(halves[0], halves[1], out=c)
    return c.reshape(a.shape[:-1] + (b.shape[1],))
