"""Data-parallel communication: one small interface over two existing engines, and the one
counting point every collective passes through (as kernels.launch is for kernels).

    Communicator          a world of one: every collective is the identity (no MPI needed)
    MetaWorld             one rank of R on the meta device, in one process: counted, not run
    MPICommunicator       CPU ranks: mpi4py over Open MPI (pip install -e '.[dist]')
    NCCLCommunicator      GPU ranks: NCCL through CuPy, its unique id broadcast over MPI;
                          host (NumPy) buffers still travel over MPI

Each call of all_reduce / reduce_scatter / all_gather / broadcast appends a Collective to the
records being kept (recording()): the buffer's bytes, the bytes this rank sends, and the time.
Bytes sent follow the ring algorithm, which is also NCCL's bus-bandwidth convention: for a
buffer of n bytes over R ranks

    all_reduce       2(R-1)/R · n     (a reduce-scatter, then an all-gather)
    reduce_scatter    (R-1)/R · n     (n: the whole input; each rank keeps n/R)
    all_gather        (R-1)/R · n     (n: the whole output; each rank brings n/R)
    broadcast               n         (NCCL's busbw factor for a broadcast is 1)

so the figure is arithmetic on the buffers that were passed, whichever algorithm the engine
picked underneath (Open MPI on one machine may copy through shared memory instead of a ring);
bytes sent / seconds is the achieved bus bandwidth.
"""

import contextlib
import ctypes
import os
import stat
import sys
import time
from dataclasses import dataclass

import numpy as np

from . import dtypes

# environment variables an MPI launcher sets in every process it starts
_LAUNCHED = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
RING_FACTOR = {
    "all_reduce": lambda R: 2 * (R - 1) / R,
    "reduce_scatter": lambda R: (R - 1) / R,
    "all_gather": lambda R: (R - 1) / R,
    "broadcast": lambda R: 1.0 if R > 1 else 0.0,
}


@dataclass
class Collective:
    name: str  # all_reduce, reduce_scatter, all_gather or broadcast
    what: str  # the caller's label: "gradients", "weights", "norm²", "loss"
    nbytes: int  # the buffer's size (reduce_scatter: the input; all_gather: the output)
    sent: float  # bytes this rank sends (RING_FACTOR · nbytes)
    seconds: float  # wall time of the call, the device synchronized before and after


def sent_bytes(name, nbytes, world):
    return RING_FACTOR[name](world) * nbytes


class Communicator:
    """A world of one process: the single-process run. Subclasses replace the underscored
    engine calls; the public ones count."""

    engine = "none"

    def __init__(self, rank=0, size=1):
        self.rank, self.size = rank, size
        self._records = None  # a list while someone is recording

    # ---- the collectives (in place unless an out buffer is given)
    def all_reduce(self, buf, what=""):
        """buf <- the sum of every rank's buf."""
        return self._counted("all_reduce", what, buf.nbytes, self._all_reduce, buf)

    def reduce_scatter(self, buf, what=""):
        """In place: the sum over ranks of chunk `rank` of buf (R equal chunks) -> the view of
        buf that now holds it (where depends on the engine; the rest of buf is left undefined)."""
        return self._counted("reduce_scatter", what, buf.nbytes, self._reduce_scatter, buf)

    def all_gather(self, buf, what=""):
        """buf (R chunks) <- chunk r from rank r, for every r (each rank wrote its own)."""
        return self._counted("all_gather", what, buf.nbytes, self._all_gather, buf)

    def broadcast(self, buf, root=0, what=""):
        return self._counted("broadcast", what, buf.nbytes, self._broadcast, buf, root)

    def barrier(self):
        pass

    def all_gather_object(self, obj):
        """[obj of rank 0, obj of rank 1, ...] for a small picklable obj (start-up checks)."""
        return [obj]

    def sum_scalar(self, value, what=""):
        """The sum over ranks of a host float (a loss), counted as an 8-byte all_reduce; the
        value itself in a world of one (no collective, nothing counted). None (the meta device
        has no loss) stays None, the collective counted."""
        if self.size == 1:
            return value
        buf = np.array([0.0 if value is None else value], np.float64)
        self.all_reduce(buf, what)
        return None if value is None else float(buf[0])

    def abort(self, code):
        sys.exit(code)

    # ---- engine calls of a world of one
    def _all_reduce(self, buf):
        pass

    def _reduce_scatter(self, buf):
        return buf

    def _all_gather(self, buf):
        pass

    def _broadcast(self, buf, root):
        pass

    def _synchronize(self, buf):
        pass

    # ---- the counting point
    @contextlib.contextmanager
    def recording(self):
        """with comm.recording() as records: ... -> the Collectives that ran inside."""
        outer, self._records = self._records, []
        try:
            yield self._records
        finally:
            if outer is not None:
                outer.extend(self._records)
            self._records = outer

    def _counted(self, name, what, nbytes, call, *args):
        # synchronized on both sides, so the time is the collective's own: it costs nothing,
        # since here the collectives run after the backward, on its stream, overlapping nothing
        self._synchronize(args[0])
        t0 = time.perf_counter()
        result = call(*args)
        self._synchronize(args[0])
        seconds = time.perf_counter() - t0
        if self._records is not None:
            sent = sent_bytes(name, nbytes, self.size)
            self._records.append(Collective(name, what, nbytes, sent, seconds))
        return result


class MetaWorld(Communicator):
    """Rank `rank` of a world of `size` ranks, all in this one process, for the meta device
    (its buffers hold no values, so nothing needs to move): every collective is counted as
    that rank of `size` runs it, and reduce_scatter hands back the rank's own chunk, where
    NCCL leaves it. AdamW's ZeRO code runs on it unchanged, so a rank's bytes and sends in a
    world of R are counted without R processes. The calls take no time worth recording."""

    engine = "meta"

    def _reduce_scatter(self, buf):
        n = buf.size // self.size
        return buf[self.rank * n : (self.rank + 1) * n]

    def _counted(self, name, what, nbytes, call, *args):
        result = call(*args)
        if self._records is not None:
            sent = sent_bytes(name, nbytes, self.size)
            self._records.append(Collective(name, what, nbytes, sent, 0.0))
        return result


class MPICommunicator(Communicator):
    """CPU ranks over MPI. MPI has no bf16 type and Open MPI no fp16 sum, so 2-byte floats
    travel as 16-bit words and are summed by a user-defined operation in their own dtype
    (rounded once per addition, as NCCL does)."""

    engine = "mpi"

    def __init__(self, comm=None):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm or MPI.COMM_WORLD
        super().__init__(self.comm.Get_rank(), self.comm.Get_size())
        self._ops = {}

    def _message(self, buf):
        dt = np.dtype(buf.dtype)
        if dt.itemsize == 2:
            return [buf.view(np.uint16), self.MPI.UINT16_T]
        return [buf, self.MPI._typedict[dt.char]]

    def _sum(self, dtype):
        dt = np.dtype(dtype)
        if dt.itemsize != 2:
            return self.MPI.SUM
        if dt not in self._ops:

            def add(inbuf, inoutbuf, datatype):
                acc = np.frombuffer(inoutbuf, dt)
                acc += np.frombuffer(inbuf, dt)

            self._ops[dt] = self.MPI.Op.Create(add, commute=True)
        return self._ops[dt]

    def _all_reduce(self, buf):
        self.comm.Allreduce(self.MPI.IN_PLACE, self._message(buf), op=self._sum(buf.dtype))

    def _reduce_scatter(self, buf):  # MPI's in-place form leaves the sum in the first chunk
        self.comm.Reduce_scatter_block(
            self.MPI.IN_PLACE, self._message(buf), op=self._sum(buf.dtype)
        )
        return buf[: buf.size // self.size]

    def _all_gather(self, buf):
        self.comm.Allgather(self.MPI.IN_PLACE, self._message(buf))

    def _broadcast(self, buf, root):
        self.comm.Bcast(self._message(buf), root=root)

    def barrier(self):
        self.comm.Barrier()

    def all_gather_object(self, obj):
        return self.comm.allgather(obj)

    def abort(self, code):
        sys.stdout.flush()
        sys.stderr.flush()
        self.comm.Abort(code)  # mpirun stops every rank, within seconds


class NCCLCommunicator(MPICommunicator):
    """GPU ranks: device buffers over NCCL on the current CuPy stream, everything on the host
    (losses, start-up checks) over the MPI world that launched the processes."""

    engine = "nccl"

    def __init__(self):
        super().__init__()
        import cupy

        nccl = _import_nccl()
        self.cupy, self.nccl = cupy, nccl
        uid = nccl.get_unique_id() if self.rank == 0 else None
        self.nccl_comm = nccl.NcclCommunicator(self.size, self.comm.bcast(uid, root=0), self.rank)
        self._types = nccl_types(nccl)

    def _on_device(self, buf):
        return hasattr(buf.data, "ptr")  # CuPy's MemoryPointer; NumPy's .data is a memoryview

    def _stream(self):
        return self.cupy.cuda.get_current_stream().ptr

    def _all_reduce(self, buf):
        if not self._on_device(buf):
            return super()._all_reduce(buf)
        self.nccl_comm.allReduce(
            buf.data.ptr,
            buf.data.ptr,
            buf.size,
            self._types[buf.dtype],
            self.nccl.NCCL_SUM,
            self._stream(),
        )

    def _reduce_scatter(self, buf):  # NCCL's in-place form: the sum lands in our own chunk
        n = buf.size // self.size
        own = buf[self.rank * n : (self.rank + 1) * n]
        self.nccl_comm.reduceScatter(
            buf.data.ptr,
            own.data.ptr,
            n,
            self._types[buf.dtype],
            self.nccl.NCCL_SUM,
            self._stream(),
        )
        return own

    def _all_gather(self, buf):
        if not self._on_device(buf):
            return super()._all_gather(buf)
        n = buf.size // self.size  # NCCL's in-place form: send from our own chunk
        own = buf.data.ptr + self.rank * n * buf.itemsize
        self.nccl_comm.allGather(own, buf.data.ptr, n, self._types[buf.dtype], self._stream())

    def _broadcast(self, buf, root):
        if not self._on_device(buf):
            return super()._broadcast(buf, root)
        self.nccl_comm.bcast(buf.data.ptr, buf.size, self._types[buf.dtype], root, self._stream())

    def _synchronize(self, buf):
        if self._on_device(buf):
            self.cupy.cuda.get_current_stream().synchronize()

    def abort(self, code):
        self.nccl_comm.abort()  # a rank blocked inside an NCCL kernel would never see MPI_Abort
        super().abort(code)


def nccl_types(nccl):
    """Our dtypes -> NCCL's data type codes, as the nccl module names them."""
    return {
        dtypes.float32: nccl.NCCL_FLOAT32,
        dtypes.float16: nccl.NCCL_FLOAT16,
        dtypes.bfloat16: nccl.NCCL_BFLOAT16,
        dtypes.float64: nccl.NCCL_FLOAT64,
    }


def _import_nccl():
    """cupy.cuda.nccl, loading libnccl.so.2 from the nvidia-nccl-cu13 wheel when the system has
    none (CuPy looks for it by name only). When CuPy's first import of its NCCL binding fails,
    it keeps a stub module (available = False, nothing else) that importing again returns: the
    module is reloaded once the wheel's library is loaded."""
    import importlib

    from cupy.cuda import nccl

    if getattr(nccl, "available", True):
        return nccl
    missing = (
        "NCCL is not installed: pip install nvidia-nccl-cu13 (GPU ranks communicate through it)"
    )
    try:
        import nvidia.nccl

        lib = os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2")
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    except (ImportError, OSError):
        raise RuntimeError(missing) from None
    nccl = importlib.reload(nccl)
    if not nccl.available:
        raise RuntimeError(f"{missing}; the wheel's libnccl.so.2 loaded, but CuPy cannot use it")
    return nccl


def launched_by_mpi():
    return any(k in os.environ for k in _LAUNCHED)


def launched_rank_and_size():
    """(rank, world size) as the launcher announced them, readable before MPI starts (the
    command line is checked first, and only rank 0 should say what is wrong with it)."""
    for rank, size in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return 0, 1


def say_past_the_launcher(line):
    """Print line where mpirun's own stderr goes (a terminal or a pipe), not through mpirun:
    on Ctrl-C or SIGTERM mpirun stops relaying the ranks' output at once and kills them 0.25 s
    after passing the signal on, so a rank's last words must bypass it. Our stderr when that
    place is a regular file (two writers at their own offsets would overwrite each other)."""
    target = f"/proc/{os.getppid()}/fd/2"
    try:
        kind = os.stat(target).st_mode
        if stat.S_ISCHR(kind) or stat.S_ISFIFO(kind):
            with open(target, "w") as f:
                print(line, file=f, flush=True)
            return
    except OSError:  # no /proc (not Linux), another user's launcher
        pass
    print(line, file=sys.stderr, flush=True)


def local_rank():
    """This process's index among the ranks on its machine (the GPU it takes)."""
    for key in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMIX_LOCAL_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def local_size():
    """The number of ranks on this process's machine (1 when started plainly)."""
    for key in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMIX_LOCAL_SIZE"):
        if key in os.environ:
            return int(os.environ[key])
    return 1


def init_world(device):
    """The world this process trains in: a world of one when started plainly; under mpirun an
    MPI world (device cpu) or an NCCL one (device cuda, one GPU per rank on each machine)."""
    if not launched_by_mpi():
        return Communicator()
    from . import backend

    host_world()  # mpi4py is there
    if backend.get(device).GPU:
        import cupy

        cupy.cuda.Device(local_rank()).use()  # before the backend allocates anything
        return NCCLCommunicator()
    return MPICommunicator()


def host_world():
    """The MPI world of the host under mpirun, a world of one otherwise: enough to agree on
    something before the device is known (the command line)."""
    if not launched_by_mpi():
        return Communicator()
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "started by mpirun but mpi4py is not installed: pip install -e '.[dist]'"
        ) from None
    return MPICommunicator()


def gather_errors(comm, mine):
    """Every rank's error in one message, the same on every rank; None when no rank has one.
    Every rank calls it at the same point, mine being its error's text or None: an error that
    every rank met is said as it is, any other as 'rank r of R: ...' for each rank that met it."""
    errors = comm.all_gather_object(mine)
    met = [(rank, text) for rank, text in enumerate(errors) if text is not None]
    if not met:
        return None
    if len(met) == comm.size and len(set(errors)) == 1:
        return mine
    return "; ".join(f"rank {rank} of {comm.size}: {text}" for rank, text in met)
