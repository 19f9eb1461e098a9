"""Elementwise kernels and data movement on the CPU (elementwise.cu's twin): binary arithmetic
with NumPy's broadcasting, the unary ops, dropout, casts, copies, fills, concatenation, index
gradients and sums; the kernels spec.py declares by their expressions (GELU, SwiGLU, ...) are
compiled from them (numba_source.py). Large contiguous operands run in flat blocks, one per
core (runtime.in_parallel).
"""

import numpy as np
from numba import prange

from ... import dtypes
from ...backend.cpu import halves
from ...backend.cpu.compiled import f32_from_bf16_bits, f32_from_f16_bits, kernel
from ...backend.cpu.halves import HALVES, bf16_binary, converted, f32, rounded
from ...backend.cpu.runtime import CHUNK, in_parallel
from . import numba_source
from .expr import device_kernels, evaluate
from .spec import unary_op


def _splits(a, b, out, dtype):
    """Whether a (op) b runs in flat blocks: a large C-contiguous a of the result dtype, b of
    its shape (C-contiguous) or one value, out None or C-contiguous of a's shape."""
    if not (
        isinstance(a, np.ndarray)
        and a.dtype == dtype
        and a.size >= 2 * CHUNK
        and a.flags.c_contiguous
    ):
        return False
    if out is not None and not (out.shape == a.shape and out.flags.c_contiguous):
        return False
    if not isinstance(b, np.ndarray):
        return True  # a Python scalar
    return (b.size == 1 and b.ndim <= a.ndim) or (b.shape == a.shape and b.flags.c_contiguous)


def _binary(ufunc):
    """a (op) b with NumPy broadcasting; either side may be a Python scalar; 2-byte operands
    in fp32, the result rounded once. A large a with a b of its shape or one value (the
    residual adds, dW summed over the LM head's row blocks, gradients scaled in place) runs in
    flat blocks, one per core, each chunk's 2-byte operands widened (and its 2-byte result
    rounded) in the cache: the bits of widening the whole arrays, one pass over memory."""

    def kernel(a, b, out=None):
        dtype = np.result_type(*[x.dtype for x in (a, b) if isinstance(x, np.ndarray)])
        half = dtype in (dtypes.float16, dtypes.bfloat16)
        if not _splits(a, b, out, dtype):
            if half:
                return rounded(np.asarray(ufunc(f32(a), f32(b))), dtype, out)
            return np.asarray(ufunc(a, b, out=out))  # asarray: 0-d results stay arrays
        out = np.empty(a.shape, dtype) if out is None else out
        if dtype == dtypes.bfloat16 and getattr(b, "dtype", None) == dtype == out.dtype:
            return bf16_binary(ufunc, a, b, out)
        fa, fo = a.reshape(-1), out.reshape(-1)
        fb = b.reshape(-1) if isinstance(b, np.ndarray) else b  # (n,), (1,) or a scalar
        one = not isinstance(b, np.ndarray) or b.size == 1

        def chunk(lo, hi):
            y = f32(fb if one else fb[lo:hi])
            if half:
                rounded(ufunc(f32(fa[lo:hi]), y), dtype, fo[lo:hi])
            else:
                ufunc(fa[lo:hi], y, out=fo[lo:hi])

        in_parallel(fa.size, chunk)
        return out

    kernel.__name__ = ufunc.__name__
    return kernel


add = _binary(np.add)
sub = _binary(np.subtract)
mul = _binary(np.multiply)
div = _binary(np.divide)


def neg(a):
    return np.asarray(np.negative(a))


# ---------------------------------------------------------------- div's gradient, unary ops, max
# (elementwise.cu's div_bwd and unary_fwd / unary_bwd; amax, argmax and their gradients are
# CuPy's own reductions on CUDA, the same formulas.)


def div_bwd(a, b, dy):
    """In fp32 for 2-byte operands, NumPy's broadcasting; b = 0 gives inf / nan, as PyTorch,
    without a warning."""
    dtype = np.result_type(*[x.dtype for x in (a, b, dy) if isinstance(x, np.ndarray)])
    af, bf, dyf = f32(a), f32(b), f32(dy)
    with np.errstate(all="ignore"):  # b = 0 gives inf / nan, as PyTorch, without a warning
        db = -(dyf * (af / bf)) / bf
    return rounded(np.asarray(db), dtype)


def _unary(x, others, e):
    """Expression e (spec.UNARY's) over x and others, in fp32 for 2-byte x, rounded once:
    compiled (_compiled) for fp32, fp64 and the 2-byte x read and written as their bits
    (halves.IN_PLACE), or by NumPy's ufuncs in flat blocks in parallel (expr.evaluate): for
    another 2-byte x, a block widening and rounding its own 2-byte elements, on its own core
    (_compiled widens the whole array first); and for log's forward in fp32 or fp64, whose
    NumPy ufunc is as fast as vector_math's log on one core and splits over the cores at sizes
    where the compiled kernel runs on one. exp, log and tanh (sigmoid and silu through exp) are
    vector_math's elsewhere, about an ulp from the exact value, as NumPy's are. log(0) = -inf,
    sqrt(-1) = nan and exp's overflow to inf are PyTorch's values, so NumPy's warnings about
    them are silenced (np.errstate is per thread)."""
    if x.dtype in halves.IN_PLACE or (
        x.dtype == dtypes.compute_dtype(x.dtype) and e is not _LOG_FORWARD
    ):
        return _compiled(e, (x, *others))

    def body(out, x, *others):
        with np.errstate(all="ignore"):
            (out[...],) = evaluate(e, [f32(x), *[f32(o) for o in others]], np)

    return _elementwise(x, *others, body=body)


_LOG_FORWARD = unary_op("log")[0]


def unary_fwd(x, op):
    """spec.UNARY_OPS' formula (_unary)."""
    return _unary(x, (), unary_op(op)[0])


def unary_bwd(x, dy, op):
    return _unary(x, (dy.astype(x.dtype, copy=False),), unary_op(op)[1])


def amax(a, axis=None, keepdims=False):
    """NumPy's max: NaN propagates, as in PyTorch."""
    return np.asarray(np.max(a, axis=axis, keepdims=keepdims))


def argmax(a, axis):
    return np.argmax(a, axis=axis, keepdims=True).astype(np.int64)


def amax_bwd(x, y, dy, axis):
    hit = x == y
    count = hit.sum(axis=axis, keepdims=True, dtype=dtypes.compute_dtype(x.dtype))
    with np.errstate(all="ignore"):  # a NaN row has no hit: 0 / 0, masked out below
        dx = np.where(hit, f32(dy) / count, 0)
    return rounded(dx, x.dtype)


def max_bwd(dy, idx, shape, axis):
    positions = np.arange(shape[axis]).reshape([-1 if i == axis else 1 for i in range(len(shape))])
    return np.where(positions == idx, dy, np.zeros((), dy.dtype))


def contiguous(a):
    return np.ascontiguousarray(a)


def cast(a, dtype):
    return converted(a, dtype)


def copy(dst, src):
    dst[...] = src
    return dst


def fill(dst, value):
    """A contiguous dst (the flat gradient buffers) is filled in blocks, one per core: one
    core's memset reaches only part of the machine's write bandwidth. A 2-byte float's buffer
    takes the value's bits through a uint16 view (the bits NumPy's fill writes; ml_dtypes'
    bf16 fill runs an element at a time, at a fifth of a memset's rate)."""
    flat = dst.reshape(-1) if dst.flags.c_contiguous else None
    if flat is None:
        dst.fill(value)
        return dst
    if flat.dtype in HALVES:
        flat, value = flat.view(np.uint16), np.array(value, flat.dtype).view(np.uint16)
    in_parallel(flat.shape[0], lambda lo, hi: flat[lo:hi].fill(value), chunk_rows=1 << 20)
    return dst


def concat(arrays, axis):
    return np.concatenate(arrays, axis=axis)


def index_bwd(dy, shape, index):
    """functional.getitem allows only basic indexes, so no element is hit twice: one assignment."""
    dx = np.zeros(shape, dtype=dy.dtype)
    dx[index] = dy
    return dx


_add = add  # sum's epilogue, whose add= parameter hides the kernel's name


def sum(a, axis=None, keepdims=False, add=None, out=None):
    """NumPy's sum with an fp32 (fp64 for fp64) accumulator, rounded to a's dtype; then
    add(add, sum) [into out], the unfused add's bits. The columns of a 2-byte (N, C >= 2)
    matrix (a bias's gradient) by _column_sums, whose order is NumPy's there: NumPy converts a
    2-byte array an element at a time as it sums."""
    acc = dtypes.compute_dtype(a.dtype)
    if a.dtype in HALVES and a.ndim == 2 and axis in (0, (0,)) and a.shape[1] >= 2:
        total = np.empty(a.shape[1], acc)
        _column_sums(np.ascontiguousarray(a).view(np.uint16), a.dtype == dtypes.bfloat16, total)
        total = total.reshape(1, -1) if keepdims else total
    else:
        total = np.asarray(np.sum(a, axis=axis, keepdims=keepdims, dtype=acc))
    total = rounded(total, a.dtype)
    return total if add is None else _add(add, total, out=out)


@kernel(work=lambda bits, bf16, total: bits.size)
def _column_sums(bits, bf16, total):
    # total (C,) fp32 = the sum over the rows of the 2-byte (N, C) matrix whose bits are bits,
    # each column from 0 in row order, as NumPy's axis-0 reduction adds a 2-byte array into an
    # fp32 sum (a column of -0 sums to +0), a block of columns per iteration, widened as read
    N, C = bits.shape
    for block in prange((C + _COLUMNS - 1) // _COLUMNS):
        lo, hi = block * _COLUMNS, min(block * _COLUMNS + _COLUMNS, C)
        total[lo:hi] = 0
        for i in range(N):
            row = bits[i, lo:hi]
            sums = total[lo:hi]
            if bf16:  # a loop of its own for each format, so that LLVM vectorizes both
                for j in range(row.shape[0]):
                    sums[j] += f32_from_bf16_bits(row[j])
            else:
                for j in range(row.shape[0]):
                    sums[j] += f32_from_f16_bits(np.int32(row[j]))


_COLUMNS = 256  # columns of _column_sums per prange iteration: 1 KB of sums


def _elementwise(x, *others, body):
    """Run body(out_block, x_block, *other_blocks) over flat blocks in parallel -> out."""
    out = np.empty(x.shape, dtype=x.dtype)
    flat = [a.reshape(-1) for a in (out, x) + others]
    in_parallel(x.size, lambda lo, hi: body(*[a[lo:hi] for a in flat]))
    return out


def _compiled(e, args):
    """Expression e's compiled kernel (numba_source.py) over args: the inputs contiguous in the
    compute dtype (2-byte ones widened exactly), flat or (rows, C) beside a row vector, each
    output rounded once to the first input's dtype and shape; inputs all of one 2-byte format
    (halves.IN_PLACE) read and the outputs written as their bits by the kernel's 2-byte twin
    (the same bits)."""
    first = e.check(*args)
    bits = first.dtype in halves.IN_PLACE and all(a.dtype == first.dtype for a in args)
    compute = first.dtype if bits else dtypes.compute_dtype(first.dtype)
    shape = (-1, first.shape[-1]) if e.rows else (-1,)  # (rows, C) beside a row vector (C,)
    ins = [halves.bits(np.ascontiguousarray(a if bits else f32(a), dtype=compute)) for a in args]
    ins = [a.reshape((-1,) if i.row else shape) for a, i in zip(ins, e.inputs)]
    outs = [np.empty(first.size, compute).reshape(shape) for _ in e.outputs]
    if first.size:
        numba_source.compiled(e.name, bits)(*ins, *(halves.bits(o) for o in outs))
    outs = tuple(rounded(o, first.dtype).reshape(first.shape) for o in outs)
    return outs if len(outs) > 1 else outs[0]


# gelu_fwd, gelu_bwd, swiglu_fwd, ...: every kernel spec.py declares by its expression
globals().update(device_kernels(_compiled, __name__))


def dropout_fwd(x, p, seed):
    """The mask from NumPy's generator seeded with seed (the CUDA twin's is its own hash: not
    the same mask)."""
    keep = np.random.default_rng(seed).random(x.shape, dtype=np.float32) >= p
    mask = (keep / np.float32(1.0 - p)).astype(x.dtype)
    return mul(x, mask), mask
