"""The layers GPT-2 is made of. Weights are stored as GPT-2's checkpoints store them."""

import numpy as np

import tinygrad_like.ops as F

from .module import Module, Parameter


class Linear(Module):
    """y = x W + b with W (in_features, out_features): GPT-2's Conv1D layout, so the forward
    GEMM is X (M, in) @ W (in, out) with no transpose."""

    def __init__(self, in_features, out_features, bias=True, std=0.02, rng=None):
        super().__init__()
        rng = rng or np.random.default_rng(0)
        weight = rng.normal(0.0, std, (in_features, out_features)).astype(np.float32)
        self.weight = Parameter(weight)
        self.bias = Parameter(np.zeros(out_features, np.float32)) if bias else None

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
        table = np.zeros((padded_to or num_embeddings, embedding_dim), np.float32)
        table[:num_embeddings] = rng.normal(0.0, std, (num_embeddings, embedding_dim))
        self.weight = Parameter(table, rows=num_embeddings)

    def forward(self, idx):
        return F.embedding(idx, self.weight, self.num_embeddings)


class LayerNorm(Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = Parameter(np.ones(dim, np.float32))
        self.bias = Parameter(np.zeros(dim, np.float32))

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
        self.weight = Parameter(np.ones(dim, np.float32))

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
        weight = np.zeros((padded_to or out_features, in_features), np.float32)
        weight[:out_features] = rng.normal(0.0, std, (out_features, in_features))
        self.weight = Parameter(weight, rows=out_features if padded_to else None)

    def forward(self, x):
        return F.linear(x, self.weight, transposed=True)
