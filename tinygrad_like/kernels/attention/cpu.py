"""Causal attention in blocks on the CPU (attention.cu's twin), FlashAttention-2 (Dao 2023):
the scores of a (query block, key block) pair live only while that pair is worked on, so memory
is O(T·D) per head, never the (Tq, Tk) matrix, and key blocks wholly after a query block are
skipped. Each pair is a few batched matmuls over a range of the B*Hkv kv heads at once, with
one compiled pass between them (_online_softmax, _probs_dscores: what attention.cu's warps do
between its tile products). Query i is at position Tk - Tq + i, as in softmax_causal_fwd
(Tq < Tk: a KV-cache decode step or a prompt after one). Grouped-query attention (k, v with
Hkv heads, a divisor of q's H): query head h reads kv head h // G, G = H / Hkv, and a kv
head's G query heads are the columns of one GEMM against it (_grouped), never a repeated k or
v. Blocks are spec.FLASH_BQ queries by spec.FLASH_BK keys, read at each call (the FLOP
count follows them; a test shrinks them to make ragged blocks).

Smaller blocks pay NumPy's per-call overhead more often; larger ones compute more of the masked
half of each diagonal block. The scores of a pair are kept transposed, sT (heads, keys,
queries) = k_j (q_i scale)^T, with q pre-transposed once per call: the softmax's max and sum
over keys then run key by key with the queries as the contiguous inner axis, which vectorizes
(a reduction along each 64-element row would not). The matmuls that need s itself take
sT.swapaxes, which BLAS reads at no cost. The block GEMMs stay in BLAS, which a Numba loop
nest without fast-math (no reassociated dot products) does not match (docs/performance.md).
BLAS runs single-threaded here (one_blas_thread): the heads are split across the cores
instead.

A decode step (one query, or a few, per head: Tq G <= DECODE_ROWS) has too few queries for
these GEMMs, whose fixed costs (the _grouped copies, the hand-off to the cores, a few NumPy
calls per block) would outweigh its work: it runs _attention_rows, one compiled kernel with one
(batch, head, query) row per iteration, as kvcache.qattention and attention.cu's block per row,
the two sharing the online softmax of a key block (softmax_block).
"""

import math

import numpy as np
from numba import prange

from ... import dtypes
from ...backend.cpu.compiled import (
    LANES,
    device,
    kernel,
    row_max,
    serial_kernel,
    vector_dot,
)
from ...backend.cpu.halves import copy_into, f32, rounded
from ...backend.cpu.runtime import CHUNK, in_parallel, one_blas_thread
from ...backend.cpu.vector_math import exp
from . import spec

# A call whose kv heads serve at most this many query rows each (Tq G: a decode step) runs
# _attention_rows, one row per iteration, rather than the GEMMs of query blocks: measured on
# GPT-2's and Llama's heads, the rows won up to Tq G = 6 and lost at 8 (each row reads its kv
# head's keys and values once, a GEMM once for all of its columns).
DECODE_ROWS = 6
_KEYS = spec.FLASH_BK  # keys per block of a row's online softmax (attention.cu's KV tile)


def _keys_end(Tq, Tk, i1, j0):
    """The end of the keys [j0, end) of the key block starting at j0 that a query block ending
    at query i1 sees: the block cut at the position of its last query."""
    return min(j0 + spec.FLASH_BK, Tk - Tq + i1)


# The online softmax between a block pair's GEMMs, compiled: one pass over the pair's scores
# for what NumPy did in six (mask, max, subtract, exp, sum, rescale), as attention.cu's warp per
# query row does it. The scores are kept transposed, (keys, queries G), so every loop's inner
# axis is the queries, contiguous: the max and the sum over keys run key by key, in order, for
# all the block's queries at once (the order of NumPy's reduction over an outer axis, and the
# same for any core count). A key after a query (key position j0 + c, query position
# first + t, the block's column t G + g) is masked: key c masks the columns r < (j0 + c -
# first) G (_masked). The per-query statistics are copied into scratch rows first (LLVM
# vectorizes loops over scratch it owns, not over views it cannot prove apart from the
# scores). These run on the calling core (serial_kernel): _by_heads has split the heads over
# the cores.


@device
def _masked(c, j0, first, G, cols):
    """How many of a block's columns (queries t G + g at positions first + t) key c of the
    block (position j0 + c) is after: the first ones."""
    return min(cols, max(0, j0 + c - first) * G)


@device
def _exp_after(s, shift, masked):
    """s[r] = exp(s[r] - shift[r]) over a row of columns, but 0 for the first masked ones
    (what their exp would be made), with no exp taken for the whole LANES-column runs among
    them: a diagonal block's exps about a third fewer. The loop runs over views that start at index
    0, which LLVM vectorizes (a loop from a variable start it does not: Numba's index may be
    negative there)."""
    start = masked // LANES * LANES
    s[:start] = 0
    rest, by = s[start:], shift[start:]
    for r in range(rest.shape[0]):
        rest[r] = exp(rest[r] - by[r])
    s[start:masked] = 0


@serial_kernel
def _online_softmax(sT, m, lsum, o, j0, first, G, opening):
    # sT (B, H', n, cols) the pair's scores k_j (q_i scale)^T, turned in place into
    # p^T = exp(s - m_new) (0 after the query); m, lsum (B, H', cols), the running max and sum
    # of exp(s - m), and o (B, H', cols, D), the running p v, updated: lsum = lsum alpha +
    # sum(p), o *= alpha, with alpha = exp(m_old - m_new). opening (key block 0): m and lsum
    # are set, o is left for the GEMM to write (what the update gives from m = -inf,
    # lsum = o = 0).
    A = sT.dtype.type
    B, heads, n, cols = sT.shape
    m_new, total = np.empty(cols, A), np.empty(cols, A)
    for b in range(B):
        for h in range(heads):
            for r in range(cols):
                m_new[r] = -np.inf if opening else m[b, h, r]
                total[r] = 0
            for c in range(n):
                s = sT[b, h, c]
                for r in range(_masked(c, j0, first, G, cols)):
                    s[r] = -np.inf
                for r in range(cols):
                    m_new[r] = max(m_new[r], s[r])
            for c in range(n):
                s = sT[b, h, c]
                _exp_after(s, m_new, _masked(c, j0, first, G, cols))
                for r in range(cols):
                    total[r] += s[r]
            for r in range(cols):
                if opening:
                    lsum[b, h, r] = total[r]
                else:
                    alpha = exp(m[b, h, r] - m_new[r])
                    lsum[b, h, r] = lsum[b, h, r] * alpha + total[r]
                    for d in range(o.shape[3]):
                        o[b, h, r, d] *= alpha
                m[b, h, r] = m_new[r]


@serial_kernel
def _probs_dscores(pT, dsT, lseT, DiT, h0, c0, j0, first, G):
    # the backward's pair, between its GEMMs, as attention.cu's probs_tile and dscores_tile:
    # pT (B, H', n, cols) the scores k_j (q_i scale)^T, turned in place into p^T =
    # exp(s - lse) (0 after the query); dsT (B, H', n, cols) dp^T = v_j dout_i^T, turned into
    # ds^T = p (dp - Di); lseT, DiT (B, Hkv, Tq G), the pair's columns from c0, of kv head h0 + h
    A = pT.dtype.type
    B, heads, n, cols = pT.shape
    lse, Di = np.empty(cols, A), np.empty(cols, A)
    for b in range(B):
        for h in range(heads):
            for r in range(cols):
                lse[r], Di[r] = lseT[b, h0 + h, c0 + r], DiT[b, h0 + h, c0 + r]
            for c in range(n):
                p, ds = pT[b, h, c], dsT[b, h, c]
                _exp_after(p, lse, _masked(c, j0, first, G, cols))
                for r in range(cols):
                    ds[r] = p[r] * (ds[r] - Di[r])


def _by_group(a, Hkv):
    """a (B, H, T, X) as a view (B, Hkv, T, G, X), G = H / Hkv: [:, j, t, g] is position t of
    query head j G + g, the g-th of the G heads that kv head j serves."""
    B, H, T, X = a.shape
    return a.reshape(B, Hkv, H // Hkv if Hkv else 1, T, X).swapaxes(2, 3)


def _grouped(a, Hkv, scale=None, transposed=False):
    """a (B, H, T, D) (any strides), H = G Hkv -> (B, Hkv, T G, D) contiguous in the compute
    dtype, times scale if given: row t G + g holds position t of query head j G + g; with
    transposed=True, (B, Hkv, D, T G). A block of queries is then one range of rows (columns)
    that holds it in all G heads of a group: one GEMM against their kv head, and dk, dv summed
    over the group inside it. G = 1 (one kv head per query head): a's (transposed) copy."""
    B, H, T, D = a.shape
    src = _by_group(a, Hkv)  # (B, Hkv, T, G, D)
    if transposed:
        src = src.transpose(0, 1, 4, 2, 3)  # (B, Hkv, D, T, G)
    out = copy_into(np.empty(src.shape, dtype=dtypes.compute_dtype(a.dtype)), src, scale)
    rows = T * (H // Hkv if Hkv else 1)
    return out.reshape(B, Hkv, D, rows) if transposed else out.reshape(B, Hkv, rows, D)


def _by_heads(H, body, work):
    """Run body(h0, h1) over ranges of the H (kv) heads, one per core when the work (scores per
    kv head) is large enough, with BLAS on one thread. Heads are independent, so the split
    changes no result (one kv head, multi-query attention, runs on one core).
    (q, k, v come in as strided views of the (B, T, 3C) projection, so the kernels index
    (B, H', ...) ranges of them rather than reshape to B*H heads, which would copy.)"""
    with one_blas_thread():
        in_parallel(H, body, per_row=work, chunk_rows=H)


@device
def softmax_block(s, m, lsum, o):
    """A row's online softmax over its next block of keys (shared with kvcache.qattention): s
    (n,) the block's scores, turned in place into p = exp(s - m_new), m_new = max(m, max(s));
    o (D,) the row's running sum of p v, rescaled by alpha = exp(m - m_new) for the block's
    values to be added -> (m_new, lsum alpha + sum(p)). The first block opens the row from
    m = -inf, lsum = 0 and o = 0 (alpha 0). max(s) over compiled's fixed lanes, in vector
    registers, not a key-by-key chain of compares: exact, a key-by-key max's value but for
    which of 0 and -0 a tie keeps, which no result can see (a row with a NaN score is NaN
    either way); the sum key by key."""
    m_new = max(m, row_max(s))
    alpha = exp(m - m_new)
    for c in range(s.shape[0]):  # apart from the sum, so that it vectorizes
        s[c] = exp(s[c] - m_new)
    total = s.dtype.type(0)
    for c in range(s.shape[0]):
        total += s[c]
    for d in range(o.shape[0]):
        o[d] *= alpha
    return m_new, lsum * alpha + total


@device
def _add_rows(o, p, v):
    """o += p v, the rows of v (n, D) weighted by p (n,) added to o (D,) in row order, each
    product rounded before it is added: the order of a row-by-row loop, with o read and written
    once per four rows (the four adds to an element one chain in registers, not four trips
    through memory)."""
    n, D = v.shape
    c = 0
    while c + 4 <= n:
        p0, p1, p2, p3 = p[c], p[c + 1], p[c + 2], p[c + 3]
        v0, v1, v2, v3 = v[c], v[c + 1], v[c + 2], v[c + 3]
        for d in range(D):
            o[d] = o[d] + p0 * v0[d] + p1 * v1[d] + p2 * v2[d] + p3 * v3[d]
        c += 4
    for c in range(c, n):
        pc, vc = p[c], v[c]
        for d in range(D):
            o[d] += pc * vc[d]


# prange over a decode step's rows from this many cached elements (k's B Hkv Tk D) on: measured
# on 2 cores, the parallel launch cost more than it saved up to 1M (Llama's 8 kv heads of
# 1000 x 128). kvcache.qattention, the same rows over an fp8 cache, keys on it too.
DECODE_SERIAL_BELOW = 1 << 21


@kernel(serial_below=DECODE_SERIAL_BELOW)
def _attention_rows(k, v, q, scale, out, lse):
    # k, v (B, Hkv, Tk, D), q (B, H, Tq, D), any strides; out (B, H, Tq, D) C-contiguous and
    # lse (B, H, Tq) written, all in the compute dtype: a row (b, h, i) per iteration
    # (attention.cu: a block per row), its keys 0 ... Tk - Tq + i in blocks of _KEYS: s = the
    # scaled query . each key (compiled.vector_dot), softmax_block, o += p v key by key
    # (_add_rows). scratch: each row's scores and scaled query, one allocation for all rows
    B, Hkv, Tk, D = k.shape
    H, Tq = q.shape[1], q.shape[2]
    G = H // Hkv
    A = out.dtype.type
    scratch = np.empty((B * H * Tq, _KEYS + D), A)
    for r in prange(B * H * Tq):
        b, h, i = r // (H * Tq), r // Tq % H, r % Tq
        # kv head h // G's keys and values (Tk, D) typed C-contiguous, so that the loops over a
        # key vectorize (Numba does not vectorize a strided view's): a view when they are (a
        # KV cache's [:, :, :Tk]), else a copy
        kh = np.ascontiguousarray(k[b, h // G])
        vh = np.ascontiguousarray(v[b, h // G])
        s, qr = scratch[r, :_KEYS], scratch[r, _KEYS:]  # qr: the query times scale
        for d in range(D):
            qr[d] = q[b, h, i, d] * scale
        seen = Tk - Tq + i + 1  # the keys this query sees
        o = out[b, h, i]  # the running sum of p v, then out
        o[:] = 0
        m, lsum = A(-np.inf), A(0)
        for j0 in range(0, seen, _KEYS):
            n = min(_KEYS, seen - j0)
            for c in range(n):
                s[c] = vector_dot(qr, kh[j0 + c])
            m, lsum = softmax_block(s[:n], m, lsum, o)
            _add_rows(o, s[:n], vh[j0 : j0 + n])
        for d in range(D):
            o[d] /= lsum
        lse[b, h, i] = m + math.log(lsum)


def flash_attention_fwd(q, k, v, scale):
    """lse is the log-sum-exp of each query's scaled scores, all that backward needs of the
    softmax. A kv head's G query heads run together, as the columns of _grouped's layout. Per
    query block, over its key blocks in order, the online softmax keeps m (running max), lsum
    (running sum of exp(s - m)), both (B, H', 1, bq G) over the kv heads [h0, h1), and o
    (running sum of exp(s - m) v, (B, H', bq G, D)); a block with a larger max rescales lsum and
    o by exp(m_old - m_new). Key 0 is in the first block and every query sees it, so m is finite
    from then on (no -inf minus -inf); that first block sets m, lsum and o directly (what the
    update gives from m = -inf, lsum = o = 0, bit for bit). A decode step (Tq G <= DECODE_ROWS)
    runs _attention_rows instead: one (batch, head, query) row per iteration, the same online
    softmax over the row's keys, dotted one at a time (reassociated: the results agree with the
    blocks' to rounding, not bit for bit)."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    G = H // Hkv if Hkv else 1
    acc = dtypes.compute_dtype(q.dtype)
    if Tq * G <= DECODE_ROWS:  # a decode step: one row per iteration
        out = np.empty(q.shape, dtype=acc)
        lse = np.empty(q.shape[:-1], dtype=acc)
        _attention_rows(f32(k), f32(v), f32(q), acc.type(scale), out, lse)
        return rounded(out, q.dtype), lse
    qT = _grouped(q, Hkv, acc.type(scale), transposed=True)  # (B, Hkv, D, Tq G), scaled
    ks, vs = f32(k), f32(v)  # (B, Hkv, Tk, D)
    out = np.empty(q.shape, dtype=q.dtype)
    lse = np.empty(q.shape[:-1], dtype=acc)
    out_g, lse_g = _by_group(out, Hkv), _by_group(lse[..., None], Hkv)  # (B, Hkv, Tq, G, D | 1)

    bq, bk = spec.FLASH_BQ, spec.FLASH_BK

    def heads(h0, h1):
        for i0 in range(0, Tq, bq):
            i1 = min(i0 + bq, Tq)
            qTi = qT[:, h0:h1, :, i0 * G : i1 * G]  # (B, H', D, bq G)
            cols = (i1 - i0) * G
            m, lsum = np.empty((2, B, h1 - h0, cols), dtype=acc)
            o = np.empty((B, h1 - h0, cols, D), dtype=acc)
            for j0 in range(0, Tk - Tq + i1, bk):  # no key after the block
                j1 = _keys_end(Tq, Tk, i1, j0)
                sT = np.matmul(ks[:, h0:h1, j0:j1], qTi)  # (B, H', n, bq G) = s^T
                _online_softmax(sT, m, lsum, o, j0, Tk - Tq + i0, G, j0 == 0)  # sT = p^T
                pT, vj = sT.swapaxes(-1, -2), vs[:, h0:h1, j0:j1]
                if j0 == 0:
                    np.matmul(pT, vj, out=o)  # (B, H', bq G, D)
                else:
                    o += np.matmul(pT, vj)
            o /= lsum[..., None]
            shape = (B, h1 - h0, i1 - i0, G)  # the block's rows t G + g as (t, g)
            copy_into(out_g[:, h0:h1, i0:i1], o.reshape(*shape, D))  # rounded once
            lse_g[:, h0:h1, i0:i1] = (m + np.log(lsum)).reshape(*shape, 1)

    _by_heads(Hkv, heads, B * G * Tq * Tk)
    return out, lse


def flash_attention_bwd(q, k, v, out, lse, dout, scale):
    """FlashAttention-2's backward: with Di = rowsum(dout * out) (B, H, Tq), each block pair's
    probabilities are recomputed as p = exp(s - lse), then dv += p^T dout, dp = dout v^T, ds = p
    (dp - Di), dq += scale ds k, dk += scale ds^T q, over the same block pairs as the forward, a
    kv head's G query heads together (_grouped's layout: dk and dv sum over the group inside the
    GEMMs). Key blocks are the outer loop, as in attention.cu: a key block's dk, dv are complete
    after one sweep of its query blocks; dq is summed over the key blocks in order. The first
    term of each sum is written, not added to zeros (the same bits, one pass fewer). p and ds
    are kept transposed, (B, H', keys, queries G), as the forward's scores."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    G = H // Hkv if Hkv else 1
    acc = dtypes.compute_dtype(q.dtype)
    scale = acc.type(scale)
    ks, vs = f32(k), f32(v)  # (B, Hkv, Tk, D)
    Di = np.einsum("bhtd,bhtd->bht", f32(dout), f32(out), dtype=acc)[..., None]
    DiT, lseT = (_grouped(a, Hkv, transposed=True)[:, :, 0] for a in (Di, lse[..., None]))
    qT = _grouped(q, Hkv, scale, transposed=True)  # (B, Hkv, D, Tq G); DiT, lseT (B, Hkv, Tq G)
    doT = _grouped(dout, Hkv, transposed=True)
    qh, dos = _grouped(q, Hkv, scale), _grouped(dout, Hkv)  # (B, Hkv, Tq G, D)
    dq = np.empty(qh.shape, dtype=acc)  # set by key block 0 (every query sees key 0)
    # dk, dv: set by each key block's first query block; no queries (Tq = 0): zeros, as the
    # CUDA kernel writes them
    alloc = np.zeros if Tq * G == 0 else np.empty
    dk, dv = alloc(k.shape, dtype=acc), alloc(v.shape, dtype=acc)

    bq, bk = spec.FLASH_BQ, spec.FLASH_BK

    def heads(h0, h1):
        # Query blocks are taken a few at a time (span queries), as many as keep p^T and ds^T
        # (B, H', bk, span G) near CHUNK elements: fewer, larger GEMMs (NumPy calls BLAS once
        # per head and pair). The queries are independent, so only dk and dv's sums change
        # order.
        span = bq * max(1, CHUNK // max(1, B * (h1 - h0) * G * bk * bq))  # B = 0: no work
        for j0 in range(0, Tk, bk):
            kj, vj = ks[:, h0:h1, j0 : j0 + bk], vs[:, h0:h1, j0 : j0 + bk]
            dkj, dvj = dk[:, h0:h1, j0 : j0 + bk], dv[:, h0:h1, j0 : j0 + bk]
            first = max(0, j0 - (Tk - Tq)) // bq * bq  # the first query block
            for i0 in range(first, Tq, span):  # that sees key j0
                i1 = min(i0 + span, Tq)
                cols = slice(i0 * G, i1 * G)  # the queries [i0, i1) in the group's G heads
                n = _keys_end(Tq, Tk, i1, j0) - j0  # the keys it sees
                pT = np.matmul(kj[..., :n, :], qT[:, h0:h1, :, cols])  # (B, H', n, span G)
                dsT = np.matmul(vj[..., :n, :], doT[:, h0:h1, :, cols])  # dp^T
                _probs_dscores(pT, dsT, lseT, DiT, h0, i0 * G, j0, Tk - Tq + i0, G)
                if j0 == 0:
                    np.matmul(dsT.swapaxes(-1, -2), kj[..., :n, :], out=dq[:, h0:h1, cols])
                else:
                    dq[:, h0:h1, cols] += np.matmul(dsT.swapaxes(-1, -2), kj[..., :n, :])
                doi, qi = dos[:, h0:h1, cols], qh[:, h0:h1, cols]  # qi carries the scale
                if i0 == first:
                    np.matmul(pT, doi, out=dvj[..., :n, :])
                    np.matmul(dsT, qi, out=dkj[..., :n, :])
                    dvj[..., n:, :] = 0
                    dkj[..., n:, :] = 0
                else:
                    dvj[..., :n, :] += np.matmul(pT, doi)
                    dkj[..., :n, :] += np.matmul(dsT, qi)
        dq[:, h0:h1] *= scale

    _by_heads(Hkv, heads, B * G * Tq * Tk)
    dq_heads = np.empty(q.shape, dtype=q.dtype)
    copy_into(_by_group(dq_heads, Hkv), dq.reshape(B, Hkv, Tq, G, D))  # rounded once
    return dq_heads, rounded(dk, k.dtype), rounded(dv, v.dtype)
