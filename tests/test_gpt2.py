"""GPT-2 the model: parameter counts of the presets, GPT-2's initialisation, the tied LM head,
Hugging Face's state_dict names and shapes, the forward pass against a plain float64 NumPy
GPT-2 written here, finite-difference gradients of every kind of parameter in float64, and the
errors for token ids and sequences the model cannot take.

Checkpoint files are in test_hf_format.py, generation and sampling in test_generate.py.
"""

import math
import re

import numpy as np
import pytest

import tinygrad_like as tg
from nn import GPT2, PRESETS, ExecutionOptions, GPT2Config, config
from tinygrad_like import dtypes

# a custom config small enough for float64 finite differences, with 2 heads and 2 layers
TINY = GPT2Config(n_layer=2, n_head=2, n_embd=8, n_positions=8, vocab_size=11)
# a somewhat wider one for the forward reference (4 heads of 8)
SMALL = GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=16, vocab_size=67)
# the model as the reference below computes it: the softmax probabilities, then the logits
NAIVE = ExecutionOptions(attention="naive", lm_head="plain")


def per_block_keys(i):
    p = f"transformer.h.{i}."
    return [
        p + k
        for k in (
            "ln_1.weight",
            "ln_1.bias",
            "attn.c_attn.weight",
            "attn.c_attn.bias",
            "attn.c_proj.weight",
            "attn.c_proj.bias",
            "ln_2.weight",
            "ln_2.bias",
            "mlp.c_fc.weight",
            "mlp.c_fc.bias",
            "mlp.c_proj.weight",
            "mlp.c_proj.bias",
        )
    ]


def expected_shapes(cfg):
    """Hugging Face GPT-2's key -> shape (Conv1D weights stored (in, out))."""
    C, V, P = cfg.n_embd, cfg.vocab_size, cfg.n_positions
    shapes = {
        "transformer.wte.weight": (V, C),
        "transformer.wpe.weight": (P, C),
        "transformer.ln_f.weight": (C,),
        "transformer.ln_f.bias": (C,),
    }
    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}."
        shapes.update(
            {
                p + "ln_1.weight": (C,),
                p + "ln_1.bias": (C,),
                p + "attn.c_attn.weight": (C, 3 * C),
                p + "attn.c_attn.bias": (3 * C,),
                p + "attn.c_proj.weight": (C, C),
                p + "attn.c_proj.bias": (C,),
                p + "ln_2.weight": (C,),
                p + "ln_2.bias": (C,),
                p + "mlp.c_fc.weight": (C, 4 * C),
                p + "mlp.c_fc.bias": (4 * C,),
                p + "mlp.c_proj.weight": (4 * C, C),
                p + "mlp.c_proj.bias": (C,),
            }
        )
    return shapes


def formula_count(cfg):
    """Embeddings, 12 C^2 + 13 C per block (4 LN vectors, QKV, proj, MLP with biases), ln_f;
    the LM head is tied so it adds nothing."""
    C = cfg.n_embd
    return cfg.vocab_size * C + cfg.n_positions * C + cfg.n_layer * (12 * C * C + 13 * C) + 2 * C


def random_state(model, rng, dtype=np.float32):
    """Weights far from GPT-2's tiny init, so attention, GELU and layer norm all do real work:
    matrices N(0, 1/fan_in), embeddings N(0, 1), LN weights around 1, biases around 0. In the
    state dict's shapes (wte without its padding rows)."""
    state = {}
    for name, p in model.named_parameters():
        shape = p.unpadded_shape
        if name.endswith("wte.weight") or name.endswith("wpe.weight"):
            a = rng.standard_normal(shape)
        elif "ln_" in name and name.endswith(".weight"):
            a = 1.0 + 0.2 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            a = 0.2 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / math.sqrt(p.shape[0])
        state[name] = a.astype(dtype)
    return state


def randomized(cfg, seed=0):
    model = GPT2(cfg, options=NAIVE)
    model.load_state_dict(random_state(model, np.random.default_rng(seed)))
    return model


# ---------------------------------------------------------------- a float64 NumPy GPT-2


def reference_gpt2(sd, cfg, idx, targets=None, hidden=None):
    """GPT-2 in plain float64 NumPy, from a state dict with Hugging Face's keys.
    hidden: a dict that receives the final layer norm's output as hidden["h"]."""
    W = {k: np.asarray(v, dtype=np.float64) for k, v in sd.items()}
    B, T = idx.shape
    C, H = cfg.n_embd, cfg.n_head
    D = C // H
    eps = cfg.layer_norm_epsilon

    def ln(x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * W[name + ".weight"] + W[name + ".bias"]

    def lin(x, name):
        return x @ W[name + ".weight"] + W[name + ".bias"]

    def gelu(x):
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))

    def heads(t):
        return t.reshape(B, T, H, D).transpose(0, 2, 1, 3)

    causal = np.tril(np.ones((T, T), dtype=bool))
    x = W["transformer.wte.weight"][idx] + W["transformer.wpe.weight"][np.arange(T)]
    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}."
        q, k, v = np.split(lin(ln(x, p + "ln_1"), p + "attn.c_attn"), 3, axis=-1)
        q, k, v = heads(q), heads(k), heads(v)
        att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
        att = np.where(causal, att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + lin(y, p + "attn.c_proj")
        x = x + lin(gelu(lin(ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
    x = ln(x, "transformer.ln_f")
    if hidden is not None:
        hidden["h"] = x
    logits = x @ W["transformer.wte.weight"].T
    if targets is None:
        return logits, None
    flat, t = logits.reshape(B * T, -1), targets.reshape(-1)
    m = flat.max(-1)
    lse = np.log(np.exp(flat - m[:, None]).sum(-1)) + m
    valid = t != -1
    nll = lse[valid] - flat[np.flatnonzero(valid), t[valid]]
    return logits, nll.mean()


# ---------------------------------------------------------------- sizes

EXPECTED_COUNTS = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
}


@pytest.mark.parametrize("name", sorted(EXPECTED_COUNTS))
def test_public_preset_parameter_counts_by_formula(name):
    cfg = GPT2Config.from_preset(name)
    assert formula_count(cfg) == EXPECTED_COUNTS[name]
    assert cfg.vocab_size == 50257 and cfg.n_positions == 1024


def test_preset_shapes_are_gpt2s():
    got = {n: (c.n_layer, c.n_head, c.n_embd) for n, c in PRESETS.items() if n in EXPECTED_COUNTS}
    assert got == {
        "gpt2": (12, 12, 768),
        "gpt2-medium": (24, 16, 1024),
        "gpt2-large": (36, 20, 1280),
        "gpt2-xl": (48, 25, 1600),
    }


def test_gpt2_small_instantiated_has_124_439_808_parameters():
    model = GPT2(GPT2Config.from_preset("gpt2"))
    assert model.num_parameters() == 124_439_808 == formula_count(model.config)
    assert sum(a.size for a in model.state_dict().values()) == 124_439_808
    assert "lm_head.weight" not in model.state_dict()
    # wte is stored padded to 50,304 rows (a multiple of 64); the 47 rows past V are zero
    assert model.config.padded_vocab_size == 50_304
    assert model.transformer.wte.weight.shape == (50_304, 768)
    assert model.state_dict()["transformer.wte.weight"].shape == (50_257, 768)
    assert model.config.padding_cost() == {
        "rows": 47,
        "elements": 47 * 768,
        "forward_flops_per_token": 2 * 768 * 47,
        "backward_flops_per_token": 4 * 768 * 47,
    }


@pytest.mark.parametrize(
    "cfg",
    [
        GPT2Config.from_preset("gpt2-mini"),
        GPT2Config.from_preset("gpt2-tiny"),
        TINY,
        SMALL,
        GPT2Config(n_layer=3, n_head=3, n_embd=12, n_positions=5, vocab_size=7),
    ],
    ids=["gpt2-mini", "gpt2-tiny", "tiny", "small", "odd"],
)
def test_formula_matches_model_for_small_configs(cfg):
    model = GPT2(cfg)
    assert model.num_parameters() == formula_count(cfg) == cfg.num_parameters()
    assert sum(p.unpadded_numel() for p in model.parameters()) == formula_count(cfg)
    # the storage holds the padding rows too
    pad = cfg.padded_vocab_size - cfg.vocab_size
    assert sum(p.numel() for p in model.parameters()) == formula_count(cfg) + pad * cfg.n_embd


def test_config_flops_per_token_is_6n_plus_12lct_as_mfu_counts_it():
    for name in ("gpt2-tiny", "gpt2-mini"):
        cfg = GPT2Config.from_preset(name)
        n = GPT2(cfg).num_parameters()
        for T in (1, 64, cfg.n_positions):
            assert cfg.flops_per_token(T) == 6 * n + 12 * cfg.n_layer * cfg.n_embd * T
    gpt2 = GPT2Config.from_preset("gpt2")
    assert gpt2.num_parameters() == 124_439_808
    assert gpt2.flops_per_token(1024) == 6 * 124_439_808 + 12 * 12 * 768 * 1024


# ---------------------------------------------------------------- names and shapes


def test_state_dict_has_exactly_hugging_faces_keys_and_shapes():
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=12, vocab_size=29)
    model = GPT2(cfg)
    sd = model.state_dict()
    expected = {
        "transformer.wte.weight",
        "transformer.wpe.weight",
        "transformer.ln_f.weight",
        "transformer.ln_f.bias",
        *per_block_keys(0),
        *per_block_keys(1),
    }
    assert set(sd) == expected
    assert len(sd) == 4 + 2 * 12
    assert {k: tuple(v.shape) for k, v in sd.items()} == expected_shapes(cfg)
    assert sd["transformer.h.0.attn.c_attn.weight"].shape == (16, 48)  # [C, 3C]
    assert all(v.dtype == np.float32 for v in sd.values())


def test_state_dict_is_a_copy():
    model = GPT2(TINY)
    snapshot = model.state_dict()
    before = snapshot["transformer.wte.weight"].copy()
    snapshot["transformer.wte.weight"][:] = 7.0
    assert not np.any(model.transformer.wte.weight.numpy() == 7.0)
    model.transformer.wpe.weight.data[...] += 1.0  # e.g. an optimizer step
    assert np.array_equal(model.state_dict()["transformer.wte.weight"], before)
    assert not np.array_equal(
        snapshot["transformer.wpe.weight"], model.transformer.wpe.weight.numpy()
    )


def test_named_parameters_match_state_dict_order_and_objects():
    model = GPT2(TINY)
    names = [n for n, _ in model.named_parameters()]
    assert names == list(model.state_dict())
    assert len(set(names)) == len(names)
    assert (
        model.transformer.h[1].mlp.c_proj.weight
        is dict(model.named_parameters())["transformer.h.1.mlp.c_proj.weight"]
    )


# ---------------------------------------------------------------- initialisation


@pytest.fixture(scope="module")
def mini():
    return GPT2(GPT2Config.from_preset("gpt2-mini"))


def _check_normal(a, std, rel=0.03):
    a = np.asarray(a, dtype=np.float64).ravel()
    n = a.size
    assert abs(a.mean()) < 5 * std / math.sqrt(n), (a.mean(), std, n)
    assert a.std() == pytest.approx(std, rel=rel), (a.std(), std)
    # a normal distribution, not e.g. a uniform one with the same std: ~95.45% within 2 sigma
    assert np.mean(np.abs(a) < 2 * std) == pytest.approx(0.9545, abs=0.01)


def test_init_embeddings_std_002(mini):
    sd = mini.state_dict()
    _check_normal(sd["transformer.wte.weight"], 0.02, rel=0.005)
    _check_normal(sd["transformer.wpe.weight"], 0.02)


def test_init_linear_weights_std_002_and_residual_projections_scaled(mini):
    L = mini.config.n_layer
    resid_std = 0.02 / math.sqrt(2 * L)
    sd = mini.state_dict()
    for i in range(L):
        p = f"transformer.h.{i}."
        _check_normal(sd[p + "attn.c_attn.weight"], 0.02)
        _check_normal(sd[p + "mlp.c_fc.weight"], 0.02)
        _check_normal(sd[p + "attn.c_proj.weight"], resid_std)
        _check_normal(sd[p + "mlp.c_proj.weight"], resid_std)
    # pooled over the layers, the estimate is tight enough to tell 0.02/sqrt(2L) from e.g.
    # 0.02/sqrt(L)
    pooled = np.concatenate(
        [
            sd[f"transformer.h.{i}.{m}.c_proj.weight"].ravel()
            for i in range(L)
            for m in ("attn", "mlp")
        ]
    )
    assert pooled.std() == pytest.approx(resid_std, rel=0.01)


def test_init_biases_zero_layernorm_one_zero(mini):
    for name, a in mini.state_dict().items():
        if ".ln_" in name or name.startswith("transformer.ln_f"):
            expected = 1.0 if name.endswith(".weight") else 0.0
            assert np.all(a == expected), name
        elif name.endswith(".bias"):
            assert np.all(a == 0.0), name
    assert all(p.dtype == np.float32 for p in mini.parameters())


def test_init_is_seeded_and_layers_differ():
    a, b, c = GPT2(TINY, seed=0), GPT2(TINY, seed=0), GPT2(TINY, seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(np.array_equal(sa[k], sb[k]) for k in sa)
    assert not np.array_equal(sa["transformer.wte.weight"], sc["transformer.wte.weight"])
    # one generator runs through all layers: blocks are not copies of each other
    assert not np.array_equal(
        sa["transformer.h.0.attn.c_attn.weight"], sa["transformer.h.1.attn.c_attn.weight"]
    )
    assert not np.array_equal(
        sa["transformer.wte.weight"][: TINY.n_positions], sa["transformer.wpe.weight"]
    )


def test_all_parameters_require_grad_and_start_without_gradients():
    model = GPT2(TINY)
    assert all(p.requires_grad and p.grad is None and p.is_leaf() for p in model.parameters())
    assert model.training


# ---------------------------------------------------------------- the tied LM head


def test_lm_head_is_tied_to_wte():
    model = GPT2(TINY, options=NAIVE)
    names = [n for n, _ in model.named_parameters()]
    assert not any("lm_head" in n for n in names)
    assert not hasattr(model, "lm_head")
    # changing wte changes the output layer: logits are x @ wte^T, so zeroing wte (keeping the
    # position embeddings) gives exactly zero logits everywhere
    model.transformer.wte.weight.data[...] = 0.0
    with tg.no_grad():
        logits, _ = model(np.array([[1, 2, 3]]))
    assert np.all(logits.numpy() == 0.0)


def test_tied_wte_gradient_sums_the_embedding_and_head_uses():
    """The head's contribution alone is dlogits^T @ h (h the final hidden states); the
    embedding's adds the rows of the input tokens. Check both pieces in float64."""
    cfg = TINY
    model = randomized(cfg, seed=3).to("fp64")
    idx = np.array([[1, 2, 1, 4, 5]])
    targets = np.array([[2, 1, 4, 5, 9]])
    logits, loss = model(idx, targets)
    loss.backward()
    g = model.transformer.wte.weight.grad.numpy()
    # the head part from the reference: dL/dlogits = (softmax - onehot) / N, h = ln_f output
    sd = model.state_dict()
    got = {}
    ref_logits, _ = reference_gpt2(sd, cfg, idx, targets, hidden=got)
    # 1e-6, not 1e-12: see test_fp64_forward_is_float64_accurate
    np.testing.assert_allclose(logits.numpy(), ref_logits, rtol=1e-6, atol=1e-6)
    probs = np.exp(ref_logits[0] - ref_logits[0].max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    dlogits = probs.copy()
    dlogits[np.arange(5), targets[0]] -= 1.0
    dlogits /= 5
    head = dlogits.T @ got["h"][0]  # (V, C)
    unused = [t for t in range(cfg.vocab_size) if t not in idx]
    # rows of tokens that are not in the input get the head's gradient only (and it is not 0)
    np.testing.assert_allclose(g[unused], head[unused], rtol=1e-6, atol=1e-9)
    assert np.abs(g[unused]).max() > 1e-3
    # rows of input tokens get more than that: the embedding's part too
    for t in (1, 2, 4, 5):
        assert np.abs(g[t] - head[t]).max() > 1e-4


# ---------------------------------------------------------------- the padded vocabulary


@pytest.mark.parametrize("V, Vp", [(50257, 50304), (64, 64), (65, 128), (1, 64), (11, 64)])
def test_padded_vocab_size_is_the_next_multiple_of_64_and_not_a_config_field(V, Vp):
    cfg = GPT2Config(n_layer=1, n_head=1, n_embd=4, vocab_size=V)
    assert cfg.padded_vocab_size == Vp
    assert "padded_vocab_size" not in cfg.to_dict()  # config.json stays Hugging Face's
    assert GPT2(cfg).transformer.wte.weight.shape == (Vp, 4)


def unpadded(cfg, monkeypatch, seed=0):
    """The same model with wte stored (V, C): VOCAB_MULTIPLE = 1 turns the padding off."""
    with monkeypatch.context() as m:
        m.setattr(config, "VOCAB_MULTIPLE", 1)
        model = GPT2(cfg, seed=seed, options=NAIVE)
    assert model.transformer.wte.weight.shape == (cfg.vocab_size, cfg.n_embd)
    return model


def test_padding_rows_start_zero_and_the_init_is_the_unpadded_models(monkeypatch):
    model = GPT2(SMALL, seed=4)
    w = model.transformer.wte.weight.numpy()
    assert w.shape == (128, 32) and np.all(w[SMALL.vocab_size :] == 0)
    twin = unpadded(SMALL, monkeypatch, seed=4).state_dict()
    assert all(np.array_equal(a, twin[k]) for k, a in model.state_dict().items())


@pytest.mark.parametrize("dtype, rtol, atol", [("fp64", 1e-12, 1e-15), ("fp32", 1e-5, 1e-6)])
def test_padded_model_gives_the_unpadded_loss_and_gradients(monkeypatch, dtype, rtol, atol):
    """The loss, the logits and the gradient of every parameter (wte's first V rows) equal the
    unpadded model's, even with the padding rows set to huge values for the test (so the
    padded logit columns would dominate any softmax that counted them); the padding rows'
    gradient is exactly zero (their dlogits are 0, and no id reaches them). In fp32 the GEMMs
    of other shapes may sum in another order: rounding-level differences."""
    model = randomized(TINY, seed=11).to(dtype)
    twin = unpadded(TINY, monkeypatch).to(dtype)
    twin.load_state_dict(model.state_dict())
    V = TINY.vocab_size
    wte = model.transformer.wte.weight
    wte.data[V:] = 100 * np.random.default_rng(0).standard_normal((wte.shape[0] - V, 8))
    idx = np.array([[1, 3, 5, 7, 3, 0], [2, 2, 9, 4, 6, 8]])
    targets = np.array([[3, 5, 7, 3, 0, -1], [2, 9, 4, 6, 8, 10]])
    logits, loss = model(idx, targets)
    want_logits, want_loss = twin(idx, targets)
    assert logits.shape == want_logits.shape == (2, 6, V)
    np.testing.assert_allclose(logits.numpy(), want_logits.numpy(), rtol=rtol, atol=atol)
    assert loss.item() == pytest.approx(want_loss.item(), rel=rtol)
    assert loss.item() == pytest.approx(
        reference_gpt2(model.state_dict(), TINY, idx, targets)[1], rel=max(rtol, 1e-6)
    )
    loss.backward()
    want_loss.backward()
    want = dict(twin.named_parameters())
    for name, p in model.named_parameters():
        g = p.grad.numpy()
        np.testing.assert_allclose(
            p.unpadded(g), want[name].grad.numpy(), rtol=rtol, atol=atol, err_msg=name
        )
        assert np.all(g[p.unpadded_shape[0] :] == 0), name


# ---------------------------------------------------------------- forward vs NumPy


@pytest.mark.parametrize("B,T", [(2, 16), (3, 5), (1, 1)])
def test_forward_matches_numpy_gpt2_fp32(B, T):
    cfg = SMALL
    model = randomized(cfg, seed=1)
    rng = np.random.default_rng(B * 100 + T)
    idx = rng.integers(0, cfg.vocab_size, (B, T))
    targets = rng.integers(0, cfg.vocab_size, (B, T))
    if B * T > 1:
        targets[0, 0] = -1
        targets[-1, T // 2] = -1
    logits, loss = model(idx, targets)
    assert logits.shape == (B, T, cfg.vocab_size) and logits.dtype == np.float32
    assert loss.shape == () and loss.dtype == np.float32
    ref_logits, ref_loss = reference_gpt2(model.state_dict(), cfg, idx, targets)
    got = logits.numpy().astype(np.float64)
    assert np.abs(ref_logits).max() > 1.0  # the logits are not trivially small
    assert np.max(np.abs(got - ref_logits)) <= 1e-5 * np.max(np.abs(ref_logits))
    assert loss.item() == pytest.approx(ref_loss, rel=1e-5)


def test_forward_matches_numpy_gpt2_tiny_preset_at_init():
    """The real gpt2-tiny preset (GPT-2 vocabulary), with its own init."""
    cfg = GPT2Config.from_preset("gpt2-tiny")
    model = GPT2(cfg, options=NAIVE)
    idx = np.array(
        [
            [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13],
            [50256, 0, 1, 2, 50255, 40, 1101, 257, 1332, 13],
        ]
    )
    targets = np.roll(idx, -1, axis=1)
    targets[:, -1] = -1
    logits, loss = model(idx, targets)
    ref_logits, ref_loss = reference_gpt2(model.state_dict(), cfg, idx, targets)
    assert np.max(np.abs(logits.numpy() - ref_logits)) <= 1e-5 * np.max(np.abs(ref_logits))
    assert loss.item() == pytest.approx(ref_loss, rel=1e-5)
    assert ref_loss == pytest.approx(math.log(cfg.vocab_size), rel=0.01)  # near-uniform at init


def test_loss_ignores_minus_one_targets():
    model = randomized(SMALL, seed=2)
    idx = np.arange(12).reshape(2, 6)
    targets = np.arange(1, 13).reshape(2, 6)
    partial = targets.copy()
    partial[:, 3:] = -1
    with tg.no_grad():
        logits, loss = model(idx, partial)
        _, loss_first = model(idx[:, :3], targets[:, :3])  # causal: positions < 3 see the same
    assert loss.item() == pytest.approx(loss_first.item(), rel=1e-6)
    ref = reference_gpt2(model.state_dict(), SMALL, idx, partial)[1]
    assert loss.item() == pytest.approx(ref, rel=1e-5)


def test_last_only_gives_the_last_positions_logits():
    model = randomized(SMALL, seed=4)
    idx = np.random.default_rng(0).integers(0, SMALL.vocab_size, (2, 7))
    with tg.no_grad():
        full, _ = model(idx)
        last, _ = model(idx, last_only=True)
    assert last.shape == (2, 1, SMALL.vocab_size)
    np.testing.assert_allclose(last.numpy()[:, 0], full.numpy()[:, -1], rtol=1e-5, atol=1e-5)


def test_forward_accepts_a_tensor_of_ids_and_eval_equals_train_without_dropout():
    model = randomized(SMALL, seed=5)
    idx = np.array([[3, 1, 4, 1, 5]])
    with tg.no_grad():
        a, _ = model(idx)
        b, _ = model(tg.Tensor(idx))
        model.eval()
        c, _ = model(idx)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(a.numpy(), c.numpy())


# ---------------------------------------------------------------- gradients in float64


def test_model_to_fp64_casts_every_parameter():
    assert dtypes.as_dtype("fp64") == np.float64
    model = randomized(TINY, seed=0)
    before = model.state_dict()
    out = model.to("fp64")
    assert out is model
    assert all(p.dtype == np.float64 for p in model.parameters())
    after = model.state_dict()
    assert all(after[k].dtype == np.float64 and np.array_equal(after[k], before[k]) for k in before)
    logits, loss = model(np.array([[1, 2, 3]]), np.array([[2, 3, 4]]))
    assert logits.dtype == np.float64 and loss.dtype == np.float64
    loss.backward()
    assert all(p.grad is not None and p.grad.dtype == np.float64 for p in model.parameters())


def test_fp64_forward_is_float64_accurate():
    model = randomized(TINY, seed=3).to("fp64")
    idx, targets = np.array([[1, 2, 1, 4, 5]]), np.array([[2, 1, 4, 5, 9]])
    with tg.no_grad():
        logits, loss = model(idx, targets)
    ref_logits, ref_loss = reference_gpt2(model.state_dict(), TINY, idx, targets)
    np.testing.assert_allclose(logits.numpy(), ref_logits, rtol=1e-12, atol=1e-12)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-12)


def _sample_indices(rng, shape, n):
    size = int(np.prod(shape))
    flat = rng.choice(size, size=min(n, size), replace=False)
    return [np.unravel_index(j, shape) for j in flat]


def test_finite_difference_gradients_of_every_parameter_kind_fp64():
    cfg = TINY
    model = randomized(cfg, seed=7).to("fp64")
    rng = np.random.default_rng(0)
    idx = np.array([[1, 3, 5, 7, 3, 0], [2, 2, 9, 4, 6, 8]])
    targets = np.array([[3, 5, 7, 3, 0, -1], [2, 9, 4, 6, 8, 10]])
    _, loss = model(idx, targets)
    loss.backward()
    params = dict(model.named_parameters())
    # every kind of parameter is in the sample
    kinds = [
        "wte.weight",
        "wpe.weight",
        "ln_1.weight",
        "ln_1.bias",
        "attn.c_attn.weight",
        "attn.c_attn.bias",
        "attn.c_proj.weight",
        "attn.c_proj.bias",
        "ln_2.weight",
        "ln_2.bias",
        "mlp.c_fc.weight",
        "mlp.c_fc.bias",
        "mlp.c_proj.weight",
        "mlp.c_proj.bias",
        "ln_f.weight",
        "ln_f.bias",
    ]
    for kind in kinds:
        assert any(n.endswith(kind) for n in params), kind

    def loss_value():
        with tg.no_grad():
            return model(idx, targets)[1].item()

    eps = 1e-5
    analytic, numeric, where = [], [], []
    for name, p in params.items():
        picks = _sample_indices(rng, p.unpadded_shape, 4)
        if name == "transformer.wte.weight":  # an input-token row and a head-only row
            picks += [(3, 2), (10, 5), (1, 0)]
        if name == "transformer.wpe.weight":  # positions past T = 6 get no gradient
            picks += [(7, 1)]
        for j in picks:
            orig = p.data[j]
            p.data[j] = orig + eps
            plus = loss_value()
            p.data[j] = orig - eps
            minus = loss_value()
            p.data[j] = orig
            numeric.append((plus - minus) / (2 * eps))
            analytic.append(float(p.grad.numpy()[j]))
            where.append(f"{name}{tuple(int(i) for i in j)}")
    analytic, numeric = np.array(analytic), np.array(numeric)
    bad = [
        f"{w}: analytic {a:.3e} numeric {n:.3e}"
        for w, a, n in zip(where, analytic, numeric)
        if abs(a - n) > 1e-7 + 1e-5 * abs(n)
    ]
    assert not bad, "\n".join(bad)
    assert np.sum(np.abs(numeric) > 1e-4) > len(numeric) // 2  # not a check of zeros
    assert analytic[where.index("transformer.wpe.weight(7, 1)")] == 0.0


def test_gradients_match_numpy_finite_differences_on_whole_small_tensors_fp64():
    """Every element of ln_f and of the first block's attention bias, against central
    differences of the float64 NumPy reference (independent of the framework's forward)."""
    cfg = TINY
    model = randomized(cfg, seed=8).to("fp64")
    idx = np.array([[4, 0, 9, 9, 2]])
    targets = np.array([[0, 9, 9, 2, 1]])
    _, loss = model(idx, targets)
    loss.backward()
    sd = model.state_dict()
    eps = 1e-6
    for name in (
        "transformer.ln_f.weight",
        "transformer.ln_f.bias",
        "transformer.h.0.attn.c_attn.bias",
    ):
        g = dict(model.named_parameters())[name].grad.numpy()
        num = np.zeros_like(g)
        for j in np.ndindex(*g.shape):
            s = {k: v.copy() for k, v in sd.items()}
            s[name][j] += eps
            plus = reference_gpt2(s, cfg, idx, targets)[1]
            s[name][j] -= 2 * eps
            minus = reference_gpt2(s, cfg, idx, targets)[1]
            num[j] = (plus - minus) / (2 * eps)
        np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-9, err_msg=name)


def test_backward_accumulates_across_calls_and_zero_grad_resets():
    model = randomized(TINY, seed=9)
    idx, targets = np.array([[1, 2, 3]]), np.array([[2, 3, 4]])
    model(idx, targets)[1].backward()
    first = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    model(idx, targets)[1].backward()
    for n, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), 2 * first[n], rtol=1e-6, atol=1e-9)
    model.zero_grad()
    assert all(np.all(p.grad.numpy() == 0) for p in model.parameters())


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("bad", [11, 12345, -1, -7])
def test_token_id_out_of_range_names_id_and_vocab(bad):
    model = GPT2(TINY)
    idx = np.array([[0, 1, bad, 2]])
    with pytest.raises(ValueError) as e:
        model(idx)
    msg = str(e.value)
    assert re.search(rf"(?<![\d-]){bad}(?!\d)", msg), msg
    assert re.search(r"(?<!\d)11(?!\d)", msg), msg


def test_sequence_longer_than_context_names_both_lengths():
    cfg = GPT2Config(n_layer=1, n_head=1, n_embd=4, n_positions=5, vocab_size=13)
    model = GPT2(cfg)
    model(np.zeros((1, 5), dtype=np.int64))  # exactly the context is fine
    with pytest.raises(ValueError) as e:
        model(np.zeros((2, 9), dtype=np.int64))
    msg = str(e.value)
    assert re.search(r"(?<!\d)9(?!\d)", msg) and re.search(r"(?<!\d)5(?!\d)", msg), msg


def test_ids_of_the_wrong_rank_or_type_are_refused():
    model = GPT2(TINY)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        model(np.array([1, 2, 3]))
    with pytest.raises(TypeError, match="integers"):
        model(np.array([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="do not match"):
        model(np.array([[1, 2, 3]]), np.array([[1, 2]]))


def test_config_validation():
    with pytest.raises(ValueError, match="divisible"):
        GPT2Config(n_layer=1, n_head=3, n_embd=8)
    with pytest.raises(ValueError, match="n_layer"):
        GPT2Config(n_layer=0)
    with pytest.raises(ValueError, match="unknown preset"):
        GPT2Config.from_preset("gpt3")
    assert GPT2Config.from_preset("gpt2-tiny", vocab_size=100).vocab_size == 100


def test_execution_options_defaults_checks_and_what_the_blocks_read():
    """One set of defaults (the training command line's), checked once at construction, and
    each block reads what it needs when it is built."""
    assert GPT2(TINY).options == ExecutionOptions("flash", "fused", "precompute", False)
    for bad, message in (
        (dict(attention="sparse"), "unknown attention 'sparse': use one of flash, naive"),
        (dict(lm_head="tied"), "unknown lm_head 'tied': use one of fused, plain"),
        (dict(lm_head_design="lazy"), "unknown lm_head_design 'lazy': use one of"),
        (dict(recompute=1), "recompute must be True or False, got 1"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            ExecutionOptions(**bad)
    model = GPT2(TINY, options=ExecutionOptions(attention="naive", recompute=True))
    assert all(not b.attn.flash and b.recompute for b in model.transformer.h)
    assert all(b.attn.flash and not b.recompute for b in GPT2(TINY).transformer.h)
