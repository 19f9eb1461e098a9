"""Softmaxes on the CPU (softmax.cu's twin): the naive attention's causal softmax over (Tq, Tk)
scores, and cross-entropy over (N, Vp) logits (forward, backward, and both in one pass).
"""

import numpy as np
from numba import prange

from ... import dtypes
from ...backend.cpu.compiled import (
    device,
    kernel,
    row_dot,
    row_max,
    row_sum,
)
from ...backend.cpu.halves import f32, rounded, row_done, row_in
from ...backend.cpu.vector_math import exp
from .spec import check_targets


def softmax_causal_fwd(scores, scale):
    """The rows of _softmax_rows, as softmax.cu's warp per row; masked keys get probability 0."""
    Tq = scores.shape[-2]
    return _over_rows(_softmax_rows, [scores], scale, Tq, True, False, period=Tq)


def softmax_causal_bwd(probs, dprobs, scale):
    """The rows of _softmax_rows_bwd, as softmax.cu's warp per row; masked entries get 0 because
    their probs are 0."""
    return _over_rows(_softmax_rows_bwd, [probs, dprobs], scale, False)


# ---------------------------------------------------------------- cross-entropy
# Cross-entropy is two kernels over the (N, V) logits. The forward reads them once for the
# loss and the log-sum-exp; the backward reads them once more and writes dlogits with the
# upstream gradient (loss scale included) folded in, so small fp16 gradients are scaled before
# they are rounded. (Writing dlogits in the forward, llm.c style, would round them unscaled.)
# A caller that knows dloss in the forward and keeps dlogits in fp32 (the fused LM head's
# precompute design) runs cross_entropy_fwd_bwd instead: both in one pass, one exp per logit.
# One row per prange iteration, as softmax.cu's block per row; the exps of a row are summed over
# fixed lanes (compiled.row_sum), so the forward's and fwd_bwd's sums, and losses, are the same
# bits. 2-byte logits are widened to fp32 a row or a block of rows at a time, dlogits rounded
# once. The kernels with an exp run four vectors of it at once (interleave=4, compiled.py's
# _interleaved: its polynomial is one chain of dependent multiply-adds), the same bits.


@device
def _exp_sum(x, shift, e, total):
    """e[c] = exp(x[c] - shift) over the row -> sum(e) if total (the forward's), else 0 (the
    backward alone, from a saved lse, needs no sum: a pass over the row saved). Called with
    e = x for the in-place kernel, so that LLVM sees one array and vectorizes (two views of one
    row would make it fall back to its scalar loop)."""
    for c in range(x.shape[0]):
        e[c] = exp(x[c] - shift)
    return row_sum(e) if total else e.dtype.type(0)


@device
def _ce_row(x, e, t, V, dloss, shift, forward, backward):
    """One row of the cross-entropy: x (V,) its logits, e (V,) where its exps and then its
    dlogits go (x itself to work in place), t its target (< 0: ignored), shift its lse (the
    backward alone) -> (loss, lse), 0 where not asked for. Forward only: the loss and the
    lse; backward only: dlogits from shift; both: the loss and dlogits from one exp per logit
    (e / s is the softmax)."""
    A = x.dtype.type
    m, picked = A(0), A(0)
    if forward:
        m = row_max(x)
        picked = x[max(t, 0)]  # both read before the exps overwrite x (in place)
        shift = m
    s = _exp_sum(x, shift, e, forward)
    coef = dloss if t >= 0 else A(0)
    loss, lse = A(0), A(0)
    if forward:
        lse = np.log(s) + m
        loss = lse - picked if t >= 0 else A(0)
        coef = coef / s
    if backward:
        for c in range(V):
            e[c] *= coef
        if t >= 0:
            e[t] -= dloss  # minus the one-hot target
    return loss, lse


@kernel(interleave=4)
def _ce(logits, targets, V, dloss, lse_in, losses, lse_out, dlogits, forward, backward, in_place):
    # _ce_row over the rows of logits (N, Vp), the first V read; in_place: dlogits is logits.
    # Each call site names its own e, so that the in-place one passes x itself (_exp_sum).
    A = logits.dtype.type
    for row in prange(logits.shape[0]):
        x, t = logits[row, :V], targets[row]
        if in_place:
            loss, lse = _ce_row(x, x, t, V, dloss, lse_in[row], forward, backward)
        elif backward:
            loss, lse = _ce_row(x, dlogits[row, :V], t, V, dloss, lse_in[row], forward, backward)
        else:
            loss, lse = _ce_row(x, np.empty(V, A), t, V, dloss, lse_in[row], forward, backward)
        if forward:
            losses[row], lse_out[row] = loss, lse
        if backward:
            dlogits[row, V:] = 0  # no gradient to padding


# Other 2-byte logits (fp16, or bf16 into fp32 dlogits) are widened to fp32 this many rows at
# a time (13 MB at Vp = 50,304), never all N rows at once; fp32 logits are read where they
# are, every row in one launch; bf16 logits into bf16 dlogits a row at a time (_ce_bf16).
_WIDEN_ROWS = 64
_BF16_ROWS = 8  # rows of bf16 logits per prange iteration, one scratch row (Vp fp32) for all


@kernel(interleave=4)
def _ce_bf16(bits, targets, V, dloss, lse_in, losses, lse_out, dbits, forward, backward):
    # _ce_row over bf16 logits, their bits (N, Vp) uint16, dlogits' bits into dbits (N, Vp)
    # uint16 when backward: each row widened into an fp32 scratch row (in the core's cache),
    # worked in place there and rounded back, one pass over the bf16 arrays; the bits of
    # widening the logits, _ce in place, and rounding dlogits.
    N, Vp = bits.shape
    for block in prange((N + _BF16_ROWS - 1) // _BF16_ROWS):
        x = np.empty(Vp, np.float32)
        for row in range(block * _BF16_ROWS, min(block * _BF16_ROWS + _BF16_ROWS, N)):
            row_in(bits, row, x)  # widened into x
            xs = x[:V]
            loss, lse = _ce_row(xs, xs, targets[row], V, dloss, lse_in[row], forward, backward)
            if forward:
                losses[row], lse_out[row] = loss, lse
            if backward:
                x[V:] = 0  # no gradient to padding
                row_done(dbits, row, x)


def _cross_entropy(
    logits, targets, dloss, n_classes, lse=None, forward=True, backward=False, out=None
):
    """_ce over the rows -> (losses, lse, dlogits) as the flags ask (None for the rest)."""
    acc = dtypes.compute_dtype(logits.dtype)
    N, Vp = logits.shape
    V = Vp if n_classes is None else n_classes
    check_targets(targets, V)
    d = acc.type(0 if dloss is None else np.asarray(dloss).reshape(-1)[0])
    targets = np.ascontiguousarray(targets, dtype=np.int64)
    losses, lse_out = np.empty(N, dtype=acc), np.empty(N, dtype=acc)
    lse_in = lse_out if lse is None else lse
    none = np.empty((0, Vp), acc)
    if logits.dtype == acc:
        x = np.ascontiguousarray(logits)
        dl = none if not backward else out if out is not None else np.empty((N, Vp), acc)
        _ce(x, targets, V, d, lse_in, losses, lse_out, dl, forward, backward, dl is x)
        return losses, lse_out, dl if backward else None
    dl = None if not backward else out if out is not None else np.empty((N, Vp), logits.dtype)
    if logits.dtype == dtypes.bfloat16 and (
        dl is None or (dl.dtype == logits.dtype and dl.flags.c_contiguous)
    ):
        bits = np.ascontiguousarray(logits).view(np.uint16)
        dbits = np.empty((0, Vp), np.uint16) if dl is None else dl.view(np.uint16)
        _ce_bf16(bits, targets, V, d, lse_in, losses, lse_out, dbits, forward, backward)
        return losses, lse_out, dl
    for lo in range(0, N, _WIDEN_ROWS):
        rows = slice(lo, min(lo + _WIDEN_ROWS, N))
        x = f32(logits[rows])  # (rows, Vp) fp32, its dlogits written over it
        args = (lse_in[rows], losses[rows], lse_out[rows], x if backward else none)
        _ce(x, targets[rows], V, d, *args, forward, backward, backward)
        if backward:
            rounded(x, dl.dtype, out=dl[rows])  # once, to the output's dtype
    return losses, lse_out, dl


def cross_entropy_fwd(logits, targets, n_classes=None):
    """_cross_entropy's rows; the columns past n_classes are not read; stable for large logits
    (the row max is subtracted before exp)."""
    losses, lse, _ = _cross_entropy(logits, targets, None, n_classes)
    return losses, lse


def cross_entropy_bwd(logits, lse, targets, dloss, n_classes=None):
    lse = np.ascontiguousarray(lse, dtype=dtypes.compute_dtype(logits.dtype))
    return _cross_entropy(logits, targets, dloss, n_classes, lse, forward=False, backward=True)[2]


def cross_entropy_fwd_bwd(logits, targets, dloss, n_classes=None, out=None):
    """One exp per logit: e = exp(logit - max) sums to the row's s, which gives the loss (log s
    + max - logit[target], bitwise cross_entropy_fwd's), and e * dloss / s is the softmax part
    of dlogits: in fp32 a few ulps from cross_entropy_bwd's exp(logit - lse) * dloss, and closer
    to the exact value (logit - lse, rounded before its exp, is the larger error: off by a
    median 4 ulps against 1-3, at most 34 against 21, on GPT-2 rows). No lse: nobody needs it
    after. out may be logits itself (each logit is read before it is overwritten), so no second
    (N, Vp) array exists. (softmax.cu's twin takes the exp twice: on a GPU bytes, not exps,
    bound it.)"""
    losses, _, dlogits = _cross_entropy(logits, targets, dloss, n_classes, backward=True, out=out)
    return losses, dlogits


def inverse_count(targets, dtype):
    """NumPy's count of the targets >= 0, then 1 / it in fp64, rounded once (cuda.py: CuPy's)."""
    with np.errstate(divide="ignore"):
        return np.asarray(np.float64(1.0) / np.count_nonzero(targets >= 0), dtype)


# ---------------------------------------------------------------- softmax over any dim
# The rows of x (..., C): functional.softmax / log_softmax move the dim last, and the naive
# attention's causal softmax is over the rows of its (..., Tq, Tk) scores. softmax.cu's twins:
# one warp per row there, one row at a time here, a block of _BLOCK_ROWS rows per prange
# iteration (its scratch allocated once), each row's max and sums over compiled's fixed lanes
# (the same bits for any core count). The CUDA forward takes the max and the sum in one online
# pass; here the max is taken first, then the exps summed, the same values to rounding. A row
# of -inf is NaN, as in PyTorch.

_BLOCK_ROWS = 32
# 2-byte rows are widened to fp32 about this many elements at a time, never the whole array
_WIDEN_ELEMENTS = 1 << 22


@kernel(interleave=4)
def _softmax_rows(x, scale, Tq, causal, log, y):
    # x, y (rows, C) in the compute dtype, m the row's max of scale x. Softmax: y = exp(scale x -
    # m) / sum(...), with causal (the naive attention's scores, row r being query r % Tq at
    # position C - Tq + r % Tq) the keys after the query 0 and out of the max and sum; log:
    # y = (x - m) - log(sum(exp(x - m))) (scale 1, no mask). e: the block's scratch, a row of
    # exps. At scale 1 the max and the exps read x where it is (x * 1 is x, bit for bit): one
    # pass over the row fewer than a scaled copy
    A = x.dtype.type
    rows, C = x.shape
    for b in prange(-(-rows // _BLOCK_ROWS)):
        e = np.empty(C, A)
        for row in range(b * _BLOCK_ROWS, min(rows, (b + 1) * _BLOCK_ROWS)):
            seen = C - Tq + row % Tq + 1 if causal else C  # keys 0 .. seen - 1
            xr, yr, p = x[row], y[row], e[:seen]
            if scale == A(1):  # x * 1 is x: read where it is
                m = row_max(xr[:seen])
                s = _exp_sum(xr[:seen], m, p, True)
            else:  # p: one view, worked in place (_exp_sum)
                for c in range(seen):
                    p[c] = xr[c] * scale
                m = row_max(p)
                s = _exp_sum(p, m, p, True)
            if log:
                lse = np.log(s)
                for c in range(C):
                    yr[c] = (xr[c] - m) - lse
            else:
                for c in range(seen):
                    yr[c] = p[c] / s
                yr[seen:] = 0


@kernel(interleave=4)
def _softmax_rows_bwd(y, dy, scale, log, dx):
    # y, dy, dx (rows, C) in the compute dtype, y the forward's output. Softmax:
    # dx = (dy - sum(dy y)) y scale (scale 1 but for the causal softmax); log:
    # dx = dy - exp(y) sum(dy)
    rows, C = y.shape
    for b in prange(-(-rows // _BLOCK_ROWS)):
        for row in range(b * _BLOCK_ROWS, min(rows, (b + 1) * _BLOCK_ROWS)):
            yr, gr, dr = y[row], dy[row], dx[row]
            if log:
                total = row_sum(gr)
                for c in range(C):
                    dr[c] = gr[c] - exp(yr[c]) * total
            else:
                total = row_dot(gr, yr)
                for c in range(C):
                    dr[c] = (gr[c] - total) * yr[c] * scale


def _over_rows(kernel, arrays, scale, *flags, period=1):
    """kernel(*rows, scale, *flags, out_rows) over the (N, C) rows of arrays (x and the others
    of its shape (..., C)) in the compute dtype -> out (..., C) in x's dtype: fp32 and fp64
    rows in one launch, where they are; 2-byte rows widened a block at a time (a multiple of
    period rows, so that the causal rule's row % Tq holds in each block) and rounded once."""
    x = arrays[0]
    C = x.shape[-1]
    N = x.size // C if C else 0
    acc = dtypes.compute_dtype(x.dtype)
    flat = [a.reshape(N, C) for a in arrays]
    out = np.empty((N, C), x.dtype)
    whole = x.dtype == acc
    step = N if whole else max(1, _WIDEN_ELEMENTS // max(C, 1) // period) * period
    for lo in range(0, N, max(step, 1)):
        blocks = [np.ascontiguousarray(a[lo : lo + step], dtype=acc) for a in flat]
        y = out[lo : lo + step] if whole else np.empty(blocks[0].shape, acc)
        kernel(*blocks, acc.type(scale), *flags, y)
        if not whole:
            out[lo : lo + step] = y  # rounded once
    return out.reshape(x.shape)


def softmax_fwd(x):
    return _over_rows(_softmax_rows, [x], 1, 1, False, False)


def softmax_bwd(y, dy):
    return _over_rows(_softmax_rows_bwd, [y, dy], 1, False)


def log_softmax_fwd(x):
    return _over_rows(_softmax_rows, [x], 1, 1, False, True)


def log_softmax_bwd(y, dy):
    return _over_rows(_softmax_rows_bwd, [y, dy], 1, True)
