"""Embeddings on the meta device (embedding.py's shapes). The ids have no values to check: the
ops check host ids before they move (ops.embedding)."""

from .runtime import new


def embedding_fwd(weight, idx):
    """weight (V, C), idx (...) -> (..., C)."""
    return new(idx.shape + weight.shape[1:], weight.dtype)


def embedding_bwd(dout, idx, num_embeddings):
    """dout (..., C) -> dweight (V, C)."""
    return new((num_embeddings, dout.shape[-1]), dout.dtype)
