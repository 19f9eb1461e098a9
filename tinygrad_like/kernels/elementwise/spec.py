"""Elementwise kernels and data movement: binary arithmetic (broadcast as NumPy does; either
side may be a Python scalar; out, when given, is written in place), the unary ops by their
PyTorch names, max and its gradients, GELU, SwiGLU, dropout, casts, copies, fills,
concatenation, index gradients and sums. Data movement counts bytes only. 2-byte floats are
computed in fp32 and rounded once.

cpu.py: NumPy, or a flat loop compiled by Numba where NumPy would make one pass per operator,
large contiguous operands in flat blocks, one per core; cuda.py + elementwise.cu: one thread per
element, with CuPy itself where a custom kernel would add nothing (broadcasting binary ops,
sums over any axes, copies, concatenation).
"""

import builtins  # `sum` below is a kernel's stub

import numpy as np

from ..record import Out, kernel, like, like_arg, per_element, per_output


def _arrays(*operands):
    return [x for x in operands if hasattr(x, "shape") and hasattr(x, "dtype")]


def _result_dtype(*operands):
    """NumPy's result dtype of the array operands (a Python scalar takes the arrays')."""
    return np.result_type(*[x.dtype for x in _arrays(*operands)])


def _binary_shape(a, b, out=None):
    """The broadcast shape, NumPy's result dtype of the array operands (a Python scalar takes
    the array's), or out (which must take that shape)."""
    arrays = _arrays(a, b)
    shape = np.broadcast_shapes(*[tuple(x.shape) for x in arrays])
    if out is not None:
        np.broadcast_shapes(shape, tuple(out.shape))  # NumPy's ValueError when they do not fit
        return out
    return Out(shape, _result_dtype(a, b))


def _reduced(a, axis=None, keepdims=False, dtype=None):
    """a reduced over axis (None: all; an int or a tuple), the axes kept as 1 when keepdims."""
    axes = range(a.ndim) if axis is None else (axis,) if isinstance(axis, int) else axis
    axes = {i % a.ndim for i in axes} if a.ndim else set()
    shape = tuple(1 if i in axes else n for i, n in enumerate(a.shape) if keepdims or i not in axes)
    return Out(shape, np.dtype(a.dtype if dtype is None else dtype))


def _contiguous(a):
    """a itself when it is C-contiguous (np.ascontiguousarray's), else a new copy."""
    return a if a.flags.c_contiguous else like(a)


def _copied(dst, src):
    np.broadcast_shapes(tuple(src.shape), tuple(dst.shape))  # dst[...] = src broadcasts
    return dst


def _concat(arrays, axis):
    first = tuple(arrays[0].shape)
    axis = axis % len(first)
    for a in arrays:
        if len(a.shape) != len(first) or any(
            n != m for i, (n, m) in enumerate(zip(a.shape, first)) if i != axis
        ):
            raise ValueError(f"concat along axis {axis}: shapes {[x.shape for x in arrays]}")
    shape = first[:axis] + (builtins.sum(a.shape[axis] for a in arrays),) + first[axis + 1 :]
    return Out(shape, np.result_type(*[a.dtype for a in arrays]))


def _index_bwd(dy, shape, index):
    """zeros of shape with dy written at index: dy must fit x[index]'s shape (a stand-in of
    shape answers it, reading nothing)."""
    stand_in = np.lib.stride_tricks.as_strided(np.empty(1), tuple(shape), (0,) * len(shape))
    np.broadcast_shapes(tuple(dy.shape), stand_in[index].shape)
    return Out(tuple(shape), dy.dtype)


@kernel(shape=_binary_shape, flops=per_output)
def add(a, b, out=None):
    """a + b."""


@kernel(shape=_binary_shape, flops=per_output)
def sub(a, b, out=None):
    """a - b."""


@kernel(shape=_binary_shape, flops=per_output)
def mul(a, b, out=None):
    """a * b."""


@kernel(shape=_binary_shape, flops=per_output)
def div(a, b, out=None):
    """a / b."""


@kernel(shape=like_arg(0), flops=per_element(1))
def neg(a):
    """-a."""


# ---- div's gradient, the unary ops, max (PyTorch's names)


@kernel(
    shape=lambda a, b, dy: Out(
        tuple(dy.shape), np.result_type(*[x.dtype for x in _arrays(a, b, dy)])
    ),
    flops=per_output,
)
def div_bwd(a, b, dy):
    """-dy a / b^2, the gradient of a / b with respect to b (dy's shape: broadcast), computed
    as -(dy (a / b)) / b in fp32 for 2-byte operands and rounded once (b * b in fp16 overflows
    for |b| >= 256). a may be a Python scalar. 4 FLOPs per output."""


# The unary ops: one kernel pair, the op named by its PyTorch name. op -> (forward FLOPs,
# forward exps, backward FLOPs, backward exps) per element; the backward recomputes op(x) from
# x where its derivative needs it (exp, tanh, sigmoid, silu), so it counts that again. A log
# per element counts as an exp (one transcendental each); sqrt as a FLOP, as above.
UNARY_OPS = {
    "exp": (1, 1, 2, 1),  # exp(x); dy exp(x)
    "log": (1, 1, 1, 0),  # log(x); dy / x
    "sqrt": (1, 0, 3, 0),  # sqrt(x); dy 0.5 / sqrt(x)
    "rsqrt": (2, 0, 5, 0),  # 1 / sqrt(x); dy -0.5 / sqrt(x) / x
    "tanh": (1, 1, 4, 1),  # tanh(x); dy (1 - t^2)
    "sigmoid": (4, 1, 7, 1),  # s = 1 / (1 + exp(-x)); dy s (1 - s)
    "silu": (5, 1, 9, 1),  # x s; dy s (1 + x (1 - s))
    "relu": (1, 0, 1, 0),  # x > 0 ? x : 0 (NaN stays NaN); x > 0 ? dy : 0
}


def unary_op(op):
    """The index of op in UNARY_OPS (elementwise.cu's UnaryOp), or a ValueError naming them."""
    if op not in UNARY_OPS:
        raise ValueError(f"unknown unary op {op!r}: use one of {', '.join(UNARY_OPS)}")
    return list(UNARY_OPS).index(op)


def _unary(column):
    return lambda r, x, *a, op=None: UNARY_OPS[a[-1] if op is None else op][column] * x.size


def _unary_shape(x, *args):
    unary_op(args[-1])  # op, the last argument
    return like(x)


@kernel(shape=_unary_shape, flops=_unary(0), exps=_unary(1))
def unary_fwd(x, op):
    """op(x) elementwise for op in UNARY_OPS, in fp32 for 2-byte x and rounded once."""


@kernel(shape=_unary_shape, flops=_unary(2), exps=_unary(3))
def unary_bwd(x, dy, op):
    """dx = dy op'(x), op'(x) from the forward's input x."""


@kernel(shape=_reduced, flops=per_element(1))
def amax(a, axis=None, keepdims=False):
    """The max over axes (NaN if any is NaN), in a's dtype."""


@kernel(shape=lambda a, axis: _reduced(a, axis, True, np.int64), flops=per_element(1))
def argmax(a, axis):
    """int64 index of the first max along axis (a NaN counts as the max), axis kept (size 1)."""


@kernel(shape=like_arg(0), flops=per_element(3))
def amax_bwd(x, y, dy, axis):
    """Gradient of amax over axis: dx = dy (x == y) / count(x == y over axis), spread evenly
    over ties as PyTorch's amax; y and dy keep the reduced axes (size 1). In fp32 for 2-byte
    x, rounded once."""


@kernel(shape=lambda dy, idx, shape, axis: Out(tuple(shape), dy.dtype))
def max_bwd(dy, idx, shape, axis):
    """Gradient of max along axis with indices idx: zeros of shape with dy at idx (dy and idx
    keep the axis, size 1)."""


@kernel(shape=like_arg(0), flops=per_element(8), exps=per_element(1))
def gelu_fwd(x):
    """GPT-2's GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). One tanh per
    element."""


@kernel(shape=like_arg(0), flops=per_element(16), exps=per_element(1))
def gelu_bwd(x, dy):
    """dx = dy GELU'(x), the forward's tanh recomputed."""


@kernel(shape=lambda x, p, seed: (like(x), like(x)), flops=per_element(2))
def dropout_fwd(x, p, seed):
    """Inverted dropout: -> (y, mask), mask in x's dtype holding 0 or 1/(1-p)."""


@kernel(shape=_contiguous)
def contiguous(a):
    """A C-contiguous copy (reshaping a transposed view needs one; explicit so it counts);
    a itself when it is one."""


@kernel(shape=lambda a, dtype: like(a, dtype))
def cast(a, dtype):
    """a in another dtype."""


@kernel(shape=_copied, writes=(0,), skips=(0,))
def copy(dst, src):
    """dst[...] = src, in place (dst may be a view, e.g. a slice of a KV cache) -> dst."""


@kernel(shape=lambda dst, value: dst, writes=(0,), skips=(0,))
def fill(dst, value):
    """dst[...] = value, in place -> dst."""


@kernel(shape=_concat)
def concat(arrays, axis):
    """The arrays joined along axis."""


@kernel(shape=_index_bwd)
def index_bwd(dy, shape, index):
    """Gradient of x[index] for a basic index (ints, slices, None, ...: no element hit twice):
    zeros of x's shape with dy written at index."""


@kernel(shape=_reduced, flops=per_element(1))
def sum(a, axis=None, keepdims=False):
    """Sum over axes, accumulated in fp32 (fp64 for fp64), result in a's dtype."""


@kernel(shape=like_arg(0), flops=per_element(5), exps=per_element(1))
def swiglu_fwd(gate, up):
    """Llama's SwiGLU: silu(gate) * up = gate sigmoid(gate) up, gate and up of one shape. One
    exp per element."""


@kernel(
    shape=lambda gate, up, dy: (like(gate), like(up)), flops=per_element(11), exps=per_element(1)
)
def swiglu_bwd(gate, up, dy):
    """-> (dgate, dup): dgate = dy up s (1 + gate (1 - s)), dup = dy gate s, s = sigmoid(gate)
    recomputed."""
