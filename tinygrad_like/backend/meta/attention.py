"""Flash attention on the meta device (attention.py's shapes): out of q's shape and dtype with
an lse (B, H, Tq) in the compute dtype; the gradients of q, k and v in their shapes and
dtypes."""

from ... import dtypes
from .runtime import like, new


def flash_attention_fwd(q, k, v, scale):
    """-> out (B, H, Tq, D), lse (B, H, Tq)."""
    return like(q), new(q.shape[:-1], dtypes.compute_dtype(q.dtype))


def flash_attention_bwd(q, k, v, out, lse, dout, scale):
    """-> dq, dk, dv."""
    return like(q), like(k), like(v)
