"""What the CPU device needs that is not a kernel: the host functions (backend/host.py), the
dtype helpers every kernel uses, malloc's settings, the thread pool the row and elementwise
kernels split their rows over, and control of the BLAS's threads.

Rules every CPU kernel (kernels/<family>/cpu.py) follows, and its CUDA twin matches:
- Arrays in, arrays out; kernels never see Tensors or the tape.
- 2-byte inputs (fp16, bf16) are computed in fp32 (f32) and rounded once on the way out
  (rounded), which is what a tensor core or an fp32-accumulating CUDA kernel does. Reductions
  accumulate in fp32 (in fp64 when the inputs are fp64, for gradient checks).
- Outputs have the dtype of the main input unless the kernel says otherwise (statistics such as
  layernorm's mean/rstd and per-token losses are fp32).
"""

import ctypes
import ctypes.util
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import ThreadpoolController

from ... import dtypes
from ..host_timer import HostTimer


def keep_freed_memory():
    """Ask glibc's malloc to keep freed memory for reuse instead of handing it back to the OS.

    By default every array above 32 MB is mmapped on allocation and unmapped when freed, so the
    next step's (B*T, V) logits fault in tens of thousands of fresh zeroed pages again. Keeping
    freed memory in the heap makes a training step reuse the same pages, as CuPy's memory pool
    does on the GPU. TG_CPU_KEEP_MEMORY=0 turns it off; other C libraries are left alone.
    """
    if os.environ.get("TG_CPU_KEEP_MEMORY", "1") == "0":
        return False
    path = ctypes.util.find_library("c")
    libc = ctypes.CDLL(path) if path else None
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
    return bool(libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


keep_freed_memory()


def supported_dtypes():
    """fp16 and bf16 are emulated: computed in fp32, stored and rounded in 2 bytes."""
    return dtypes.TRAINING


# ---------------------------------------------------------------- what this device is
# (asked of the backend module, backend.get(name) or backend.of(array), never by its name)
HOLDS_VALUES = True  # its arrays have values to read back; its kernels run, and are timed
GPU = False  # the training defaults of a CPU run; ranks talk over MPI
HOST_MEMORY = True  # its memory is the host's: the ranks of one machine and host copies share it
GRAPHS = False  # no graphs of its own: its steps' ops run compiled (STEP_OPS)
STEP_OPS = True  # graph/cpu_step.py: every thread through a step's ops, one hand-off


def require_values(what):
    """Nothing: this device holds values (meta's raises NoValues)."""


def available_bytes():
    """The memory that can be allocated now: the kernel's MemAvailable (free memory and the
    page cache it can drop), else the free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # not Linux
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def total_bytes():
    """The machine's memory."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def capture_graph(run):
    """The CPU keeps no graphs (GRAPHS is False)."""
    raise NotImplementedError("the CPU keeps no graphs: replay the step from Python")


# ---------------------------------------------------------------- arrays and timing (HOST)


def asarray(data, dtype=None):
    return np.asarray(data, dtype=dtype)


def to_numpy(a) -> np.ndarray:
    return np.asarray(a)


def empty(shape, dtype):
    return np.empty(shape, dtype=dtype)


def synchronize():
    pass


def start_timer():
    return HostTimer()


# ---------------------------------------------------------------- threads
# NumPy's elementwise loops run on one core (BLAS uses them all), and each NumPy call is one
# pass over memory. So the row and elementwise kernels split their rows into one block per
# core, run the blocks on a thread pool (NumPy releases the GIL inside its loops, so the blocks
# run at the same time), and inside a block work through chunks small enough (~128K elements)
# that their many passes hit the core's cache, not memory. The split depends only on the sizes
# and the core count, so results are deterministic.
# the cores this process may run on (one under mpirun's binding of a rank per core)
THREADS = max(
    1,
    min(
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 8
    ),
)
CHUNK = 1 << 17  # elements per chunk: with a few fp32 temporaries, fits in L2
_pool = None


_block = threading.local()  # .inside: this thread runs a block of in_parallel
# run(blocks, job) -> whether it ran job(0) ... job(blocks - 1) on the compiled kernels' pool
# (compiled.py sets it: OpenMP's, whose threads spin after each kernel and would otherwise
# share the cores with this module's threads); False: this module's threads run them
blocks_on_pool = [None]


def in_block():
    """Whether this thread runs a block of in_parallel now: a compiled kernel called there runs
    on this core alone (compiled.kernel), as the block's share of the work."""
    return getattr(_block, "inside", False)


def in_parallel(n, body, per_row=1, chunk_rows=None, blocks=None):
    """Call body(lo, hi) over [0, n) rows: one block per core (one block when the work is
    small, or `blocks` blocks), each block in chunks of chunk_rows rows (default: about CHUNK
    elements). This thread runs the first block itself: waking a sleeping core is not free, so
    it wakes one fewer."""
    global _pool
    chunk_rows = chunk_rows or max(1, CHUNK // per_row)
    blocks = blocks or max(1, min(THREADS, n * per_row // CHUNK, n))

    def block(start, stop):
        _block.inside = True
        try:
            for lo in range(start, stop, chunk_rows):
                body(lo, min(lo + chunk_rows, stop))
        finally:
            _block.inside = False

    if blocks == 1:
        block(0, n)
        return
    edges = [n * i // blocks for i in range(blocks + 1)]
    if not in_block() and blocks_on_pool[0] is not None:
        if blocks_on_pool[0](blocks, lambda i: block(edges[i], edges[i + 1])):
            return
    if _pool is None:
        _pool = ThreadPoolExecutor(THREADS - 1, thread_name_prefix="tg-cpu")
    jobs = [_pool.submit(block, lo, hi) for lo, hi in zip(edges[1:], edges[2:])]
    block(edges[0], edges[1])
    for job in jobs:
        job.result()


# ---------------------------------------------------------------- the BLAS's threads


def _numpy_openblas():
    """threadpoolctl's controller of the OpenBLAS that NumPy loaded (NumPy's wheels bundle it as
    scipy-openblas), or None (NumPy on another BLAS). Its get_num_threads and set_num_threads
    find the library's own names (scipy_openblas_set_num_threads64_ and the like), and its
    dynlib is the library, for the calls threadpoolctl has no API for."""
    found = ThreadpoolController().select(internal_api="openblas").lib_controllers
    numpys = [lib for lib in found if "numpy" in lib.filepath]
    return (numpys or found or [None])[0]


OPENBLAS = _numpy_openblas()


def _blas_workers_sleep_when_idle():
    """Make OpenBLAS's idle worker threads sleep at once instead of spinning; -> whether they
    do (True also when the user set their timeout: their choice stands).

    After a threaded call each worker spins for 2^28 TSC cycles (blas_server.c's
    thread_timeout, a tenth of a second or so), and a row kernel's thread that lands on its
    core meanwhile runs at about half speed. OPENBLAS_THREAD_TIMEOUT=4, the minimum (2^4
    cycles), puts them to sleep right away (the next threaded call wakes them with a condition
    variable). threadpoolctl sets thread counts only, and OpenBLAS reads that variable when it
    loads, before this module can run, so it is set for a moment and re-read with the
    library's own openblas_read_env, and the workers are stopped; the next threaded call starts
    them again with the new timeout (exec_blas restarts a stopped pool, as after a fork)."""
    if any(v in os.environ for v in ("OPENBLAS_THREAD_TIMEOUT", "GOTO_THREAD_TIMEOUT")):
        return True
    lib = OPENBLAS.dynlib if OPENBLAS else None
    read_env = getattr(lib, "openblas_read_env", None)
    stop_workers = getattr(lib, "blas_thread_shutdown_", None)
    if read_env is None or stop_workers is None:
        return False
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = "4"
    try:
        read_env()
    finally:
        del os.environ["OPENBLAS_THREAD_TIMEOUT"]  # children start with OpenBLAS's default
    stop_workers()
    return True


class one_blas_thread:
    """with one_blas_thread(): BLAS calls in the block run on the calling thread only.

    For the kernels that split their work across the cores themselves, each part one
    single-threaded BLAS call. The count is restored afterwards, so NumPy elsewhere (the MFU
    peak measurement, say) keeps its default. It is entered once per such GEMM, so it calls
    the cached controller's get and set directly rather than threadpool_limits, which looks up
    every loaded library on each entry.
    OpenBLAS's pthreads pool is process-wide, and threadpoolctl lets one Python thread at a
    time set its size: the block hands that right back on leaving, as threadpool_limits does,
    so that whichever thread enters next may set it."""

    def __enter__(self):
        self.previous = OPENBLAS.get_num_threads() if OPENBLAS else None
        if self.previous not in (None, 1):
            OPENBLAS.set_num_threads(1)

    def __exit__(self, *exc):
        if self.previous not in (None, 1):
            OPENBLAS.set_num_threads(self.previous)
            OPENBLAS.clear_controlling_thread()


BLAS_QUIET = _blas_workers_sleep_when_idle()  # idle OpenBLAS workers sleep instead of spinning
