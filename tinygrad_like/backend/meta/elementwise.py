"""Elementwise kernels and data movement on the meta device (elementwise.py's shapes): NumPy's
broadcasting and result dtypes, arguments written in place returned as the CPU returns them."""

import builtins  # `sum` below is a kernel

import numpy as np

from ..contract import unary_op
from .array import MetaArray
from .runtime import like, new


def _binary(name):
    """a (op) b: the broadcast shape, NumPy's result dtype of the array operands (a Python
    scalar takes the array's), or out."""

    def kernel(a, b, out=None):
        arrays = [x for x in (a, b) if isinstance(x, MetaArray)]
        shape = np.broadcast_shapes(*[x.shape for x in arrays])
        if out is not None:
            np.broadcast_shapes(shape, out.shape)  # NumPy's ValueError when they do not fit
            return out
        return new(shape, np.result_type(*[x.dtype for x in arrays]))

    kernel.__name__ = name
    return kernel


add = _binary("add")
sub = _binary("sub")
mul = _binary("mul")
div = _binary("div")


def neg(a):
    return like(a)


# ---- div's gradient, the unary ops, max


def div_bwd(a, b, dy):
    return new(dy.shape, np.result_type(*[x.dtype for x in (a, b, dy) if isinstance(x, MetaArray)]))


def unary_fwd(x, op):
    unary_op(op)
    return like(x)


def unary_bwd(x, dy, op):
    unary_op(op)
    return like(x)


def amax(a, axis=None, keepdims=False):
    return sum(a, axis, keepdims)  # the sum's shape and dtype


def argmax(a, axis):
    """int64 indices, the axis kept (size 1)."""
    return new(tuple(1 if i == axis % a.ndim else n for i, n in enumerate(a.shape)), np.int64)


def amax_bwd(x, y, dy, axis):
    return like(x)


def max_bwd(dy, idx, shape, axis):
    return new(tuple(shape), dy.dtype)


def contiguous(a):
    """a itself when it is C-contiguous (np.ascontiguousarray's), else a fresh copy."""
    return a if a.c_contiguous else like(a)


def cast(a, dtype):
    return like(a, dtype)


def copy(dst, src):
    np.broadcast_shapes(src.shape, dst.shape)
    return dst


def fill(dst, value):
    return dst


def concat(arrays, axis):
    first = arrays[0].shape
    axis = axis % len(first)
    for a in arrays:
        if len(a.shape) != len(first) or any(
            n != m for i, (n, m) in enumerate(zip(a.shape, first)) if i != axis
        ):
            raise ValueError(f"concat along axis {axis}: shapes {[x.shape for x in arrays]}")
    shape = first[:axis] + (builtins.sum(a.shape[axis] for a in arrays),) + first[axis + 1 :]
    return new(shape, np.result_type(*[a.dtype for a in arrays]))


def index_bwd(dy, shape, index):
    dx = new(shape, dy.dtype)
    np.broadcast_shapes(dy.shape, dx[index].shape)
    return dx


def sum(a, axis=None, keepdims=False):
    axes = range(a.ndim) if axis is None else (axis,) if isinstance(axis, int) else axis
    axes = {i % a.ndim for i in axes}
    shape = tuple(1 if i in axes else n for i, n in enumerate(a.shape) if keepdims or i not in axes)
    return new(shape, a.dtype)


def gelu_fwd(x):
    return like(x)


def gelu_bwd(x, dy):
    return like(x)


def dropout_fwd(x, p, seed):
    """-> (y, mask), both of x's shape and dtype."""
    return like(x), like(x)


def swiglu_fwd(gate, up):
    return like(gate)


def swiglu_bwd(gate, up, dy):
    """-> (dgate, dup)."""
    return like(gate), like(up)
