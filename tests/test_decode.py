"""Decoding where bytes decide (accounting/decode.py, nn/lm.py's KVCache): the KV cache in another
dtype (greedy tokens against an fp32 cache, the tracker's bytes against the prediction, the
casts counted), batched decode against each prompt alone, the decode step's GEMMs and floor
against what the kernels counted, generate.py --stats and its refusals, the sweep's smoke run,
and the meta device's 7B cache beside its weights in 80 GB.
"""

import re
import types

import numpy as np
import pytest
from test_faults import script_main
from test_generate import CFG, randomized
from test_llama import GQA
from test_llama import randomized as randomized_llama

import tinygrad_like as tg
from accounting import decode, predictions
from nn import KVCache, from_preset
from tinygrad_like import compiles, dtypes
from tinygrad_like.memory import TRACKER
from tinygrad_like.profiler import GEMMS, Profiler


@pytest.fixture(scope="module")
def gpt2():
    return randomized(CFG, seed=0)


@pytest.fixture(scope="module")
def llama():
    return randomized_llama(GQA, seed=0)


def prompts(cfg, B, T, seed=3):
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, (B, T))


# ---------------------------------------------------------------- the cache's dtype


def forced_agreement(model, want, T, kv_dtype):
    """Teacher forcing: feed the fp32 cache's greedy sequence want (B, T + n) through a cache
    in kv_dtype and say, per step, whether its argmax picks want's next token (B, n) bools."""
    B, n = want.shape[0], want.shape[1] - T
    cache = KVCache(model.config, B, want.shape[1], model.get_input_embeddings().weight, kv_dtype)
    model.eval()
    picked, feed = [], want[:, :T]
    with tg.no_grad():
        for i in range(n):
            logits, _ = model(feed, cache=cache, last_only=True)
            picked.append(logits.numpy()[:, -1].argmax(-1))
            feed = want[:, T + i : T + i + 1]
    return np.stack(picked, 1) == want[:, T:]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp16"])
def test_a_narrower_cache_decodes_the_fp32_caches_greedy_tokens(family, kv_dtype, request):
    """A 2-byte cache rounds every key and value (bf16: 8 bits of mantissa). Of 4 x 12 greedy
    choices made from fp32's own prefixes, all agree here but one (Llama, bf16: 47 of 48);
    free-running, one flip changes all that follows (Llama, bf16: 42 of 48 agree)."""
    model = request.getfixturevalue(family)
    p = prompts(model.config, 4, 5)
    want = model.generate(p, 12, temperature=0)
    agree = forced_agreement(model, want, 5, kv_dtype)
    assert agree.sum() >= agree.size - 1
    got = model.generate(p, 12, temperature=0, kv_dtype=kv_dtype)
    np.testing.assert_array_equal(got[:, 5], want[:, 5])  # the prompt's own step: no flip


def test_the_cache_is_read_in_its_own_dtype(gpt2):
    """The attention kernel reads a bf16 cache as bf16 (q cast to it, its output cast back):
    its bytes are half the fp32 cache's for the cached part, and every cast is a counted
    launch (k and v into the cache, q and the output out of it)."""
    p = prompts(CFG, 1, 6)
    counted = {}
    for kv in ("fp32", "bf16"):
        cache = KVCache(CFG, 1, 7, gpt2.get_input_embeddings().weight, kv)
        gpt2.eval()
        with tg.no_grad():
            gpt2(p, cache=cache, last_only=True)
            with Profiler() as prof:
                gpt2(p[:, -1:], cache=cache, last_only=True)
        counted[kv] = prof.census()
        assert cache.k[0].dtype == dtypes.as_dtype(kv)
    by_name = {kv: {r["kernel"]: r for r in rows} for kv, rows in counted.items()}
    assert "cast" not in by_name["fp32"]
    assert by_name["bf16"]["cast"]["calls"] == 4 * CFG.n_layer  # k, v, q, the output
    attention = [name for name in by_name["fp32"] if "attention" in name]
    assert attention
    for name in attention:
        assert by_name["bf16"][name]["bytes"] < by_name["fp32"][name]["bytes"]


@pytest.mark.parametrize("cfg", [CFG, GQA, from_preset("gpt2-tiny")], ids=["gpt2", "gqa", "tiny"])
@pytest.mark.parametrize("kv_dtype", dtypes.TRAINING)
def test_the_trackers_cache_bytes_equal_the_prediction(cfg, kv_dtype):
    """Per token per layer: K and V of Hkv heads of D values, 2 Hkv D itemsize bytes
    (config.kv_cache_bytes_per_token / n_layer), registered as the tracker's kv_cache and
    released with the cache."""
    B, T = 3, 10
    before = TRACKER.current["kv_cache"]
    like = tg.Tensor(np.zeros((2, 2), np.float32))
    cache = KVCache(cfg, B, T, like, kv_dtype)
    held = TRACKER.current["kv_cache"] - before
    per_layer = cfg.kv_cache_bytes_per_token(dtypes.as_dtype(kv_dtype).itemsize) // cfg.n_layer
    assert held == B * T * cfg.n_layer * per_layer
    assert per_layer == 2 * cfg.n_kv_head * cfg.head_dim * dtypes.as_dtype(kv_dtype).itemsize
    del cache
    assert TRACKER.current["kv_cache"] == before


@pytest.mark.parametrize("bad", ["fp8", "int8", "fp64", "float8"])
def test_a_cache_dtype_it_cannot_hold_is_refused(gpt2, bad):
    with pytest.raises(ValueError, match="use one of fp32, fp16, bf16, fp8_e4m3, fp8_e5m2"):
        gpt2.generate(prompts(CFG, 1, 3), 2, kv_dtype=bad)


# ---------------------------------------------------------------- batched decode


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("kv_dtype", [None, "bf16"])
def test_batched_greedy_decode_equals_each_prompt_alone(family, kv_dtype, request):
    model = request.getfixturevalue(family)
    p = prompts(model.config, 5, 4, seed=11)
    together = model.generate(p, 10, temperature=0, kv_dtype=kv_dtype)
    for b in range(5):
        alone = model.generate(p[b : b + 1], 10, temperature=0, kv_dtype=kv_dtype)
        np.testing.assert_array_equal(together[b : b + 1], alone)


# ---------------------------------------------------------------- counted against predicted


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("B", [1, 3])
def test_the_decode_steps_gemms_are_the_predicted_ones(family, B, request):
    """Every GEMM launch of a decode step is one of decode_gemms' rows, with its FLOPs and
    bytes, as many times a step as the row says; and the step moves at least its floor."""
    model = request.getfixturevalue(family)
    meter = decode.StepMeter(model.generate_stream(prompts(model.config, B, 4), 3, temperature=0))
    list(meter)
    launches = [launch for launch in meter.steps[1][1] if launch.name in GEMMS]
    got = sorted((launch.flops, launch.bytes) for launch in launches)
    want = sorted(
        decode.gemm_counts(B, K, N, 4, bias)
        for _, K, N, count, bias in decode.decode_gemms(model.config)
        for _ in range(count)
    )
    assert got == want
    floor = decode.stream_bytes(model.config, 4, 4, B, 4 + 1)
    assert floor <= meter.step_bytes(1) < 2 * floor


def test_the_streamed_weights_are_the_stored_ones_but_the_gathered_table():
    gpt2, llama = from_preset("gpt2"), from_preset("llama-7b")
    assert decode.streamed_weight_elements(gpt2) == predictions.stored_elements(gpt2) - 1024 * 768
    gathered = llama.padded_vocab_size * llama.hidden_size
    assert decode.streamed_weight_elements(llama) == predictions.stored_elements(llama) - gathered


def test_the_compute_bound_batch_is_where_the_intensity_meets_the_ridge():
    K, N, size, ridge = 768, 3072, 4, 20.0
    B = decode.compute_bound_batch(K, N, size, ridge)
    flops, nbytes = 2 * B * K * N, (B * K + K * N + B * N) * size
    assert flops / nbytes == pytest.approx(ridge)
    assert decode.compute_bound_batch(K, N, size, 2 * K * N / (size * (K + N))) is None


# ---------------------------------------------------------------- generate.py


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    randomized(CFG, seed=0).save_pretrained(path)
    return str(path)


def generate_py(argv, capsys):
    """-> (exit code, stdout, stderr) of examples/generate.py."""
    code = 0
    try:
        script_main("examples/generate.py")(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
def test_generate_py_stats(checkpoint, capsys, kv_dtype):
    """The stats lines of eager steps (--no-compile); the floor's KV cache part is the cache's
    bytes at the steps' lengths (an fp8 cache's: 1 + 4 / D bytes an element)."""
    code, out, err = generate_py(
        ["--checkpoint", checkpoint, "--prompt", "!#", "--max-new-tokens", "6", "--stats"]
        + ["--temperature", "0", "--kv-dtype", kv_dtype, "--no-compile"],
        capsys,
    )
    assert code == 0, err
    stats = out[out.index("--- stats") :].splitlines()
    assert f"weights fp32, KV cache {kv_dtype}, B = 1" in stats[0] and "GB/s" in stats[0]
    per_element = 2 if kv_dtype == "bf16" else 1 + 4 / CFG.head_dim
    kv = np.mean([CFG.kv_cache_bytes_per_token(per_element) * (2 + s) for s in range(1, 6)])
    assert f"KV cache {kv / 1e6:,.3f}" in stats[4]
    assert stats[1].startswith("prompt: 2 tokens x 1") and "ms/token" in stats[1]
    assert stats[2].startswith("decode: 5 steps of 1 tokens") and "tokens/s" in stats[2]
    model = randomized(CFG)  # the checkpoint's architecture: its decode step's launches
    step = model.decode_step(KVCache(CFG, 1, 3, model.get_input_embeddings().weight, kv_dtype))
    step(np.zeros((1, 2), np.int64), np.arange(2))
    with Profiler() as launched:
        step(np.zeros((1, 1), np.int64), np.arange(2, 3))
    launches, host = stats[3].split("; ")
    assert launches == f"launches: {len(launched.launches)} per decode step"
    # each kernel timed (--stats): the step's host time is the rest, within the step
    eager = re.fullmatch(r"host \(a step's seconds minus its kernels'\): eager (\S+) ms/step", host)
    assert 0 <= float(eager.group(1)) < float(re.search(r"([\d.]+) ms/step", stats[2]).group(1))
    assert stats[4].startswith("bytes: ") and "MB/token moved" in stats[4]
    assert stats[5].startswith("bound: ") and "of the bound" in stats[5]


def test_generate_py_compile_prints_the_same_text_and_counts_the_eager_steps(checkpoint, capsys):
    """The steps replayed (--compile, the default) or not (--no-compile): the same greedy text;
    --stats says how many steps were replayed (they pass no launch point) and counts the bytes
    on the others."""
    argv = ["--checkpoint", checkpoint, "--prompt", "!#", "--max-new-tokens", "7"]
    argv += ["--temperature", "0", "--stats"]
    texts = []
    for flags in (["--no-compile"], []):
        code, out, err = generate_py(argv + flags, capsys)
        assert code == 0, err
        texts.append(out[: out.index("\n--- prompt")])
        stats = out[out.index("--- stats") :].splitlines()
    assert texts[0] == texts[1]
    assert stats[2].startswith(
        "decode: 6 steps of 1 tokens (4 replayed, bytes counted on the other 2)"
    )
    eager, replayed = re.match(
        r"launches: (\d+) per decode step, (\d+) on a replay", stats[3]
    ).groups()
    assert 0 < int(replayed) < int(eager)  # the residual adds fused into their GEMMs
    assert "the 2 eager steps that recorded it" in stats[3]
    host = re.search(r"host \(.*\): replayed (\S+) ms/step, eager (\S+) ms/step$", stats[3])
    assert host and all(float(ms) >= 0 for ms in host.groups())  # a replay's kernels timed too


def test_a_steps_seconds_hold_none_of_its_compiles(monkeypatch):
    """The issue: generate.py --stats counted 20,549 ms for a prompt token, Numba's first
    compiles. The meter takes each step's compiles (tinygrad_like.compiles) out of its seconds
    and sums them on their own (a made-up clock: no timing is asserted)."""
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(decode, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    monkeypatch.setattr(compiles, "_total", compiles.Compiles())

    def tokens():
        clock.now += 20.5  # the prompt's step: 20 s of it compiling
        compiles.add(20.0)
        yield np.array([1])
        clock.now += 0.1
        yield np.array([2])

    meter = decode.StepMeter(tokens())
    assert [int(t[0]) for t in meter] == [1, 2]
    assert [seconds for seconds, _ in meter.steps] == pytest.approx([0.5, 0.1])
    assert meter.compiled == compiles.Compiles(1, 20.0)


def test_generate_py_says_its_compiles_on_a_line_of_their_own(checkpoint, capsys, monkeypatch):
    calls = []

    def so_far():  # one compile, of no seconds, in the prompt's step (made up: they may be warm)
        calls.append(1)
        return compiles.Compiles(int(len(calls) > 1), 0.0)

    monkeypatch.setattr(compiles, "so_far", so_far)
    argv = ["--checkpoint", checkpoint, "--prompt", "!#", "--max-new-tokens", "3"]
    code, out, err = generate_py(argv, capsys)
    assert code == 0, err
    lines = out.splitlines()
    speeds = [i for i, line in enumerate(lines) if line.startswith("--- prompt: 1 x 2 tokens")]
    assert len(speeds) == 1 and lines[speeds[0] + 1] == (
        "--- compiles: 1 kernel variant compiled (or loaded from Numba's disk cache) on first "
        "use, 0.00 s, kept out of every time"
    )


def test_generate_py_decodes_a_batch_as_each_prompt_alone(checkpoint, capsys):
    argv = ["--checkpoint", checkpoint, "--max-new-tokens", "5", "--temperature", "0"]
    code, out, err = generate_py(argv + ["--prompt", "!#", "--prompt", "(%"], capsys)
    assert code == 0, err
    texts = [line for line in out.splitlines() if line.startswith(("!#", "(%"))]
    assert len(texts) == 2 and "--- (prompt 2 of 2)" in out
    for prompt, text in zip(("!#", "(%"), texts):
        code, alone, err = generate_py(argv + ["--prompt", prompt], capsys)
        assert code == 0 and alone.splitlines()[1] == text


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--kv-dtype", "fp8"], "--kv-dtype fp8: use one of fp32, fp16, bf16, fp8_e4m3, fp8_e5m2"),
        (["--prompt", "!#", "--prompt", "!"], "prompts of one token length"),
        (["--prompt", "!", "--prompt", ""], "--prompt is empty"),
    ],
)
def test_generate_py_refuses_in_one_line(checkpoint, capsys, argv, words):
    code, out, err = generate_py(["--checkpoint", checkpoint, *argv], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and words in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- the sweep and the meta device


def test_decode_sweep_smoke(capsys):
    script_main("scripts/decode_sweep.py")(
        ["--model", "gpt2-tiny", "--batches", "1,2", "--new-tokens", "3", "--seq-len", "4"]
    )
    out = capsys.readouterr().out
    assert "ridge point" in out and "predicted B" in out and "measured B" in out
    for name, *_ in decode.decode_gemms(from_preset("gpt2-tiny")):
        assert re.search(rf"^ +2  {name} +\d", out, re.M), name


def test_decode_sweep_refuses_bad_batches(capsys):
    with pytest.raises(SystemExit) as e:
        script_main("scripts/decode_sweep.py")(["--model", "gpt2-tiny", "--batches", "1,x"])
    assert e.value.code == 2 and "--batches" in capsys.readouterr().err


def test_the_reference_7bs_cache_beside_its_weights_in_80_gb():
    """Counted on the meta device, for each KV cache dtype: 2 L Hkv D itemsize bytes per token
    (512 KiB in bf16, 16 KiB per layer; an fp8 cache's codes and its scales, one fp32 per
    position of a head: 2 L Hkv (D + 4), 264 KiB, 8,448 bytes per layer), and the positions that
    fit beside the bf16 weights in 80 GB. (One test: each count settles the tracker, a full
    garbage collection, seconds in a worker that has run many tests.)"""
    c = from_preset("llama-7b")
    itemsizes = {"bf16": 2, "fp32": 4, "fp8_e4m3": 1 + 4 / 128, "fp8_e5m2": 1 + 4 / 128}
    for kv_dtype, itemsize in itemsizes.items():
        got = decode.kv_budget(c, "bf16", kv_dtype, 80e9)
        assert got["weights"] == 2 * predictions.stored_elements(c)
        per_token = 2 * 32 * 32 * 128 * itemsize
        assert got["kv_per_token"] == per_token == c.kv_cache_bytes_per_token(itemsize)
        assert got["kv_per_token_per_layer"] == 2 * 32 * 128 * itemsize
        assert got["tokens_that_fit"] == int((80e9 - got["weights"]) // got["kv_per_token"])
        assert got["tokens_that_fit"] == {2: 126_882, 4: 63_441}.get(itemsize, 246_075)
    gqa = decode.kv_budget(from_preset("llama-7b", num_key_value_heads=8), "bf16", "fp8_e4m3")
    assert gqa["kv_per_token"] * 4 == got["kv_per_token"]
    assert all(n in decode.format_kv_budget(c, "llama-7b") for n in ("126,882", "246,075"))


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8_e4m3"])
@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-tiny"])
def test_meta_counts_a_quantized_models_weights_as_the_cpu_holds_them(preset, fmt):
    """kv_budget(weights=fmt) on the meta device: the bytes of the same model built on the CPU
    and quantized (its codes, scales and the bf16 rest); and the 7B's table has every format."""
    from nn import build
    from nn.quant import quantize_model

    c = from_preset(preset)
    before = TRACKER.settled()["weights"]  # earlier tests' garbage collected before, not within
    model = quantize_model(build(c, device="cpu").to(dtype="bf16"), fmt)
    held = TRACKER.settled()["weights"] - before
    del model
    assert decode.kv_budget(c, "bf16", weights=fmt)["weights"] == held
    if preset == "llama-tiny" and fmt == "int8":
        seven = decode.format_weight_budget(from_preset("llama-7b"), "llama-7b")
        assert all(name in seven for name in ("bf16", "int8", "int4", "fp4_e2m1", "fp8_e5m2"))
