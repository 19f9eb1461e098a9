"""Hugging Face's GPT-2 format: save_pretrained / from_pretrained round trips, the files written
(safetensors with {"format": "pt"}, config.json with GPT-2's fields), loading directories
written the way Hugging Face writes them (keys with and without "transformer.", the attention
mask buffers, lm_head.weight), and the errors for checkpoints that do not fit the model.
"""

import ast
import inspect
import json
import math
import os
import re

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from nn import GPT2, ExecutionOptions, GPT2Config, hf
from nn.hf import read_config, read_state

CFG = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=12, vocab_size=37)


def random_state(model, seed=0):
    """Values unlike the init (so a load that did nothing, or loaded the wrong key, shows), in
    the files' shapes (wte without its padding rows)."""
    rng = np.random.default_rng(seed)
    return {
        name: (rng.standard_normal(p.unpadded_shape) / math.sqrt(p.shape[0])).astype(np.float32)
        for name, p in model.named_parameters()
    }


def snapshot(model):
    """Copies of the weights (state_dict's arrays may share the parameters' memory)."""
    return {k: np.array(v, copy=True) for k, v in model.state_dict().items()}


def assert_same_bits(a, b):
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype == np.float32, k
        assert a[k].shape == b[k].shape, k
        assert np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)), k


def hf_config_json(cfg, **extra):
    """config.json as transformers writes it for GPT-2 (the fields that matter, and a few that
    do not)."""
    d = {
        "activation_function": "gelu_new",
        "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1,
        "bos_token_id": 50256,
        "embd_pdrop": 0.1,
        "eos_token_id": 50256,
        "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05,
        "model_type": "gpt2",
        "n_ctx": cfg.n_positions,
        "n_embd": cfg.n_embd,
        "n_head": cfg.n_head,
        "n_layer": cfg.n_layer,
        "n_positions": cfg.n_positions,
        "resid_pdrop": 0.1,
        "summary_activation": None,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
        "vocab_size": cfg.vocab_size,
    }
    d.update(extra)
    return d


def write_hf_dir(path, cfg, tensors, config=None, metadata=None):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config if config is not None else hf_config_json(cfg), f)
    save_file(
        tensors,
        os.path.join(path, "model.safetensors"),
        metadata=metadata if metadata is not None else {"format": "pt"},
    )
    return str(path)


def mask_buffers(cfg, prefix=""):
    """GPT-2's non-parameter buffers as old transformers versions saved them."""
    P = cfg.n_positions
    out = {}
    for i in range(cfg.n_layer):
        out[f"{prefix}h.{i}.attn.bias"] = np.tril(np.ones((P, P), np.float32))[None, None]
        out[f"{prefix}h.{i}.attn.masked_bias"] = np.array(-1e4, dtype=np.float32)
    return out


@pytest.fixture
def model():
    m = GPT2(CFG)
    m.load_state_dict(random_state(m, seed=1))
    return m


# ---------------------------------------------------------------- save then load


def test_round_trip_is_bitwise_exact(tmp_path, model):
    model.save_pretrained(str(tmp_path))
    loaded = GPT2.from_pretrained(str(tmp_path))
    assert_same_bits(snapshot(loaded), snapshot(model))
    assert loaded.config == model.config
    idx = np.array([[1, 5, 9, 36, 0]])
    a, _ = model(idx)
    b, _ = loaded(idx)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    naive = GPT2.from_pretrained(str(tmp_path), options=ExecutionOptions(attention="naive"))
    assert naive.options.attention == "naive" and loaded.options == ExecutionOptions()


def test_the_file_format_imports_no_model():
    """nn/hf.py reads and writes configs and state dicts; GPT2 calls it, never the reverse."""
    tree = ast.parse(inspect.getsource(hf))
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert imported and not any(m and "gpt2" in m for m in imported), imported


def test_round_trip_of_special_values(tmp_path, model):
    """Denormals, -0.0, huge and tiny values survive bit for bit (no text or fp16 detour)."""
    state = snapshot(model)
    w = state["transformer.h.1.mlp.c_fc.bias"]
    w[:6] = [
        np.float32(1e-45),
        -0.0,
        np.float32(3.4e38),
        np.float32(-1.17549435e-38),
        np.nextafter(np.float32(1), np.float32(2)),
        np.float32(1 / 3),
    ]
    model.load_state_dict(state)
    model.save_pretrained(str(tmp_path))
    assert_same_bits(snapshot(GPT2.from_pretrained(str(tmp_path))), snapshot(model))


def test_saved_files_are_hugging_faces(tmp_path, model):
    path = str(tmp_path / "ckpt")  # a directory that does not exist yet
    model.save_pretrained(path)
    assert sorted(os.listdir(path)) == ["config.json", "model.safetensors"]  # no temp files
    weights = os.path.join(path, "model.safetensors")
    with safe_open(weights, framework="np") as f:
        assert f.metadata() == {"format": "pt"}
        keys = set(f.keys())
    assert keys == set(model.state_dict())
    assert all(k.startswith("transformer.") for k in keys)
    assert not any("lm_head" in k or k.endswith(".attn.bias") for k in keys)
    tensors = load_file(weights)
    assert tensors["transformer.h.0.attn.c_attn.weight"].shape == (16, 48)
    assert tensors["transformer.wte.weight"].shape == (37, 16)  # V rows, not the padded 64
    assert all(t.dtype == np.float32 for t in tensors.values())
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    assert config["model_type"] == "gpt2"
    assert {k: config[k] for k in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size")} == {
        "n_layer": 2,
        "n_head": 2,
        "n_embd": 16,
        "n_positions": 12,
        "vocab_size": 37,
    }
    assert config["layer_norm_epsilon"] == pytest.approx(1e-5)
    assert config["architectures"] == ["GPT2LMHeadModel"]
    assert config["activation_function"] == "gelu_new"


def test_save_overwrites_an_existing_checkpoint(tmp_path, model):
    path = str(tmp_path)
    GPT2(CFG, seed=5).save_pretrained(path)
    model.save_pretrained(path)
    assert_same_bits(snapshot(GPT2.from_pretrained(path)), snapshot(model))
    assert sorted(os.listdir(path)) == ["config.json", "model.safetensors"]


def test_save_with_an_explicit_state(tmp_path, model):
    """save_pretrained(path, state) writes that state (the fp32 master) instead of the model's."""
    other = random_state(model, seed=9)
    model.save_pretrained(str(tmp_path), state=other)
    assert_same_bits(snapshot(GPT2.from_pretrained(str(tmp_path))), other)


def test_save_of_a_bf16_model_writes_fp32(tmp_path, model):
    model.to("bf16")
    model.save_pretrained(str(tmp_path))
    tensors = load_file(os.path.join(tmp_path, "model.safetensors"))
    for k, v in model.state_dict().items():
        assert tensors[k].dtype == np.float32
        np.testing.assert_array_equal(tensors[k], v.astype(np.float32))


def test_from_pretrained_can_cast(tmp_path, model):
    model.save_pretrained(str(tmp_path))
    loaded = GPT2.from_pretrained(str(tmp_path), dtype="fp64")
    assert all(p.dtype == np.float64 for p in loaded.parameters())
    for k, v in loaded.state_dict().items():
        np.testing.assert_array_equal(v, model.state_dict()[k].astype(np.float64))


def test_files_hold_v_rows_and_loading_leaves_the_padding_rows_zero(tmp_path, model):
    """wte is stored padded to 64 rows; the file has the V = 37 rows transformers expects, and a
    file with the padded 64 rows is refused (the model expects (37, 16))."""
    assert model.transformer.wte.weight.shape == (64, 16)
    model.save_pretrained(str(tmp_path))
    assert load_file(os.path.join(tmp_path, "model.safetensors"))[
        "transformer.wte.weight"
    ].shape == (37, 16)
    w = GPT2.from_pretrained(str(tmp_path)).transformer.wte.weight.numpy()
    np.testing.assert_array_equal(w[:37], model.state_dict()["transformer.wte.weight"])
    assert np.all(w[37:] == 0)
    state = snapshot(model)
    state["transformer.wte.weight"] = np.zeros((64, 16), np.float32)
    with pytest.raises(ValueError, match=re.escape("(64, 16), model expects (37, 16)")):
        model.load_state_dict(state)


def test_read_config_round_trip(tmp_path):
    cfg = GPT2Config(
        n_layer=3, n_head=4, n_embd=8, n_positions=20, vocab_size=50, layer_norm_epsilon=1e-6
    )
    GPT2(cfg).save_pretrained(str(tmp_path))
    assert read_config(str(tmp_path)) == cfg


# ---------------------------------------------------------------- Hugging Face directories


def test_loads_keys_without_the_transformer_prefix_and_ignores_buffers(tmp_path, model):
    """The original gpt2 upload (GPT2Model): 'wte.weight', 'h.0.attn.c_attn.weight', ..., plus
    the causal-mask buffers h.N.attn.bias and h.N.attn.masked_bias."""
    want = random_state(model, seed=2)
    tensors = {k[len("transformer.") :]: v for k, v in want.items()}
    tensors.update(mask_buffers(CFG))
    path = write_hf_dir(tmp_path, CFG, tensors)
    loaded = GPT2.from_pretrained(path)
    assert_same_bits(snapshot(loaded), want)


def test_loads_lm_head_model_keys_and_ignores_lm_head(tmp_path, model):
    """GPT2LMHeadModel: 'transformer.'-prefixed keys, the buffers, and lm_head.weight, which
    is tied to wte: even when the file's copy differs, wte comes from transformer.wte.weight."""
    want = random_state(model, seed=3)
    tensors = dict(want)
    tensors.update(mask_buffers(CFG, prefix="transformer."))
    tensors["lm_head.weight"] = np.full((CFG.vocab_size, CFG.n_embd), 5.0, np.float32)
    path = write_hf_dir(tmp_path, CFG, tensors)
    loaded = GPT2.from_pretrained(path)
    assert_same_bits(snapshot(loaded), want)
    state = read_state(path)
    assert set(state) == set(want)


def test_loads_an_hf_config_with_only_n_ctx(tmp_path, model):
    config = hf_config_json(CFG)
    del config["n_positions"]
    path = write_hf_dir(tmp_path, CFG, random_state(model), config=config)
    assert GPT2.from_pretrained(path).config.n_positions == CFG.n_positions


def test_loads_fp16_tensors(tmp_path, model):
    want = {k: v.astype(np.float16) for k, v in random_state(model, seed=4).items()}
    path = write_hf_dir(tmp_path, CFG, want)
    loaded = GPT2.from_pretrained(path)
    for k, v in loaded.state_dict().items():
        assert v.dtype == np.float32
        np.testing.assert_array_equal(v, want[k].astype(np.float32))


# ---------------------------------------------------------------- checkpoints that do not fit


def _bad_state(model, kind):
    """A state dict whose every tensor differs from the model's, broken in one way."""
    state = {k: v + 1.0 for k, v in snapshot(model).items()}
    if kind == "missing":
        del state["transformer.h.1.mlp.c_proj.bias"]
    elif kind == "extra":
        state["transformer.h.2.ln_1.weight"] = np.ones(CFG.n_embd, np.float32)
    elif kind == "misshaped":  # the last key, so a load that copies as it checks would show
        state["transformer.ln_f.bias"] = np.zeros(CFG.n_embd + 1, np.float32)
    return state


@pytest.mark.parametrize(
    "kind,names",
    [
        ("missing", ["transformer.h.1.mlp.c_proj.bias"]),
        ("extra", ["transformer.h.2.ln_1.weight"]),
        ("misshaped", ["transformer.ln_f.bias", "(17,)", "(16,)"]),
    ],
)
def test_load_state_dict_that_does_not_fit_names_the_key_and_loads_nothing(model, kind, names):
    before = snapshot(model)
    with pytest.raises(ValueError) as e:
        model.load_state_dict(_bad_state(model, kind))
    for name in names:
        assert name in str(e.value), str(e.value)
    assert_same_bits(snapshot(model), before)


def test_load_state_dict_reports_every_problem_at_once(model):
    state = snapshot(model)
    del state["transformer.wpe.weight"]
    state["transformer.h.0.attn.c_attn.weight"] = np.zeros((16, 16), np.float32)
    state["junk"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError) as e:
        model.load_state_dict(state)
    msg = str(e.value)
    assert "transformer.wpe.weight" in msg and "junk" in msg
    assert "transformer.h.0.attn.c_attn.weight" in msg and "(16, 16)" in msg and "(16, 48)" in msg


@pytest.mark.parametrize(
    "kind,names",
    [
        ("missing", ["h.1.mlp.c_proj.bias"]),
        ("extra", ["h.2.ln_1.weight"]),
        ("misshaped", ["ln_f.bias", "(17,)", "(16,)"]),
    ],
)
def test_from_pretrained_with_a_checkpoint_that_does_not_fit(tmp_path, model, kind, names):
    state = _bad_state(model, kind)
    path = write_hf_dir(tmp_path, CFG, {k[len("transformer.") :]: v for k, v in state.items()})
    with pytest.raises(ValueError) as e:
        GPT2.from_pretrained(path)
    for name in names:
        assert name in str(e.value), str(e.value)


def test_config_and_weights_of_different_sizes(tmp_path, model):
    """config.json says 3 layers, the weights have 2: the missing layer's keys are named."""
    path = write_hf_dir(tmp_path, CFG, random_state(model), config=hf_config_json(CFG, n_layer=3))
    with pytest.raises(ValueError, match=re.escape("transformer.h.2.attn.c_attn.weight")):
        GPT2.from_pretrained(path)


@pytest.mark.parametrize("present", [[], ["config.json"], ["model.safetensors"]])
def test_a_directory_that_is_not_a_checkpoint_says_what_it_expected(tmp_path, present, model):
    for name in present:
        if name == "config.json":
            (tmp_path / name).write_text(json.dumps(hf_config_json(CFG)))
        else:
            save_file(random_state(model), str(tmp_path / name))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not ours")
    with pytest.raises(FileNotFoundError) as e:
        GPT2.from_pretrained(str(tmp_path))
    msg = str(e.value)
    assert "config.json" in msg and "model.safetensors" in msg
    assert str(tmp_path) in msg
    # and which of them is not there (the message lists the missing ones after "missing")
    tail = msg[msg.index("missing") :]
    for name in {"config.json", "model.safetensors"} - set(present):
        assert name in tail, msg


def test_a_path_that_does_not_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json.*model.safetensors"):
        GPT2.from_pretrained(str(tmp_path / "nowhere"))


def test_a_config_that_is_not_gpt2s_names_the_field(tmp_path, model):
    config = hf_config_json(CFG)
    del config["n_head"]
    path = write_hf_dir(tmp_path, CFG, random_state(model), config=config)
    with pytest.raises(ValueError, match="n_head"):
        GPT2.from_pretrained(path)


def test_a_truncated_weights_file_is_a_clean_error_naming_it(tmp_path, model):
    model.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ValueError, match=r"model\.safetensors: cannot be read .*truncated"):
        read_state(tmp_path)


@pytest.mark.parametrize(
    "text",
    ['{"n_layer": 2,', "[1, 2]", '{"n_layer": 2.5, "n_head": 2, "n_embd": 16, "vocab_size": 37}'],
)
def test_a_config_that_is_not_json_names_the_file(tmp_path, model, text):
    model.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError, match=r"config\.json"):
        read_config(tmp_path)
