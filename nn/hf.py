"""Hugging Face's formats of GPT-2 and Llama: a directory with config.json and
model.safetensors, the family told by config.json's model_type ("gpt2", "llama").

GPT-2: keys may carry the "transformer." prefix (GPT2LMHeadModel) or not (GPT2Model, the
original gpt2 upload); the causal-mask buffers attn.bias / attn.masked_bias are ignored, and so
is lm_head.weight, which is tied to transformer.wte.weight. Weights are written in fp32 with
metadata {"format": "pt"}, so transformers' GPT2LMHeadModel.from_pretrained loads them as is.

Llama (LlamaForCausalLM): the keys are the model's own (model.embed_tokens.weight,
model.layers.N.self_attn.q_proj.weight, ..., lm_head.weight), each linear weight (out, in) as
PyTorch's nn.Linear stores it, which is also how Llama holds them; a tied checkpoint
(tie_word_embeddings, no lm_head.weight) gets lm_head.weight from the embedding.

A quantized checkpoint (scripts/quantize.py, nn/quant_checkpoint.py) is such a directory
whose config.json has a "quantization" entry (read_quantization): its GEMM weights are stored
as codes and scales, so read_state refuses it (it loads for inference only, never as fp32).

A file format only: it reads and writes configs and state dicts, and builds no model (GPT2's
from_pretrained and save_pretrained call it).
"""

import json
import os

import numpy as np

from tinygrad_like import formats
from tinygrad_like.files import atomic_write

from .config import GPT2Config, LlamaConfig

CONFIG, WEIGHTS = "config.json", "model.safetensors"
QUANTIZATION = "quantization"  # config.json's entry in a quantized checkpoint
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


def family(config):
    """'GPT-2' or 'Llama', for messages."""
    return "Llama" if isinstance(config, LlamaConfig) else "GPT-2"


def read_json(path):
    """(config.json's path, its object) of the checkpoint directory at path."""
    check_dir(path)
    file = os.path.join(path, CONFIG)
    try:
        with open(file, "rb") as f:
            hf = json.loads(f.read())
    except ValueError as e:  # UnicodeDecodeError is one too
        raise ValueError(f"{file}: not valid JSON ({e}); the file is corrupt") from None
    if not isinstance(hf, dict):
        raise ValueError(f"{file}: expected a JSON object, found {type(hf).__name__}")
    return file, hf


def _is_llama(hf):
    return hf.get("model_type") == "llama"


def read_config(path):
    """The GPT2Config or LlamaConfig of the checkpoint directory at path (ValueError for a
    corrupt one, or a Llama variant the model does not implement)."""
    file, hf = read_json(path)
    if _is_llama(hf):
        return _llama_config(file, hf)
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
    _check_ints(file, fields)
    eps, dropout = hf.get("layer_norm_epsilon", 1e-5), hf.get("resid_pdrop", 0.0)
    if type(eps) not in (int, float) or type(dropout) not in (int, float):
        raise ValueError(f"{file}: layer_norm_epsilon and resid_pdrop must be numbers")
    return GPT2Config(**fields, layer_norm_epsilon=eps, dropout=dropout)


def _check_ints(file, fields):
    for name, value in fields.items():  # a corrupt file must not build a model of any shape
        if type(value) is not int:
            raise ValueError(f"{file}: {name} must be an integer, got {value!r}")


def _llama_config(file, hf):
    """LlamaConfig from a LlamaForCausalLM config.json: plain rotary positions (no
    rope_scaling), SiLU, no biases, head_dim = hidden_size / num_attention_heads."""
    try:
        ints = {
            k: hf[k]
            for k in (
                "num_hidden_layers",
                "hidden_size",
                "num_attention_heads",
                "intermediate_size",
                "vocab_size",
                "max_position_embeddings",
            )
        }
    except KeyError as e:
        raise ValueError(f"{file} has no {e.args[0]!r}: is it a Llama config?") from None
    ints["num_key_value_heads"] = hf.get("num_key_value_heads") or ints["num_attention_heads"]
    _check_ints(file, ints)
    floats = {"rms_norm_eps": hf.get("rms_norm_eps", 1e-6), "rope_theta": hf.get("rope_theta", 1e4)}
    if any(type(v) not in (int, float) for v in floats.values()):
        raise ValueError(f"{file}: rms_norm_eps and rope_theta must be numbers")
    unsupported = {
        "hidden_act": (hf.get("hidden_act", "silu"), "silu"),
        "rope_scaling": (hf.get("rope_scaling"), None),
        "attention_bias": (hf.get("attention_bias", False), False),
        "mlp_bias": (hf.get("mlp_bias", False), False),
        "head_dim": (
            hf.get("head_dim") or ints["hidden_size"] // ints["num_attention_heads"],
            ints["hidden_size"] // ints["num_attention_heads"],
        ),
    }
    for name, (value, ours) in unsupported.items():
        if value != ours:
            raise ValueError(f"{file}: {name} {value!r} is not implemented (only {ours!r})")
    return LlamaConfig(**ints, **floats)


def read_quantization(path):
    """config.json's "quantization" entry of the checkpoint at path, checked: {"format": a
    FORMATS name, "group_size": an int or None (the format's default), "tensors": the names
    stored as codes and scales}; None for an fp32 checkpoint."""
    file, hf = read_json(path)
    entry = hf.get(QUANTIZATION)
    if entry is None:
        return None
    fields = ("format", "group_size", "tensors")
    if not isinstance(entry, dict) or set(entry) != set(fields):
        raise ValueError(f"{file}: {QUANTIZATION!r} must hold exactly {', '.join(fields)}")
    try:
        formats.get_format(entry["format"])
    except ValueError as e:
        raise ValueError(f"{file}: {e}") from None
    group, names = entry["group_size"], entry["tensors"]
    if group is not None and type(group) is not int:
        raise ValueError(f"{file}: quantization group_size must be an integer or null")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{file}: quantization tensors must be a list of names")
    return entry


def check_dir(path):
    missing = [f for f in (CONFIG, WEIGHTS) if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise FileNotFoundError(
            f"{path} is not a checkpoint: expected {CONFIG} and {WEIGHTS} in it "
            f"(missing: {', '.join(missing)}). Train one with examples/train_gpt2.py --out DIR, "
            "or point at a Hugging Face GPT-2 or Llama directory."
        )


def read_state(path):
    """The tensors of a checkpoint as NumPy arrays under the model's names: GPT-2's prefix-free
    keys mapped to ours, a tied Llama's lm_head.weight taken from its embedding."""
    _, hf = read_json(path)
    if QUANTIZATION in hf:
        fmt = read_quantization(path)["format"]
        raise ValueError(
            f"{path} holds {fmt} weights (scripts/quantize.py), not fp32 ones: load it for "
            "inference with nn.from_pretrained, or use the fp32 checkpoint it was made from"
        )
    tensors = read_tensors(path)
    if _is_llama(hf):
        if "lm_head.weight" not in tensors and "model.embed_tokens.weight" in tensors:
            tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
        return tensors
    state = {}
    for key, array in tensors.items():
        if key.endswith(_IGNORED_SUFFIXES) or key == "lm_head.weight":
            continue
        state[key if key.startswith("transformer.") else "transformer." + key] = array
    return state


def read_tensors(path):
    """The checkpoint's model.safetensors as NumPy arrays, names and dtypes as stored."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    file = os.path.join(path, WEIGHTS)
    try:
        return load_file(file)
    except (SafetensorError, OSError) as e:
        raise ValueError(
            f"{file}: cannot be read ({e}); the file is truncated or corrupt"
        ) from None


def hf_config(config):
    """config.json's contents for config (either family)."""
    if isinstance(config, LlamaConfig):
        return _llama_hf_config(config)
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


def _llama_hf_config(config):
    gpt2_vocab = config.vocab_size == 50257  # the presets' tokenizer: its <|endoftext|>
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "num_hidden_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.intermediate_size,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "bos_token_id": 50256 if gpt2_vocab else None,
        "eos_token_id": 50256 if gpt2_vocab else None,
        "use_cache": True,
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
