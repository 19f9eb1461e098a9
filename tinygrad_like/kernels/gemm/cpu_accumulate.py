"""A GEMM that accumulates into its output on the CPU: out (M, N) += a (M, K) @ b (K, N) in fp32
as one call of NumPy's OpenBLAS's cblas_sgemm with beta = 1 (gemm.cu's epilogue add, in place).

The epilogue's contract is the unfused bits: C rounded as the GEMM returns it, then elementwise's
add(out, C). With beta = 1 OpenBLAS adds each output's dot product into out once, where it
stores it, when K fits one of its K blocks (it adds the blocks one after another otherwise);
so the first call of each shape computes both ways and keeps beta = 1 for that shape only if
the bits agree, on this machine and its OpenBLAS. What it spares (the fused LM head's dW summed
over its row blocks): C's (M, N) temporary and the add's pass over three arrays of its size.
"""

import ctypes

import numpy as np

from ...backend.cpu.runtime import BLAS_QUIET, OPENBLAS
from ..elementwise.cpu import add as elementwise_add

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # CBLAS's enums


def cblas_sgemm(function, index):
    """function, a library's cblas_sgemm (its ints `index`: c_int, or c_int64 for an ILP64
    BLAS), as sgemm(a, b, out, beta): out (M, N) C-contiguous = a @ b + beta out, a (M, K) and b
    (K, N) fp32 views each C- or Fortran-ordered (a transpose), read where they are."""
    function.argtypes = [ctypes.c_int] * 3 + [index] * 3 + [ctypes.c_float, ctypes.c_void_p, index]
    function.argtypes += [ctypes.c_void_p, index, ctypes.c_float, ctypes.c_void_p, index]
    function.restype = None

    def sgemm(a, b, out, beta=0.0):
        (M, K), N = a.shape, b.shape[1]
        (ta, lda), (tb, ldb) = _layout(a), _layout(b)
        function(ROW_MAJOR, ta, tb, M, N, K, 1.0, a.ctypes.data, lda, b.ctypes.data, ldb,
                 beta, out.ctypes.data, N)  # fmt: skip
        return out

    return sgemm


def _layout(x):
    """(CBLAS's transpose flag, leading dimension) of a 2-D fp32 view, row-major."""
    if x.flags.c_contiguous:
        return NO_TRANS, max(1, x.shape[1])
    return TRANS, max(1, x.shape[0])  # Fortran-ordered: the transpose of a row-major array


def _openblas():
    """NumPy's OpenBLAS's own cblas_sgemm (scipy-openblas's ILP64 names), or None."""
    lib = OPENBLAS.dynlib if OPENBLAS else None
    for name in ("scipy_cblas_sgemm64_", "cblas_sgemm64_", "cblas_sgemm"):
        function = getattr(lib, name, None) if lib is not None else None
        if function is not None:
            return cblas_sgemm(function, ctypes.c_int64 if "64" in name else ctypes.c_int)
    return None


SGEMM = _openblas()
_SAME_BITS = {}  # (M, K, N, a's layout, b's) -> whether beta = 1 gave the unfused bits


def accumulated(a, b, out, unfused):
    """out += a @ b by one sgemm with beta = 1 -> out, or None where it does not apply (no
    OpenBLAS of ours, idle workers that spin, operands that are not 2-D fp32 in a BLAS layout)
    or did not give unfused()'s bits (C, the GEMM's own result) for this shape when tried."""
    if SGEMM is None or not BLAS_QUIET or a.ndim != 2 or b.ndim != 2:
        return None
    if not (a.dtype == b.dtype == out.dtype == np.float32 and out.flags.c_contiguous):
        return None
    if not all(x.flags.c_contiguous or x.flags.f_contiguous for x in (a, b)):
        return None
    key = (*a.shape, b.shape[1], _layout(a)[0], _layout(b)[0])
    if key not in _SAME_BITS:  # the first call: both ways, compared
        tried = SGEMM(a, b, out.copy(), 1.0)
        elementwise_add(out, unfused(), out=out)
        _SAME_BITS[key] = bool(np.array_equal(tried.view(np.uint32), out.view(np.uint32)))
        return out
    return SGEMM(a, b, out, 1.0) if _SAME_BITS[key] else None
