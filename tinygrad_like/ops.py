"""The differentiable ops GPT-2 needs: one Function (forward + backward) each, then the
functional API (PyTorch's names) that the Tensor methods and nn/ call.

Every array operation goes through kernels.launch(name, ...), so each op's FLOPs and bytes are
counted where they happen. Views (reshape, transpose, permute, split, basic slicing) launch no
kernel: they move no data. Shapes in comments: B batch, T sequence, C channels, H heads,
D = C / H, V vocabulary, N = B * T rows.

Over 500 lines on purpose: it is the whole list of differentiable ops, each forward beside its
backward (tinygrad's mlops.py), so that one file answers "what can the tape record".
"""

import math

import numpy as np

from . import backend, dtypes, profiler, rng
from .autograd import Function, is_grad_enabled
from .kernels import launch
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
        db = None
        if mb:  # d(a/b)/db = -a / b^2
            db = _unbroadcast(
                launch("neg", launch("div", launch("mul", g, a), launch("mul", b, b))), *mb
            )
        return da, db


class Neg(Function):
    @staticmethod
    def forward(ctx, x):
        return launch("neg", x)

    @staticmethod
    def backward(ctx, g):
        return launch("neg", g)


class Sum(Function):
    @staticmethod
    def forward(ctx, x, axis, keepdims):
        ctx.shape = x.shape
        ctx.axis = (
            tuple(range(x.ndim))
            if axis is None
            else tuple(a % x.ndim for a in ((axis,) if isinstance(axis, int) else axis))
        )
        return launch("sum", x, axis=ctx.axis, keepdims=keepdims)

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


def _can_view(x, shape):
    """Whether x (either backend) can take shape without a copy: always when contiguous, and
    e.g. when splitting the last dimension of a column slice. NumPy decides, on a stand-in with
    x's shape and strides over one element of memory (it only computes strides, reads nothing)."""
    stand_in = np.lib.stride_tricks.as_strided(np.empty(1, x.dtype), x.shape, x.strides)
    try:
        np.reshape(stand_in, shape, copy=False)
        return True
    except ValueError:
        return False


def _reshape(x, shape):
    """A view when the strides allow one, else an explicit, counted copy first."""
    return (x if _can_view(x, shape) else launch("contiguous", x)).reshape(shape)


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
        ctx.inverse = tuple(np.argsort(dims))
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
        bounds = np.cumsum(sizes)[:-1]
        return tuple(_xp(x).split(x, bounds, axis=axis))

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
            y = launch("matmul", _reshape(a, (-1, a.shape[-1])), b)
            return y.reshape(*a.shape[:-1], b.shape[-1])
        return launch("matmul", a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved
        if b.ndim == 2 and a.ndim > 2:
            g2, a2 = _reshape(g, (-1, g.shape[-1])), _reshape(a, (-1, a.shape[-1]))
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
        x2 = _reshape(x, (-1, x.shape[-1]))  # (M, K), M = B*T
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
        g2 = _reshape(g, (-1, g.shape[-1]))  # (M, N)
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


class Attention(Function):
    """Causal scaled-dot-product attention, fused into one tape record.
    q (B, H, Tq, D), k and v (B, H, Tk, D), Tk >= Tq (Tk > Tq when decoding with a KV cache).
    Saves q, k, v and the probabilities (B, H, Tq, Tk). Masked scores are computed, not
    skipped: forward 4*Tq*Tk*D FLOPs per head, backward twice that."""

    @staticmethod
    def forward(ctx, q, k, v):
        scale = 1.0 / math.sqrt(q.shape[-1])
        scores = launch("matmul_nt", q, k)  # (B, H, Tq, Tk)
        probs = launch("softmax_causal_fwd", scores, scale)
        ctx.save_for_backward(q, k, v, probs)
        ctx.scale = scale
        return launch("matmul", probs, v)  # (B, H, Tq, D)

    @staticmethod
    def backward(ctx, g):
        q, k, v, probs = ctx.saved
        dprobs = launch("matmul_nt", g, v)  # (B, H, Tq, Tk)
        dv = launch("matmul_tn", probs, g)  # (B, H, Tk, D)
        dscores = launch("softmax_causal_bwd", probs, dprobs, ctx.scale)
        dq = launch("matmul", dscores, k)  # (B, H, Tq, D)
        dk = launch("matmul_tn", dscores, q)  # (B, H, Tk, D)
        return dq, dk, dv


class FlashAttention(Function):
    """Attention's function in blocks (FlashAttention-2): q (B, H, Tq, D), k and v
    (B, H, Tk, D), Tk >= Tq, as Attention. The (Tq, Tk) scores never exist beyond one block
    pair; the record saves q, k, v, the output and one log-sum-exp per query (B, H, Tq) fp32,
    from which the backward recomputes each block's probabilities: O(T·D) bytes per head, not
    O(T²). The key blocks past each query block are skipped (FLOPs: contract.flash_scores)."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.scale = 1.0 / math.sqrt(q.shape[-1])
        out, lse = launch("flash_attention_fwd", q, k, v, ctx.scale)  # (B, H, Tq, D), (B, H, Tq)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, g):
        return launch("flash_attention_bwd", *ctx.saved, g, ctx.scale)  # dq, dk, dv


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


def permute(x, dims):
    return Permute.apply(x, tuple(d % x.ndim for d in dims))


def sum(x, axis=None, keepdims=False):
    return Sum.apply(x, axis, keepdims)


def mean(x, axis=None, keepdims=False):
    axes = range(x.ndim) if axis is None else ((axis,) if isinstance(axis, int) else axis)
    n = math.prod(x.shape[a] for a in axes)
    return mul(sum(x, axis, keepdims), 1.0 / n)


def transpose(x, dim0=-2, dim1=-1):
    dims = list(range(x.ndim))
    dims[dim0], dims[dim1] = dims[dim1], dims[dim0]
    return permute(x, dims)


def getitem(x, index):
    items = index if isinstance(index, tuple) else (index,)
    if not all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items):
        raise TypeError(
            f"indexing with {index!r}: only ints, slices, None and ... are "
            "supported (views); use embedding() to gather rows by id"
        )
    return GetItem.apply(x, index)


def split(x, split_size, dim=-1):
    """Like torch.split: chunks of split_size (an int) or of the listed sizes along dim."""
    n = x.shape[dim]
    sizes = (
        [split_size] * (n // split_size) + ([n % split_size] if n % split_size else [])
        if isinstance(split_size, int)
        else list(split_size)
    )
    if np.sum(sizes) != n:
        raise ValueError(f"split: sizes {sizes} do not add up to dimension {dim} of size {n}")
    return Split.apply(x, sizes, dim % x.ndim)


def cat(tensors, dim=0):
    return Concat.apply(*tensors, axis=dim % tensors[0].ndim)


def matmul(a, b):
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
    transposed=True the weight is (out, in), as PyTorch's nn.Linear and the tied LM head."""
    k = weight.shape[1] if transposed else weight.shape[0]
    if x.shape[-1] != k:
        raise ValueError(
            f"linear: input {x.shape} @ weight {weight.shape}"
            f"{'^T' if transposed else ''}: inner dimensions {x.shape[-1]} and "
            f"{k} differ"
        )
    return Linear.apply(x, weight, bias, transposed)


def embedding(idx, weight, num_embeddings=None):
    """idx (...) int token ids -> weight rows (..., C). Ids must be < num_embeddings: all of
    weight's rows by default, fewer when the rows past it are padding."""
    n = weight.shape[0] if num_embeddings is None else num_embeddings
    ids = idx.data if isinstance(idx, Tensor) else idx
    if not hasattr(ids, "__cuda_array_interface__"):  # host ids (lists too): check, then move
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"embedding: ids must be integers, got {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            bad = int(ids.max() if ids.max() >= n else ids.min())
            raise ValueError(f"token id {bad} out of range for vocab {n}")
        ids = backend.of(weight.data).asarray(ids)
    return Embedding.apply(weight, ids)


def gelu(x):
    """GELU, tanh approximation (GPT-2's)."""
    return GELU.apply(x)


def layer_norm(x, weight, bias, eps=1e-5):
    if x.shape[-1] != weight.shape[0]:
        raise ValueError(
            f"layer_norm: input {x.shape} has {x.shape[-1]} features, weight has {weight.shape[0]}"
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


def scaled_dot_product_attention(q, k, v, flash=False):
    """Causal attention over (B, H, T, D) tensors (the only kind GPT-2 uses). flash=True runs
    it in blocks (FlashAttention), saving one number per query instead of the probabilities."""
    if q.shape[-1] != k.shape[-1] or k.shape != v.shape or k.shape[-2] < q.shape[-2]:
        raise ValueError(
            f"attention: q {q.shape}, k {k.shape}, v {v.shape}: need equal head "
            "dims, k and v of one shape, and at least as many keys as queries"
        )
    return (FlashAttention if flash else Attention).apply(q, k, v)


def _class_targets(fn, what, targets, N, Vp, n_classes, ignore_index, like):
    """Check the targets of a cross-entropy over the first n_classes of Vp columns for N rows
    (what: the operand that has them, for the messages) -> (targets (N,) int64 on like's
    device with ignore_index as -1, the count of the others, V = n_classes or Vp)."""
    t = targets.numpy() if isinstance(targets, Tensor) else np.asarray(targets)
    V = Vp if n_classes is None else n_classes
    if not 0 < V <= Vp:
        raise ValueError(f"{fn}: n_classes {V} must be in [1, {Vp}] for {what}")
    if t.shape != (N,):
        raise ValueError(f"{fn}: {what} need targets of shape ({N},), got {t.shape}")
    t = np.where(t == ignore_index, -1, t).astype(np.int64)
    bad = t[(t < -1) | (t >= V)]
    if bad.size:
        raise ValueError(f"target id {int(bad[0])} out of range for vocab {V}")
    count = int((t >= 0).sum())
    if count == 0:
        raise ValueError(f"{fn}: every target is ignored (-1), so the mean is undefined")
    return backend.of(like.data).asarray(t), count, V


def cross_entropy(logits, targets, ignore_index=-1, n_classes=None):
    """Mean over the targets that are not ignore_index; logits (N, Vp), targets (N,). The
    classes are the first n_classes columns (default all Vp); the rest are padding, given no
    probability (the padded LM head, see GPT2Config.padded_vocab_size)."""
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
    if not training or p == 0.0:
        return x
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    return Dropout.apply(x, p, rng.next_seed())


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
