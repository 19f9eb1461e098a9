"""The layers GPT-2 is made of. Weights are stored as GPT-2's checkpoints store them.

Each layer makes its parameters with parameter(shape, init): init() draws the initial values
on the host (one stream whatever the device, so a model is the same on every device), except
when building for a device that holds no values (meta: shapes only), where nothing is drawn.
"""

import contextlib

import numpy as np

import tinygrad_like.functional as F
from tinygrad_like import backend, dtypes

from .module import Module, Parameter

_building_for = [None]  # the device of the model being built (building_on), innermost last


@contextlib.contextmanager
def building_on(device):
    """with building_on(device): the layers made inside are for device (a model's __init__)."""
    _building_for.append(device)
    try:
        yield
    finally:
        _building_for.pop()


def parameter(shape, init, rows=None):
    """A Parameter of shape from init() -> its fp32 host values, or, when building for a device
    that holds no values (meta), a shape-only fp32 array with nothing drawn or allocated."""
    device = _building_for[-1]
    if device is not None and not backend.get(device).HOLDS_VALUES:
        return Parameter(backend.get(device).empty(shape, dtypes.float32), rows=rows)
    return Parameter(init(), rows=rows)


def _normal_rows(rows, cols, std, rng, padded_to=None):
    """A (padded_to or rows, cols) Parameter: N(0, std) draws for the first rows (the unpadded
    table's draws, whatever the padding), zero rows after them."""
    shape = (padded_to or rows, cols)

    def init():
        table = np.zeros(shape, np.float32)
        table[:rows] = rng.normal(0.0, std, (rows, cols))
        return table

    return parameter(shape, init, rows=rows)


class Linear(Module):
    """y = x W + b with W (in_features, out_features): GPT-2's Conv1D layout, so the forward
    GEMM is X (M, in) @ W (in, out) with no transpose."""

    def __init__(self, in_features, out_features, bias=True, std=0.02, rng=None):
        super().__init__()
        rng = rng or np.random.default_rng(0)
        shape = (in_features, out_features)
        self.weight = parameter(shape, lambda: rng.normal(0.0, std, shape).astype(np.float32))
        self.bias = None
        if bias:
            self.bias = parameter((out_features,), lambda: np.zeros(out_features, np.float32))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class Embedding(Module):
    """A table of num_embeddings rows. padded_to stores it with zero rows up to that many
    (padded_to, embedding_dim), for the tied LM head's aligned GEMMs; ids stay < num_embeddings
    and the random init is the unpadded table's (the same draws)."""

    def __init__(self, num_embeddings, embedding_dim, std=0.02, rng=None, padded_to=None):
        super().__init__()
        rng = rng or np.random.default_rng(0)
        self.num_embeddings = num_embeddings
        self.weight = _normal_rows(num_embeddings, embedding_dim, std, rng, padded_to)

    def forward(self, idx):
        return F.embedding(idx, self.weight, self.num_embeddings)


class LayerNorm(Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = parameter((dim,), lambda: np.ones(dim, np.float32))
        self.bias = parameter((dim,), lambda: np.zeros(dim, np.float32))

    def forward(self, x):
        return F.layer_norm(x, self.weight, self.bias, self.eps)


class Dropout(Module):
    def __init__(self, p=0.0):
        super().__init__()
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)


class RMSNorm(Module):
    """Llama's RMSNorm: x / sqrt(mean(x^2) + eps) * weight, no mean subtracted, no bias."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = parameter((dim,), lambda: np.ones(dim, np.float32))

    def forward(self, x):
        return F.rms_norm(x, self.weight, self.eps)


class TransposedLinear(Module):
    """y = x W^T, no bias, with W (out_features, in_features): PyTorch's nn.Linear layout, in
    which Llama's checkpoints store every projection (F.linear(transposed=True): the same three
    GEMMs as Linear's, each 2 M K N). padded_to stores W with zero rows up to that many, as
    Embedding does (the LM head's aligned vocabulary)."""

    def __init__(self, in_features, out_features, std=0.02, rng=None, padded_to=None):
        super().__init__()
        rng = rng or np.random.default_rng(0)
        self.weight = _normal_rows(out_features, in_features, std, rng, padded_to)

    def forward(self, x):
        return F.linear(x, self.weight, transposed=True)


def projections(x, *modules):
    """Each TransposedLinear's y = x W^T (Llama's q, k and v; gate and up): the modules called
    one by one, or where their weights all meet x in int8 codes (quantized, activations "int8"),
    F.linears, which quantizes x once for them all."""
    if all(F.shares_codes(m.weight) for m in modules):
        return F.linears(x, [m.weight for m in modules], transposed=True)
    return [m(x) for m in modules]
