"""Every kernel launch, as data: name, phase, FLOPs, bytes and (when asked) time.

kernels.launch() appends one Launch per kernel to every active Profiler. Nothing is kept unless
a Profiler is active: when nobody is looking (no profiler, no tape record being counted, no
memory tracker recording temporaries) a launch costs three checks before its kernel runs. The
sums per phase divided by the tokens in the step and by N are the measured multiples of N (2N
forward, 4N backward).

Each launch has two labels: its phase, where it ran, and its math, the phase whose work it is.
They agree unless a math(...) block says otherwise: the fused LM head's "precompute" design
forms the head's gradients in the forward phase (math "backward"), its "recompute" design and
activation recomputation (autograd.checkpoint) redo forward work in the backward phase (math
"forward"). by_phase(by="math") sums
the launches by the second label.
"""

import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass

from . import backend

PHASES = ("forward", "backward", "optimizer", "other")
# the kernels that hold the 2N / 4N of the model (qmatmul: a quantized model's forward)
GEMMS = ("matmul", "matmul_nt", "matmul_tn", "qmatmul")
_phase = ["forward"]  # a stack; the top is the current phase
_math = [None]  # a stack; the top, when set, is the math label of launches now
_active = []  # the profilers recording now


@dataclass
class Launch:
    name: str
    phase: str
    flops: int
    bytes: int
    device: str
    timer: object = None  # backend timer with .seconds(), when timing is on
    start: float = 0.0  # host seconds since the profiler started (for the trace)
    math: str = None  # the phase whose work this is (see the module's docstring)
    exps: int = 0  # exp / tanh evaluations (kernels/record.py): a CPU bound of their own

    def __post_init__(self):  # made by kernels.launch as the kernel runs: read the label now
        if self.math is None:
            self.math = _math[-1] or self.phase

    @property
    def seconds(self):
        return self.timer.seconds() if self.timer is not None else 0.0


@dataclass
class Replay:
    """A captured step replayed (graph/capture.py Program.replay): its program, and its
    kernels' timers when a profiler timed launches (None otherwise)."""

    program: object
    timers: list = None

    @property
    def launches(self):
        return self.program.launches

    @property
    def seconds(self):
        """Its kernels' seconds (0.0 untimed)."""
        return sum(t.seconds() for t in self.timers or ())


def current_phase() -> str:
    return _phase[-1]


@contextlib.contextmanager
def _pushed(stack, name):
    assert name in PHASES, name
    stack.append(name)
    try:
        yield
    finally:
        stack.pop()


def phase(name: str):
    """with phase("backward"): the launches inside run in that phase."""
    return _pushed(_phase, name)


def math(name: str):
    """with math("backward"): the launches inside are that phase's work, whatever phase they
    run in."""
    return _pushed(_math, name)


def active():
    return _active


def timing_wanted() -> bool:
    return any(p.timing for p in _active)


def deferring() -> bool:
    """Whether every active profiler counts its launches later (Profiler(deferred=True))."""
    return all(p.deferred for p in _active)


class Profiler:
    """with Profiler(timing=True) as prof: ...  then prof.census(), prof.by_phase(), ...
    deferred=True: a launch keeps its arguments and result as they were and is counted when the
    launches are next read, so that while it runs the counting costs it a list append: a decode
    step timed without the counting's Python (accounting/decode.py StepMeter), yet counted launch
    by launch. It holds the step's arrays until then: for inference steps, not memory traces."""

    def __init__(self, timing=False, deferred=False):
        self.timing, self.deferred = timing, deferred
        self._launches, self._pending = [], []
        # the captured steps (graph/capture.py Program) replayed meanwhile, a Replay each: their
        # kernels pass no launch point, so a replay is heard of here, whole
        self.replays = []

    @property
    def launches(self):
        """Every Launch so far, in order (the deferred ones counted now)."""
        if self._pending:
            for name, device, timer, start, phase, math, counts in self._pending:
                flops, exps, nbytes = counts()
                self._launches.append(
                    Launch(name, phase, flops, nbytes, device, timer, start, math, exps)
                )
            self._pending = []
        return self._launches

    @launches.setter
    def launches(self, launches):
        self._launches, self._pending = list(launches), []

    def add(self, name, device, timer, t_host, counts):
        """A launch of kernel `name` that started at t_host (perf_counter), counted (counts:
        kernels.count's FLOPs, exps and bytes) or, for a deferred launch, a function that counts
        it when the launches are next read."""
        start = t_host - self.t0
        if callable(counts):
            math = _math[-1] or _phase[-1]
            self._pending.append((name, device, timer, start, _phase[-1], math, counts))
        else:
            flops, exps, nbytes = counts
            self._launches.append(
                Launch(name, _phase[-1], flops, nbytes, device, timer, start, exps=exps)
            )

    def __enter__(self):
        # the perf_counter() reading every Launch.start counts from (other timelines, such as
        # the memory tracker's, line up with this one through it)
        self.t0 = time.perf_counter()
        _active.append(self)
        return self

    def __exit__(self, *exc):
        _active.remove(self)
        for device in {launch.device for launch in self.launches}:
            backend.get(device).synchronize()

    def elapsed(self):
        return time.perf_counter() - self.t0

    def by_phase(self, kernels=None, by="phase"):
        """phase -> {launches, flops, bytes, seconds}; only the named kernels when given
        (by_phase(GEMMS) separates the matmul FLOPs from everything else). by="math" sums
        each launch under the phase whose work it is instead of the one it ran in."""
        out = {p: {"launches": 0, "flops": 0, "bytes": 0, "seconds": 0.0} for p in PHASES}
        for launch in self.launches:
            if kernels is not None and launch.name not in kernels:
                continue
            row = out[getattr(launch, by)]
            row["launches"] += 1
            row["flops"] += launch.flops
            row["bytes"] += launch.bytes
            row["seconds"] += launch.seconds
        return out

    def census(self):
        """One row per kernel name, most time (or FLOPs when untimed) first."""
        rows = defaultdict(lambda: {"calls": 0, "flops": 0, "bytes": 0, "exps": 0, "seconds": 0.0})
        for launch in self.launches:
            r = rows[launch.name]
            r["calls"] += 1
            r["flops"] += launch.flops
            r["bytes"] += launch.bytes
            r["exps"] += launch.exps
            r["seconds"] += launch.seconds
        total = sum(r["seconds"] for r in rows.values()) or 1.0
        table = []
        for name, r in rows.items():
            s = r["seconds"]
            table.append(
                {
                    "kernel": name,
                    **r,
                    "GB/s": r["bytes"] / s / 1e9 if s else 0.0,
                    "GFLOP/s": r["flops"] / s / 1e9 if s else 0.0,
                    "share": s / total,
                }
            )
        table.sort(key=lambda r: (r["seconds"], r["flops"]), reverse=True)
        return table

    def phase_spans(self):
        """[(phase, start, end)] in seconds since t0: one span per run of consecutive launches
        in one phase, so a training step reads as forward, backward, optimizer."""
        spans = []
        for launch in self.launches:
            end = launch.start + launch.seconds
            if spans and spans[-1][0] == launch.phase:
                spans[-1][2] = max(spans[-1][2], end)
            else:
                spans.append([launch.phase, launch.start, end])
        return [tuple(s) for s in spans]

    def chrome_trace_events(self, pid=1):
        """One complete ("X") event per kernel on a track (tid) per phase, times in µs."""
        events = [
            {"name": "thread_name", "ph": "M", "ts": 0, "pid": pid, "tid": i, "args": {"name": p}}
            for i, p in enumerate(PHASES)
        ]
        for k in self.launches:
            events.append(
                {
                    "name": k.name,
                    "ph": "X",
                    "pid": pid,
                    "tid": PHASES.index(k.phase),
                    "ts": k.start * 1e6,
                    "dur": max(k.seconds * 1e6, 0.01),
                    "cat": k.phase,
                    "args": {"flops": k.flops, "bytes": k.bytes, "math": k.math},
                }
            )
        return events


def format_census(rows, title="op census"):
    """The census as a table. Rows that carry a roofline (accounting/roofline.census adds
    "bound", "roofline_s", "fraction", "lost_s") get four more columns: the bound, the roofline
    time, the fraction of it reached and the time lost to it (measured - roofline)."""
    roof = bool(rows) and "bound" in rows[0]
    head = (
        f"{'kernel':<24}{'calls':>7}{'MB':>10}{'GFLOP':>10}{'ms':>10}{'GB/s':>9}"
        f"{'GFLOP/s':>10}{'share':>8}"
    )
    lines = [
        title,
        head + (f"{'bound':>9}{'roof ms':>10}{'of roof':>9}{'lost ms':>10}" if roof else ""),
    ]
    for r in rows:
        line = (
            f"{r['kernel']:<24}{r['calls']:>7}{r['bytes'] / 1e6:>10.1f}"
            f"{r['flops'] / 1e9:>10.3f}{r['seconds'] * 1e3:>10.2f}{r['GB/s']:>9.1f}"
            f"{r['GFLOP/s']:>10.1f}{r['share'] * 100:>7.1f}%"
        )
        if roof:
            fraction = "-" if r["fraction"] is None else f"{r['fraction']:.0%}"
            line += (
                f"{r['bound']:>9}{r['roofline_s'] * 1e3:>10.3f}{fraction:>9}"
                f"{r['lost_s'] * 1e3:>10.2f}"
            )
        lines.append(line)
    return "\n".join(lines)
