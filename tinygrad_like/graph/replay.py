"""A captured step's replay as one generated Python function (tinygrad's TinyJit runs its
captured kernels from a list; here the list is unrolled into source): each launch one line that
calls its kernel on local variables, each buffer the step makes a local (v3), each host call's
result a local (h0), each constant (a weight, a shape, a kernel) a global of the generated code,
so that a launch costs Python one call and no list building, closure or dictionary per argument.
The views a launch takes of a buffer the step makes are rebuilt each replay (_view_of: the
buffer is new each time), those of constant arrays never.

    steps: Program.steps (capture.py), result: its result's description
"""

import numpy as np

from .. import backend
from ..memory import root


def generate(steps, result, timer, given=()):
    """-> replay(timers, *given): the steps run in order -> the step's result (built of this
    run's buffers). timers: None, or a list each kernel's timer (timer(), the device's) is
    appended to, in a second generated function made when first asked for. given: the names of
    what earlier steps made ("v3": a value, "h1": a host call's result), passed in that order
    (device_graph.py runs a step in parts)."""
    made = {}

    def replay(timers=None, *arrays):
        timed = timers is not None
        if timed not in made:
            made[timed] = _function(steps, result, timer, timed, given)
        return made[timed](timers, *arrays)

    return replay


def _function(steps, result, timer, timed, given=()):
    scope = {"_view_of": _view_of, "root": root, "timer": timer}
    constant = _Constants(scope)
    lines = []
    for step in steps:
        if step[0] == "host":  # ("host", fn, ("seq", type, its arguments), k)
            call = ", ".join(_argument(d, constant) for d in step[2][2])
            lines.append(f"h{step[3]} = {constant(step[1])}({call})")
            continue
        for v, shape, dtype, device in step.allocs:  # what the step's Python allocated
            lines.append(f"v{v} = {constant(device.empty)}({constant(shape)}, {constant(dtype)})")
        arguments = [_argument(d, constant) for d in step.args]
        arguments += [f"{k}={_argument(d, constant)}" for k, d in step.kwargs.items()]
        call = f"{constant(step.kernel)}({', '.join(arguments)})"
        if timed:
            lines += ["t = timer()", f"out = {call}", "timers.append(t.stop())"]
        else:
            lines.append(f"out = {call}")
        fills = [(i, v, step.shapes[i]) for i, v in enumerate(step.makes) if v is not None]
        if fills:
            lines.append("outs = out if out.__class__ is tuple else (out,)")
        for i, v, shape in fills:
            held = f"root(outs[{i}])" if shape is None else f"outs[{i}].reshape({constant(shape)})"
            lines.append(f"v{v} = {held}")
    lines.append(f"return {_argument(result, constant)}")
    parameters = "".join(f", {name}" for name in given)
    source = f"def replay(timers{parameters}):\n" + "".join(f"    {line}\n" for line in lines)
    exec(compile(source, "<replay>", "exec"), scope)
    return scope["replay"]


class _Constants:
    """Names in the generated code's globals for the replay's constants, one per object."""

    def __init__(self, scope):
        self.scope, self.names = scope, {}

    def __call__(self, x):
        key = id(x)
        if key not in self.names:
            self.names[key] = f"c{len(self.names)}"
            self.scope[self.names[key]] = x
        return self.names[key]


def _argument(d, constant):
    """The source of an argument's description (capture.py's: "const", "hosted", "seq",
    "value")."""
    kind = d[0]
    if kind == "const":
        return constant(d[1])
    if kind == "hosted":
        return f"h{d[1]}"
    if kind == "seq":
        return f"{constant(d[1])}(({''.join(_argument(x, constant) + ', ' for x in d[2])}))"
    v, view = d[1], d[2]
    if view is None:
        return f"v{v}"
    shape, strides, offset = view
    return f"_view_of(v{v}, {constant(shape)}, {constant(strides)}, {offset})"


def _view_of(buffer, shape, strides, offset):
    """The view (shape, strides) at a byte offset of buffer, a contiguous array: NumPy's own
    constructor on the CPU (a tenth of as_strided's time), as_strided on a GPU, and on the meta
    device an array of that shape, strides and offset whose base is buffer (no bytes behind it)."""
    if type(buffer) is np.ndarray and buffer.flags.c_contiguous:
        return np.ndarray(shape, buffer.dtype, buffer, offset, strides)
    be = backend.of(buffer)
    if not be.HOLDS_VALUES:
        return type(buffer)(shape, buffer.dtype, strides, buffer, offset=offset)
    flat = buffer.reshape(-1)[offset // buffer.itemsize :]
    return be.xp.lib.stride_tricks.as_strided(flat, shape, strides)
