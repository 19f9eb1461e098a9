"""An fp8 KV cache on the meta device (kvcache.py's shapes): kv_quantize's codes (..., D) uint8
and scales (...) fp32, qattention's output of q's shape and dtype."""

import numpy as np

from .runtime import like, new


def kv_quantize(x, fmt):
    """x (..., D) -> codes (..., D) uint8, scales (...) fp32."""
    return new(x.shape, np.uint8), new(x.shape[:-1], np.float32)


def qattention(q, k_codes, k_scales, v_codes, v_scales, fmt, length, scale):
    """-> out (B, H, Tq, D), q's dtype."""
    return like(q)
