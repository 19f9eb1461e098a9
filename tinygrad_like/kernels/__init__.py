"""Every kernel, and the one place every kernel launch passes through.

The kernels live by family, one folder each: kernels/<family>/spec.py declares them (name,
signature, docstring, shape rule, counts: record.py), cpu.py and cuda.py (beside <family>.cu)
implement them under the same names, and the meta device runs each shape rule (meta.py). on(device)
gathers a device's kernels from the family folders the first time it is asked (CUDA's only then,
so importing the package never imports CuPy).

The ops (functions.py), nn/ and optim/ run kernels only through launch("gelu_fwd", x), which finds
the device that owns x, runs its kernel, and counts the launch: FLOPs and exps from the shapes
(the kernel's record), bytes as everything the kernel reads plus everything it writes, the
phase, and (when a profiler asks) the time. The tape and the profiler read these counts; nothing
else computes them.

What does not pass through here, and so is never counted: a device's host functions
(backend/host.py), called directly on the device's module. Host-to-device and device-to-host
copies are among them: asarray (Tensor(...) from NumPy data or lists, the ops moving host token
ids and targets, moving a tensor to another device, loading weights) and to_numpy (.numpy(),
reading a loss or a gradient norm back), and so are the min/max reads of the id checks
(embedding.spec.check_ids, softmax.spec.check_targets).
"""

import time
from importlib import import_module
from types import SimpleNamespace

from .. import backend, profiler
from ..backend.host import HOST
from ..memory import TRACKER
from . import meta
from .adamw import spec as adamw  # noqa: F401 (each spec declares its family's kernels)
from .attention import spec as attention  # noqa: F401
from .elementwise import spec as elementwise  # noqa: F401
from .embedding import spec as embedding  # noqa: F401
from .gemm import spec as gemm  # noqa: F401
from .kvcache import spec as kvcache  # noqa: F401
from .quant import spec as quant  # noqa: F401
from .record import KERNELS
from .rotary import spec as rotary  # noqa: F401
from .rownorm import spec as rownorm  # noqa: F401
from .softmax import spec as softmax  # noqa: F401

_gathered = {}  # a device's backend module -> on(device), gathered on first use


def on(device):
    """A device (a name, "cpu", "cuda" or "meta", or its backend module) as code that runs on it
    sees it: its host functions (backend/host.py) and every kernel, each by its name, uncounted:
    on("cpu").matmul(a, b) runs kernels/gemm/cpu.py's matmul. The CPU and CUDA kernels come from
    kernels/<family>/<device>.py, the meta device's from the shape rules."""
    be = backend.get(device) if isinstance(device, str) else device
    found = _gathered.get(be)
    if found is None:
        host = {f.__name__: getattr(be, f.__name__) for f in HOST}
        found = _gathered[be] = SimpleNamespace(**host, **_gather(be))
    return found


def _gather(be):
    """name -> function for every kernel of KERNELS on the device of backend module be; a
    missing one fails here, naming the file it belongs in."""
    if not be.HOLDS_VALUES:  # the meta device's are the shape rules
        return {name: meta.shape_only(k) for name, k in KERNELS.items()}
    found = {}
    for k in KERNELS.values():
        module = import_module(f"{__name__}.{k.family}.{be.name}")
        if not hasattr(module, k.name):
            raise ImportError(
                f"{module.__name__} has no {k.name}, which {k.family}/spec.py declares"
            )
        found[k.name] = getattr(module, k.name)
    return found


def count(name, args, kwargs, out):
    """(FLOPs, exps, bytes) of one launch of kernel `name` that returned out, from its record:
    bytes are what it reads plus what it writes."""
    k = KERNELS[name]
    outs = () if out is None else out if isinstance(out, tuple) else (out,)
    result = outs[0] if outs else None
    flops = int(k.flops(result, *args, **kwargs)) if k.flops else 0
    exps = int(k.exps(result, *args, **kwargs)) if k.exps else 0
    if k.reads:
        nbytes = k.reads(outs, *args, **kwargs)
    else:
        reads = [a for i, a in enumerate(args) if i not in k.skips]
        nbytes = sum(a.nbytes for a in arrays(reads))
        nbytes += sum(a.nbytes for key, v in kwargs.items() if key != "out" for a in arrays((v,)))
    written = [args[i] for i in k.writes if args[i] is not None]
    written += [kwargs["out"]] if kwargs.get("out") is not None else []
    ids = {id(a) for a in written}
    nbytes += k.written(outs, *args, **kwargs) if k.written else sum(a.nbytes for a in written)
    nbytes += sum(a.nbytes for a in arrays(outs) if id(a) not in ids)
    return flops, exps, nbytes


def arrays(items):
    """The arrays among items, nested tuples and lists included, in order."""
    for x in items:
        if hasattr(x, "nbytes") and hasattr(x, "shape"):
            yield x
        elif isinstance(x, (tuple, list)):
            yield from arrays(x)


def _first_array(args):
    for a in arrays(args):
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


_recorders = []  # objects with .launched(...) and .hosted(...): the captures recording now


class recording:
    """with recording(r): launches inside call r.launched(name, kernel, args, kwargs, out), and
    kernels.on_host r.hosted(fn, args, result), after running (tinygrad_like/graph's capture)."""

    def __init__(self, target):
        self.target = target

    def __enter__(self):
        _recorders.append(self.target)
        return self.target

    def __exit__(self, *exc):
        _recorders.pop()


def on_host(fn, *args):
    """fn(*args) now -> its result: host work a step does besides its kernels (a KV cache's
    length grown, AdamW's scalars for this step, a collective, a read of the gradient norm). A
    captured step's replay runs it again, in its place among the launches, and passes its new
    result wherever the step passed this one."""
    result = fn(*args)
    if _recorders:
        _recorders[-1].hosted(fn, args, result)
    return result


def launch(name, *args, **kwargs):
    be = backend.of(args[0] if hasattr(args[0], "shape") else _first_array(args))
    kernel = getattr(_gathered.get(be) or on(be), name)
    if not (_sinks or profiler.active() or TRACKER.track_temporaries):  # nobody counts
        out = kernel(*args, **kwargs)
        if _recorders:
            _recorders[-1].launched(name, kernel, args, kwargs, out)
        return out
    timing = profiler.timing_wanted()
    timer = be.start_timer() if timing else None
    t_host = time.perf_counter()
    out = kernel(*args, **kwargs)
    if timer is not None:
        timer.stop()
    if _recorders:
        _recorders[-1].launched(name, kernel, args, kwargs, out)
    # counted now unless only deferred profilers want it: they count it when next read
    if not _sinks and profiler.deferring():
        counts = lambda: count(name, args, kwargs, out)  # noqa: E731
    else:
        counts = count(name, args, kwargs, out)
    if _sinks:
        _sinks[-1].add(counts[0], counts[2])
    for prof in profiler.active():
        prof.add(name, be.name, timer, t_host, counts)
    if TRACKER.track_temporaries:  # what the tracker does not know yet: a new array, or an
        # empty() buffer this kernel filled in place (fill, copy, out=); never a retag
        for a in arrays(out if isinstance(out, tuple) else (out,)):
            if TRACKER.tag_of(a) is None:
                TRACKER.register(a, "temporaries")
    return out
