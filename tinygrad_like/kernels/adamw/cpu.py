"""The optimizer's kernels on the CPU (adamw.cu's twin): the gradient's sum of squares and one
fused AdamW update over the flat fp32 buffers, in cache-sized chunks, one block per core.
"""

import numpy as np
from numba import prange

from ... import dtypes
from ...backend.cpu.compiled import f32_from_bf16_bits, f32_from_f16_bits, kernel, row_dot
from ...backend.cpu.halves import HALVES, f32, rounded
from ...backend.cpu.runtime import in_parallel
from .spec import DECAY, INV_SQRT_BC2, LR_BC1, ONE_MINUS_BETA1, ONE_MINUS_BETA2, hyper_of

_NORM_PART = 1 << 18  # elements per partial sum of grad_norm_sq (1 MB of fp32)


@kernel
def _sum_squares(g, partials):
    # one fixed part of _NORM_PART elements per iteration (adamw.cu's sum_partials, a block
    # each), its squares summed over the lanes of compiled.row_dot
    for p in prange(partials.shape[0]):
        part = g[p * _NORM_PART : (p + 1) * _NORM_PART]
        partials[p] = row_dot(part, part)


@kernel
def _sum_squares_half(bits, partials, half):
    # bits (n,) uint16, a bf16 (or, where half, fp16) gradient's: _sum_squares' parts, each
    # widened into a scratch row of its own in the cache, then the same row_dot (the sums of
    # widening the gradient whole), all in one launch
    for p in prange(partials.shape[0]):
        part = bits[p * _NORM_PART : (p + 1) * _NORM_PART]
        wide = np.empty(part.shape[0], np.float32)
        for i in range(part.shape[0]):
            if half:
                wide[i] = f32_from_f16_bits(np.int32(part[i]))
            else:
                wide[i] = f32_from_bf16_bits(part[i])
        partials[p] = row_dot(wide, wide)


def grad_norm_sq(grad):
    """Partial sums over fixed parts of _NORM_PART elements (adamw.cu's blocks), then the
    partials in order: the parts depend only on the size, so the sum is the same for any core
    count. inf/nan in the gradient make it non-finite, so the same number serves clipping and
    the overflow check. A 2-byte gradient is widened a part at a time, in the cache (the same
    sums as widening it whole)."""
    g = np.ascontiguousarray(grad).reshape(-1)
    acc = dtypes.compute_dtype(g.dtype)
    partials = np.zeros(-(-g.shape[0] // _NORM_PART), dtype=acc)
    if g.dtype == acc:
        _sum_squares(g, partials)
    else:
        _sum_squares_half(g.view(np.uint16), partials, g.dtype == dtypes.float16)
    return np.array([np.sum(partials)], dtype=acc)


@kernel
def _adamw(
    master,
    grad,
    m,
    v,
    n_decay,
    coef,
    beta1,
    one_minus_beta1,
    beta2,
    one_minus_beta2,
    eps,
    decay,
    lr_bc1,
    inv_sqrt_bc2,
):
    # one element per iteration in adamw.cu's order (each scalar already rounded to master's
    # dtype, as there): m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, decay, the update
    for i in prange(master.shape[0]):
        g = grad[i] * coef
        mi = m[i] * beta1 + one_minus_beta1 * g
        vi = v[i] * beta2 + one_minus_beta2 * (g * g)
        w = master[i]
        if i < n_decay:
            w *= decay
        w -= mi / (np.sqrt(vi) * inv_sqrt_bc2 + eps) * lr_bc1
        m[i], v[i], master[i] = mi, vi, w


def adamw_step(master, grad, m, v, working, norm_sq, constants):
    """adamw.cu's update: the skip and the clipping coefficient decided here from norm_sq (one
    host read), then one compiled pass over the elements, the working copy refreshed after."""
    scaled_norm_sq = float(norm_sq[0])
    if not np.isfinite(scaled_norm_sq):
        return
    c = constants
    h = hyper_of(c)
    g_coef = h.inv_scale
    if h.max_norm > 0:
        norm = np.sqrt(scaled_norm_sq) * h.inv_scale
        g_coef *= min(1.0, h.max_norm / (norm + 1e-6))
    acc = master.dtype.type
    scalars = (
        g_coef,
        h.beta1,
        c[ONE_MINUS_BETA1],
        h.beta2,
        c[ONE_MINUS_BETA2],
        h.eps,
        c[DECAY],
        c[LR_BC1],
        c[INV_SQRT_BC2],
    )
    n_decay, scalars = h.n_decay if h.weight_decay else 0, [acc(s) for s in scalars]
    if grad.dtype == master.dtype or grad.dtype not in HALVES:
        _adamw(master, np.ascontiguousarray(grad, dtype=master.dtype), m, v, n_decay, *scalars)
        if working is not None:
            rounded(master, working.dtype, out=working)
        return

    # a 2-byte gradient: widened a chunk at a time, and that chunk's working copy rounded from
    # master while it is in the cache, one pass over the buffers (each element's update is
    # its own: the bits of widening the whole gradient first)
    def chunk(lo, hi):
        decayed = min(max(n_decay - lo, 0), hi - lo)  # the chunk's first elements decay
        _adamw(master[lo:hi], f32(grad[lo:hi]), m[lo:hi], v[lo:hi], decayed, *scalars)
        if working is not None:
            rounded(master[lo:hi], working.dtype, out=working[lo:hi])

    in_parallel(master.shape[0], chunk)
