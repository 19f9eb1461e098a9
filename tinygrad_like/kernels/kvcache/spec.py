"""A KV cache's kernels (nn/lm.py KVCache, inference only): its keys and values (B, Hkv, L, D)
written at the positions of the tokens appended, and attended to by the queries at those
positions. Every kernel takes the whole cache and the positions as a device array, never a slice
of the cache cut to a length known on the host, so that a decode step launches the same kernels
on the same arrays at every position: a step that can be captured and replayed (CUDA graphs
included). positions: (Tq,) int64, the positions of the queries (and of the keys and values
written), consecutive; the keys 0 ... positions[-1] are read.

In an 8-bit float format the cache stores codes (B, Hkv, L, D) uint8 of fmt, one of KV_FORMATS
(tinygrad_like/formats.py FORMATS), and scales (B, Hkv, L) fp32, one per row of D (a position of a
kv head): the row's max |x| over the format's qmax (1 for an all-zero row), an element being its
code's value x its row's scale, as quant.quantize scales a weight's output channel. kv_quantize
makes the rows of the positions appended; qattention decodes each code as it reads it: there is
never a dequantized copy.

cpu.py: kv_attention runs attention's kernels on the cache cut to its length (a decode step's one
compiled (batch, head, query) row per program); qattention one row per program, each key decoded
into a row and dotted, the online softmax of attention's decode rows (kernels/attention/cpu.py
softmax_block). cuda.py + kvcache.cu: both attentions one block per (batch, query head, query),
the cache's length read from the positions on the device, never on the host (check_positions'
read=False); kv_write a CuPy scatter.
"""

import numpy as np

from ... import backend
from ..record import Out, kernel, like, per_element

KV_FORMATS = ("fp8_e4m3", "fp8_e5m2")


def host_positions(positions):
    """positions read back to the host (the meta device keeps the values of the small host
    arrays it is given)."""
    known = getattr(positions, "known", None)
    return known if known is not None else backend.of(positions).to_numpy(positions)


def cache_length(positions):
    """The keys an attention at these query positions reads: the last position + 1."""
    return int(host_positions(positions)[-1]) + 1


def causal_pairs(Tq, length):
    """(query, key) pairs of a causal attention of Tq queries over `length` keys, query i at
    position length - Tq + i seeing keys 0 ... that position."""
    return Tq * (length - Tq) + Tq * (Tq + 1) // 2


def _scores(q, positions):
    """Scores an attention of q (B, H, Tq, D) at positions computes: the causal pairs of each
    query head."""
    return q.shape[0] * q.shape[1] * causal_pairs(q.shape[2], cache_length(positions))


def _read(q, caches, positions):
    """q, the positions, and of each cache array (B, Hkv, L, ...) the positions 0 ... the last
    query's."""
    length = cache_length(positions)
    return q.nbytes + positions.nbytes + sum(c.nbytes // c.shape[2] * length for c in caches)


def check_write(cache, new, positions):
    """-> cache itself (kv_write's shape rule: written in place) when new (B, Hkv, T, ...) fits
    cache (B, Hkv, L, ...) at positions (T,), else a ValueError or TypeError saying how not."""
    if (
        new.ndim != cache.ndim
        or new.ndim < 3
        or new.shape[:2] != cache.shape[:2]
        or new.shape[3:] != cache.shape[3:]
        or positions.shape != (new.shape[2],)
    ):
        raise ValueError(
            f"kv_write: new {new.shape} at positions {positions.shape} into a cache "
            f"{cache.shape}: need new (B, Hkv, T, ...) of the cache's (B, Hkv, L, ...), T positions"
        )
    if new.dtype != cache.dtype or positions.dtype != np.int64:
        raise TypeError(
            f"kv_write: new {new.dtype} into a {cache.dtype} cache at {positions.dtype} "
            "positions: cast new to the cache's dtype first; positions are int64"
        )
    return cache


@kernel(
    shape=check_write,
    writes=(0,),
    skips=(0,),
    written=lambda outs, cache, new, positions: new.nbytes,
)
def kv_write(cache, new, positions):
    """cache[:, :, positions[t]] = new[:, :, t] for each t, in place -> cache: the keys or
    values (B, Hkv, T, D), or an fp8 cache's codes (B, Hkv, T, D) or scales (B, Hkv, T), of the
    positions appended. new is in the cache's dtype (a counted cast first when it is not)."""


@kernel(
    shape=lambda q, k, v, positions, scale: like(q),
    # per computed score: q k and p v (2 D each) and the online softmax (5), as flash attention
    flops=lambda r, q, k, v, positions, scale: (4 * q.shape[-1] + 5) * _scores(q, positions),
    exps=lambda r, q, k, v, positions, scale: _scores(q, positions),
    reads=lambda outs, q, k, v, positions, scale: _read(q, (k, v), positions),
)
def kv_attention(q, k, v, positions, scale):
    """Causal attention of q (B, H, Tq, D) at positions over a cache's keys and values k, v
    (B, Hkv, L, D) in q's dtype, H a multiple of Hkv -> out (B, H, Tq, D) = softmax(scale q
    K^T, keys past each query's position masked) V over the positions 0 ... positions[-1],
    query head h against kv head h // (H / Hkv): flash_attention_fwd's output on the cache cut
    to that length, without its lse (nothing saved: inference only)."""


@kernel(
    shape=lambda x, fmt: (Out(tuple(x.shape), np.uint8), Out(tuple(x.shape[:-1]), np.float32)),
    flops=per_element(2),
)
def kv_quantize(x, fmt):
    """x (..., D) float -> codes (..., D) uint8 and scales (...) fp32 of fmt (KV_FORMATS), one
    scale per row: max |x| / qmax (1 for an all-zero row); a code is x / scale rounded to fmt
    (to nearest, ties to even) within +-qmax: quant.quantize's codes and scales of the rows as
    a weight of one scale per output channel, bit for bit. In fp32 (fp64 x rounded to it).
    2 FLOPs per element: the max and the divide."""


@kernel(
    shape=lambda q, *args: like(q),
    # per (query head, query, key) pair: q k and p v (2 D each), the online softmax (5) and the
    # two row scales (of the key's score, of the value's weight)
    flops=lambda r, q, kc, ks, vc, vs, fmt, positions, scale: (
        (4 * q.shape[-1] + 7) * _scores(q, positions)
    ),
    exps=lambda r, q, kc, ks, vc, vs, fmt, positions, scale: _scores(q, positions),
    reads=lambda outs, q, kc, ks, vc, vs, fmt, positions, scale: _read(
        q, (kc, ks, vc, vs), positions
    ),
)
def qattention(q, k_codes, k_scales, v_codes, v_scales, fmt, positions, scale):
    """Causal attention of q (B, H, Tq, D) at positions over an fp8 cache (codes (B, Hkv, L, D)
    uint8, scales (B, Hkv, L) fp32 for K and for V, fmt of KV_FORMATS), H a multiple of Hkv
    -> out (B, H, Tq, D) in q's dtype = softmax(scale q K^T, future keys masked) V over the
    positions 0 ... positions[-1], query head h against kv head h // (H / Hkv); K and V decoded
    inside the kernel, fp32 accumulation."""


# ---------------------------------------------------------------- checks both backends run


def check_kv_format(fmt):
    """Raise ValueError unless fmt is one of KV_FORMATS (the kernels' template arguments)."""
    if fmt not in KV_FORMATS:
        raise ValueError(f"a KV cache in {fmt!r}: the quantized ones are {', '.join(KV_FORMATS)}")


def check_positions(what, q, cache, positions, read=True):
    """-> the cache's length for an attention of q (B, H, Tq, D) at positions over a cache
    (B, Hkv, L, ...), or a ValueError (the kernels index the cache by these shapes, with no
    bounds check): q and the cache of one B and D, H a multiple of Hkv, positions (Tq,)
    consecutive, the last below L. read=False (a device that never reads the positions on the
    host, so that a step can be captured as a CUDA graph): the shapes only, -> None; the
    positions' values are then the caller's to keep in range (nn/lm.py's KVCache.advance)."""

    def shapes():  # the message's start, made only for an error (this runs every decode step)
        return f"{what}: q {q.shape}, cache {cache.shape}, positions {positions.shape}"

    if q.ndim != 4 or cache.ndim != 4 or positions.shape != (q.shape[2],) or not q.shape[2]:
        raise ValueError(f"{shapes()}: need q (B, H, Tq, D), a cache (B, Hkv, L, D), Tq positions")
    (B, H, Tq, D), (_, Hkv, L, _) = q.shape, cache.shape
    if cache.shape[0] != B or cache.shape[3] != D or not Hkv or H % Hkv:
        raise ValueError(f"{shapes()}: need one B and D, and H a multiple of Hkv")
    if positions.dtype != np.int64:
        raise TypeError(f"{shapes()}: positions must be int64, got {positions.dtype}")
    if not read:
        return None
    at = host_positions(positions)
    first, length = int(at[0]), int(at[-1]) + 1
    consecutive = length - first == Tq and (Tq < 3 or bool((np.diff(at) == 1).all()))
    if not (0 <= first and length <= L and consecutive):  # a decode step's Tq = 1: no array op
        raise ValueError(f"{shapes()}: need consecutive positions in [0, L = {L}), got {at}")
    return length


def check_kv_attention(q, k_codes, k_scales, v_codes, v_scales, fmt, positions, read=True):
    """-> the cache's length, or a ValueError unless qattention's arguments fit: fmt one of
    KV_FORMATS, codes (B, Hkv, L, D) and scales (B, Hkv, L) alike for K and V, positions as
    check_positions says."""
    check_kv_format(fmt)
    if k_codes.shape != v_codes.shape or {k_scales.shape, v_scales.shape} != {k_codes.shape[:3]}:
        raise ValueError(
            f"qattention: codes {k_codes.shape} and {v_codes.shape}, scales {k_scales.shape} "
            f"and {v_scales.shape}: need codes (B, Hkv, L, D) and scales (B, Hkv, L) for K and V"
        )
    return check_positions("qattention", q, k_codes, positions, read)
