"""The memory predictions (accounting/predictions.py) against the tracker, to the byte, on a grid
of shapes, dtypes and options, GPT-2's and Llama's: the bytes the tape saves and the peak of a
training step (measure.measure, the path the accounting report takes). The grid is chosen so
that every moment step_moments lists is the peak of some case: the plain head's, the fused
head's in both designs, the last block's backward (a vocabulary of 64 makes the head small
beside the block), inside its checkpoint when recomputing."""

import re
from dataclasses import replace

import pytest

from accounting import measure, predictions
from nn import ExecutionOptions, LlamaConfig, from_preset

NAIVE, FLASH = "naive", "flash"
PLAIN = dict(lm_head="plain")
FUSED = dict(lm_head="fused", lm_head_design="precompute")
REDO = dict(lm_head="fused", lm_head_design="recompute")

# (preset, config overrides, dtype, B, T, attention, head, recompute)
CASES = [
    # the shapes the earlier prediction missed (issue 21)
    ("gpt2-mini", {}, "fp32", 2, 200, FLASH, FUSED, False),
    ("gpt2-mini", {}, "bf16", 3, 96, NAIVE, FUSED, False),
    ("gpt2-mini", {}, "bf16", 3, 96, NAIVE, FUSED, True),
    ("gpt2-tiny", {}, "fp16", 5, 50, NAIVE, PLAIN, False),
    ("gpt2-mini", {}, "fp32", 8, 128, NAIVE, PLAIN, False),
    # the plain head: dlogits beside the logits, or (few rows) its dW
    ("gpt2-tiny", {}, "bf16", 8, 7, FLASH, PLAIN, True),
    ("gpt2-tiny", {}, "fp16", 3, 1, NAIVE, PLAIN, False),
    ("gpt2-tiny", {}, "bf16", 2, 7, FLASH, PLAIN, False),
    # the fused head, precompute: a forward block's dW, its logits' cast, its dX rows; the
    # backward's rounding (few rows)
    ("gpt2-tiny", {}, "fp32", 1, 7, NAIVE, FUSED, False),
    ("gpt2-mini", {}, "fp16", 5, 200, FLASH, FUSED, False),
    ("gpt2-tiny", {}, "bf16", 3, 64, NAIVE, FUSED, False),
    ("gpt2-tiny", {}, "fp16", 2, 50, FLASH, FUSED, True),
    ("gpt2-tiny", {"vocab_size": 64}, "fp16", 2, 50, FLASH, FUSED, False),
    ("gpt2-tiny", {"vocab_size": 64}, "fp32", 5, 64, NAIVE, FUSED, False),
    ("gpt2-tiny", {}, "bf16", 1, 1, NAIVE, FUSED, False),
    ("gpt2-mini", {}, "bf16", 5, 1, FLASH, FUSED, True),
    # the fused head, recompute: a backward block's dW or dX rows
    ("gpt2-tiny", {}, "fp16", 1, 1, NAIVE, REDO, True),
    ("gpt2-mini", {}, "fp32", 2, 1, FLASH, REDO, True),
    ("gpt2-tiny", {}, "bf16", 1, 7, FLASH, REDO, False),
    ("gpt2-mini", {}, "fp32", 3, 128, NAIVE, REDO, False),
    ("gpt2-tiny", {"vocab_size": 64}, "bf16", 5, 64, NAIVE, REDO, False),
    ("gpt2-tiny", {"vocab_size": 64}, "fp16", 8, 64, NAIVE, REDO, False),
    # the last block's backward: mlp.c_proj, naive attention (T²), in a checkpoint
    ("gpt2-tiny", {"vocab_size": 64}, "fp32", 2, 1, NAIVE, PLAIN, False),
    ("gpt2-tiny", {"vocab_size": 64}, "bf16", 3, 7, FLASH, PLAIN, False),
    ("gpt2-tiny", {"vocab_size": 64}, "fp16", 8, 1, FLASH, REDO, True),
    ("gpt2-tiny", {"vocab_size": 64}, "bf16", 2, 64, FLASH, PLAIN, True),
    ("gpt2-mini", {"vocab_size": 64}, "bf16", 8, 7, FLASH, FUSED, False),
    ("gpt2-mini", {"vocab_size": 64}, "bf16", 3, 200, NAIVE, PLAIN, True),
    ("gpt2-mini", {"vocab_size": 64}, "fp16", 5, 200, NAIVE, FUSED, False),
    ("gpt2-tiny", {"vocab_size": 64, "n_head": 1}, "fp32", 3, 50, FLASH, PLAIN, False),
    ("gpt2-mini", {"vocab_size": 64, "n_layer": 1}, "fp16", 2, 96, NAIVE, REDO, True),
    # Llama (GQA: llama-tiny's 4 query heads on 2 K/V heads; llama-mha's 3 on 3): the head's
    # moments as GPT-2's; the last block's backward at down_proj, swiglu, naive attention, and
    # (F small beside C) at gate_proj and up_proj or o_proj, inside its checkpoint or not
    ("llama-tiny", {}, "fp32", 2, 16, FLASH, PLAIN, False),
    ("llama-tiny", {}, "bf16", 3, 20, NAIVE, FUSED, False),
    ("llama-tiny", {}, "fp16", 2, 16, FLASH, REDO, True),
    ("llama-tiny", {}, "bf16", 1, 7, NAIVE, FUSED, False),
    ("llama-tiny", {"vocab_size": 64}, "fp32", 2, 64, NAIVE, PLAIN, False),
    ("llama-tiny", {"vocab_size": 64}, "bf16", 2, 16, FLASH, FUSED, True),
    ("llama-tiny", {"vocab_size": 64}, "bf16", 4, 64, FLASH, REDO, False),
    ("llama-mha", {}, "fp32", 8, 7, NAIVE, PLAIN, False),
    ("llama-mha", {}, "fp16", 3, 1, NAIVE, FUSED, True),
    ("llama-mha", {"vocab_size": 64}, "fp16", 2, 30, NAIVE, PLAIN, True),
    ("llama-mha", {"vocab_size": 64}, "fp32", 1, 1, FLASH, PLAIN, False),
    ("llama-mha", {"vocab_size": 64}, "bf16", 4, 80, NAIVE, REDO, True),
    ("llama-narrow-mlp", {}, "fp32", 2, 2, NAIVE, PLAIN, True),
    ("llama-narrow-mlp", {}, "bf16", 3, 33, FLASH, PLAIN, True),
]
PRESETS = {  # small Llamas: one K/V head per query head; an MLP narrower than C (F = C / 4)
    "llama-mha": LlamaConfig(1, 48, 3, 3, 80, 300, 80),
    "llama-narrow-mlp": LlamaConfig(1, 64, 4, 2, 16, 64, 128),
}


def _case(preset, overrides, dtype, B, T, attention, head, recompute):
    """-> (config, dtype, B, T, options)."""
    if preset in PRESETS:
        config = replace(PRESETS[preset], **overrides)
    else:
        config = from_preset(preset, **overrides)
    return config, dtype, B, T, ExecutionOptions(attention=attention, recompute=recompute, **head)


def _kind(moment):
    return re.sub(r"block \d+", "block k", moment)


def _id(case):
    preset, overrides, dtype, B, T, attention, head, recompute = case
    changed = "".join(f"-{k}={v}" for k, v in overrides.items())
    head = "-".join(head.values())
    return f"{preset}{changed}-{dtype}-B{B}-T{T}-{attention}-{head}" + "-recompute" * recompute


# fp16 at the scaler's first scale overflows in a random model's backward: the step is skipped,
# its memory is the same
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_saved_bytes_and_the_peak_equal_the_trackers(case):
    config, dtype, B, T, options = _case(*case)
    warmup = B % 2  # a cold step or a warm one: the same peak
    m = measure.measure(config, dtype, batch_size=B, seq_len=T, warmup=warmup, options=options)
    saved = predictions.predicted_saved_bytes(config, B, T, dtype, options)
    assert sum(r["saved_bytes"] for r in m.tape) == m.activation_bytes == saved
    peak = predictions.predicted_peak_bytes(config, B, T, dtype, options)
    assert m.peak_bytes == peak, predictions.predicted_peak(config, B, T, dtype, options)


def test_every_moment_is_the_peak_of_some_case():
    """So that the grid above checks every moment's tensors, not only the head's."""
    peaks, listed = set(), set()
    for case in CASES:
        config, dtype, B, T, options = _case(*case)
        peaks.add(_kind(predictions.predicted_peak(config, B, T, dtype, options)[0]))
        listed |= {_kind(name) for name in predictions.step_moments(config, B, T, dtype, options)}
    assert peaks == listed - {"the fused head's forward: the loss"}  # never the largest here


def test_the_moments_read_as_a_derivation():
    """Each moment is the persistent state and one line per tensor alive then; the saved bytes
    per token per layer are the block's lines (ACTIVATION_CONVENTION)."""
    config = from_preset("gpt2-mini")
    options = ExecutionOptions(attention="naive", lm_head="plain")
    moments = predictions.step_moments(config, 8, 128, "fp32", options)
    lines = moments["the loss's backward: dlogits"]
    assert ("dlogits (B·T, Vp)", 8 * 128 * 50304 * 4) in lines
    assert [w for w, _ in lines[:5]] == [
        f"persistent {t}" for t in predictions.predicted_state_bytes("fp32")
    ]
    C, H, T = 128, 4, 128
    assert (
        predictions.predicted_activation_bytes(config, T, "fp32", options)
        == (16 * C + H * T) * 4 + 16
    )


@pytest.mark.parametrize(
    "attention, head, recompute, zero, world",
    [
        (FLASH, FUSED, False, 0, 1),
        (NAIVE, PLAIN, False, 0, 1),
        (FLASH, PLAIN, True, 0, 1),
        (NAIVE, FUSED, True, 1, 8),
        (FLASH, FUSED, True, 2, 8),
    ],
)
def test_the_reference_7b_on_meta(attention, head, recompute, zero, world):
    """The course's 7B at T = 4,096 in bf16, counted on the meta device (as the CPU counts),
    rank 0 of R under ZeRO: the peak predicted to the byte."""
    config = from_preset("llama-7b")
    options = ExecutionOptions(attention=attention, recompute=recompute, **head)
    m = measure.measure(
        config, "bf16", "meta", 1, 4096, warmup=0, options=options, zero=zero, world_size=world
    )
    assert m.activation_bytes == predictions.predicted_saved_bytes(
        config, 1, 4096, "bf16", options, world
    )
    assert m.peak_bytes == predictions.predicted_peak_bytes(
        config, 1, 4096, "bf16", options, zero, world
    )


def test_largest_batch_takes_each_ranks_budget_under_zero():
    """On one 80 GB card the 7B's persistent state alone (16 bytes per parameter, 107.8 GB)
    does not fit; ZeRO-1 over 8 ranks leaves room for a batch (the cheap trades' more)."""
    config, GB = from_preset("llama-7b"), 80e9
    batch = {
        opts: predictions.largest_batch(config, 4096, "bf16", GB, opts, zero=1, world=8)
        for opts in predictions.OPTION_GRID
    }
    assert all(predictions.largest_batch(config, 4096, "bf16", GB, o) == 0 for o in batch)
    cheap = ExecutionOptions(attention=FLASH, recompute=True, **FUSED)
    assert batch[cheap] > batch[ExecutionOptions(attention=NAIVE, recompute=False, **PLAIN)]
    b = batch[cheap]
    assert b > 0
    assert predictions.predicted_peak_bytes(config, b, 4096, "bf16", cheap, 1, 8) <= GB
    assert predictions.predicted_peak_bytes(config, b + 1, 4096, "bf16", cheap, 1, 8) > GB
