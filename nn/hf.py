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

Every file is untrusted input: config.json is bounded in size before it is read, each field
checked for type and range, and a field set to something the model does not implement (an
activation, unscaled attention, rope scaling, ...) is refused by name (IMPLEMENTED: one table
per family); model.safetensors is bounded by what the config's model can hold
(max_weights_bytes) before it is read, and its weights must be finite.

A file format only: it reads and writes configs and state dicts, and builds no model (GPT2's
from_pretrained and save_pretrained call it).
"""

import json
import os

import numpy as np

from tinygrad_like import formats
from tinygrad_like.files import atomic_write, read_small

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
    data = read_small(file)
    try:
        hf = json.loads(data)
    except ValueError as e:  # UnicodeDecodeError is one too
        raise ValueError(f"{file}: not valid JSON ({e}); the file is corrupt") from None
    if not isinstance(hf, dict):
        raise ValueError(f"{file}: expected a JSON object, found {type(hf).__name__}")
    return file, hf


def _is_llama(hf):
    return hf.get("model_type") == "llama"


def read_config(path):
    """The GPT2Config or LlamaConfig of the checkpoint directory at path (ValueError for a
    corrupt one, or a variant the model does not implement)."""
    file, hf = read_json(path)
    kind = hf.get("model_type", "gpt2")  # the original gpt2 upload has none
    if kind not in IMPLEMENTED:
        raise ValueError(f"{file}: model_type {kind!r} is not implemented (only gpt2 or llama)")
    try:
        config = (_llama_config if kind == "llama" else _gpt2_config)(file, hf)
    except KeyError as e:
        raise ValueError(f"{file} has no {e.args[0]!r}: is it a {kind} config?") from None
    except ValueError as e:  # the config's own checks (a size, an epsilon, rope_theta)
        raise ValueError(f"{file}: {e}") from None
    _check_implemented(file, hf, IMPLEMENTED[kind](config))
    return config


def _gpt2_config(file, hf):
    fields = dict(
        n_layer=hf["n_layer"],
        n_head=hf["n_head"],
        n_embd=hf["n_embd"],
        n_positions=hf.get("n_positions", hf.get("n_ctx", 1024)),
        vocab_size=hf["vocab_size"],
    )
    _check_ints(file, fields)
    eps, dropout = hf.get("layer_norm_epsilon", 1e-5), hf.get("resid_pdrop", 0.0)
    return GPT2Config(**fields, layer_norm_epsilon=eps, dropout=dropout)


def _check_ints(file, fields):
    for name, value in fields.items():  # a corrupt file must not build a model of any shape
        if type(value) is not int:
            raise ValueError(f"{file}: {name} must be an integer, got {value!r}")


def _llama_config(file, hf):
    """LlamaConfig from a LlamaForCausalLM config.json."""
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
    ints["num_key_value_heads"] = hf.get("num_key_value_heads") or ints["num_attention_heads"]
    _check_ints(file, ints)
    floats = {"rms_norm_eps": hf.get("rms_norm_eps", 1e-6), "rope_theta": hf.get("rope_theta", 1e4)}
    return LlamaConfig(**ints, **floats)


# config.json's fields that change what a model computes, by model_type: field -> (its value
# when the file leaves it out, the values the model implements), for the config read. Fields
# that only change training's dropout (attn_pdrop, embd_pdrop) or the numerics of one
# computation (reorder_and_upcast_attn: ours accumulates in fp32 anyway; pretraining_tp) are
# not here.
IMPLEMENTED = {
    "gpt2": lambda c: {
        # nn/gpt2.py's GELU is the tanh form: these three names are it
        "activation_function": ("gelu_new", ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")),
        "n_inner": (None, (None, 4 * c.n_embd)),
        "scale_attn_weights": (True, (True,)),
        "scale_attn_by_inverse_layer_idx": (False, (False,)),
        "add_cross_attention": (False, (False,)),
        "tie_word_embeddings": (True, (True,)),  # lm_head.weight is never read: wte is the head
    },
    "llama": lambda c: {
        "hidden_act": ("silu", ("silu",)),
        "rope_scaling": (None, (None,)),
        "attention_bias": (False, (False,)),
        "mlp_bias": (False, (False,)),
        "head_dim": (c.head_dim, (None, c.head_dim)),
    },
}


def _check_implemented(file, hf, implemented):
    """A ValueError naming the first field of config.json (hf) set to a value the model does not
    implement (implemented: an IMPLEMENTED table). Types must match too: 1 is not true."""
    for name, (default, ours) in implemented.items():
        value = hf.get(name, default)
        if not any(type(value) is type(v) and value == v for v in ours):
            only = ", ".join(map(repr, ours[:-1])) + " or " * (len(ours) > 1) + repr(ours[-1])
            raise ValueError(f"{file}: {name} {value!r} is not implemented (only {only})")


def read_quantization(path):
    """config.json's "quantization" entry of the checkpoint at path, checked: {"format": a
    FORMATS name, "group_size": an int or None (the format's default), "tensors": the names
    stored as codes and scales}; None for an fp32 checkpoint."""
    file, hf = read_json(path)
    if QUANTIZATION not in hf:
        return None
    entry = hf[QUANTIZATION]
    fields = ("format", "group_size", "tensors")
    if entry is None:
        raise ValueError(
            f"{file}: {QUANTIZATION!r} is null: remove the entry (an fp32 checkpoint has none; "
            "a quantized one's is written by scripts/quantize.py)"
        )
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
    keys mapped to ours, a tied Llama's lm_head.weight taken from its embedding. Every weight
    must be finite (a nan would otherwise be blamed on --lr, or quantized into zeros)."""
    _, hf = read_json(path)
    if QUANTIZATION in hf:
        fmt = read_quantization(path)["format"]
        raise ValueError(
            f"{path} holds {fmt} weights (scripts/quantize.py), not fp32 ones: load it for "
            "inference with nn.from_pretrained, or use the fp32 checkpoint it was made from"
        )
    recorded = read_metadata(path).get(QUANTIZATION)
    if recorded is not None:
        raise ValueError(
            f"{os.path.join(path, WEIGHTS)} records {recorded} weights, but {CONFIG} has no "
            f"{QUANTIZATION!r} entry: the folder is damaged; quantize the fp32 checkpoint again"
        )
    tensors = read_tensors(path, max_weights_bytes(read_config(path)))
    for name, array in tensors.items():
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            raise ValueError(
                f"{os.path.join(path, WEIGHTS)}: {name} holds nan or inf: the weights are unusable"
            )
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


def max_weights_bytes(config):
    """The most bytes a model.safetensors of config can hold, checked before it is read: each
    parameter in fp32, an LM head stored beside a tied embedding, GPT-2's causal-mask buffers
    (attn.bias, L x n_positions^2 fp32, as openai-community/gpt2's file has them) and 1 MiB of
    header. A quantized file holds less."""
    masks = 0 if isinstance(config, LlamaConfig) else config.n_layer * config.n_positions**2
    return 4 * (config.num_parameters() + config.vocab_size * config.n_embd + masks) + (1 << 20)


def read_tensors(path, limit, name=WEIGHTS):
    """The checkpoint's name (model.safetensors) as NumPy arrays, names and dtypes as stored;
    a ValueError for a file of more than limit bytes, before it is read."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    file = os.path.join(path, name)
    size = os.path.getsize(file)
    if size > limit:
        raise ValueError(
            f"{file}: {size:,} bytes, more than the {limit:,} its {CONFIG}'s model can hold: "
            "the file is not this model's"
        )
    try:
        return load_file(file)
    except (SafetensorError, OSError) as e:
        raise ValueError(
            f"{file}: cannot be read ({e}); the file is truncated or corrupt"
        ) from None


def read_metadata(path):
    """model.safetensors' own metadata (a dict of strings; {} when it has none), read from its
    header alone."""
    from safetensors import SafetensorError, safe_open

    file = os.path.join(path, WEIGHTS)
    try:
        with safe_open(file, framework="np") as f:
            return f.metadata() or {}
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
