"""Rotary position embeddings on the CPU (rotary.cu's twin): Hugging Face Llama's rotate-half
convention, forward and backward, one row (a head at one position) per iteration of a compiled
loop, its pairs in turn (rotary.cu: a thread per pair).

x (B, H, T, D) is seen as (B·H·T, D) rows; cos, sin (T, D/2) are the turn of each of a head's D/2
pairs (i, i + D/2) at each position. The backward turns by the opposite angle (sin negated),
so both directions are one function with a sign, as in rotary.cu.
"""

import numpy as np
from numba import prange

from ...backend.cpu.compiled import kernel
from ...backend.cpu.halves import rounded


@kernel
def _rotary(x, cos, sin, sign, y):
    # one row (a head's D channels at one position) per iteration, each pair as rotary.cu's
    # thread per pair: x, y (rows, D) in the tables' dtype, row r at position r % T; cos, sin
    # (T, D/2); y1 = x1 cos - x2 (sign sin), y2 = x2 cos + x1 (sign sin)
    rows, D = x.shape
    T, half = cos.shape
    for row in prange(rows):
        t = row % T
        for j in range(half):
            c, s = cos[t, j], sign * sin[t, j]
            x1, x2 = x[row, j], x[row, j + half]
            y[row, j] = x1 * c - x2 * s
            y[row, j + half] = x2 * c + x1 * s


def _turn(x, cos, sin, sign):
    """y1 = x1 cos - sign x2 sin, y2 = x2 cos + sign x1 sin over x (..., T, D), computed in the
    tables' dtype (fp32, fp64 for fp64) and rounded once into y of x's dtype."""
    D = x.shape[-1]
    acc = cos.dtype
    xs = np.ascontiguousarray(x, dtype=acc).reshape(-1, D)  # (B·H·T, D), one copy of a strided x
    y = np.empty(xs.shape, dtype=acc)
    if xs.size:
        _rotary(xs, cos, sin, acc.type(sign), y)
    return rounded(y, x.dtype).reshape(x.shape)


def rotary_fwd(x, cos, sin):
    return _turn(x, cos, sin, 1)


def rotary_bwd(dy, cos, sin):
    return _turn(dy, cos, sin, -1)
