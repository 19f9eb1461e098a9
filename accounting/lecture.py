"""The course's reference 7B (lecture 2, ../shared/seeds), its figures by the lecture's own
formulas beside what one real training step measured, for any Llama-family config.

Each row is (figure, the lecture's formula from the config, measured, how they compare). The
lecture counts what a 7B is made of on paper; the measurement counts what the kernels of this
project did and what the memory tracker held. Where a convention differs (the RMSNorm weights
the lecture leaves out, the tensors our tape saves against its 6·d + 3·d_ff per layer), the
row says which and by how much. On the meta device (scripts/report.py --device meta) the
measured column is the same step's counts without a byte allocated: the 7B runs here.
"""

import math

from tinygrad_like import dtypes
from tinygrad_like.profiler import GEMMS, PHASES

from .tables import table, wrap

MICRO_BATCH_TOKENS = 32_768  # the lecture's micro-batch (B = 8, S = 4096) for the loss tensor


def paper_parameters(c):
    """N as the lecture counts it: each layer's weights without its two RMSNorms (Q and O d x d,
    K and V d x Hkv·D, gate, up and down d x d_ff), two V x d embeddings, no final norm."""
    return c.n_layer * (c.layer_parameters() - 2 * c.hidden_size) + 2 * c.vocab_size * c.hidden_size


def lecture_activation_bytes_per_token(c, itemsize=2):
    """The lecture's convention: (6·d_model + 3·d_ff) values saved per layer per token."""
    return (6 * c.hidden_size + 3 * c.intermediate_size) * itemsize * c.n_layer


def _gb(nbytes):
    return f"{nbytes / 1e9:,.2f} GB"


def _fit(free_bytes, per_token):
    return f"{max(0, free_bytes // per_token):,.0f}"


def _ratio(measured, predicted):
    return f"{measured / predicted:.4f}x" if predicted else "-"


def figures(m, budget_bytes):
    """[(figure, lecture, measured, note)] for the Measurement m of a Llama-family config."""
    c, tokens = m.config, m.batch_size * m.seq_len
    itemsize = dtypes.as_dtype(m.dtype).itemsize
    n_paper, n = paper_parameters(c), m.n_params
    by_math = m.step.by_phase(by="math")
    ran_in = m.step.by_phase()
    # attention's matmuls, forward, per token: 4·d·S per layer at position S, S = 1 ... T
    attention = 2 * c.n_layer * c.hidden_size * (m.seq_len + 1)
    persistent = sum(m.persistent.values())
    logits = [r for r in m.tape if r["scope"] == "lm_head" and r["op"] == "linear"]
    rows = [
        ("N (parameters)", f"{n_paper:,}", f"{n:,}", f"+{n - n_paper:,}: the RMSNorm weights"),
        (f"weights ({m.dtype})", _gb(n_paper * itemsize), _gb(m.persistent["weights"]), ""),
    ]
    gather = 2 * c.vocab_size * c.hidden_size  # the embedding's share of 2N, never multiplied
    gemm = m.step.by_phase(GEMMS, by="math")["forward"]["flops"] / tokens
    rows.append(
        (
            "forward GEMM FLOPs/token",
            f"2N = {2 * n_paper / 1e9:,.3f} G",
            f"{gemm / 1e9:,.3f} G",
            f"{_ratio(gemm, 2 * n_paper)}: 2N less 2·V·d (the embedding, a gather)"
            + (
                "; + attention's QK^T and PV (naive)"
                if m.options.attention == "naive"
                else " (flash attention is not a GEMM kernel)"
            ),
        )
    )
    for phase, times in (("forward", 1), ("backward", 2), ("step", 3)):
        phases = PHASES if phase == "step" else (phase,)
        got = sum(by_math[p]["flops"] for p in phases) / tokens
        predicted = times * (2 * n_paper + attention)
        rows.append(
            (
                f"{phase} FLOPs/token",
                f"{2 * times}N + {times}·2·L·d·(T+1) = {predicted / 1e9:,.3f} G",
                f"{got / 1e9:,.3f} G",
                f"{_ratio(got, predicted)}: {times}·2·V·d = {times * gather / 1e9:.3f} G less "
                "(the embedding is a gather); + norms, rotary, SwiGLU, softmax"
                + (", AdamW" if phase == "step" else "")
                + ("; + the masked half of the scores" if m.options.attention == "naive" else ""),
            )
        )
    optimizer = ran_in["optimizer"]["bytes"]
    by_kernel = {}
    for launch in m.step.launches:
        if launch.phase == "optimizer":
            by_kernel[launch.name] = by_kernel.get(launch.name, 0) + launch.bytes
    rows += [
        (
            "persistent training state",
            f"16 B/param = {_gb(16 * n_paper)}",
            f"{persistent / n:.2f} B/param = {_gb(persistent)}",
            (f"rank 0 of {m.world_size}, ZeRO-{m.zero}: " if m.world_size > 1 else "")
            + f"{'fits' if persistent <= budget_bytes else 'exceeds'} {_gb(budget_bytes)} "
            f"by {_gb(abs(budget_bytes - persistent))}",
        ),
        (
            "optimizer bytes streamed",
            f"~28 B/param = {_gb(28 * n_paper)}",
            f"{optimizer / n:.2f} B/param = {_gb(optimizer)}",
            " + ".join(f"{name} {b / n:.2f}" for name, b in by_kernel.items()),
        ),
    ]
    if logits:
        (shape, dtype) = logits[0]["outputs"][0]
        held = math.prod(shape) * dtypes.as_dtype(dtype).itemsize
        rows.append(
            (
                f"loss tensor at {tokens:,} tokens",
                f"B·S·V·2 = {_gb(tokens * c.vocab_size * 2)} (fp32 softmax "
                f"{_gb(tokens * c.vocab_size * 4)})",
                f"{_gb(held)} logits {tuple(shape)} {dtype}",
                "the softmax is never an fp32 tensor: the loss kernels compute it row by row",
            )
        )
    else:
        rows.append(
            (
                f"loss tensor at {tokens:,} tokens",
                _gb(tokens * c.vocab_size * 2),
                "none",
                "the fused LM head never holds the batch's logits",
            )
        )
    lecture_acts = lecture_activation_bytes_per_token(c, itemsize)
    acts = m.activation_bytes / tokens
    rows += [
        (
            "activations per token",
            f"(6d + 3·d_ff)·{itemsize}·L = {lecture_acts / 1e6:,.3f} MB",
            f"{acts / 1e6:,.3f} MB",
            f"{_ratio(acts, lecture_acts)} (the tape, per record in the table above)",
        ),
        (
            "step peak (tracker)",
            "",
            _gb(m.peak_bytes),
            f"{'fits' if m.peak_bytes <= budget_bytes else 'misses'} {_gb(budget_bytes)} by "
            f"{_gb(abs(budget_bytes - m.peak_bytes))}",
        ),
        (
            "KV cache per token",
            f"2·L·Hkv·D·2 = {c.kv_cache_bytes_per_token(2) / 1024:,.0f} KiB",
            f"{m.kv_cache_bytes_per_token / 1024:,.0f} KiB ({m.dtype})",
            "the decode step's cache, per position",
        ),
        (
            f"KV cache tokens in {_gb(budget_bytes)}",
            f"({_gb(budget_bytes)} - {itemsize}N) / KV = "
            f"{_fit(budget_bytes - n_paper * itemsize, c.kv_cache_bytes_per_token(itemsize))}",
            _fit(budget_bytes - m.persistent["weights"], m.kv_cache_bytes_per_token),
            f"beside the weights: one sequence of that many or B of 1/B of it ({m.dtype} cache; "
            "accounting/decode.py's kv_budget for the other dtypes)",
        ),
        (
            "attention crossover S",
            f"{c.attention_crossover():,.0f}",
            "",
            "per-layer weights / (2·d): where attention (4·d·S) equals the linears (2 per weight)",
        ),
    ]
    return rows


def format_lecture(m, budget_bytes):
    """The lecture's figures for m's config beside the measured ones, as a report section."""
    return "\n".join(
        [
            "-- the lecture's figures (lecture 2's formulas from the config) beside the measured",
            wrap(
                f"N and FLOPs by the lecture's count (no RMSNorm weights); bytes at this step's "
                f"B={m.batch_size}, T={m.seq_len}, {m.dtype}; lecture figures quoted at a "
                f"{MICRO_BATCH_TOKENS:,}-token micro-batch match when B·T = {MICRO_BATCH_TOKENS:,}"
            ),
            table(("figure", "lecture", "measured", "note"), figures(m, budget_bytes), "llll"),
        ]
    )
