"""The meta device's host functions (backend/host.py): arrays made and moved by their shapes and
dtypes alone."""

import weakref

import numpy as np

from ... import dtypes
from ...memory import root
from ..host_timer import HostTimer
from .array import MetaArray, NoValues


def supported_dtypes():
    """fp16 trains with a loss scaler whose overflow skip needs the gradient norm's value."""
    return tuple(d for d in dtypes.TRAINING if d != "fp16")


# ---------------------------------------------------------------- what this device is
# (asked of the backend module, backend.get(name) or backend.of(array), never by its name)
HOLDS_VALUES = False  # shapes only: nothing to read back, no weights drawn, nothing run or timed
GPU = False  # counts any machine's step: the CPU's training defaults
HOST_MEMORY = False  # it allocates nothing
GRAPHS = False  # nothing runs on it
STEP_OPS = False


def require_values(what):
    """Refuse what needs values (a loss, a token file, the fp16 overflow skip): NoValues."""
    raise NoValues(what)


def available_bytes():
    """None: it allocates nothing, so whatever it counts fits."""


def total_bytes():
    """None: it has no memory of its own."""


def capture_graph(run):
    """The meta device keeps no graphs (GRAPHS is False)."""
    raise NotImplementedError("the meta device keeps no graphs: replay the step from Python")


# ---------------------------------------------------------------- arrays and timing (HOST)


def asarray(data, dtype=None):
    """Host data to the meta device: its shape and dtype; the values stay behind. A NumPy
    array that np.asarray returns as it is (the CPU's asarray: its device memory is the host's)
    gives its twin, so the memory tracker sees the buffers the CPU sees."""
    if isinstance(data, MetaArray):
        return (
            data if dtype is None or np.dtype(dtype) == data.dtype else MetaArray(data.shape, dtype)
        )
    host = np.asarray(data, dtype=dtype)
    return _twin(host) if host is data else MetaArray(host.shape, host.dtype)


_twins = {}  # id(host array) -> its MetaArray, while the host array lives
KNOWN = 1024  # the integer host arrays up to this size whose values a twin keeps (positions)


def _twin(host):
    """The meta array of a host NumPy array: one per host buffer while it lives (the same ids
    moved every step are one buffer, as on the CPU), a view of it for a view; a small integer
    one keeps its values (MetaArray.known)."""
    owner = root(host)
    twin = _twins.get(id(owner))
    if twin is None:
        twin = _twins[id(owner)] = MetaArray(owner.shape, owner.dtype, owner.strides)
        weakref.finalize(owner, _twins.pop, id(owner))
    known = host if host.dtype.kind in "iu" and host.size <= KNOWN else None
    if owner is host:
        twin.known = known
        return twin
    offset = host.__array_interface__["data"][0] - owner.__array_interface__["data"][0]
    return MetaArray(host.shape, host.dtype, host.strides, twin, known, offset)


def to_numpy(a):
    raise NoValues("reading an array back to the host")


def empty(shape, dtype):
    return MetaArray((shape,) if isinstance(shape, int) else shape, dtype)


def synchronize():
    pass


def start_timer():
    return HostTimer()
