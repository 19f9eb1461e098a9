"""The loss as one tape record: cross-entropy over logits (CrossEntropy), and the tied LM head and
the cross-entropy fused over row blocks, so that the logits of the whole batch never exist
(LinearCrossEntropy); then their functional forms (cross_entropy, linear_cross_entropy, which
functional.py exports), which check the operands in PyTorch's words.
"""

import numpy as np

from . import backend, dtypes, profiler
from .autograd import Function, is_grad_enabled
from .functions import _as
from .kernels import launch
from .tensor import Tensor


class CrossEntropy(Function):
    """Mean cross-entropy of logits (N, Vp) against targets (N,), -1 ignored -> fp32 scalar,
    over the first V = n_classes columns (Vp > V: the LM head's padded vocabulary; the padded
    columns take no probability and get dlogits 0). Saves the logits and each row's
    log-sum-exp (N,); backward makes dlogits in one pass with the upstream gradient (and so the
    fp16 loss scale) folded in before rounding."""

    @staticmethod
    def forward(ctx, logits, targets, n_classes):
        inv_count = launch("inverse_count", targets, dtypes.compute_dtype(logits.dtype))
        losses, lse = launch("cross_entropy_fwd", logits, targets, n_classes=n_classes)
        ctx.save_for_backward(logits, lse, targets)
        ctx.inv_count, ctx.n_classes = inv_count, n_classes
        return launch("mul", launch("sum", losses), inv_count)

    @staticmethod
    def backward(ctx, g):
        logits, lse, targets = ctx.saved
        dloss = launch("mul", g, ctx.inv_count)  # (,) fp32, stays on the device
        dlogits = launch("cross_entropy_bwd", logits, lse, targets, dloss, n_classes=ctx.n_classes)
        return dlogits, None, None


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
    compute dtype (the first block's, dw None, starts the sum): the GEMM's epilogue rounds the
    block's share once to dlogits' dtype, casts it to the compute dtype (bf16's fp32) and adds
    it into the sum in place."""
    launch("copy", dx[rows], launch("matmul", dlogits, weight))  # (rows, C)
    acc = dtypes.compute_dtype(dlogits.dtype)
    cast = {} if acc == dlogits.dtype else {"cast": acc}  # (none given: what a fusion may add)
    if dw is None:
        return launch("matmul_tn", dlogits, x[rows], **cast)  # (Vp, C)
    return launch("matmul_tn", dlogits, x[rows], **cast, add=dw, out=dw)


def _precomputed_block(x, weight, rows, targets, unit, n_classes, dx, dw):
    """The precompute design's work on one block -> (its losses, dW so far): its logits (fp32,
    or bf16 as the GEMMs' dtype: bf16 has fp32's range, where fp16's loss scale comes later),
    overwritten in place by their dlogits for dloss = unit (one pass, one exp per logit in fp32;
    the loss needs no lse), then its dX rows and dW share. Its own function so that the block's
    (rows, Vp) buffer is freed before the next block's logits exist."""
    logits = launch("matmul_nt", x[rows], weight)  # (rows, Vp)
    if x.dtype != dtypes.bfloat16:
        logits = _as(logits, dtypes.compute_dtype(x.dtype))
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
      dlogits written over the logits, labeled forward math as the loss is); in bf16 the
      logits stay bf16 (widened in the kernel) and the dlogits are rounded to bf16 for the
      block's two GEMMs (bf16 dot products, as the recompute design's and PyTorch's
      autocast's), each block's dW share rounded once. The backward
      multiplies them by the upstream gradient and rounds once, so the fp16 loss scale still
      never flushes a small gradient. No extra FLOPs, but the head's two backward GEMMs run in
      the forward phase (labeled backward math)."""

    @staticmethod
    def forward(ctx, x, weight, targets, n_classes, design):
        acc = dtypes.compute_dtype(x.dtype)
        inv_count = launch("inverse_count", targets, acc)
        ctx.inv_count, ctx.n_classes, ctx.design = inv_count, n_classes, design
        precompute = design == "precompute"
        if precompute:  # dlogits and both gradients in fp32, for dloss = 1 / count
            dx, dw = backend.of(x).empty(x.shape, acc), None
            unit = inv_count.reshape(1)
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
        return launch("mul", launch("sum", launch("concat", losses, 0)), inv_count)

    @staticmethod
    def backward(ctx, g):
        if ctx.design == "precompute":  # scale by the upstream gradient (in place: the
            dx, dw = (
                _as(launch("mul", grad, g, out=grad), dtype)  # record frees them next),
                for grad, dtype in zip(ctx.saved, ctx.dtypes)
            )  # then round once
            return dx, dw, None, None, None
        x, weight, lse, targets = ctx.saved
        dloss = launch("mul", g, ctx.inv_count)  # (,) fp32, stays on the device
        dx, dw = backend.of(x).empty(x.shape, x.dtype), None
        for rows in _row_blocks(x.shape[0]):
            dw = _recomputed_block(x, weight, rows, lse, targets, dloss, ctx.n_classes, dx, dw)
        return dx, _as(dw, weight.dtype), None, None, None


# ---------------------------------------------------------------- the functional API


def _class_targets(fn, what, targets, N, Vp, n_classes, ignore_index, like):
    """Check the targets of a cross-entropy over the first n_classes of Vp columns for N rows
    (what: the operand that has them, for the messages) -> (targets (N,) int64 on like's
    device with ignore_index as -1 (the targets themselves when they already are: the same
    array at every call of a captured step), V = n_classes or Vp). The checks read the targets
    on the host, in eager calls only: the mean's 1 / count is counted on the device by the
    loss's forward (inverse_count), so a captured step's replay reads no target on the host.
    The meta device's targets have a shape only."""
    t = targets.data if isinstance(targets, Tensor) else targets
    meta = not backend.holds_values(t)  # the meta device's targets: a shape, no ids
    if not (meta or backend.is_array(t)):
        t = np.asarray(t)  # host data: a list
    V = Vp if n_classes is None else n_classes
    if not 0 < V <= Vp:
        raise ValueError(f"{fn}: n_classes {V} must be in [1, {Vp}] for {what}")
    if t.shape != (N,):
        raise ValueError(f"{fn}: {what} need targets of shape ({N},), got {t.shape}")
    if t.dtype.kind not in "iu":
        raise TypeError(f"{fn}: targets must be integer class ids, got {t.dtype}")
    if meta:  # int64, as np.where below makes
        t = t if t.dtype == np.int64 else backend.of(t).empty((N,), np.int64)
        return t, V
    ids = backend.of(t).to_numpy(t)  # read on the host to be checked (a copy from a GPU)
    ignored = ids == ignore_index
    bad = ids[~ignored & ((ids < 0) | (ids >= V))]  # -1 is a class id unless it is ignored
    if bad.size:
        raise ValueError(
            f"target id {int(bad[0])} out of range for vocab {V} (ignore_index is {ignore_index})"
        )
    if ignored.all():
        raise ValueError(
            f"{fn}: every target is ignored ({ignore_index}), so the mean is undefined"
        )
    if ignore_index != -1 or t.dtype != np.int64:
        t = np.where(ignored, -1, ids).astype(np.int64)
    t = backend.of(like.data).asarray(t)  # targets already on like's device stay the same array
    return t, V


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
    t, V = _class_targets(
        "cross_entropy", f"logits {logits.shape}", targets, N, Vp, n_classes, ignore_index, logits
    )
    return CrossEntropy.apply(logits, t, V)


def linear_cross_entropy(x, weight, targets, ignore_index=-1, n_classes=None, design="precompute"):
    """cross_entropy(linear(x, weight, transposed=True), targets, ignore_index, n_classes) as
    one record that never holds the logits of the whole batch: x (N, C), weight (Vp, C) (the
    tied LM head's wte), targets (N,). design: one of HEAD_DESIGNS (see LinearCrossEntropy).
    "precompute" is the default: it makes each block's logits once, where "recompute" makes them
    again in the backward (its extra GEMM; docs/memory.md compares the designs). When no
    backward can follow (no_grad, or nothing needs a gradient) only the loss is computed,
    whatever the design."""
    if design not in HEAD_DESIGNS:
        raise ValueError(f"unknown design {design!r}: use one of {', '.join(HEAD_DESIGNS)}")
    if x.ndim != 2 or weight.ndim != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"linear_cross_entropy: input {x.shape} @ weight {weight.shape}^T: "
            "need x (N, C) and weight (Vp, C)"
        )
    t, V = _class_targets(
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
    return LinearCrossEntropy.apply(x, weight, t, V, design)
