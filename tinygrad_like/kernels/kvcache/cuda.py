"""A KV cache on CUDA (kvcache.cu): kv_write, CuPy's scatter; kv_quantize, one warp per row of
the positions appended; kv_attention and qattention, one block per (batch, head, query) row,
qattention decoding an fp8 cache's codes as it reads them. Neither attention reads the positions
on the host. The layout is spec.py's: codes (B, Hkv, L, D) uint8, scales (B, Hkv, L) fp32.
"""

from functools import lru_cache

import cupy
import numpy as np

from ... import dtypes
from ...backend.cuda.runtime import BLOCK, CTYPES, blocks_for, check_same_dtype, compiled
from ...formats import FORMATS
from .spec import check_kv_attention, check_kv_format, check_positions, check_write

KEYS = 64  # kvcache.cu's KV_KEYS: the scores of one block of keys in shared memory


def _fields(fmt):
    """(exp_bits, man_bits) of a KV cache format: kvcache.cu's template arguments."""
    check_kv_format(fmt)
    return FORMATS[fmt].fields[:2]


@lru_cache(maxsize=None)
def _values(fmt, device):
    """fmt's 256 code values (fp32, ml_dtypes') on the device numbered `device` (the current
    one, which cupy.asarray copies to): qattention's lookup table, one per format and GPU."""
    codes = np.arange(256, dtype=np.uint8).view(FORMATS[fmt].element)
    return cupy.asarray(codes.astype(np.float32))


def kv_quantize(x, fmt):
    """One warp per row, bit for bit the CPU twin's."""
    exp_bits, man_bits = _fields(fmt)
    if x.dtype not in CTYPES:
        raise TypeError(f"kv_quantize takes a floating-point x, got {x.dtype}")
    x = cupy.ascontiguousarray(x)
    D = x.shape[-1]
    rows = x.size // D if D else int(np.prod(x.shape[:-1]))
    codes = cupy.empty(x.shape, dtype=np.uint8)
    scales = cupy.empty(x.shape[:-1], dtype=dtypes.float32)
    if rows:
        compiled("kvcache.cu", "kv_quantize", x.dtype, exp_bits, man_bits)(
            (blocks_for(rows, BLOCK // 32),),
            (BLOCK,),
            (
                x,
                codes,
                scales,
                np.int32(rows),
                np.int32(D),
                np.float32(FORMATS[fmt].qmax),
                np.int32(FORMATS[fmt].nan_code),
            ),
        )
    return codes, scales


def kv_write(cache, new, positions):
    """CuPy's scatter, on the device (the positions never read by the host)."""
    check_write(cache, new, positions)
    cache[:, :, positions] = new
    return cache


def kv_attention(q, k, v, positions, scale):
    """One block per query row over the whole cache, its length read from positions on the
    device (no host read: a decode step can be captured in a CUDA graph)."""
    check_positions("kv_attention", q, k, positions, read=False)
    check_same_dtype(q, k, v)
    return _attend("kv_attention", q, (k, v), (), positions, dtypes.compute_dtype(q.dtype), scale)


def qattention(q, k_codes, k_scales, v_codes, v_scales, fmt, positions, scale):
    """One block per query row, as kv_attention, decoding the codes as it reads them."""
    check_kv_attention(q, k_codes, k_scales, v_codes, v_scales, fmt, positions, read=False)
    if q.dtype not in CTYPES:
        raise TypeError(f"qattention takes a floating-point q, got {q.dtype}")
    caches = (k_codes, k_scales, v_codes, v_scales)
    table = (_values(fmt, cupy.cuda.Device().id),)
    return _attend("qattention", q, caches, table, positions, dtypes.float32, scale)


def _attend(kernel, q, caches, table, positions, acc, scale):
    """Launch kvcache.cu's kernel (attend_row): one block per (b, h, i) row of q (B, H, Tq, D),
    the caches (B, Hkv, L, ...) contiguous, shared memory (table, q, o, a block's scores) in
    acc."""
    B, H, Tq, D = q.shape
    Hkv, L = caches[0].shape[1], caches[0].shape[2]
    q = cupy.ascontiguousarray(q)  # GPT-2's is a transposed view
    caches = tuple(cupy.ascontiguousarray(a) for a in caches)
    out = cupy.empty(q.shape, dtype=q.dtype)
    if out.size:
        smem = (256 * len(table) + 2 * D + KEYS) * acc.itemsize
        compiled("kvcache.cu", kernel, q.dtype)(
            (B * H * Tq,),
            (BLOCK,),
            (
                q,
                *caches,
                *table,
                out,
                np.int32(H),
                np.int32(H // Hkv),
                np.int32(Tq),
                np.int32(L),
                cupy.ascontiguousarray(positions),
                np.int32(D),
                acc.type(scale),
            ),
            shared_mem=smem,
        )
    return out
