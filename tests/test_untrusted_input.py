"""Every file the project reads is untrusted input (issue 35): a config.json asking for what
the model does not implement is refused by the field's name, for GPT-2 and Llama alike;
epsilons and rope_theta must be finite and positive; a file read whole is bounded in size
before it is read; every field of trainer_state.json is checked for type and range, and only
the checkpoint's own files are ever opened by a name it holds, even when an editor has
recomputed its sums; metrics.jsonl lines that are not rows of ours are left out. Each is one
`error:` line and exit 2 where a program meets it, with the files left as they were."""

import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from test_faults import load_resumed, one_line_error, script_main, tiny
from test_llama import MHA

from nn import GPT2, GPT2Config, Llama, hf
from optim import LossScaler
from tinygrad_like import files
from training import checkpoint
from training.data import write_tokens
from training.loop import Trainer
from training.plot import read_metrics

pytestmark = pytest.mark.usefixtures("one_blas_thread")

TINY = GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=8, vocab_size=37)


def edit_config(folder, **changes):
    path = os.path.join(folder, hf.CONFIG)
    with open(path) as f:
        config = json.load(f)
    with open(path, "w") as f:
        json.dump({**config, **changes}, f)  # nan and inf as JSON's NaN / Infinity


# ---------------------------------------------------------------- config.json


@pytest.mark.parametrize(
    "change, words",
    [
        ({"activation_function": "relu"}, "activation_function 'relu' is not implemented"),
        ({"activation_function": "gelu"}, "activation_function 'gelu' is not implemented"),
        ({"scale_attn_weights": False}, "scale_attn_weights False is not implemented"),
        ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx True"),
        ({"add_cross_attention": True}, "add_cross_attention True is not implemented"),
        ({"tie_word_embeddings": False}, "tie_word_embeddings False is not implemented"),
        ({"n_inner": 48}, "n_inner 48 is not implemented (only None or 64)"),
        ({"scale_attn_weights": 1}, "scale_attn_weights 1 is not implemented (only True)"),
        ({"model_type": "bert"}, "model_type 'bert' is not implemented (only gpt2 or llama)"),
        ({"layer_norm_epsilon": 0}, "layer_norm_epsilon must be a finite number > 0, got 0"),
        ({"layer_norm_epsilon": float("inf")}, "layer_norm_epsilon must be a finite number"),
        ({"layer_norm_epsilon": "1e-5"}, "layer_norm_epsilon must be a finite number"),
        ({"resid_pdrop": 1.5}, "GPT2Config.dropout must be in [0, 1), got 1.5"),
    ],
)
def test_a_gpt2_config_the_model_does_not_implement_is_refused(tmp_path, change, words):
    GPT2(TINY).save_pretrained(tmp_path)
    edit_config(tmp_path, **change)
    with pytest.raises(ValueError, match="config.json: ") as e:
        hf.read_config(tmp_path)
    assert words in str(e.value)


@pytest.mark.parametrize(
    "change",
    [
        {"activation_function": "gelu_pytorch_tanh"},  # the same tanh form as gelu_new
        {"activation_function": "gelu_fast"},
        {"n_inner": 64},  # 4 x n_embd, what null means
        {"reorder_and_upcast_attn": True},  # numerics only: ours accumulates in fp32
        {"attn_pdrop": 0.1, "embd_pdrop": 0.1},  # dropout: training only, as Hugging Face's
    ],
)
def test_what_the_gpt2_model_implements_loads(tmp_path, change):
    GPT2(TINY).save_pretrained(tmp_path)
    edit_config(tmp_path, **change)
    assert hf.read_config(tmp_path) == TINY


@pytest.mark.parametrize(
    "change, words",
    [
        ({"rms_norm_eps": 0.0}, "LlamaConfig.rms_norm_eps must be a finite number > 0, got 0.0"),
        ({"rms_norm_eps": -1e-6}, "rms_norm_eps must be a finite number > 0"),
        ({"rope_theta": float("inf")}, "rope_theta must be a finite number > 0, got inf"),
        ({"rope_theta": float("nan")}, "rope_theta must be a finite number > 0, got nan"),
        ({"rope_theta": None}, "rope_theta must be a finite number > 0, got None"),
        ({"mlp_bias": True}, "mlp_bias True is not implemented (only False)"),
    ],
)
def test_a_llama_config_with_a_bad_epsilon_or_rope_theta_is_refused(tmp_path, change, words):
    Llama(MHA).save_pretrained(tmp_path)
    edit_config(tmp_path, **change)
    with pytest.raises(ValueError, match="config.json: ") as e:
        hf.read_config(tmp_path)
    assert words in str(e.value)


def test_generate_py_refuses_such_a_config_in_one_line(tmp_path, capsys):
    GPT2(TINY).save_pretrained(tmp_path)
    edit_config(tmp_path, activation_function="relu")
    with pytest.raises(SystemExit) as exit_info:
        script_main("examples/generate.py")(["--checkpoint", str(tmp_path)])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and out == "" and one_line_error(err), err
    assert "activation_function 'relu' is not implemented" in err


# ---------------------------------------------------------------- sizes


def test_a_config_json_over_the_bound_is_refused_unread(tmp_path):
    GPT2(TINY).save_pretrained(tmp_path)
    with open(tmp_path / hf.CONFIG, "r+b") as f:
        f.truncate(files.SMALL_FILE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(ValueError, match="over the 16,777,216 such a file may have"):
        hf.read_config(tmp_path)


def test_weights_larger_than_the_model_can_hold_are_refused_unread(tmp_path):
    """A model.safetensors with a tensor the config's model has no room for: refused by its
    size before any tensor is read (an fp32 model's bytes, a tied head and GPT-2's mask
    buffers are the bound)."""
    GPT2(TINY).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / hf.WEIGHTS)
    limit = hf.max_weights_bytes(TINY)
    tensors["extra"] = np.zeros(limit // 4, np.float32)
    save_file(tensors, tmp_path / hf.WEIGHTS, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"more than the {limit:,} its config.json's model"):
        hf.read_state(tmp_path)


def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path):
    GPT2(TINY).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / hf.WEIGHTS)
    tensors["transformer.h.0.ln_1.bias"][3] = np.nan
    save_file(tensors, tmp_path / hf.WEIGHTS, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="transformer.h.0.ln_1.bias holds nan or inf"):
        hf.read_state(tmp_path)


# ---------------------------------------------------------------- trainer_state.json


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A 2-step gpt2-tiny run saved in run/, its token files in data/ (load_resumed's layout)."""
    root = tmp_path_factory.mktemp("state")
    (root / "data").mkdir()
    rng = np.random.default_rng(0)
    for name in ("train.bin", "val.bin"):
        write_tokens(root / "data" / name, rng.integers(0, 50257, 3000))
    Trainer(tiny(str(root / "data"), root / "run", steps=2)).run()
    return root


def resummed(state):
    """state with its own sum recomputed, as someone who edits the file would."""
    state["sha256"][checkpoint.STATE] = checkpoint._state_sha256(state)
    return state


DELETE = object()
SCALER = {**LossScaler().state_dict(), "update": 1}  # setattr on every key it holds


@pytest.mark.parametrize(
    "keys, value, words",
    [
        (("step",), "2", "step must be an integer >= 0, got '2'"),
        (("step",), -1, "step must be an integer >= 0"),
        (("step",), True, "step must be an integer >= 0, got True"),
        (("data", "batch_size"), 0, "data.batch_size must be an integer >= 1"),
        (("data",), DELETE, "has no data"),
        (("scaler",), SCALER, "scaler holds unknown fields (update)"),
        (("dropout_rng", "uinteger"), 2**40, "dropout_rng.uinteger must be an integer >= 0 and"),
        (("dropout_rng", "bit_generator"), "MT19937", "bit_generator must be one of PCG64"),
        (("dropout_rng", "extra"), 1, "dropout_rng holds unknown fields (extra)"),
        (("world_size",), 0, "world_size must be an integer >= 1"),
        (("dtype",), "fp8", "dtype must be one of fp32, fp16, bf16"),
        (("optimizer", "step"), 1.5, "optimizer.step must be an integer >= 0"),
        (("run_config",), [], "run_config must be an object"),
        (("run_config", "lr"), "fast", "run_config.lr must be float, got 'fast'"),
        (("run_config", "batch_size"), 2.0, "run_config.batch_size must be int, got 2.0"),
        (("sha256", "../../etc/passwd"), "0" * 64, "sha256 holds unknown fields (../../etc/pas"),
        (("sha256", checkpoint.OPTIMIZER), DELETE, "has no sha256.optimizer.safetensors"),
    ],
)
def test_every_field_of_the_trainer_state_is_checked(saved, keys, value, words):
    """Each field edited and the file's own sum recomputed: the resume is one line, exit 2,
    naming the field, before anything is built from it."""
    state_path = saved / "run" / "checkpoint" / checkpoint.STATE
    original = state_path.read_bytes()
    state = json.loads(original)
    holder = state
    for key in keys[:-1]:
        holder = holder[key]
    if value is DELETE:
        del holder[keys[-1]]
    else:
        holder[keys[-1]] = value
    state_path.write_text(json.dumps(resummed(state)))
    try:
        code, err, _ = load_resumed(saved)
    finally:
        state_path.write_bytes(original)
    assert code == 2 and one_line_error(err), err
    assert words in err and checkpoint.STATE in err, err


def test_a_state_without_sums_is_refused(saved):
    state_path = saved / "run" / "checkpoint" / checkpoint.STATE
    original = state_path.read_bytes()
    state = json.loads(original)
    del state["sha256"]
    state_path.write_text(json.dumps(state))
    try:
        code, err, _ = load_resumed(saved)
    finally:
        state_path.write_bytes(original)
    assert code == 2 and one_line_error(err) and "has no sha256" in err, err


def test_non_finite_optimizer_state_is_refused_even_with_its_sum_recomputed(saved):
    ck = saved / "run" / "checkpoint"
    originals = {n: (ck / n).read_bytes() for n in (checkpoint.OPTIMIZER, checkpoint.STATE)}
    arrays = load_file(ck / checkpoint.OPTIMIZER)
    arrays["v.transformer.ln_f.weight"][0] = np.inf
    save_file(arrays, ck / checkpoint.OPTIMIZER)
    state = json.loads(originals[checkpoint.STATE])
    state["sha256"][checkpoint.OPTIMIZER] = files.file_sha256(ck / checkpoint.OPTIMIZER)
    (ck / checkpoint.STATE).write_text(json.dumps(resummed(state)))
    try:
        code, err, _ = load_resumed(saved)
    finally:
        for name, data in originals.items():
            (ck / name).write_bytes(data)
    assert code == 2 and one_line_error(err), err
    assert "v.transformer.ln_f.weight holds nan or inf" in err


# ---------------------------------------------------------------- metrics.jsonl


def test_lines_that_are_not_rows_of_ours_are_left_out(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "loss": 2.5, "skipped": False}, {"step": 2, "loss": None}]
    lines = [json.dumps(rows[0]), '{"step": 9, "loss": "x"}', '{"step": "3"}', "[1, 2]"]
    lines += ['{"step": 4, "pad": "' + "x" * 5000 + '"}', json.dumps(rows[1])]
    path.write_text("\n".join(lines) + "\n")
    assert read_metrics(path) == rows
