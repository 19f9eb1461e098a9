"""GEMMs on the meta device (gemm.py's shapes): C (..., M, N) in A's dtype, the batch
dimensions broadcast as np.matmul's."""

import numpy as np

from .runtime import new


def _product(a, a_shape, b_shape):
    """C of op(A) (..., M, K) @ op(B) (..., K, N), or the ValueError NumPy raises."""
    if len(a_shape) < 2 or len(b_shape) < 2 or a_shape[-1] != b_shape[-2]:
        raise ValueError(f"matmul: {a_shape} @ {b_shape}: the operands do not multiply")
    batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    return new(batch + (a_shape[-2], b_shape[-1]), a.dtype)


def _t(shape):
    return shape[:-2] + (shape[-1], shape[-2])


def matmul(a, b, bias=None):
    """(..., M, K) @ (..., K, N) [+ bias (N,)] -> (..., M, N)."""
    return _product(a, a.shape, b.shape)


def matmul_nt(a, b):
    """(..., M, K) @ (..., N, K)^T -> (..., M, N)."""
    return _product(a, a.shape, _t(b.shape))


def matmul_tn(a, b):
    """(..., K, M)^T @ (..., K, N) -> (..., M, N)."""
    return _product(a, _t(a.shape), b.shape)
