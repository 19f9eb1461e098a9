"""The Llama family: its kernels' counting (rotary, SwiGLU; their values on every device:
tests/kernels/test_rotary.py and test_elementwise.py), its ops' float64 gradient checks, the
model (Hugging Face's names and shapes, the parameter count of its config, the KV cache,
recomputation, the fused head), Hugging Face's LlamaForCausalLM directory format (round trip,
config.json, tied and unsupported checkpoints) and nn.build / nn.from_pretrained choosing the
family. Parity with transformers itself:
tests/test_llama_hf_parity.py.

Grouped-query configs (num_key_value_heads < num_attention_heads) need attention with fewer K/V
heads than query heads (F.scaled_dot_product_attention over k, v of Hkv heads).
"""

import json
import math

import numpy as np
import pytest
from gradcheck import gradcheck
from safetensors.numpy import load_file, save_file

import nn
from nn import GPT2, ExecutionOptions, GPT2Config, Llama, LlamaConfig, hf
from tinygrad_like import Tensor, dtypes, no_grad, profiler
from tinygrad_like import functional as F

F32 = dtypes.float32
MHA = LlamaConfig(2, 32, 4, 4, 48, 101, 24)
GQA = LlamaConfig(2, 32, 4, 2, 48, 101, 24)
CONFIGS = [pytest.param(MHA, id="mha"), pytest.param(GQA, id="gqa")]


def rotary_ref(x, cos, sin):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def tables(rng, T, h):
    angles = rng.uniform(-4, 4, (T, h))
    return np.cos(angles), np.sin(angles)


# ---------------------------------------------------------------- kernels


def test_the_kernels_are_counted(rng):
    x = Tensor(rng.standard_normal((2, 3, 5, 8)).astype(F32), requires_grad=True)
    cos, sin = (t.astype(F32) for t in tables(rng, 9, 4))
    g = Tensor(rng.standard_normal((4, 6)).astype(F32), requires_grad=True)
    u = Tensor(rng.standard_normal((4, 6)).astype(F32), requires_grad=True)
    with profiler.Profiler() as prof:
        (F.apply_rotary(x, cos, sin, start=2).sum() + F.swiglu(g, u).sum()).backward()
    by = {ln.name: ln for ln in prof.launches}
    n = x.numpy().size
    assert by["rotary_fwd"].flops == by["rotary_bwd"].flops == 3 * n
    # x and y, and the 5 rows of each table the op sliced
    assert by["rotary_fwd"].bytes == 2 * 4 * n + 2 * 4 * 5 * 4
    assert (by["swiglu_fwd"].flops, by["swiglu_fwd"].exps) == (6 * 24, 24)  # its expression's
    assert (by["swiglu_bwd"].flops, by["swiglu_bwd"].exps) == (12 * 24, 24)
    assert by["swiglu_bwd"].bytes == 5 * 4 * 24


# ---------------------------------------------------------------- ops


def test_apply_rotary_gradcheck_at_an_offset(rng):
    """A decode step's positions: the op reads rows start .. start + T of the tables."""
    cos, sin = tables(rng, 9, 3)
    x = rng.standard_normal((2, 2, 4, 6))
    leaves = gradcheck(lambda t: F.apply_rotary(t, cos, sin, start=3), x)
    np.testing.assert_allclose(
        F.apply_rotary(leaves[0], cos, sin, start=3).numpy(),
        rotary_ref(x, cos[3:7], sin[3:7]),
        rtol=1e-14,
    )


def test_swiglu_gradcheck(rng):
    g, u = 2 * rng.standard_normal((3, 7)), rng.standard_normal((3, 7))
    gradcheck(F.swiglu, g, u)


def test_rms_norm_layer_gradcheck(rng):
    layer = nn.RMSNorm(6, eps=1e-5).to("fp64")
    x = rng.standard_normal((2, 3, 6))
    gradcheck(lambda t: layer(t), x)
    assert layer.weight.dtype == np.float64 and layer.weight.grad is not None


@pytest.mark.parametrize(
    "args,match",
    [
        (((2, 2, 4, 5), (9, 2)), "even D"),
        (((2, 2, 4, 6), (9, 2)), "tables"),
        (((2, 4, 6), (9, 3)), r"x \(B, H, T, D\)"),
        (((2, 2, 8, 6), (9, 3), 2), "outside the tables' 9 positions"),
    ],
)
def test_apply_rotary_refuses_bad_shapes(args, match):
    x, table, *start = args
    t = np.zeros(table, F32)
    with pytest.raises(ValueError, match=match):
        F.apply_rotary(Tensor(np.zeros(x, F32)), t, t, *start)


def test_swiglu_refuses_different_shapes():
    with pytest.raises(ValueError, match="differ in shape"):
        F.swiglu(Tensor(np.zeros((2, 3), F32)), Tensor(np.zeros((2, 4), F32)))


# ---------------------------------------------------------------- the model


def randomized(cfg, options=None, seed=0):
    """Weights far from the init, so that tokens' logits are well apart."""
    model = Llama(cfg, options=options)
    rng = np.random.default_rng(seed)
    state = {}
    for name, p in model.named_parameters():
        shape = p.unpadded_shape
        scale = 1.0 if name == "model.embed_tokens.weight" else 1 / math.sqrt(shape[-1])
        a = scale * rng.standard_normal(shape)
        state[name] = (1 + 0.1 * a if name.endswith("norm.weight") else a).astype(F32)
    model.load_state_dict(state)
    return model


def ids(cfg, B=2, T=None, seed=1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab_size, (B, T or cfg.max_position_embeddings))


def test_names_and_shapes_are_hugging_faces():
    cfg = LlamaConfig(2, 32, 4, 2, 48, 101, 24)
    shapes = {name: p.unpadded_shape for name, p in Llama(cfg).named_parameters()}
    C, kv, Fw, V = 32, 2 * 8, 48, 101
    want = {
        "model.embed_tokens.weight": (V, C),
        "model.norm.weight": (C,),
        "lm_head.weight": (V, C),
    }
    for i in range(2):
        p = f"model.layers.{i}."
        want.update(
            {
                p + "input_layernorm.weight": (C,),
                p + "post_attention_layernorm.weight": (C,),
                p + "self_attn.q_proj.weight": (C, C),
                p + "self_attn.k_proj.weight": (kv, C),
                p + "self_attn.v_proj.weight": (kv, C),
                p + "self_attn.o_proj.weight": (C, C),
                p + "mlp.gate_proj.weight": (Fw, C),
                p + "mlp.up_proj.weight": (Fw, C),
                p + "mlp.down_proj.weight": (C, Fw),
            }
        )
    assert shapes == want


@pytest.mark.parametrize("name", ["llama-tiny", "llama-mini"])
def test_the_presets_count_their_config_s_parameters(name):
    cfg = nn.from_preset(name)
    model = nn.build(cfg)
    assert isinstance(model, Llama)
    assert model.num_parameters() == cfg.num_parameters()
    # the embedding and the head store Vp rows, zero past V (padding_cost's elements)
    Vp = cfg.padded_vocab_size
    for p in (model.model.embed_tokens.weight, model.lm_head.weight):
        assert p.shape == (Vp, cfg.hidden_size) and not p.numpy()[cfg.vocab_size :].any()
    stored = sum(p.numpy().size for p in model.parameters())
    assert stored - model.num_parameters() == cfg.padding_cost()["elements"]


def test_forward_shapes_and_errors():
    model = Llama(MHA)
    x = ids(MHA, T=5)
    logits, loss = model(x)
    assert logits.shape == (2, 5, 101) and loss is None
    assert model(x, last_only=True)[0].shape == (2, 1, 101)
    with pytest.raises(ValueError, match="Llama expects token ids of shape"):
        model(x[0])
    with pytest.raises(ValueError, match="longer than the context of 24"):
        model(ids(MHA, T=25))
    with pytest.raises(ValueError, match="token id 101 out of range for vocab 101"):
        model(np.full((1, 3), 101))


@pytest.mark.parametrize("cfg", CONFIGS)
def test_kv_cache_decode_matches_the_full_forward(cfg):
    """The prompt, then one token at a time: each step's rotary positions continue from the
    cache, which holds Hkv heads."""
    model = randomized(cfg)
    x = ids(cfg, T=9)
    with no_grad():
        full, _ = model(x)
        cache = nn.KVCache(cfg, 2, 9, model.model.embed_tokens.weight)
        assert cache.k[0].shape == (2, cfg.num_key_value_heads, 9, cfg.head_dim)
        steps = [model(x[:, :4], cache=cache)[0].numpy()]
        steps += [model(x[:, t : t + 1], cache=cache)[0].numpy() for t in range(4, 9)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_generate_greedy_equals_argmax_of_the_full_forward(cfg):
    model = randomized(cfg)
    out = model.generate(ids(cfg, B=1, T=3), 6, temperature=0)
    with no_grad():
        logits, _ = model(out[:, :-1])
    np.testing.assert_array_equal(out[0, 3:], logits.numpy()[0, 2:].argmax(-1))


def grads(model, x, y):
    model.zero_grad()
    _, loss = model(x, y)
    loss.backward()
    return loss.numpy(), {n: p.grad.numpy().copy() for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "options",
    [
        ExecutionOptions(recompute=True),
        ExecutionOptions(attention="naive", lm_head="plain"),
        ExecutionOptions(lm_head_design="recompute"),
    ],
    ids=["recompute", "naive-plain", "fused-recompute"],
)
def test_execution_options_give_the_default_s_gradients(options):
    x, y = ids(MHA, T=12), ids(MHA, T=12, seed=2)
    loss, ref = grads(randomized(MHA), x, y)
    got_loss, got = grads(randomized(MHA, options), x, y)
    np.testing.assert_allclose(got_loss, loss, rtol=1e-5)
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-4, atol=1e-6, err_msg=name)
    assert not ref["lm_head.weight"][MHA.vocab_size :].any()  # padding rows stay zero


def test_a_few_steps_lower_the_loss():
    from optim import AdamW

    model = nn.build(nn.from_preset("llama-tiny"), seed=0, dtype="fp32")
    opt = AdamW(model.named_parameters(), lr=3e-3)
    x = ids(model.config, B=4, T=16)
    y = np.roll(x, -1, axis=1)
    losses = []
    for _ in range(8):
        model.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(float(loss.numpy()))
    assert losses[-1] < losses[0] - 0.5, losses


def test_bf16_forward_runs_in_bf16():
    model = randomized(MHA).to("bf16")
    logits, loss = model(ids(MHA, T=6), ids(MHA, T=6, seed=3))
    assert loss.dtype == np.float32 and np.isfinite(loss.numpy())
    out = model.generate(ids(MHA, B=1, T=2), 3, temperature=0)
    assert out.shape == (1, 5)


# ---------------------------------------------------------------- Hugging Face's format


def test_round_trip_is_bitwise_exact_and_holds_v_rows(tmp_path):
    model = randomized(GQA)
    model.save_pretrained(tmp_path)
    files = load_file(tmp_path / "model.safetensors")
    assert files["lm_head.weight"].shape == files["model.embed_tokens.weight"].shape == (101, 32)
    assert files["model.layers.0.self_attn.k_proj.weight"].shape == (16, 32)  # (out, in)
    loaded = Llama.from_pretrained(tmp_path)
    for name, a in model.state_dict().items():
        assert np.array_equal(a.view(np.uint32), loaded.state_dict()[name].view(np.uint32)), name
    assert not loaded.lm_head.weight.numpy()[101:].any()


def test_config_json_is_a_llama_for_causal_lm_s(tmp_path):
    Llama(GQA).save_pretrained(tmp_path)
    got = json.loads((tmp_path / "config.json").read_text())
    assert got["architectures"] == ["LlamaForCausalLM"] and got["model_type"] == "llama"
    assert (got["hidden_act"], got["tie_word_embeddings"], got["rope_scaling"]) == (
        "silu",
        False,
        None,
    )
    assert (got["num_attention_heads"], got["num_key_value_heads"], got["head_dim"]) == (4, 2, 8)
    assert hf.read_config(tmp_path) == GQA


def test_nn_from_pretrained_picks_the_family(tmp_path):
    Llama(MHA).save_pretrained(tmp_path / "llama")
    GPT2(GPT2Config(1, 2, 16, 8, 37)).save_pretrained(tmp_path / "gpt2")
    assert isinstance(nn.from_pretrained(tmp_path / "llama"), Llama)
    assert isinstance(nn.from_pretrained(tmp_path / "gpt2"), GPT2)
    with pytest.raises(ValueError, match="holds a Llama checkpoint, not a GPT2 one"):
        GPT2.from_pretrained(tmp_path / "llama")
    with pytest.raises(ValueError, match="holds a GPT-2 checkpoint, not a Llama one"):
        Llama.from_pretrained(tmp_path / "gpt2")
    assert isinstance(nn.build(GPT2Config(1, 2, 16, 8, 37)), GPT2)
    with pytest.raises(TypeError, match="no model family for a dict"):
        nn.build({})


def test_a_tied_checkpoint_gets_its_head_from_the_embedding(tmp_path):
    model = randomized(MHA)
    model.save_pretrained(tmp_path)
    files = load_file(tmp_path / "model.safetensors")
    del files["lm_head.weight"]
    save_file(files, tmp_path / "model.safetensors", metadata={"format": "pt"})
    loaded = Llama.from_pretrained(tmp_path)
    np.testing.assert_array_equal(
        loaded.state_dict()["lm_head.weight"], files["model.embed_tokens.weight"]
    )


@pytest.mark.parametrize(
    "change,match",
    [
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not implemented"),
        ({"attention_bias": True}, "attention_bias"),
        ({"head_dim": 16}, "head_dim 16"),
        ({"hidden_size": 32.0}, "hidden_size must be an integer"),
        ({"num_hidden_layers": None}, "num_hidden_layers must be an integer"),
    ],
)
def test_a_llama_variant_we_do_not_implement_is_refused(tmp_path, change, match):
    Llama(MHA).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(ValueError, match=match):
        hf.read_config(tmp_path)


def test_a_config_without_key_value_heads_is_multi_head(tmp_path):
    Llama(MHA).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    d = json.loads(path.read_text())
    del d["num_key_value_heads"], d["head_dim"], d["rms_norm_eps"]
    path.write_text(json.dumps(d))
    cfg = hf.read_config(tmp_path)
    assert cfg.num_key_value_heads == 4 and cfg.rms_norm_eps == 1e-6  # Hugging Face's defaults


# ---------------------------------------------------------------- the accounting


@pytest.mark.parametrize(
    "options",
    [ExecutionOptions(), ExecutionOptions(attention="naive", lm_head="plain")],
    ids=["flash-fused", "naive-plain"],
)
@pytest.mark.parametrize("cfg", CONFIGS)
def test_accounting_predicts_what_a_llama_step_measures(cfg, options):
    """Parameters by piece, the bytes each layer and the whole tape save, and the tracker's
    peak, predicted from the config alone, equal what a real step measured."""
    from accounting import measure, predictions, report

    m = measure.measure(cfg, "fp32", batch_size=2, seq_len=20, warmup=0, options=options)
    measured = predictions.count_pieces(m.parameters)
    for key, _, _, n in predictions.parameter_pieces(cfg):
        assert measured[key] == n, key
    per_layer = measure.group(m.tape, lambda r: measure.layer_of(r["scope"]))
    assert measure.block_layers(m.tape) == ["model.layers.0", "model.layers.1"]
    block = per_layer["model.layers.0"]["saved_bytes"] / 40
    assert block == predictions.predicted_activation_bytes(cfg, 20, "fp32", options)
    assert sum(r["saved_bytes"] for r in m.tape) == predictions.predicted_saved_bytes(
        cfg, 2, 20, "fp32", options
    )
    assert m.peak_bytes == pytest.approx(
        predictions.predicted_peak_bytes(cfg, 2, 20, "fp32", options), rel=1e-3
    )
    gemm, bias = predictions.gemm_flops(cfg, 2, 20)
    assert bias == 0
    text = report.format_report(m, budget_bytes=1e9)
    assert "the embedding and the LM head are stored 128 x 32" in text
    assert "2·Hkv·D" in text  # the Llama convention, not GPT-2's


# ---------------------------------------------------------------- the trainer


class Killed(BaseException):
    """Stands in for SIGKILL (as in test_training.py)."""


def test_the_trainer_trains_resumes_and_fine_tunes_the_llama_preset(
    shakespeare, tmp_path, monkeypatch
):
    """--model llama-tiny: the preset picks the family; the checkpoint is a LlamaForCausalLM
    directory that resumes exactly and is fine-tuned from (--init-from)."""
    from training import checkpoint
    from training.loop import RunConfig, Trainer

    def run(out, **kw):
        cfg = dict(model="llama-tiny", data_dir=shakespeare, batch_size=4, seq_len=16, lr=1e-2)
        cfg.update(min_lr=1e-3, warmup=5, eval_iters=4, out=str(out), quiet=True, report=False)
        return Trainer(RunConfig(**{**cfg, **kw}))

    tr = run(tmp_path / "a", steps=40, eval_every=40)
    assert isinstance(tr.model, Llama)
    initial, history = tr.evaluate(), tr.run()
    assert history[-1]["val_loss"] < initial - 1.5, (initial, history[-1]["val_loss"])
    ck = checkpoint.find_checkpoint(str(tmp_path / "a"))
    assert json.loads(open(f"{ck}/config.json").read())["model_type"] == "llama"
    # killed after its step-20 checkpoint, then resumed: the uninterrupted run's losses
    real_save = Trainer.save

    def save_then_die(self):
        path = real_save(self)
        if self.step == 20:
            raise Killed
        return path

    monkeypatch.setattr(Trainer, "save", save_then_die)
    with pytest.raises(Killed):
        run(tmp_path / "b", steps=40, eval_every=40, save_every=20).run()
    monkeypatch.setattr(Trainer, "save", real_save)
    resumed = run(tmp_path / "b", steps=40, eval_every=40, resume=str(tmp_path / "b")).run()
    assert [r["loss"] for r in resumed] == [r["loss"] for r in history[20:]]
    tuned = run(tmp_path / "c", steps=2, eval_every=0, init_from=ck, model=None)
    assert isinstance(tuned.model, Llama) and tuned.model.config == tr.model.config
