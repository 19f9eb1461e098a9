"""The NCCL engine's calls without a GPU: NCCLCommunicator over a stand-in for CuPy's NCCL
communicator that checks each call against NCCL's rules (counts, dtypes, the in-place forms:
reduceScatter's recvbuff = sendbuff + rank·count, allGather's sendbuff = recvbuff + rank·count)
and plays the other ranks, so that the results can be checked too. It cannot show that NCCL
itself runs: that needs GPUs (scripts/gpu_check.sh's nccl part, one rank). The stand-in knows
NCCL's own data type codes (nccl.h's ncclDataType_t, which CuPy's NCCL_* constants are), and
the dtype map is distributed.nccl_types, the engine's own. The last test is the engine's import
of CuPy's NCCL binding when CuPy's first try failed."""

import ctypes
import importlib
import sys
import types

import ml_dtypes
import numpy as np
import pytest
from fake_cupy import ndarray

from tinygrad_like import distributed, dtypes
from tinygrad_like.distributed import NCCLCommunicator

SUM = 0
# nccl.h: ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9
NCCL = types.SimpleNamespace(
    NCCL_SUM=SUM, NCCL_FLOAT16=6, NCCL_FLOAT32=7, NCCL_FLOAT64=8, NCCL_BFLOAT16=9
)
TYPES = {6: np.float16, 7: np.float32, 8: np.float64, 9: ml_dtypes.bfloat16}


class FakeNccl:
    """Rank `rank` of `size`; every other rank holds `others` times this rank's data."""

    def __init__(self, rank, size, others=2.0):
        self.rank, self.size, self.others, self.calls = rank, size, others, []

    def _view(self, ptr, count, dtype):
        dt = np.dtype(TYPES[dtype])
        raw = (ctypes.c_char * (count * dt.itemsize)).from_address(ptr)
        return np.frombuffer(raw, dt)

    def allReduce(self, send, recv, count, dtype, op, stream):
        assert send == recv and op == SUM
        self.calls.append(("allReduce", count))
        buf = self._view(recv, count, dtype)
        buf[...] = buf * (1 + self.others * (self.size - 1))

    def reduceScatter(self, send, recv, count, dtype, op, stream):
        itemsize = np.dtype(TYPES[dtype]).itemsize
        assert recv == send + self.rank * count * itemsize and op == SUM  # NCCL's in-place form
        self.calls.append(("reduceScatter", count))
        own = self._view(recv, count, dtype)
        own[...] = own * (1 + self.others * (self.size - 1))

    def allGather(self, send, recv, count, dtype, stream):
        itemsize = np.dtype(TYPES[dtype]).itemsize
        assert send == recv + self.rank * count * itemsize  # NCCL's in-place form
        self.calls.append(("allGather", count))
        full = self._view(recv, count * self.size, dtype)
        for r in range(self.size):
            if r != self.rank:
                full[r * count : (r + 1) * count] = -r

    def bcast(self, buf, count, dtype, root, stream):
        assert 0 <= root < self.size
        self.calls.append(("bcast", count, root))
        if root != self.rank:  # the root's data: `others` times ours, plus the root's number
            data = self._view(buf, count, dtype)
            data[...] = data * self.others + root

    def abort(self):
        self.calls.append(("abort",))


def engine(rank, size):
    comm = NCCLCommunicator.__new__(NCCLCommunicator)
    comm.rank, comm.size, comm._records, comm._ops = rank, size, [], {}
    comm.nccl_comm = FakeNccl(rank, size)
    comm.nccl = NCCL
    comm._types = distributed.nccl_types(NCCL)  # as NCCLCommunicator.__init__ builds it
    stream = types.SimpleNamespace(ptr=0, synchronize=lambda: None)
    comm.cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: stream))
    return comm


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16", "fp64"])
@pytest.mark.parametrize("rank", [0, 1, 2])
def test_collectives_pass_nccls_in_place_forms(rank, dtype):
    R, n = 3, 12
    comm = engine(rank, R)
    dt = dtypes.as_dtype(dtype)
    grads = np.arange(n, dtype=np.float32).astype(dt).view(ndarray)
    comm.all_reduce(grads, what="gradients")
    np.testing.assert_array_equal(grads.astype(np.float32), np.arange(n) * 5)
    grads = np.arange(n, dtype=np.float32).astype(dt).view(ndarray)
    shard = comm.reduce_scatter(grads, what="gradients")
    lo = rank * n // R
    np.testing.assert_array_equal(shard.astype(np.float32), np.arange(lo, lo + n // R) * 5)
    assert shard.data.ptr == grads.data.ptr + lo * dt.itemsize
    weights = np.full(n, 7, np.float32).astype(dt).view(ndarray)
    comm.all_gather(weights, what="weights")
    expect = np.concatenate([np.full(n // R, 7 if r == rank else -r) for r in range(R)])
    np.testing.assert_array_equal(weights.astype(np.float32), expect)
    for root in (0, R - 1):
        data = np.arange(n, dtype=np.float32).astype(dt).view(ndarray)
        comm.broadcast(data, root=root, what="weights")
        want = np.arange(n) * (1 if root == rank else 2) + (0 if root == rank else root)
        np.testing.assert_array_equal(data.astype(np.float32), want)
    assert comm.nccl_comm.calls == [
        ("allReduce", n),
        ("reduceScatter", n // R),
        ("allGather", n // R),
        ("bcast", n, 0),
        ("bcast", n, R - 1),
    ]
    assert [c.sent for c in comm._records] == [
        2 * (R - 1) / R * n * dt.itemsize,
        (R - 1) / R * n * dt.itemsize,
        (R - 1) / R * n * dt.itemsize,
        n * dt.itemsize,
        n * dt.itemsize,
    ]


def test_the_dtype_codes_are_nccls():
    assert distributed.nccl_types(NCCL) == {
        dtypes.float16: 6,
        dtypes.float32: 7,
        dtypes.float64: 8,
        dtypes.bfloat16: 9,
    }
    for dtype, code in distributed.nccl_types(NCCL).items():
        assert np.dtype(TYPES[code]) == dtype


STUB = """
import os
available = os.environ.get("FAKE_LIBNCCL") == "loaded"  # as CuPy: False if the import failed
if available:
    NCCL_SUM, NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_BFLOAT16 = 0, 6, 7, 8, 9
"""


def test_nccl_is_imported_again_after_loading_the_wheels_library(tmp_path, monkeypatch):
    """CuPy 14 leaves cupy.cuda.nccl as a stub (available = False) when libnccl.so.2 cannot be
    found, and importing it again returns the stub: _import_nccl loads the nvidia-nccl wheel's
    library and reloads the module. A fake CuPy and wheel: the stub becomes available only once
    the wheel's library is 'loaded'."""
    for pkg in ("cupy", "cupy/cuda", "nvidia", "nvidia/nccl"):
        (tmp_path / pkg).mkdir(parents=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "cupy" / "cuda" / "nccl.py").write_text(STUB)
    for name in [m for m in sys.modules if m.split(".")[0] in ("cupy", "nvidia")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("FAKE_LIBNCCL", raising=False)
    loaded = []

    def cdll(path, mode=0):
        assert path == str(tmp_path / "nvidia" / "nccl" / "lib" / "libnccl.so.2")
        loaded.append(path)
        monkeypatch.setenv("FAKE_LIBNCCL", "loaded")

    monkeypatch.setattr(distributed.ctypes, "CDLL", cdll)
    nccl = distributed._import_nccl()
    assert loaded and nccl.available and nccl.NCCL_BFLOAT16 == 9
    assert sys.modules["cupy.cuda.nccl"] is nccl
    assert distributed._import_nccl() is nccl and len(loaded) == 1  # available now: no reload

    def missing(path, mode=0):
        raise OSError("no such file")

    monkeypatch.delenv("FAKE_LIBNCCL")
    importlib.reload(nccl)
    monkeypatch.setattr(distributed.ctypes, "CDLL", missing)
    with pytest.raises(RuntimeError, match="pip install nvidia-nccl-cu13"):
        distributed._import_nccl()
