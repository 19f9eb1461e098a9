"""Quantizing a model for inference: quantize_model(model, fmt) replaces its GEMM weights, in
place, by QuantizedWeights (tinygrad_like/quant.py) that the kernels decode as they read them.

What is quantized: every Linear weight (GPT-2's Conv1D layout (in, out): out_axis 1), every
TransposedLinear weight ((out, in): Llama's projections and its LM head) and the token
embedding (rows: out_axis 0), which for GPT-2 is also the tied LM head (logits = x wte^T: one
QuantizedWeight serves both). Norms, biases and GPT-2's position embedding stay as they are:
they are small, and the position table is only gathered from. use_activations chooses, at run
time, whether the quantized GEMMs meet x in fp32 or quantized to int8 (int8 and int4 weights).
"""

import numpy as np

from tinygrad_like import backend, no_grad
from tinygrad_like.formats import get_format
from tinygrad_like.quant import QuantizedWeight, check_activations, quantize

from .layers import Linear, TransposedLinear


def quantize_model(model, fmt, group_size=None, activations="fp32"):
    """Quantize model's weights to fmt (a FORMATS name; "fp32" leaves the model as it is), with
    group_size elements per scale (the format's default when None) -> model; their GEMMs then
    meet x as `activations` says (use_activations). A weight shared by two modules stays one.
    Every weight is quantized and checked before any is replaced, so a group size that does not
    fit one, activations it cannot meet, or a weight holding nan or inf (which the codes would
    turn into finite numbers), leaves the model as it was. Inference only: the model can no
    longer be trained."""
    if fmt == "fp32":
        return use_activations(model, activations)  # refuses int8: nothing is quantized
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
    _set_activations(done.values(), activations)
    for _, module, _ in targets:
        module.weight = done[id(module.weight)]
    return model


def use_activations(model, activations):
    """How every quantized weight of model meets x (tinygrad_like.quant.ACTIVATIONS), a run-time
    choice never stored in a checkpoint -> model: "fp32", x as it is against the decoded
    weights; "int8", x quantized per block of 32 to int8 codes and dotted with int8 or int4
    weights in integers (llama.cpp's Q8_0 activations: faster on a CPU; the logits of the
    tests' small GPT-2s within 1% of the fp32 path's); "bf16", x rounded to bf16 for bf16
    weights (llama.cpp's bf16). All are checked before any changes: a ValueError for weights
    that have no such path (int8: a float format, groups that are not whole blocks of 32;
    bf16: any format but bf16)."""
    weights = {id(m.weight): m.weight for _, m, _ in quantized_modules(model)}
    quantized = [w for w in weights.values() if isinstance(w, QuantizedWeight)]
    if not quantized and activations != "fp32":
        raise ValueError(f"{activations} activations need quantized weights: the model is fp32")
    _set_activations(quantized, activations)
    return model


def _set_activations(weights, activations):
    """Every QuantizedWeight of weights checked for activations, then switched to it."""
    weights = list(weights)
    for w in weights:
        check_activations(w, activations)
    for w in weights:
        w.activations = activations


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
