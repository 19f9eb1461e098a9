"""GEMMs. A linear layer Y = X W (W stored [in, out], as GPT-2's checkpoints) runs three GEMMs of
the same cost 2 M K N: forward X W (matmul), backward dX = dY W^T (matmul_nt) and dW = X^T dY
(matmul_tn). Each is C (M, N) = op(A) (M, K) op(B) (K, N), op a transpose of the operand's last
two axes where the name says t. Leading dimensions are batch dimensions (B, H), broadcast as
np.matmul's; C is in A's dtype.

cpu.py: NumPy's BLAS in fp32 (2-byte inputs widened, the result rounded once, as a tensor core
does; bf16 by AVX-512 BF16's dot products where the CPU has them, cpu_bf16.py); cuda.py +
gemm.cu: tiled shared-memory fp32 and mma.sync tensor-core fp16/bf16 GEMMs, with cuBLAS kept as
the yardstick. The epilogue adds bias (N,), then multiplies by scale (one element),
casts to cast (a dtype) and adds add (C's shape), each rounded as the unfused kernels round: the
bits of elementwise's mul(C, scale), cast(C, cast), then add(add, C), in place when out is add.
Or, after the bias, an elementwise kernel declared by its expression with C as its last operand
(then=: GPT-2's GELU or its gradient, Llama's SwiGLU or its gradient), its bits; aux=True
returns C after its outputs (cuBLASLt's GELU, GELU_AUX and DGELU epilogues are three cases).
"""

import numpy as np

from ..elementwise.spec import then_counts, then_outputs
from ..record import Out, kernel


def _product(a, a_shape, b_shape):
    """C of op(A) (..., M, K) @ op(B) (..., K, N), or the ValueError NumPy raises."""
    if len(a_shape) < 2 or len(b_shape) < 2 or a_shape[-1] != b_shape[-2]:
        raise ValueError(f"matmul: {a_shape} @ {b_shape}: the operands do not multiply")
    batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    return Out(batch + (a_shape[-2], b_shape[-1]), a.dtype)


def _t(shape):
    return tuple(shape[:-2]) + (shape[-1], shape[-2])


def _epilogued(c, scale=None, cast=None, add=None, out=None, then=None, aux=False):
    """C's Out, or out, or the outputs of then's kernel on C (and C's Out, with aux): the
    factor `scale` must be one element of C's dtype; cast, a dtype, is C's from there on; the
    summand `add` and out must be C's shape and dtype (they act as elementwise's mul, cast and
    add on the C this kernel would return); then = (name, operands) takes no other part, and
    its kernel's own rule checks the operands beside C."""
    if then is not None or aux:
        if any(x is not None for x in (scale, cast, add, out)):
            raise ValueError("matmul: then= takes no scale=, cast=, add= or out=")
        return then_outputs(c, then, aux)
    if scale is not None and (tuple(scale.shape) != () or scale.dtype != c.dtype):
        raise ValueError(f"matmul: scale {tuple(scale.shape)} {scale.dtype}, need () {c.dtype}")
    if cast is not None:
        c = Out(c.shape, np.dtype(cast))
    for name, x in (("add", add), ("out", out)):
        if x is not None and (tuple(x.shape) != c.shape or x.dtype != c.dtype):
            raise ValueError(f"matmul: {name} {tuple(x.shape)} {x.dtype}, need {c.shape} {c.dtype}")
    return c if out is None else out


def _gemm_counts(k_of):
    """FLOPs and exps of a GEMM whose K is k_of(a): 2 M K N, plus M N each for a bias, a scale,
    an add, and then='s kernel's own counts on C (r: C, or then's first output: C's shape)."""

    def flops(r, a, b, bias=None, scale=None, cast=None, add=None, out=None, then=None, aux=0):
        epilogue = sum(x is not None for x in (bias, scale, add))
        return (2 * k_of(a) + epilogue) * r.size + then_counts(r, then)[0]

    def exps(r, a, b, *_, then=None, **kwargs):
        return then_counts(r, then)[1]

    return {"flops": flops, "exps": exps}


# scale=, cast=, add= and out= are the epilogue a captured step fuses into a GEMM (graph/fuse.py):
# C times a 0-d array (a mean's 1 / count), then cast to a dtype (a bf16 step's logits to fp32
# for the loss, an fp32 gradient to its bf16 parameter's), then plus add (a layer's residual, or
# the gradient C accumulates into: out=add), in one launch instead of the GEMM then
# elementwise's mul, cast and add; None launches the plain GEMM. then=(name, operands) runs
# elementwise's kernel `name` (declared by its expression) as name(*operands, C) after the bias
# instead: GPT-2's fc and GELU (then=("gelu_fwd", ())), the GELU's gradient of the fc's dY
# (("gelu_bwd", (x,))), Llama's up projection and SwiGLU (("swiglu_fwd", (gate,))) and its
# gradient; aux=True returns C after its outputs, where the backward reads C again.
EPILOGUE = ("scale", "cast", "add", "out", "then")


@kernel(
    shape=lambda a, b, bias=None, **epilogue: _epilogued(
        _product(a, tuple(a.shape), tuple(b.shape)), **epilogue
    ),
    **_gemm_counts(lambda a: a.shape[-1]),
    epilogue=EPILOGUE,
)
def matmul(a, b, bias=None, scale=None, cast=None, add=None, out=None, then=None, aux=False):
    """(..., M, K) @ (..., K, N) [+ bias (N,)] [* scale ()] [as cast] [+ add (..., M, N)] ->
    (..., M, N) [into out]; then: then[0](*then[1], C)'s outputs instead [and C: aux]."""


@kernel(
    shape=lambda a, b, **epilogue: _epilogued(_product(a, tuple(a.shape), _t(b.shape)), **epilogue),
    **_gemm_counts(lambda a: a.shape[-1]),
    epilogue=EPILOGUE,
)
def matmul_nt(a, b, scale=None, cast=None, add=None, out=None, then=None, aux=False):
    """(..., M, K) @ (..., N, K)^T [* scale ()] [as cast] [+ add (..., M, N)] -> (..., M, N)
    [into out]; then: then[0](*then[1], C)'s outputs instead [and C: aux]."""


@kernel(
    shape=lambda a, b, **epilogue: _epilogued(_product(a, _t(a.shape), tuple(b.shape)), **epilogue),
    **_gemm_counts(lambda a: a.shape[-2]),
    epilogue=EPILOGUE,
)
def matmul_tn(a, b, scale=None, cast=None, add=None, out=None, then=None, aux=False):
    """(..., K, M)^T @ (..., K, N) [* scale ()] [as cast] [+ add (..., M, N)] -> (..., M, N)
    [into out]; then: then[0](*then[1], C)'s outputs instead [and C: aux]."""
