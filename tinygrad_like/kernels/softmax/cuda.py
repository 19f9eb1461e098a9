"""Softmaxes on CUDA (softmax.cu): the naive attention's causal softmax and cross-entropy over
(N, Vp) logits, one warp (or block) per row.
"""

import cupy
import numpy as np

from ... import dtypes
from ...backend.cuda.runtime import (
    acc_type,
    as_rows,
    capturing,
    check_same_dtype,
    compiled,
    launch_per_row,
)
from .spec import check_targets


def softmax_causal_fwd(scores, scale):
    s, rows, Tk = as_rows(scores)
    p = cupy.empty_like(s)
    launch_per_row(
        "softmax.cu",
        "softmax_causal_fwd",
        s.dtype,
        rows,
        s,
        p,
        np.int32(rows),
        np.int32(s.shape[-2]),
        np.int32(Tk),
        acc_type(s.dtype)(scale),
    )
    return p


def softmax_causal_bwd(probs, dprobs, scale):
    check_same_dtype(probs, dprobs)
    p, rows, Tk = as_rows(probs)
    dp = cupy.ascontiguousarray(dprobs)
    ds = cupy.empty_like(p)
    launch_per_row(
        "softmax.cu",
        "softmax_causal_bwd",
        p.dtype,
        rows,
        p,
        dp,
        ds,
        np.int32(rows),
        np.int32(Tk),
        acc_type(p.dtype)(scale),
    )
    return ds


def _loss_rows(logits, targets, n_classes):
    """-> contiguous logits (N, Vp), int64 targets checked against V, N, V, Vp. The check is a
    device reduction and a host read: the kernels index each row with its target."""
    logits = cupy.ascontiguousarray(logits)
    N, Vp = logits.shape
    V = Vp if n_classes is None else n_classes
    targets = cupy.ascontiguousarray(targets, dtype=cupy.int64)
    if not capturing():  # a host read, refused inside a graph's capture (runtime.capturing)
        check_targets(targets, V)
    return logits, targets, N, V, Vp


def cross_entropy_fwd(logits, targets, n_classes=None):
    """One block per row (see softmax.cu)."""
    logits, targets, N, V, Vp = _loss_rows(logits, targets, n_classes)
    acc = dtypes.compute_dtype(logits.dtype)
    losses, lse = cupy.empty(N, dtype=acc), cupy.empty(N, dtype=acc)
    if N:
        compiled("softmax.cu", "cross_entropy_fwd", logits.dtype)(
            (N,), (512,), (logits, targets, losses, lse, np.int32(V), np.int32(Vp))
        )
    return losses, lse


def cross_entropy_bwd(logits, lse, targets, dloss, n_classes=None):
    """One block per row; dloss is read by the kernel on the device (no host synchronization for
    it; the target check in _loss_rows is one)."""
    logits, targets, N, V, Vp = _loss_rows(logits, targets, n_classes)
    acc = dtypes.compute_dtype(logits.dtype)
    dlogits = cupy.empty_like(logits)
    if N:
        compiled("softmax.cu", "cross_entropy_bwd", logits.dtype)(
            (N,),
            (512,),
            (
                logits,
                cupy.ascontiguousarray(lse, dtype=acc),
                targets,
                cupy.ascontiguousarray(dloss, dtype=acc).reshape(1),
                dlogits,
                np.int32(V),
                np.int32(Vp),
            ),
        )
    return dlogits


def cross_entropy_fwd_bwd(logits, targets, dloss, n_classes=None, out=None):
    """One launch, one block per row (see softmax.cu); out, when given (logits itself, say),
    must be a C-contiguous array of the logits' shape and dtype."""
    logits, targets, N, V, Vp = _loss_rows(logits, targets, n_classes)
    acc = dtypes.compute_dtype(logits.dtype)
    if out is not None and not (
        out.shape == logits.shape and out.dtype == logits.dtype and out.flags.c_contiguous
    ):
        raise ValueError(
            f"cross_entropy_fwd_bwd: out {out.shape} {out.dtype} must be a "
            f"C-contiguous {logits.shape} {logits.dtype} array"
        )
    losses = cupy.empty(N, dtype=acc)
    dlogits = cupy.empty_like(logits) if out is None else out
    if N:
        compiled("softmax.cu", "cross_entropy_fwd_bwd", logits.dtype)(
            (N,),
            (512,),
            (
                logits,
                targets,
                cupy.ascontiguousarray(dloss, dtype=acc).reshape(1),
                losses,
                dlogits,
                np.int32(V),
                np.int32(Vp),
            ),
        )
    return losses, dlogits


# ---------------------------------------------------------------- softmax over any dim
# Rows of (..., C) over the last axis, one warp per row (softmax.cu), as softmax/cpu.py.


def _rows(kernel, x, *others):
    """softmax.cu's kernel<T> over the rows of x (and others of its shape) -> out (..., C)."""
    check_same_dtype(x, *others)
    x, rows, C = as_rows(x)
    out = cupy.empty_like(x)
    others = [cupy.ascontiguousarray(o) for o in others]
    launch_per_row(
        "softmax.cu", kernel, x.dtype, rows, x, *others, out, np.int32(rows), np.int32(C)
    )
    return out


def softmax_fwd(x):
    return _rows("softmax_fwd", x)


def softmax_bwd(y, dy):
    return _rows("softmax_bwd", y, dy)


def log_softmax_fwd(x):
    return _rows("log_softmax_fwd", x)


def log_softmax_bwd(y, dy):
    return _rows("log_softmax_bwd", y, dy)


def inverse_count(targets, dtype):
    """CuPy's reductions on the device (no host read): the CPU twin's count and fp64 divide."""
    count = cupy.sum(targets >= 0, dtype=np.float64)
    return cupy.divide(1.0, count).astype(dtype)
