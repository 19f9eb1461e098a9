"""The optimizer's kernels on CUDA (adamw.cu): the gradient's sum of squares in fixed partial
sums, and one fused AdamW update that never waits for the host: the overflow skip and the
clipping coefficient are decided on the device from norm_sq.
"""

import cupy
import numpy as np

from ... import dtypes
from ...backend.cuda.runtime import BLOCK, NULL, blocks_for, compiled, launch_flat


def grad_norm_sq(grad):
    """Two fixed-order passes (adamw.cu's sum_partials, then the partials in order):
    deterministic; fp64 for fp64."""
    g = cupy.ascontiguousarray(grad).reshape(-1)
    acc = dtypes.compute_dtype(g.dtype)
    nblocks = max(1, min(1024, blocks_for(g.size)))
    partial, out = cupy.empty(nblocks, dtype=acc), cupy.empty(1, dtype=acc)
    compiled("adamw.cu", "sum_partials", g.dtype, True)(
        (nblocks,), (BLOCK,), (g, partial, np.int64(g.size))
    )
    compiled("adamw.cu", "sum_partials", acc, False)(
        (1,), (1024,), (partial, out, np.int64(nblocks))
    )
    return out


def adamw_step(master, grad, m, v, working, norm_sq, constants):
    """norm_sq and the step's constants stay on the device: the kernel skips the step when
    norm_sq is inf/nan and derives the clipping coefficient from it, so nothing here waits for
    the GPU, and a CUDA graph of the step reads each step's constants."""
    for a in (master, grad, m, v) + (() if working is None else (working,)):
        if not a.flags.c_contiguous or a.size != master.size:
            raise ValueError("adamw_step updates flat contiguous buffers of one size in place")
    norm_sq = cupy.ascontiguousarray(norm_sq, dtype=dtypes.compute_dtype(grad.dtype))
    launch_flat(
        "adamw.cu",
        "adamw_step",
        (master.dtype, grad.dtype),
        master.size,
        master,
        grad,
        m,
        v,
        NULL if working is None else working,
        norm_sq,
        np.int64(master.size),
        cupy.ascontiguousarray(constants, dtype=np.float64),
    )
