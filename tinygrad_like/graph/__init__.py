"""Graph second: a step captured once through the launch point and replayed without the op layer
(capture.py), its buffers planned in one arena by their lifetimes (plan.py).

compile(fn), named as PyTorch's torch.compile (the command-line flag is --compile, and fused
kernels, the next step of a compiler, are to come from the same capture), wraps a step function
fn(*inputs) -> an array or a tuple of arrays, whose inputs are arrays of one device. The first
call with inputs of a shape runs fn eagerly, recording; the second runs it eagerly again,
recording, and checks the two (capture.py); every later call copies its inputs into the buffers
the first two ran on and replays the kernels (on a device that keeps graphs, as CUDA graphs:
device_graph.py; on the CPU, where every launch has an op form, as one parallel hand-off of
compiled ops over the memory plan's arena: cpu_step.py). A call whose inputs have another shape
or dtype is captured anew, and says so once. What changes between calls must reach the kernels
as the contents of an input (token ids, positions), never as a Python value the step computes:
a step that passes one (capture.py names the launch) runs eagerly from then on, and says so
once, as torch.compile falls back to eager where it cannot capture; fullgraph=True raises
instead.
"""

import sys

from .. import backend, kernels
from . import cpu_step
from .capture import Mismatch, Program, Recording
from .device_graph import graphed
from .fuse import fuse


def compile(fn, fuse=True, fullgraph=False):
    """fn as a captured step (see the module's docstring); fuse: fold its adds into the kernels
    that made their operands (fuse.py), False to replay the launches as recorded; fullgraph:
    raise where the step cannot be replayed, rather than run it eagerly (PyTorch's name)."""
    return Compiled(fn, fuse, fullgraph)


class Compiled:
    def __init__(self, fn, fuse=True, fullgraph=False):
        self.fn = fn
        self.fuse = fuse
        self.fullgraph = fullgraph
        self.name = getattr(fn, "__name__", "step")
        self.captures = {}  # (shape, dtype, device) of each input -> its Capture
        self.told = False
        self.last = None  # the Capture of the latest call

    @property
    def program(self):
        """The Program of the shape captured last (None until its second call)."""
        return self.last.program if self.last else None

    def __call__(self, *inputs, timers=None):
        """fn(*inputs), eagerly or replayed. timers: Program.replay's (a replay's kernel times)."""
        key = tuple((tuple(a.shape), a.dtype, backend.of(a).name) for a in inputs)
        capture = self.captures.get(key)
        if capture is None:
            if self.captures and not self.told:
                print(
                    f"compile: {self.name} captured again, for inputs "
                    f"{', '.join(f'{s} {d}' for s, d, _ in key)}",
                    file=sys.stderr,
                )
                self.told = True
            capture = self.captures[key] = Capture(inputs, self.fuse)
        self.last = capture
        if capture.failed is None:
            result = capture(self.fn, inputs, timers)
            if capture.failed is None:
                return result
            if not self.fullgraph:
                print(f"compile: {self.name} runs eagerly: {capture.failed}", file=sys.stderr)
                return result
        if self.fullgraph:
            raise RuntimeError(f"compile: cannot replay the step: {capture.failed}")
        return self.fn(*inputs)


class Capture:
    """One shape of a step: the buffers its inputs are copied into, its two recordings, then
    its Program (or, where they cannot be replayed, why not: failed)."""

    def __init__(self, inputs, fuse):
        self.buffers = [backend.of(a).empty(a.shape, a.dtype) for a in inputs]
        self.fuse = fuse
        self.recordings = []
        self.program = None
        self.failed = None  # the Mismatch that keeps the step from a replay: fn runs as it is

    def __call__(self, fn, inputs, timers=None):
        for buffer, a in zip(self.buffers, inputs):
            if backend.of(buffer).HOLDS_VALUES:  # the meta device's arrays hold none
                buffer[...] = a  # a host write, not a launch
        if self.program is not None:
            return self.program.replay(timers)
        recording = Recording()
        with kernels.recording(recording):
            result = fn(*self.buffers)
        self.recordings.append((recording, result))
        if len(self.recordings) == 2:
            try:
                self.program = Program(*self.recordings)
            except Mismatch as e:
                self.failed, self.recordings = e, None
                return result  # computed eagerly, as every later call will be
            if self.fuse:
                fuse(self.program)
            if self.program.device.GRAPHS:
                self.program.graph = graphed(self.program)
            elif self.program.device.STEP_OPS:
                self.program.graph, self.program.python_why = cpu_step.compiled(self.program)
            self.recordings = None
        return result


__all__ = ["compile", "Compiled", "Mismatch"]
