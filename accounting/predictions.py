"""Predictions of the accounting report from a configuration alone, GPT-2's or Llama's (no
model is built):
parameter counts by piece, GEMM and attention FLOPs, persistent training state, per-step
collectives, saved activations and the peak of a training step under each memory trade, and
the largest batch that fits a memory budget. accounting/report.py prints them beside what a real
step measured.
"""

import re

from nn import ExecutionOptions, GPT2Config, LlamaConfig
from tinygrad_like import dtypes, losses


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


# ---------------------------------------------------------------- saved bytes and the peak
#
# What the memory tracker counts in a training step (tinygrad_like/memory.py): every buffer a
# kernel makes or fills, while it is alive; a buffer the tape's records save is an activation
# until the record that saved it last is freed. The peak is the largest sum of them, on top of
# the persistent state, at some moment of the step; which moment depends on the options and the
# shapes, so the prediction lists the candidates (step_moments), each as the tensors alive at
# that moment, one line per tensor, and takes the largest. The family-specific part is what one
# block saves and what its backward holds, with what its embeddings and final norm save
# (_gpt2, _llama: one function per family in FAMILIES); the rest (the LM head and the loss,
# recomputation, the persistent state, the moments' bookkeeping) is any decoder's.
# Shapes: N = B·T rows, C channels, H heads, Vp the padded vocabulary, s the dtype's itemsize.


def _attention_saves(attention, out_proj, x, probs, B, H, T):
    """What attention keeps beyond q, k, v, and what its output projection (out_proj) saves:
    the probabilities (naive) or its output and lse (flash); the projection's input, a
    contiguous copy of that output unless (B, T, H, D) is a view of (B, H, T, D). x: the bytes
    of one (B, T, C) tensor, probs: of the (B, H, T, T) probabilities."""
    if attention == "naive":
        saved = [("attention: the probabilities (B, H, T, T)", probs)]
    else:
        saved = [("attention: its output (B, H, T, D), the lse (B, H, T) fp32", x + B * H * T * 4)]
    if attention == "naive" or (T > 1 and H > 1):
        saved += [(f"{out_proj}: its input, attention's output made contiguous (B, T, C)", x)]
    return saved


def _gpt2(config, batch_size, seq_len, size, attention):
    """GPT-2's part (nn/gpt2.py): (inputs, saved, moments, final_norm).
    inputs and final_norm: (what, bytes) the embeddings and ln_f save.
    saved: [(what, bytes)], what one block's records save for its backward (a buffer saved by
    two records counts once).
    moments: {name: (freed, extra, holds_upstream, copied)} for each moment of the last block's
    backward that may be the step's largest: bytes of `saved` released by then, the gradients
    alive then [(what, bytes)], whether the backward itself still holds the (B, T, C)
    gradient that came in, and whether the first residual's summed gradient is still in use
    (then, recomputing, the checkpoint's input leaf holds its own copy of it too). The other
    moments hold less: after mlp.c_proj the gradients are no larger, and the activations fall
    by more than they grow."""
    B, T, C, H = batch_size, seq_len, config.n_embd, config.n_head
    N = B * T
    x, stats = N * C * size, 2 * N * 4  # one (B, T, C) tensor; a layernorm's fp32 mean, rstd
    probs = B * H * T * T * size  # (B, H, T, T)
    saved = [("ln_1: its input x (B, T, C), mean and rstd (B, T) fp32", x + stats)]
    saved += [("c_attn: its input, ln_1's output (B·T, C)", x)]
    saved += [("attention: q, k, v, views of c_attn's output (B·T, 3C)", 3 * x)]
    saved += _attention_saves(attention, "attn.c_proj", x, probs, B, H, T)
    saved += [
        ("ln_2: its input (B, T, C), mean and rstd", x + stats),
        ("mlp.c_fc: its input, ln_2's output (B·T, C)", x),
        ("gelu: its input, c_fc's output (B·T, 4C)", 4 * x),
        ("mlp.c_proj: its input, gelu's output (B·T, 4C)", 4 * x),
    ]
    moments = {
        "the last block's backward: mlp.c_proj": (
            0,
            [
                ("mlp.c_proj's dx (B·T, 4C)", 4 * x),
                ("mlp.c_proj's dW (4C, C)", 4 * C * C * size),
                ("mlp.c_proj's db (C,)", C * size),
            ],
            True,  # the residual add passed it on to both its inputs
            False,
        )
    }
    if attention == "naive":  # grows with T²; the flash backward's blocks are not tracked
        moments["the last block's backward: attention"] = (
            11 * x + stats,  # the MLP's, ln_2's and c_proj's saved tensors
            [
                ("the residual stream's gradient, summed (B, T, C)", x),
                ("attn.c_proj's dx, the attention's upstream gradient (B, T, C)", x),
                ("dprobs and dscores (B, H, T, T)", 2 * probs),
                ("dq, dk, dv (B, H, T, D)", 3 * x),
            ],
            False,
            False,
        )
    inputs = ("the embeddings' ids (B, T) and positions (T,), int64", 8 * (N + T))
    final_norm = ("ln_f: its input (B, T, C), mean and rstd (B, T) fp32", x + stats)
    return inputs, saved, moments, final_norm


def _llama(config, batch_size, seq_len, size, attention):
    """Llama's part (nn/llama.py), as _gpt2's: (inputs, saved, moments, final_norm). Rotary
    and the residual adds save nothing; its backward may peak at down_proj, at the SwiGLU
    (dgate and dup beside gate and up, when B·T > C), at naive attention, or with an MLP
    narrower than C at gate_proj and up_proj or o_proj (their dx beside a small dW); the other
    moments hold less (measured on random shapes of every option, tests/test_predictions.py)."""
    B, T, C, H = batch_size, seq_len, config.n_embd, config.n_head
    N, kv, Fw = B * T, config.n_kv_head * config.head_dim, config.intermediate_size
    x, rstd = N * C * size, N * 4  # one (B, T, C) tensor; an RMSNorm's fp32 rstd (B, T)
    f = N * Fw * size  # one (B, T, F) tensor
    probs = B * H * T * T * size  # (B, H, T, T)
    saved = [("input_layernorm: its input x (B, T, C), rstd (B, T) fp32", x + rstd)]
    saved += [("q/k/v_proj: their input, the norm's output (B·T, C)", x)]
    saved += [("attention: q after rotary (B, H, T, D)", x)]
    saved += [("attention: k after rotary, v (B, Hkv, T, D)", 2 * N * kv * size)]
    saved += _attention_saves(attention, "o_proj", x, probs, B, H, T)
    saved += [
        ("post_attention_layernorm: its input (B, T, C), rstd", x + rstd),
        ("gate/up_proj: their input, the norm's output (B·T, C)", x),
        ("swiglu: gate and up, the projections' outputs (B·T, F) each", 2 * f),
        ("down_proj: its input, swiglu's output (B·T, F)", f),
    ]
    moments = {
        "the last block's backward: down_proj": (
            0,
            [("down_proj's dx (B·T, F)", f), ("down_proj's dW (C, F)", C * Fw * size)],
            True,  # the residual add passed it on to both its inputs
            False,
        ),
        "the last block's backward: swiglu": (
            f,  # down_proj's input
            [("down_proj's dx (B·T, F)", f), ("swiglu's dgate and dup (B·T, F) each", 2 * f)],
            True,
            False,
        ),
        "the last block's backward: gate_proj and up_proj": (  # the largest when F is small
            3 * f,  # swiglu's and down_proj's saved tensors
            [
                ("the first projection's dx (B·T, C)", x),
                ("the second's dx (B·T, C)", x),
                ("the second's upstream gradient, dgate or dup (B·T, F)", f),
                ("the second's dW (F, C)", Fw * C * size),
            ],
            True,
            False,
        ),
        "the last block's backward: o_proj": (  # the largest when F is small beside C
            sum(b for _, b in saved[-4:]),  # the norm's and the MLP's saved tensors
            [
                ("the residual stream's gradient, summed (B, T, C)", x),
                ("o_proj's dx (B·T, C)", x),
                ("o_proj's dW (C, C)", C * C * size),
            ],
            False,
            True,
        ),
    }
    if attention == "naive":  # grows with T²; the flash backward's blocks are not tracked
        moments["the last block's backward: attention"] = (
            sum(b for _, b in saved[5:]),  # o_proj's, the norm's and the MLP's saved tensors
            [
                ("the residual stream's gradient, summed (B, T, C)", x),
                ("o_proj's dx, the attention's upstream gradient (B, T, C)", x),
                *([("that gradient copied to q's groups (B, Hkv, G·T, D)", x)] * (kv < C)),
                ("dprobs and dscores (B, H, T, T)", 2 * probs),
                ("dq (B, H, T, D)", x),
                ("dk, dv (B, Hkv, T, D)", 2 * N * kv * size),
            ],
            False,
            False,
        )
    inputs = ("the embedding's ids (B, T), int64", 8 * N)
    final_norm = ("norm: its input (B, T, C), rstd (B, T) fp32", x + rstd)
    return inputs, saved, moments, final_norm


FAMILIES = {GPT2Config: _gpt2, LlamaConfig: _llama}  # config class -> its part of the predictions


def _family(config, batch_size, seq_len, size, attention):
    return FAMILIES[type(config)](config, batch_size, seq_len, size, attention)


def _loss_chain(dtype, world):
    """The 0-d fp32 arrays the ops the step runs on the loss before backward (optim/step.py)
    save: the division by the ranks (world > 1) its array operand, the fp16 loss scale both
    (the loss and the scale, a device array: optim/scaler.py)."""
    return (world > 1) + 2 * (dtypes.as_dtype(dtype) == dtypes.float16)


def predicted_activation_bytes(config, seq_len, dtype, options):
    """Bytes saved for backward per token per layer under ACTIVATION_CONVENTION, for the
    model's ExecutionOptions."""
    size = dtypes.as_dtype(dtype).itemsize
    if options.recompute:
        return config.n_embd * size
    saved = _family(config, 1, seq_len, size, options.attention)[1]
    return sum(b for _, b in saved) // seq_len


def predicted_head_bytes(config, tokens, dtype, options):
    """Bytes the LM head and the loss save for backward, for `tokens` tokens (HEAD_CONVENTION)."""
    size, C, Vp = dtypes.as_dtype(dtype).itemsize, config.n_embd, config.padded_vocab_size
    if options.lm_head == "plain":
        return tokens * ((C + Vp) * size + 4 + 8)
    if options.lm_head_design == "recompute":
        return tokens * (C * size + 4 + 8)
    return 4 * tokens * C + 4 * Vp * C


def _saved_lines(config, batch_size, seq_len, dtype, options, world=1):
    """[(what, bytes)]: everything the tape holds at the end of a forward."""
    B, T, size = batch_size, seq_len, dtypes.as_dtype(dtype).itemsize
    N, C, L = B * T, config.n_embd, config.n_layer
    inputs, saved, _, final_norm = _family(config, B, T, size, options.attention)
    block = sum(b for _, b in saved)
    return [
        inputs,
        (f"{L} blocks", L * (N * C * size if options.recompute else block)),
        final_norm,
        ("the LM head and the loss", predicted_head_bytes(config, N, dtype, options)),
        ("the loss's 0-d fp32 ops (divided by the ranks, scaled)", 4 * _loss_chain(dtype, world)),
    ]


def predicted_saved_bytes(config, batch_size, seq_len, dtype, options, world=1):
    """Everything the tape holds at the end of a forward: the blocks, the head and loss, ln_f's
    input and stats, the embeddings' int64 ids (wte's per token, wpe's per position) and the
    0-d loss the fp16 loss scale (and the division by the ranks) saves."""
    return sum(b for _, b in _saved_lines(config, batch_size, seq_len, dtype, options, world))


def _head_blocks(tokens):
    """The fused head's row blocks (losses._row_blocks) that may hold its largest moment:
    [(index, rows)]: the first, the last full one and the last (the blocks before each keep
    their losses, so among the full ones after the first the last holds the most)."""
    R = losses.HEAD_BLOCK_ROWS
    n = -(-tokens // R)
    last_full = tokens // R - 1
    return [(k, min(R, tokens - k * R)) for k in sorted({0, max(last_full, 0), n - 1})]


def _precompute_head(before_head, all_saved, loss, upstream, N, C, Vp, size, bf16):
    """The fused head in its precompute design: each forward block's logits in fp32 (bf16 in
    bf16: the kernel widens them a few rows at a time, its scratch no buffer of the tracker's),
    made its dlogits in place, then its dX rows and dW share (after block 0 added into the fp32
    sum by the dW GEMM itself, a bf16 share rounded and cast in its epilogue: no (Vp, C)
    temporary); its backward only scales what it saved (and rounds it, fp16 and bf16)."""
    moments = {}
    for k, r in _head_blocks(N):
        common = before_head + [
            ("the head's input, the final norm's output (B·T, C)", N * C * size),
            ("the mean's 1 / count, the unit dloss (1,) fp32", 4),
            ("the losses of the blocks before (rows,) fp32", 4 * k * losses.HEAD_BLOCK_ROWS),
            ("dW so far (Vp, C) fp32", 4 * Vp * C if k else 0),
        ]
        if size < 4 and not bf16:  # fp16: the logits GEMM's output, cast to fp32
            moments[f"the fused head's forward, block {k}: the logits' cast"] = common + [
                ("dX (B·T, C) fp32, made by block 0's first copy", 4 * N * C if k else 0),
                ("the block's logits (rows, Vp)", r * Vp * size),
                ("the block's logits (rows, Vp) fp32", 4 * r * Vp),
            ]
        after = common + [
            ("dX (B·T, C) fp32", 4 * N * C),
            ("the block's losses (rows,) fp32", 4 * r),
            ("the block's logits, now its dlogits (rows, Vp)", r * Vp * (2 if bf16 else 4)),
        ]
        # block 0's share is the sum; a later block's is added by its GEMM
        share = [("block 0's dW share (Vp, C) fp32", 0 if k else 4 * Vp * C)]
        moments[f"the fused head's forward, block {k}: dX rows"] = after + [
            ("the block's dX rows (rows, C), before their copy", r * C * (2 if bf16 else 4))
        ]
        moments[f"the fused head's forward, block {k}: dW"] = after + share
    moments["the fused head's forward: the loss"] = before_head + [
        ("the head's input, the final norm's output (B·T, C)", N * C * size),
        ("the mean's 1 / count, the unit dloss (1,) fp32", 4),
        ("dX (B·T, C) and dW (Vp, C) fp32", 4 * (N + Vp) * C),
        ("the losses (B·T,) fp32 and their concatenation", 8 * N),
        ("their sum, 0-d fp32", 4),
    ]
    if size < 4:  # the saved fp32 gradients times the upstream one, rounded to the dtype
        moments["the fused head's backward: rounding"] = (
            all_saved + loss + upstream + [("dX and dW in the dtype", (N + Vp) * C * size)]
        )
    return moments


def _recompute_head(all_saved, scalars, N, C, Vp, size):
    """The fused head in its recompute design: each backward block's logits again, their
    dlogits, its dX rows and its dW share, summed in fp32 (block 0's share cast to it, a later
    block's added, by the dW GEMM's epilogue)."""
    moments = {}
    for k, r in _head_blocks(N)[:2]:  # the first, and the largest after it
        common = (
            all_saved
            + scalars
            + [
                ("dx (B·T, C), made by block 0's first copy", N * C * size),
                ("the block's logits and dlogits (rows, Vp)", 2 * r * Vp * size),
            ]
        )
        moments[f"the fused head's backward, block {k}: dX rows"] = common + [
            ("the block's dX rows (rows, C), before their copy", r * C * size),
            ("dW so far (Vp, C) fp32", 4 * Vp * C if k else 0),
        ]
        moments[f"the fused head's backward, block {k}: dW"] = common + [
            # a later block's share is added into the sum by its GEMM (its epilogue)
            ("dW so far, or block 0's share, (Vp, C) fp32", 4 * Vp * C),
        ]
    moments["the fused head's backward: dW rounded to the weights' dtype"] = (
        all_saved
        + scalars
        + [
            ("dx (B·T, C)", N * C * size),
            ("dW (Vp, C) fp32", 4 * Vp * C),
            ("dW rounded (Vp, C)", Vp * C * size if size < 4 else 0),
        ]
    )
    return moments


def _plain_head(before_head, all_saved, scalars, loss, N, C, Vp, size):
    """The plain head: the loss's backward makes dlogits beside the logits, then the head's
    GEMMs its dx and dW once the logits are freed."""
    x = N * C * size
    return {
        "the loss's backward: dlogits": all_saved
        + scalars
        + [("dlogits (B·T, Vp)", N * Vp * size)],
        "the LM head's backward: dW": before_head
        + loss
        + [
            ("the head's input, the final norm's output (B·T, C)", x),
            ("dlogits (B·T, Vp)", N * Vp * size),
            ("the head's dx (B·T, C)", x),
            ("the head's dW (Vp, C)", Vp * C * size),
        ],
    }


def _block_moments(config, B, T, size, options, ids, loss):
    """The last block's backward (its family's moments), beside the other blocks'
    saved tensors; under recomputation inside its checkpoint's backward (autograd.Checkpoint),
    which also holds the recomputed output and the gradient that came in."""
    x, C, L = B * T * config.n_embd * size, config.n_embd, config.n_layer
    _, block_saved, moments, _ = _family(config, B, T, size, options.attention)
    block = sum(b for _, b in block_saved)
    out = {}
    for name, (freed, extra, holds_upstream, copied) in moments.items():
        lines = [
            ids,
            (f"the other {L - 1} blocks' saved", (L - 1) * (x if options.recompute else block)),
        ]
        lines += [("the last block's saved tensors not yet released", block - freed)]
        if options.recompute:
            lines += [
                ("the recomputed block's output (B, T, C)", x),
                ("the final norm's last gradient (C,), the outer loop's", C * size),
            ]
        if holds_upstream or options.recompute:
            lines += [("the block's upstream gradient, the final norm's dx (B, T, C)", x)]
        if copied and options.recompute:  # autograd._accumulate_leaf
            lines += [("the checkpoint's input's gradient, a copy of the summed one", x)]
        out[name] = lines + extra + loss
    return out


def step_moments(config, batch_size, seq_len, dtype, options, zero=0, world=1):
    """{moment: [(what, bytes)]}: the moments of a training step at which the tracker's total
    may peak, each as the tensors alive then, the persistent state first (on each of `world`
    ranks at ZeRO stage `zero`); measure._step_peak's peak is the largest sum. The loss is a 0-d
    fp32 tensor the step holds through the backward; the ones the first backward starts from
    are a host copy, no kernel's, so the tracker does not see them.
    Left out, as smaller than a listed one: the forward of the blocks and of the plain head (the
    loss's backward holds all it saved and more), ln_f's backward (mlp.c_proj's holds more),
    the embeddings' backward (wte's (Vp, C) gradient, less than any head moment's), the
    optimizer's step (nothing but the state). A kernel's own scratch (a NumPy temporary inside
    it, the flash backward's blocks) is no buffer the tracker sees; dropout (0 in every preset)
    is not counted. Exact for the tracker on every shape measured (tests/test_predictions.py:
    GPT-2 and Llama on one rank; the 7B's rank 0 of 8 under ZeRO-1 and ZeRO-2, counted on the
    meta device)."""
    B, T = batch_size, seq_len
    size, fp16 = dtypes.as_dtype(dtype).itemsize, dtypes.as_dtype(dtype) == dtypes.float16
    N, C, Vp = B * T, config.n_embd, config.padded_vocab_size
    state = [
        (f"persistent {tag}", stored_elements(config) * b)
        for tag, b in predicted_state_bytes(dtype, zero, world).items()
    ]
    if zero == 2:  # what the backward accumulates into, from zero_grad to the reduce-scatter
        state += [("the full gradient buffer (ZeRO-2)", stored_elements(config) * size)]
    saved = _saved_lines(config, B, T, dtype, options, world)
    before_head, all_saved = saved[:3], saved[:4]  # the chain's scalars: counted below
    loss = [  # alive until the backward is done (the loss's record holds the 1 / count)
        ("the loss (and the fp16 scaled loss), 0-d fp32", 4 * (1 + fp16)),
        ("the mean's 1 / count, 0-d fp32 (losses.inverse_count)", 4),
    ]
    upstream = [("the head's upstream gradient, 0-d fp32", 4)] if _loss_chain(dtype, world) else []
    scalars = loss + upstream + [("dloss = upstream / count, 0-d fp32", 4)]
    if options.lm_head == "plain":
        moments = _plain_head(before_head, all_saved, scalars, loss, N, C, Vp, size)
    elif options.lm_head_design == "precompute":
        bf16 = dtypes.as_dtype(dtype) == dtypes.bfloat16
        moments = _precompute_head(before_head, all_saved, loss, upstream, N, C, Vp, size, bf16)
    else:
        moments = _recompute_head(all_saved, scalars, N, C, Vp, size)
    moments.update(_block_moments(config, B, T, size, options, saved[0], loss))
    return {name: state + lines for name, lines in moments.items()}


def predicted_peak(config, batch_size, seq_len, dtype, options, zero=0, world=1):
    """-> (moment, bytes): the largest moment of step_moments, the tracker's peak over a step
    (the persistent state on each of `world` ranks at ZeRO stage `zero`, predicted_state_bytes,
    with the tensors alive then)."""
    moments = step_moments(config, batch_size, seq_len, dtype, options, zero, world)
    totals = {name: sum(b for _, b in lines) for name, lines in moments.items()}
    at = max(totals, key=totals.get)
    return at, totals[at]


def predicted_peak_bytes(config, batch_size, seq_len, dtype, options, zero=0, world=1):
    """The tracker's peak over a step (predicted_peak's bytes)."""
    return predicted_peak(config, batch_size, seq_len, dtype, options, zero, world)[1]


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


def largest_batch(config, seq_len, dtype, budget_bytes, options, zero=0, world=1):
    """The largest batch at seq_len whose predicted peak fits the budget (0 if none); under
    ZeRO the budget is each rank's, against each rank's persistent state."""

    def fits(b):
        peak = predicted_peak_bytes(config, b, seq_len, dtype, options, zero, world)
        return peak <= budget_bytes

    lo, hi = 0, 1
    while fits(hi) and hi < 1 << 20:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
