"""Row normalizations on CUDA (rownorm.cu): layernorm and RMSNorm forward, one warp per row;
backward as dx per row plus dweight (and dbias) partial sums per block of rows, reduced in
order.
"""

import cupy
import numpy as np

from ... import dtypes
from ...backend.cuda.runtime import (
    BLOCK,
    NULL,
    as_rows,
    blocks_for,
    check_same_dtype,
    compiled,
    launch_per_row,
)


def layernorm_fwd(x, weight, bias, eps=1e-5):
    check_same_dtype(x, weight, bias)
    x, rows, C = as_rows(x)
    stat = dtypes.compute_dtype(x.dtype)
    y = cupy.empty_like(x)
    mean, rstd = cupy.empty(x.shape[:-1], dtype=stat), cupy.empty(x.shape[:-1], dtype=stat)
    launch_per_row(
        "rownorm.cu",
        "layernorm_fwd",
        x.dtype,
        rows,
        x,
        cupy.ascontiguousarray(weight),
        cupy.ascontiguousarray(bias),
        y,
        mean,
        rstd,
        np.int32(rows),
        np.int32(C),
        stat.type(eps),
    )
    return y, mean, rstd


def layernorm_bwd(dy, x, weight, mean, rstd, add=None):
    """dweight/dbias summed deterministically: partial sums per chunk of rows, then one ordered
    pass over the chunks (see rownorm.cu); add (x's shape) joins dx in its store."""
    check_same_dtype(dy, x, weight)
    x, rows, C = as_rows(x)
    dy, weight = cupy.ascontiguousarray(dy), cupy.ascontiguousarray(weight)
    stat = dtypes.compute_dtype(x.dtype)
    mean, rstd = cupy.ascontiguousarray(mean, dtype=stat), cupy.ascontiguousarray(rstd, dtype=stat)
    dx = cupy.empty_like(x)
    if dx.size == 0:  # no rows (or columns): nothing to sum, and a 0-block grid is invalid
        return dx, cupy.zeros(C, dtype=x.dtype), cupy.zeros(C, dtype=x.dtype)
    launch_per_row(
        "rownorm.cu",
        "layernorm_bwd_dx",
        x.dtype,
        rows,
        dy,
        x,
        weight,
        mean,
        rstd,
        _summand(add),
        dx,
        np.int32(rows),
        np.int32(C),
    )
    dweight, dbias = _weight_grads(dy, x, mean, rstd, rows, C)
    return dx, dweight, dbias


def _summand(add):
    """The dx kernels' add argument: add (x's shape) contiguous, or NULL for none."""
    return NULL if add is None else cupy.ascontiguousarray(add)


def _weight_grads(dy, x, mean, rstd, rows, C):
    """dweight = sum(dy (x - mean) rstd), dbias = sum(dy) over the rows (C,), deterministic:
    partial sums per chunk of rows, then one ordered pass over the chunks (see rownorm.cu)."""
    stat = dtypes.compute_dtype(x.dtype)
    rows_per_block = max(1, blocks_for(rows, 256))  # at most 256 chunks: the partials stay small
    nblocks = blocks_for(rows, rows_per_block)
    partial = cupy.empty((nblocks, 2, C), dtype=stat)
    dweight, dbias = cupy.empty(C, dtype=x.dtype), cupy.empty(C, dtype=x.dtype)
    compiled("rownorm.cu", "layernorm_bwd_partials", x.dtype)(
        (nblocks,),
        (BLOCK,),
        (dy, x, mean, rstd, partial, np.int32(rows), np.int32(C), np.int32(rows_per_block)),
    )
    compiled("rownorm.cu", "layernorm_bwd_reduce", x.dtype)(
        (blocks_for(C),), (BLOCK,), (partial, dweight, dbias, np.int32(nblocks), np.int32(C))
    )
    return dweight, dbias


def rmsnorm_fwd(x, weight, eps=1e-6):
    check_same_dtype(x, weight)
    x, rows, C = as_rows(x)
    stat = dtypes.compute_dtype(x.dtype)
    y = cupy.empty_like(x)
    rstd = cupy.empty(x.shape[:-1], dtype=stat)
    launch_per_row(
        "rownorm.cu",
        "rmsnorm_fwd",
        x.dtype,
        rows,
        x,
        cupy.ascontiguousarray(weight),
        y,
        rstd,
        np.int32(rows),
        np.int32(C),
        stat.type(eps),
    )
    return y, rstd


def rmsnorm_bwd(dy, x, weight, rstd, add=None):
    """dweight is layernorm's with a mean of 0, by the same two kernels (their dbias unused);
    add (x's shape) joins dx in its store."""
    check_same_dtype(dy, x, weight)
    x, rows, C = as_rows(x)
    dy, weight = cupy.ascontiguousarray(dy), cupy.ascontiguousarray(weight)
    stat = dtypes.compute_dtype(x.dtype)
    rstd = cupy.ascontiguousarray(rstd, dtype=stat)
    dx = cupy.empty_like(x)
    if dx.size == 0:  # no rows (or columns): nothing to sum, and a 0-block grid is invalid
        return dx, cupy.zeros(C, dtype=x.dtype)
    launch_per_row(
        "rownorm.cu",
        "rmsnorm_bwd_dx",
        x.dtype,
        rows,
        dy,
        x,
        weight,
        rstd,
        _summand(add),
        dx,
        np.int32(rows),
        np.int32(C),
    )
    dweight, _ = _weight_grads(dy, x, cupy.zeros(rows, dtype=stat), rstd, rows, C)
    return dx, dweight
