"""Softmax and cross-entropy on the meta device (softmax.py's shapes): probabilities and
dlogits in their input's shape and dtype, per-row losses and log-sum-exps (N,) in the compute
dtype."""

from ... import dtypes
from .runtime import like, new


def _rows(logits):
    return new(logits.shape[:1], dtypes.compute_dtype(logits.dtype))


def softmax_causal_fwd(scores, scale):
    return like(scores)


def softmax_causal_bwd(probs, dprobs, scale):
    return like(probs)


def cross_entropy_fwd(logits, targets, n_classes=None):
    """-> losses (N,), lse (N,)."""
    return _rows(logits), _rows(logits)


def cross_entropy_bwd(logits, lse, targets, dloss, n_classes=None):
    return like(logits)


def cross_entropy_fwd_bwd(logits, targets, dloss, n_classes=None, out=None):
    """-> losses (N,), dlogits (N, Vp) (out when given)."""
    return _rows(logits), like(logits) if out is None else out


def softmax_fwd(x):
    return like(x)


def softmax_bwd(y, dy):
    return like(y)


def log_softmax_fwd(x):
    return like(x)


def log_softmax_bwd(y, dy):
    return like(y)
