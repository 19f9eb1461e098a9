"""Embeddings on CUDA (embedding.cu): a gather forward; a backward that sorts the ids and sums
each id's rows in a fixed order (deterministic, no atomics).
"""

import cupy
import numpy as np

from ...backend.cuda.runtime import BLOCK, capturing, compiled
from .spec import check_ids


def embedding_fwd(weight, idx):
    """Ids out of range raise spec.check_ids's ValueError (one device min/max, read by the host)
    before the launch: the kernel does no bounds check. Not inside a graph's capture, where the
    host may not read them (runtime.capturing)."""
    weight = cupy.ascontiguousarray(weight)
    idx = cupy.ascontiguousarray(idx, dtype=cupy.int64)
    if not capturing():
        check_ids(idx, weight.shape[0])
    out = cupy.empty(idx.shape + weight.shape[1:], dtype=weight.dtype)
    if idx.size:
        compiled("embedding.cu", "embedding_fwd", weight.dtype)(
            (idx.size,), (BLOCK,), (weight, idx, out, np.int32(weight.shape[1]))
        )
    return out


def embedding_bwd(dout, idx, num_embeddings):
    """Repeated ids summed in increasing position, the order of the CPU twin's stable sort, by
    one block per id: deterministic. Ids are checked as in embedding_fwd (a negative one would
    write before dweight), not inside a capture."""
    C = dout.shape[-1]
    dout = cupy.ascontiguousarray(dout).reshape(-1, C)
    flat = cupy.ascontiguousarray(idx, dtype=cupy.int64).reshape(-1)
    if not capturing():
        check_ids(flat, num_embeddings)
    n = flat.size
    keys = cupy.sort(flat * n + cupy.arange(n, dtype=cupy.int64))  # unique: id-major, then position
    dweight = cupy.zeros((num_embeddings, C), dtype=dout.dtype)
    if n:
        compiled("embedding.cu", "embedding_bwd", dout.dtype)(
            (n,), (BLOCK,), (dout, keys, dweight, np.int32(n), np.int32(C))
        )
    return dweight
