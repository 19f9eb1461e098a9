"""Causal attention in blocks (FlashAttention-2): the scores of a (query block, key block) pair
live only while that pair is worked on, and the key blocks wholly after a query block are
skipped. Grouped-query attention: k, v (and dk, dv) have Hkv heads, a divisor of q's H, query head
h reading kv head h // (H / Hkv): FLOPs count per query head, bytes count k and v as they are.
Query i is at position Tk - Tq + i (Tq < Tk: a KV-cache decode step or a prompt after one).

Per computed score (flash_scores): forward QK^T and PV (2D + 2D) + 5 for the online softmax;
backward QK^T again, dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q (5 x 2D) + 4 for P and dS.

cpu.py: each block pair a few batched BLAS GEMMs over a range of heads with a compiled pass
between them, a decode step one compiled (batch, head, query) row per program; cuda.py +
attention.cu: one block per (tile of queries or keys, head), the tiles in shared memory.
"""

from ..record import kernel, like, per_row

# The blocks of queries and of keys. FLOPs count the scores these blocks compute, so both
# backends use them: cpu.py, and attention.cu's tile<float> (64).
FLASH_BQ = 64
FLASH_BK = 64


def flash_scores(q, k):
    """Scores the flash kernels compute for q (B, H, Tq, D), k (B, Hkv, Tk, D): each block of
    FLASH_BQ queries of each of the H query heads against the keys up to its last query's
    position (per query head: grouped-query attention, Hkv < H, computes as many as Hkv = H).
    The masked corner of each diagonal block is computed and counted; the key blocks after a
    query block are skipped and not counted."""
    (B, H, Tq, _), Tk, bq = q.shape, k.shape[-2], FLASH_BQ
    return B * H * sum(min(bq, Tq - i) * (Tk - Tq + min(i + bq, Tq)) for i in range(0, Tq, bq))


@kernel(
    shape=lambda q, k, v, scale: (like(q), per_row(q)),
    flops=lambda r, q, k, *a: (4 * q.shape[-1] + 5) * flash_scores(q, k),
    exps=lambda r, q, k, *a: flash_scores(q, k),
)
def flash_attention_fwd(q, k, v, scale):
    """q (B, H, Tq, D), k and v (B, Hkv, Tk, D), Tk >= Tq, H a multiple of Hkv -> out
    (B, H, Tq, D) = softmax(scale q k^T, future keys masked) v with query head h against kv head
    h // (H / Hkv), and lse (B, H, Tq) fp32 (fp64 for fp64), saved for backward."""


@kernel(
    shape=lambda q, k, v, out, lse, dout, scale: (like(q), like(k), like(v)),
    flops=lambda r, q, k, *a: (10 * q.shape[-1] + 4) * flash_scores(q, k),
    exps=lambda r, q, k, *a: flash_scores(q, k),  # P recomputed from lse
)
def flash_attention_bwd(q, k, v, out, lse, dout, scale):
    """-> dq (B, H, Tq, D), dk and dv (B, Hkv, Tk, D) (summed over the query heads of each kv
    head) of flash_attention_fwd, from its inputs, its out and lse, and dout."""
