"""The model families by config: build(config) makes a GPT2 for a GPT2Config and a Llama for a
LlamaConfig, from_pretrained(path) the model a Hugging Face directory (or a training
checkpoint) holds, whichever family its config.json names. The trainer, generation and the
scripts reach both families through these two, so a preset's name alone picks the family."""

from . import hf
from .gpt2 import GPT2
from .llama import Llama

FAMILIES = (GPT2, Llama)


def model_class(config):
    """GPT2 or Llama: the family config (a GPT2Config or a LlamaConfig) is of."""
    for cls in FAMILIES:
        if isinstance(config, cls.config_class):
            return cls
    raise TypeError(f"no model family for a {type(config).__name__}")


def build(config, seed=0, device=None, options=None, dtype=None):
    """A fresh model of config's family (random weights from seed, drawn in fp32), run with
    options; with dtype, laid out for training in that working dtype (flatten_parameters)."""
    model = model_class(config)(config, seed=seed, device=device, options=options)
    return model if dtype is None else model.flatten_parameters(dtype)


def from_pretrained(path, dtype=None, device=None, options=None):
    """The model in the checkpoint directory at path, of the family its config.json names."""
    cls = model_class(hf.read_config(path))
    return cls.from_pretrained(path, dtype=dtype, device=device, options=options)
