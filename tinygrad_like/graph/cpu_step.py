"""A captured step replayed on the CPU as one parallel hand-off per run of launches
(backend/cpu/step_runner.py), where capture.py's replay launches each kernel from Python: the
CPU's counterpart of a CUDA graph (device_graph.py), the launches frozen on fixed buffers.

Every buffer the step makes lives in one arena at the offset its memory plan gave it (plan.py:
two buffers share bytes when their lifetimes do not meet), allocated once. Each launch becomes
the ops of its kernel's form (a family's cpu_step.py) over these buffers, the weights and the
step's inputs; a host call (a KV cache's length grown) is moved past the launches that touch
nothing of its (device_graph.py's rule) and runs from Python between runs of ops. A call runs
the launches' checks of the step's inputs (a token id in range, a position in the cache) on the
host before anything runs (a bad input changes nothing, as eagerly), then the ops, and returns
the step's result copied out of the arena (the next call writes it again). A step with a launch
no form takes (an fp8 KV cache's kernels, a model in a 2-byte dtype, a prompt's GEMMs, a
training step's backward) stays a replay from Python, as a step with a host value stays out of
a CUDA graph: compiled() says why.
"""

import importlib
from pathlib import Path

import numpy as np

from ..backend.cpu import step_runner
from ..memory import root
from .device_graph import _copied, _moved
from .plan import ALIGN
from .replay import _view_of

# the kernel families with a cpu_step.py of forms, imported when a step is first compiled
FAMILIES = sorted(
    p.parent.name for p in (Path(__file__).parents[1] / "kernels").glob("*/cpu_step.py")
)


def compiled(program):
    """-> (replay(), None) running program's steps as ops where every launch has a form, else
    (None, why not)."""
    if not step_runner.run_ready():
        return None, "the thread pool cannot hold every thread in one loop (TBB)"
    for family in FAMILIES:
        importlib.import_module(f"tinygrad_like.kernels.{family}.cpu_step")
    missing = {s.name for s in program.steps if s[0] == "launch"} - set(step_runner.FORMS)
    if missing:
        return None, f"no op form for {', '.join(sorted(missing))}"
    arena, buffers = _arena(program)
    hosted = {}

    def resolve(d):
        kind = d[0]
        if kind == "const":
            return d[1]
        if kind == "hosted":
            if d[1] not in hosted:
                raise step_runner.Unsupported("a launch takes a host call's result")
            return hosted[d[1]]
        if kind == "seq":
            return d[1](resolve(x) for x in d[2])
        v, view = d[1], d[2]
        return buffers[v] if view is None else _view_of(buffers[v], *view)

    parts = []  # step_runner.Ops, or a host call's (fn, its arguments' description, k)
    try:
        for s in _moved(program.steps):
            if s[0] == "host":
                parts.append(s[1:])
                continue
            if not parts or not isinstance(parts[-1], step_runner.Ops):
                parts.append(step_runner.Ops({id(arena)}))
            args = [resolve(d) for d in s.args]
            kwargs = {k: resolve(d) for k, d in s.kwargs.items()}
            step_runner.FORMS[s.name](parts[-1], _outputs(s, buffers), *args, **kwargs)
        for part in parts:
            if isinstance(part, step_runner.Ops):
                part.ready()  # each op compiled (or loaded from the disk cache) now
    except step_runner.Unsupported as e:
        return None, str(e)
    result = program.result
    ops = [p for p in parts if isinstance(p, step_runner.Ops)]
    timer = program.device.start_timer

    def replay(timers=None):
        """The step's ops and host calls; timers: a list each run of ops' timer is appended to
        (its seconds the step's kernels', as a replay's launches' are)."""
        for part in ops:  # every check before anything runs: a bad input changes nothing
            part.check_inputs()
        for part in parts:
            if isinstance(part, step_runner.Ops):
                t = timer() if timers is not None else None
                part.run()
                if t is not None:
                    timers.append(t.stop())
            else:
                fn, arguments, k = part
                hosted[k] = fn(*resolve(arguments))
        return _copied(resolve(result))

    replay.timed = True  # it takes Program.replay's timers (a CUDA graph's replay does not)
    replay.graphs = len(ops)  # hand-offs a call (accounting/captured.py reads graphs' figures)
    replay.nbytes = lambda: arena.nbytes + sum(a.nbytes for p in ops for a in p.scratches)
    return replay, None


def _arena(program):
    """(arena, buffers): one uint8 array of the plan's size (ALIGN-aligned), and per value the
    view of it at its planned offset in its first recording's shape and dtype (None for a value
    no step makes)."""
    program.planned()
    made = [v for v, birth in enumerate(program.births) if birth is not None]
    raw = np.empty(program.plan.size + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    arena = raw[start : start + program.plan.size]
    buffers = [None] * len(program.buffers)
    for v, offset in zip(made, program.plan.offsets):
        b = program.buffers[v]
        buffers[v] = arena[offset : offset + b.nbytes].view(b.dtype).reshape(b.shape)
    return arena, buffers


def _outputs(step, buffers):
    """Per output of a launch, its buffer shaped as the kernel returns it, or None where the
    output is no new buffer (an argument written in place, or no array)."""
    recorded = step.recorded[2]
    recorded = recorded if isinstance(recorded, tuple) else (recorded,)
    outs = []
    for v, out in zip(step.makes, recorded):
        if v is None:
            outs.append(None)
            continue
        b = buffers[v]
        if b.size != out.size or b.dtype != out.dtype or root(out).size != out.size:
            raise step_runner.Unsupported(f"{step.name} returns a view into a larger buffer")
        outs.append(b.reshape(out.shape))
    return outs
