"""Elementwise kernels as ops of a compiled CPU step (backend/cpu/step_runner.py): add of two
fp32 arrays, each of the result's shape or broadcast over its leading dimensions (cpu.py's add:
NumPy's, each sum rounded once, the same bits), its elements split over the threads; and the
expression kernels a GEMM's then= epilogue runs (gemm/cpu_step.py), each thread its own part of
C, by the kernel's serial twin: the bits of the launch from Python, whose compiled loop computes
each element the same way on any split."""

import numba
import numpy as np

from ...backend.cpu.step_runner import Unsupported, f32_at, form, op, share
from . import numba_source


@op
def _add(t, T, a):
    # a: x (nx,), y (ny,), out (n,) fp32, x and y each tiled over out (_tiles); nx, ny, n
    nx, ny, n = a[3], a[4], a[5]
    x, y = numba.carray(f32_at(a[0]), (nx,)), numba.carray(f32_at(a[1]), (ny,))
    out = numba.carray(f32_at(a[2]), (n,))
    lo, hi = share(n, t, T)
    for i in range(lo, hi):
        out[i] = x[i % nx] + y[i % ny]


def _tiles(shape, result):
    """Whether an operand of shape, broadcast to result, repeats its flat elements in order:
    leading dimensions of 1 (added or present), then the result's own trailing ones."""
    padded = (1,) * (len(result) - len(shape)) + tuple(shape)
    lead = next((j for j, d in enumerate(padded) if d != 1), len(padded))
    return padded[lead:] == tuple(result[lead:])


@form("add")
def _add_form(ops, outs, a, b, out=None):
    arrays = all(isinstance(x, np.ndarray) and x.dtype == np.float32 for x in (a, b))
    if not arrays or out is not None or outs[0] is None:
        raise Unsupported("add: two fp32 arrays")
    result = np.broadcast_shapes(a.shape, b.shape)
    if not (_tiles(a.shape, result) and _tiles(b.shape, result)):
        raise Unsupported("add: a broadcast other than over leading dimensions")
    ops.add(_add, a, b, outs[0], a.size, b.size, outs[0].size)


# then= epilogues a step's GEMM may carry (gemm/cpu_step.py): their codes in then_rows, and
# the serial twins of their compiled kernels over flat fp32 (n,) arrays (x, out)
THEN = {"gelu_fwd": 1}
_gelu_fwd = numba_source.compiled("gelu_fwd").serial


def then_code(then):
    """then='s code for then_rows (0: none); Unsupported for a kernel it does not run."""
    if then is None:
        return 0
    name, operands = then
    if name not in THEN or operands:
        raise Unsupported(f"then={name}")
    return THEN[name]


@numba.njit(inline="always")
def then_rows(code, c, out, lo, hi):
    """out[m, lo:hi] = then='s kernel (then_code's code) of c[m, lo:hi], each row m of c."""
    for m in range(c.shape[0]):
        if code == 1:
            _gelu_fwd(c[m, lo:hi], out[m, lo:hi])
