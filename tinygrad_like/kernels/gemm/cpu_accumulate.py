"""A GEMM that accumulates into its output on the CPU: out (M, N) += a (M, K) @ b (K, N) in fp32
as one cblas_sgemm with beta = 1 of the BLAS in use (cpu_blas.py; gemm.cu's epilogue add, in
place).

The epilogue's contract is the unfused bits: C rounded as the GEMM returns it, then elementwise's
add(out, C). With beta = 1 OpenBLAS adds each output's dot product into out once, where it
stores it, when K fits one of its K blocks (it adds the blocks one after another otherwise);
so the first call of each shape computes both ways and keeps beta = 1 for that shape only if
the bits agree, on this machine and its BLAS. What it spares (the fused LM head's dW summed
over its row blocks): C's (M, N) temporary and the add's pass over three arrays of its size.
"""

import numpy as np

from ..elementwise.cpu import add as elementwise_add
from . import cpu_blas

_SAME_BITS = {}  # (BLAS, M, K, N, a's layout, b's) -> whether beta = 1 gave the unfused bits


def accumulated(a, b, out, unfused):
    """out += a @ b by one sgemm with beta = 1 -> out, or None where it does not apply (a BLAS
    without a CBLAS of ours, idle workers that spin, operands that are not 2-D fp32 in a BLAS
    layout) or did not give unfused()'s bits (C, the GEMM's own result) for this shape when
    tried."""
    sgemm = cpu_blas.sgemm()
    if sgemm is None or not cpu_blas.quiet() or a.ndim != 2 or b.ndim != 2:
        return None
    if not (a.dtype == b.dtype == out.dtype == np.float32 and out.flags.c_contiguous):
        return None
    layouts = cpu_blas.layout(a), cpu_blas.layout(b)
    if None in layouts:
        return None
    key = (cpu_blas.used(), *a.shape, b.shape[1], layouts[0][0], layouts[1][0])
    if key not in _SAME_BITS:  # the first call: both ways, compared
        tried = sgemm(a, b, out.copy(), 1.0)
        elementwise_add(out, unfused(), out=out)
        _SAME_BITS[key] = bool(np.array_equal(tried.view(np.uint32), out.view(np.uint32)))
        return out
    return sgemm(a, b, out, 1.0) if _SAME_BITS[key] else None
