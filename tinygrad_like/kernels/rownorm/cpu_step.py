"""layernorm_fwd and rmsnorm_fwd as ops of a compiled CPU step (backend/cpu/step_runner.py):
cpu.py's _layernorm_fwd and _rmsnorm_fwd (their serial twins: the same loops, the same bits) on
each thread's rows, for fp32 x, weight and bias (a decode step's row or two: a thread each)."""

import numba
import numpy as np

from ...backend.cpu.step_runner import Unsupported, f32_at, f64_of, form, op, share
from .cpu import _layernorm_fwd, _rmsnorm_fwd

_layernorm_rows, _rmsnorm_rows = _layernorm_fwd.serial, _rmsnorm_fwd.serial


@op
def _layernorm(t, T, a):
    # a: x, y (rows, C), weight, bias (C,), mean, rstd (rows,), all fp32; rows, C, eps's bits
    rows, C = a[6], a[7]
    lo, hi = share(rows, t, T)
    if lo == hi:
        return
    x, y = numba.carray(f32_at(a[0]), (rows, C)), numba.carray(f32_at(a[1]), (rows, C))
    weight, bias = numba.carray(f32_at(a[2]), (C,)), numba.carray(f32_at(a[3]), (C,))
    mean, rstd = numba.carray(f32_at(a[4]), (rows,)), numba.carray(f32_at(a[5]), (rows,))
    eps = f64_of(a[8])
    _layernorm_rows(x[lo:hi], weight, bias, eps, y[lo:hi], mean[lo:hi], rstd[lo:hi])


@form("layernorm_fwd")
def _layernorm_fwd_form(ops, outs, x, weight, bias, eps=1e-5):
    arrays = (x, weight, bias, *outs)
    if any(a is None or a.dtype != np.float32 for a in arrays) or not x.ndim:
        raise Unsupported("layernorm_fwd: fp32 x, weight and bias")
    C = x.shape[-1]
    ops.add(_layernorm, x, outs[0], weight, bias, outs[1], outs[2], x.size // C, C, float(eps))


@op
def _rmsnorm(t, T, a):
    # a: x, y (rows, C), weight (C,), rstd (rows,), all fp32; rows, C, eps's bits
    rows, C = a[4], a[5]
    lo, hi = share(rows, t, T)
    if lo == hi:
        return
    x, y = numba.carray(f32_at(a[0]), (rows, C)), numba.carray(f32_at(a[1]), (rows, C))
    weight, rstd = numba.carray(f32_at(a[2]), (C,)), numba.carray(f32_at(a[3]), (rows,))
    _rmsnorm_rows(x[lo:hi], weight, f64_of(a[6]), y[lo:hi], rstd[lo:hi])


@form("rmsnorm_fwd")
def _rmsnorm_fwd_form(ops, outs, x, weight, eps=1e-6):
    if any(a is None or a.dtype != np.float32 for a in (x, weight, *outs)) or not x.ndim:
        raise Unsupported("rmsnorm_fwd: fp32 x and weight")
    C = x.shape[-1]
    ops.add(_rmsnorm, x, outs[0], weight, outs[1], x.size // C, C, float(eps))
