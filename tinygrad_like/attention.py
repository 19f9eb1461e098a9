"""Causal scaled-dot-product attention as one tape record, in two designs: Attention (the
(Tq, Tk) probabilities saved) and FlashAttention (blocks; one log-sum-exp per query saved).
scaled_dot_product_attention, at the end (functional.py exports it), checks the operands in
PyTorch's words and picks one.
"""

import builtins
import math

import numpy as np

from . import backend
from .autograd import Function
from .functions import _meta, _reshape, _unbroadcast
from .kernels import launch


def _attention_inputs(ctx, q, k, v):
    """q (..., H, Tq, D), k and v (..., Hkv, Tk, D), as scaled_dot_product_attention checked
    them -> q (B, H, Tq, D), k and v (B, Hkv, Tk, D), the shapes the kernels take: missing dims
    read as 1, the leading dims (ctx.lead) merged into B. An operand broadcast along a leading
    dim, or a q of one head against several kv heads, is copied out to its full shape (one
    counted copy; _attention_grads sums its gradient back). Kv heads are never repeated: H is a
    multiple of Hkv, the grouped-query attention the kernels run. The (B, H, T, D) views a
    model passes go through as they are."""
    ctx.metas = _meta(q), _meta(k), _meta(v)
    n = builtins.max(q.ndim, k.ndim, v.ndim, 3)
    q, k, v = (a.reshape((1,) * (n - a.ndim) + a.shape) for a in (q, k, v))
    leads = q.shape[:-3], k.shape[:-3], v.shape[:-3]
    ctx.lead = leads[0] if leads[0] == leads[1] == leads[2] else np.broadcast_shapes(*leads)
    Hkv = builtins.max(k.shape[-3], v.shape[-3])
    H = Hkv if q.shape[-3] == 1 else q.shape[-3]  # one head broadcast, or a multiple of Hkv

    def full(a, heads):
        shape = ctx.lead + (heads,) + a.shape[-2:]
        if a.shape != shape:  # dst[...] = a broadcasts; counted as a read of a, a write of dst
            a = launch("copy", backend.of(a).empty(shape, a.dtype), a)
        batched = (math.prod(ctx.lead), heads) + a.shape[-2:]
        return a if a.shape == batched else _reshape(a, batched)

    q, k, v = full(q, H), full(k, Hkv), full(v, Hkv)
    ctx.shapes = q.shape, k.shape, v.shape
    ctx.out_shape = (ctx.lead + q.shape[1:])[-builtins.max(len(m[0]) for m in ctx.metas) :]
    return q, k, v


def _attention_out(ctx, out):
    """out (B, H, Tq, D) -> in the inputs' leading dims (*lead, H, Tq, D)."""
    return out if out.shape == ctx.out_shape else out.reshape(ctx.out_shape)


def _attention_grads(ctx, *grads):
    """dq, dk, dv (in any shape holding _attention_inputs' (B, heads, T, D)) -> each in its
    operand's shape and dtype, summed over the dims the operand was broadcast along."""
    result = []
    for g, full, (shape, dtype) in zip(grads, ctx.shapes, ctx.metas):
        broadcast = g.size != math.prod(shape)
        result.append(
            _unbroadcast(_reshape(g, ctx.lead + full[1:] if broadcast else shape), shape, dtype)
        )
    return tuple(result)


class Attention(Function):
    """Causal scaled-dot-product attention, fused into one tape record: q (B, H, Tq, D), k and v
    (B, Hkv, Tk, D) (see _attention_inputs for other shapes), Tk >= Tq (Tk > Tq when decoding
    with a KV cache). Grouped-query attention: kv head j serves the G = H / Hkv query heads
    j G ... j G + G - 1, whose queries, one head after another, are the (G Tq) rows of one GEMM
    against it (no repeated k, v; the backward's dk and dv sum over the group inside their
    GEMMs). Saves q, k, v and the probabilities (B, H, Tq, Tk). Masked scores are computed, not
    skipped: forward 4*Tq*Tk*D FLOPs per query head, backward twice that, whatever Hkv."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        q, k, v = _attention_inputs(ctx, q, k, v)
        (B, H, Tq, D), (Hkv, Tk) = q.shape, k.shape[1:3]
        ctx.scale, ctx.heads = scale, (B, H, Tq, Tk)
        # (B, Hkv, G Tq, D): a view of a contiguous q; a counted copy when G > 1 of a transposed
        # one ((B, T, H, D) -> (B, H, T, D), as models make them)
        qg = _reshape(q, (B, Hkv, (H // Hkv if Hkv else 1) * Tq, D))
        scores = launch("matmul_nt", qg, k)  # (B, Hkv, G Tq, Tk)
        probs = launch("softmax_causal_fwd", scores.reshape(ctx.heads), scale)  # (B, H, Tq, Tk)
        probs = probs.reshape(scores.shape)
        ctx.save_for_backward(qg, k, v, probs)
        return _attention_out(ctx, launch("matmul", probs, v).reshape(q.shape))

    @staticmethod
    def backward(ctx, g):
        qg, k, v, probs = ctx.saved
        g = _reshape(g, qg.shape)  # (B, Hkv, G Tq, D), a copy as q's when G > 1
        dprobs = launch("matmul_nt", g, v)  # (B, Hkv, G Tq, Tk)
        dv = launch("matmul_tn", probs, g)  # (B, Hkv, Tk, D), summed over the group
        dscores = launch(
            "softmax_causal_bwd", probs.reshape(ctx.heads), dprobs.reshape(ctx.heads), ctx.scale
        ).reshape(probs.shape)
        dq = launch("matmul", dscores, k)  # (B, Hkv, G Tq, D)
        dk = launch("matmul_tn", dscores, qg)  # (B, Hkv, Tk, D), summed over the group
        return _attention_grads(ctx, dq, dk, dv) + (None,)


class FlashAttention(Function):
    """Attention's function in blocks (FlashAttention-2): q (B, H, Tq, D), k and v
    (B, Hkv, Tk, D), Tk >= Tq, grouped-query as Attention (the kernels read kv head h // G for
    query head h). The (Tq, Tk) scores never exist beyond one block pair; the record saves q, k,
    v, the output and one log-sum-exp per query (B, H, Tq) fp32, from which the backward
    recomputes each block's probabilities: O(T·D) bytes per head, not O(T²). The key blocks past
    each query block are skipped (FLOPs: contract.flash_scores)."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        q, k, v = _attention_inputs(ctx, q, k, v)
        ctx.scale = scale
        out, lse = launch("flash_attention_fwd", q, k, v, scale)  # (B, H, Tq, D), (B, H, Tq)
        ctx.save_for_backward(q, k, v, out, lse)
        return _attention_out(ctx, out)

    @staticmethod
    def backward(ctx, g):
        g = _reshape(g, ctx.shapes[0])  # (B, H, Tq, D)
        dq, dk, dv = launch("flash_attention_bwd", *ctx.saved, g, ctx.scale)
        return _attention_grads(ctx, dq, dk, dv) + (None,)


def scaled_dot_product_attention(q, k, v, flash=False, scale=None):
    """Causal attention softmax(scale q k^T, future keys masked) v of q (..., H, Tq, D) and k, v
    (..., Hkv, Tk, D), Tk >= Tq -> (..., H, Tq, D); scale defaults to 1 / sqrt(D). Grouped-query
    attention when Hkv < H (a divisor of it; Hkv = 1 is multi-query attention): kv head j
    serves query heads j G ... j G + G - 1, G = H / Hkv (Hugging Face's repeat_kv order),
    without copying k and v G times. The leading dims broadcast (NumPy's rules), and so does a
    q of one head against several kv heads. flash=True runs it in blocks (FlashAttention),
    saving one number per query instead of the probabilities.
    As torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
    enable_gqa=True) when Tq = Tk; by design it differs in that it is
    - always causal, and has no attn_mask and no dropout_p;
    - aligned bottom-right when there are fewer queries than keys: query i is at position
      Tk - Tq + i and sees keys 0 ... Tk - Tq + i (a KV-cache decode step), where PyTorch's
      is_causal aligns the mask top-left (query i sees keys 0 ... i);
    - grouped-query whenever Hkv divides H, as PyTorch's only with enable_gqa=True."""
    shapes = f"attention: q {q.shape}, k {k.shape}, v {v.shape}"
    if min(q.ndim, k.ndim, v.ndim) < 2:
        raise ValueError(f"{shapes}: need q (..., Tq, D) and k, v (..., Tk, D)")
    if q.dtype != k.dtype or k.dtype != v.dtype:
        raise TypeError(f"{shapes}: need one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    H, Hk, Hv = (a.shape[-3] if a.ndim > 2 else 1 for a in (q, k, v))
    Hkv = builtins.max(Hk, Hv)
    try:
        if q.shape[:-3] != k.shape[:-3] or k.shape[:-2] != v.shape[:-2]:  # else none broadcast
            np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
            np.broadcast_shapes(k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(
            f"{shapes}: need leading dims (and k's and v's heads) that broadcast"
        ) from None
    for bad, need in [
        (q.shape[-1] != k.shape[-1], "equal head dims D"),
        (k.shape[-2:] != v.shape[-2:], "k and v of one (Tk, D)"),
        (k.shape[-2] < q.shape[-2], "at least as many keys as queries"),
        (
            H != 1 and (H % Hkv if Hkv else H),
            f"q's {H} heads a multiple of k and v's {Hkv} (grouped-query attention), or 1",
        ),
    ]:
        if bad:
            raise ValueError(f"{shapes}: need {need}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return (FlashAttention if flash else Attention).apply(q, k, v, scale)
