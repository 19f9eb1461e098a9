"""The NCCL engine's calls without a GPU: NCCLCommunicator over a stand-in for CuPy's NCCL
communicator that checks each call against NCCL's rules (counts, dtypes, the in-place forms:
reduceScatter's recvbuff = sendbuff + rank·count, allGather's sendbuff = recvbuff + rank·count)
and plays the other ranks, so that the results can be checked too. It cannot show that NCCL
itself runs: that needs GPUs (scripts/gpu_check.sh's nccl part, one rank)."""

import ctypes
import types

import ml_dtypes
import numpy as np
import pytest
from fake_cupy import ndarray

from tinygrad_like import dtypes
from tinygrad_like.distributed import NCCLCommunicator

SUM = 0
TYPES = {1: np.float32, 2: np.float16, 3: ml_dtypes.bfloat16, 4: np.float64}


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

    def abort(self):
        self.calls.append(("abort",))


def engine(rank, size):
    comm = NCCLCommunicator.__new__(NCCLCommunicator)
    comm.rank, comm.size, comm._records, comm._ops = rank, size, [], {}
    comm.nccl_comm = FakeNccl(rank, size)
    comm.nccl = types.SimpleNamespace(NCCL_SUM=SUM)
    comm._types = {dtypes.float32: 1, dtypes.float16: 2, dtypes.bfloat16: 3, dtypes.float64: 4}
    stream = types.SimpleNamespace(ptr=0, synchronize=lambda: None)
    comm.cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: stream))
    return comm


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
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
    assert comm.nccl_comm.calls == [
        ("allReduce", n),
        ("reduceScatter", n // R),
        ("allGather", n // R),
    ]
    assert [c.sent for c in comm._records] == [
        2 * (R - 1) / R * n * dt.itemsize,
        (R - 1) / R * n * dt.itemsize,
        (R - 1) / R * n * dt.itemsize,
    ]
