"""layernorm_fwd and rmsnorm_fwd as ops of a compiled CPU step (backend/cpu/step_runner.py):
cpu.py's _layernorm_fwd and _rmsnorm_fwd (their serial twins: the same loops, the same bits) on
each thread's rows, for fp32 x, weight and bias (a decode step's row or two: a thread each)."""

import numba
import numpy as np

from ...backend.cpu.step_runner import Unsupported, f32_at, f64_of, form, op, share
from .cpu import _layernorm_fwd, _rmsnorm_fwd

_layernorm_rows, _rmsnorm_rows = _layernorm_fwd.serial, _rmsnorm_fwd.serial


@op
def _norm(t, T, a):
    # a: x, y (rows, C), weight (C,), bias (C,) or 0, mean (rows,) or 0, rstd (rows,), all fp32;
    # rows, C, eps's bits: layernorm with a bias, RMSNorm without
    rows, C = a[6], a[7]
    lo, hi = share(rows, t, T)
    if lo == hi:
        return
    x, y = numba.carray(f32_at(a[0]), (rows, C)), numba.carray(f32_at(a[1]), (rows, C))
    weight, rstd = numba.carray(f32_at(a[2]), (C,)), numba.carray(f32_at(a[5]), (rows,))
    eps = f64_of(a[8])
    if a[3]:
        bias, mean = numba.carray(f32_at(a[3]), (C,)), numba.carray(f32_at(a[4]), (rows,))
        _layernorm_rows(x[lo:hi], weight, bias, eps, y[lo:hi], mean[lo:hi], rstd[lo:hi])
    else:
        _rmsnorm_rows(x[lo:hi], weight, eps, y[lo:hi], rstd[lo:hi])


def _fp32(name, *arrays):
    if any(a is None or a.dtype != np.float32 for a in arrays) or not arrays[0].ndim:
        raise Unsupported(f"{name}: fp32 x, weight and outputs")


@form("layernorm_fwd")
def _layernorm_fwd_form(ops, outs, x, weight, bias, eps=1e-5):
    _fp32("layernorm_fwd", x, weight, bias, *outs)
    y, mean, rstd = outs
    C = x.shape[-1]
    ops.add(_norm, x, y, weight, bias, mean, rstd, x.size // C, C, float(eps))


@form("rmsnorm_fwd")
def _rmsnorm_fwd_form(ops, outs, x, weight, eps=1e-6):
    _fp32("rmsnorm_fwd", x, weight, *outs)
    y, rstd = outs
    C = x.shape[-1]
    ops.add(_norm, x, y, weight, 0, 0, rstd, x.size // C, C, float(eps))
