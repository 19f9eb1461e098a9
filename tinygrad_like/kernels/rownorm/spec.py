"""Row normalizations over the last axis of x (..., C): GPT-2's layernorm and Llama's RMSNorm,
forward and backward, the statistics of each row in fp32 (fp64 for fp64), saved for the backward.
dweight and dbias are summed per block of rows, then over the blocks in order: the same bits for
any core count.

cpu.py: a block of rows per program, each row as rownorm.cu's warp per row; cuda.py + rownorm.cu:
one warp per row, the weight gradients' partial sums per block of rows reduced in order.
"""

from ..record import kernel, like, per_element, per_row


@kernel(
    shape=lambda x, weight, bias, eps=1e-5: (like(x), per_row(x), per_row(x)), flops=per_element(8)
)
def layernorm_fwd(x, weight, bias, eps=1e-5):
    """x (..., C) -> y (..., C), mean (...,) and rstd (...,) in fp32 (saved for backward)."""


def _dx_plus(x, add):
    """dx's Out: like x, and so must add be (the epilogue's summand)."""
    if add is not None and (tuple(add.shape) != tuple(x.shape) or add.dtype != x.dtype):
        raise ValueError(f"norm backward: add {tuple(add.shape)} {add.dtype}, need x's {x.shape}")
    return like(x)


def _plus(n):
    """n FLOPs per element of x, one more with an add."""
    return lambda r, dy, x, *args, add=None: (n + (add is not None)) * x.size


# add= is the epilogue a captured step fuses into the backward (tinygrad_like/graph/fuse.py):
# dx + add, the residual stream's other gradient, with the bits of elementwise's add(add, dx).


@kernel(
    shape=lambda dy, x, weight, mean, rstd, add=None: (
        _dx_plus(x, add),
        like(weight),
        like(weight),
    ),
    flops=_plus(12),
    epilogue=("add",),
)
def layernorm_bwd(dy, x, weight, mean, rstd, add=None):
    """-> dx (..., C), dweight (C,), dbias (C,). With xhat = (x - mean) rstd and g = dy weight:
    dx = rstd (g - mean(g) - xhat mean(g xhat)) [+ add], dweight = sum(dy xhat), dbias = sum(dy)."""


@kernel(shape=lambda x, weight, eps=1e-6: (like(x), per_row(x)), flops=per_element(4))
def rmsnorm_fwd(x, weight, eps=1e-6):
    """x (..., C) -> y (..., C) = x rstd weight, and rstd (...,) fp32 = 1 / sqrt(mean(x^2) + eps)
    (saved for backward). Llama's RMSNorm: no mean subtracted, no bias."""


@kernel(
    shape=lambda dy, x, weight, rstd, add=None: (_dx_plus(x, add), like(weight)),
    flops=_plus(9),
    epilogue=("add",),
)
def rmsnorm_bwd(dy, x, weight, rstd, add=None):
    """-> dx (..., C), dweight (C,). With xhat = x rstd and g = dy weight:
    dx = rstd (g - xhat mean(g xhat)) [+ add], dweight = sum(dy xhat)."""
