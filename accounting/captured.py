"""A step captured and replayed (tinygrad_like.compile) beside the same step run eagerly: its
launches and host calls, the arena its buffers are planned in (graph/plan.py) beside the most
bytes they hold at once, and its host time, the step's seconds minus its kernels', before and
after. On the meta device only the counts: nothing runs.

Each way a step runs twice: once plain, for its seconds, and once with its kernels timed, for
theirs (eager under a deferred Profiler, replayed with Program.replay's timers), so that neither
time holds the other's bookkeeping.
"""

import statistics
import time
from dataclasses import dataclass

import numpy as np

from nn import KVCache
from optim.step import device_step
from tinygrad_like import backend, graph
from tinygrad_like.profiler import Profiler


@dataclass
class Captured:
    launches: int  # kernel launches per step, the same eager and replayed
    host_calls: int  # kernels.on_host calls per step (AdamW's scalars, a KV cache's length)
    arena_bytes: int  # the plan's arena: every buffer the step makes, placed by lifetime
    live_bytes: int  # the most bytes those buffers hold at once (no plan does with less)
    eager_seconds: float = None  # a step run eagerly (None on meta)
    eager_kernel_seconds: float = None  # its kernels' share
    replay_seconds: float = None  # the step replayed
    replay_kernel_seconds: float = None

    @property
    def eager_host(self):
        return self.eager_seconds - self.eager_kernel_seconds

    @property
    def replay_host(self):
        return self.replay_seconds - self.replay_kernel_seconds


def _counts(program):
    return Captured(program.launches, program.host_calls, program.plan.size, program.plan.live_peak)


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


def _found(program, eager, replayed):
    """program's counts with the medians of eager and replayed [(seconds, kernel seconds)]."""
    found = _counts(program)
    found.eager_seconds, found.eager_kernel_seconds = _medians(eager)
    found.replay_seconds, found.replay_kernel_seconds = _medians(replayed)
    return found


def _medians(pairs):
    return tuple(statistics.median(column) for column in zip(*pairs))


def training(model, optimizer, batch, scaler, repeats=1):
    """The training step device_step on one micro-batch (x, y) (B, T): `repeats` eager steps
    timed (twice each: see the module's docstring), two more that capture it (a recorded call
    keeps every buffer it made until the capture is read: slower than eager), then `repeats`
    replays timed (the medians). It trains the model: run it on a twin."""
    be = backend.get(model.get_input_embeddings().weight.device)
    batch = tuple(be.asarray(a) for a in batch)  # on the device (Trainer._captured says why)

    def eager(x, y):
        return device_step(model, optimizer, [(x, y)], scaler)

    step = graph.compile(eager)
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
    `repeats` replays timed (the medians)."""
    like = model.get_input_embeddings().weight
    be, steps = backend.get(like.device), 4 * repeats + 3
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
        return _counts(captured.program)
    eagerly = [_eagerly(be, lambda: step(token, at_length())) for _ in range(repeats)]
    captured(token, at_length())
    captured(token, at_length())
    replayed = [
        _replayed(be, lambda t=None: captured(token, at_length(), timers=t)) for _ in range(repeats)
    ]
    return _found(captured.program, eagerly, replayed)
