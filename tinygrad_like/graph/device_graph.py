"""A captured step replayed as one graph of its device (a CUDA graph: the backend's
capture_graph, on a device whose GRAPHS is True): one launch a call for all its kernels, where
capture.py's replay launches each from Python.

A graph freezes each kernel's arguments, so a step is replayed so only where nothing a kernel
takes changes between calls but the contents of its buffers (the step's inputs, which Capture
copies into its buffers before each call, and what its kernels write): no launch may take a
host call's result (AdamW's scalars of the step, a mean's 1 / count: still launched one by one,
and said once), and every host call must be able to run after the graph: none may take an
array that a launch after it reads or writes (a KV cache's length grown on the host, which no
kernel reads, can; a collective on the gradients, which AdamW reads next, cannot). A call then
launches the graph, runs the host calls in their order on the graph's buffers, and returns the
step's result copied out of them (the next launch writes them again).

Its buffers are the graph's own (capture_graph keeps what the capture allocated): the memory of
the step's live peak or more, for as long as the graph lives, as a CUDA graph's pool in PyTorch.
"""

import sys

from ..memory import root
from .capture import arguments, values
from .replay import generate


def graphed(program):
    """-> replay() of program as one device graph, captured at its first call, or None (and
    the reason printed once) where program cannot be replayed so (the module's docstring)."""
    why = refusal(program.steps)
    if why is not None:
        print(
            f"compile: the step's kernels are launched one by one, not as one graph: {why}",
            file=sys.stderr,
        )
        return None
    launches = [s for s in program.steps if s[0] == "launch"]
    hosts = [s for s in program.steps if s[0] == "host"]
    needed = sorted(
        {v for s in hosts for d in arguments(s) for v in values(d)} | set(values(program.result))
    )
    out = ("seq", tuple, tuple(("value", v, None) for v in needed))
    timer = program.device.start_timer
    run, after = generate(launches, out, timer), generate(hosts, program.result, timer, needed)
    graph = []  # (its launcher, the needed values' buffers), made at the first call

    def replay():
        if not graph:
            graph.append(program.device.capture_graph(run))
        launcher, buffers = graph[0]
        launcher()
        return _copied(after(None, *buffers))

    return replay


def refusal(steps):
    """Why these steps cannot be one device graph, or None where they can."""
    if not any(s[0] == "launch" for s in steps):
        return "the step launches nothing"
    for s in steps:
        if s[0] == "launch" and any(_hosted(d) for d in arguments(s)):
            return f"{s.name} takes a value a host call makes, which a graph would freeze"
    for h, s in enumerate(steps):
        if s[0] != "host":
            continue
        taken = set().union(*map(_arrays, arguments(s)))
        for later in steps[h + 1 :]:
            if later[0] == "launch" and taken & set().union(*map(_arrays, arguments(later))):
                return (
                    f"the host call {s[1].__name__} takes an array that {later.name} reads or "
                    "writes after it"
                )
    return None


def _hosted(d):
    return d[0] == "hosted" or (d[0] == "seq" and any(_hosted(x) for x in d[2]))


def _arrays(d):
    """The buffers a description refers to: ("v", a value) or ("c", id of a constant's root)."""
    if d[0] == "value":
        return {("v", d[1])}
    if d[0] == "const":
        return {("c", id(root(d[1])))} if hasattr(d[1], "nbytes") else set()
    if d[0] == "seq":
        return set().union(*map(_arrays, d[2]))
    return set()


def _copied(x):
    """The step's result with each array copied (a tuple's or list's items too)."""
    if isinstance(x, (tuple, list)):
        return type(x)(_copied(i) for i in x)
    return x.copy() if hasattr(x, "nbytes") and hasattr(x, "copy") else x
