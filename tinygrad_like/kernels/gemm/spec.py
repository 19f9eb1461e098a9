"""GEMMs. A linear layer Y = X W (W stored [in, out], as GPT-2's checkpoints) runs three GEMMs of
the same cost 2 M K N: forward X W (matmul), backward dX = dY W^T (matmul_nt) and dW = X^T dY
(matmul_tn). Each is C (M, N) = op(A) (M, K) op(B) (K, N), op a transpose of the operand's last
two axes where the name says t. Leading dimensions are batch dimensions (B, H), broadcast as
np.matmul's; C is in A's dtype.

cpu.py: NumPy's BLAS in fp32 (2-byte inputs widened, the result rounded once, as a tensor core
does); cuda.py + gemm.cu: tiled shared-memory fp32 and mma.sync tensor-core fp16/bf16 GEMMs, with
cuBLAS kept as the yardstick.
"""

import numpy as np

from ..record import Out, kernel


def _product(a, a_shape, b_shape):
    """C of op(A) (..., M, K) @ op(B) (..., K, N), or the ValueError NumPy raises."""
    if len(a_shape) < 2 or len(b_shape) < 2 or a_shape[-1] != b_shape[-2]:
        raise ValueError(f"matmul: {a_shape} @ {b_shape}: the operands do not multiply")
    batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    return Out(batch + (a_shape[-2], b_shape[-1]), a.dtype)


def _t(shape):
    return tuple(shape[:-2]) + (shape[-1], shape[-2])


@kernel(
    shape=lambda a, b, bias=None: _product(a, tuple(a.shape), tuple(b.shape)),
    flops=lambda r, a, b, bias=None: 2 * r.size * a.shape[-1] + (bias is not None) * r.size,
)
def matmul(a, b, bias=None):
    """(..., M, K) @ (..., K, N) [+ bias (N,)] -> (..., M, N)."""


@kernel(
    shape=lambda a, b: _product(a, tuple(a.shape), _t(b.shape)),
    flops=lambda r, a, b: 2 * r.size * a.shape[-1],
)
def matmul_nt(a, b):
    """(..., M, K) @ (..., N, K)^T -> (..., M, N)."""


@kernel(
    shape=lambda a, b: _product(a, _t(a.shape), tuple(b.shape)),
    flops=lambda r, a, b: 2 * r.size * a.shape[-2],
)
def matmul_tn(a, b):
    """(..., K, M)^T @ (..., K, N) -> (..., M, N)."""
