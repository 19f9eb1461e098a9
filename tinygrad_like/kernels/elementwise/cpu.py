"""Elementwise kernels and data movement on the CPU (elementwise.cu's twin): binary arithmetic
with NumPy's broadcasting, GELU, dropout, casts, copies, fills, concatenation, index gradients
and sums. Large contiguous operands run in flat blocks, one per core (runtime.in_parallel).
"""

import math

import numpy as np
from numba import prange

from ... import dtypes
from ...backend.cpu.compiled import exp, kernel, tanh
from ...backend.cpu.runtime import CHUNK, f32, in_parallel, rounded
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
    """a (op) b with NumPy broadcasting; either side may be a Python scalar. A large a with a b
    of its shape or one value (the residual adds, dW summed over the LM head's row blocks,
    gradients scaled in place) runs in flat blocks, one per core."""

    def kernel(a, b, out=None):
        dtype = np.result_type(*[x.dtype for x in (a, b) if isinstance(x, np.ndarray)])
        if dtype in (dtypes.float16, dtypes.bfloat16):
            return rounded(np.asarray(ufunc(f32(a), f32(b))), dtype, out)
        if not _splits(a, b, out, dtype):
            return np.asarray(ufunc(a, b, out=out))  # asarray: 0-d results stay arrays
        out = np.empty(a.shape, dtype) if out is None else out
        fa, fo = a.reshape(-1), out.reshape(-1)
        fb = b.reshape(-1) if isinstance(b, np.ndarray) else b  # (n,), (1,) or a scalar
        one = not isinstance(b, np.ndarray) or b.size == 1
        in_parallel(
            fa.size, lambda lo, hi: ufunc(fa[lo:hi], fb if one else fb[lo:hi], out=fo[lo:hi])
        )
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


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


# op -> (forward(x), backward(x, dy)) on x in fp32 (fp64 for fp64): elementwise.cu's
# unary_value and unary_grad, term for term; the FLOPs per element are spec.UNARY_OPS'.
UNARY = {
    "exp": (np.exp, lambda x, dy: dy * np.exp(x)),
    "log": (np.log, lambda x, dy: dy / x),
    "sqrt": (np.sqrt, lambda x, dy: dy * 0.5 / np.sqrt(x)),
    "rsqrt": (lambda x: 1 / np.sqrt(x), lambda x, dy: dy * -0.5 / np.sqrt(x) / x),
    "tanh": (np.tanh, lambda x, dy: dy * (1 - np.tanh(x) * np.tanh(x))),
    "sigmoid": (_sigmoid, lambda x, dy: dy * _sigmoid(x) * (1 - _sigmoid(x))),
    "silu": (
        lambda x: x * _sigmoid(x),
        lambda x, dy: dy * _sigmoid(x) * (1 + x * (1 - _sigmoid(x))),
    ),
    "relu": (lambda x: np.where(x <= 0, 0, x), lambda x, dy: np.where(x > 0, dy, 0)),
}


def _unary_kernel(x, others, formula):
    """formula(x, *others) over flat blocks in parallel, in fp32 for 2-byte x, rounded once.
    log(0) = -inf, sqrt(-1) = nan and exp's overflow to inf are PyTorch's values, so NumPy's
    warnings about them are silenced (np.errstate is per thread)."""

    def body(out, x, *others):
        with np.errstate(all="ignore"):
            out[...] = formula(f32(x), *[f32(o) for o in others])

    return _elementwise(x, *others, body=body)


def unary_fwd(x, op):
    """UNARY's formula over flat blocks, one per core (_unary_kernel)."""
    unary_op(op)
    return _unary_kernel(x, (), UNARY[op][0])


def unary_bwd(x, dy, op):
    unary_op(op)
    return _unary_kernel(x, (dy.astype(x.dtype, copy=False),), UNARY[op][1])


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
    return a.astype(dtype)


def copy(dst, src):
    dst[...] = src
    return dst


def fill(dst, value):
    """A contiguous dst (the flat gradient buffers) is filled in blocks, one per core: one
    core's memset reaches only part of the machine's write bandwidth."""
    flat = dst.reshape(-1) if dst.flags.c_contiguous else None
    if flat is None:
        dst.fill(value)
    else:
        in_parallel(flat.shape[0], lambda lo, hi: flat[lo:hi].fill(value), chunk_rows=1 << 20)
    return dst


def concat(arrays, axis):
    return np.concatenate(arrays, axis=axis)


def index_bwd(dy, shape, index):
    """functional.getitem allows only basic indexes, so no element is hit twice: one assignment."""
    dx = np.zeros(shape, dtype=dy.dtype)
    dx[index] = dy
    return dx


def sum(a, axis=None, keepdims=False):
    """NumPy's sum with an fp32 (fp64 for fp64) accumulator."""
    total = np.sum(a, axis=axis, keepdims=keepdims, dtype=dtypes.compute_dtype(a.dtype))
    return rounded(np.asarray(total), a.dtype)


def _elementwise(x, *others, body):
    """Run body(out_block, x_block, *other_blocks) over flat blocks in parallel -> out."""
    out = np.empty(x.shape, dtype=x.dtype)
    flat = [a.reshape(-1) for a in (out, x) + others]
    in_parallel(x.size, lambda lo, hi: body(*[a[lo:hi] for a in flat]))
    return out


_GELU_C = math.sqrt(2.0 / math.pi)


@kernel
def _gelu(x, dy, out, backward):
    # one element per iteration, as elementwise.cu's thread per element, in its order:
    # t = tanh(((x x 0.044715 + 1) x) c); forward (t + 1) x 0.5, backward
    # ((t + 1) 0.5 + inner (1 - t^2)) dy with inner = ((x x 3 0.044715 + 1) x) 0.5 c
    A = x.dtype.type
    for i in prange(x.shape[0]):
        v = x[i]
        t = tanh((v * v * A(0.044715) + A(1)) * v * A(_GELU_C))
        if backward:
            inner = (v * v * A(3 * 0.044715) + A(1)) * v * A(0.5 * _GELU_C)
            out[i] = ((t + A(1)) * A(0.5) + inner * (A(1) - t * t)) * dy[i]
        else:
            out[i] = (t + A(1)) * v * A(0.5)


def _flat(a):
    """a (any shape and strides) as a contiguous (a.size,) array in the compute dtype (no copy
    when it is one already)."""
    return np.ascontiguousarray(f32(a)).reshape(-1)


def _run_gelu(x, dy):
    """_gelu over x (and dy) flattened, in the compute dtype -> out in x's dtype, rounded once."""
    xf = _flat(x)
    dyf = xf if dy is None else _flat(dy)
    out = np.empty(xf.shape, dtype=xf.dtype)
    _gelu(xf, dyf, out, dy is not None)
    return rounded(out, x.dtype).reshape(x.shape)


def gelu_fwd(x):
    """_gelu, one element per iteration as elementwise.cu's gelu_fwd."""
    return _run_gelu(x, None)


def gelu_bwd(x, dy):
    """dx = dy (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)), t the
    forward's tanh, in _gelu."""
    return _run_gelu(x, dy)


def dropout_fwd(x, p, seed):
    """The mask from NumPy's generator seeded with seed (the CUDA twin's is its own hash: not
    the same mask)."""
    keep = np.random.default_rng(seed).random(x.shape, dtype=np.float32) >= p
    mask = (keep / np.float32(1.0 - p)).astype(x.dtype)
    return mul(x, mask), mask


@kernel
def _swiglu(gate, up, dy, out, dup, backward):
    # one element per iteration, as elementwise.cu's swiglu_fwd / swiglu_bwd, in their order:
    # s = 1 / (exp(-gate) + 1) (exp of a large -gate is inf: s = 0); forward (s gate) up,
    # backward dup = (gate s) dy, dgate = ((1 - s) gate + 1) s up dy
    A = gate.dtype.type
    for i in prange(gate.shape[0]):
        g = gate[i]
        s = A(1) / (exp(-g) + A(1))
        if backward:
            d = dy[i]
            dup[i] = g * s * d
            out[i] = ((A(1) - s) * g + A(1)) * s * up[i] * d
        else:
            out[i] = s * g * up[i]


def _run_swiglu(gate, up, dy):
    """_swiglu over gate, up (and dy) flattened, in the compute dtype -> (out, dup) in gate's
    dtype, rounded once (dup None in the forward)."""
    backward = dy is not None
    g, u = _flat(gate), _flat(up)
    d = _flat(dy) if backward else g
    out, dup = np.empty(g.shape, g.dtype), np.empty(g.shape if backward else 0, g.dtype)
    _swiglu(g, u, d, out, dup, backward)
    out = rounded(out, gate.dtype).reshape(gate.shape)
    return out, rounded(dup, gate.dtype).reshape(gate.shape) if backward else None


def swiglu_fwd(gate, up):
    """_swiglu in the compute dtype, rounded once."""
    return _run_swiglu(gate, up, None)[0]


def swiglu_bwd(gate, up, dy):
    return _run_swiglu(gate, up, dy)
