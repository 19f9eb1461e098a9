"""Row normalizations on the CPU (rownorm.cu's twin): layernorm and RMSNorm, forward and
backward, one block of rows per core, fp32 statistics per row.
"""

import math

import numpy as np

from ... import dtypes
from .runtime import CHUNK, f32, in_parallel, rounded

# NumPy runs a broadcast a (r, C) * w (C,) as r inner loops of C elements, and at C = 128 the
# per-loop overhead about doubles the time of the pass. So weight-like
# (C,) operands are tiled to _TILE elements once per call, and a block of rows is viewed as
# fewer, longer rows that the tiled vector broadcasts along: the same elementwise operations,
# bit for bit.
_TILE = 1 << 13


def _row_tiled(vec, rows):
    """vec (C,) repeated k = min(rows, _TILE // C) times -> (k C,): no more copies than rows
    (a decode step's one row gets vec itself, a copy fewer per call)."""
    k = max(1, min(rows, _TILE // vec.shape[0]))
    return vec if k == 1 else np.tile(vec, k)


def _long_rows(a, *tiled):
    """a (r, C) contiguous -> a viewed as (r / j, j C) and each tiled vector cut to (j C,),
    j the largest count of rows that divides r and fits the tiles."""
    r, C = a.shape
    j = math.gcd(r, tiled[0].shape[0] // C) if r else 1
    return (a.reshape(r // j, j * C),) + tuple(t[: j * C] for t in tiled)


def layernorm_fwd(x, weight, bias, eps=1e-5):
    """x (..., C) -> y (..., C), mean (...,) fp32, rstd (...,) fp32 (saved for backward)."""
    C = x.shape[-1]
    stat = dtypes.compute_dtype(x.dtype)
    xs = x.reshape(-1, C)
    y = np.empty(xs.shape, dtype=x.dtype)
    mean, rstd = np.empty(xs.shape[0], dtype=stat), np.empty(xs.shape[0], dtype=stat)
    wt, bt = _row_tiled(f32(weight), xs.shape[0]), _row_tiled(f32(bias), xs.shape[0])

    def rows(lo, hi):
        # six passes over the (r, C) chunk: row sums by einsum (3x faster than .mean here), the
        # centred copy xc, its sum of squares (einsum, no x*x temporary), * rstd, * w, + b
        # straight into y. Same formula as rownorm.cu: mean = sum(x)/C, var = sum((x-mean)^2)/C,
        # y = ((x - mean) rstd) w + b (einsum sums in another order than np.mean: an ulp).
        xr = xs[lo:hi]
        mu = np.einsum("rc->r", xr, dtype=stat)
        mu /= C
        xc = np.subtract(xr, mu[:, None], dtype=stat)  # (r, C), a private buffer
        var = np.einsum("rc,rc->r", xc, xc)
        var /= C
        var += eps
        rs = np.divide(1.0, np.sqrt(var, out=var), out=var)
        mean[lo:hi], rstd[lo:hi] = mu, rs
        xc *= rs[:, None]
        xl, wl, bl = _long_rows(xc, wt, bt)
        xl *= wl
        if y.dtype == stat:
            np.add(xl, bl, out=y[lo:hi].reshape(xl.shape))
        else:
            xl += bl
            y[lo:hi] = xc

    # half the default chunk: x's rows, xc and y's rows then stay in L2 (512 rows at C = 128)
    in_parallel(xs.shape[0], rows, per_row=C, chunk_rows=max(1, CHUNK // 2 // C))
    return y.reshape(x.shape), mean.reshape(x.shape[:-1]), rstd.reshape(x.shape[:-1])


def layernorm_bwd(dy, x, weight, mean, rstd):
    """-> dx (..., C), dweight (C,), dbias (C,).
    With xhat = (x - mean) rstd and g = dy * weight:
    dx = rstd (g - mean(g) - xhat mean(g xhat)), dweight = sum(dy xhat), dbias = sum(dy).
    dweight and dbias are summed per row block, then over the blocks in order."""
    C = x.shape[-1]
    dys, xs = dy.reshape(-1, C), x.reshape(-1, C)
    means, rstds = mean.reshape(-1, 1), rstd.reshape(-1, 1)
    dx = np.empty(xs.shape, dtype=x.dtype)
    stat = dtypes.compute_dtype(x.dtype)
    wt = _row_tiled(f32(weight), xs.shape[0])
    partials = {}

    def rows(lo, hi):
        # per (r, C) chunk: two temporaries (xhat, g), row means by einsum (no g * xhat
        # temporary), w through the long-row view (see _row_tiled), rstd straight into dx
        dyf = f32(dys[lo:hi])
        xhat = np.subtract(xs[lo:hi], means[lo:hi], dtype=stat)
        xhat *= rstds[lo:hi]
        partials[lo] = (np.einsum("rc,rc->c", dyf, xhat), dyf.sum(axis=0))
        dl, wl = _long_rows(dyf, wt)
        g = np.multiply(dl, wl).reshape(dyf.shape)  # dy w
        mean_g = np.einsum("rc->r", g)[:, None]
        mean_g /= C
        mean_gx = np.einsum("rc,rc->r", g, xhat)[:, None]
        mean_gx /= C
        xhat *= mean_gx
        g -= mean_g
        g -= xhat  # g - mean(g) - xhat mean(g xhat)
        if dx.dtype == stat:
            np.multiply(g, rstds[lo:hi], out=dx[lo:hi])
        else:
            g *= rstds[lo:hi]
            dx[lo:hi] = g

    # half the default chunk, as layernorm_fwd: the rows and both temporaries stay in L2
    in_parallel(xs.shape[0], rows, per_row=C, chunk_rows=max(1, CHUNK // 2 // C))
    dweight, dbias = _sum_blocks(partials, C, 2)
    return dx.reshape(x.shape), rounded(dweight, weight.dtype), rounded(dbias, weight.dtype)


def _sum_blocks(partials, C, n):
    """The n (C,) sums of the row blocks' partials {first row: (n partial sums)}, each added in
    row order: the same result whatever the core count. No rows: n zeros."""
    blocks = [partials[k] for k in sorted(partials)]
    if not blocks:
        return (np.zeros(C),) * n
    return tuple(np.sum(parts, axis=0) for parts in zip(*blocks))


def rmsnorm_fwd(x, weight, eps=1e-6):
    """x (..., C) -> y (..., C), rstd (...,) fp32 (saved for backward)."""
    C = x.shape[-1]
    stat = dtypes.compute_dtype(x.dtype)
    xs = x.reshape(-1, C)
    y = np.empty(xs.shape, dtype=x.dtype)
    rstd = np.empty(xs.shape[0], dtype=stat)
    wt = _row_tiled(f32(weight), xs.shape[0])

    def rows(lo, hi):
        # the formula of rownorm.cu: rstd = 1 / sqrt(sum(x^2) / C + eps), y = (x rstd) w; three
        # passes over a private fp32 copy of the chunk: sum of squares, * rstd, * w into y
        xr = xs[lo:hi].astype(stat)
        ms = np.einsum("rc,rc->r", xr, xr)
        ms /= C
        ms += eps
        rs = np.divide(1.0, np.sqrt(ms, out=ms), out=ms)
        rstd[lo:hi] = rs
        xr *= rs[:, None]
        xl, wl = _long_rows(xr, wt)
        if y.dtype == stat:
            np.multiply(xl, wl, out=y[lo:hi].reshape(xl.shape))
        else:
            xl *= wl
            y[lo:hi] = xr

    in_parallel(xs.shape[0], rows, per_row=C, chunk_rows=max(1, CHUNK // 2 // C))
    return y.reshape(x.shape), rstd.reshape(x.shape[:-1])


def rmsnorm_bwd(dy, x, weight, rstd):
    """-> dx (..., C), dweight (C,). With xhat = x rstd and g = dy * weight:
    dx = rstd (g - xhat mean(g xhat)), dweight = sum(dy xhat), summed per row block, then over
    the blocks in order."""
    C = x.shape[-1]
    dys, xs, rstds = dy.reshape(-1, C), x.reshape(-1, C), rstd.reshape(-1, 1)
    dx = np.empty(xs.shape, dtype=x.dtype)
    stat = dtypes.compute_dtype(x.dtype)
    wt = _row_tiled(f32(weight), xs.shape[0])
    partials = {}

    def rows(lo, hi):
        dyf = f32(dys[lo:hi])
        xhat = np.multiply(xs[lo:hi], rstds[lo:hi], dtype=stat)
        partials[lo] = (np.einsum("rc,rc->c", dyf, xhat),)
        dl, wl = _long_rows(dyf, wt)
        g = np.multiply(dl, wl).reshape(dyf.shape)  # dy w
        mean_gx = np.einsum("rc,rc->r", g, xhat)[:, None]
        mean_gx /= C
        xhat *= mean_gx
        g -= xhat  # g - xhat mean(g xhat)
        if dx.dtype == stat:
            np.multiply(g, rstds[lo:hi], out=dx[lo:hi])
        else:
            g *= rstds[lo:hi]
            dx[lo:hi] = g

    in_parallel(xs.shape[0], rows, per_row=C, chunk_rows=max(1, CHUNK // 2 // C))
    (dweight,) = _sum_blocks(partials, C, 1)
    return dx.reshape(x.shape), rounded(dweight, weight.dtype)
