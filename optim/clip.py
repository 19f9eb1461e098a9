"""Global gradient-norm clipping for any list of parameters (PyTorch's clip_grad_norm_).
AdamW(grad_clip=...) does the same inside its fused step without the extra pass."""
import math

from tinygrad_like import backend, kernels


def clip_grad_norm(parameters, max_norm):
    """Scale every gradient in place so their global L2 norm is at most max_norm.
    Returns the norm before clipping."""
    grads = [p.grad.data for p in parameters if p.grad is not None]
    total = 0.0
    for g in grads:
        sq = kernels.launch("grad_norm_sq", g.reshape(-1))
        total += float(backend.of(sq).to_numpy(sq)[0])
    norm = math.sqrt(total)
    if norm > max_norm:
        for g in grads:
            kernels.launch("mul", g, max_norm / (norm + 1e-6), out=g)
    return norm
