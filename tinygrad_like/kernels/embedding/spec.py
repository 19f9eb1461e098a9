"""Embeddings: a gather of a table's rows by token id, and its gradient, the rows of repeated ids
summed in a fixed order (deterministic: no atomics).

cpu.py: a gather, and a compiled scatter-add over the ids in order; cuda.py + embedding.cu: a
gather, and a backward that sorts the ids and sums each id's rows in a fixed order.
"""

from ..record import Out, kernel, per_element


@kernel(
    shape=lambda weight, idx: Out(tuple(idx.shape) + tuple(weight.shape[1:]), weight.dtype),
    skips=(0,),
    reads=lambda outs, weight, idx: idx.nbytes + outs[0].nbytes,
)
def embedding_fwd(weight, idx):
    """weight (V, C), idx (...) int in [0, V) -> (..., C): a gather (reads only the rows it
    copies)."""


@kernel(
    shape=lambda dout, idx, num_embeddings: Out((num_embeddings, dout.shape[-1]), dout.dtype),
    flops=per_element(1),
)
def embedding_bwd(dout, idx, num_embeddings):
    """dout (..., C) -> dweight (V, C), rows of repeated ids summed in a fixed order."""


def check_ids(idx, num_embeddings):
    """Raise ValueError unless every id is in [0, num_embeddings): NumPy would wrap a negative id
    around and raise IndexError for a large one, a CUDA kernel would read or write out of bounds.
    On CuPy min and max are device reductions whose results int() reads back (a host sync)."""
    if idx.size:
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= num_embeddings:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} out of range for vocab {num_embeddings}")
