"""Rotary position embeddings on CUDA (rotary.cu): one thread per channel pair, forward and
backward one kernel with a sign, as rotary/cpu.py.
"""

import cupy
import numpy as np

from ... import dtypes
from ...backend.cuda.runtime import launch_flat


def _turn(x, cos, sin, sign):
    """x (..., T, D) turned by cos, sin (T, D/2) (sign -1: the opposite angle) -> y of x's
    shape and dtype; the tables go in the compute dtype."""
    T, D = x.shape[-2:]
    x = cupy.ascontiguousarray(x)
    acc = dtypes.compute_dtype(x.dtype)
    cos, sin = cupy.ascontiguousarray(cos, dtype=acc), cupy.ascontiguousarray(sin, dtype=acc)
    y = cupy.empty_like(x)
    n = x.size // 2
    launch_flat(
        "rotary.cu",
        "rotary",
        (x.dtype, sign),
        n,
        x,
        cos,
        sin,
        y,
        np.int64(n),
        np.int32(T),
        np.int32(D // 2),
    )
    return y


def rotary_fwd(x, cos, sin):
    return _turn(x, cos, sin, 1)


def rotary_bwd(dy, cos, sin):
    return _turn(dy, cos, sin, -1)
