"""Predictions of the accounting report from a configuration alone, GPT-2's or Llama's (no
model is built):
parameter counts by piece, GEMM and attention FLOPs, persistent training state, per-step
collectives, saved activations and the peak of a training step under each memory trade, and
the largest batch that fits a memory budget. training/report.py prints them beside what a real
step measured.
"""

import re
from dataclasses import replace

import tinygrad_like.ops as F
from nn import ExecutionOptions, LlamaConfig
from tinygrad_like import dtypes


def parameter_pieces(config):
    """[(key, piece, shape, parameters)]: the rows of ACCOUNTING.md's table for this config."""
    if isinstance(config, LlamaConfig):
        return _llama_pieces(config)
    V, P, L, C = config.vocab_size, config.n_positions, config.n_layer, config.n_embd
    block = [
        ("qkv", "per block: QKV projection", f"{C:,} x {3 * C:,} + {3 * C:,}", 3 * C * C + 3 * C),
        ("attn_out", "per block: attention output", f"{C:,} x {C:,} + {C:,}", C * C + C),
        ("mlp_up", "per block: MLP up", f"{C:,} x {4 * C:,} + {4 * C:,}", 4 * C * C + 4 * C),
        ("mlp_down", "per block: MLP down", f"{4 * C:,} x {C:,} + {C:,}", 4 * C * C + C),
        ("block_ln", "per block: two layernorms", f"4 x {C:,}", 4 * C),
    ]
    per_block = sum(row[3] for row in block)
    rows = [
        ("wte", "token embedding (tied with the LM head)", f"{V:,} x {C:,}", V * C),
        ("wpe", "position embedding", f"{P:,} x {C:,}", P * C),
        *block,
        ("blocks", f"{L} blocks", f"{L} x {per_block:,}", L * per_block),
        ("ln_f", "final layernorm", f"2 x {C:,}", 2 * C),
    ]
    total = V * C + P * C + L * per_block + 2 * C
    return rows + [("total", "total", "", total)]


def _llama_pieces(config):
    V, L, C, F = config.vocab_size, config.n_layer, config.n_embd, config.intermediate_size
    kv = config.n_kv_head * config.head_dim
    block = [
        (
            "qkv",
            "per block: Q, K, V projections",
            f"{C:,} x ({C:,} + 2 x {kv:,})",
            C * (C + 2 * kv),
        ),
        ("attn_out", "per block: attention output", f"{C:,} x {C:,}", C * C),
        ("mlp_up", "per block: MLP gate and up", f"2 x {C:,} x {F:,}", 2 * C * F),
        ("mlp_down", "per block: MLP down", f"{F:,} x {C:,}", F * C),
        ("block_ln", "per block: two RMSNorms", f"2 x {C:,}", 2 * C),
    ]
    per_block = sum(row[3] for row in block)
    rows = [
        ("wte", "token embedding", f"{V:,} x {C:,}", V * C),
        *block,
        ("blocks", f"{L} blocks", f"{L} x {per_block:,}", L * per_block),
        ("ln_f", "final RMSNorm", f"{C:,}", C),
        ("lm_head", "LM head (untied)", f"{V:,} x {C:,}", V * C),
    ]
    return rows + [("total", "total", "", 2 * V * C + L * per_block + C)]


# which parameter names each piece counts in a built model (per-block pieces: block 0)
_PIECE_NAMES = {
    "wte": r"transformer\.wte\.",
    "wpe": r"transformer\.wpe\.",
    "qkv": r"transformer\.h\.0\.attn\.c_attn\.",
    "attn_out": r"transformer\.h\.0\.attn\.c_proj\.",
    "mlp_up": r"transformer\.h\.0\.mlp\.c_fc\.",
    "mlp_down": r"transformer\.h\.0\.mlp\.c_proj\.",
    "block_ln": r"transformer\.h\.0\.ln_[12]\.",
    "blocks": r"transformer\.h\.",
    "ln_f": r"transformer\.ln_f\.",
    "total": r"",
}
_LLAMA_PIECE_NAMES = {
    "wte": r"model\.embed_tokens\.",
    "qkv": r"model\.layers\.0\.self_attn\.[qkv]_proj\.",
    "attn_out": r"model\.layers\.0\.self_attn\.o_proj\.",
    "mlp_up": r"model\.layers\.0\.mlp\.(gate|up)_proj\.",
    "mlp_down": r"model\.layers\.0\.mlp\.down_proj\.",
    "block_ln": r"model\.layers\.0\.(input|post_attention)_layernorm\.",
    "blocks": r"model\.layers\.",
    "ln_f": r"model\.norm\.",
    "lm_head": r"lm_head\.",
    "total": r"",
}


def count_pieces(parameters):
    """piece key -> parameters counted in the model's own tensors ({name: elements})."""
    llama = any(name.startswith("model.") for name in parameters)
    return {
        key: sum(n for name, n in parameters.items() if re.match(pattern, name))
        for key, pattern in (_LLAMA_PIECE_NAMES if llama else _PIECE_NAMES).items()
    }


def attention_flops_per_token(config, seq_len):
    """Forward FLOPs per token of attention's own GEMMs (QK^T and probs·V) over all layers:
    (masked half computed, as our kernels do; masked half skipped)."""
    computed = 4 * config.n_layer * config.n_embd * seq_len
    return computed, computed // 2


def gemm_flops(config, batch_size, seq_len):
    """Forward FLOPs of one forward pass's GEMMs from the shapes: (2·M·K·N summed over the
    linears, the LM head (over the padded vocabulary Vp) and attention's two GEMMs; the M·N
    fused-bias epilogues)."""
    V, L, C, H = config.padded_vocab_size, config.n_layer, config.n_embd, config.n_head
    B, T = batch_size, seq_len
    M = B * T
    if isinstance(config, LlamaConfig):  # q, k, v, o, gate, up, down; no biases
        kv, F = config.n_kv_head * config.head_dim, config.intermediate_size
        linears = [(C, C), (C, kv), (C, kv), (C, C), (C, F), (C, F), (F, C)]
        biased = 0
    else:
        linears = [(C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)]  # c_attn, c_proj, c_fc, c_proj
        biased = 1
    attention = 2 * (2 * B * H * T * T * (C // H))  # scores and probs·V, every query head
    gemm = L * (sum(2 * M * k * n for k, n in linears) + attention) + 2 * M * C * V
    bias = biased * L * M * sum(n for _, n in linears)
    return gemm, bias


def predicted_state_bytes(dtype, zero=0, world=1):
    """Bytes per parameter of the persistent training state per tracker tag, on each of
    `world` ranks at ZeRO stage `zero`: the working weights and gradients in the training
    dtype, an fp32 master only when that is narrower; ZeRO-1 divides the master, m and v by
    the ranks, ZeRO-2 the gradients too (16; 2 + 2 + 12/R; 2 + (2 + 12)/R)."""
    size = dtypes.as_dtype(dtype).itemsize
    optimizer = 1 / world if zero >= 1 else 1
    return {
        "weights": size,
        "gradients": size / world if zero == 2 else size,
        "master": (4 if size < 4 else 0) * optimizer,
        "adam_m": 4 * optimizer,
        "adam_v": 4 * optimizer,
    }


def predicted_collectives(numel, dtype, zero, world, micro_batches=1):
    """[(collective, what, buffer bytes)] one data-parallel step runs, numel being AdamW's flat
    length (the parameters, padded to R equal shards under ZeRO): the gradients all-reduced
    (ZeRO-0) or reduce-scattered (ZeRO-1/2, the same bytes with the all-gather of the working
    weights that follows), the shards' norm² summed, and (R > 1) the loss (fp64). Gradients
    travel once per step whatever micro_batches is: they accumulate locally first."""
    size = dtypes.as_dtype(dtype).itemsize
    rows = [("reduce_scatter" if zero else "all_reduce", "gradients", numel * size)]
    if zero:
        rows += [("all_reduce", "norm²", 4), ("all_gather", "weights", numel * size)]
    return rows + ([("all_reduce", "loss", 8)] if world > 1 else [])


def predicted_activation_bytes(config, seq_len, dtype, options):
    """Bytes saved for backward per token per layer under ACTIVATION_CONVENTION, for the
    model's ExecutionOptions."""
    size, C, H = dtypes.as_dtype(dtype).itemsize, config.n_embd, config.n_head
    if options.recompute:
        return C * size
    if isinstance(config, LlamaConfig):
        return _llama_activation_bytes(config, seq_len, size, options)
    stats = 2 * 2 * 4  # two layernorms' fp32 mean and rstd
    if options.attention == "flash":
        return 17 * C * size + 4 * H + stats
    return (16 * C + H * seq_len) * size + stats


def _llama_activation_bytes(config, seq_len, size, options):
    """A Llama block's saved bytes per token (report.LLAMA_ACTIVATION_CONVENTION): the two
    RMSNorms' inputs and outputs (4C) and fp32 rstd, q after rotary (C), k after rotary and
    v (2·Hkv·D), o_proj's input (C), the SwiGLU's gate and up and down_proj's input (3F); flash
    adds its output (C) and an fp32 log-sum-exp per head, naive the H·T probabilities."""
    C, H = config.n_embd, config.n_head
    kv, F = config.n_kv_head * config.head_dim, config.intermediate_size
    elements = 6 * C + 2 * kv + 3 * F
    if options.attention == "flash":
        return (elements + C) * size + 4 * H + 2 * 4
    return (elements + H * seq_len) * size + 2 * 4


def predicted_head_bytes(config, tokens, dtype, options):
    """Bytes the LM head and the loss save for backward, for `tokens` tokens (HEAD_CONVENTION)."""
    size, C, Vp = dtypes.as_dtype(dtype).itemsize, config.n_embd, config.padded_vocab_size
    if options.lm_head == "plain":
        return tokens * ((C + Vp) * size + 4 + 8)
    if options.lm_head_design == "recompute":
        return tokens * (C * size + 4 + 8)
    return 4 * tokens * C + 4 * Vp * C


def predicted_saved_bytes(config, batch_size, seq_len, dtype, options):
    """Everything the tape holds at the end of a forward: the blocks, the head and loss, ln_f's
    (Llama: the final norm's) input and stats, and the embeddings' int64 ids (wte's per token,
    GPT-2's wpe's per position)."""
    tokens, size = batch_size * seq_len, dtypes.as_dtype(dtype).itemsize
    blocks = config.n_layer * predicted_activation_bytes(config, seq_len, dtype, options)
    if isinstance(config, LlamaConfig):  # the final RMSNorm's input and rstd; no positions
        ln_f, ids = config.n_embd * size + 4, 8 * tokens
    else:
        ln_f, ids = config.n_embd * size + 2 * 4, 8 * (tokens + seq_len)
    return tokens * (blocks + ln_f) + ids + predicted_head_bytes(config, tokens, dtype, options)


def predicted_peak_bytes(config, batch_size, seq_len, dtype, options, zero=0, world=1):
    """The tracker's peak over a step, from its three parts: the persistent state (16 bytes per
    stored element; on each of `world` ranks at ZeRO stage `zero`, predicted_state_bytes),
    everything saved, and the largest transient. The transient is the plain
    loss's dlogits (as large as the logits, alive beside them), or the fused head's (its
    precompute design's: the recompute design's backward is not modelled) one block of fp32
    logits, which its dlogits overwrite, beside that block's fp32 dW before it is
    summed (from the second block on) or (fp16, bf16) beside the logits GEMM's output while it
    is cast to fp32, before the dW (counted as saved) exists in a single block; with
    recomputation, one block's own activations may be larger. ZeRO-2 also holds the full-size
    gradient buffer the backward accumulates into, beside the shard it keeps."""
    tokens, size = batch_size * seq_len, dtypes.as_dtype(dtype).itemsize
    state = stored_elements(config) * sum(predicted_state_bytes(dtype, zero, world).values())
    if zero == 2:
        state += stored_elements(config) * size
    saved = predicted_saved_bytes(config, batch_size, seq_len, dtype, options)
    Vp = config.padded_vocab_size
    if options.lm_head == "plain":
        transient = tokens * Vp * size
    else:
        rows = min(tokens, F.HEAD_BLOCK_ROWS)  # the first block's dW starts the sum in place
        logits, dw = rows * Vp * 4, 4 * Vp * config.n_embd
        cast = rows * Vp * size if size < 4 else 0
        transient = logits + (max(dw, cast) if tokens > rows else max(0, cast - dw))
    if options.recompute:
        block = predicted_activation_bytes(
            config, seq_len, dtype, replace(options, recompute=False)
        )
        transient = max(transient, tokens * (block - config.n_embd * size))
    return state + saved + transient


def _stored_parameters(config):
    return parameter_pieces(config)[-1][3]


def stored_elements(config):
    """The elements each buffer of the persistent state holds: the parameters and the padding
    rows (wte's; Llama's embedding's and LM head's)."""
    return config.padding_cost()["elements"] + _stored_parameters(config)


OPTION_GRID = [  # the eight combinations of the three trades
    ExecutionOptions(attention=a, lm_head=h, recompute=r)
    for a in ("naive", "flash")
    for h in ("plain", "fused")
    for r in (False, True)
]


def largest_batch(config, seq_len, dtype, budget_bytes, options):
    """The largest batch at seq_len whose predicted peak fits the budget (0 if none)."""

    def fits(b):
        return predicted_peak_bytes(config, b, seq_len, dtype, options) <= budget_bytes

    lo, hi = 0, 1
    while fits(hi) and hi < 1 << 20:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
