"""kv_write and kv_attention as ops of a compiled CPU step (backend/cpu/step_runner.py), over an
fp32 cache. kv_write: cpu.py's cache[:, :, positions] = new, each thread its (batch, head) pairs.
kv_attention: cpu.py's, the cache cut to its length (the last position + 1, read by the op from
the positions, the step's input), a decode step's rows (attention/cpu.py's _attention_rows, its
serial twin: the same loop, the same bits) split over the threads by whole groups of query heads
(one kv head each). The positions are checked on the host before each run by the launches' own
checks (spec.check_positions; kv_write's as NumPy's index error)."""

import numba
import numpy as np

from ...backend.cpu.step_runner import (
    Strided,
    Unsupported,
    f32_at,
    f64_of,
    form,
    i64_at,
    op,
    share,
    strided4,
)
from ..attention.cpu import DECODE_ROWS, _attention_rows
from .spec import check_positions, check_write, host_positions

_rows = _attention_rows.serial


@op
def _write(t, T, a):
    # a: cache (B, Hkv, L, D) fp32 C-contiguous; new (B, Hkv, Tn, D) Strided (9 slots);
    # positions (Tn,) int64; B, Hkv, L, D
    B, Hkv, L, D = a[11], a[12], a[13], a[14]
    cache = numba.carray(f32_at(a[0]), (B, Hkv, L, D))
    new = strided4(a, 1)
    Tn = new.shape[2]
    positions = numba.carray(i64_at(a[10]), (Tn,))
    lo, hi = share(B * Hkv, t, T)
    for bh in range(lo, hi):
        b, h = bh // Hkv, bh % Hkv
        for i in range(Tn):
            p = positions[i] + L if positions[i] < 0 else positions[i]  # NumPy's negative index
            cache[b, h, p, :] = new[b, h, i, :]


@form("kv_write")
def _kv_write_form(ops, outs, cache, new, positions):
    check_write(cache, new, positions)
    if cache.dtype != np.float32 or new.dtype != np.float32 or cache.ndim != 4:
        raise Unsupported("kv_write: an fp32 cache")
    L = cache.shape[2]
    ops.check(("write", id(positions), L), lambda: _in_cache(positions, L), positions)
    ops.add(_write, cache, Strided(new), positions, *cache.shape)


def _in_cache(positions, L):
    """NumPy's IndexError for a position outside [-L, L) (cache[:, :, positions]'s)."""
    for p in host_positions(positions).tolist():
        if not -L <= p < L:
            raise IndexError(f"index {p} is out of bounds for axis 2 with size {L}")


@op
def _attention(t, T, a):
    # a: q (B, H, Tq, D) Strided (9 slots); k, v caches (B, Hkv, L, D) fp32 C-contiguous;
    # positions (Tq,) int64; out (B, H, Tq, D), lse (B, H, Tq) fp32; Hkv, L, scale's bits
    q = strided4(a, 0)
    B, H, Tq, D = q.shape
    Hkv, L = a[14], a[15]
    G = H // Hkv
    lo, hi = share(Hkv, t, T)  # kv heads, and their G query heads each
    if lo == hi:
        return
    k = numba.carray(f32_at(a[9]), (B, Hkv, L, D))
    v = numba.carray(f32_at(a[10]), (B, Hkv, L, D))
    length = numba.carray(i64_at(a[11]), (Tq,))[Tq - 1] + 1
    out = numba.carray(f32_at(a[12]), (B, H, Tq, D))
    lse = numba.carray(f32_at(a[13]), (B, H, Tq))
    scale = np.float32(f64_of(a[16]))
    heads = slice(lo * G, hi * G)
    _rows(
        k[:, lo:hi, :length], v[:, lo:hi, :length], q[:, heads], scale, out[:, heads], lse[:, heads]
    )


@form("kv_attention")
def _kv_attention_form(ops, outs, q, k, v, positions, scale):
    check_positions("kv_attention", q, k, positions, read=False)
    fp32 = all(x.dtype == np.float32 for x in (q, k, v))
    B, H, Tq, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    if not fp32 or v.shape != k.shape or Tq * (H // Hkv) > DECODE_ROWS or outs[0] is None:
        raise Unsupported("kv_attention: a decode step's rows over an fp32 cache")
    # the positions' values against the cache's length: every layer's cache is as long
    key = ("positions", id(positions), k.shape)
    ops.check(key, lambda: check_positions("kv_attention", q, k, positions), positions)
    lse = ops.scratch((B, H, Tq))
    ops.add(_attention, Strided(q), k, v, positions, outs[0], lse, Hkv, L, float(scale))
