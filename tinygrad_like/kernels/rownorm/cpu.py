"""Row normalizations on the CPU (rownorm.cu's twin): layernorm and RMSNorm, forward and
backward, one block of rows per core, fp32 statistics per row.
"""

import numpy as np
from numba import prange

from ... import dtypes
from ...backend.cpu.compiled import kernel, row_dot, row_sum
from ...backend.cpu.halves import (
    f32,
    finished,
    operand,
    result,
    rounded,
    row_done,
    row_in,
    row_out,
    through,
    value,
)
from ..elementwise.cpu import add as elementwise_add

# Rows go a block of _BLOCK_ROWS per prange iteration (scratch allocated once per block);
# dweight and dbias are summed per block of _BLOCK_ROWS rows (one prange iteration each), then
# over the blocks in order (rownorm.cu's layernorm_bwd_partials and _reduce): the same bits for
# any core count.
_BLOCK_ROWS = 32


@kernel
def _layernorm_fwd(x, weight, bias, eps, y, mean, rstd):
    # a block of rows per iteration, each row as rownorm.cu's warp per row: x, y (rows, C) in
    # A (fp32 or fp64) or a 2-byte float's bits (halves.row_in / row_out); d, xs, ys: the
    # block's scratch rows
    A = mean.dtype.type
    rows, C = x.shape
    for b in prange(-(-rows // _BLOCK_ROWS)):
        d, xs, ys = np.empty(C, A), np.empty(C, A), np.empty(C, A)
        for row in range(b * _BLOCK_ROWS, min(rows, (b + 1) * _BLOCK_ROWS)):
            xr = row_in(x, row, xs)
            mu = row_sum(xr) / A(C)
            for c in range(C):
                d[c] = xr[c] - mu
            rs = A(1) / np.sqrt(row_dot(d, d) / A(C) + A(eps))
            yr = row_out(y, row, ys)
            for c in range(C):
                yr[c] = d[c] * rs * weight[c] + bias[c]
            row_done(y, row, yr)
            mean[row], rstd[row] = mu, rs


def layernorm_fwd(x, weight, bias, eps=1e-5):
    """rownorm.cu's formula: mean = sum(x)/C, var = sum((x-mean)^2)/C, y = (x - mean) rstd w +
    b."""
    stat = dtypes.compute_dtype(x.dtype)
    xs = operand(x, stat)
    y, ys = result(x.shape, x.dtype, stat)
    mean, rstd = np.empty(xs.shape[0], dtype=stat), np.empty(xs.shape[0], dtype=stat)
    w, b = np.asarray(f32(weight), stat), np.asarray(f32(bias), stat)  # copies only if narrower
    _layernorm_fwd(xs, w, b, eps, ys, mean, rstd)
    return (
        finished(y, x.dtype),
        mean.reshape(x.shape[:-1]),
        rstd.reshape(x.shape[:-1]),
    )


@kernel
def _norm_bwd(dy, x, weight, mean, rstd, centred, plus, dx, partial):
    # layernorm (centred) or RMSNorm (mean unused) backward in one pass over dy and x: a block
    # of _BLOCK_ROWS rows per iteration, each row's dx (rownorm.cu's _bwd_dx, a warp per row),
    # plus[row] added to it where plus has rows (the epilogue, as elementwise's add after the
    # kernel: in fp32, to dx as its dtype holds it), and the block's partial[b] = (dweight,
    # dbias) = (sum(dy xhat), sum(dy)) over its rows in order (_partials), added in the pass
    # that makes xhat (one pass over the row fewer). dy, x, plus, dx: (rows, C) in A or a
    # 2-byte float's bits (halves.row_in / row_out); xhat, g, xs, dys, dxs: the block's scratch
    # rows
    A = partial.dtype.type
    rows, C = x.shape
    for b in prange(partial.shape[0]):
        xhat, g = np.empty(C, A), np.empty(C, A)
        xs, dys, dxs = np.empty(C, A), np.empty(C, A), np.empty(C, A)
        dweight, dbias = partial[b, 0], partial[b, 1]
        for row in range(b * _BLOCK_ROWS, min(rows, (b + 1) * _BLOCK_ROWS)):
            xr, dyr = row_in(x, row, xs), row_in(dy, row, dys)
            mu = mean[row] if centred else A(0)
            rs = rstd[row]
            for c in range(C):
                xh = (xr[c] - mu) * rs
                xhat[c] = xh
                g[c] = dyr[c] * weight[c]
                dweight[c] += dyr[c] * xh
                dbias[c] += dyr[c]
            mean_g = row_sum(g) / A(C) if centred else A(0)
            mean_gx = row_dot(g, xhat) / A(C)
            dxr = row_out(dx, row, dxs)
            for c in range(C):
                v = (g[c] - mean_g - xhat[c] * mean_gx) * rs
                dxr[c] = through(dx, v) + value(plus[row, c]) if plus.shape[0] else v
            row_done(dx, row, dxr)


def _norm_backward(dy, x, weight, mean, rstd, add):
    """dx [+ add] and the (blocks, 2, C) partial sums of dweight and dbias of layernorm's
    backward, or RMSNorm's when mean is None (_norm_bwd); the callers add them in block order.
    add joins dx inside the pass where dx is written in its own dtype (fp32, fp64, a 2-byte
    format the kernel writes as bits: halves.IN_PLACE); else dx is rounded after the pass, so
    there the add is elementwise's, after it."""
    C = x.shape[-1]
    stat = dtypes.compute_dtype(x.dtype)
    dys, xs = operand(dy, stat), operand(x, stat)
    rows = xs.shape[0]
    dx, dxs = result(x.shape, x.dtype, stat)
    partial = np.zeros((-(-rows // _BLOCK_ROWS), 2, C), dtype=stat)
    means = rstd.reshape(-1) if mean is None else mean.reshape(-1)
    w = np.asarray(f32(weight), stat)
    inside = add is not None and add.dtype == x.dtype and dx.dtype == x.dtype
    plus = operand(add, stat) if inside else np.empty((0, C), stat)
    _norm_bwd(dys, xs, w, means, rstd.reshape(-1), mean is not None, plus, dxs, partial)
    dx = finished(dx, x.dtype)
    if add is not None and not inside:
        dx = elementwise_add(add, dx, out=dx)
    return dx, partial


def layernorm_bwd(dy, x, weight, mean, rstd, add=None):
    """dweight and dbias summed per row block (_norm_bwd), then over the blocks in order."""
    dx, partial = _norm_backward(dy, x, weight, mean, rstd, add)
    dweight, dbias = partial[:, 0].sum(axis=0), partial[:, 1].sum(axis=0)  # (C,) each, no views
    return dx, rounded(dweight, weight.dtype), rounded(dbias, weight.dtype)


@kernel
def _rmsnorm_fwd(x, weight, eps, y, rstd):
    # a block of rows per iteration, each row as rownorm.cu's warp per row (x, y as
    # _layernorm_fwd's)
    A = rstd.dtype.type
    rows, C = x.shape
    for b in prange(-(-rows // _BLOCK_ROWS)):
        xs, ys = np.empty(C, A), np.empty(C, A)
        for row in range(b * _BLOCK_ROWS, min(rows, (b + 1) * _BLOCK_ROWS)):
            xr = row_in(x, row, xs)
            rs = A(1) / np.sqrt(row_dot(xr, xr) / A(C) + A(eps))
            yr = row_out(y, row, ys)
            for c in range(C):
                yr[c] = xr[c] * rs * weight[c]
            row_done(y, row, yr)
            rstd[row] = rs


def rmsnorm_fwd(x, weight, eps=1e-6):
    """rownorm.cu's formula: rstd = 1 / sqrt(sum(x^2) / C + eps), y = (x rstd) w."""
    stat = dtypes.compute_dtype(x.dtype)
    xs = operand(x, stat)
    y, ys = result(x.shape, x.dtype, stat)
    rstd = np.empty(xs.shape[0], dtype=stat)
    _rmsnorm_fwd(xs, np.asarray(f32(weight), stat), eps, ys, rstd)
    return finished(y, x.dtype), rstd.reshape(x.shape[:-1])


def rmsnorm_bwd(dy, x, weight, rstd, add=None):
    """layernorm_bwd's pass without the mean; dweight summed per row block, then over the blocks
    in order."""
    dx, partial = _norm_backward(dy, x, weight, None, rstd, add)
    return dx, rounded(partial[:, 0].sum(axis=0), weight.dtype)
