"""Embeddings on the CPU (embedding.cu's twin): a gather forward, a deterministic scatter-add
backward.
"""

import numpy as np

from ..contract import check_ids
from .elementwise import fill
from .runtime import f32


def embedding_fwd(weight, idx):
    """weight (V, C), idx (...) int in [0, V) -> (..., C): a gather."""
    check_ids(idx, weight.shape[0])
    return weight[idx]


def embedding_bwd(dout, idx, num_embeddings):
    """dout (..., C) -> dweight (V, C), rows of repeated ids summed in a fixed order (sorted),
    so the result is deterministic."""
    check_ids(idx, num_embeddings)
    C = dout.shape[-1]
    flat_idx = idx.reshape(-1)
    order = np.argsort(flat_idx, kind="stable")
    ids, starts = np.unique(flat_idx[order], return_index=True)
    sums = np.add.reduceat(f32(dout.reshape(-1, C))[order], starts, axis=0)  # (ids, C)
    # dweight (V, C) is mostly zero rows (wte: 25.8 MB of fp32 for 1024 ids): zeroed with the
    # parallel fill (np.zeros on reused heap memory is one core's memset), in dout's dtype
    # directly, so only the touched rows are rounded (each once, as before).
    dweight = fill(np.empty((num_embeddings, C), dtype=dout.dtype), 0)
    dweight[ids] = sums
    return dweight
