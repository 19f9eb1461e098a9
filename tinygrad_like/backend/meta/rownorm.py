"""Row norms on the meta device (rownorm.py's shapes): outputs of the input's shape and dtype,
the statistics saved for backward (...,) in the compute dtype, the weight gradients in the
weight's dtype."""

from ... import dtypes
from .runtime import like, new


def _stat(x):
    return new(x.shape[:-1], dtypes.compute_dtype(x.dtype))


def layernorm_fwd(x, weight, bias, eps=1e-5):
    """-> y (..., C), mean (...,), rstd (...,)."""
    return like(x), _stat(x), _stat(x)


def layernorm_bwd(dy, x, weight, mean, rstd):
    """-> dx (..., C), dweight (C,), dbias (C,)."""
    return like(x), like(weight), like(weight)


def rmsnorm_fwd(x, weight, eps=1e-6):
    """-> y (..., C), rstd (...,)."""
    return like(x), _stat(x)


def rmsnorm_bwd(dy, x, weight, rstd):
    """-> dx (..., C), dweight (C,)."""
    return like(x), like(weight)
