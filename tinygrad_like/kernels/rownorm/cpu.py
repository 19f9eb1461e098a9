"""Row normalizations on the CPU (rownorm.cu's twin): layernorm and RMSNorm, forward and
backward, one block of rows per core, fp32 statistics per row.
"""

import numpy as np
from numba import prange

from ... import dtypes
from ...backend.cpu.compiled import kernel, row_dot, row_sum
from ...backend.cpu.halves import f32, rounded
from ..elementwise.cpu import add as elementwise_add

# Rows go a block of _BLOCK_ROWS per prange iteration (scratch allocated once per block);
# dweight and dbias are summed per block of _BLOCK_ROWS rows (one prange iteration each), then
# over the blocks in order (rownorm.cu's layernorm_bwd_partials and _reduce): the same bits for
# any core count.
_BLOCK_ROWS = 32


@kernel
def _layernorm_fwd(x, weight, bias, eps, y, mean, rstd):
    # a block of rows per iteration, each row as rownorm.cu's warp per row: x, y (rows, C) in
    # A (fp32 or fp64); d: the block's scratch row
    A = x.dtype.type
    rows, C = x.shape
    for b in prange(-(-rows // _BLOCK_ROWS)):
        d = np.empty(C, A)
        for row in range(b * _BLOCK_ROWS, min(rows, (b + 1) * _BLOCK_ROWS)):
            mu = row_sum(x[row]) / A(C)
            for c in range(C):
                d[c] = x[row, c] - mu
            rs = A(1) / np.sqrt(row_dot(d, d) / A(C) + A(eps))
            for c in range(C):
                y[row, c] = d[c] * rs * weight[c] + bias[c]
            mean[row], rstd[row] = mu, rs


def layernorm_fwd(x, weight, bias, eps=1e-5):
    """rownorm.cu's formula: mean = sum(x)/C, var = sum((x-mean)^2)/C, y = (x - mean) rstd w +
    b."""
    C = x.shape[-1]
    stat = dtypes.compute_dtype(x.dtype)
    xs = np.ascontiguousarray(f32(x.reshape(-1, C)))
    y = np.empty(xs.shape, dtype=stat)
    mean, rstd = np.empty(xs.shape[0], dtype=stat), np.empty(xs.shape[0], dtype=stat)
    w, b = np.asarray(f32(weight), stat), np.asarray(f32(bias), stat)  # copies only if narrower
    _layernorm_fwd(xs, w, b, eps, y, mean, rstd)
    return (
        rounded(y, x.dtype).reshape(x.shape),
        mean.reshape(x.shape[:-1]),
        rstd.reshape(x.shape[:-1]),
    )


@kernel
def _norm_bwd(dy, x, weight, mean, rstd, centred, plus, dx, partial):
    # layernorm (centred) or RMSNorm (mean unused) backward in one pass over dy and x: a block
    # of _BLOCK_ROWS rows per iteration, each row's dx (rownorm.cu's _bwd_dx, a warp per row),
    # plus[row] added to it where plus has rows (the epilogue, in fp32 as elementwise's add),
    # and the block's partial[b] = (sum(dy xhat), sum(dy)) over its rows in order (_partials);
    # xhat, g: the block's scratch
    A = x.dtype.type
    rows, C = x.shape
    for b in prange(partial.shape[0]):
        xhat, g = np.empty(C, A), np.empty(C, A)
        for row in range(b * _BLOCK_ROWS, min(rows, (b + 1) * _BLOCK_ROWS)):
            mu = mean[row] if centred else A(0)
            rs = rstd[row]
            for c in range(C):
                xhat[c] = (x[row, c] - mu) * rs
                g[c] = dy[row, c] * weight[c]
            mean_g = row_sum(g) / A(C) if centred else A(0)
            mean_gx = row_dot(g, xhat) / A(C)
            for c in range(C):
                dx[row, c] = (g[c] - mean_g - xhat[c] * mean_gx) * rs
                if plus.shape[0]:
                    dx[row, c] += plus[row, c]
                partial[b, 0, c] += dy[row, c] * xhat[c]
                partial[b, 1, c] += dy[row, c]


def _norm_backward(dy, x, weight, mean, rstd, add):
    """dx [+ add] and the (blocks, 2, C) partial sums of dweight and dbias of layernorm's
    backward, or RMSNorm's when mean is None (_norm_bwd); the callers add them in block order.
    add joins dx inside the pass for fp32 and fp64 x; a 2-byte dx is rounded first, as the add
    launched after it would have read it, so there the add is elementwise's, after the pass."""
    C = x.shape[-1]
    stat = dtypes.compute_dtype(x.dtype)
    dys = np.ascontiguousarray(f32(dy.reshape(-1, C)))
    xs = np.ascontiguousarray(f32(x.reshape(-1, C)))
    rows = xs.shape[0]
    dx = np.empty(xs.shape, dtype=stat)
    partial = np.zeros((-(-rows // _BLOCK_ROWS), 2, C), dtype=stat)
    means = rstd.reshape(-1) if mean is None else mean.reshape(-1)
    w = np.asarray(f32(weight), stat)
    inside = add is not None and x.dtype == stat
    plus = np.ascontiguousarray(add.reshape(-1, C)) if inside else np.empty((0, C), stat)
    _norm_bwd(dys, xs, w, means, rstd.reshape(-1), mean is not None, plus, dx, partial)
    dx = rounded(dx, x.dtype).reshape(x.shape)
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
    # a block of rows per iteration, each row as rownorm.cu's warp per row
    A = x.dtype.type
    rows, C = x.shape
    for b in prange(-(-rows // _BLOCK_ROWS)):
        for row in range(b * _BLOCK_ROWS, min(rows, (b + 1) * _BLOCK_ROWS)):
            rs = A(1) / np.sqrt(row_dot(x[row], x[row]) / A(C) + A(eps))
            for c in range(C):
                y[row, c] = x[row, c] * rs * weight[c]
            rstd[row] = rs


def rmsnorm_fwd(x, weight, eps=1e-6):
    """rownorm.cu's formula: rstd = 1 / sqrt(sum(x^2) / C + eps), y = (x rstd) w."""
    C = x.shape[-1]
    stat = dtypes.compute_dtype(x.dtype)
    xs = np.ascontiguousarray(f32(x.reshape(-1, C)))
    y = np.empty(xs.shape, dtype=stat)
    rstd = np.empty(xs.shape[0], dtype=stat)
    _rmsnorm_fwd(xs, np.asarray(f32(weight), stat), eps, y, rstd)
    return rounded(y, x.dtype).reshape(x.shape), rstd.reshape(x.shape[:-1])


def rmsnorm_bwd(dy, x, weight, rstd, add=None):
    """layernorm_bwd's pass without the mean; dweight summed per row block, then over the blocks
    in order."""
    dx, partial = _norm_backward(dy, x, weight, None, rstd, add)
    return dx, rounded(partial[:, 0].sum(axis=0), weight.dtype)
