"""Our side of scripts/bench.py: build the model and optimizer, time training and decode steps,
summarize them, and take one step's census under the profiler.
"""

import statistics
import time

import machine
import numpy as np

from nn import GPT2
from optim import AdamW, LossScaler
from optim.step import device_step, train_on
from tinygrad_like import backend, graph, no_grad
from tinygrad_like.backend.cpu.compiled import use_pool
from tinygrad_like.gemm_library import choose as choose_gemm_library
from tinygrad_like.kernels.gemm.cpu_bf16 import use_training_pool
from tinygrad_like.profiler import Profiler


# |initial loss, ours - PyTorch's| allowed: both compute the same function, rounded alike
def build_ours(
    config, device="cpu", dtype="fp32", seed=0, lr=1e-4, weight_decay=0.1, grad_clip=1.0,
    batch=None, decode_only=False, **options,
):  # fmt: skip
    """Our model (options: attention, lm_head, recompute) and AdamW, and the fp16 loss scaler
    (None in fp32 and bf16). On the CPU the trainer's pool first (before the first kernel;
    after torch has loaded its libgomp in bench.py: docs/performance.md, "Which pool"), or
    generate.py's for a run that only decodes (decode_only: OpenMP's, for the decode step's
    compiled GEMVs), and its GEMM library for a step of batch (B, T) (gemm_library.py), when
    given."""
    if not backend.get(device).GPU:
        if decode_only:
            use_pool("omp")
        else:
            use_training_pool(dtype)
        if batch is not None:
            choose_gemm_library(config, *batch, dtype)
    model = GPT2(config, seed=seed, device=device, **options).flatten_parameters(dtype)
    opt = AdamW(
        model.named_parameters(),
        lr=lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        weight_decay=weight_decay,
        grad_clip=grad_clip,
    )
    return model, opt, LossScaler() if dtype == "fp16" else None


def ours_loss(model, x, y):
    with no_grad():
        return float(model(x, y)[1].item())


def ours_train_step(model, opt, x, y, device="cpu", scaler=None, step=device_step):
    """One optimizer step as the trainer takes it (optim/step.py, grad_accum 1, no data
    loading), finished on the device; step: device_step or captured_step's. -> the loss."""
    loss = train_on(model, opt, [(x, y)], scaler, step=step)[0]
    backend.get(device).synchronize()
    return loss


def captured_step(model, opt, scaler, device):
    """A step for train_on that records device_step on its first two calls and replays it
    after (tinygrad_like.compile), as train_gpt2.py --compile does: the batch moved to the
    device before each call, outside the captured step."""
    be = backend.get(device)
    replay = graph.compile(lambda x, y: device_step(model, opt, [(x, y)], scaler))

    def step(_model, _optimizer, batches, _scaler, watch=None):  # the ones replay closes over
        ((x, y),) = batches
        return replay(be.asarray(x), be.asarray(y))

    return step


def time_steps(step, n):
    """Run step() n times; -> ([(seconds, foreign CPU share) of each], the last loss)."""
    samples, loss = [], None
    for _ in range(n):
        loss, wall, foreign = machine.timed(step)
        samples.append((wall, foreign))
    return samples, loss


def round_summary(name, samples):
    """'name 12.3 ms/step (others used 4% of the CPUs)' from one round's (seconds, others)."""
    ms = statistics.median(t for t, _ in samples) * 1e3
    others = statistics.mean(f for _, f in samples)
    return f"{name} {ms:.1f} ms/step (others used {others:.0%} of the CPUs)"


def summarize_steps(samples, tokens, flops_per_token, peak):
    """Step times -> median (over the quiet steps), min, spread, tokens/s and MFU."""
    chosen, is_quiet = machine.quiet(samples)
    times = [t for t, _ in chosen]
    med = statistics.median(times)
    tps = tokens / med
    all_times = [t for t, _ in samples]
    return {
        "steps": len(samples),
        "quiet_steps": len(chosen) if is_quiet else 0,
        "median_ms": med * 1e3,
        "median_all_ms": statistics.median(all_times) * 1e3,
        "min_ms": min(all_times) * 1e3,
        "max_ms": max(all_times) * 1e3,
        "spread": (max(times) - min(times)) / med,
        "tokens_per_s": tps,
        "tokens_per_s_best": tokens / min(all_times),
        "mfu": tps * flops_per_token / peak,
        "foreign_cpu": statistics.mean(f for _, f in samples),
        "times_ms": [t * 1e3 for t in all_times],
        "foreign_cpu_per_step": [f for _, f in samples],
    }


def ours_generate(model, prompt, new_tokens, compile=False):
    """Greedy generation with the KV cache through GPT2.generate_stream (each token comes back
    to the host, so the clock reads finished work); compile: the decode step captured and
    replayed, as generate.py decodes by default.
    -> (prompt seconds (to the first new token), decode seconds (the other tokens), ids)."""
    t0 = time.perf_counter()
    stream = model.generate_stream(prompt, new_tokens, temperature=0.0, compile=compile)
    tokens = [next(stream)]
    t1 = time.perf_counter()
    tokens.extend(stream)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, np.stack(tokens, axis=1)


def time_generations(generate, n):
    """n runs of generate() -> [(prompt s, decode s, ids, foreign CPU share)]."""
    runs = []
    for _ in range(n):
        (prompt_s, decode_s, ids), _, foreign = machine.timed(generate)
        runs.append((prompt_s, decode_s, ids, foreign))
    return runs


def summarize_generation(runs, batch, prompt_len, new_tokens):
    """runs: [(prompt s, decode s, ids, foreign share)] -> medians over the quiet runs and
    tokens/s (decode counts the new_tokens - 1 steps after the first token, which the
    prompt's forward gives)."""
    chosen, is_quiet = machine.quiet(runs, key=lambda r: (r, r[3]))
    prompt_s = statistics.median(r[0] for r in chosen)
    decode_s = statistics.median(r[1] for r in chosen)
    steps = max(new_tokens - 1, 1)
    return {
        "runs": len(runs),
        "quiet_runs": len(chosen) if is_quiet else 0,
        "prompt_ms": prompt_s * 1e3,
        "prompt_tokens_per_s": batch * prompt_len / prompt_s,
        "decode_ms_per_token": decode_s / steps * 1e3,
        "decode_tokens_per_s": batch * steps / decode_s if decode_s > 0 else float("inf"),
        "foreign_cpu": statistics.mean(r[3] for r in runs),
        "prompt_ms_all": [r[0] * 1e3 for r in runs],
        "decode_ms_all": [r[1] * 1e3 for r in runs],
    }


def census_train_step(step):
    """Profile one training step with kernel timing -> the Profiler, wall seconds."""
    with Profiler(timing=True) as prof:
        step()
        wall = prof.elapsed()
    return prof, wall


def census_decode_step(model, prompt, new_tokens=3):
    """Profile the forward of one decode step (one new token, the KV cache filled by the prompt
    and one decode step before it) -> the Profiler, wall seconds."""
    stream = model.generate_stream(prompt, max(new_tokens, 3), temperature=0.0)
    next(stream)  # the prompt's forward and the first token
    next(stream)  # a decode step untimed: its kernels' first calls (a cold cache compiles them)
    with Profiler(timing=True) as prof:
        next(stream)  # one decode forward and its argmax
        wall = prof.elapsed()
    stream.close()
    return prof, wall


def format_phases(by_phase, wall):
    kernel_s = sum(row["seconds"] for row in by_phase.values())
    parts = [
        f"{name} {row['seconds'] * 1e3:.1f} ms / {row['launches']} launches"
        for name, row in by_phase.items()
        if row["launches"]
    ]
    return (
        f"  by phase: {', '.join(parts)}\n  wall {wall * 1e3:.1f} ms, in kernels "
        f"{kernel_s * 1e3:.1f} ms, outside kernels (Python, tape, allocation) "
        f"{(wall - kernel_s) * 1e3:.1f} ms ({(wall - kernel_s) / wall:.0%})"
    )
