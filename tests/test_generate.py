"""Generation: the KV cache against recomputing the whole sequence, generate / generate_stream
(shapes, seeds, the context limit, the train/eval mode and grad mode it leaves behind, the
tape), nn.sampling.sample (temperature, top-k and top-p never leave their sets), and int8
activations (nn/quant.py use_activations, generate.py --activations): their logits beside the
fp32 path's, the same tokens captured and replayed, the refusals.
"""

import math
import re

import numpy as np
import pytest

import tinygrad_like as tg
from nn import GPT2, GPT2Config, KVCache, lm
from nn.quant import quantize_model, use_activations
from nn.sampling import sample
from tinygrad_like import TAPE, dtypes

CFG = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=24, vocab_size=53)


def randomized(cfg, seed=0):
    """Weights far from the 0.02 init, so the logits of different tokens are well apart and a
    greedy choice does not hinge on rounding."""
    model = GPT2(cfg)
    rng = np.random.default_rng(seed)
    state = {}
    for name, p in model.named_parameters():
        shape = p.unpadded_shape  # wte without its padding rows
        if name.endswith(("wte.weight", "wpe.weight")):
            a = rng.standard_normal(shape)
        elif ".ln_" in name or name.startswith("transformer.ln_f"):
            a = (1.0 if name.endswith(".weight") else 0.0) + 0.1 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            a = 0.1 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / math.sqrt(p.shape[0])
        state[name] = a.astype(np.float32)
    model.load_state_dict(state)
    return model


@pytest.fixture(scope="module")
def model():
    return randomized(CFG, seed=0)


def greedy_without_cache(model, prompt, n):
    """The reference: run the whole sequence through the model for every new token."""
    seq = np.array(prompt)
    was_training = model.training
    model.eval()
    with tg.no_grad():
        for _ in range(n):
            logits, _ = model(seq)
            nxt = logits.numpy()[:, -1, :].argmax(-1)
            seq = np.concatenate([seq, nxt[:, None]], axis=1)
    model.train(was_training)
    return seq


# ---------------------------------------------------------------- the KV cache


@pytest.mark.parametrize("B,T,n", [(1, 1, 12), (2, 5, 10), (3, 8, 16)])
def test_kv_cache_greedy_equals_recomputing_everything(model, B, T, n):
    prompt = np.random.default_rng(B * 10 + T).integers(0, CFG.vocab_size, (B, T))
    want = greedy_without_cache(model, prompt, n)
    got = model.generate(prompt, n, temperature=0)
    assert got.shape == (B, T + n) and got.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    assert len(set(got[:, T:].ravel().tolist())) > 1  # not one token over and over


def test_kv_cache_logits_equal_full_forward_logits(model):
    """Prefill 3 positions, then 2 at once (queries at an offset in the causal mask), then one
    at a time: each step's logits equal those of the full sequence at the same positions."""
    rng = np.random.default_rng(7)
    seq = rng.integers(0, CFG.vocab_size, (2, 9))
    model.eval()
    with tg.no_grad():
        full, _ = model(seq)
        cache = KVCache(CFG, 2, 9, model.transformer.wte.weight)
        pieces = []
        for a, b in [(0, 3), (3, 5), (5, 6), (6, 7), (7, 8), (8, 9)]:
            logits, _ = model(seq[:, a:b], cache=cache)
            assert cache.length == b
            pieces.append(logits.numpy())
    model.train()
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full.numpy(), rtol=1e-5, atol=1e-5)


def test_kv_cache_positions_are_checked_against_the_context(model):
    cache = KVCache(CFG, 1, CFG.n_positions, model.transformer.wte.weight)
    with tg.no_grad():
        model(np.zeros((1, 20), np.int64), cache=cache)
        with pytest.raises(ValueError) as e:
            model(np.zeros((1, 5), np.int64), cache=cache)  # 20 + 5 > 24
    assert "25" in str(e.value) and "24" in str(e.value)


# ---------------------------------------------------------------- generate / generate_stream


def test_generate_starts_with_the_prompt_and_stays_in_the_vocab(model):
    prompt = np.array([[1, 2, 3], [50, 51, 52]])
    out = model.generate(prompt, 7, temperature=1.0, seed=0)
    assert out.shape == (2, 10) and out.dtype == np.int64
    np.testing.assert_array_equal(out[:, :3], prompt)
    assert out.min() >= 0 and out.max() < CFG.vocab_size


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": 0}, {"temperature": 1.0}, {"temperature": 2.0, "top_k": 5}, {"top_p": 0.9}],
    ids=["greedy", "t1", "top_k", "top_p"],
)
def test_generation_never_samples_a_padding_id(monkeypatch, kwargs):
    """wte is stored padded (V = 10 -> 64 rows). Set 16 padding rows (for the test) to +-1e3
    times each unit vector: for any hidden state h the padded logits reach 1e3 max|h_j|,
    above every real logit h.w_t <= |h| |w_t| <= sqrt(C) max|h_j| |w_t|. Sampling gets the V
    real logits only, so no id >= V comes out."""
    cfg = GPT2Config(n_layer=1, n_head=2, n_embd=8, n_positions=16, vocab_size=10)
    model = randomized(cfg, seed=1)
    V, C, wte = cfg.vocab_size, cfg.n_embd, model.transformer.wte.weight
    wte.data[V : V + 2 * C] = 1e3 * np.concatenate([np.eye(C), -np.eye(C)])
    assert 1e3 > np.sqrt(C) * np.linalg.norm(wte.numpy()[:V], axis=1).max()  # the trap
    seen = []
    monkeypatch.setattr(
        lm, "sample", lambda logits, *a: seen.append(logits.shape) or sample(logits, *a)
    )
    out = model.generate(np.array([[1, 2, 3], [5, 6, 7]]), 8, seed=0, **kwargs)
    assert out.max() < V and seen == [(2, V)] * 8


def test_generate_stream_yields_one_token_per_row_per_step(model):
    prompt = np.array([[4, 8], [15, 16], [23, 42]])
    steps = list(model.generate_stream(prompt, 6, temperature=0.8, top_k=10, seed=3))
    assert len(steps) == 6
    for tok in steps:
        assert isinstance(tok, np.ndarray) and tok.shape == (3,) and tok.dtype == np.int64
    # the stream is what generate returns, column by column
    out = model.generate(prompt, 6, temperature=0.8, top_k=10, seed=3)
    np.testing.assert_array_equal(np.stack(steps, axis=1), out[:, 2:])


def test_generate_stream_accepts_a_1d_prompt(model):
    steps = list(model.generate_stream(np.array([3, 1, 4]), 4, temperature=0))
    assert [t.shape for t in steps] == [(1,)] * 4
    want = greedy_without_cache(model, np.array([[3, 1, 4]]), 4)
    np.testing.assert_array_equal(np.concatenate(steps), want[0, 3:])


def test_generate_accepts_a_1d_prompt(model):
    out = model.generate(np.array([3, 1, 4]), 4, temperature=0)
    want = greedy_without_cache(model, np.array([[3, 1, 4]]), 4)
    np.testing.assert_array_equal(np.asarray(out).reshape(-1), want.reshape(-1))


def test_generate_zero_new_tokens_returns_the_prompt(model):
    prompt = np.array([[5, 6, 7]])
    np.testing.assert_array_equal(model.generate(prompt, 0), prompt)
    assert list(model.generate_stream(prompt, 0)) == []


def test_generate_is_deterministic_with_a_seed(model):
    prompt = np.array([[1, 2], [3, 4]])
    a = model.generate(prompt, 10, temperature=1.5, seed=11)
    b = model.generate(prompt, 10, temperature=1.5, seed=11)
    c = model.generate(prompt, 10, temperature=1.5, seed=12)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_generate_can_fill_the_context_exactly(model):
    prompt = np.zeros((1, 20), np.int64)
    out = model.generate(prompt, CFG.n_positions - 20, temperature=0)
    assert out.shape == (1, CFG.n_positions)
    np.testing.assert_array_equal(out, greedy_without_cache(model, prompt, 4))


@pytest.mark.parametrize("T,n", [(20, 5), (24, 1), (30, 0), (1, 100)])
def test_generate_beyond_the_context_names_both_lengths(model, T, n):
    prompt = np.zeros((2, T), np.int64)
    with pytest.raises(ValueError) as e:
        model.generate(prompt, n)
    msg = str(e.value)
    assert str(T + n) in msg and str(CFG.n_positions) in msg and str(T) in msg
    with pytest.raises(ValueError, match=str(CFG.n_positions)):
        next(iter(model.generate_stream(prompt, n)))


def test_generate_negative_max_new_tokens_is_refused_clearly(model):
    with pytest.raises(ValueError) as e:
        model.generate(np.array([[1, 2, 3]]), -1)
    assert "max_new_tokens" in str(e.value), str(e.value)


def test_generate_empty_prompt_is_refused_clearly(model):
    with pytest.raises(ValueError) as e:
        model.generate(np.zeros((1, 0), np.int64), 3)
    assert "prompt" in str(e.value) or "token" in str(e.value), str(e.value)


@pytest.mark.parametrize("dtype", ["fp64", "bf16"])
def test_generate_in_other_dtypes(dtype):
    m = randomized(CFG, seed=0).to(dtype)
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    out = m.generate(prompt, 6, temperature=0)
    assert out.shape == (2, 9) and out.dtype == np.int64
    assert out.min() >= 0 and out.max() < CFG.vocab_size
    assert all(p.dtype == dtypes.as_dtype(dtype) for p in m.parameters())
    if dtype == "fp64":
        np.testing.assert_array_equal(out, greedy_without_cache(m, prompt, 6))
    sampled = m.generate(prompt, 6, temperature=1.0, top_k=5, seed=0)
    np.testing.assert_array_equal(sampled, m.generate(prompt, 6, temperature=1.0, top_k=5, seed=0))


def overflowing_in_fp16():
    """A model whose weights all fit fp16 (at most ~7,000) but whose logits reach ~90,000:
    its fp16 forward overflows, as a real model's can."""
    state = randomized(CFG).state_dict()
    state["transformer.ln_f.weight"] *= 6000
    model = GPT2(CFG)
    model.load_state_dict(state)
    assert max(np.abs(a).max() for a in state.values()) < 65504
    return model


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_non_finite_logits_stop_generation_naming_the_dtype(temperature):
    """Not token 0 over and over (greedy) nor a NumPy error (sampling): a ValueError that
    says which dtype to use; bf16 has fp32's range and generates."""
    model = overflowing_in_fp16().to(dtype="fp16")
    with pytest.raises(ValueError, match="fp16 forward gave inf or nan.*use dtype bf16"):
        model.generate(np.array([[1, 2, 3]]), 4, temperature=temperature, seed=0)
    model.to(dtype="bf16").generate(np.array([[1, 2, 3]]), 4, temperature=temperature, seed=0)


def test_generate_py_says_an_fp16_overflow_in_one_line_before_printing(tmp_path, capsys):
    from test_faults import script_main

    overflowing_in_fp16().save_pretrained(tmp_path)
    argv = ["--checkpoint", str(tmp_path), "--dtype", "fp16", "--prompt", "!#", "--top-k", "5"]
    with pytest.raises(SystemExit) as exit_info:
        script_main("examples/generate.py")(
            [*argv, "--max-new-tokens", "5"]
        )  # ids 0 and 2: in CFG's vocabulary
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and out == ""
    assert err.startswith("error: the fp16 forward") and "use dtype bf16" in err
    assert len(err.strip().splitlines()) == 1, err


def test_generate_with_a_bad_prompt_id_names_it(model):
    with pytest.raises(ValueError, match=r"\b99\b.*\b53\b"):
        model.generate(np.array([[1, 99]]), 3)


# ---------------------------------------------------------------- side effects


@pytest.mark.parametrize("training", [True, False])
def test_generation_leaves_train_eval_mode_as_it_was(training):
    m = randomized(CFG, seed=1)
    m.train(training)
    m.generate(np.array([[1, 2, 3]]), 5, temperature=0.7, seed=0)
    assert all(mod.training == training for _, mod in m.named_modules())
    list(m.generate_stream(np.array([[1, 2, 3]]), 3, temperature=0))
    assert all(mod.training == training for _, mod in m.named_modules())


def test_generation_restores_each_submodules_own_mode():
    m = randomized(CFG, seed=1)
    m.train()
    m.transformer.h[0].eval()
    before = {name: mod.training for name, mod in m.named_modules()}
    assert before["transformer.h.0.attn"] is False and before["transformer.h.1"] is True
    m.generate(np.array([[1, 2, 3]]), 3, temperature=0)
    assert {name: mod.training for name, mod in m.named_modules()} == before


def test_generation_runs_in_eval_mode_and_restores_training_even_on_error():
    """With dropout the model in training mode is random; generation must not be."""
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=24, vocab_size=53, dropout=0.5)
    m = randomized(cfg, seed=0)
    m.train()
    prompt = np.array([[3, 1, 4, 1, 5]])
    a = m.generate(prompt, 8, temperature=0)
    b = m.generate(prompt, 8, temperature=0)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, greedy_without_cache(m, prompt, 8))
    assert m.training
    with pytest.raises(ValueError):
        m.generate(np.array([[1, 500]]), 3)  # fails inside the forward
    assert all(mod.training for _, mod in m.named_modules())


def test_generation_records_nothing_on_the_tape(model):
    model.train()
    assert tg.is_grad_enabled()
    start = TAPE.position()
    model.generate(np.array([[1, 2, 3], [4, 5, 6]]), 6, temperature=1.0, top_p=0.9, seed=0)
    for _ in model.generate_stream(np.array([[7, 8]]), 4, temperature=0):
        pass
    # positions and records share one counter: nothing in between means no record was made
    assert TAPE.position() == start + 1
    assert TAPE.records(since=start) == []
    assert all(p.grad is None for p in model.parameters())
    assert tg.is_grad_enabled()


def test_a_stream_closed_early_restores_the_mode():
    m = randomized(CFG, seed=2)
    m.train()
    stream = m.generate_stream(np.array([[1, 2]]), 10, temperature=0)
    next(stream)
    stream.close()
    assert m.training and tg.is_grad_enabled()


def test_a_suspended_stream_does_not_change_the_callers_grad_mode():
    m = randomized(CFG, seed=3)
    m.train()
    stream = m.generate_stream(np.array([[1, 2]]), 10, temperature=0)
    next(stream)
    try:
        assert tg.is_grad_enabled()
        _, loss = m(np.array([[1, 2, 3]]), np.array([[2, 3, 4]]))
        loss.backward()
        assert m.transformer.wte.weight.grad is not None
    finally:
        stream.close()
        m.zero_grad()


# ---------------------------------------------------------------- sampling


def crafted_logits(rng, V=12):
    """Distinct logits in a shuffled order (so the top ids are not simply the last ones)."""
    logits = np.linspace(-2.0, 3.0, V)
    return logits[rng.permutation(V)].astype(np.float32)


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def test_temperature_zero_is_argmax():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((64, 100)).astype(np.float32)
    got = sample(logits, temperature=0)
    np.testing.assert_array_equal(got, logits.argmax(-1))
    assert got.dtype == np.int64 and got.shape == (64,)
    # top-k / top-p cannot change a greedy choice
    np.testing.assert_array_equal(sample(logits, 0, top_k=5, top_p=0.3), got)


def test_top_k_only_samples_the_k_largest_over_many_seeds():
    rng = np.random.default_rng(1)
    logits = crafted_logits(rng)
    top3 = set(np.argsort(logits)[-3:].tolist())
    rows = np.tile(logits, (50, 1))
    seen = []
    for seed in range(100):
        seen.extend(sample(rows, 1.0, top_k=3, rng=np.random.default_rng(seed)).tolist())
    assert set(seen) == top3  # never outside, and each of the 3 appears
    # in proportion to the renormalised softmax of the three
    p = softmax(logits[sorted(top3)].astype(np.float64))
    freq = np.array([seen.count(t) for t in sorted(top3)]) / len(seen)
    np.testing.assert_allclose(freq, p, atol=0.02)


def test_top_k_with_high_temperature_still_stays_in_the_set():
    rng = np.random.default_rng(2)
    logits = np.tile(crafted_logits(rng), (2000, 1))
    got = sample(logits, 50.0, top_k=2, rng=np.random.default_rng(0))
    assert set(got.tolist()) == set(np.argsort(logits[0])[-2:].tolist())
    # k larger than the vocabulary keeps everything
    got = sample(logits[:500], 50.0, top_k=1000, rng=np.random.default_rng(0))
    assert len(set(got.tolist())) == logits.shape[1]


def test_top_p_only_samples_the_nucleus_over_many_seeds():
    # probabilities 0.3, 0.25, 0.2, 0.1, 0.08, 0.07 (shuffled): mass reaches 0.5 with the
    # first two (0.55), so the nucleus is exactly those two
    probs = np.array([0.3, 0.25, 0.2, 0.1, 0.08, 0.07])
    order = np.random.default_rng(3).permutation(6)
    logits = np.log(probs)[order].astype(np.float32)
    nucleus = {int(np.flatnonzero(order == 0)[0]), int(np.flatnonzero(order == 1)[0])}
    rows = np.tile(logits, (40, 1))
    seen = []
    for seed in range(100):
        seen.extend(sample(rows, 1.0, top_p=0.5, rng=np.random.default_rng(seed)).tolist())
    assert set(seen) == nucleus
    a = int(np.flatnonzero(order == 0)[0])
    assert seen.count(a) / len(seen) == pytest.approx(0.3 / 0.55, abs=0.02)


def test_top_p_keeps_the_most_likely_token_even_when_p_is_tiny():
    rng = np.random.default_rng(4)
    logits = np.tile(crafted_logits(rng), (300, 1))
    got = sample(logits, 1.0, top_p=1e-6, rng=np.random.default_rng(0))
    assert set(got.tolist()) == {int(logits[0].argmax())}


def test_top_k_and_top_p_together_sample_the_intersection():
    rng = np.random.default_rng(5)
    logits = crafted_logits(rng, V=20)
    rows = np.tile(logits, (3000, 1))
    # top_k=4 then top_p over the 4 renormalised probabilities
    top4 = np.argsort(logits)[-4:][::-1]
    p4 = softmax(logits[top4].astype(np.float64))
    n = int(np.searchsorted(np.cumsum(p4), 0.6) + 1)  # the nucleus size for p = 0.6
    got = sample(rows, 1.0, top_k=4, top_p=0.6, rng=np.random.default_rng(1))
    assert set(got.tolist()) == set(top4[:n].tolist())


def test_sampling_rows_are_independent():
    """Each row of a batch samples from its own logits."""
    logits = np.full((2, 10), -50.0, np.float32)
    logits[0, 2] = logits[1, 7] = 50.0
    for seed in range(20):
        np.testing.assert_array_equal(sample(logits, 1.0, rng=np.random.default_rng(seed)), [2, 7])


def test_sampling_is_deterministic_with_a_seed():
    logits = np.random.default_rng(6).standard_normal((100, 30)).astype(np.float32)
    a = sample(logits, 1.0, top_k=20, top_p=0.9, rng=np.random.default_rng(42))
    b = sample(logits, 1.0, top_k=20, top_p=0.9, rng=np.random.default_rng(42))
    c = sample(logits, 1.0, top_k=20, top_p=0.9, rng=np.random.default_rng(43))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.dtype == np.int64 and a.shape == (100,)


@pytest.mark.parametrize(
    "kwargs,word",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_bad_sampling_arguments(kwargs, word):
    logits = np.zeros((1, 5), np.float32)
    args = {"temperature": 1.0, **kwargs}
    with pytest.raises(ValueError, match=word):
        sample(logits, rng=np.random.default_rng(0), **args)


@pytest.mark.parametrize(
    "kwargs,word",
    [
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_p": float("nan")}, "top_p"),
        ({"top_k": 0}, "top_k"),
    ],
)
def test_generate_stream_refuses_bad_sampling_arguments_eagerly(model, kwargs, word):
    """Before the first next(), so a caller never prints half an output before the error."""
    with pytest.raises(ValueError, match=word):
        model.generate_stream(np.array([[1, 2]]), 3, **{"temperature": 1.0, **kwargs})


# ---------------------------------------------------------------- int8 activations

# K = 256 and 1024: whole chunks of 8 blocks of 32 in the CPU's integer dot (CFG's 32: one block)
WIDE = GPT2Config(n_layer=2, n_head=4, n_embd=256, n_positions=24, vocab_size=53)


@pytest.mark.parametrize("fmt, group_size", [("int8", None), ("int4", None), ("int4", 64)])
def test_int8_activations_keep_the_logits_within_2_percent_of_the_fp32_paths(fmt, group_size):
    """The same quantized weights, x quantized per block of 32 or not: every logit within 2% of
    the largest logit's magnitude (measured 0.3%), the argmax the same; the model's weights
    untouched by the switch (use_activations back to fp32 gives the fp32 path's bits)."""
    model = quantize_model(randomized(WIDE), fmt, group_size).eval()
    ids = np.random.default_rng(0).integers(0, WIDE.vocab_size, (2, 12))
    with tg.no_grad():
        fp32 = model(ids)[0].numpy()
        int8 = use_activations(model, "int8")(ids)[0].numpy()
        again = use_activations(model, "fp32")(ids)[0].numpy()
    assert np.abs(int8 - fp32).max() <= 0.02 * np.abs(fp32).max()
    assert np.array_equal(int8.argmax(-1), fp32.argmax(-1))
    assert again.tobytes() == fp32.tobytes()


def test_a_llamas_projections_of_one_input_share_its_int8_codes(monkeypatch):
    """q, k and v (and gate and up) meet one x: with int8 activations it is quantized once for
    them (nn/layers.py projections, F.linears), 4 quantize_rows a layer and the head's, not 7;
    the logits are the bits of quantizing it for each projection."""
    from nn import build
    from nn.config import LlamaConfig
    from tinygrad_like import functional
    from tinygrad_like.profiler import Profiler

    config = LlamaConfig(2, 64, 4, 2, 96, 53, 24)  # every K a multiple of 32
    model = quantize_model(build(config, seed=0), "int8", activations="int8").eval()
    ids = np.random.default_rng(0).integers(0, 53, (1, 6))
    logits = {}
    for shared in (True, False):
        if not shared:  # every projection called on its own, quantizing x itself
            monkeypatch.setattr(functional, "shares_codes", lambda weight: False)
        with tg.no_grad(), Profiler() as prof:
            logits[shared] = model(ids)[0].numpy()
        quantized = sum(launch.name == "quantize_rows" for launch in prof.launches)
        assert quantized == (4 * 2 + 1 if shared else 7 * 2 + 1)
    assert logits[True].tobytes() == logits[False].tobytes()


def test_bf16_activations_keep_the_logits_within_2_percent_of_the_fp32_paths():
    """bf16 weights meeting x rounded to bf16 (24 rows: a prompt's GEMMs, bf16 dot products
    where the CPU has them): every logit within 2% of the largest's magnitude, the argmax the
    same; int8 weights have no bf16 path."""
    model = quantize_model(randomized(WIDE), "bf16").eval()
    ids = np.random.default_rng(0).integers(0, WIDE.vocab_size, (2, 12))
    with tg.no_grad():
        fp32 = model(ids)[0].numpy()
        bf16 = use_activations(model, "bf16")(ids)[0].numpy()
    assert np.abs(bf16 - fp32).max() <= 0.02 * np.abs(fp32).max()
    assert np.array_equal(bf16.argmax(-1), fp32.argmax(-1))
    with pytest.raises(ValueError, match="bf16 activations need bf16 weights, not int8"):
        quantize_model(randomized(CFG), "int8", activations="bf16")


def test_int8_activations_are_refused_before_anything_changes():
    """A float format has no integer path: quantize_model refuses before it replaces a weight,
    use_activations before it switches one; an fp32 model has none either."""
    model = randomized(CFG)
    with pytest.raises(ValueError, match="fp8_e4m3 has no integer path"):
        quantize_model(model, "fp8_e4m3", activations="int8")
    assert not any(type(p).__name__ == "QuantizedWeight" for p in model.parameters())
    with pytest.raises(ValueError, match="the model is fp32"):
        use_activations(model, "int8")
    quantize_model(model, "fp8_e4m3")
    with pytest.raises(ValueError, match="no integer path"):
        use_activations(model, "int8")
    assert {p.activations for p in model.parameters() if hasattr(p, "activations")} == {"fp32"}


def generate_py(argv, capsys):
    """-> (exit code, stdout, stderr) of examples/generate.py."""
    from test_faults import script_main

    try:
        script_main("examples/generate.py")(argv)
    except SystemExit as e:
        return e.code, *capsys.readouterr()
    return 0, *capsys.readouterr()


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    randomized(CFG, seed=0).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("fmt", ["int8", "int4", "bf16"])
def test_generate_py_int8_activations_compiled_give_the_same_tokens(tiny_checkpoint, capsys, fmt):
    """--activations int8: the step captured (quantize_rows and qmatmul_int8x launched through
    kernels.launch) and replayed, generate.py's default, gives the eager step's (--no-compile)
    greedy tokens, the residual adds fused into qmatmul_int8x (fewer launches on a replay); the
    same for bf16 weights and activations (a cast, then qmatmul)."""
    argv = ["--checkpoint", tiny_checkpoint, "--prompt", "!#", "--max-new-tokens", "7"]
    activations = "bf16" if fmt == "bf16" else "int8"  # bf16 weights: bf16 activations
    argv += ["--temperature", "0", "--weights", fmt, "--activations", activations, "--stats"]
    texts = []
    for flags in (["--no-compile"], []):
        code, out, err = generate_py(argv + flags, capsys)
        assert code == 0, err
        texts.append(out[: out.index("\n--- prompt")])
    assert texts[0] == texts[1]
    launches = next(line for line in out.splitlines() if line.startswith("launches: "))
    eager, replayed = map(
        int, re.match(r"launches: (\d+) per decode step, (\d+) on a", launches).groups()
    )
    assert replayed < eager


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--weights", "fp8_e4m3", "--activations", "int8"], "fp8_e4m3 weights have none"),
        (["--activations", "int8"], "fp32 weights have none"),
        (["--weights", "int4", "--group-size", "16", "--activations", "int8"], "multiple of 32"),
        (["--weights", "int8", "--activations", "int4"], "use one of fp32, int8"),
        (["--weights", "int8", "--activations", "bf16"], "needs --weights bf16"),
    ],
)
def test_generate_py_activations_refuses_in_one_line(tiny_checkpoint, capsys, argv, words):
    code, out, err = generate_py(["--checkpoint", tiny_checkpoint, *argv], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and words in err and len(err.strip().splitlines()) == 1
