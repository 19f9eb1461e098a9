"""Softmaxes over rows: the naive attention's causal softmax over (Tq, Tk) scores, softmax and
log_softmax over the last axis of (..., C) rows (the ops move the dim last), and cross-entropy
over (N, Vp) logits whose columns past V = n_classes are padding. Targets are int64, -1 =
ignored (0 loss, 0 gradient). Statistics (per-row losses, log-sum-exps) are fp32 (fp64 for
fp64).

cpu.py: one row per program of a compiled loop, as softmax.cu's warp per row; cuda.py +
softmax.cu: one warp (or block, for a vocabulary's row) per row.
"""

import numpy as np

from ..record import Out, kernel, like, like_arg, per_element, per_row


def _classes(logits, n_classes):
    """Elements of the logits' first n_classes columns: a padded vocabulary's columns past
    n_classes are neither computed nor read."""
    return logits[:, :n_classes].size


def _logits_read(outs, logits, *rest, n_classes=None, out=None):
    return logits[:, :n_classes].nbytes + sum(a.nbytes for a in rest if hasattr(a, "nbytes"))


@kernel(shape=like_arg(0), flops=per_element(5), exps=per_element(1))
def softmax_causal_fwd(scores, scale):
    """scores (..., Tq, Tk) -> probs of softmax(scale * scores) over keys, future keys masked.
    Query i is position Tk - Tq + i, so Tq < Tk serves a KV-cache decode step. One exp per
    score, masked ones included."""


@kernel(shape=like_arg(0), flops=per_element(4))
def softmax_causal_bwd(probs, dprobs, scale):
    """dscores = scale * probs * (dprobs - sum(dprobs * probs over keys))."""


@kernel(
    shape=lambda logits, targets, n_classes=None: (per_row(logits), per_row(logits)),
    flops=lambda r, logits, *a, n_classes=None: 4 * _classes(logits, n_classes),
    exps=lambda r, logits, *a, n_classes=None: _classes(logits, n_classes),
    reads=_logits_read,
)
def cross_entropy_fwd(logits, targets, n_classes=None):
    """logits (N, Vp), targets (N,) -> losses (N,) fp32 (0 if ignored), lse (N,) fp32: each
    row's log-sum-exp, saved for backward."""


@kernel(
    shape=like_arg(0),
    flops=lambda r, logits, *a, n_classes=None: 4 * _classes(logits, n_classes),
    exps=lambda r, logits, *a, n_classes=None: _classes(logits, n_classes),
    reads=_logits_read,
)
def cross_entropy_bwd(logits, lse, targets, dloss, n_classes=None):
    """dlogits (N, Vp) = dloss * (softmax(logits) - onehot(target)), 0 in the padding columns
    and the ignored rows; dloss (1,) is the upstream gradient over the count of targets."""


@kernel(
    shape=lambda logits, targets, dloss, n_classes=None, out=None: (
        per_row(logits),
        like(logits) if out is None else out,
    ),
    # max, subtract, exp, sum, scale: the backward's subtract and exp are the forward's
    flops=lambda r, logits, *a, n_classes=None, out=None: 5 * _classes(logits, n_classes),
    exps=lambda r, logits, *a, n_classes=None, out=None: _classes(logits, n_classes),
    reads=_logits_read,
)
def cross_entropy_fwd_bwd(logits, targets, dloss, n_classes=None, out=None):
    """cross_entropy_fwd's losses and cross_entropy_bwd's dlogits in one pass -> (losses (N,)
    fp32, dlogits (N, Vp)); dlogits are written into out when given (which may be logits)."""


@kernel(shape=lambda targets, dtype: Out((), np.dtype(dtype)), flops=per_element(1))
def inverse_count(targets, dtype):
    """targets (N,) int64 -> (,) in dtype: 1 / the number of targets that are not -1 (ignored),
    computed in fp64 and rounded once (a mean's factor; on the device, so that a captured step
    needs no host read of its targets: inf when every target is ignored)."""


@kernel(shape=like_arg(0), flops=per_element(5), exps=per_element(1))
def softmax_fwd(x):
    """x (..., C) -> softmax over the last axis: exp(x - max) / sum(exp(x - max))."""


@kernel(shape=like_arg(0), flops=per_element(4))
def softmax_bwd(y, dy):
    """dx = y (dy - sum(dy y over the row)), from the forward's output y."""


@kernel(shape=like_arg(0), flops=per_element(5), exps=per_element(1))
def log_softmax_fwd(x):
    """x (..., C) -> x - max - log(sum(exp(x - max))) over the last axis (a log per row, left
    out of the exps)."""


@kernel(shape=like_arg(0), flops=per_element(4), exps=per_element(1))
def log_softmax_bwd(y, dy):
    """dx = dy - exp(y) sum(dy over the row), from the forward's output y."""


def check_targets(targets, n_classes):
    """Raise ValueError unless every target is -1 (ignored) or in [0, n_classes): the kernels
    index each row with it, past the row's end (CUDA) or, in a padded row, at a padding column."""
    if targets.size:
        lo, hi = int(targets.min()), int(targets.max())
        if lo < -1 or hi >= n_classes:
            raise ValueError(
                f"target id {lo if lo < -1 else hi} out of range for vocab {n_classes}"
            )
