"""The course's reference 7B measured on the meta device: lecture 2's figures come out of a
real training step's counts (accounting/lecture.py, scripts/report.py)."""

import time

import pytest

from accounting import lecture, measure
from nn import ExecutionOptions, from_preset

B, T = 8, 4096  # the lecture's micro-batch: 32,768 tokens


@pytest.fixture(scope="module")
def plain():
    """The 7B's bf16 step with the plain LM head (the logits exist) and flash attention."""
    t0 = time.perf_counter()
    m = measure.measure(
        from_preset("llama-7b"), "bf16", "meta", B, T, options=ExecutionOptions(lm_head="plain")
    )
    assert time.perf_counter() - t0 < 60  # the "under a minute here"
    return m


def test_the_parameter_count_is_the_lectures_plus_the_norms(plain):
    config = plain.config
    assert lecture.paper_parameters(config) == 6_738_149_376
    assert plain.n_params == 6_738_149_376 + 2 * 32 * 4096 + 4096
    assert config.attention_crossover() == 24_704


def test_sixteen_bytes_per_parameter_and_the_optimizers_28(plain):
    assert sum(plain.persistent.values()) == 16 * plain.n_params  # 107.8 GB
    adamw = sum(x.bytes for x in plain.step.launches if x.name == "adamw_step")
    assert adamw == 28 * plain.n_params + 4  # and the norm² it reads (1,) fp32


def test_the_loss_tensor_and_the_kv_cache(plain):
    (shape, dtype) = next(
        r["outputs"][0] for r in plain.tape if r["scope"] == "lm_head" and r["op"] == "linear"
    )
    assert shape == [B, T, 32_000] and dtype == "bfloat16"  # 2.10 GB
    assert plain.kv_cache_bytes_per_token == 512 * 1024
    rows = {row[0]: row for row in lecture.figures(plain, 80e9)}
    assert "2.10 GB" in rows["loss tensor at 32,768 tokens"][2]
    assert "exceeds 80.00 GB by 27.81 GB" in rows["persistent training state"][3]
    fit = rows["KV cache tokens in 80.00 GB"]
    assert fit[1].endswith("= 126,883") and fit[2] == "126,882"  # the norms' 0.26 MB
    assert lecture.lecture_activation_bytes_per_token(plain.config) == 3_686_400


def test_forward_flops_are_2n_less_the_embedding_gather(plain):
    """Each block's GEMMs are 2 FLOPs per weight per token; flash attention computes the causal
    scores only (its diagonal blocks whole), about 2·L·d·(T+1) per token."""
    c, tokens = plain.config, B * T
    gemm = sum(
        x.flops for x in plain.step.launches if x.name.startswith("matmul") and x.math == "forward"
    )
    linear_weights = lecture.paper_parameters(c) - c.vocab_size * c.hidden_size  # no gather
    assert gemm == 2 * linear_weights * tokens
    attention = sum(x.flops for x in plain.step.launches if x.name == "flash_attention_fwd")
    assert 1.0 < attention / (2 * c.n_layer * c.hidden_size * (T + 1) * tokens) < 1.03


def test_grouped_query_attention_exercise():
    config = from_preset("llama-7b", num_key_value_heads=8)
    assert lecture.paper_parameters(config) == 5_932_843_008
    assert config.kv_cache_bytes_per_token(2) == 128 * 1024
    assert config.attention_crossover() == 21_632
    m = measure.measure(config, "bf16", "meta", 1, 64)
    assert m.kv_cache_bytes_per_token == 128 * 1024
    assert m.n_params == config.num_parameters()
