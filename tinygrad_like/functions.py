"""The differentiable ops: one Function each, its forward beside its backward (tinygrad's
mlops.py), over arrays, through kernels.launch(name, ...), so each op's FLOPs and bytes are counted
where they happen. attention.py and losses.py hold the two fused records (attention, the loss and
its LM head); functional.py is the PyTorch-style API over all of them, with its checks. Together
the three files answer "what can the tape record".

Views (reshape, transpose, permute, split, basic slicing) launch no kernel: they move no data.
Shapes in comments: B batch, T sequence, C channels, H heads, D = C / H, V vocabulary, N = B * T
rows.
"""

import itertools
import math

import numpy as np

from . import backend
from .autograd import Function
from .kernels import launch
from .kernels.elementwise.spec import UNARY_OPS


def _xp(a):
    return backend.of(a).xp


def _as(a, dtype):
    """a in dtype: itself when it already is, else one counted cast."""
    return a if a.dtype == dtype else launch("cast", a, dtype)


def _unbroadcast(g, shape, dtype):
    """Sum a gradient back down to the shape of a broadcast input (and to its dtype)."""
    if tuple(g.shape) != tuple(shape):
        lead = g.ndim - len(shape)
        axes = tuple(range(lead)) + tuple(
            i + lead for i, n in enumerate(shape) if n == 1 and g.shape[i + lead] != 1
        )
        g = launch("sum", g, axis=axes, keepdims=True).reshape(shape)
    return _as(g, dtype)


def _meta(x):
    """(shape, dtype) of an array operand, or None for a Python scalar."""
    return (x.shape, x.dtype) if hasattr(x, "shape") else None


# ---------------------------------------------------------------- arithmetic


class Add(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.metas = _meta(a), _meta(b)
        return launch("add", a, b)

    @staticmethod
    def backward(ctx, g):
        return tuple(_unbroadcast(g, *m) if m else None for m in ctx.metas)


class Sub(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.metas = _meta(a), _meta(b)
        return launch("sub", a, b)

    @staticmethod
    def backward(ctx, g):
        ma, mb = ctx.metas
        return (
            _unbroadcast(g, *ma) if ma else None,
            _unbroadcast(launch("neg", g), *mb) if mb else None,
        )


class Mul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        ctx.metas = _meta(a), _meta(b)
        return launch("mul", a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved
        ma, mb = ctx.metas
        wants_a, wants_b = ctx.needs_input_grad  # a constant array operand (a loss scale) gets none
        return (
            _unbroadcast(launch("mul", g, b), *ma) if ma and wants_a else None,
            _unbroadcast(launch("mul", g, a), *mb) if mb and wants_b else None,
        )


class Div(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        ctx.metas = _meta(a), _meta(b)
        return launch("div", a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved
        ma, mb = ctx.metas
        da = _unbroadcast(launch("div", g, b), *ma) if ma else None
        # d(a/b)/db = -a / b^2, in one kernel: b * b in fp16 overflows for |b| >= 256
        db = _unbroadcast(launch("div_bwd", a, b, g), *mb) if mb else None
        return da, db


class Neg(Function):
    @staticmethod
    def forward(ctx, x):
        return launch("neg", x)

    @staticmethod
    def backward(ctx, g):
        return launch("neg", g)


class Unary(Function):
    """One of contract.UNARY_OPS (exp, log, sqrt, rsqrt, tanh, sigmoid, silu, relu): one kernel
    pair for all, op'(x) recomputed from the saved input. _UNARY makes one subclass per op, so
    the tape names the op."""

    op = None

    @classmethod
    def forward(cls, ctx, x):
        ctx.save_for_backward(x)
        return launch("unary_fwd", x, cls.op)

    @classmethod
    def backward(cls, ctx, g):
        (x,) = ctx.saved
        return launch("unary_bwd", x, g, cls.op)


_UNARY = {op: type(op.capitalize(), (Unary,), {"op": op, "name": op}) for op in UNARY_OPS}


def _rows(a):
    """a made C-contiguous for a row kernel: itself when it is, else one counted copy."""
    return a if _stand_in(a).flags.c_contiguous else launch("contiguous", a)


class Softmax(Function):
    """softmax over the last axis (the functional API moves the dim there); saves the output."""

    @staticmethod
    def forward(ctx, x):
        y = launch("softmax_fwd", _rows(x))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        return launch("softmax_bwd", ctx.saved[0], _rows(g))


class LogSoftmax(Function):
    """log_softmax over the last axis; saves the output."""

    @staticmethod
    def forward(ctx, x):
        y = launch("log_softmax_fwd", _rows(x))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        return launch("log_softmax_bwd", ctx.saved[0], _rows(g))


class Amax(Function):
    """The max over axes (normalized, _axes); the gradient is shared evenly by ties, as in
    PyTorch's amax (and max without a dim)."""

    @staticmethod
    def forward(ctx, x, axes, keepdim):
        y = launch("amax", x, axis=axes, keepdims=True)  # reduced axes kept: (..., 1, ...)
        ctx.save_for_backward(x, y)
        ctx.axes = axes
        return y if keepdim else y.reshape([n for i, n in enumerate(x.shape) if i not in axes])

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved
        return launch("amax_bwd", x, y, g.reshape(y.shape), ctx.axes)


class Max(Function):
    """max along one dim (normalized) given idx, its argmax (axis kept, not differentiable): the
    gradient goes to the index, as torch.max(x, dim)."""

    @staticmethod
    def forward(ctx, x, idx, dim, keepdim):
        ctx.save_for_backward(idx)
        ctx.shape, ctx.dim = x.shape, dim
        return launch("amax", x, axis=dim, keepdims=keepdim)

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved
        g = g.reshape(idx.shape)  # the dim kept
        return launch("max_bwd", g, idx, ctx.shape, ctx.dim), None, None, None


class Sum(Function):
    @staticmethod
    def forward(ctx, x, axes, keepdims):  # axes: normalized (_axes)
        ctx.shape, ctx.axis = x.shape, axes
        return launch("sum", x, axis=axes, keepdims=keepdims)

    @staticmethod
    def backward(ctx, g):
        kept = tuple(1 if i in ctx.axis else n for i, n in enumerate(ctx.shape))
        return _xp(g).broadcast_to(g.reshape(kept), ctx.shape)


class Cast(Function):
    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = x.dtype
        return launch("cast", x, dtype)

    @staticmethod
    def backward(ctx, g):
        return launch("cast", g, ctx.dtype)


# ---------------------------------------------------------------- views (no kernels)


def _stand_in(x):
    """A NumPy array with x's (any backend's) shape and strides over one element of memory, for
    NumPy to answer layout questions on (it only computes strides, reads nothing)."""
    return np.lib.stride_tricks.as_strided(np.empty(1, x.dtype), x.shape, x.strides)


def _can_view(x, shape):
    """Whether x (either backend) can take shape without a copy: always when contiguous, and
    e.g. when splitting the last dimension of a column slice. NumPy decides, on a stand-in
    (a NumPy or CuPy array that says it is contiguous needs none)."""
    flags = getattr(x, "flags", None)  # a meta array has none: its stand-in answers
    if flags is not None and flags.c_contiguous:
        return True
    try:
        np.reshape(_stand_in(x), shape, copy=False)
        return True
    except ValueError:
        return False


def _reshape(x, shape):
    """A view when the strides allow one, else an explicit, counted copy first."""
    return (x if _can_view(x, shape) else launch("contiguous", x)).reshape(shape)


def _matrix(a):
    """a (..., K) as (M, K), M the product of the leading dims: a view when the strides allow
    (-1 would be ambiguous for K = 0)."""
    return _reshape(a, (math.prod(a.shape[:-1]), a.shape[-1]))


class Reshape(Function):
    @staticmethod
    def forward(ctx, x, shape, copy):
        if not (copy or _can_view(x, shape)):  # PyTorch's view never copies
            raise RuntimeError(
                f"view{shape} of a tensor of shape {x.shape} with strides "
                f"{x.strides} is impossible without a copy: use reshape()"
            )
        ctx.shape = x.shape
        return _reshape(x, shape)

    @staticmethod
    def backward(ctx, g):
        return _reshape(g, ctx.shape)


class Permute(Function):
    @staticmethod
    def forward(ctx, x, dims):
        ctx.inverse = tuple(sorted(range(len(dims)), key=dims.__getitem__))
        return x.transpose(dims)

    @staticmethod
    def backward(ctx, g):
        return g.transpose(ctx.inverse)


class GetItem(Function):
    @staticmethod
    def forward(ctx, x, index):
        ctx.shape, ctx.index = x.shape, index
        return x[index]

    @staticmethod
    def backward(ctx, g):
        return launch("index_bwd", g, ctx.shape, ctx.index)


class Split(Function):
    @staticmethod
    def forward(ctx, x, sizes, axis):
        ctx.axis = axis
        lead, bounds = (slice(None),) * axis, itertools.accumulate(sizes, initial=0)
        return tuple(x[lead + (slice(lo, lo + n),)] for lo, n in zip(bounds, sizes))

    @staticmethod
    def backward(ctx, *grads):
        return launch("concat", list(grads), ctx.axis)


class Concat(Function):
    @staticmethod
    def forward(ctx, *arrays, axis):
        ctx.axis, ctx.bounds = axis, np.cumsum([a.shape[axis] for a in arrays])[:-1]
        return launch("concat", list(arrays), axis)

    @staticmethod
    def backward(ctx, g):
        return tuple(_xp(g).split(g, ctx.bounds, axis=ctx.axis))


# ---------------------------------------------------------------- GEMMs


class MatMul(Function):
    """a (..., M, K) @ b (..., K, N) with equal batch dims, or either side 2-D."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        if b.ndim == 2 and a.ndim > 2:  # fold the batch into M: one 2-D GEMM
            y = launch("matmul", _matrix(a), b)
            return y.reshape(*a.shape[:-1], b.shape[-1])
        return launch("matmul", a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved
        if b.ndim == 2 and a.ndim > 2:
            g2, a2 = _matrix(g), _matrix(a)
            return launch("matmul_nt", g2, b).reshape(a.shape), launch("matmul_tn", a2, g2)
        da = launch("matmul_nt", g, b)  # dA = dY B^T
        db = launch("matmul_tn", a, g)  # dB = A^T dY
        if a.ndim == 2 and b.ndim > 2:  # a was shared across the batch: sum its gradients
            da = launch("sum", da, axis=tuple(range(da.ndim - 2)))
        return da, db


class Linear(Function):
    """y = x W + b with W stored (in, out) as in GPT-2's checkpoints, or (out, in) when
    transposed (the tied LM head, logits = x wte^T). The three GEMMs of a linear layer, each
    2*M*K*N FLOPs: forward x W, backward dx = dy W^T and dW = x^T dy."""

    @staticmethod
    def forward(ctx, x, weight, bias=None, transposed=False):
        x2 = _matrix(x)  # (M, K), M = B*T
        ctx.save_for_backward(x2, weight)
        ctx.x_shape, ctx.has_bias, ctx.transposed = x.shape, bias is not None, transposed
        if transposed:  # (M, K) @ (N, K)^T
            y = (
                launch("matmul_nt", x2, weight)
                if bias is None
                else launch("add", launch("matmul_nt", x2, weight), bias)
            )
        else:  # (M, K) @ (K, N) + b
            y = launch("matmul", x2, weight, bias=bias)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, g):
        x2, weight = ctx.saved
        g2 = _matrix(g)  # (M, N)
        if ctx.transposed:
            dx = launch("matmul", g2, weight)  # (M, N) @ (N, K)
            dweight = launch("matmul_tn", g2, x2)  # (M, N)^T @ (M, K) -> (N, K)
        else:
            dx = launch("matmul_nt", g2, weight)  # (M, N) @ (K, N)^T
            dweight = launch("matmul_tn", x2, g2)  # (M, K)^T @ (M, N) -> (K, N)
        dbias = launch("sum", g2, axis=0) if ctx.has_bias else None
        return dx.reshape(ctx.x_shape), dweight, dbias


# ---------------------------------------------------------------- GPT-2's layers


class Embedding(Function):
    @staticmethod
    def forward(ctx, weight, idx):
        ctx.save_for_backward(idx)
        ctx.num_embeddings = weight.shape[0]
        return launch("embedding_fwd", weight, idx)  # (..., C)

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved
        return launch("embedding_bwd", g, idx, ctx.num_embeddings), None


class GELU(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return launch("gelu_fwd", x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved
        return launch("gelu_bwd", x, g)


class LayerNorm(Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = launch("layernorm_fwd", x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)  # mean, rstd: (...,) fp32
        return y

    @staticmethod
    def backward(ctx, g):
        return launch("layernorm_bwd", g, *ctx.saved)


class RMSNorm(Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        y, rstd = launch("rmsnorm_fwd", x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)  # rstd: (...,) fp32
        return y

    @staticmethod
    def backward(ctx, g):
        return launch("rmsnorm_bwd", g, *ctx.saved)


class Dropout(Function):
    @staticmethod
    def forward(ctx, x, p, seed):
        y, mask = launch("dropout_fwd", x, p, seed)
        ctx.save_for_backward(mask)
        return y

    @staticmethod
    def backward(ctx, g):
        return launch("mul", g, ctx.saved[0]), None, None


class Rotary(Function):
    """Rotary position embeddings of x (B, H, T, D) (Llama's rotate-half convention) by the
    tables cos, sin (T, D/2) of its positions. Saves nothing of x: the backward is the
    opposite turn of dy. The tables are the model's constants (like a weight, not an
    activation), kept on the context rather than saved."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.cos, ctx.sin = cos, sin
        return launch("rotary_fwd", x, cos, sin)

    @staticmethod
    def backward(ctx, g):
        return launch("rotary_bwd", g, ctx.cos, ctx.sin), None, None


class SwiGLU(Function):
    """silu(gate) * up, Llama's MLP nonlinearity, one record: saves gate and up."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return launch("swiglu_fwd", gate, up)

    @staticmethod
    def backward(ctx, g):
        return launch("swiglu_bwd", *ctx.saved, g)  # dgate, dup
