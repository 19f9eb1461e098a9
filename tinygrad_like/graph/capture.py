"""Capture: a step's kernel launches recorded as they pass kernels.launch, then replayed without
the op layer: no Tensor, Function, tape or Module code per op, only the kernels in order.

A step is recorded on two calls, and the recordings are read side by side. Each argument of a
launch must be, in both, a buffer the step makes (a kernel's output, or a buffer the step's
Python allocates and a kernel writes before anything reads it), at the same place within it; or
the same array object both times (a weight, a KV cache, the gradients, the step's input
buffers, whose contents change between calls: constants of the replay); or an equal Python
value. An argument that differs otherwise is a value the step's Python computed from something
that changes between calls, which a replay would pass stale: it is refused, naming the launch,
so that the value becomes an array the kernels read (a KV cache's positions). Host state a step
changes besides its arrays (a KV cache's length, AdamW's scalars of the step) goes through
kernels.on_host, which the replay runs too, in its place, passing its new result wherever the
recordings passed that object (a result that is an interned Python value, None, a bool, a small
int or a string, cannot be told from a constant: give such values in an object of their own).
Shapes: v a value (a buffer the step makes, numbered as it appears), view (shape, strides, byte
offset) within its buffer; k the number of a host call.
"""

from typing import Callable, NamedTuple

from .. import backend, kernels, profiler
from ..memory import root
from .plan import Buffer, plan
from .replay import generate


class Recording:
    """One call of a step, in order: ("launch", name, kernel, args, kwargs, out) and ("host",
    fn, args, result); with kernels.recording(it) kernels.launch and kernels.on_host add them."""

    def __init__(self):
        self.steps = []

    def launched(self, name, kernel, args, kwargs, out):
        self.steps.append(("launch", name, kernel, args, kwargs, out))

    def hosted(self, fn, args, result):
        self.steps.append(("host", fn, args, result))


class Launch(NamedTuple):
    """A launch of a Program's steps (a host call is ("host", fn, its arguments' "seq", k))."""

    kind: str  # "launch"
    kernel: Callable  # the device's kernel
    args: tuple  # each argument's description
    kwargs: dict
    makes: tuple  # per output: the value it starts, or None (no array, or an argument returned)
    allocs: tuple  # (v, shape, dtype, device): buffers the step's Python allocated for it
    name: str  # the kernel's name (kernels.KERNELS)
    shapes: tuple  # per output: the shape its value is held in (a fusion's reshape), or None
    recorded: tuple  # (args, kwargs, out) of the first recording, the arrays themselves
    folded: tuple = ()  # fuse.Fusion of each launch folded into it as its epilogue


class Mismatch(RuntimeError):
    """Two calls of a step launched what a replay cannot reproduce."""


def _is_array(x):
    return hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "nbytes")


def address(a):
    """a's first byte in memory (on the meta device, which has none, its offset in its buffer)."""
    if hasattr(a, "__array_interface__"):
        return a.__array_interface__["data"][0]
    data = getattr(a, "data", None)
    return getattr(data, "ptr", 0) if data is not None else getattr(a, "offset", 0)


def _view(a, buffer):
    """None when a is buffer itself, else (shape, strides, byte offset) of a within it."""
    if a is buffer:
        return None
    return tuple(a.shape), tuple(a.strides), address(a) - address(buffer)


def _said(x):
    if _is_array(x):
        return f"an array {tuple(x.shape)} {x.dtype}"
    return repr(x) if not isinstance(x, (list, tuple)) else f"a {type(x).__name__} of {len(x)}"


class Program:
    """The launches and host calls of a step read from two recordings, (recording, result) each;
    each argument described as ("const", x), ("value", v, view) or ("seq", type, items)."""

    def __init__(self, first, second):
        (rec1, result1), (rec2, result2) = first, second
        if len(rec1.steps) != len(rec2.steps):
            raise Mismatch(
                f"two calls of the step launched {len(rec1.steps)} and {len(rec2.steps)} "
                "kernels and host calls: what it launches depends on something that changes"
            )
        self.values = ({}, {})  # per recording: id(buffer) -> v
        self.buffers = []  # per v, its buffer in the first recording
        self.hosted = ({}, {})  # per recording: id(a host call's result) -> k
        self.device = None  # the backend module of the first launch's first array
        self.steps = []
        for i, (a, b) in enumerate(zip(rec1.steps, rec2.steps)):
            self.where = f"step {i} ({a[1] if a[0] == 'launch' else a[1].__name__})"
            if a[0] != b[0] or a[1] != b[1]:  # the kernel's name, or the host function
                raise Mismatch(f"{self.where}: the second call ran {b[1]} there")
            if a[0] == "host":
                k = len(self.hosted[0])
                self.steps.append(("host", a[1], self._describe(a[2], b[2]), k))
                if not isinstance(a[3], (type(None), bool, int, str)):
                    self.hosted[0][id(a[3])], self.hosted[1][id(b[3])] = k, k
            else:
                self.steps.append(self._launch(a, b))
        self.where = "the step's result"
        self.result = self._describe(result1, result2)
        self.recorded = list(self.steps)  # the launches as recorded, before any fusion
        # replay() as device graphs (device_graph.py), where the device has them, or on the CPU
        # as runs of compiled ops (cpu_step.py); python_why: why the CPU's stays from Python
        self.graph, self.python_why = None, None
        self.planned()

    @property
    def launches(self):
        return sum(step[0] == "launch" for step in self.steps)

    @property
    def eager_launches(self):
        """The launches as recorded: an eager step's."""
        return sum(step[0] == "launch" for step in self.recorded)

    @property
    def fusions(self):
        """fuse.Fusion of every launch folded into another (graph/fuse.py), in step order."""
        return [f for s in self.steps if s[0] == "launch" for f in s.folded]

    def fused_census(self):
        """[(kernel and what it took, e.g. "matmul_tn+mul+add", launches, bytes they move as
        the launch point counts them, bytes the fusions removed, predicted)] per kind of fused
        launch, the most bytes removed first."""
        rows = {}
        for s in self.steps:
            if s[0] == "launch" and s.folded:
                name = "+".join([s.name, *(f.folded for f in s.folded)])
                n, moved, saved = rows.get(name, (0, 0, 0))
                counted = kernels.count(s.name, *s.recorded)[2]
                rows[name] = (n + 1, moved + counted, saved + sum(f.saved for f in s.folded))
        return sorted(((k, *v) for k, v in rows.items()), key=lambda row: -row[3])

    @property
    def host_calls(self):
        return len(self.steps) - self.launches

    @property
    def bytes(self):
        """The bytes the step's launches move, as the launch point counts them (kernels.count)
        over the first recording's arrays (a decode step's KV reads at its length then)."""
        return _counted(self.steps)

    @property
    def eager_bytes(self):
        """The same count over the launches as recorded (before fuse.py)."""
        return _counted(self.recorded)

    def planned(self):
        """Each value's lifetime read from the steps as they are now (a fusion moves and removes
        some), and the memory plan of those alive (graph/plan.py)."""
        births, deaths = [None] * len(self.buffers), [None] * len(self.buffers)
        for i, step in enumerate(self.steps):
            for v in made(step):
                births[v] = i if births[v] is None else births[v]
            for v in read(step):
                deaths[v] = i
        for v in values(self.result):
            deaths[v] = len(self.steps)
        self.births, self.deaths = births, deaths
        alive = [
            Buffer(x.nbytes, b, d if d is not None else b)
            for x, b, d in zip(self.buffers, births, deaths)
            if b is not None
        ]
        self.plan = plan(alive)

    def _launch(self, a, b):
        """One launch, its arguments described and the buffers it makes numbered."""
        _, name, kernel, args1, kwargs1, out1 = a
        args2, kwargs2, out2 = b[3:]
        writes, known = set(kernels.KERNELS[name].writes), len(self.buffers)
        args = tuple(
            self._describe(x, y, j in writes) for j, (x, y) in enumerate(zip(args1, args2))
        )
        kwargs = {k: self._describe(x, kwargs2[k], k == "out") for k, x in kwargs1.items()}
        allocs = tuple(  # the buffers the step's Python allocated for this launch to write
            (v, tuple(self.buffers[v].shape), self.buffers[v].dtype, backend.of(self.buffers[v]))
            for v in range(known, len(self.buffers))
        )
        if self.device is None:  # the device the step runs on: its timers time a replay
            self.device = backend.of(next(kernels.arrays(args1)))
        given = {id(root(x)) for x in (*args1, *kwargs1.values()) if _is_array(x)}
        outs1, outs2 = ((o if isinstance(o, tuple) else (o,)) for o in (out1, out2))
        makes = tuple(self._made(x, y, given) for x, y in zip(outs1, outs2))
        shapes = (None,) * len(makes)
        return Launch("launch", kernel, args, kwargs, makes, allocs, name, shapes, a[3:])

    def _new(self, buffer1, buffer2):
        v = len(self.buffers)
        self.values[0][id(buffer1)], self.values[1][id(buffer2)] = v, v
        self.buffers.append(buffer1)
        return v

    def _made(self, x, y, given):
        """The value an output starts, or None: no array, or a launch's argument returned."""
        if not _is_array(x):
            return None
        buffer = root(x)
        if id(buffer) in given or id(buffer) in self.values[0]:
            return None
        return self._new(buffer, root(y))

    def _describe(self, x, y, written=False):
        """The description of an argument x (first recording) and y (second)."""
        k = self.hosted[0].get(id(x))
        if k is not None and self.hosted[1].get(id(y)) == k:
            return ("hosted", k)
        if isinstance(x, (list, tuple)) and not _is_array(x):
            if type(x) is type(y) and len(x) == len(y):
                return ("seq", type(x), tuple(self._describe(a, b) for a, b in zip(x, y)))
        elif not _is_array(x):
            if x is y or (type(x) is type(y) and not _is_array(y) and x == y):
                return ("const", x)
        elif _is_array(y):
            r1, r2 = root(x), root(y)
            v, view = self.values[0].get(id(r1)), _view(x, r1)
            if v is None and (x is y or (r1 is r2 and view == _view(y, r2))):
                return ("const", x)
            if v is None and written and r1 is not r2 and id(r2) not in self.values[1]:
                v = self._new(r1, r2)  # allocated by the step's Python, written here
            if v is not None and self.values[1].get(id(r2)) == v and view == _view(y, r2):
                return ("value", v, view)
        raise Mismatch(
            f"{self.where} takes a value that changes between calls of the step ({_said(x)}, "
            f"then {_said(y)}): a replay would pass the first again; make it an array the "
            "kernels read"
        )

    def replay(self, timers=None):
        """Run the step's kernels and host calls again -> its result, built of this run's
        buffers. timers: a list each kernel's timer (the device's) is appended to (a replay's
        host time is its seconds minus its kernels'; the CPU's compiled ops: a timer each run of
        them); a profiler that times launches gets them when no caller asks. The steps run as
        one function generated at the first replay (replay.py), after fuse.py has had its say;
        as what graph holds where it holds one: device graphs (device_graph.py), untimed; on the
        CPU, runs of compiled ops (cpu_step.py)."""
        if timers is None and profiler.timing_wanted():
            timers = []
        for prof in profiler.active():
            prof.replays.append(profiler.Replay(self, timers))
        if self.graph is not None and timers is None:
            return self.graph()
        if self.graph is not None and getattr(self.graph, "timed", False):
            return self.graph(timers)  # the CPU's compiled ops, each run of them timed
        if not hasattr(self, "_replay"):
            self._replay = generate(self.steps, self.result, self.device.start_timer)
        return self._replay(timers)


def _counted(steps):
    return sum(kernels.count(s.name, *s.recorded)[2] for s in steps if s[0] == "launch")


def values(d):
    """The values an argument's description refers to."""
    if d[0] == "value":
        yield d[1]
    elif d[0] == "seq":
        for x in d[2]:
            yield from values(x)


def arguments(step):
    """The descriptions of what a step passes to its kernel or host function."""
    return step[2][2] if step[0] == "host" else (*step.args, *step.kwargs.values())


def read(step):
    """The values a step passes to its kernel or host function (read, or written in place)."""
    for d in arguments(step):
        yield from values(d)


def made(step):
    """The values a launch makes: its new outputs and what the step's Python allocated for it."""
    if step[0] == "launch":
        yield from (v for v in step.makes if v is not None)
        yield from (v for v, *_ in step.allocs)
