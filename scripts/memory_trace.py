"""Trace a few training steps: every kernel launch on a timeline per phase, and the live bytes
of every tagged buffer (weights, gradients, master, adam_m, adam_v, activations, temporaries).

Writes to --out-dir (default out/trace):
  trace.json   Chrome trace events: one duration ("X") event per kernel on a track per phase,
               and a counter ("C") of live bytes per tag after every allocation and free.
               Open it in https://ui.perfetto.dev or chrome://tracing.
  memory.png   live bytes over time stacked by tag, with the forward, backward and optimizer
               phases shaded.
and prints the peak bytes per tag (on CUDA, beside what CuPy's memory pool saw).

    python scripts/memory_trace.py                          # gpt2-mini, 3 steps, B=4, T=64
    python scripts/memory_trace.py --model gpt2 --steps 2 --batch-size 1 --dtype bf16
"""

import contextlib
import gc
import json
import os

import numpy as np

from accounting.tables import table
from tinygrad_like import backend, memory
from tinygrad_like.memory import TAGS, TRACKER
from tinygrad_like.profiler import PHASES, Profiler
from training.args import ArgumentParser, add_model_args, check_model_args, user_errors
from training.cli import ensure_data
from training.corpus import DEFAULT_DATA_DIR
from training.loop import RunConfig, Trainer

PHASE_COLORS = {
    "forward": "tab:blue",
    "backward": "tab:red",
    "optimizer": "tab:green",
    "other": "tab:gray",
}


def parse_args(argv=None):
    p = ArgumentParser(
        description="Chrome trace and memory plot of a few training steps (GPT-2 or Llama preset)."
    )
    add_model_args(p, model="gpt2-mini", batch_size=4, seq_len=64)
    p.add_argument("--steps", type=int, default=3, help="training steps traced (default 3)")
    p.add_argument(
        "--data-dir",
        default=DEFAULT_DATA_DIR,
        help="folder with train.bin and val.bin (the default is made if missing)",
    )
    p.add_argument("--out-dir", default="out/trace", help="where trace.json and memory.png go")
    return p.parse_args(argv)


def trace_steps(trainer, steps, before):
    """Run training steps with every launch timed and every buffer (temporaries too) tracked
    on one clock. before: the bytes per tag the process held before the run was built (in a
    program that imports this, other work's buffers), left out of the events' starting point.
    -> (profiler, memory events, the pool watcher's report or None)."""
    # a device with a memory pool of its own (CUDA: CuPy's) watches it, to cross-check
    pool = getattr(backend.get(trainer.device), "PoolWatcher", None)
    watcher = pool() if pool else None
    gc.collect()  # buffers that died before the trace (in cycles) are not its events
    with watcher or contextlib.nullcontext(), Profiler(timing=True) as prof:
        TRACKER.start_recording(temporaries=True, t0=prof.t0)
        try:
            for _ in range(steps):
                trainer.train_step()
                trainer.step += 1
        finally:
            events = TRACKER.stop_recording()
    starts = [(t, tag, nbytes - before[tag]) for t, tag, nbytes in events[: len(TAGS)]]
    return prof, starts + events[len(TAGS) :], watcher.report() if watcher else None


def chrome_trace(prof, events, title):
    """The trace-event JSON object: kernels on a track per phase, memory as one counter."""
    meta = [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": 1, "tid": 0, "args": {"name": title}}
    ]
    counters = memory.counter_events(events, pid=1, tid=len(PHASES))
    return {
        "traceEvents": meta + prof.chrome_trace_events(pid=1) + counters,
        "displayTimeUnit": "ms",
    }


def plot_memory(events, spans, path, title):
    """Live MB over time stacked by tag, each phase's spans shaded behind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    times, series = memory.timeline(events)
    t_ms = np.asarray(times) * 1e3
    fig, ax = plt.subplots(figsize=(12, 5))
    for phase, start, end in spans:
        ax.axvspan(start * 1e3, end * 1e3, color=PHASE_COLORS[phase], alpha=0.12, lw=0)
    ax.stackplot(t_ms, *[np.asarray(series[tag]) / 1e6 for tag in TAGS], labels=TAGS, step="post")
    tags = ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), title="buffers")
    ax.add_artist(tags)
    phases = ax.legend(
        handles=[
            Patch(color=PHASE_COLORS[p], alpha=0.25, label=p)
            for p in PHASES
            if any(s[0] == p for s in spans)
        ],
        loc="lower left",
        bbox_to_anchor=(1.01, 0.0),
        title="phases",
    )
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("live bytes (MB)")
    ax.set_xlim(0, t_ms[-1] if len(t_ms) else 1)
    ax.set_title(title)
    fig.savefig(path, dpi=110, bbox_inches="tight", bbox_extra_artists=(tags, phases))
    plt.close(fig)


def format_peaks(pool, before):
    """The tracker's peaks per tag and of their sum, less what the process held before the run
    (before: bytes per tag; those buffers lived through the trace, so the peaks hold them)."""
    peaks = {tag: TRACKER.peak[tag] - before[tag] for tag in TAGS}
    total = TRACKER.peak_total - sum(before.values())
    rows = [(tag, f"{peaks[tag]:,}", f"{peaks[tag] / 1e6:,.1f}") for tag in TAGS]
    rows.append(("total (peak of the sum)", f"{total:,}", f"{total / 1e6:,.1f}"))
    if pool is not None:
        rows.append(
            (
                "CuPy pool, peak in use",
                f"{pool['peak_used_bytes']:,}",
                f"{pool['peak_used_bytes'] / 1e6:,.1f}",
            )
        )
    return table(("tag", "peak bytes", "peak MB"), rows)


def main(argv=None):
    args = parse_args(argv)
    with user_errors():
        check_model_args(args)
        if args.steps <= 0:
            raise ValueError(f"--steps must be positive, got {args.steps}")
        device = args.device
        cfg = RunConfig(
            model=args.model,
            data_dir=args.data_dir,
            batch_size=args.batch_size,
            seq_len=args.seq_len,
            steps=args.steps,
            dtype=args.dtype,
            device=device,
            eval_every=0,
            out=args.out_dir,
            quiet=True,
        )
        ensure_data(cfg)
        before = TRACKER.settled()  # what died before the run is not held against it
        trainer = Trainer(cfg)
    prof, events, pool = trace_steps(trainer, args.steps, before)
    title = (
        f"{args.model}, {args.dtype}, B={args.batch_size}, T={args.seq_len}: "
        f"{args.steps} training steps on {device}"
    )
    os.makedirs(args.out_dir, exist_ok=True)
    trace_path = os.path.join(args.out_dir, "trace.json")
    with open(trace_path, "w") as f:
        json.dump(chrome_trace(prof, events, title), f)
    png_path = os.path.join(args.out_dir, "memory.png")
    plot_memory(events, prof.phase_spans(), png_path, title)
    print(f"traced {title}: {len(prof.launches):,} launches, {len(events):,} memory events")
    print(f"peak live bytes per tag while tracing:\n{format_peaks(pool, before)}")
    print(f"wrote {trace_path} (open in https://ui.perfetto.dev) and {png_path}")


if __name__ == "__main__":
    main()
