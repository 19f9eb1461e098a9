"""The fp8 KV cache (nn/lm.py KVCache in fp8_e4m3 / fp8_e5m2): the cache's tracked bytes
against the prediction, the launches of a decode step, and greedy decode of GPT-2 and Llama
against an fp32 cache. Its kernels (kv_quantize, qattention) on every device: tests/kernels/
test_kvcache.py.
"""

import numpy as np
import pytest
from test_decode import prompts
from test_generate import CFG, randomized
from test_llama import GQA
from test_llama import randomized as randomized_llama

import tinygrad_like as tg
from nn import KVCache, from_preset
from nn.lm import KV_FORMATS, kv_bytes_per_element
from tinygrad_like import dtypes
from tinygrad_like.memory import TRACKER
from tinygrad_like.profiler import Profiler

F32, BF16 = dtypes.float32, dtypes.bfloat16


# ---------------------------------------------------------------- the cache


@pytest.mark.parametrize("cfg", [CFG, GQA, from_preset("gpt2-tiny")], ids=["gpt2", "gqa", "tiny"])
@pytest.mark.parametrize("fmt", KV_FORMATS)
def test_the_trackers_fp8_cache_bytes_equal_the_prediction(cfg, fmt):
    """Per token per layer: K and V of Hkv heads, D one-byte codes and a 4-byte scale each,
    2 Hkv (D + 4) bytes = kv_cache_bytes_per_token(kv_bytes_per_element) / n_layer; tagged
    kv_cache, released with the cache."""
    B, T = 3, 10
    before = TRACKER.current["kv_cache"]
    cache = KVCache(cfg, B, T, tg.Tensor(np.zeros((2, 2), np.float32)), fmt)
    measured = (TRACKER.current["kv_cache"] - before) / (B * T * cfg.n_layer)
    predicted = 2 * cfg.n_kv_head * (cfg.head_dim + 4)
    assert measured == predicted
    per_token = cfg.kv_cache_bytes_per_token(kv_bytes_per_element(fmt, cfg.head_dim))
    assert per_token / cfg.n_layer == pytest.approx(predicted, rel=1e-12)
    assert (cache.k[0].dtype, cache.k_scales[0].shape) == (np.uint8, (B, cfg.n_kv_head, T))
    del cache
    assert TRACKER.current["kv_cache"] == before


def test_a_decode_step_quantizes_its_position_and_reads_the_codes():
    """Per layer and step: two kv_quantize launches (k and v of the new position), four copies
    into the cache (codes, scales), one qattention that reads q, the codes and scales of the
    positions so far (counted: 2 B Hkv length (D + 4) bytes) and writes out; no cast and no
    other attention kernel."""
    model = randomized_llama(GQA, seed=0)
    cfg, B, T = GQA, 2, 6
    cache = KVCache(cfg, B, T + 1, model.get_input_embeddings().weight, "fp8_e4m3")
    model.eval()
    p = prompts(cfg, B, T)
    with tg.no_grad():
        model(p, cache=cache, last_only=True)
        with Profiler() as prof:
            model(p[:, -1:], cache=cache, last_only=True)
    names = [launch.name for launch in prof.launches]
    L = cfg.n_layer
    assert names.count("kv_quantize") == 2 * L and names.count("qattention") == L
    assert "cast" not in names and not any("flash" in n or "softmax_causal" in n for n in names)
    D, Hkv, H = cfg.head_dim, cfg.n_kv_head, cfg.n_head
    q_bytes = B * H * D * 4
    for launch in prof.launches:
        if launch.name == "qattention":  # q in and out, the cache so far, its one position
            assert launch.bytes == 2 * q_bytes + 2 * B * Hkv * (T + 1) * (D + 4) + 8
            assert launch.flops == (4 * D + 7) * B * H * (T + 1)


def test_an_fp8_cache_is_inference_only():
    cache = KVCache(CFG, 1, 4, tg.Tensor(np.zeros((2, 2), np.float32)), "fp8_e5m2")
    q = tg.Tensor(np.zeros((1, 2, 1, 16), np.float32), requires_grad=True)
    kv = tg.Tensor(np.zeros((1, 2, 1, 16), np.float32))
    with pytest.raises(RuntimeError, match="fp8_e5m2 is inference only"):
        cache.attention(0, q, kv, kv, np.zeros(1, np.int64))


# ---------------------------------------------------------------- decoding

# The logits bound: an fp8 code holds its value to within half an ulp, a relative 2^-(m + 1)
# (m mantissa bits: 2^-4 for e4m3, 2^-3 for e5m2), every key and value once (the row scales are
# exact fp32), and each layer's attention output is a convex combination of values whose
# weights move with the scores' error of the same relative size. Measured, the teacher-forced
# logits of the random models here move by 0.16 to 0.29 of that relative error times their
# largest magnitude (bf16's 2^-9 gives 0.29 to 0.65 of its own): the bound is that relative
# error, whole, times the fp32 logits' largest magnitude.
ROUNDING = {"fp8_e4m3": 2.0**-4, "fp8_e5m2": 2.0**-3}


def forced_logits(model, want, T, kv_dtype):
    """Teacher forcing: feed the fp32 cache's greedy sequence want (B, T + n) through a cache in
    kv_dtype -> (the last-position logits (B, n, V), whether each step's argmax picks want's
    next token (B, n))."""
    B, n = want.shape[0], want.shape[1] - T
    cache = KVCache(model.config, B, want.shape[1], model.get_input_embeddings().weight, kv_dtype)
    model.eval()
    logits, feed = [], want[:, :T]
    with tg.no_grad():
        for i in range(n):
            step, _ = model(feed, cache=cache, last_only=True)
            logits.append(step.numpy()[:, -1])
            feed = want[:, T + i : T + i + 1]
    logits = np.stack(logits, 1)
    return logits, logits.argmax(-1) == want[:, T:]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("fmt", KV_FORMATS)
def test_an_fp8_cache_decodes_most_of_the_fp32_caches_greedy_tokens(family, fmt):
    """4 prompts x 12 greedy tokens of a random model: teacher-forced from the fp32 cache's own
    prefixes, at least 44 of the 48 choices agree (measured: 45 to 48), and the logits stay
    within ROUNDING's bound of the fp32 cache's. Free-running (generate), the first token is
    the teacher-forced first step's (the same prompt through the same cache); after a flip the
    sequences part (measured: 27 to 48 of 48 agree)."""
    model = randomized(CFG, seed=0) if family == "gpt2" else randomized_llama(GQA, seed=0)
    p = prompts(model.config, 4, 5)
    want = model.generate(p, 12, temperature=0)
    fp32, _ = forced_logits(model, want, 5, None)
    logits, agree = forced_logits(model, want, 5, fmt)
    assert agree.sum() >= 44
    assert np.abs(logits - fp32).max() <= ROUNDING[fmt] * np.abs(fp32).max()
    got = model.generate(p, 12, temperature=0, kv_dtype=fmt)
    np.testing.assert_array_equal(got[:, 5], logits[:, 0].argmax(-1))
