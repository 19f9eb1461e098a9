"""Quantized weights on the meta device (quant.py's shapes): qmatmul's (M, N) in x's dtype, and
qembedding's (..., K) fp32, K from the codes (two elements a byte for the 4-bit formats)."""

import numpy as np

from .runtime import new

_FOUR_BIT = ("int4", "fp4_e2m1")


def qmatmul(x, codes, scales, fmt, group_size, bias=None):
    """x (M, K) -> (M, N), N the rows of codes."""
    return new((x.shape[0], codes.shape[0]), x.dtype)


def qembedding(codes, scales, idx, fmt, group_size):
    """idx (...) -> (..., K) fp32."""
    K = codes.shape[1] * (2 if fmt in _FOUR_BIT else 1)
    return new(idx.shape + (K,), np.float32)
