"""Decoding where bytes decide: what one decode step must read (every weight once, the KV cache
so far), the time that stream takes at the machine's measured read bandwidth (the bound), and
where each of the step's GEMMs sits on the roofline as the batch B grows.

A decode step of B sequences multiplies X (B, K) by each weight W (K, N): 2·B·K·N FLOPs over
(B·K + K·N + B·N) elements, an arithmetic intensity of about 2·B / itemsize FLOP per byte while
B << K, N. Below the machine's ridge point (peak FLOP/s / bandwidth) the step costs the weight
stream whatever B is, so tokens/s grows with B; above it the GEMMs are compute-bound. Used by
examples/generate.py --stats, scripts/decode_sweep.py and, on the meta device, kv_budget (the
reference 7B's cache beside its weights in 80 GB).
"""

import time

import numpy as np

from nn import GPT2Config, KVCache, build
from nn.lm import KV_DTYPES, kv_bytes_per_element, kv_name
from nn.quant import quantize_model
from tinygrad_like import compiles, dtypes, no_grad
from tinygrad_like.compiles import Compiles
from tinygrad_like.formats import FORMATS, bytes_per_parameter
from tinygrad_like.memory import TRACKER
from tinygrad_like.profiler import GEMMS, Profiler

from .predictions import stored_elements
from .tables import table

GB = 1e9


# ---------------------------------------------------------------- predicted


def streamed_weight_elements(config):
    """The weight elements a decode step reads: every stored one but the table it only gathers
    rows of (GPT-2's position embedding, its token embedding being the LM head too; Llama's
    token embedding, its LM head being its own weight)."""
    gathered = config.n_positions if isinstance(config, GPT2Config) else config.padded_vocab_size
    return stored_elements(config) - gathered * config.n_embd


def stream_bytes(config, weight_itemsize, kv_itemsize, batch, length):
    """The floor of one decode step's reads: the weights once, and the keys and values of
    `batch` sequences at `length` positions (the new one included); kv_itemsize: bytes per
    cached element (nn/lm.py kv_bytes_per_element: an fp8 cache's scales included)."""
    weights = streamed_weight_elements(config) * weight_itemsize
    return weights + batch * length * config.kv_cache_bytes_per_token(kv_itemsize)


def decode_gemms(config):
    """[(names, K, N, launches per step, bias)]: the weight GEMMs of one decode step,
    X (B, K) @ W (K, N) (+ b (N,) for GPT-2's layers), those of one shape in one row (the
    per-layer ones L or 2 L times a step), the LM head last."""
    C, L = config.n_embd, config.n_layer
    if isinstance(config, GPT2Config):
        rows = [("c_attn", C, 3 * C, L, True), ("attn.c_proj", C, C, L, True)]
        rows += [("c_fc", C, 4 * C, L, True), ("mlp.c_proj", 4 * C, C, L, True)]
    else:
        kv, F = config.n_kv_head * config.head_dim, config.intermediate_size
        rows = [("q_proj, o_proj", C, C, 2 * L, False), ("k_proj, v_proj", C, kv, 2 * L, False)]
        rows += [("gate_proj, up_proj", C, F, 2 * L, False), ("down_proj", F, C, L, False)]
    return rows + [("lm_head", C, config.padded_vocab_size, 1, False)]


def gemm_counts(batch, K, N, itemsize, bias=False):
    """(FLOPs, bytes) of X (B, K) @ W (K, N) (+ b): reads X, W (and b), writes Y (B, N), as
    the contract counts the matmul kernel."""
    flops = 2 * batch * K * N + (batch * N if bias else 0)
    return flops, (batch * K + K * N + batch * N + (N if bias else 0)) * itemsize


def compute_bound_batch(K, N, itemsize, ridge):
    """The least B at which X (B, K) @ W (K, N) reaches the ridge point (FLOP per byte), from
    2·B·K·N = ridge·itemsize·(B·K + K·N + B·N); None when no B does (a ridge above 2·K·N /
    (itemsize·(K + N)), the intensity's limit)."""
    slope = 2 * K * N - ridge * itemsize * (K + N)
    return ridge * itemsize * K * N / slope if slope > 0 else None


# ---------------------------------------------------------------- measured


class StepMeter:
    """Wraps a generate_stream iterator: yields its tokens, and keeps for each step (the prompt's
    first, then one per decode step) its seconds and the launches it made, whose bytes are
    counted where each kernel is launched (kernels.launch) and tallied after the step's clock
    has stopped (a deferred Profiler), so that a step's seconds hold none of the counting's
    Python. A step's seconds hold no compiles either: the kernels compiled on first use
    (tinygrad_like.compiles) are taken out and summed in .compiled, for a line of their own.
    timing: time each launch too (the sweep's per-GEMM times; a replayed step's kernels, one
    timer each), so that a step's host time is its seconds minus its kernels'."""

    def __init__(self, tokens, timing=False):
        self.tokens, self.timing = tokens, timing
        self.steps = []  # (seconds, [Launch])
        self.replayed = []  # per step, the launches of the captured steps it replayed
        self.hand_offs = []  # per step, its replay's runs of compiled ops (graph/cpu_step.py)
        self.host_seconds = []  # per step, its seconds minus its kernels' (timing only)
        self.compiled = Compiles()  # during the steps, outside their seconds

    def __iter__(self):
        with Profiler(timing=self.timing, deferred=True) as prof:
            while True:
                start, t0 = len(prof.launches), time.perf_counter()  # the last step counted
                replays = len(prof.replays)
                before = compiles.so_far()
                try:
                    token = next(self.tokens)  # its logits reached the host: the step is done
                except StopIteration:
                    return
                seconds, compiled = time.perf_counter() - t0, compiles.so_far() - before
                self.compiled += compiled
                self.steps.append((seconds - compiled.seconds, prof.launches[start:]))
                self.replayed.append(sum(r.launches for r in prof.replays[replays:]))
                graphs = [r.program.graph for r in prof.replays[replays:]]
                self.hand_offs.append(sum(g.graphs for g in graphs if g is not None))
                kernels = sum(launch.seconds for launch in self.steps[-1][1])
                kernels += sum(r.seconds for r in prof.replays[replays:])
                self.host_seconds.append(seconds - kernels)  # a compile is in both or host
                yield token

    def step_bytes(self, step):
        return sum(launch.bytes for launch in self.steps[step][1])


def weight_bytes_per_parameter(weights, group_size=None, config=None):
    """-> (name, bytes per weight parameter) of a weight dtype (its itemsize) or a quantized
    format (tinygrad_like/formats.py FORMATS: the code's bytes and its share of the scales, a
    per-channel scale shared by config.n_embd elements, most GEMMs' rows)."""
    if weights in FORMATS:
        row = config.n_embd if config is not None else None
        return weights, bytes_per_parameter(weights, group_size, row)
    dtype = dtypes.as_dtype(weights)
    return dtypes.name(dtype), dtype.itemsize


def stats(meter, config, weight_dtype, kv_dtype, batch, prompt_len, peaks, group_size=None):
    """The lines generate.py --stats prints: prompt and decode ms per token, tokens/s, the bytes
    a decode step moved (counted at each launch: read + written) beside its floor (the weights
    and the cache so far, stream_bytes), and the measured speed as a fraction of the bound (the
    floor at the measured read bandwidth). weight_dtype: a dtype or a quantized format's name
    (group_size its group, None for the format's default), whose bytes per parameter (scales
    included) the floor counts for every streamed weight. kv_dtype: a dtype or an fp8 format
    (nn/lm.py KV_DTYPES), whose bytes per element (its scales' share included) the floor counts
    for the cache. No time holds a kernel's compile (StepMeter)."""
    name, w = weight_bytes_per_parameter(weight_dtype, group_size, config)
    kv = kv_bytes_per_element(kv_dtype, config.head_dim)
    prompt_s = meter.steps[0][0]
    busy = f"; {peaks.condition()}" if peaks.busy else ""
    lines = [
        f"--- stats: {peaks.device}, weights {name}, KV cache {kv_name(kv_dtype)}, "
        f"B = {batch}; {w:g} bytes per weight; read bandwidth {peaks.read_bw / GB:.1f} GB/s "
        f"(tinygrad_like/peaks.py, measured {peaks.when}{busy})",
        f"prompt: {prompt_len} tokens x {batch} in {prompt_s * 1e3:,.1f} ms: "
        f"{prompt_s * 1e3 / (prompt_len * batch):,.2f} ms/token",
    ]
    steps = range(1, len(meter.steps))  # step s feeds token s: the cache holds T + s positions
    if not steps:
        return lines + ["decode: no decode step (one new token comes from the prompt's step)"]
    n = len(steps)
    seconds = sum(meter.steps[s][0] for s in steps) / n
    counted = [s for s in steps if meter.steps[s][1]]  # a replayed step passes no launch point
    moved = sum(meter.step_bytes(s) for s in counted) / len(counted)
    floor = sum(stream_bytes(config, w, kv, batch, prompt_len + s) for s in steps) / n
    replayed = f" ({n - len(counted)} replayed, bytes counted on the other {len(counted)})"
    weights = streamed_weight_elements(config) * w
    bound = floor / peaks.read_bw
    launches = f"launches: {len(meter.steps[counted[-1]][1])} per decode step"
    if len(counted) < n:  # generate --compile: the first two decode steps recorded, eagerly
        eager = sum(meter.steps[s][0] for s in counted) / len(counted)
        again = sum(meter.steps[s][0] for s in steps if s not in counted) / (n - len(counted))
        fused, hand_offs = max(meter.replayed), max(meter.hand_offs)
        ops = f", as compiled ops in {hand_offs} parallel hand-off{'s' * (hand_offs > 1)}"
        launches += (
            f", {fused} on a replayed step (no op layer, adds and activations fused"
            f"{ops if hand_offs else ''}): "
            f"replayed {again * 1e3:,.2f} ms/step, the {len(counted)} eager steps that recorded it "
            f"{eager * 1e3:,.2f} ms/step"
        )
    if meter.timing:
        launches += "; " + _host_time(meter, steps, counted)
    return lines + [
        f"decode: {n} steps of {batch} tokens{replayed if len(counted) < n else ''}, "
        f"{seconds * 1e3:,.2f} ms/step = {seconds * 1e3 / batch:,.2f} ms/token, "
        f"{batch / seconds:,.1f} tokens/s",
        launches,
        f"bytes: {moved / batch / 1e6:,.2f} MB/token moved by the kernels (counted at each "
        f"launch, read + written); floor {floor / batch / 1e6:,.2f} MB/token = weights "
        f"{weights / batch / 1e6:,.2f} + KV cache {(floor - weights) / batch / 1e6:,.3f}",
        f"bound: {bound * 1e3:,.2f} ms/step (the floor at {peaks.read_bw / GB:.1f} GB/s); "
        f"measured {seconds * 1e3:,.2f}: {bound / seconds:.2f} of the bound",
    ]


def _host_time(meter, steps, counted):
    """The launches line's host part: a decode step's seconds minus its kernels' (the Python
    between them, the sampling), the mean over the replayed steps and over the eager ones."""
    parts = []
    for label, which in [("replayed", [s for s in steps if s not in counted]), ("eager", counted)]:
        if which:
            host = sum(meter.host_seconds[s] for s in which) / len(which)
            parts.append(f"{label} {host * 1e3:,.2f} ms/step")
    return "host (a step's seconds minus its kernels'): " + ", ".join(parts)


# ---------------------------------------------------------------- the meta device


def kv_budget(config, dtype="bf16", kv_dtype=None, budget_bytes=80e9, tokens=16, weights=None):
    """On the meta device (shapes only, nothing allocated): the tracker's bytes of config's
    weights in dtype (its GEMM weights quantized to the format `weights` when given, nn/quant.py)
    and of a one-sequence KV cache in kv_dtype (default dtype; an fp8 format's codes and scales
    both counted) of `tokens` positions ->
    {weights, kv_per_token, kv_per_token_per_layer, tokens_that_fit}: how many positions of
    cache fit beside the weights in budget_bytes (0 when the weights alone do not)."""
    kv_dtype = kv_dtype or dtype
    before = TRACKER.settled()
    model = build(config, device="meta").to(dtype=dtype)
    if weights not in (None, "fp32"):
        quantize_model(model, weights)
    weights = TRACKER.settled()["weights"] - before["weights"]  # not those the casts replaced
    with no_grad():
        cache = KVCache(config, 1, tokens, model.get_input_embeddings().weight, kv_dtype)
        per_token = (TRACKER.current["kv_cache"] - before["kv_cache"]) // tokens
    del cache, model
    return {
        "weights": weights,
        "kv_per_token": per_token,
        "kv_per_token_per_layer": per_token // config.n_layer,
        "tokens_that_fit": max(0, int((budget_bytes - weights) // per_token)),
    }


def format_kv_budget(config, name, dtype="bf16", budget_bytes=80e9):
    """A table, one row per KV cache dtype (nn/lm.py KV_DTYPES, the fp8 formats included): the
    weights in dtype, the cache's bytes per token (all layers, and per layer) and the positions
    that fit beside the weights in budget_bytes."""
    rows = []
    for kv in KV_DTYPES:
        got = kv_budget(config, dtype, kv, budget_bytes)
        rows.append(
            (
                kv,
                f"{got['weights'] / GB:,.2f} GB",
                f"{got['kv_per_token'] / 1024:,.0f} KiB",
                f"{got['kv_per_token_per_layer'] / 1024:,.1f} KiB",
                f"{got['tokens_that_fit']:,}",
            )
        )
    head = ("KV dtype", f"weights ({dtype})", "KV/token", "KV/token/layer", "tokens that fit")
    return f"-- {name}: the KV cache beside the weights in {budget_bytes / GB:,.0f} GB (meta)\n" + (
        table(head, rows)
    )


def format_weight_budget(config, name, kv_dtype="bf16", budget_bytes=80e9):
    """A table, one row per weight format (bf16, then each of FORMATS but fp16 quantized from
    it): the weights' bytes, per parameter (over config.num_parameters) and in all, and the
    positions of a kv_dtype cache that fit beside them in budget_bytes (meta: kv_budget)."""
    rows = []
    for fmt in ["bf16"] + [f for f in FORMATS if f not in ("bf16", "fp16")]:
        got = kv_budget(config, "bf16", kv_dtype, budget_bytes, weights=fmt)
        rows.append(
            (
                fmt,
                f"{got['weights'] / config.num_parameters():.3f}",
                f"{got['weights'] / GB:,.2f} GB",
                f"{got['tokens_that_fit']:,}",
            )
        )
    head = ("weights", "bytes/param", "weights", f"{kv_dtype} KV tokens that fit")
    title = f"-- {name}: each weight format beside a {kv_dtype} KV cache in "
    return title + f"{budget_bytes / GB:,.0f} GB (meta)\n" + table(head, rows)


# ---------------------------------------------------------------- the batch sweep


def compute_bound_step(config, itemsize, flops_per_s, bandwidth):
    """The least B at which the decode step's GEMMs together take as long at the compute roof
    as at the memory roof (the sum of each one's FLOPs / peak against its bytes / bandwidth:
    both linear in B), or None when no B does."""
    per_b = fixed = 0.0  # memory time = fixed + B * mem_per_b; compute time = B * per_b
    mem_per_b = 0.0
    for _, K, N, count, bias in decode_gemms(config):
        f1, b1 = gemm_counts(1, K, N, itemsize, bias)
        f2, b2 = gemm_counts(2, K, N, itemsize, bias)
        per_b += count * (f2 - f1) / flops_per_s
        mem_per_b += count * (b2 - b1) / bandwidth
        fixed += count * (2 * b1 - b2) / bandwidth
    return fixed / (per_b - mem_per_b) if per_b > mem_per_b else None


def sweep_batch(model, batch, prompt_len, new_tokens, kv_dtype, peaks, seed=0):
    """Greedy decode of `batch` random prompts of prompt_len tokens for new_tokens steps, every
    launch timed -> {batch, step_s, tokens_per_s, gemms: [{names, flops, bytes, seconds,
    roof_s, bound}]}, each per decode step: the fastest of the steps (as peaks.py takes the best
    of its tries: a burst of load elsewhere only slows a step), the prompt's step and the first
    decode step, a warm-up, left out when there are more."""
    config, dtype = model.config, model.get_input_embeddings().weight.dtype
    prompts = np.random.default_rng(seed).integers(0, config.vocab_size, (batch, prompt_len))
    stream = model.generate_stream(prompts, new_tokens, temperature=0, kv_dtype=kv_dtype)
    meter = StepMeter(stream, timing=True)
    for _ in meter:
        pass
    steps = meter.steps[2:] or meter.steps[1:]
    rows = {}  # a weight GEMM's FLOPs -> its row (one shape, one FLOP count)
    for names, K, N, count, bias in decode_gemms(config):
        flops, nbytes = gemm_counts(batch, K, N, dtype.itemsize, bias)
        row = rows.setdefault(flops, {"names": [], "flops": 0, "bytes": 0, "seconds": 0.0})
        row["names"].append(names)
        row["flops"] += count * flops
        row["bytes"] += count * nbytes
    for row in rows.values():
        row["seconds"] = float("inf")
    for _, launches in steps:
        this = dict.fromkeys(rows, 0.0)
        for launch in launches:
            if launch.name in GEMMS and launch.flops in this:  # not naive attention's scores
                this[launch.flops] += launch.seconds
        for flops, seconds in this.items():
            rows[flops]["seconds"] = min(rows[flops]["seconds"], seconds)
    peak = peaks.flops(dtypes.name(dtype))
    for row in rows.values():
        row["names"] = ", ".join(row["names"])
        row["roof_s"] = max(row["flops"] / peak, row["bytes"] / peaks.bandwidth)
        row["bound"] = (
            "compute" if row["flops"] / peak >= row["bytes"] / peaks.bandwidth else ("memory")
        )
    step_s = min(seconds for seconds, _ in steps)
    return {
        "batch": batch,
        "step_s": step_s,
        "tokens_per_s": batch / step_s,
        "gemms": list(rows.values()),
    }


def measured_knee(results):
    """The B at which the GEMMs' measured time at B = 1 (the weight stream) meets their time
    per sequence at the largest B (the compute slope): the measured compute-bound batch. None
    when the largest B has not yet doubled the B = 1 time (still memory-bound: no slope)."""
    t = {r["batch"]: sum(g["seconds"] for g in r["gemms"]) for r in results}
    last = max(t)
    if 1 not in t or t[last] < 2 * t[1]:
        return None
    return t[1] / (t[last] / last)


def format_sweep(results, config, dtype, peaks):
    """The sweep's tables: per B the step's ms, tokens/s and its GEMMs against their roofs;
    per B and GEMM its intensity, bound and fraction of its roof; then the compute-bound B
    predicted from the ridge point beside the measured one."""
    dtype = dtypes.as_dtype(dtype)
    size, peak = dtype.itemsize, peaks.flops(dtypes.name(dtype))
    ridge = peak / peaks.bandwidth
    steps, gemms = [], []
    for r in results:
        g = r["gemms"]
        flops, nbytes = sum(x["flops"] for x in g), sum(x["bytes"] for x in g)
        seconds, roof = sum(x["seconds"] for x in g), sum(x["roof_s"] for x in g)
        steps.append(
            (
                r["batch"],
                f"{r['step_s'] * 1e3:,.2f}",
                f"{r['tokens_per_s']:,.1f}",
                f"{seconds * 1e3:,.2f}",
                f"{flops / nbytes:,.2f}",
                f"{roof / seconds:.2f}" if seconds else "-",
            )
        )
        for x in g:
            gemms.append(
                (
                    r["batch"],
                    x["names"],
                    f"{x['flops'] / x['bytes']:,.2f}",
                    x["bound"],
                    f"{x['roof_s'] * 1e3:,.3f}",
                    f"{x['seconds'] * 1e3:,.3f}",
                    f"{x['roof_s'] / x['seconds']:.2f}" if x["seconds"] else "-",
                )
            )
    predicted = [
        (names, f"{K:,} x {N:,}", _batch(compute_bound_batch(K, N, size, ridge)))
        for names, K, N, _, _ in decode_gemms(config)
    ]
    knee = compute_bound_step(config, size, peak, peaks.bandwidth)
    return "\n".join(
        [
            f"-- decode sweep, {dtypes.name(dtype)}: {peaks.machine}",
            f"  roofs: {peak / 1e9:,.1f} GFLOP/s, {peaks.bandwidth / GB:,.1f} GB/s: ridge point "
            f"{ridge:,.2f} FLOP/byte (tinygrad_like/peaks.py, measured {peaks.when})",
            table(
                ("B", "ms/step", "tokens/s", "GEMM ms", "GEMM FLOP/B", "GEMM frac of roof"),
                steps,
                "rrrrrr",
            ),
            table(
                ("B", "GEMM", "FLOP/byte", "bound", "roof ms", "ms", "frac of roof"),
                gemms,
                "rlrlrrr",
            ),
            "-- the B at which each GEMM turns compute-bound (intensity = the ridge point)",
            table(("GEMM", "K x N", "predicted B"), predicted, "llr"),
            f"  all the step's GEMMs: predicted B = {_batch(knee)}; measured B = "
            f"{_batch(measured_knee(results))} (where their B = 1 time meets the time per "
            "sequence at the largest B; none while that B has not doubled the B = 1 time)",
        ]
    )


def _batch(b):
    return f"{b:,.1f}" if b is not None else "none"
