"""Causal attention in blocks on CUDA (attention.cu): one block per (tile of queries or keys,
head), the tiles in dynamic shared memory. Grouped-query attention: k and v have Hkv heads, a
divisor of q's H; query head h reads kv head h // G, G = H / Hkv.
"""

import cupy
import numpy as np

from ... import dtypes
from ...backend.cuda.runtime import BLOCK, blocks_for, check_same_dtype, compiled, launch_per_row

# attention.cu's dynamic shared memory per block, in elements of the acc type: (D + 1)-pitched
# tiles, (TILE + 1)-pitched score tiles, per-row vectors (see each kernel's comment). At D = 64
# the backward's dk/dv kernel needs 134 KB in fp32 and 117 KB in fp64 (32-row tiles).
_FLASH_SMEM = {
    "flash_attention_fwd": (3, 1, 3),
    "flash_attention_bwd_dq": (5, 2, 2),
    "flash_attention_bwd_dkdv": (6, 2, 2),
}


def _smem_optin(device):
    """The most dynamic shared memory a block of this device may opt into (sm_80: 163 KB,
    sm_90: 227 KB), as the device reports it (a few microseconds: asked at each launch)."""
    runtime = cupy.cuda.runtime
    return int(runtime.getDeviceAttribute(runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin, device))


def _attention_shapes(q, k, v):
    """-> B, H, Hkv, Tq, Tk, D of q (B, H, Tq, D), k and v (B, Hkv, Tk, D) with H a multiple of
    Hkv and Tk >= Tq, else raise."""
    if (
        q.ndim != 4
        or k.shape != v.shape
        or k.ndim != 4
        or (k.shape[0], k.shape[3]) != (q.shape[0], q.shape[3])
        or (q.shape[1] % k.shape[1] if k.shape[1] else q.shape[1])
        or k.shape[2] < q.shape[2]
    ):
        raise ValueError(
            f"flash attention: q {q.shape}, k {k.shape}, v {v.shape}: need "
            "(B, H, Tq, D) and (B, Hkv, Tk, D) with H a multiple of Hkv and Tk >= Tq"
        )
    B, H, Tq, D = q.shape
    if B * H > 65535:  # grid y
        raise ValueError(f"flash attention: {B * H} heads is more than one grid holds (65535)")
    return B, H, k.shape[1], Tq, k.shape[2], D


def _flash(kernel, dtype, n, BH, D, *args):
    """Launch an attention.cu kernel: one block per (tile of the n queries or keys, head), BH
    heads (query heads, or kv heads for dk, dv)."""
    acc = dtypes.compute_dtype(dtype)
    tile = 32 if acc.itemsize == 8 else 64  # attention.cu's tile<A>()
    wide, square, rows = _FLASH_SMEM[kernel]
    smem = (wide * tile * (D + 1) + square * tile * (tile + 1) + rows * tile) * acc.itemsize
    optin = _smem_optin(cupy.cuda.Device().id)
    if smem > optin:
        raise ValueError(
            f"flash attention: head dim {D} needs {smem} bytes of shared memory "
            f"per block ({kernel}), more than the {optin} this GPU's blocks may use"
        )
    if n and BH:  # no queries, keys or heads: nothing to launch (a grid of 0 blocks is invalid)
        fn = compiled("attention.cu", kernel, dtype)
        fn.max_dynamic_shared_size_bytes = smem  # above 48 KB a kernel must opt in
        fn((blocks_for(n, tile), BH), (BLOCK,), args, shared_mem=smem)


def flash_attention_fwd(q, k, v, scale):
    """One block per (query tile, query head)."""
    check_same_dtype(q, k, v)
    B, H, Hkv, Tq, Tk, D = _attention_shapes(q, k, v)
    q, k, v = (cupy.ascontiguousarray(a) for a in (q, k, v))  # GPT-2's are transposed views
    acc = dtypes.compute_dtype(q.dtype)
    out, lse = cupy.empty_like(q), cupy.empty((B, H, Tq), dtype=acc)
    _flash(
        "flash_attention_fwd",
        q.dtype,
        Tq,
        B * H,
        D,
        q,
        k,
        v,
        out,
        lse,
        np.int32(Tq),
        np.int32(Tk),
        np.int32(D),
        np.int32(H // Hkv if Hkv else 1),
        acc.type(scale),
    )
    return out, lse


def flash_attention_bwd(q, k, v, out, lse, dout, scale):
    """Three launches: Di = rowsum(dout * out), then dq (one block per query tile of a query
    head) and dk, dv (one block per key tile of a kv head, over its G query heads), each summed
    over the other side's tiles in a fixed order: deterministic, at the price of recomputing the
    scores and dout v^T once more (see attention.cu)."""
    check_same_dtype(q, k, v, out, dout)
    B, H, Hkv, Tq, Tk, D = _attention_shapes(q, k, v)
    if out.shape != q.shape or dout.shape != q.shape or lse.shape != q.shape[:-1]:
        raise ValueError(
            f"flash attention backward: out {out.shape}, dout {dout.shape} and "
            f"lse {lse.shape} must be q's {q.shape} and {q.shape[:-1]}"
        )
    q, k, v, out, dout = (cupy.ascontiguousarray(a) for a in (q, k, v, out, dout))
    acc = dtypes.compute_dtype(q.dtype)
    lse = cupy.ascontiguousarray(lse, dtype=acc)
    Di = cupy.empty(lse.shape, dtype=acc)
    dq, dk, dv = cupy.empty_like(q), cupy.empty_like(k), cupy.empty_like(v)
    G = H // Hkv if Hkv else 1
    rows, sizes = (
        B * H * Tq,
        (np.int32(Tq), np.int32(Tk), np.int32(D), np.int32(G), acc.type(scale)),
    )
    launch_per_row(
        "attention.cu",
        "flash_attention_bwd_rowdot",
        q.dtype,
        rows,
        dout,
        out,
        Di,
        np.int32(rows),
        np.int32(D),
    )
    _flash("flash_attention_bwd_dq", q.dtype, Tq, B * H, D, q, k, v, dout, lse, Di, dq, *sizes)
    _flash(
        "flash_attention_bwd_dkdv", q.dtype, Tk, B * Hkv, D, q, k, v, dout, lse, Di, dk, dv, *sizes
    )
    return dq, dk, dv
