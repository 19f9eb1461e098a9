"""GEMMs. A linear layer Y = X W (W stored [in, out], as GPT-2's checkpoints) runs three GEMMs of
the same cost 2 M K N: forward X W (matmul), backward dX = dY W^T (matmul_nt) and dW = X^T dY
(matmul_tn). Each is C (M, N) = op(A) (M, K) op(B) (K, N), op a transpose of the operand's last
two axes where the name says t. Leading dimensions are batch dimensions (B, H), broadcast as
np.matmul's; C is in A's dtype.

cpu.py: NumPy's BLAS in fp32 (2-byte inputs widened, the result rounded once, as a tensor core
does); cuda.py + gemm.cu: tiled shared-memory fp32 and mma.sync tensor-core fp16/bf16 GEMMs, with
cuBLAS kept as the yardstick. The epilogue adds bias (N,), then multiplies by scale (one element),
casts to cast (a dtype) and adds add (C's shape), each rounded as the unfused kernels round: the
bits of elementwise's mul(C, scale), cast(C, cast), then add(add, C), in place when out is add.
Or, after the bias, GPT-2's GELU (matmul's gelu=, aux= to return its input too) or its gradient
(matmul_nt's gelu_input=): the bits of elementwise's gelu_fwd(C) and gelu_bwd(gelu_input, C),
cuBLASLt's GELU, GELU_AUX and DGELU epilogues.
"""

import numpy as np

from ..record import KERNELS, Out, kernel


def _product(a, a_shape, b_shape):
    """C of op(A) (..., M, K) @ op(B) (..., K, N), or the ValueError NumPy raises."""
    if len(a_shape) < 2 or len(b_shape) < 2 or a_shape[-1] != b_shape[-2]:
        raise ValueError(f"matmul: {a_shape} @ {b_shape}: the operands do not multiply")
    batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    return Out(batch + (a_shape[-2], b_shape[-1]), a.dtype)


def _t(shape):
    return tuple(shape[:-2]) + (shape[-1], shape[-2])


def _epilogued(
    c, scale=None, cast=None, add=None, out=None, gelu=False, aux=False, gelu_input=None
):
    """C's Out, or out, or with gelu (and aux) GELU(C)'s Out (and C's): an epilogue's factor
    `scale` must be one element of C's dtype; cast, a dtype, is C's from there on; its summand
    `add`, out and gelu_input must be C's shape and dtype (they act as elementwise's mul, cast,
    add and gelu_bwd on the C this kernel would return); a GELU or its gradient takes no other
    part."""
    if (gelu or gelu_input is not None) and any(x is not None for x in (scale, cast, add, out)):
        raise ValueError("matmul: a GELU epilogue takes no scale=, cast=, add= or out=")
    if aux and not gelu:
        raise ValueError("matmul: aux=True returns the GELU's input: it needs gelu=True")
    if scale is not None and (tuple(scale.shape) != () or scale.dtype != c.dtype):
        raise ValueError(f"matmul: scale {tuple(scale.shape)} {scale.dtype}, need () {c.dtype}")
    if cast is not None:
        c = Out(c.shape, np.dtype(cast))
    for name, x in (("add", add), ("out", out), ("gelu_input", gelu_input)):
        if x is not None and (tuple(x.shape) != c.shape or x.dtype != c.dtype):
            raise ValueError(f"matmul: {name} {tuple(x.shape)} {x.dtype}, need {c.shape} {c.dtype}")
    return (c, c) if aux else c if out is None else out


def _gelu_part(r, gelu=False, gelu_input=None, **_):
    """The record of the elementwise kernel a GELU epilogue runs on C (r: C's Out), or None."""
    if gelu:
        return KERNELS["gelu_fwd"], (r,)
    return (KERNELS["gelu_bwd"], (gelu_input, r)) if gelu_input is not None else None


def _gemm_counts(k_of):
    """FLOPs and exps of a GEMM whose K is k_of(a): 2 M K N, plus M N each for a bias, a scale,
    an add, and the GELU epilogue's as gelu_fwd or gelu_bwd counts them on C."""

    def flops(r, a, b, bias=None, scale=None, cast=None, add=None, out=None, **gelu):
        epilogue = sum(x is not None for x in (bias, scale, add))
        part = _gelu_part(r, **gelu)
        return (2 * k_of(a) + epilogue) * r.size + (part[0].flops(r, *part[1]) if part else 0)

    def exps(r, a, b, *_, **kwargs):
        part = _gelu_part(r, **kwargs)
        return part[0].exps(r, *part[1]) if part else 0

    return {"flops": flops, "exps": exps}


# scale=, cast=, add= and out= are the epilogue a captured step fuses into a GEMM (graph/fuse.py):
# C times a 0-d array (a mean's 1 / count), then cast to a dtype (a bf16 step's logits to fp32
# for the loss, an fp32 gradient to its bf16 parameter's), then plus add (a layer's residual, or
# the gradient C accumulates into: out=add), in one launch instead of the GEMM then
# elementwise's mul, cast and add; None launches the plain GEMM. gelu= (matmul: the MLP's fc,
# returning GELU(C), and C too where the backward reads it: aux=) and gelu_input= (matmul_nt:
# the fc's dY times GELU'(its input)) fold elementwise's gelu_fwd and gelu_bwd the same way.
EPILOGUE = ("scale", "cast", "add", "out")


@kernel(
    shape=lambda a, b, bias=None, **epilogue: _epilogued(
        _product(a, tuple(a.shape), tuple(b.shape)), **epilogue
    ),
    **_gemm_counts(lambda a: a.shape[-1]),
    epilogue=(*EPILOGUE, "gelu"),
)
def matmul(a, b, bias=None, scale=None, cast=None, add=None, out=None, gelu=False, aux=False):
    """(..., M, K) @ (..., K, N) [+ bias (N,)] [* scale ()] [as cast] [+ add (..., M, N)] ->
    (..., M, N) [into out]; gelu: GELU(C) instead [and C: aux]."""


@kernel(
    shape=lambda a, b, **epilogue: _epilogued(_product(a, tuple(a.shape), _t(b.shape)), **epilogue),
    **_gemm_counts(lambda a: a.shape[-1]),
    epilogue=(*EPILOGUE, "gelu_input"),
)
def matmul_nt(a, b, scale=None, cast=None, add=None, out=None, gelu_input=None):
    """(..., M, K) @ (..., N, K)^T [* scale ()] [as cast] [+ add (..., M, N)] -> (..., M, N)
    [into out]; gelu_input: C GELU'(gelu_input) instead (the gradient through the GELU C came
    out of)."""


@kernel(
    shape=lambda a, b, **epilogue: _epilogued(_product(a, _t(a.shape), tuple(b.shape)), **epilogue),
    **_gemm_counts(lambda a: a.shape[-2]),
    epilogue=EPILOGUE,
)
def matmul_tn(a, b, scale=None, cast=None, add=None, out=None):
    """(..., K, M)^T @ (..., K, N) [* scale ()] [as cast] [+ add (..., M, N)] -> (..., M, N)
    [into out]."""
