"""The optimizer's kernels on the CPU (adamw.cu's twin): the gradient's sum of squares and one
fused AdamW update over the flat fp32 buffers, in cache-sized chunks, one block per core.
"""

import numpy as np

from .runtime import f32, in_parallel, one_blas_thread

_NORM_PART = 1 << 18  # elements per partial sum of grad_norm_sq (1 MB of fp32)


def grad_norm_sq(grad):
    """Sum of squares of a flat gradient buffer in fp32 -> array (1,). inf/nan in the gradient
    make it non-finite, so the same number serves clipping and the overflow check."""
    g = f32(grad)
    # A dot product per fixed part of _NORM_PART elements, the parts shared among the cores
    # (one core streams at half the memory bandwidth), then the partials summed in order: the
    # parts depend only on the size, so the result is the same for any core count.
    n_parts = -(-g.shape[0] // _NORM_PART)
    partials = np.zeros(n_parts, dtype=g.dtype)

    def parts(p0, p1):
        for p in range(p0, p1):
            part = g[p * _NORM_PART : (p + 1) * _NORM_PART]
            partials[p] = np.dot(part, part)

    with one_blas_thread():  # each dot on its own thread: no OpenBLAS split either
        in_parallel(n_parts, parts, per_row=_NORM_PART)
    return np.array([np.sum(partials)], dtype=g.dtype)


def adamw_step(
    master,
    grad,
    m,
    v,
    working,
    norm_sq,
    *,
    lr,
    beta1,
    beta2,
    eps,
    weight_decay,
    n_decay,
    step,
    inv_scale,
    max_norm,
):
    """One fused AdamW update over flat buffers, in place. Returns nothing.

    master, m, v: fp32 (N,). grad: (N,) in the working dtype, multiplied by the loss scale.
    working: the 2-byte copy to refresh from master, or None when master is the working copy.
    norm_sq: (1,) sum of squares of the scaled gradient; if it is not finite (overflow) the
    step is skipped and nothing changes. The first n_decay elements get weight decay (the 2-D
    weights are packed first). Clipping to max_norm (0 = off) uses the unscaled norm.
    """
    scaled_norm_sq = float(norm_sq[0])
    if not np.isfinite(scaled_norm_sq):
        return
    g_coef = inv_scale
    if max_norm > 0:
        norm = np.sqrt(scaled_norm_sq) * inv_scale
        g_coef *= min(1.0, max_norm / (norm + 1e-6))
    # the bias corrections fold into two scalars: update = lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
    bc1, bc2 = 1 - beta1**step, 1 - beta2**step
    acc = master.dtype.type
    decay, lr_c, v_c = acc(1 - lr * weight_decay), acc(lr / bc1), acc(1 / np.sqrt(bc2))

    # one cache-sized chunk at a time: every buffer is read and written once per step, with no
    # N-sized temporaries
    def chunk(lo, hi):
        g = np.multiply(grad[lo:hi], acc(g_coef), dtype=master.dtype)  # unscaled, clipped
        mc, vc, wc = m[lo:hi], v[lo:hi], master[lo:hi]
        mc *= beta1
        d = np.multiply(g, 1 - beta1)
        mc += d  # m = b1 m + (1 - b1) g
        g *= g
        g *= 1 - beta2
        vc *= beta2
        vc += g  # v = b2 v + (1 - b2) g^2
        if weight_decay and lo < n_decay:  # decoupled decay, 2-D weights only
            wc[: n_decay - lo] *= decay
        np.sqrt(vc, out=d)
        d *= v_c
        d += eps
        np.divide(mc, d, out=d)
        d *= lr_c
        wc -= d
        if working is not None:
            working[lo:hi] = wc

    in_parallel(master.shape[0], chunk)
