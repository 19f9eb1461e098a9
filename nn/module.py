"""Module and Parameter, PyTorch's names and semantics where it has them.

Parameters are Tensors that require grad and are tagged 'weights' in the memory tracker.
state_dict() names come from attribute names, so a GPT2 built from transformer.wte,
transformer.h.0.attn.c_attn, ... has exactly Hugging Face's GPT-2 keys. A weight may be a
QuantizedWeight (nn/quant.py's quantize_model): it is listed among the parameters (counted,
moved, saved as the fp32 values it stands for) but has no gradient and is never cast.
"""

import numpy as np

from tinygrad_like import Tensor, autograd, backend, dtypes, kernels
from tinygrad_like.memory import TRACKER
from tinygrad_like.padded_rows import PaddedRows
from tinygrad_like.quant import QuantizedWeight, dequantize

from .flat import flatten_parameters


class Parameter(Tensor, PaddedRows):
    """rows: how many leading rows are parameters when the storage has zero rows past them (the
    tied token embedding, padded to an aligned vocabulary: GPT2Config.padded_vocab_size); None
    when all are. num_parameters(), state dicts and checkpoints see only those rows; the padding
    rows get zero gradients, so AdamW keeps them zero."""

    def __init__(self, data, dtype=None, device=None, rows=None):
        super().__init__(data, requires_grad=True, dtype=dtype, device=device)
        self.rows = rows
        self.flat = None  # the FlatParameters whose buffer this one views (nn/flat.py)
        TRACKER.register(self.data, "weights")

    def assign(self, array, flat=None):
        """Rebind to a new buffer: a cast or moved copy, or a view of flat's buffer."""
        self.data, self.flat = array, flat
        TRACKER.register(array, "weights")


class Module:
    def __init__(self):
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_scope", "")

    def __setattr__(self, name, value):
        if isinstance(value, (Parameter, QuantizedWeight)):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def __call__(self, *args, **kwargs):
        with autograd.scope(self._scope):
            return self.forward(*args, **kwargs)

    # ---- traversal
    def named_modules(self, prefix=""):
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def named_parameters(self, prefix=""):
        """(name, parameter) pairs; a parameter shared by two modules (tied) appears once."""
        seen = set()
        for mod_name, m in self.named_modules(prefix):
            for name, p in m._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{mod_name}.{name}" if mod_name else name), p

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def name_scopes(self):
        """Give every submodule its dotted name, so tape records know which layer ran them."""
        for name, m in self.named_modules():
            object.__setattr__(m, "_scope", name)

    def num_parameters(self):
        """Parameters without storage padding (see Parameter.rows)."""
        return sum(p.unpadded_numel() for p in self.parameters())

    # ---- modes and gradients
    def train(self, mode=True):
        for _, m in self.named_modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self):
        """Zero every gradient in place. Gradients stay allocated (they are one of the four
        consumers of training memory, and may be views into the optimizer's flat buffer)."""
        for p in self.parameters():
            if p.grad is not None:
                kernels.launch("fill", p.grad.data, 0)

    def to(self, dtype=None, device=None):
        """Move every parameter to device and/or cast it to dtype (e.g. bf16 inference), each
        into a buffer of its own (training lays them out in one: flatten_parameters).
        model.to("cuda") and model.to("bf16") also work."""
        if dtype in backend.DEVICES:
            dtype, device = None, dtype
        with autograd.no_grad():
            for p in self.parameters():
                if isinstance(p, QuantizedWeight):  # its format is fixed: moved, never cast
                    p.to(device or p.device)
                    continue
                if device is not None and p.device != device:
                    p.assign(backend.get(device).asarray(p.numpy()))
                    p.grad = None
                if dtype is not None and p.dtype != dtypes.as_dtype(dtype):
                    p.assign(kernels.launch("cast", p.data, dtypes.as_dtype(dtype)))
                    p.grad = None
        return self

    def flatten_parameters(self, dtype=None, shards=1):
        """Take the working dtype of training: every parameter becomes a view of one flat
        buffer of dtype (default their own), which the optimizer updates in one launch (nn/flat.py:
        its layout, and zeros up to a multiple of shards for ZeRO's equal shards). -> self."""
        quantized = [name for name, p in self.named_parameters() if isinstance(p, QuantizedWeight)]
        if quantized:
            raise ValueError(f"a quantized model ({quantized[0]}, ...) is for inference only")
        flatten_parameters(self.parameters(), dtype, shards)
        return self

    def replace_parameters(self, new):
        """Rebind each module's parameter p to new[id(p)] where there is one (a Parameter or a
        QuantizedWeight): a weight two modules share (tied) is replaced in both."""
        for _, m in self.named_modules():
            for name, p in list(m._parameters.items()):
                if id(p) in new:
                    setattr(m, name, new[id(p)])

    # ---- state
    def state_dict(self):
        """name -> NumPy array (a host copy of the parameter rows), in the parameters' own dtype
        (a quantized weight: the fp32 values it stands for, quant.dequantize)."""
        return {
            name: np.array(p.unpadded(_host_values(p)), copy=True)
            for name, p in self.named_parameters()
        }

    def load_state_dict(self, state, strict=True):
        """Check every key and shape first, then copy: a bad state dict loads nothing."""
        params = dict(self.named_parameters())
        quantized = sorted(name for name, p in params.items() if isinstance(p, QuantizedWeight))
        if quantized:
            raise ValueError(
                f"state dict into a quantized model ({', '.join(quantized[:3])}, ...): load the "
                "weights first, then quantize (nn.quant.quantize_model)"
            )
        missing = sorted(set(params) - set(state))
        extra = sorted(set(state) - set(params))
        problems = []
        if missing:
            problems.append(f"missing keys: {', '.join(missing)}")
        if extra and strict:
            problems.append(f"unexpected keys: {', '.join(extra)}")
        for name, p in params.items():
            if name in state and tuple(state[name].shape) != p.unpadded_shape:
                problems.append(
                    f"{name}: checkpoint has shape {tuple(state[name].shape)}, "
                    f"model expects {p.unpadded_shape}"
                )
        if problems:
            raise ValueError(
                "state dict does not match the model (nothing was loaded): " + "; ".join(problems)
            )
        with autograd.no_grad():
            for name, p in params.items():
                src = np.ascontiguousarray(state[name]).astype(p.dtype)
                kernels.launch("copy", p.unpadded(p.data), backend.of(p.data).asarray(src))


def _host_values(p):
    """A parameter's values on the host: a Parameter's own, a quantized weight's fp32."""
    return dequantize(p) if isinstance(p, QuantizedWeight) else p.numpy()


class ModuleList(Module):
    def __init__(self, modules):
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)

    def __getitem__(self, i):
        return self._modules[str(i)]
