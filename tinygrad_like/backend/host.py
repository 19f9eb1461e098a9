"""What every device provides besides its kernels (backend/<device>/runtime.py, exported by the
device package), declared once here: the host functions, called directly on the device's module
and never counted by kernels.launch, and the facts that say what the device is. Code outside
backend/ asks these of the device's module (backend.get(name), backend.of(array)), never tests a
device by its name; tests/kernels/test_contract.py and tests/test_devices.py hold every device
to them.
"""

# The facts, each a bool of the device's runtime.py
FACTS = (
    "HOLDS_VALUES",  # its arrays have values to read back; its kernels run and are timed
    "GPU",  # a GPU: a GPU run's training defaults, datasheet peaks, ranks over NCCL
    "HOST_MEMORY",  # its memory is the host's: a machine's ranks and host copies share it
    "GRAPHS",  # it keeps graphs of launches of its own (CUDA graphs): capture_graph
    "STEP_OPS",  # a captured step runs as compiled ops, a hand-off a run (graph/cpu_step.py)
)


def supported_dtypes():
    """The dtype names the device trains in."""


def asarray(data, dtype=None):
    """Host data (NumPy arrays, lists) as an array of this device: a host-to-device copy."""


def to_numpy(a):
    """An array of this device as a NumPy array: a device-to-host copy (waits for it)."""


def empty(shape, dtype):
    """An uninitialized array of this device."""


def synchronize():
    """Wait for every launch so far."""


def start_timer():
    """A timer started now, with .stop() and .seconds()."""


def require_values(what):
    """Nothing where the device holds values; where it does not (meta), NoValues saying that
    what needs them."""


def available_bytes():
    """The memory that can be allocated now (None: the device allocates nothing)."""


def total_bytes():
    """The device's memory (None: it has none of its own)."""


def capture_graph(run):
    """run() recorded as one graph of the device (a CUDA graph) -> (launcher, run()'s result):
    launcher() runs what run() launched again, as one unit, on the same buffers (what run()
    allocated kept for the graph alone: launcher.nbytes() bytes); run() itself launches
    nothing. Only where GRAPHS is True; elsewhere NotImplementedError (a captured step's replay
    launches its kernels one by one from Python: graph/capture.py)."""


HOST = (
    supported_dtypes,
    asarray,
    to_numpy,
    empty,
    synchronize,
    start_timer,
    require_values,
    available_bytes,
    total_bytes,
    capture_graph,
)
