"""Global gradient-norm clipping for any parameters, as PyTorch's
torch.nn.utils.clip_grad_norm_. The trainer does not call it: AdamW(grad_clip=...) clips inside
its fused step from the norm it already computes, with no extra pass over the gradients. This is
for a loop of a user's own, with any optimizer."""

import math

from tinygrad_like import Tensor, backend, kernels


def clip_grad_norm_(parameters, max_norm):
    """Scale every gradient in place so their global L2 norm is at most max_norm (a Tensor or
    an iterable of them; those without a gradient are skipped). -> the norm before clipping."""
    parameters = [parameters] if isinstance(parameters, Tensor) else list(parameters)
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
