"""The one place every kernel launch passes through.

ops.py, nn/ and optim/ run kernels only through launch("gelu_fwd", x), which finds the backend
that owns x, runs its kernel, and counts the launch: FLOPs and exps from the shapes (each
kernel's record in backend/contract.py), bytes as everything the kernel reads plus everything
it writes, the phase, and (when a profiler asks) the time. The tape and the profiler read these
counts; nothing else computes them.

What does not pass through here, and so is never counted: the contract's HOST functions,
called directly on a backend. Host-to-device and device-to-host copies are among them:
backend.asarray (Tensor(...) from NumPy data or lists, ops.py moving host token ids and
targets, moving a tensor to another device, loading weights) and to_numpy (.numpy(), reading a
loss or a gradient norm back), and so are the min/max reads of the id checks
(contract.check_ids, contract.check_targets).
"""

import time

from . import backend, profiler
from .backend.contract import KERNELS
from .memory import TRACKER


def count(name, args, kwargs, out):
    """(FLOPs, exps, bytes) of one launch of kernel `name` that returned out, from its contract
    record: bytes are what it reads plus what it writes."""
    k = KERNELS[name]
    outs = () if out is None else out if isinstance(out, tuple) else (out,)
    result = outs[0] if outs else None
    flops = int(k.flops(result, *args, **kwargs)) if k.flops else 0
    exps = int(k.exps(result, *args, **kwargs)) if k.exps else 0
    if k.reads:
        nbytes = k.reads(outs, *args, **kwargs)
    else:
        reads = [a for i, a in enumerate(args) if i not in k.skips]
        nbytes = sum(a.nbytes for a in _arrays(reads))
        nbytes += sum(
            a.nbytes for key, a in kwargs.items() if key != "out" and hasattr(a, "nbytes")
        )
    written = [args[i] for i in k.writes if args[i] is not None]
    written += [kwargs["out"]] if kwargs.get("out") is not None else []
    ids = {id(a) for a in written}
    nbytes += sum(a.nbytes for a in written)
    nbytes += sum(a.nbytes for a in _arrays(outs) if id(a) not in ids)
    return flops, exps, nbytes


def _arrays(items):
    for x in items:
        if hasattr(x, "nbytes") and hasattr(x, "shape"):
            yield x
        elif isinstance(x, (tuple, list)):
            yield from _arrays(x)


def _first_array(args):
    for a in _arrays(args):
        return a
    raise TypeError("a kernel launch needs at least one array argument")


_sinks = []  # objects with .add(flops, nbytes): the tape record being run, if any


class sink_to:
    """with sink_to(record): launches inside add their FLOPs and bytes to the record."""

    def __init__(self, target):
        self.target = target

    def __enter__(self):
        _sinks.append(self.target)

    def __exit__(self, *exc):
        _sinks.pop()


def launch(name, *args, **kwargs):
    be = backend.of(args[0] if hasattr(args[0], "shape") else _first_array(args))
    if not (_sinks or profiler.active() or TRACKER.track_temporaries):
        return getattr(be, name)(*args, **kwargs)  # nobody is counting: just run it
    timing = profiler.timing_wanted()
    timer = be.start_timer() if timing else None
    t_host = time.perf_counter()
    out = getattr(be, name)(*args, **kwargs)
    if timer is not None:
        timer.stop()
    # counted now unless only deferred profilers want it (they count it when next read)
    deferred = not _sinks and profiler.deferring()
    counts = None if deferred else count(name, args, kwargs, out)
    if _sinks:
        _sinks[-1].add(counts[0], counts[2])
    for prof in profiler.active():
        prof.add(name, be.name, timer, t_host, counts, (args, kwargs, out))
    if TRACKER.track_temporaries:  # what the tracker does not know yet: a new array, or an
        # empty() buffer this kernel filled in place (fill, copy, out=); never a retag
        for a in _arrays(out if isinstance(out, tuple) else (out,)):
            if TRACKER.tag_of(a) is None:
                TRACKER.register(a, "temporaries")
    return out
