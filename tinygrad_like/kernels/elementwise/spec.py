"""Elementwise kernels and data movement: binary arithmetic (broadcast as NumPy does; either
side may be a Python scalar; out, when given, is written in place), the unary ops by their
PyTorch names, max and its gradients, GELU, SwiGLU, dropout, casts, copies, fills,
concatenation, index gradients and sums. Data movement counts bytes only. 2-byte floats are
computed in fp32 and rounded once.

The unary ops, GELU and SwiGLU are declared by their scalar expressions
(expr.py: @elementwise(formula) on the stub, or declare), which count their FLOPs and exps and
from which both devices' kernels are generated: an elementwise op a model needs is one formula
here, its gradient's another.

cpu.py: NumPy, or a flat loop compiled by Numba (numba_source.py, for the expressions) where
NumPy would make one pass per operator, large contiguous operands in flat blocks, one per core;
cuda.py + elementwise.cu and the generated expressions.cu (cuda_source.py): one thread per
element, with CuPy itself where a custom kernel would add nothing (broadcasting binary ops,
sums over any axes, copies, concatenation).
"""

import builtins  # `sum` below is a kernel's stub
import math

import numpy as np

from ..record import KERNELS, Out, kernel, like, like_arg, per_element, per_output
from .expr import EXPRESSIONS, declare, elementwise, exp, log, sqrt, tanh, where


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


# The unary ops: one kernel pair, the op named by its PyTorch name. op -> (its formula, its
# gradient's: dx from x and dy), each an expression (expr.py) that counts itself; the backward
# recomputes op(x) from x where its derivative needs it (exp, tanh, sigmoid, silu).


def _sigmoid(x):
    return 1.0 / (1.0 + exp(-x))


UNARY_OPS = {
    "exp": (lambda x: exp(x), lambda x, dy: dy * exp(x)),
    "log": (lambda x: log(x), lambda x, dy: dy / x),
    "sqrt": (lambda x: sqrt(x), lambda x, dy: dy * 0.5 / sqrt(x)),
    "rsqrt": (lambda x: 1.0 / sqrt(x), lambda x, dy: dy * -0.5 / sqrt(x) / x),
    "tanh": (lambda x: tanh(x), lambda x, dy: dy * (1.0 - tanh(x) * tanh(x))),
    "sigmoid": (_sigmoid, lambda x, dy: dy * _sigmoid(x) * (1.0 - _sigmoid(x))),
    "silu": (
        lambda x: x * _sigmoid(x),
        lambda x, dy: dy * _sigmoid(x) * (1.0 + x * (1.0 - _sigmoid(x))),
    ),
    # x <= 0 ? 0 : x keeps a NaN; the gradient x > 0 ? dy : 0
    "relu": (lambda x: where(x <= 0.0, 0.0, x), lambda x, dy: where(x > 0.0, dy, 0.0)),
}
# op -> the Expressions of its forward and backward kernels (unary_fwd_<op>, unary_bwd_<op>)
UNARY = {
    op: (
        declare(f"unary_fwd_{op}", ("x",), fwd),
        declare(f"unary_bwd_{op}", ("x", "dy"), bwd),
    )
    for op, (fwd, bwd) in UNARY_OPS.items()
}


def unary_op(op):
    """op's (forward, backward) Expressions, or a ValueError naming the ops."""
    if op not in UNARY_OPS:
        raise ValueError(f"unknown unary op {op!r}: use one of {', '.join(UNARY_OPS)}")
    return UNARY[op]


def _unary_counts(direction, column):
    """A counting rule: op's forward (direction 0) or backward (1) FLOPs (column 0) or exps
    (column 1) per element of x, from its expression."""

    def rule(result, x, *args, op=None):
        return unary_op(args[-1] if op is None else op)[direction].counts()[column] * x.size

    return rule


def _unary_shape(x, *args):
    unary_op(args[-1])  # op, the last argument
    return like(x)


@kernel(shape=_unary_shape, flops=_unary_counts(0, 0), exps=_unary_counts(0, 1))
def unary_fwd(x, op):
    """op(x) elementwise for op in UNARY_OPS, in fp32 for 2-byte x and rounded once."""


@kernel(shape=_unary_shape, flops=_unary_counts(1, 0), exps=_unary_counts(1, 1))
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


# ---- GELU and SwiGLU, from their expressions (expr.py)

GELU_C = math.sqrt(2.0 / math.pi)


def _gelu_tanh_t(v):
    """tanh(((v v 0.044715 + 1) v) c), c = sqrt(2/pi): the tanh GELU's forward and backward
    share."""
    return tanh((v * v * 0.044715 + 1.0) * v * GELU_C)


def gelu_tanh(v):
    """GPT-2's GELU, tanh form: 0.5 v (1 + t), evaluated (t + 1) v 0.5."""
    return (_gelu_tanh_t(v) + 1.0) * v * 0.5


def gelu_tanh_grad(v, dy):
    """dy GELU'(v) = dy (0.5 (1 + t) + (1 - t^2) 0.5 c v (1 + 3 * 0.044715 v^2)), evaluated
    ((t + 1) 0.5 + inner (1 - t t)) dy with inner = ((v v 3 * 0.044715 + 1) v) 0.5 c."""
    t = _gelu_tanh_t(v)
    inner = (v * v * (3 * 0.044715) + 1.0) * v * (0.5 * GELU_C)
    return ((t + 1.0) * 0.5 + inner * (1.0 - t * t)) * dy


@elementwise(gelu_tanh)
def gelu_fwd(x):
    """GPT-2's GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). One tanh per
    element."""


@elementwise(gelu_tanh_grad)
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


def _summed(a, axis=None, keepdims=False, add=None, out=None):
    """The sum's Out, or out; add and out (the epilogue) must take its shape and a's dtype."""
    s = _reduced(a, axis, keepdims)
    for name, x in (("add", add), ("out", out)):
        if x is not None and (tuple(x.shape) != s.shape or x.dtype != s.dtype):
            raise ValueError(f"sum: {name} {tuple(x.shape)} {x.dtype}, need {s.shape} {s.dtype}")
    if out is not None and add is None:
        raise ValueError("sum: out= is where the epilogue's add= accumulates: give add= too")
    return s if out is None else out


# add= (and out=add) is the epilogue a captured step fuses into a sum (graph/fuse.py): a bias's
# gradient, the rows of dY summed, then added into the gradient, in one launch


@kernel(
    shape=_summed,
    flops=lambda r, a, *_, add=None, **kw: a.size + (0 if add is None else r.size),
    epilogue=("add", "out"),
)
def sum(a, axis=None, keepdims=False, add=None, out=None):
    """Sum over axes, accumulated in fp32 (fp64 for fp64), result in a's dtype [+ add, as
    add(add, sum) rounds] [into out]."""


# ---- then=: an expression kernel as another kernel's epilogue (the GEMMs', graph/fuse.py)


def then_outputs(c, then, aux):
    """What a kernel whose epilogue is then = (name, operands) returns (c: its own result's Out):
    the outputs of name(*operands, C), an elementwise kernel declared by its expression, [and C
    after them: aux], or C without then=; ValueError for any other kernel, operands that do not
    fit C, or aux without then=."""
    if then is None:
        if aux:
            raise ValueError("aux=True returns C beside then='s outputs: give then=")
        return c
    name, operands = then
    if name not in EXPRESSIONS:
        raise ValueError(f"then= names {name!r}, not an elementwise expression kernel")
    outs = KERNELS[name].shape(*operands, c)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return (*outs, c) if aux else outs if len(outs) > 1 else outs[0]


def then_epilogue(kernels, c, then, aux):
    """Run a kernel's then= epilogue on its result C, on the device whose elementwise kernels are
    `kernels` (its cpu.py or cuda.py module): then[0](*then[1], C) -> its outputs [and C: aux],
    or C without then=."""
    if then is None:
        return c
    name, operands = then
    out = getattr(kernels, name)(*operands, c)
    return ((*out, c) if isinstance(out, tuple) else (out, c)) if aux else out


def then_counts(r, then):
    """(FLOPs, exps) of then='s kernel on C (r: an Out of C's shape), (0, 0) without one."""
    if then is None:
        return 0, 0
    k = KERNELS[then[0]]
    return k.flops(r, *then[1], r), (k.exps(r, *then[1], r) if k.exps else 0)


# ---- Lab 5's fused kernels: the MLP's bias and GELU, and the block's bias and residual, each
# one pass where the unfused ops make two (and write, then read back, the tensor between)


@elementwise(lambda v, b: gelu_tanh(v + b), rows=("b",))
def bias_gelu(v, b):
    """GELU(v + b), b (C,) broadcast over the rows of v (..., C): the fc bias and GPT-2's GELU
    in the unfused order (add, then gelu_fwd's formula), so the same bits in fp32."""


@elementwise(lambda x, v, b: x + (v + b), rows=("b",))
def bias_residual(x, v, b):
    """x + (v + b), b (C,) broadcast over the rows: the proj bias and the residual add (the
    lab's bias_gelu_residual, out = x + v + b; it has no GELU, so it is named for what it
    does), in the unfused order: the same bits in fp32."""


def _swiglu_s(gate):
    """sigmoid(gate) = 1 / (exp(-gate) + 1) (exp of a large -gate is inf: s = 0)."""
    return 1.0 / (exp(-gate) + 1.0)


@elementwise(lambda gate, up: _swiglu_s(gate) * gate * up)
def swiglu_fwd(gate, up):
    """Llama's SwiGLU: silu(gate) * up = gate sigmoid(gate) up, gate and up of one shape. One
    exp per element."""


def _swiglu_grads(gate, up, dy):
    s = _swiglu_s(gate)
    return ((1.0 - s) * gate + 1.0) * s * up * dy, gate * s * dy


@elementwise(_swiglu_grads)
def swiglu_bwd(gate, up, dy):
    """-> (dgate, dup): dgate = dy up s (1 + gate (1 - s)), dup = dy gate s, s = sigmoid(gate)
    recomputed."""
