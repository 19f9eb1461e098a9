"""A step captured and replayed (tinygrad_like.compile) beside the same step run eagerly: its
launches and host calls, the arena its buffers are planned in (graph/plan.py) beside the most
bytes they hold at once, and its host time, the step's seconds minus its kernels', before and
after. On the meta device only the counts: nothing runs.

Each way a step runs twice: once plain, for its seconds, and once with its kernels timed, for
theirs (eager under a deferred Profiler, replayed with Program.replay's timers), so that neither
time holds the other's bookkeeping.
"""

import time
from dataclasses import dataclass

import numpy as np

from nn import KVCache
from optim.step import device_step
from tinygrad_like import backend, graph
from tinygrad_like.profiler import Profiler

from .predictions import predicted_peak, step_moments
from .tables import table, wrap


@dataclass
class Captured:
    eager_launches: int  # kernel launches per step, eagerly (and recorded)
    launches: (
        int  # replayed: fewer by the adds and activations fused into their kernels (graph/fuse.py)
    )
    host_calls: int  # kernels.on_host calls per step (AdamW's scalars, a KV cache's length)
    arena_bytes: int  # the plan's arena: every buffer the step makes, placed by lifetime
    live_bytes: int  # the most bytes those buffers hold at once (no plan does with less)
    eager_bytes: int  # bytes the step's kernels move eagerly, counted as the launch point does
    replay_bytes: int  # the same count over the fused step's launches
    fused_saved: int  # predicted bytes the fusions remove: each intermediate written, read back
    eager_seconds: float = None  # a step run eagerly (None on meta)
    eager_kernel_seconds: float = None  # its kernels' share
    replay_seconds: float = None  # the step replayed
    replay_kernel_seconds: float = None
    fused: list = None  # Program.fused_census(): per kind of fused launch (counted steps only)
    graphs: int = None  # device graphs launched per replayed step (None: its launches from Python)
    graph_bytes: int = None  # the device memory those graphs keep (their pools: the arena's twin)
    python_seconds: float = None  # with graphs, the step replayed launch by launch from Python

    @property
    def eager_host(self):
        return self.eager_seconds - self.eager_kernel_seconds

    @property
    def replay_host(self):
        return self.replay_seconds - self.replay_kernel_seconds


def _counts(program, counted=True):
    """program's counts; counted=False leaves its bytes out (None): a decode step's KV reads
    depend on its length, which the meta device's captured positions do not hold (the counts
    must read the same on meta as on the CPU: tests/test_docs.py)."""
    return Captured(
        program.eager_launches,
        program.launches,
        program.host_calls,
        program.plan.size,
        program.plan.live_peak,
        program.eager_bytes if counted else None,
        program.bytes if counted else None,
        sum(f.saved for f in program.fusions),
        fused=program.fused_census() if counted else None,
        graphs=program.graph.graphs if program.graph is not None else None,
        graph_bytes=program.graph.nbytes() if program.graph is not None else None,
    )


def _timed(be, run):
    """The seconds of run(), the device finished with it."""
    t0 = time.perf_counter()
    run()
    be.synchronize()
    return time.perf_counter() - t0


def _eagerly(be, run):
    """(seconds of a plain run(), of its kernels in a second run, profiled)."""
    seconds = _timed(be, run)
    with Profiler(timing=True, deferred=True) as prof:
        run()
    return seconds, sum(launch.seconds for launch in prof.launches)


def _replayed(be, run):
    """(seconds of a plain replay run(), of its kernels in a second run(timers))."""
    seconds, timers = _timed(be, run), []
    run(timers)
    return seconds, sum(t.seconds() for t in timers)


def _found(program, eager, replayed, counted=True):
    """program's counts with the best of eager and replayed [(seconds, kernel seconds)], each
    column's least (the least disturbed: the two columns come from different runs, so a host
    time, their difference, is only as good as their noise)."""
    found = _counts(program, counted)
    found.eager_seconds, found.eager_kernel_seconds = _best(eager)
    found.replay_seconds, found.replay_kernel_seconds = _best(replayed)
    return found


def _best(pairs):
    return tuple(min(column) for column in zip(*pairs))


def training(model, optimizer, batch, scaler, repeats=1, fuse=True):
    """The training step device_step on one micro-batch (x, y) (B, T): `repeats` eager steps
    timed (twice each: see the module's docstring), two more that capture it (a recorded call
    keeps every buffer it made until the capture is read: slower than eager), then `repeats`
    replays timed (the best of each), its adds and activations fused (graph/fuse.py) unless fuse is
    False. It trains the model: run it on a twin."""
    be = backend.get(model.get_input_embeddings().weight.device)
    batch = tuple(be.asarray(a) for a in batch)  # on the device (Trainer._captured says why)

    def eager(x, y):
        return device_step(model, optimizer, [(x, y)], scaler)

    step = graph.compile(eager, fuse=fuse)
    if not be.HOLDS_VALUES:
        step(*batch)
        step(*batch)
        return _counts(step.program)
    eagerly = [_eagerly(be, lambda: eager(*batch)) for _ in range(repeats)]
    step(*batch)
    step(*batch)
    replayed = [_replayed(be, lambda t=None: step(*batch, timers=t)) for _ in range(repeats)]
    return _found(step.program, eagerly, replayed)


def decode(model, x, repeats=5):
    """The decode step (CausalLM.decode_step, B = 1) after a prompt, the first row of token ids
    x (B, T), filled a KV cache: one untimed step (its first kernels' compiles), `repeats` eager
    steps timed (twice each: see the module's docstring), two more that capture it, then
    `repeats` replays timed (the best of each); where the replay runs as a graph (CUDA's, or
    the CPU's compiled ops: graph/cpu_step.py) and the context has room, each repeat also a
    replay launched from Python (python_seconds), the two ways taking turns."""
    like = model.get_input_embeddings().weight
    be, steps = backend.get(like.device), 4 * repeats + 3
    python_repeats = repeats if model.config.n_positions > steps + repeats else 0
    steps += python_repeats
    prompt = x[:1, : min(x.shape[1], model.config.n_positions - steps)]
    P = prompt.shape[1]
    cache = KVCache(model.config, 1, P + steps, like)
    step = model.decode_step(cache)
    captured = graph.compile(step)
    step(be.asarray(prompt), be.asarray(np.arange(P)))
    token = be.asarray(prompt[:, -1:])

    def at_length():  # the next position, a device array (1,)
        return be.asarray(np.arange(cache.length, cache.length + 1))

    step(token, at_length())
    if not be.HOLDS_VALUES:
        captured(token, at_length())
        captured(token, at_length())
        return _counts(captured.program, counted=False)
    eagerly = [_eagerly(be, lambda: step(token, at_length())) for _ in range(repeats)]
    captured(token, at_length())
    captured(token, at_length())
    program, replayed, python = captured.program, [], []

    def from_python():  # the replay of each kernel from Python, where a graph holds them
        held, program.graph = program.graph, None
        try:
            captured(token, at_length())
        finally:
            program.graph = held

    for _ in range(repeats):
        replayed.append(_replayed(be, lambda t=None: captured(token, at_length(), timers=t)))
        if program.graph is not None and len(python) < python_repeats:
            python.append(_timed(be, from_python))
    found = _found(program, eagerly, replayed, counted=False)
    found.python_seconds = min(python, default=None)
    return found


def host_ms(host):
    """A host time in ms; under 0 it is "~0": a step's seconds and its kernels' come from two
    runs, so their difference carries both runs' noise, and a host time below it reads as less
    than nothing."""
    return "~0" if host < 0 else f"{host * 1e3:,.2f}"


def host_cell(host, seconds):
    """host_ms with its share of the step's seconds."""
    return host_ms(host) + ("" if host < 0 else f" ({host / seconds:.0%})")


def fused_line(name, c):
    """The bytes a step's fusions removed (graph/fuse.py): counted by the launch point over the
    eager and the fused launches, beside the course's arithmetic (2 |C| per launch folded, |C|
    for an activation whose input C the backward still reads)."""
    line = (
        f"fused {name} step: {c.eager_launches - c.launches} adds, scalings, casts and activations "
        "folded into the kernels that made their operands (graph/fuse.py), predicted "
        f"{c.fused_saved:,} bytes fewer (2 |C| each, |C| where C is kept)"
    )
    if c.eager_bytes is not None:
        line += (
            f"; counted at the launches {c.eager_bytes:,} -> {c.replay_bytes:,} bytes, "
            f"{c.eager_bytes - c.replay_bytes:,} fewer"
        )
    return wrap(line)


def fused_table(census):
    """The training step's fused launches by kind (Program.fused_census): how many, the bytes
    they move, the bytes their fusions removed."""
    rows = [
        (name, n, f"{moved:,}", f"{saved:,}", f"{saved / (moved + saved):.0%}")
        for name, n, moved, saved in census
    ]
    columns = ("fused launch (training step)", "launches", "bytes", "bytes removed", "of unfused")
    return table(columns, rows, "lrrrr")


def section(m, timed):
    """The two steps captured and replayed (this module): launches and host calls
    per step, host time eager and replayed, and the training step's buffers in their arena
    beside the tracker's peak and the predicted one, each above the persistent state."""
    train, decode = m.captured_step, m.captured_decode
    rows = []
    for name, c in (("training step", train), ("decode step (M = 1)", decode)):
        launches = f"{c.eager_launches:,} -> {c.launches:,}"
        row = [name, launches, c.host_calls, f"{c.arena_bytes:,}", f"{c.live_bytes:,}"]
        if timed:
            row += [
                f"{c.eager_seconds * 1e3:,.2f}",
                host_cell(c.eager_host, c.eager_seconds),
                f"{c.replay_seconds * 1e3:,.2f}",
                host_cell(c.replay_host, c.replay_seconds),
            ]
        rows.append(row)
    columns = ["step", "launches (fused)", "host calls", "arena bytes", "live peak"]
    if timed:
        columns += ["eager ms", "host ms", "replayed ms", "host ms"]
    persistent = sum(m.persistent.values())
    tracked = m.peak_bytes - persistent
    _, predicted = predicted_peak(
        m.config, m.batch_size, m.seq_len, m.dtype, m.options, m.zero, m.world_size
    )
    moments = step_moments(
        m.config, m.batch_size, m.seq_len, m.dtype, m.options, m.zero, m.world_size
    )
    state = sum(b for what, b in next(iter(moments.values())) if what.startswith("persistent"))
    lines = [
        "-- captured steps (tinygrad_like.compile, --compile): the kernels replayed in order, "
        "no op layer, adds and activations fused",
        table(columns, rows, "lrrrr" + "rrrr" * timed),
        wrap(
            "arena: every buffer the step makes, placed by lifetime (graph/plan.py, greedy by "
            "size); live peak: the most of them alive at once. Host time: a step's seconds minus "
            "its kernels' (eager: a plain step's seconds, a profiled step's kernels; replayed: "
            "one timer per kernel; ~0: below the two runs' noise)."
        ),
        *(fused_line(name, c) for name, c in (("training", train), ("decode", decode))),
        fused_table(train.fused),
        wrap(
            "the training step's buffers, above the persistent state: planned "
            f"{train.arena_bytes:,} bytes, live peak {train.live_bytes:,}; the tracker's peak "
            f"{tracked:,} (measured), "
            f"{tracked - train.live_bytes:+,}: the tracker counts besides what the tape saves that "
            "no kernel of the step made (the token ids, the targets, GPT-2's positions: constants "
            "of a replay), what eager Python holds past its last read (a plan frees a buffer "
            "there) and the C of each add fused, which the eager step makes and the fused one "
            f"never does; predicted {predicted - state:,.0f} (accounting/predictions.py)"
        ),
    ]
    return "\n".join(lines)
