"""Quantizing a model for inference: quantize_model(model, fmt) replaces its GEMM weights, in
place, by QuantizedWeights (tinygrad_like/quant.py) that the kernels decode as they read them.

What is quantized: every Linear weight (GPT-2's Conv1D layout (in, out): out_axis 1), every
TransposedLinear weight ((out, in): Llama's projections and its LM head) and the token
embedding (rows: out_axis 0), which for GPT-2 is also the tied LM head (logits = x wte^T: one
QuantizedWeight serves both). Norms, biases and GPT-2's position embedding stay as they are:
they are small, and the position table is only gathered from.
"""

import numpy as np

from tinygrad_like import backend, no_grad
from tinygrad_like.formats import get_format
from tinygrad_like.quant import QuantizedWeight, quantize

from .layers import Linear, TransposedLinear


def quantize_model(model, fmt, group_size=None):
    """Quantize model's weights to fmt (a FORMATS name; "fp32" leaves the model as it is), with
    group_size elements per scale (the format's default when None) -> model. A weight shared
    by two modules stays one. Every weight is quantized before any is replaced, so a group size
    that does not fit one, or a weight holding nan or inf (which the codes would turn into
    finite numbers), leaves the model as it was. Inference only: the model can no longer be
    trained."""
    if fmt == "fp32":
        return model
    get_format(fmt)
    targets = list(quantized_modules(model))
    if any(isinstance(module.weight, QuantizedWeight) for _, module, _ in targets):
        raise ValueError("the model is quantized already: quantize it once")
    done = {}  # id(parameter) -> its QuantizedWeight
    with no_grad():
        for name, module, out_axis in targets:
            p = module.weight
            if id(p) not in done:
                _check_finite(f"{name}.weight", p.data)
                done[id(p)] = quantize(p.data, fmt, group_size, out_axis, rows=p.rows)
    for _, module, _ in targets:
        module.weight = done[id(module.weight)]
    return model


def _check_finite(name, array):
    """A ValueError naming the weight when array (on any device) holds nan or inf."""
    be = backend.of(array)
    if backend.holds_values(array) and not np.isfinite(be.to_numpy(array)).all():
        raise ValueError(f"{name} holds nan or inf: it cannot be quantized (a code is finite)")


def quantized_modules(model):
    """(name, module, out_axis) of every module whose weight quantize_model quantizes: the
    Linears (out_axis 1), the TransposedLinears and the token embedding (0). The loader of a
    quantized checkpoint (nn/quant_checkpoint.py) reads the same list, so a weight loaded from
    one has the layout quantizing on load gives it."""
    token_embedding = model.get_input_embeddings()
    for name, module in model.named_modules():
        if isinstance(module, Linear):
            yield name, module, 1
        elif isinstance(module, TransposedLinear) or module is token_embedding:
            yield name, module, 0
