"""GEMMs. A linear layer Y = X W (W stored [in, out], as GPT-2's checkpoints) runs three GEMMs of
the same cost 2 M K N: forward X W (matmul), backward dX = dY W^T (matmul_nt) and dW = X^T dY
(matmul_tn). Each is C (M, N) = op(A) (M, K) op(B) (K, N), op a transpose of the operand's last
two axes where the name says t. Leading dimensions are batch dimensions (B, H), broadcast as
np.matmul's; C is in A's dtype.

cpu.py: NumPy's BLAS in fp32 (2-byte inputs widened, the result rounded once, as a tensor core
does); cuda.py + gemm.cu: tiled shared-memory fp32 and mma.sync tensor-core fp16/bf16 GEMMs, with
cuBLAS kept as the yardstick. The epilogue adds bias (N,), then multiplies by scale (one element)
and adds add (C's shape), each rounded as the unfused kernels round: the bits of elementwise's
mul(C, scale), then add(add, C), in place when out is add.
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


def _epilogued(c, scale, add, out):
    """C's Out, or out: an epilogue's factor `scale` must be one element of C's dtype, its
    summand `add` and out C's shape and dtype (they act as elementwise's mul and add on the C
    this kernel would return)."""
    if scale is not None and (tuple(scale.shape) != () or scale.dtype != c.dtype):
        raise ValueError(f"matmul: scale {tuple(scale.shape)} {scale.dtype}, need () {c.dtype}")
    for name, x in (("add", add), ("out", out)):
        if x is not None and (tuple(x.shape) != c.shape or x.dtype != c.dtype):
            raise ValueError(f"matmul: {name} {tuple(x.shape)} {x.dtype}, need {c.shape} {c.dtype}")
    return c if out is None else out


def _gemm_counts(k_of):
    """FLOPs of a GEMM whose K is k_of(a): 2 M K N, plus M N each for a bias, a scale, an add."""

    def flops(r, a, b, bias=None, scale=None, add=None, out=None):
        epilogue = sum(x is not None for x in (bias, scale, add))
        return (2 * k_of(a) + epilogue) * r.size

    return flops


# scale=, add= and out= are the epilogue a captured step fuses into a GEMM (graph/fuse.py): C
# times a 0-d array (a mean's 1 / count), then plus add (a layer's residual, or the gradient C
# accumulates into: out=add), in one launch instead of the GEMM then elementwise's mul and add;
# None launches the plain GEMM.


@kernel(
    shape=lambda a, b, bias=None, scale=None, add=None, out=None: _epilogued(
        _product(a, tuple(a.shape), tuple(b.shape)), scale, add, out
    ),
    flops=_gemm_counts(lambda a: a.shape[-1]),
    epilogue=("scale", "add", "out"),
)
def matmul(a, b, bias=None, scale=None, add=None, out=None):
    """(..., M, K) @ (..., K, N) [+ bias (N,)] [* scale ()] [+ add (..., M, N)] -> (..., M, N)
    [into out]."""


@kernel(
    shape=lambda a, b, scale=None, add=None, out=None: _epilogued(
        _product(a, tuple(a.shape), _t(b.shape)), scale, add, out
    ),
    flops=_gemm_counts(lambda a: a.shape[-1]),
    epilogue=("scale", "add", "out"),
)
def matmul_nt(a, b, scale=None, add=None, out=None):
    """(..., M, K) @ (..., N, K)^T [* scale ()] [+ add (..., M, N)] -> (..., M, N) [into out]."""


@kernel(
    shape=lambda a, b, scale=None, add=None, out=None: _epilogued(
        _product(a, _t(a.shape), tuple(b.shape)), scale, add, out
    ),
    flops=_gemm_counts(lambda a: a.shape[-2]),
    epilogue=("scale", "add", "out"),
)
def matmul_tn(a, b, scale=None, add=None, out=None):
    """(..., K, M)^T @ (..., K, N) [* scale ()] [+ add (..., M, N)] -> (..., M, N) [into out]."""
