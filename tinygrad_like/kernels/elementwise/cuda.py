"""Elementwise kernels and data movement on CUDA (elementwise.cu, and expressions.cu for the
kernels spec.py declares by their expressions: the unary ops, GELU, SwiGLU, ...), with CuPy
itself where a custom kernel would add nothing: binary ops that broadcast, sums over arbitrary
axes, copies, fills, concatenation and index gradients. Dropout draws from its own random
stream (not the CPU's).
"""

import cupy
import numpy as np

from ... import dtypes
from ...backend.cuda.runtime import CTYPES, HALF, NULL, TRAINING, acc_type, f32, launch_flat
from .cuda_source import FILENAME
from .expr import device_kernels
from .spec import unary_op


def _binary(op, ufunc):
    """a (op) b with NumPy broadcasting; either side may be a Python scalar. Same shapes (or a
    scalar) run elementwise.cu's binary kernel; broadcasting and mixed dtypes run CuPy's ufunc,
    2-byte floats computed in fp32 and rounded once, as the CPU twin does."""

    def kernel(a, b, out=None):
        arrays = [x for x in (a, b) if isinstance(x, cupy.ndarray)]
        dtype = np.result_type(*[x.dtype for x in arrays])
        shape = arrays[0].shape
        plain = [
            x.dtype == dtype and x.shape == shape and x.flags.c_contiguous
            for x in arrays + ([] if out is None else [out])
        ]
        if dtype in CTYPES and all(plain):
            y = cupy.empty(shape, dtype=dtype) if out is None else out
            ptrs = [x if isinstance(x, cupy.ndarray) else NULL for x in (a, b)]
            scalars = [acc_type(dtype)(0 if isinstance(x, cupy.ndarray) else x) for x in (a, b)]
            launch_flat(
                "elementwise.cu",
                "binary",
                (dtype, op),
                y.size,
                *ptrs,
                *scalars,
                y,
                np.int64(y.size),
            )
            return y
        if dtype in HALF:
            y = ufunc(f32(a), f32(b))
            if out is None:
                return y.astype(dtype)
            out[...] = y
            return out
        return ufunc(a, b, out=out)

    return kernel


add = _binary(0, cupy.add)
sub = _binary(1, cupy.subtract)
mul = _binary(2, cupy.multiply)
div = _binary(3, cupy.divide)


def neg(a):
    return mul(a, -1.0) if a.dtype in CTYPES else cupy.negative(a)


# ---------------------------------------------------------------- div's gradient, unary ops, max
# div_bwd and the unary ops run elementwise.cu's kernels; amax, argmax and their gradients are
# CuPy's reductions and ufuncs (in fp32 for 2-byte inputs), elementwise/cpu.py's formulas.


def div_bwd(a, b, dy):
    """a (or a scalar), b and dy of one shape, dtype and C-contiguous run elementwise.cu's
    div_bwd; broadcasting runs CuPy's ufuncs in fp32."""
    dtype = np.result_type(*[x.dtype for x in (a, b, dy) if isinstance(x, cupy.ndarray)])
    arrays = [x for x in (a, b, dy) if isinstance(x, cupy.ndarray)]
    if dtype in CTYPES and all(
        x.dtype == dtype and x.shape == dy.shape and x.flags.c_contiguous for x in arrays
    ):
        db = cupy.empty(dy.shape, dtype=dtype)
        scalar = acc_type(dtype)(0 if isinstance(a, cupy.ndarray) else a)
        launch_flat(
            "elementwise.cu",
            "div_bwd",
            (dtype,),
            db.size,
            a if isinstance(a, cupy.ndarray) else NULL,
            scalar,
            b,
            dy,
            db,
            np.int64(db.size),
        )
        return db
    db = -(f32(dy) * (f32(a) / f32(b))) / f32(b)
    return db.astype(dtype, copy=False)


def unary_fwd(x, op):
    """spec.UNARY_OPS' formula, its kernel in expressions.cu (_run)."""
    return _run(unary_op(op)[0], (x,))


def unary_bwd(x, dy, op):
    return _run(unary_op(op)[1], (x, dy))


def amax(a, axis=None, keepdims=False):
    return cupy.max(f32(a), axis=axis, keepdims=keepdims).astype(a.dtype, copy=False)


def argmax(a, axis):
    return cupy.argmax(f32(a), axis=axis, keepdims=True).astype(np.int64, copy=False)


def amax_bwd(x, y, dy, axis):
    hit = f32(x) == f32(y)
    count = hit.sum(axis=axis, keepdims=True, dtype=dtypes.compute_dtype(x.dtype))
    return cupy.where(hit, f32(dy) / count, 0).astype(x.dtype, copy=False)


def max_bwd(dy, idx, shape, axis):
    positions = cupy.arange(shape[axis]).reshape(
        [-1 if i == axis else 1 for i in range(len(shape))]
    )
    return cupy.where(positions == idx, f32(dy), 0).astype(dy.dtype, copy=False)  # exact


def contiguous(a):
    return cupy.ascontiguousarray(a)


def cast(a, dtype):
    dtype = np.dtype(dtype)
    if a.dtype == dtype or a.dtype not in TRAINING or dtype not in TRAINING:
        return a.astype(dtype)
    a = cupy.ascontiguousarray(a)
    y = cupy.empty(a.shape, dtype=dtype)
    launch_flat("elementwise.cu", "cast", (a.dtype, dtype), a.size, a, y, np.int64(a.size))
    return y


def copy(dst, src):
    dst[...] = src
    return dst


def fill(dst, value):
    dst.fill(value)
    return dst


def concat(arrays, axis):
    return cupy.concatenate(arrays, axis=axis)


def index_bwd(dy, shape, index):
    dx = cupy.zeros(shape, dtype=dy.dtype)
    dx[index] = dy
    return dx


_add = add  # sum's epilogue, whose add= parameter hides the kernel's name


def sum(a, axis=None, keepdims=False, add=None, out=None):
    """CuPy's sum with an fp32 (fp64 for fp64) accumulator, rounded to a's dtype; then
    add(add, sum) [into out], the unfused add's bits (a second kernel)."""
    s = cupy.sum(a, axis=axis, keepdims=keepdims, dtype=dtypes.compute_dtype(a.dtype))
    s = s.astype(a.dtype, copy=False)
    return s if add is None else _add(add, s, out=out)


def dropout_fwd(x, p, seed):
    """The stream is a hash of (seed, element index): the same seed gives the same mask, but not
    NumPy's."""
    x = cupy.ascontiguousarray(x)
    y, mask = cupy.empty_like(x), cupy.empty_like(x)
    key = np.uint64(np.random.default_rng(seed).integers(2**63))  # any seed NumPy accepts
    scale = np.float32(1.0) / np.float32(1.0 - p)
    launch_flat(
        "elementwise.cu",
        "dropout_fwd",
        (x.dtype,),
        x.size,
        x,
        y,
        mask,
        np.int64(x.size),
        np.float32(p),
        scale,
        key,
    )
    return y, mask


def _run(e, args):
    """Expression e's kernel in expressions.cu (cuda_source.py) over args made contiguous in
    the first input's dtype -> an output per formula output, of its shape and dtype."""
    first = e.check(*args)
    ins = [cupy.ascontiguousarray(a, dtype=first.dtype) for a in args]
    outs = [cupy.empty(first.shape, dtype=first.dtype) for _ in e.outputs]
    cols = [np.int64(first.shape[-1])] if e.rows else []  # a row vector's length
    n = first.size
    launch_flat(FILENAME, e.name, (first.dtype,), n, *ins, *outs, np.int64(n), *cols)
    return tuple(outs) if len(outs) > 1 else outs[0]


# gelu_fwd, gelu_bwd, swiglu_fwd, ...: every kernel spec.py declares by its expression
globals().update(device_kernels(_run, __name__))
