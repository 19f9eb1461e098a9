"""The decode step's fp32 GEMMs on the CPU (cpu.py's _gemm with fewer than GEMV_BELOW rows of
A): compiled GEMVs instead of BLAS, which streamed GPT-2 124M's weights at 15-20 GB/s of the 29
one core reads (OpenBLAS's sgemv, AMD EPYC Zen 4). Two layouts of B (K, N):
- B the transpose of a C-contiguous W (N, K) (matmul_nt: the tied LM head, x @ wte^T): each
  element of C a row of W dotted with a row of A, kernels/quant/cpu_gemv.py's GEMV with fp32
  as its unquantized format (sixteen lanes and four sums, added in a fixed tree);
- B C-contiguous (K, N) (matmul: GPT-2's Conv1D weights): _columns, a block of C's columns per
  program, B's rows streamed in order and each multiplied into C's block: c[m, n] = (..((a[m, 0]
  b[0, n]) + a[m, 1] b[1, n]) + ...), each product and sum rounded on its own, k in order, the
  dot product as written (no lanes: its vectors run across n), the same bits for any core
  count or vector width.
Either gives each element of C one core's fixed order; neither is BLAS's, so a decode step's
C differs from a prompt's in the last bits, as sgemv's and sgemm's do.
"""

import numpy as np
from numba import prange

from ...backend.cpu.compiled import kernel
from ..quant.cpu_gemv import gemv as row_gemv

GEMV_BELOW = 4  # rows of A (a decode step's batch) below which a GEMM is a GEMV
K_PARTS = 2  # _columns' ranges of k, summed in order after: one a core on two cores


@kernel(work=lambda a, b, partial: b.size)
def _columns(a, b, partial):
    # a (M, K), b (K, N) fp32, M < GEMV_BELOW; partial (P, M, N) fp32: the sums over P
    # contiguous ranges of k, one a program, each streaming its rows of b in order (one long
    # run of memory) into its C-sized partial row, which stays in L1; the caller adds them.
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
    in all and b's layout has a compiled GEMV (above) -> C, else None (BLAS's)."""
    rows = a.size // a.shape[-1] if a.shape[-1] else 0
    if b.ndim != 2 or not 0 < rows < GEMV_BELOW or (a.dtype, b.dtype) != (np.float32,) * 2:
        return None
    if not (b.T.flags.c_contiguous or b.flags.c_contiguous):
        return None
    x = np.ascontiguousarray(a).reshape(rows, a.shape[-1])
    c = np.empty((rows, b.shape[1]), np.float32)
    if b.T.flags.c_contiguous:  # W (N, K) read by rows: fp32 codes, no scales
        none = np.empty((b.shape[1], 0), np.float32)
        row_gemv(b.T, none, b.shape[0], 32, (0, 0, 0), x, np.zeros(0, np.float32), c)
    else:
        partial = np.empty((K_PARTS, rows, b.shape[1]), np.float32)
        _columns(x, b, partial)
        np.add(partial[0], partial[1], out=c)
    return c.reshape(a.shape[:-1] + (b.shape[1],))
