"""Elementwise kernels as ops of a compiled CPU step (backend/cpu/step_runner.py), their
elements split over the threads: add of two fp32 arrays, each of the result's shape or broadcast
over its leading dimensions (cpu.py's add: NumPy's, each sum rounded once); cast from fp32 to
bf16 (halves.py's rounding kernel); and the expression kernels GELU and SwiGLU, launched on
their own or as a GEMM's then= epilogue (gemm/ and quant/cpu_step.py). Each by its kernel's
serial twin where it has one, whose loop computes each element the same way on any split: the
bits of the launch from Python."""

import numba
import numpy as np

from ...backend.cpu.halves import _bf16_rounded
from ...backend.cpu.step_runner import Unsupported, f32_at, form, op, share, u16_at, u32_at
from ...dtypes import bfloat16
from . import numba_source

# The expression kernels a step runs on their own or as a GEMM's then= epilogue: their codes,
# and the serial twins of their compiled kernels over flat fp32 (n,) arrays (inputs, then out)
THEN = {"gelu_fwd": 1, "swiglu_fwd": 2}
_gelu_fwd = numba_source.compiled("gelu_fwd").serial
_swiglu_fwd = numba_source.compiled("swiglu_fwd").serial  # (gate, up, out): then= up's
_bf16_bits = _bf16_rounded.serial  # fp32 bits (n,) -> bf16 bits (n,), rounded to nearest even


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


@op
def _to_bf16(t, T, a):
    # a: x (n,) fp32 as its bits (uint32), out (n,) bf16 as its bits (uint16); n
    n = a[2]
    x, out = numba.carray(u32_at(a[0]), (n,)), numba.carray(u16_at(a[1]), (n,))
    lo, hi = share(n, t, T)
    if lo < hi:
        _bf16_bits(x[lo:hi], out[lo:hi])


@form("cast")
def _cast_form(ops, outs, a, dtype):
    if a.dtype != np.float32 or np.dtype(dtype) != bfloat16 or outs[0] is None:
        raise Unsupported("cast: fp32 to bf16")
    ops.add(_to_bf16, a.view(np.uint32), outs[0].view(np.uint16), a.size)


@op
def _expression(t, T, a):
    # a: x (n,), y (n,) or 0, out (n,), fp32; n, the kernel's code (THEN's)
    n, code = a[3], a[4]
    x, out = numba.carray(f32_at(a[0]), (n,)), numba.carray(f32_at(a[2]), (n,))
    y = numba.carray(f32_at(a[1] if a[1] else a[0]), (n,))
    lo, hi = share(n, t, T)
    if lo < hi:
        if code == 1:
            _gelu_fwd(x[lo:hi], out[lo:hi])
        else:
            _swiglu_fwd(x[lo:hi], y[lo:hi], out[lo:hi])


def _expression_form(name):
    def expression_form(ops, outs, *args):
        if any(a.dtype != np.float32 or a.shape != args[0].shape for a in args) or outs[0] is None:
            raise Unsupported(f"{name}: fp32 operands of one shape")
        ops.add(_expression, *args, *([0] * (2 - len(args))), outs[0], args[0].size, THEN[name])

    return expression_form


def epilogue(ops, outs, M, N, add=None, then=None):
    """(C's buffer (M, N), the epilogue's four Ops.add values) for a GEMM's op whose output is
    outs[0] (M, N): add= (its address or 0), then='s code (0: none), its operand (or 0), and
    where then= writes (0: none). C is the output itself without then=, else a scratch of the
    op's own. Unsupported for another then= or an operand that is no fp32 (M, N) array."""
    arrays = (add, *(then[1] if then else ()))
    if any(a is not None and not a.flags.c_contiguous for a in arrays):
        raise Unsupported("a GEMV epilogue of a strided array")  # reshape would copy it
    add = 0 if add is None else add.reshape(M, N)
    if then is None:
        return outs[0].reshape(M, N), (add, 0, 0, 0)
    name, operands = then
    if name not in THEN or len(operands) != THEN[name] - 1:
        raise Unsupported(f"then={name}")
    operand = operands[0].reshape(M, N) if operands else 0
    if operands and operands[0].dtype != np.float32:
        raise Unsupported(f"then={name} of a {operands[0].dtype} operand")
    return ops.scratch((M, N)), (add, THEN[name], operand, outs[0].reshape(M, N))


@numba.njit(inline="always")
def apply_epilogue(a, k, c, lo, hi):
    """Columns [lo, hi) of C (M, N) fp32: + add, then then='s kernel into its output, as the
    launch from Python runs them one after the other (elementwise's add, then_epilogue); a[k]
    to a[k + 3] the values epilogue() gave."""
    M, N = c.shape
    if a[k]:
        add = numba.carray(f32_at(a[k]), (M, N))
        for m in range(M):
            for j in range(lo, hi):
                c[m, j] = add[m, j] + c[m, j]
    code = a[k + 1]
    if code:
        out = numba.carray(f32_at(a[k + 3]), (M, N))
        operand = numba.carray(f32_at(a[k + 2] if a[k + 2] else a[k + 3]), (M, N))
        for m in range(M):
            if code == 1:
                _gelu_fwd(c[m, lo:hi], out[m, lo:hi])
            else:
                _swiglu_fwd(operand[m, lo:hi], c[m, lo:hi], out[m, lo:hi])


for _name in THEN:  # the same kernels launched on their own
    form(_name)(_expression_form(_name))
