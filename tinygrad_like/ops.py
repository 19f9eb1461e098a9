"""The differentiable ops GPT-2 needs: one Function (forward + backward) each, then the
functional API (PyTorch's names) that the Tensor methods and nn/ call.

Every array operation goes through kernels.launch(name, ...), so each op's FLOPs and bytes are
counted where they happen. Views (reshape, transpose, permute, split, basic slicing) launch no
kernel: they move no data. Shapes in comments: B batch, T sequence, C channels, H heads,
D = C / H, V vocabulary, N = B * T rows.

Over 500 lines on purpose: it is the whole list of differentiable ops, each forward beside its
backward (tinygrad's mlops.py), so that one file answers "what can the tape record".
"""

import builtins  # `sum` and `max` below are ops
import itertools
import math
from collections import namedtuple

import numpy as np

from . import backend, dtypes, profiler, rng
from .autograd import Function, is_grad_enabled
from .backend.contract import UNARY_OPS
from .kernels import launch
from .quant import QuantizedWeight
from .rng import get_rng_state, manual_seed, set_rng_state  # noqa: F401 (F.manual_seed, ...)
from .tensor import Tensor


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
        return (
            _unbroadcast(launch("mul", g, b), *ma) if ma else None,
            _unbroadcast(launch("mul", g, a), *mb) if mb else None,
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


def _attention_inputs(ctx, q, k, v):
    """q (..., H, Tq, D), k and v (..., Hkv, Tk, D), as scaled_dot_product_attention checked
    them -> q (B, H, Tq, D), k and v (B, Hkv, Tk, D), the shapes the kernels take: missing dims
    read as 1, the leading dims (ctx.lead) merged into B. An operand broadcast along a leading
    dim, or a q of one head against several kv heads, is copied out to its full shape (one
    counted copy; _attention_grads sums its gradient back). Kv heads are never repeated: H is a
    multiple of Hkv, the grouped-query attention the kernels run. The (B, H, T, D) views a
    model passes go through as they are."""
    ctx.metas = _meta(q), _meta(k), _meta(v)
    n = builtins.max(q.ndim, k.ndim, v.ndim, 3)
    q, k, v = (a.reshape((1,) * (n - a.ndim) + a.shape) for a in (q, k, v))
    leads = q.shape[:-3], k.shape[:-3], v.shape[:-3]
    ctx.lead = leads[0] if leads[0] == leads[1] == leads[2] else np.broadcast_shapes(*leads)
    Hkv = builtins.max(k.shape[-3], v.shape[-3])
    H = Hkv if q.shape[-3] == 1 else q.shape[-3]  # one head broadcast, or a multiple of Hkv

    def full(a, heads):
        shape = ctx.lead + (heads,) + a.shape[-2:]
        if a.shape != shape:  # dst[...] = a broadcasts; counted as a read of a, a write of dst
            a = launch("copy", backend.of(a).empty(shape, a.dtype), a)
        batched = (math.prod(ctx.lead), heads) + a.shape[-2:]
        return a if a.shape == batched else _reshape(a, batched)

    q, k, v = full(q, H), full(k, Hkv), full(v, Hkv)
    ctx.shapes = q.shape, k.shape, v.shape
    ctx.out_shape = (ctx.lead + q.shape[1:])[-builtins.max(len(m[0]) for m in ctx.metas) :]
    return q, k, v


def _attention_out(ctx, out):
    """out (B, H, Tq, D) -> in the inputs' leading dims (*lead, H, Tq, D)."""
    return out if out.shape == ctx.out_shape else out.reshape(ctx.out_shape)


def _attention_grads(ctx, *grads):
    """dq, dk, dv (in any shape holding _attention_inputs' (B, heads, T, D)) -> each in its
    operand's shape and dtype, summed over the dims the operand was broadcast along."""
    result = []
    for g, full, (shape, dtype) in zip(grads, ctx.shapes, ctx.metas):
        broadcast = g.size != math.prod(shape)
        result.append(
            _unbroadcast(_reshape(g, ctx.lead + full[1:] if broadcast else shape), shape, dtype)
        )
    return tuple(result)


class Attention(Function):
    """Causal scaled-dot-product attention, fused into one tape record: q (B, H, Tq, D), k and v
    (B, Hkv, Tk, D) (see _attention_inputs for other shapes), Tk >= Tq (Tk > Tq when decoding
    with a KV cache). Grouped-query attention: kv head j serves the G = H / Hkv query heads
    j G ... j G + G - 1, whose queries, one head after another, are the (G Tq) rows of one GEMM
    against it (no repeated k, v; the backward's dk and dv sum over the group inside their
    GEMMs). Saves q, k, v and the probabilities (B, H, Tq, Tk). Masked scores are computed, not
    skipped: forward 4*Tq*Tk*D FLOPs per query head, backward twice that, whatever Hkv."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        q, k, v = _attention_inputs(ctx, q, k, v)
        (B, H, Tq, D), (Hkv, Tk) = q.shape, k.shape[1:3]
        ctx.scale, ctx.heads = scale, (B, H, Tq, Tk)
        # (B, Hkv, G Tq, D): a view of a contiguous q; a counted copy when G > 1 of a transposed
        # one ((B, T, H, D) -> (B, H, T, D), as models make them)
        qg = _reshape(q, (B, Hkv, (H // Hkv if Hkv else 1) * Tq, D))
        scores = launch("matmul_nt", qg, k)  # (B, Hkv, G Tq, Tk)
        probs = launch("softmax_causal_fwd", scores.reshape(ctx.heads), scale)  # (B, H, Tq, Tk)
        probs = probs.reshape(scores.shape)
        ctx.save_for_backward(qg, k, v, probs)
        return _attention_out(ctx, launch("matmul", probs, v).reshape(q.shape))

    @staticmethod
    def backward(ctx, g):
        qg, k, v, probs = ctx.saved
        g = _reshape(g, qg.shape)  # (B, Hkv, G Tq, D), a copy as q's when G > 1
        dprobs = launch("matmul_nt", g, v)  # (B, Hkv, G Tq, Tk)
        dv = launch("matmul_tn", probs, g)  # (B, Hkv, Tk, D), summed over the group
        dscores = launch(
            "softmax_causal_bwd", probs.reshape(ctx.heads), dprobs.reshape(ctx.heads), ctx.scale
        ).reshape(probs.shape)
        dq = launch("matmul", dscores, k)  # (B, Hkv, G Tq, D)
        dk = launch("matmul_tn", dscores, qg)  # (B, Hkv, Tk, D), summed over the group
        return _attention_grads(ctx, dq, dk, dv) + (None,)


class FlashAttention(Function):
    """Attention's function in blocks (FlashAttention-2): q (B, H, Tq, D), k and v
    (B, Hkv, Tk, D), Tk >= Tq, grouped-query as Attention (the kernels read kv head h // G for
    query head h). The (Tq, Tk) scores never exist beyond one block pair; the record saves q, k,
    v, the output and one log-sum-exp per query (B, H, Tq) fp32, from which the backward
    recomputes each block's probabilities: O(T·D) bytes per head, not O(T²). The key blocks past
    each query block are skipped (FLOPs: contract.flash_scores)."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        q, k, v = _attention_inputs(ctx, q, k, v)
        ctx.scale = scale
        out, lse = launch("flash_attention_fwd", q, k, v, scale)  # (B, H, Tq, D), (B, H, Tq)
        ctx.save_for_backward(q, k, v, out, lse)
        return _attention_out(ctx, out)

    @staticmethod
    def backward(ctx, g):
        g = _reshape(g, ctx.shapes[0])  # (B, H, Tq, D)
        dq, dk, dv = launch("flash_attention_bwd", *ctx.saved, g, ctx.scale)
        return _attention_grads(ctx, dq, dk, dv) + (None,)


class CrossEntropy(Function):
    """Mean cross-entropy of logits (N, Vp) against targets (N,), -1 ignored -> fp32 scalar,
    over the first V = n_classes columns (Vp > V: the LM head's padded vocabulary; the padded
    columns take no probability and get dlogits 0). Saves the logits and each row's
    log-sum-exp (N,); backward makes dlogits in one pass with the upstream gradient (and so the
    fp16 loss scale) folded in before rounding."""

    @staticmethod
    def forward(ctx, logits, targets, count, n_classes):
        losses, lse = launch("cross_entropy_fwd", logits, targets, n_classes=n_classes)
        ctx.save_for_backward(logits, lse, targets)
        ctx.count, ctx.n_classes = count, n_classes
        return launch("mul", launch("sum", losses), 1.0 / count)

    @staticmethod
    def backward(ctx, g):
        logits, lse, targets = ctx.saved
        dloss = launch("mul", g, 1.0 / ctx.count)  # (,) fp32, stays on the device
        dlogits = launch("cross_entropy_bwd", logits, lse, targets, dloss, n_classes=ctx.n_classes)
        return dlogits, None, None, None


# The fused LM head works through x (N, C) in blocks of this many rows. A block's logits and
# dlogits (rows, Vp) are the head's largest temporaries: 2 x 51.5 MB in fp32 at Vp = 50,304
# (one buffer in the precompute design, whose dlogits overwrite the logits), where the plain
# head holds the whole batch's (2 x 205.9 MB at B = 8, T = 128). Each block
# also costs one pass over dW (Vp, C) to accumulate it, and thinner GEMMs: 512 rows step 2%
# slower than the plain head on the CPU but save only 155 MB of peak; 256 rows save 258 MB
# (more than the logits) for 7%. A block small enough for a core's L2 (4 MB: 20 rows) would
# multiply both costs.
HEAD_BLOCK_ROWS = 256
HEAD_DESIGNS = ("recompute", "precompute")  # see LinearCrossEntropy


def _row_blocks(n):
    """Slices of HEAD_BLOCK_ROWS rows that cover [0, n); the last one may be shorter."""
    return [slice(lo, min(lo + HEAD_BLOCK_ROWS, n)) for lo in range(0, n, HEAD_BLOCK_ROWS)]


def _block_grads(x, weight, rows, dlogits, dx, dw):
    """One block's share of the head's gradients from its dlogits (rows, Vp): writes the block's
    rows of dX (N, C) = dlogits wte and returns dW (Vp, C) += dlogits^T x[rows], summed in the
    compute dtype (the first block's, dw None, starts the sum)."""
    launch("copy", dx[rows], launch("matmul", dlogits, weight))  # (rows, C)
    dw_rows = launch("matmul_tn", dlogits, x[rows])  # (Vp, C)
    if dw is None:
        return _as(dw_rows, dtypes.compute_dtype(dw_rows.dtype))
    return launch("add", dw, dw_rows, out=dw)


def _precomputed_block(x, weight, rows, targets, unit, n_classes, dx, dw):
    """The precompute design's work on one block -> (its losses, dW so far): its logits in fp32,
    overwritten in place by their dlogits for dloss = unit (one pass, one exp per logit; the
    loss needs no lse), then its dX rows and dW share. Its own function so that the block's
    (rows, Vp) buffer is freed before the next block's logits exist."""
    acc = dtypes.compute_dtype(x.dtype)
    logits = _as(launch("matmul_nt", x[rows], weight), acc)  # (rows, Vp)
    losses, dlogits = launch(
        "cross_entropy_fwd_bwd", logits, targets[rows], unit, n_classes=n_classes, out=logits
    )
    with profiler.math("backward"):
        return losses, _block_grads(x, weight, rows, dlogits, dx, dw)


def _recomputed_block(x, weight, rows, lse, targets, dloss, n_classes, dx, dw):
    """The recompute design's backward on one block -> dW so far: its logits again (forward
    math), their dlogits from the saved lse (N,) with dloss folded in before rounding, then its
    dX rows and dW share."""
    with profiler.math("forward"):
        logits = launch("matmul_nt", x[rows], weight)  # (rows, Vp)
    dlogits = launch(
        "cross_entropy_bwd", logits, lse[rows], targets[rows], dloss, n_classes=n_classes
    )
    return _block_grads(x, weight, rows, dlogits, dx, dw)


class LinearCrossEntropy(Function):
    """The tied LM head and the mean cross-entropy in one record: x (N, C), weight (Vp, C),
    targets (N,), -1 ignored -> fp32 scalar, the loss of Linear(transposed) + CrossEntropy over
    the first n_classes columns, with the same kernels. It works through blocks of
    HEAD_BLOCK_ROWS rows; a block's logits x[rows] wte^T (rows, Vp) are reduced to its losses
    (and what the design keeps) and dropped, so the logits of the whole batch never exist. Two
    designs:
    - "recompute" saves x, the lse (N,) and the targets. The backward recomputes each block's
      logits (one more head GEMM, +2*C*Vp FLOPs per token, labeled forward math), then makes
      dlogits with the upstream gradient (and the fp16 loss scale) folded in before rounding,
      as CrossEntropy does, and the block's dX and dW GEMMs. dW accumulates over the blocks in
      fp32 (the compute dtype) and is rounded once, as the plain head's one GEMM is.
    - "precompute" forms the gradients for a unit upstream gradient in the forward, in fp32:
      dX (N, C) and dW (Vp, C), which it saves (4*(N + Vp)*C bytes) instead of x. A block's
      losses and dlogits come from one kernel (cross_entropy_fwd_bwd: one exp per logit, the
      dlogits written over the logits, labeled forward math as the loss is). The backward
      multiplies them by the upstream gradient and rounds once, so the fp16 loss scale still
      never flushes a small gradient. No extra FLOPs, but the head's two backward GEMMs run in
      the forward phase (labeled backward math)."""

    @staticmethod
    def forward(ctx, x, weight, targets, count, n_classes, design):
        ctx.count, ctx.n_classes, ctx.design = count, n_classes, design
        precompute = design == "precompute"
        if precompute:  # dlogits and both gradients in fp32, for dloss = 1 / count
            acc = dtypes.compute_dtype(x.dtype)
            dx, dw = backend.of(x).empty(x.shape, acc), None
            unit = launch("fill", backend.of(x).empty((1,), acc), 1.0 / count)
            ctx.dtypes = x.dtype, weight.dtype
        losses, lses = [], []
        for rows in _row_blocks(x.shape[0]):
            if precompute:
                loss, dw = _precomputed_block(x, weight, rows, targets, unit, n_classes, dx, dw)
            else:
                logits = launch("matmul_nt", x[rows], weight)  # (rows, Vp)
                loss, lse = launch("cross_entropy_fwd", logits, targets[rows], n_classes=n_classes)
                lses.append(lse)
            losses.append(loss)
        if precompute:
            ctx.save_for_backward(dx, dw)
        else:
            ctx.save_for_backward(x, weight, launch("concat", lses, 0), targets)
        return launch("mul", launch("sum", launch("concat", losses, 0)), 1.0 / count)

    @staticmethod
    def backward(ctx, g):
        if ctx.design == "precompute":  # scale by the upstream gradient (in place: the
            dx, dw = (
                _as(launch("mul", grad, g, out=grad), dtype)  # record frees them next),
                for grad, dtype in zip(ctx.saved, ctx.dtypes)
            )  # then round once
            return dx, dw, None, None, None, None
        x, weight, lse, targets = ctx.saved
        dloss = launch("mul", g, 1.0 / ctx.count)  # (,) fp32, stays on the device
        dx, dw = backend.of(x).empty(x.shape, x.dtype), None
        for rows in _row_blocks(x.shape[0]):
            dw = _recomputed_block(x, weight, rows, lse, targets, dloss, ctx.n_classes, dx, dw)
        return dx, _as(dw, weight.dtype), None, None, None, None


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


# ---------------------------------------------------------------- the functional API


def _operand(x, like):
    """Tensors and Python scalars pass through; other array-likes become constant Tensors."""
    if isinstance(x, np.generic):  # a NumPy scalar acts like the Python number it holds
        return x.item()
    if isinstance(x, (Tensor, int, float)):
        return x
    return Tensor(x, device=like.device)


def _binary(fn, a, b):
    like = a if isinstance(a, Tensor) else b
    return fn.apply(_operand(a, like), _operand(b, like))


def add(a, b):
    return _binary(Add, a, b)


def sub(a, b):
    return _binary(Sub, a, b)


def mul(a, b):
    return _binary(Mul, a, b)


def div(a, b):
    return _binary(Div, a, b)


def neg(x):
    return Neg.apply(x)


def cast(x, dtype):
    return Cast.apply(x, dtypes.as_dtype(dtype))


def reshape(x, shape):
    return Reshape.apply(x, shape, True)


def view(x, shape):
    return Reshape.apply(x, shape, False)


# ---- dims, as PyTorch takes them


def _dim(dim, ndim):
    """dim in [-ndim, ndim - 1] wrapped into [0, ndim), as PyTorch (a 0-d tensor takes -1 and
    0 as if it had one dim); anything else is an IndexError in PyTorch's words."""
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"dim must be an int, got {dim!r}")
    n = builtins.max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})"
        )
    return int(dim) % n


def _dims(dims, ndim):
    """Each of dims normalized (_dim), none repeated."""
    out = [_dim(d, ndim) for d in dims]
    for d in out:
        if out.count(d) > 1:
            raise ValueError(f"dim {d} appears multiple times in the list of dims {tuple(dims)}")
    return tuple(out)


def _axes(dim, ndim):
    """The axes a reduction over dim covers: every axis for None or () (PyTorch's meaning;
    NumPy's () reduces none), else the dims normalized (_dims). A 0-d tensor's dim 0 or -1
    covers no axis."""
    if dim is None or (isinstance(dim, (tuple, list)) and not dim):
        return tuple(range(ndim))
    return tuple(
        d for d in _dims(dim if isinstance(dim, (tuple, list)) else (dim,), ndim) if d < ndim
    )


def _reduction(dim, keepdim, axis, keepdims):
    """PyTorch's (dim, keepdim), also given as NumPy's (axis, keepdims), the names sum and mean
    took first."""
    if axis is not None:
        if dim is not None:
            raise TypeError("give dim or axis, not both")
        dim = axis
    return dim, keepdim if keepdims is None else keepdims


def permute(x, dims):
    """torch.permute: the dims reordered (a view); dims lists each dim once."""
    dims = tuple(dims)
    if len(dims) != x.ndim:
        raise ValueError(f"permute: {len(dims)} dims {dims} for a tensor of shape {x.shape}")
    return Permute.apply(x, _dims(dims, x.ndim))


def sum(x, dim=None, keepdim=False, *, axis=None, keepdims=None):
    """torch.sum: over dim (an int or a tuple; None or () sums everything)."""
    dim, keepdim = _reduction(dim, keepdim, axis, keepdims)
    return Sum.apply(x, _axes(dim, x.ndim), keepdim)


def mean(x, dim=None, keepdim=False, *, axis=None, keepdims=None):
    """torch.mean: over dim (an int or a tuple; None or () averages everything); nan over no
    elements, as PyTorch."""
    dim, keepdim = _reduction(dim, keepdim, axis, keepdims)
    axes = _axes(dim, x.ndim)
    n = math.prod(x.shape[a] for a in axes)
    return mul(Sum.apply(x, axes, keepdim), 1.0 / n if n else math.nan)


def var(x, dim=None, correction=1, keepdim=False):
    """torch.var: sum((x - mean)^2) / max(0, n - correction) over dim (None or (): all), by
    default unbiased (correction=1). A composite of mean, sub, mul and sum, each launch
    counted. With n - correction <= 0 it divides by zero as PyTorch does: inf, or nan where the
    sum is 0 (one element)."""
    axes = _axes(dim, x.ndim)
    d = sub(x, mean(x, axes, keepdim=True))
    s = Sum.apply(mul(d, d), axes, keepdim)
    dof = builtins.max(0, math.prod(x.shape[a] for a in axes) - correction)
    return mul(s, 1.0 / dof if dof else math.inf)


def transpose(x, dim0=-2, dim1=-1):
    """Swap dims dim0 and dim1 (a view). The defaults, the last two dims, are this API's
    (PyTorch's transpose names both)."""
    dim0, dim1 = _dim(dim0, x.ndim), _dim(dim1, x.ndim)
    dims = list(range(x.ndim))
    if x.ndim:
        dims[dim0], dims[dim1] = dims[dim1], dims[dim0]
    return Permute.apply(x, tuple(dims))  # a permutation by construction: permute's checks pass


def getitem(x, index):
    """x[index] for a basic index: ints, slices, None and ... only (a view; its gradient writes
    dy back). Unlike PyTorch, no indexing by tensors, lists or booleans: gather rows with
    embedding()."""
    items = index if isinstance(index, tuple) else (index,)
    if not all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items):
        raise TypeError(
            f"indexing with {index!r}: only ints, slices, None and ... are "
            "supported (views); use embedding() to gather rows by id"
        )
    return GetItem.apply(x, index)


def split(x, split_size, dim=-1):
    """Like torch.split: chunks of split_size (an int) or of the listed sizes along dim. The
    default dim is the last (this API's; PyTorch's is 0)."""
    if x.ndim == 0:
        raise ValueError("split: a 0-d tensor has no dim to split")
    dim = _dim(dim, x.ndim)
    if isinstance(split_size, int) and split_size <= 0:
        raise ValueError(f"split: split_size must be a positive int, got {split_size}")
    n = x.shape[dim]
    sizes = (
        [split_size] * (n // split_size) + ([n % split_size] if n % split_size else [])
        if isinstance(split_size, int)
        else list(split_size)
    )
    if np.sum(sizes) != n or any(k < 0 for k in sizes):
        raise ValueError(f"split: sizes {sizes} do not add up to dimension {dim} of size {n}")
    return Split.apply(x, sizes, dim)


def cat(tensors, dim=0):
    """torch.cat: tensors of one ndim (at least 1), equal but in dim, joined along dim."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat: expected a non-empty list of tensors")
    for i, t in enumerate(tensors):
        if t.ndim == 0:
            raise ValueError(
                f"cat: zero-dimensional tensor (at position {i}) cannot be concatenated"
            )
        if t.ndim != tensors[0].ndim or any(
            n != m
            for k, (n, m) in enumerate(zip(t.shape, tensors[0].shape))
            if k != _dim(dim, t.ndim)
        ):
            raise ValueError(
                f"cat: tensor {i} of shape {t.shape} does not match tensor 0 of shape "
                f"{tensors[0].shape} outside dim {dim}"
            )
    return Concat.apply(*tensors, axis=_dim(dim, tensors[0].ndim))


def matmul(a, b):
    """a (..., M, K) @ b (..., K, N). Unlike torch.matmul, both operands need 2 dims or more
    (no 1-D vector forms) and batch dims must be equal, or one side 2-D (no broadcasting of
    batch dims)."""
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"matmul: {a.shape} @ {b.shape}: both operands need at least 2 dims")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"matmul: {a.shape} @ {b.shape}: inner dimensions "
            f"{a.shape[-1]} and {b.shape[-2]} differ"
        )
    if a.ndim > 2 and b.ndim > 2 and a.shape[:-2] != b.shape[:-2]:
        raise ValueError(
            f"matmul: {a.shape} @ {b.shape}: batch dimensions "
            f"{a.shape[:-2]} and {b.shape[:-2]} differ (no batch broadcasting)"
        )
    return MatMul.apply(a, b)


def linear(x, weight, bias=None, transposed=False):
    """x (..., in) @ weight (in, out) + bias (out,): GPT-2's (in, out) layout. With
    transposed=True the weight is (out, in), as PyTorch's nn.Linear and the tied LM head.
    weight may be a QuantizedWeight (inference only): then its out_axis must say the same
    layout (0 for transposed=True, 1 otherwise), and qmatmul decodes it in the kernel."""
    k = weight.shape[1] if transposed else weight.shape[0]
    if x.shape[-1] != k:
        raise ValueError(
            f"linear: input {x.shape} @ weight {weight.shape}"
            f"{'^T' if transposed else ''}: inner dimensions {x.shape[-1]} and "
            f"{k} differ"
        )
    if isinstance(weight, QuantizedWeight):
        return _quantized_linear(x, weight, bias, transposed)
    return Linear.apply(x, weight, bias, transposed)


def _inference_only(what, *tensors):
    """A RuntimeError when the tape would record an op on a quantized weight: it has no
    gradient (and its kernels no backward)."""
    if is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in tensors):
        raise RuntimeError(
            f"{what} with a quantized weight is inference only: run it under no_grad() "
            "(quantized weights hold no gradient)"
        )


def _quantized_linear(x, weight, bias, transposed):
    """y (..., N) = x (..., K) W^T + bias, W (N, K) the quantized weight's rows: one qmatmul
    over x flattened to (M, K)."""
    if weight.out_axis != (0 if transposed else 1):
        raise ValueError(
            f"linear: a quantized weight stored with out_axis {weight.out_axis} used as "
            f"{'(out, in)' if transposed else '(in, out)'}: quantize it with out_axis "
            f"{0 if transposed else 1}"
        )
    _inference_only("linear", x, bias)
    x2 = _matrix(x.data)
    y = launch(
        "qmatmul",
        x2,
        weight.codes,
        weight.scales,
        weight.fmt,
        weight.group_size,
        bias=None if bias is None else bias.data,
    )
    return Tensor(y.reshape(*x.shape[:-1], y.shape[-1]))


def embedding(idx, weight, num_embeddings=None):
    """idx (...) int token ids -> weight rows (..., C). Ids must be < num_embeddings: all of
    weight's rows by default, fewer when the rows past it are padding."""
    if weight.ndim != 2:
        raise ValueError(
            f"embedding: weight must be (num_embeddings, embedding_dim), got shape {weight.shape}"
        )
    quantized = isinstance(weight, QuantizedWeight)
    if quantized and weight.out_axis != 0:
        raise ValueError("embedding: a quantized table must be stored by rows (out_axis 0)")
    n = weight.shape[0] if num_embeddings is None else num_embeddings
    ids = idx.data if isinstance(idx, Tensor) else idx
    # host ids (lists too): check, then move; device ids as they are (meta's: no values)
    if backend.holds_values(ids) and not hasattr(ids, "__cuda_array_interface__"):
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"embedding: ids must be integers, got {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            bad = int(ids.max() if ids.max() >= n else ids.min())
            raise ValueError(f"token id {bad} out of range for vocab {n}")
        ids = backend.get(weight.device).asarray(ids)
    if quantized:  # only the gathered rows decoded; no gradient to the table
        args = weight.codes, weight.scales, ids, weight.fmt, weight.group_size
        return Tensor(launch("qembedding", *args))
    return Embedding.apply(weight, ids)


def gelu(x):
    """GELU, always the tanh approximation (GPT-2's): PyTorch's gelu(x, approximate="tanh").
    PyTorch's default is the exact erf form."""
    return GELU.apply(x)


def layer_norm(x, weight, bias, eps=1e-5):
    """Layer norm over the last dim only, with a weight and a bias of (C,): PyTorch's
    layer_norm(x, (C,), weight, bias, eps). No normalized_shape of several dims."""
    C = x.shape[-1] if x.ndim else None
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None or p.shape != (C,):
            got = None if p is None else p.shape
            raise ValueError(
                f"layer_norm: input {x.shape} has {C} features, {name} has shape {got}: "
                f"need a {name} of ({C},)"
            )
    return LayerNorm.apply(x, weight, bias, eps)


def rms_norm(x, weight, eps=1e-6):
    """x / sqrt(mean(x^2 over the last axis) + eps) * weight: Llama's RMSNorm (PyTorch's
    rms_norm over the last dim, with a weight)."""
    if weight.ndim != 1 or x.shape[-1] != weight.shape[0]:
        raise ValueError(
            f"rms_norm: input {x.shape} has {x.shape[-1]} features, weight has shape "
            f"{weight.shape}: need a weight of ({x.shape[-1]},)"
        )
    return RMSNorm.apply(x, weight, eps)


def scaled_dot_product_attention(q, k, v, flash=False, scale=None):
    """Causal attention softmax(scale q k^T, future keys masked) v of q (..., H, Tq, D) and k, v
    (..., Hkv, Tk, D), Tk >= Tq -> (..., H, Tq, D); scale defaults to 1 / sqrt(D). Grouped-query
    attention when Hkv < H (a divisor of it; Hkv = 1 is multi-query attention): kv head j
    serves query heads j G ... j G + G - 1, G = H / Hkv (Hugging Face's repeat_kv order),
    without copying k and v G times. The leading dims broadcast (NumPy's rules), and so does a
    q of one head against several kv heads. flash=True runs it in blocks (FlashAttention),
    saving one number per query instead of the probabilities.
    As torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
    enable_gqa=True) when Tq = Tk; by design it differs in that it is
    - always causal, and has no attn_mask and no dropout_p;
    - aligned bottom-right when there are fewer queries than keys: query i is at position
      Tk - Tq + i and sees keys 0 ... Tk - Tq + i (a KV-cache decode step), where PyTorch's
      is_causal aligns the mask top-left (query i sees keys 0 ... i);
    - grouped-query whenever Hkv divides H, as PyTorch's only with enable_gqa=True."""
    shapes = f"attention: q {q.shape}, k {k.shape}, v {v.shape}"
    if min(q.ndim, k.ndim, v.ndim) < 2:
        raise ValueError(f"{shapes}: need q (..., Tq, D) and k, v (..., Tk, D)")
    if q.dtype != k.dtype or k.dtype != v.dtype:
        raise TypeError(f"{shapes}: need one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    H, Hk, Hv = (a.shape[-3] if a.ndim > 2 else 1 for a in (q, k, v))
    Hkv = builtins.max(Hk, Hv)
    try:
        if q.shape[:-3] != k.shape[:-3] or k.shape[:-2] != v.shape[:-2]:  # else none broadcast
            np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
            np.broadcast_shapes(k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(
            f"{shapes}: need leading dims (and k's and v's heads) that broadcast"
        ) from None
    for bad, need in [
        (q.shape[-1] != k.shape[-1], "equal head dims D"),
        (k.shape[-2:] != v.shape[-2:], "k and v of one (Tk, D)"),
        (k.shape[-2] < q.shape[-2], "at least as many keys as queries"),
        (
            H != 1 and (H % Hkv if Hkv else H),
            f"q's {H} heads a multiple of k and v's {Hkv} (grouped-query attention), or 1",
        ),
    ]:
        if bad:
            raise ValueError(f"{shapes}: need {need}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return (FlashAttention if flash else Attention).apply(q, k, v, scale)


def _class_targets(fn, what, targets, N, Vp, n_classes, ignore_index, like):
    """Check the targets of a cross-entropy over the first n_classes of Vp columns for N rows
    (what: the operand that has them, for the messages) -> (targets (N,) int64 on like's
    device with ignore_index as -1, the count of the others, V = n_classes or Vp). The meta
    device's targets have a shape only: none is taken as ignored."""
    t = targets.numpy() if isinstance(targets, Tensor) else targets
    meta = not backend.holds_values(t)  # the meta device's targets: a shape, no ids
    t = t if meta else np.asarray(t)
    V = Vp if n_classes is None else n_classes
    if not 0 < V <= Vp:
        raise ValueError(f"{fn}: n_classes {V} must be in [1, {Vp}] for {what}")
    if t.shape != (N,):
        raise ValueError(f"{fn}: {what} need targets of shape ({N},), got {t.shape}")
    if t.dtype.kind not in "iu":
        raise TypeError(f"{fn}: targets must be integer class ids, got {t.dtype}")
    if meta:  # a fresh int64 (N,) array, as np.where below makes
        return backend.of(t).empty((N,), np.int64), N, V
    ignored = t == ignore_index
    bad = t[~ignored & ((t < 0) | (t >= V))]  # -1 is a class id like any other unless ignored
    if bad.size:
        raise ValueError(
            f"target id {int(bad[0])} out of range for vocab {V} (ignore_index is {ignore_index})"
        )
    t = np.where(ignored, -1, t).astype(np.int64)
    count = int((t >= 0).sum())
    if count == 0:
        raise ValueError(
            f"{fn}: every target is ignored ({ignore_index}), so the mean is undefined"
        )
    return backend.of(like.data).asarray(t), count, V


def cross_entropy(logits, targets, ignore_index=-1, n_classes=None):
    """Mean over the targets that are not ignore_index; logits (N, Vp), targets (N,). The
    classes are the first n_classes columns (default all Vp); the rest are padding, given no
    probability (the padded LM head, see GPT2Config.padded_vocab_size). Unlike PyTorch's: only
    the (N, C) form (not (C,) nor (N, C, d...)), and ignore_index defaults to -1 (PyTorch's
    -100); any other negative target is out of range."""
    if logits.ndim != 2:
        raise ValueError(
            f"cross_entropy: logits of shape {logits.shape}: takes (N, C) logits with (N,) "
            "targets (PyTorch's (N, C, d...) form is not supported): for (B, T, V) logits pass "
            "logits.reshape(-1, V) and targets.reshape(-1)"
        )
    N, Vp = logits.shape
    t, count, V = _class_targets(
        "cross_entropy", f"logits {logits.shape}", targets, N, Vp, n_classes, ignore_index, logits
    )
    return CrossEntropy.apply(logits, t, count, V)


def linear_cross_entropy(x, weight, targets, ignore_index=-1, n_classes=None, design="precompute"):
    """cross_entropy(linear(x, weight, transposed=True), targets, ignore_index, n_classes) as
    one record that never holds the logits of the whole batch: x (N, C), weight (Vp, C) (the
    tied LM head's wte), targets (N,). design: one of HEAD_DESIGNS (see LinearCrossEntropy).
    "precompute" is the default, the faster: a gpt2-mini training step (B = 8, T = 128, fp32,
    one core of an Intel Xeon, model 207) takes 660 ms of CPU time with it, 785 ms with
    "recompute" (its extra GEMM) and 618 ms with the plain head, whose peak is 258 MB higher.
    When no backward can follow (no_grad, or nothing needs a gradient) only the loss is
    computed, whatever the design."""
    if design not in HEAD_DESIGNS:
        raise ValueError(f"unknown design {design!r}: use one of {', '.join(HEAD_DESIGNS)}")
    if x.ndim != 2 or weight.ndim != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"linear_cross_entropy: input {x.shape} @ weight {weight.shape}^T: "
            "need x (N, C) and weight (Vp, C)"
        )
    t, count, V = _class_targets(
        "linear_cross_entropy",
        f"input {x.shape}",
        targets,
        x.shape[0],
        weight.shape[0],
        n_classes,
        ignore_index,
        x,
    )
    if not (is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        design = "recompute"  # its forward is the loss alone
    return LinearCrossEntropy.apply(x, weight, t, count, V, design)


def dropout(x, p=0.0, training=True):
    """Inverted dropout: zero with probability p, scale the rest by 1 / (1 - p). The default p
    is 0.0, off (PyTorch's is 0.5)."""
    if not training or p == 0.0:
        return x
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    return Dropout.apply(x, p, rng.next_seed())


# ---- unary ops, softmax over any dim, max (PyTorch's names and signatures)


def _unary(op, x):
    if not dtypes.is_float(x.dtype):
        raise TypeError(f"{op}: needs a floating-point tensor, got {x.dtype}")
    return _UNARY[op].apply(x)


def exp(x):
    return _unary("exp", x)


def log(x):
    return _unary("log", x)


def sqrt(x):
    return _unary("sqrt", x)


def rsqrt(x):
    return _unary("rsqrt", x)


def tanh(x):
    return _unary("tanh", x)


def sigmoid(x):
    return _unary("sigmoid", x)


def silu(x):
    """x sigmoid(x) (SwiSH), Llama's MLP activation."""
    return _unary("silu", x)


def relu(x):
    return _unary("relu", x)


def _over_dim(fn, x, dim):
    """fn, a Function over the last axis, applied over dim: dim swapped last (a view; the
    kernel's input is made contiguous by a counted copy when it is not), and back. A 0-d
    tensor is one row of one element."""
    if not dtypes.is_float(x.dtype):
        raise TypeError(f"{fn.__name__.lower()}: needs a floating-point tensor, got {x.dtype}")
    d = _dim(dim, x.ndim)
    if x.ndim == 0:
        return reshape(fn.apply(reshape(x, (1,))), ())
    if d == x.ndim - 1:
        return fn.apply(x)
    return transpose(fn.apply(transpose(x, d, -1)), d, -1)


def softmax(x, dim):
    """torch.softmax over dim: exp(x - max) / sum(exp(x - max)); a row of -inf is nan."""
    return _over_dim(Softmax, x, dim)


def log_softmax(x, dim):
    """torch.log_softmax over dim: x - max - log(sum(exp(x - max)))."""
    return _over_dim(LogSoftmax, x, dim)


def _nonempty(fn, x, axes):
    for a in axes:
        if x.shape[a] == 0:
            raise IndexError(f"{fn}(): Expected reduction dim {a} to have non-zero size")


def amax(x, dim=(), keepdim=False):
    """torch.amax: the max over dim (an int or a tuple; () or None: every dim); a NaN is the
    max. The gradient is shared evenly by tied maxima."""
    axes = _axes(dim, x.ndim)
    _nonempty("amax", x, axes)
    return Amax.apply(x, axes, keepdim)


MaxResult = namedtuple("max", ["values", "indices"])  # torch.return_types.max


def max(x, dim=None, keepdim=False):
    """torch.max: without dim, the max of every element (as amax, ties sharing the gradient);
    with dim, (values, indices) along it, indices (int64) of the first max, the gradient going
    to the index."""
    if dim is None:
        return amax(x)
    if x.ndim == 0:  # one element, dim 0 or -1
        _dim(dim, 0)
        values, indices = max(reshape(x, (1,)), 0)
        return MaxResult(reshape(values, ()), reshape(indices, ()))
    d = _dim(dim, x.ndim)
    _nonempty("max", x, (d,))
    idx = launch("argmax", x.data, d)  # (..., 1, ...): not differentiable, no record
    values = Max.apply(x, idx, d, keepdim)
    return MaxResult(values, Tensor(idx if keepdim else idx.reshape(values.shape)))


def apply_rotary(x, cos, sin, start=0):
    """Rotary position embeddings (Hugging Face Llama's rotate-half convention) of x (B, H, T,
    D) at positions start .. start + T - 1: cos, sin are tables (positions, D/2) of the angles
    (arrays of x's device in its compute dtype, or Tensors), of which rows start .. start + T
    are read (a KV-cache decode step starts past the cached positions)."""
    cos, sin = (t.data if isinstance(t, Tensor) else t for t in (cos, sin))
    T, D = x.shape[-2:]
    if x.ndim != 4 or D % 2 or cos.shape[1:] != (D // 2,) or sin.shape != cos.shape:
        raise ValueError(
            f"apply_rotary: x {x.shape}, cos {cos.shape}, sin {sin.shape}: need x (B, H, T, D) "
            f"of an even D and tables (positions, D/2) of one shape"
        )
    if start < 0 or start + T > cos.shape[0]:
        raise ValueError(
            f"apply_rotary: positions {start} .. {start + T - 1} are outside the tables' "
            f"{cos.shape[0]} positions"
        )
    return Rotary.apply(x, cos[start : start + T], sin[start : start + T])


def swiglu(gate, up):
    """silu(gate) * up (Llama's SwiGLU MLP: down(silu(gate(x)) * up(x)))."""
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate {gate.shape} and up {up.shape} differ in shape")
    return SwiGLU.apply(gate, up)
