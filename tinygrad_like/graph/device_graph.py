"""A captured step replayed as graphs of its device (CUDA graphs: the backend's capture_graph,
on a device whose GRAPHS is True): each run of its launches one graph launch a call, where
capture.py's replay launches every kernel from Python.

A graph freezes each kernel's arguments, so only launches whose arguments change between calls
in their buffers' contents alone can be in one: the step's inputs (Capture copies each call's
into its buffers), what its kernels write, the device values the host writes by a host call
(AdamW's constants of the step, the fp16 loss scale). A launch that takes a host call's result
itself is launched from Python; a host call runs in its place, or before or after the launches
next to it that touch nothing it takes: the step is cut into runs of launches, each captured as
one graph (the decode step of GPT-2 and Llama, and a training step: one graph). What a launch
from Python makes for a later graph is copied into the buffer that graph was captured on (its
first call's), each call.

A call launches the parts in order (the first call captures each graph, then launches it: a
capture runs nothing) and returns the step's result copied out of the graphs' buffers (the next
call writes them again). The graphs' buffers are their own (capture_graph keeps what a capture
allocated): the memory of the step's live peak or more, for as long as the step lives, as a CUDA
graph's pool in PyTorch.
"""

import sys

from ..memory import root
from .capture import arguments, made
from .replay import generate


def graphed(program):
    """-> replay() of program as graphs where its launches allow (the module's docstring), or
    None where none can be one; what is launched from Python instead is said once."""
    parts = _parts(_moved(program.steps))
    graphs = sum(graph for graph, _ in parts)
    if not graphs:
        return None
    apart = [s.name for graph, steps in parts if not graph for s in steps if s[0] == "launch"]
    if apart:
        print(
            f"compile: the step replays as {graphs} graphs, launching {', '.join(apart)} from "
            "Python between them (each takes a value a host call makes, which a graph would "
            "freeze)",
            file=sys.stderr,
        )
    timer = program.device.start_timer
    result = sorted(_names(program.result))
    later = [set(result)]  # per part: the names the parts after it (and the result) use
    for _, steps in reversed(parts[1:]):
        later.insert(0, later[0] | _uses(steps))
    plans = []  # per part: (graph?, its function, the names it takes, the names it gives)
    for (graph, steps), wanted in zip(parts, later):
        makes = set().union(*map(_defines, steps))
        given = sorted(_uses(steps) - makes)
        gives = sorted(makes & wanted)
        out = ("seq", tuple, tuple(_description(n) for n in gives))
        plans.append((graph, generate(steps, out, timer, given), given, gives))
    build = generate([], program.result, timer, result)
    first = []  # per part, from its first call: (its graph's launcher or None, what it gave)

    def replay():
        env = {}
        for p, (graph, run, given, gives) in enumerate(plans):
            taken = [env[n] for n in given]
            if graph:
                if p == len(first):  # a capture runs nothing: launched after it, as always
                    first.append(program.device.capture_graph(lambda: run(None, *taken)))
                launcher, outs = first[p]
                launcher()
            else:
                outs = run(None, *taken)
                if p == len(first):
                    first.append((None, outs))
                else:  # into the buffers the graphs after it were captured on
                    outs = [_into(kept, new) for kept, new in zip(first[p][1], outs)]
            env.update(zip(gives, outs))
        return _copied(build(None, *[env[n] for n in result]))

    replay.graphs = graphs  # graph launches a call
    # the device memory the graphs keep (their pools), once captured
    replay.nbytes = lambda: sum(launcher.nbytes() for launcher, _ in first if launcher)
    return replay


def _moved(steps):
    """steps with each host call moved before the launches before it, or else past the launches
    after it (never past another host call), over those that take neither its result nor an
    array it takes nor make one: AdamW's constants written for the step, or a KV cache's length
    grown on the host, which no kernel reads, then cut no graph in two."""
    steps = list(steps)
    for s in [s for s in steps if s[0] == "host"]:
        i = j = next(n for n, x in enumerate(steps) if x is s)
        while j > 0 and steps[j - 1][0] == "launch" and _free(s, steps[j - 1]):
            j -= 1
        if j == i:
            while j + 1 < len(steps) and steps[j + 1][0] == "launch" and _free(s, steps[j + 1]):
                j += 1
        steps.insert(j, steps.pop(i))
    return steps


def _free(host, launch):
    """Whether the host call and the launch may run in either order: the launch takes neither
    the host call's result nor an array it takes, nor makes one."""
    if f"h{host[3]}" in _uses([launch]):
        return False
    touched = set().union(*map(_arrays, arguments(launch)), {("v", v) for v in made(launch)})
    return not set().union(*map(_arrays, arguments(host))) & touched


def _arrays(d):
    """The buffers a description refers to: ("v", a value) or ("c", id of a constant's root)."""
    if d[0] == "value":
        return {("v", d[1])}
    if d[0] == "const":
        return {("c", id(root(d[1])))} if hasattr(d[1], "nbytes") else set()
    if d[0] == "seq":
        return set().union(*map(_arrays, d[2]))
    return set()


def _parts(steps):
    """[(graph?, steps)]: the steps cut into runs of launches a graph can hold (True) and the
    rest, each in order."""
    parts = []
    for s in steps:
        graph = s[0] == "launch" and not any(n[0] == "h" for n in _uses([s]))
        if parts and parts[-1][0] == graph:
            parts[-1][1].append(s)
        else:
            parts.append((graph, [s]))
    return parts


def _names(d):
    """The names a description refers to: "v3" for a value, "h1" for a host call's result."""
    if d[0] == "value":
        return {f"v{d[1]}"}
    if d[0] == "hosted":
        return {f"h{d[1]}"}
    if d[0] == "seq":
        return set().union(*map(_names, d[2]))
    return set()


def _uses(steps):
    return set().union(*(_names(d) for s in steps for d in arguments(s)))


def _defines(step):
    return {f"h{step[3]}"} if step[0] == "host" else {f"v{v}" for v in made(step)}


def _description(name):
    return ("value", int(name[1:]), None) if name[0] == "v" else ("hosted", int(name[1:]))


def _into(kept, new):
    """kept (a buffer a graph reads) holding new's values -> kept; a host call's result that is
    no array -> new."""
    if not hasattr(kept, "nbytes"):
        return new
    if new is not kept:
        kept[...] = new
    return kept


def _copied(x):
    """The step's result with each array copied (a tuple's or list's items too)."""
    if isinstance(x, (tuple, list)):
        return type(x)(_copied(i) for i in x)
    return x.copy() if hasattr(x, "nbytes") and hasattr(x, "copy") else x
