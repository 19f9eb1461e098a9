"""The working weights of training: a model's parameters laid out in one flat buffer of the
working dtype, each Parameter a view of its span. This is where a model takes its training
dtype (Module.flatten_parameters, nn.build(config, dtype=...)): fp32, or bf16 / fp16 with the
fp32 master copy in the optimizer. AdamW (optim/adamw.py) views this buffer as its working
weights (in fp32 its master) and updates every parameter in one launch; it never rebinds a
parameter.

The layout: the 2-D (and higher) parameters first, in the model's order, then the rest (biases,
norm gains), so that weight decay, which covers the matrices, is a prefix of the buffer; then
zeros up to a multiple of `shards`, so that the buffer splits into equal shards (ZeRO over R
ranks: shards = R). A parameter stored with zero padding rows (the tied wte) is laid out whole.
"""

import numpy as np

from tinygrad_like import autograd, backend, dtypes, kernels
from tinygrad_like.memory import TRACKER


class FlatParameters:
    """data: the flat buffer (numel,) in the working dtype; params: the Parameters viewing it,
    in its order; spans: each one's [lo, hi) in it; padding: the zero elements after the last
    one (for equal shards)."""

    def __init__(self, data, params, spans):
        self.data, self.params, self.spans = data, params, spans
        self.numel = data.shape[0]
        self.padding = self.numel - (spans[-1][1] if spans else 0)


def flatten_parameters(params, dtype=None, shards=1):
    """Lay params (Parameters, each once, on one device) out in one flat buffer of dtype
    (default the first one's), tagged "weights" in the memory tracker; each Parameter is
    rebound to its view (its values cast to dtype) and its gradient dropped. -> FlatParameters.
    """
    params = sorted(params, key=lambda p: p.ndim < 2)  # stable: the model's order within each
    if not params:
        raise ValueError("no parameters to lay out")
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    dtype = dtypes.as_dtype(dtype) if dtype is not None else params[0].dtype
    be = backend.of(params[0].data)
    if any(backend.of(p.data) is not be for p in params):
        raise ValueError("parameters on more than one device: move the model to one first")
    edges = np.cumsum([0] + [p.numel() for p in params]).tolist()
    numel = -(-edges[-1] // shards) * shards
    data = be.empty((numel,), dtype)
    TRACKER.register(data, "weights")
    flat = FlatParameters(data, params, list(zip(edges, edges[1:])))
    with autograd.no_grad():
        for p, (lo, hi) in zip(params, flat.spans):
            values = p.data if p.dtype == dtype else kernels.launch("cast", p.data, dtype)
            kernels.launch("copy", data[lo:hi], values.reshape(-1))
            p.assign(data[lo:hi].reshape(p.shape), flat)
            p.grad = None
        if flat.padding:
            kernels.launch("fill", data[edges[-1] :], 0)
    return flat
