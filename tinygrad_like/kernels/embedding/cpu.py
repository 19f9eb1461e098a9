"""Embeddings on the CPU (embedding.cu's twin): a gather forward, a deterministic scatter-add
backward.
"""

import numpy as np
from numba import prange

from ...backend.cpu.compiled import kernel
from ...backend.cpu.halves import f32, rounded
from .spec import check_ids


@kernel
def _embedding_bwd(dout, order, starts, dweight):
    # one id per iteration (embedding.cu: one block per run of equal ids), its run of tokens
    # order[starts[id]:starts[id + 1]] summed in increasing position; an id no token has gets
    # a zero row, so dweight is written once and never zeroed first
    C = dout.shape[1]
    for row in prange(dweight.shape[0]):
        dweight[row] = 0
        for j in range(starts[row], starts[row + 1]):
            for c in range(C):
                dweight[row, c] += dout[order[j], c]


def embedding_fwd(weight, idx):
    check_ids(idx, weight.shape[0])
    return weight[idx]


def embedding_bwd(dout, idx, num_embeddings):
    """The rows of each id summed in the order of a stable sort of the ids (position order):
    deterministic."""
    check_ids(idx, num_embeddings)
    C = dout.shape[-1]
    flat_idx = idx.reshape(-1)
    order = np.argsort(flat_idx, kind="stable")
    starts = np.searchsorted(flat_idx[order], np.arange(num_embeddings + 1))  # (V + 1,) runs
    douts = np.ascontiguousarray(f32(dout.reshape(-1, C)))
    dweight = np.empty((num_embeddings, C), dtype=douts.dtype)
    _embedding_bwd(douts, order, starts, dweight)
    return rounded(dweight, dout.dtype)  # 2-byte: summed in fp32, each row rounded once
