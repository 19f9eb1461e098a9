"""Predicted beside measured: the figures of ACCOUNTING.md for one configuration (GPT-2 or Llama).

Predicted numbers come from the config alone (the formulas). Measured numbers come from a real
training step and a real decode step on a fresh model of that config: FLOPs, bytes and launches
from the profiler (it sees every kernel launch), persistent and activation bytes from the memory
tracker (it sees every buffer), and what each layer saves from the tape's records.

The attention convention printed is the one the kernels follow: they compute the masked half of
the T x T scores, so a training step costs 6N + 12·L·C·T FLOPs per token. The other public
convention, 6N + 6·L·C·T (masked work skipped), is printed beside it.

scripts/report.py prints the report for any preset; Trainer.run() prints it after training.
The measurement builds its own model and AdamW (a twin of the trained one), so it never touches
a trainer's weights, optimizer state or data position; the twin costs 16 bytes per parameter
while it lives.
"""

from nn import LlamaConfig
from tinygrad_like import backend, gemm_library
from tinygrad_like.distributed import sent_bytes
from tinygrad_like.memory import PERSISTENT
from tinygrad_like.profiler import GEMMS, PHASES, format_census

from . import captured, lecture, mfu, roofline
from .measure import Measurement, block_layers, group, layer_of, measure
from .predictions import (
    OPTION_GRID,
    attention_flops_per_token,
    count_pieces,
    gemm_flops,
    largest_batch,
    parameter_pieces,
    predicted_activation_bytes,
    predicted_collectives,
    predicted_head_bytes,
    predicted_peak,
    predicted_peak_bytes,
    predicted_saved_bytes,
    predicted_state_bytes,
)
from .tables import table, wrap

LAUNCH_COST_S = 5e-6  # host cost of one eager launch on a GPU (ACCOUNTING.md, "Launches")

# What each op keeps for its backward (tinygrad_like's functions.py, attention.py, losses.py). The
# first record to save a buffer is charged for it, so a record's saved bytes are what it adds.
SAVES = {
    "layernorm": "its input x, fp32 mean and rstd per row",
    "linear": "its input x (the weight is persistent, not an activation)",
    "attention": "q, k, v (B, H, T, D) and the probabilities (B, H, T, T)",
    "gelu": "its input x",
    "embedding": "the ids (int64)",
    "crossentropy": "the logits (B·T, Vp), read again by its backward; fp32 log-sum-exp per row",
    "mul": "its array operands",
    "div": "its array operands",
    "dropout": "the mask",
    "rmsnorm": "its input x, fp32 rstd per row",
    "flashattention": "q, k, v and its output, fp32 log-sum-exp per query and head",
    "swiglu": "gate and up",
}
ACTIVATION_CONVENTION = {  # per layer, per token, under each option
    "naive": "ln_1 input C + fp32 mean, rstd; c_attn input C; q, k, v 3C; attention "
    "probabilities H·T; c_proj input C; ln_2 input C + fp32 mean, rstd; c_fc input C; "
    "GELU input 4C; mlp.c_proj input 4C. Residual adds, splits and views save nothing. "
    "Total (16·C + H·T) elements + 16 bytes.",
    "flash": "as naive, but attention saves q, k, v and its output (4C) and an fp32 log-sum-exp "
    "per head instead of the H·T probabilities: 17·C elements + 4·H + 16 bytes, no "
    "term that grows with T.",
    "recompute": "each block saves only its input, C elements; the rest of a block's "
    "activations live only while that block's backward re-runs its forward.",
}
LLAMA_ACTIVATION_CONVENTION = {  # per layer, per token, under each option
    "naive": "input_layernorm input C + fp32 rstd; q/k/v_proj input C (one buffer); q after "
    "rotary C, k after rotary and v 2·Hkv·D; attention probabilities H·T; o_proj input C; "
    "post_attention_layernorm input C + fp32 rstd; gate/up_proj input C; SwiGLU gate and up "
    "2F; down_proj input F. Rotary, residual adds and views save nothing. Total "
    "(6·C + 2·Hkv·D + 3·F + H·T) elements + 8 bytes.",
    "flash": "as naive, but attention saves its output (C) and an fp32 log-sum-exp per head "
    "instead of the H·T probabilities: (7·C + 2·Hkv·D + 3·F) elements + 4·H + 8 bytes.",
    "recompute": ACTIVATION_CONVENTION["recompute"],
}
HEAD_CONVENTION = {  # what the LM head and the loss save, per token, by _head()
    "plain": "the head's input C, the logits Vp (B·T x Vp, the largest tensor of the step), "
    "an fp32 log-sum-exp and the int64 target",
    "fused (precompute)": "the head's gradients formed in the forward, dX in fp32 (4·C per "
    "token) and dW in fp32 (4·Vp·C for the whole batch); no logits",
    "fused (recompute)": "the head's input C, an fp32 log-sum-exp and the int64 target; no "
    "logits (the backward forms them again)",
}


def for_run(config, dtype, device, batch, options):
    """The report of one training step of a model of this config, dtype and execution options on
    a batch (x, y) (B, T), measured on a twin so that a trained model and its optimizer stay as
    they are. One warm-up step first, so the twin's buffers are in place before the step that
    is timed."""
    return format_report(measure(config, dtype, device, batch=batch, warmup=1, options=options))


def default_budget_bytes(device):
    """The memory a run may use: the GPU's, or 8 GB on a CPU (and on meta)."""
    be = backend.get(device)
    return be.total_bytes() if be.GPU else 8 * 10**9


def format_report(m: Measurement, budget_bytes=None, counts_only=False) -> str:
    """The report of a Measurement; budget_bytes: the largest-batch table's (default
    default_budget_bytes). counts_only: only what is the same on every machine and device
    (counts, bytes, launches, predictions), the part the docs quote and tests/test_docs.py
    regenerates on the meta device; no times, MFU, peaks, compiles or census."""
    be = backend.get(m.device)
    c, timed = m.config, be.HOLDS_VALUES and not counts_only
    device = "" if counts_only else f" on {m.device}"
    head = (
        f"== accounting: L={c.n_layer}, C={c.n_embd}, H={c.n_head}, V={c.vocab_size:,}, "
        f"context {c.n_positions:,}; {m.dtype}{device}; one training step at "
        f"B={m.batch_size}, T={m.seq_len} ({m.batch_size * m.seq_len:,} tokens) =="
    )
    if m.skipped:
        head += "\n(the fp16 loss scaler skipped the profiled step for an overflow)"
    budget_bytes = budget_bytes or default_budget_bytes(m.device)
    sections = [
        _parameters(m),
        _flops(m, timed),
        _state_memory(m, timed),
        _activations(m),
        _memory_trades(m, budget_bytes),
        _launches(m, timed),
        captured.section(m, timed),
    ]
    if isinstance(c, LlamaConfig):  # the course's reference 7B is of this family
        sections.append(lecture.format_lecture(m, budget_bytes))
    if counts_only:
        note = "counts only: the same on every machine and device; no times, no census"
        return "\n\n".join([head] + sections + [f"-- ({note})"])
    if not be.HOLDS_VALUES:  # meta: counted, not run, nothing timed
        note = "meta device: the step was counted, not run; no times, no census by time"
        return "\n\n".join([head] + sections + [f"-- ({note})"])
    peaks = m.machine  # read once for the whole report (and raised by its GEMMs, if they beat it)
    if not be.GPU:  # Numba's first calls (a GPU's, NVRTC's, are not counted); the BLAS
        sections.append("-- " + m.compiles.describe())
        sections.append("-- " + gemm_library.in_use().describe())
    sections += [
        "-- " + peaks.describe() + (f"\n  {m.peak_note}" if m.peak_note else ""),
        format_census(
            roofline.census(m.step, peaks, m.dtype),
            title=f"-- op census: one training step, M = B·T = "
            f"{m.batch_size * m.seq_len:,}, by time lost to the roofline",
        ),
        format_census(
            roofline.census(m.decode, peaks, m.dtype),
            title=f"-- op census: one decode step, M = 1 (KV cache of "
            f"{m.cached_positions} positions, no_grad), by time lost to the "
            "roofline",
        ),
    ]
    return "\n\n".join([head] + sections)


def _parameters(m):
    measured = count_pieces(m.parameters)
    rows = [
        (piece, shape, f"{n:,}", f"{measured[key]:,}", "yes" if measured[key] == n else "NO")
        for key, piece, shape, n in parameter_pieces(m.config)
    ]
    total, c = m.n_params, m.config
    pad = c.padding_cost()
    return "\n".join(
        [
            "-- parameters N: predicted from the config, measured in the model's tensors",
            table(("piece", "shape", "predicted", "measured", "equal"), rows, "llrrr"),
            f"  fp32 weights: {total * 4:,} bytes ({total * 4 / 1e6:,.0f} MB)",
            wrap(
                f"{_padded(c)} stored {c.padded_vocab_size:,} x {c.n_embd:,} (the vocabulary "
                f"padded to a multiple of 64 for aligned LM-head GEMMs): {pad['elements']:,} zero "
                f"elements that are not parameters, yet cost 16 bytes each in the training state "
                f"({16 * pad['elements']:,} bytes) and {pad['forward_flops_per_token']:,} + "
                f"{pad['backward_flops_per_token']:,} GEMM FLOPs per token (forward + backward)"
            ),
        ]
    )


def _padded(config):
    """What stores the padded vocabulary: GPT-2's tied wte, Llama's embedding and LM head."""
    return "the embedding and the LM head are" if isinstance(config, LlamaConfig) else "wte is"


def _flops(m, timed):
    c, n, tokens = m.config, m.n_params, m.batch_size * m.seq_len
    computed, skipped = attention_flops_per_token(c, m.seq_len)
    gemm, bias = gemm_flops(c, m.batch_size, m.seq_len)
    all_ = m.step.by_phase(by="math")  # beside the predictions: the phase of their math
    gemms = m.step.by_phase(GEMMS, by="math")

    def multiple(flops_per_token):
        return f"{flops_per_token / n:.4f}"

    # per token: the two conventions, then the GEMMs counted exactly from the shapes
    predicted = {
        "forward": (2 * n + computed, 2 * n + skipped, (gemm + bias) / tokens),
        "backward": (4 * n + 2 * computed, 4 * n + 2 * skipped, 2 * gemm / tokens),
        "step": (6 * n + 3 * computed, 6 * n + 3 * skipped, (3 * gemm + bias) / tokens),
    }
    rows = []
    for phase in ("forward", "backward", "optimizer", "step"):
        phases = PHASES if phase == "step" else (phase,)
        got = sum(all_[p]["flops"] for p in phases)
        got_gemm = sum(gemms[p]["flops"] for p in phases)
        pred = [multiple(f) for f in predicted[phase]] if phase in predicted else ["-"] * 3
        rows.append(
            (phase, *pred, multiple(got_gemm / tokens), multiple(got / tokens), f"{got / 1e9:,.3f}")
        )
    step_flops = c.flops_per_token(m.seq_len) * tokens
    achieved = (  # a time: not on meta, which counts a step without running it
        [
            wrap(
                f"achieved: {m.step_seconds:.3f} s per step (profiled), "
                f"{tokens / m.step_seconds:,.0f} tokens/s, MFU "
                f"{mfu.percent(step_flops / m.step_seconds / m.peak, 2)} of the {m.peak_name} "
                "(6N + 12·L·C·T per token)"
            )
        ]
        if timed
        else []
    )
    return "\n".join(
        [
            f"-- FLOPs per token as multiples of N = {n:,} (measured: one profiled training step)",
            wrap(
                "printed convention: attention's masked half is computed, as our kernels do: "
                "2N + 4·L·C·T forward, 4N + 8·L·C·T backward, 6N + 12·L·C·T per step. 'masked "
                "skipped' is the other public convention (6N + 6·L·C·T). 'GEMMs from shapes' is "
                "exact: Σ 2·M·K·N over the linears, the LM head and attention's two GEMMs, plus "
                "M·N per fused bias, forward; backward is twice the GEMMs (bias gradients are "
                "sum kernels, not GEMMs). 'measured all' adds layernorm, GELU, softmax, adds, "
                "casts and the optimizer. Measured FLOPs are counted under the phase whose math "
                "they are (below: and under the phase they ran in)."
            ),
            table(
                (
                    "phase",
                    "6N+12LCT",
                    "masked skipped",
                    "GEMMs from shapes",
                    "measured GEMMs",
                    "measured all",
                    "GFLOP",
                ),
                rows,
            ),
            wrap(
                f"the optimizer updates N parameters once per step, so its share per token falls "
                f"as the batch grows ({tokens:,} tokens here)"
            ),
            _ran_in_versus_math(m),
        ]
        + achieved
    )


def _ran_in_versus_math(m):
    """All FLOPs per token by the phase whose math each launch is and by the phase it ran in,
    the math first: that is the 2N + 4N split of the convention. They differ for the fused head
    (precompute: the head's gradients formed in the forward; recompute: its logits formed
    again in the backward) and for recomputation (a block's forward re-run in the backward)."""
    tokens, n, opts = m.batch_size * m.seq_len, m.n_params, m.options
    sums = [m.step.by_phase(kernels, by) for by in ("math", "phase") for kernels in (None, GEMMS)]
    rows = [
        (phase, *(f"{s[phase]['flops'] / tokens / n:.4f}" for s in sums))
        for phase in ("forward", "backward")
    ]
    return "\n".join(
        [
            wrap(
                "FLOPs per token / N, by the phase whose math a kernel is and the phase it ran "
                f"in (LM head {_head(opts)}, recompute {_on_off(opts.recompute)}):"
            ),
            table(
                ("phase", "all: math of", "GEMMs: math of", "all: ran in", "GEMMs: ran in"),
                rows,
                indent="    ",
            ),
            wrap(_why_ran_in_differs(opts), "    "),
        ]
    )


def _why_ran_in_differs(opts):
    """One sentence: what moves FLOPs out of the phase of their math under these options."""
    reasons = []
    if opts.lm_head == "fused" and opts.lm_head_design == "precompute":
        reasons.append(
            "the fused head's precompute design runs the head's backward GEMMs (dX and dW) "
            "inside the forward"
        )
    if opts.lm_head == "fused" and opts.lm_head_design == "recompute":
        reasons.append(
            "the fused head's recompute design forms its logits again inside the backward "
            "(forward math)"
        )
    if opts.recompute:
        reasons.append("each block re-runs its forward inside the backward (forward math)")
    if not reasons:
        return "'ran in' equals 'math of': every kernel ran in the phase of its math."
    return "'ran in' differs from 'math of' because " + "; and ".join(reasons) + "."


def _state_memory(m, timed):
    source = "measured: the buffers the model and AdamW allocated"
    if m.world_size == 1 and not m.zero:
        return state_memory_table(m.persistent, m.n_params, m.dtype, source)
    R = m.world_size
    return "\n\n".join(
        [
            state_memory_table(
                m.persistent,
                m.n_params,
                m.dtype,
                source + (f", rank 0 of {R} counted on the meta device" if R > 1 else ""),
                zero=m.zero,
                elements=m.elements,
                padding=m.padding,
                world=R,
            ),
            communication_table(
                m.collectives,
                predicted_collectives(m.elements, m.dtype, m.zero, R),
                R,
                timed=timed,
            ),
        ]
    )


def state_memory_table(
    persistent, n, dtype, source, zero=0, ranks=None, elements=None, padding=0, world=None
):
    """Bytes per parameter by consumer, predicted beside measured: persistent is tracker tag ->
    bytes, n the parameter count, source says where the bytes were measured, elements the
    length of AdamW's flat buffers (the padded vocabulary's rows included). Data parallel:
    ranks is every rank's measured persistent dict (this one's is the table's), or world the
    number of ranks when this one's alone was counted (the meta device); padding the elements
    the flat buffers got to split into equal shards."""
    R = len(ranks) if ranks else world or 1
    pred = predicted_state_bytes(dtype, zero, R)
    names = {
        "weights": f"weights ({dtype})",
        "gradients": f"gradients ({dtype})",
        "master": "master (fp32)",
        "adam_m": "adam m (fp32)",
        "adam_v": "adam v (fp32)",
    }
    rows = [
        (names[tag], f"{pred[tag]:g}", f"{persistent[tag]:,}", f"{persistent[tag] / n:.2f}")
        for tag in PERSISTENT
    ]
    total = sum(persistent[tag] for tag in PERSISTENT)
    rows.append(("total", f"{sum(pred.values()):g}", f"{total:,}", f"{total / n:.2f}"))
    lines = [
        f"-- persistent training memory, bytes per parameter ({source})",
        table(("consumer", "predicted", "measured bytes", "measured/param"), rows),
    ]
    if R > 1 and ranks:
        totals = [sum(r[tag] for tag in PERSISTENT) for r in ranks]
        same = (
            "the same on every rank"
            if len(set(totals)) == 1
            else "per rank: " + ", ".join(f"{t:,}" for t in totals)
        )
        lines.append(
            f"  per rank of {R}, ZeRO-{zero}: measured {same}; the flat buffers are "
            f"padded by {padding:,} elements to {R} equal shards"
        )
    elif R > 1:
        lines.append(
            f"  per rank of {R}, ZeRO-{zero}: rank 0's counted, and every rank holds as much "
            f"(AdamW's flat buffers are padded by {padding:,} elements to {R} equal shards)"
        )
    if elements is not None and elements > n:
        lines.append(
            f"  measured/param divides by N; the flat buffers hold {elements - n:,} "
            f"elements more ({(elements - n) / n:.2%}: the padded vocabulary's zero "
            "rows" + (", the shards' padding)" if padding else ")")
        )
        if zero == 2:
            lines.append(
                "  ZeRO-2: the step also holds a full-size gradient buffer from its first "
                "backward to the reduce-scatter (in the step's peak, not kept)"
            )
    lines.append(
        f"  {total / 1e9:.2f} GB for N = {n:,}"
        + (
            "; 14 bytes/param if gradients were freed inside the step (ours stay allocated)"
            if R == 1
            else ""
        )
    )
    return "\n".join(lines)


def communication_table(collectives, predicted, world, timed=True):
    """Bytes each rank sends in one step, per collective, predicted (predicted_collectives)
    beside measured (the distributed.Collective records of a step that ran), with the time
    and the achieved bus bandwidth (NCCL's busbw: bytes sent / time); timed=False (a world
    counted on the meta device) leaves those two out."""
    ran = {}
    for c in collectives:
        r = ran.setdefault((c.name, c.what), [0, 0, 0.0, 0.0])
        r[0] += 1
        r[1] += c.nbytes
        r[2] += c.sent
        r[3] += c.seconds
    rows, total = [], [0.0, 0.0, 0.0]
    for name, what, nbytes in predicted:
        calls, buf, sent, seconds = ran.get((name, what), (0, 0, 0.0, 0.0))
        expect = sent_bytes(name, nbytes, world)
        rows.append(
            (
                f"{name} {what}",
                f"{nbytes:,}",
                f"{expect:,.0f}",
                f"{sent:,.0f}",
                f"{seconds * 1e3:.2f}" if timed else "-",
                f"{sent / seconds / 1e9:.2f}" if seconds else "-",
            )
        )
        total = [total[0] + expect, total[1] + sent, total[2] + seconds]
    unexpected = sorted(set(ran) - {(n, w) for n, w, _ in predicted})
    rows.append(
        (
            "total",
            "",
            f"{total[0]:,.0f}",
            f"{total[1]:,.0f}",
            f"{total[2] * 1e3:.2f}" if timed else "-",
            f"{total[1] / total[2] / 1e9:.2f}" if total[2] else "-",
        )
    )
    return "\n".join(
        [
            f"-- communication per step, bytes each rank sends (R = {world}; ring: all-reduce "
            "2(R-1)/R x buffer, reduce-scatter and all-gather (R-1)/R)",
            table(
                (
                    "collective",
                    "buffer bytes",
                    "predicted sent",
                    "measured sent",
                    "ms",
                    "busbw GB/s",
                ),
                rows,
            ),
        ]
        + ([f"  also ran, not predicted: {unexpected}"] if unexpected else [])
    )


def _on_off(flag):
    return "on" if flag else "off"


def _head(opts):
    """The LM head that ran, with the fused head's design."""
    return f"fused ({opts.lm_head_design})" if opts.lm_head == "fused" else opts.lm_head


def _activations(m):
    c, tokens, opts = m.config, m.batch_size * m.seq_len, m.options
    layers = block_layers(m.tape)
    first = [r for r in m.tape if layer_of(r["scope"]) == layers[0] and r["saved_bytes"]]
    rows = [
        (
            r["scope"][len(layers[0]) + 1 :] or "(block)",
            r["op"],
            _bytes_per_token(r["saved_bytes"], tokens),
            SAVES.get(r["op"], ""),
        )
        for r in first
    ]
    per_layer = group(m.tape, lambda r: layer_of(r["scope"]))
    block_bytes = [per_layer[name]["saved_bytes"] for name in layers]
    outside = [
        (name, _bytes_per_token(g["saved_bytes"], tokens))
        for name, g in per_layer.items()
        if name not in layers and g["saved_bytes"]
    ]
    head = sum(g["saved_bytes"] for name, g in per_layer.items() if name in ("lm_head", "loss"))
    tape_total = sum(r["saved_bytes"] for r in m.tape)
    predicted = predicted_activation_bytes(c, m.seq_len, m.dtype, opts)
    head_predicted = predicted_head_bytes(c, tokens, m.dtype, opts)
    saved_predicted = predicted_saved_bytes(c, m.batch_size, m.seq_len, m.dtype, opts, m.world_size)
    llama = isinstance(c, LlamaConfig)
    conventions = LLAMA_ACTIVATION_CONVENTION if llama else ACTIVATION_CONVENTION
    convention = conventions["recompute" if opts.recompute else opts.attention]
    return "\n".join(
        [
            f"-- activations saved for backward ({m.dtype}, B={m.batch_size}, T={m.seq_len}; "
            f"attention {opts.attention}, LM head {_head(opts)}, recompute "
            f"{_on_off(opts.recompute)}), from the tape",
            wrap("convention per layer per token: " + convention),
            f"  what {layers[0]} saves, per record (the first record to save a buffer is charged):",
            table(("record", "op", "bytes/token", "what"), rows, "llrl", indent="    "),
            f"  per token per layer: predicted {predicted:,}, measured "
            f"{sum(block_bytes) / tokens / len(layers):,.0f} "
            f"(mean of {len(layers)} layers; all equal: "
            f"{'yes' if len(set(block_bytes)) == 1 else 'NO'})",
            "  outside the blocks, bytes per token:",
            table(("layer", "bytes/token"), outside, indent="    "),
            wrap(
                f"the LM head and the loss save {head / tokens:,.1f} bytes per token, predicted "
                f"{head_predicted / tokens:,.1f}: {HEAD_CONVENTION[_head(opts)]}"
            ),
            f"  total saved: {tape_total:,} bytes by the tape's records (predicted "
            f"{saved_predicted:,}), {m.activation_bytes:,} counted by the tracker "
            f"({'equal' if tape_total == m.activation_bytes else 'DIFFERENT'})",
        ]
    )


def _memory_trades(m, budget_bytes):
    """The tracker's peak predicted beside measured, and what the three options buy: the
    largest batch at this T that fits the budget under each combination."""
    c = m.config
    at, predicted = predicted_peak(
        c, m.batch_size, m.seq_len, m.dtype, m.options, m.zero, m.world_size
    )
    rows = []
    for opts in OPTION_GRID:
        peak = predicted_peak_bytes(c, m.batch_size, m.seq_len, m.dtype, opts, m.zero, m.world_size)
        batch = largest_batch(c, m.seq_len, m.dtype, budget_bytes, opts, m.zero, m.world_size)
        rows.append(
            (
                opts.attention,
                opts.lm_head,
                _on_off(opts.recompute),
                f"{predicted_activation_bytes(c, m.seq_len, m.dtype, opts):,}",
                f"{peak / 1e6:,.1f}",
                f"{batch:,}",
            )
        )
    return "\n".join(
        [
            "-- peak memory of the step (the tracker, temporaries included) and the three trades",
            f"  measured peak {m.peak_bytes:,} bytes ({m.peak_bytes / 1e6:,.1f} MB); predicted "
            f"{predicted:,.0f} ({predicted / 1e6:,.1f} MB), {m.peak_bytes / predicted:.3f}x; "
            f"predicted at {at} (the persistent state and the tensors alive then)",
            f"  largest batch at T = {m.seq_len:,} in a budget of {budget_bytes / 1e9:,.1f} GB "
            f"({m.dtype}), from the predicted peak:",
            table(
                (
                    "attention",
                    "LM head",
                    "recompute",
                    "saved bytes/token/layer",
                    f"peak MB at B={m.batch_size}",
                    "largest B",
                ),
                rows,
                "lllrrr",
                indent="    ",
            ),
        ]
    )


def _bytes_per_token(nbytes, tokens):
    per = nbytes / tokens
    return f"{per:,.0f}" if per == int(per) else f"{per:,.2f}"


def _launches(m, timed):
    phases = m.step.by_phase()
    layers = block_layers(m.tape)
    layer = group(m.tape, lambda r: layer_of(r["scope"]))[layers[0]]
    rows = [
        ("training step: forward", phases["forward"]["launches"], layer["fwd_launches"], ""),
        (
            "training step: backward",
            phases["backward"]["launches"],
            layer["bwd_launches"],
            f"{m.unowned['backward'].launches} outside any record (gradient sums, adds into .grad)",
        ),
        ("training step: optimizer", phases["optimizer"]["launches"], "", ""),
    ]
    total = sum(p["launches"] for p in phases.values())
    rows.append(("training step: total", total, "", ""))
    decode = len(m.decode.launches)
    seconds = f"{m.decode_seconds * 1e3:.1f} ms measured" if timed else ""
    rows.append(("decode step (M = 1)", decode, "", seconds))
    return "\n".join(
        [
            f"-- kernel launches (per layer: {layers[0]}, from the tape)",
            table(("where", "launches", "per layer", "note"), rows, "lrrl"),
            f"  at ~{LAUNCH_COST_S * 1e6:.0f} µs each (eager, GPU) the launches alone cost "
            f"{total * LAUNCH_COST_S * 1e3:.1f} ms per training step and "
            f"{decode * LAUNCH_COST_S * 1e3:.1f} ms per decode step",
        ]
    )
