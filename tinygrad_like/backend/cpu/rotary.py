"""Rotary position embeddings on the CPU (rotary.cu's twin): Hugging Face Llama's rotate-half
convention, forward and backward, one block of heads per core.

x (B, H, T, D) is seen as (B·H, T, D); cos, sin (T, D/2) are the turn of each of a head's D/2
pairs (i, i + D/2) at each position. The backward turns by the opposite angle (sin negated),
so both directions are one function with a sign, as in rotary.cu.
"""

import numpy as np

from .runtime import f32, in_parallel


def _turn(x, cos, sin, sign):
    """y1 = x1 cos - sign x2 sin, y2 = x2 cos + sign x1 sin over x (..., T, D), computed in the
    tables' dtype (fp32, fp64 for fp64) and rounded once into y of x's dtype."""
    T, D = x.shape[-2:]
    h = D // 2
    xs = x.reshape(-1, T, D)  # (B·H, T, D), a view or one copy of a strided x
    y = np.empty(xs.shape, dtype=x.dtype)
    s = sin if sign > 0 else -sin  # (T, D/2): a table's worth, not a pass over x

    def heads(lo, hi):
        xr = f32(xs[lo:hi])  # (n, T, D)
        x1, x2 = xr[..., :h], xr[..., h:]
        y[lo:hi, :, :h] = x1 * cos - x2 * s
        y[lo:hi, :, h:] = x2 * cos + x1 * s

    in_parallel(xs.shape[0], heads, per_row=T * D)
    return y.reshape(x.shape)


def rotary_fwd(x, cos, sin):
    """x (B, H, T, D) -> y (B, H, T, D), turned by the angles of cos, sin (T, D/2)."""
    return _turn(x, cos, sin, 1)


def rotary_bwd(dy, cos, sin):
    """dx (B, H, T, D): dy turned back by the same angles."""
    return _turn(dy, cos, sin, -1)
