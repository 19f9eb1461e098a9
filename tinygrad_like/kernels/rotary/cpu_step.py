"""rotary_fwd as an op of a compiled CPU step (backend/cpu/step_runner.py): cpu.py's _rotary
(its serial twin: the same loop, the same bits) on each thread's rows of x (B H T, D), split at
whole runs of T positions (a row's position is its index mod T), fp32 x and tables."""

import numba
import numpy as np

from ...backend.cpu.step_runner import Unsupported, f32_at, form, op, share
from .cpu import _rotary

_turned = _rotary.serial


@op
def _rotary_op(t, T, a):
    # a: x, y (rows, D), cos, sin (Tp, D / 2), fp32; rows, D, Tp
    rows, D, Tp = a[4], a[5], a[6]
    lo, hi = share(rows // Tp, t, T)
    if lo == hi:
        return
    x, y = numba.carray(f32_at(a[0]), (rows, D)), numba.carray(f32_at(a[1]), (rows, D))
    cos, sin = numba.carray(f32_at(a[2]), (Tp, D // 2)), numba.carray(f32_at(a[3]), (Tp, D // 2))
    _turned(x[lo * Tp : hi * Tp], cos, sin, np.float32(1), y[lo * Tp : hi * Tp])


@form("rotary_fwd")
def _rotary_fwd_form(ops, outs, x, cos, sin):
    if any(a.dtype != np.float32 for a in (x, cos, sin)) or outs[0] is None:
        raise Unsupported("rotary_fwd: fp32 x and tables")
    D, Tp = x.shape[-1], cos.shape[0]
    ops.add(_rotary_op, x, outs[0], cos, sin, x.size // D, D, Tp)
