"""Hugging Face's GPT-2 format: a directory with config.json and model.safetensors.

Keys may carry the "transformer." prefix (GPT2LMHeadModel) or not (GPT2Model, the original
gpt2 upload); the causal-mask buffers attn.bias / attn.masked_bias are ignored, and so is
lm_head.weight, which is tied to transformer.wte.weight. Weights are written in fp32 with
metadata {"format": "pt"}, so transformers' GPT2LMHeadModel.from_pretrained loads them as is.
A file format only: it reads and writes configs and state dicts, and builds no model (GPT2's
from_pretrained and save_pretrained call it).
"""

import json
import os

import numpy as np

from tinygrad_like.files import atomic_write

from .config import GPT2Config

CONFIG, WEIGHTS = "config.json", "model.safetensors"
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


def read_config(path):
    """The GPT2Config of the checkpoint directory at path (ValueError for a corrupt one)."""
    check_dir(path)
    file = os.path.join(path, CONFIG)
    try:
        with open(file, "rb") as f:
            hf = json.loads(f.read())
    except ValueError as e:  # UnicodeDecodeError is one too
        raise ValueError(f"{file}: not valid JSON ({e}); the file is corrupt") from None
    if not isinstance(hf, dict):
        raise ValueError(f"{file}: expected a JSON object, found {type(hf).__name__}")
    try:
        fields = dict(
            n_layer=hf["n_layer"],
            n_head=hf["n_head"],
            n_embd=hf["n_embd"],
            n_positions=hf.get("n_positions", hf.get("n_ctx", 1024)),
            vocab_size=hf["vocab_size"],
        )
    except KeyError as e:
        raise ValueError(f"{file} has no {e.args[0]!r}: is it a GPT-2 config?") from None
    for name, value in fields.items():  # a corrupt file must not build a model of any shape
        if type(value) is not int:
            raise ValueError(f"{file}: {name} must be an integer, got {value!r}")
    eps, dropout = hf.get("layer_norm_epsilon", 1e-5), hf.get("resid_pdrop", 0.0)
    if type(eps) not in (int, float) or type(dropout) not in (int, float):
        raise ValueError(f"{file}: layer_norm_epsilon and resid_pdrop must be numbers")
    return GPT2Config(**fields, layer_norm_epsilon=eps, dropout=dropout)


def check_dir(path):
    missing = [f for f in (CONFIG, WEIGHTS) if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise FileNotFoundError(
            f"{path} is not a GPT-2 checkpoint: expected {CONFIG} and {WEIGHTS} in it "
            f"(missing: {', '.join(missing)}). Train one with examples/train_gpt2.py --out DIR, "
            "or point at a Hugging Face GPT-2 directory."
        )


def read_state(path):
    """The tensors of a checkpoint as NumPy arrays, with the prefix-free keys mapped to ours."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    file = os.path.join(path, WEIGHTS)
    try:
        tensors = load_file(file)
    except (SafetensorError, OSError) as e:
        raise ValueError(
            f"{file}: cannot be read ({e}); the file is truncated or corrupt"
        ) from None
    state = {}
    for key, array in tensors.items():
        if key.endswith(_IGNORED_SUFFIXES) or key == "lm_head.weight":
            continue
        state[key if key.startswith("transformer.") else "transformer." + key] = array
    return state


def hf_config(config):
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "activation_function": "gelu_new",
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_embd": config.n_embd,
        "n_positions": config.n_positions,
        "n_ctx": config.n_positions,
        "n_inner": None,
        "vocab_size": config.vocab_size,
        "layer_norm_epsilon": config.layer_norm_epsilon,
        "initializer_range": 0.02,
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": 0.0,
        "bos_token_id": 50256,
        "eos_token_id": 50256,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }


def save_pretrained(path, config, state):
    """Write config.json for config and model.safetensors for state (name -> array, written
    in fp32) atomically (temp file, fsync, rename)."""
    from safetensors.numpy import save

    tensors = {k: np.ascontiguousarray(np.asarray(v, dtype=np.float32)) for k, v in state.items()}
    os.makedirs(path, exist_ok=True)
    atomic_write(os.path.join(path, WEIGHTS), save(tensors, metadata={"format": "pt"}))
    atomic_write(os.path.join(path, CONFIG), json.dumps(hf_config(config), indent=2).encode())
