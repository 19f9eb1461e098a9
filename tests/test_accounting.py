"""The accounting layer: FLOPs counted from real launches against ACCOUNTING.md's formulas
(written out here from the config, never taken from the code under test), bytes per parameter,
activations (tape against tracker), the tape listing against the profiler, the Chrome trace's
format, and the report printed by scripts/report.py and at the end of training."""

import gc
import json
import os
import sys
import tracemalloc

import numba
import numpy as np
import pytest

from accounting import measure, predictions, report
from nn import GPT2, ExecutionOptions, GPT2Config
from optim import AdamW
from scripts import report as report_script
from tinygrad_like import compiles, losses
from tinygrad_like.backend.cpu import compiled
from tinygrad_like.compiles import Compiles
from tinygrad_like.memory import PERSISTENT, TRACKER
from tinygrad_like.profiler import GEMMS, Profiler
from training.args import Refused
from training.data import write_tokens
from training.loop import RunConfig, Trainer

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
)
import inspect_tape  # noqa: E402
import memory_trace  # noqa: E402

B, T = 1, 8  # a small batch: the counts are exact at any size, and gpt2's LM head is big
# what the formulas below are written for: every kernel in the phase of its math, the
# (B, H, T, T) probabilities saved
NAIVE_PLAIN = ExecutionOptions(attention="naive", lm_head="plain")


def allocated_by(build):
    """-> (build(), bytes per persistent tag that building allocated, as the tracker saw)."""
    gc.collect()
    before = dict(TRACKER.current)
    built = build()
    gc.collect()  # the per-parameter tensors the optimizer's flat buffers replaced
    return built, {tag: TRACKER.current[tag] - before[tag] for tag in PERSISTENT}


@pytest.fixture(scope="module")
def gpt2():
    """GPT-2 124M with fp32 AdamW, shared by the module (it takes seconds to build), and the
    bytes the two allocated per tag."""

    def build():
        model = GPT2(GPT2Config.from_preset("gpt2"), options=NAIVE_PLAIN).flatten_parameters()
        return model, AdamW(model.named_parameters())

    (model, optimizer), allocated = allocated_by(build)
    return model, optimizer, allocated


@pytest.fixture(scope="module")
def step(gpt2):
    """One profiled forward and backward of gpt2 at B x T, through the helper the report and
    inspect_tape share. -> (profiler, tape records as dicts, tracker's activation bytes,
    launches outside records per phase)."""
    model, optimizer, _ = gpt2
    x, y = measure.random_batch(model.config.vocab_size, B, T)
    with Profiler() as prof:
        records, activations, unowned = measure.forward_backward(model, x, y)
    optimizer.zero_grad()
    return prof, records, activations, unowned


def flops(prof, phase, kernels):
    return sum(x.flops for x in prof.launches if x.phase == phase and x.name in kernels)


def linear_shapes(config):
    """(K, N) of each linear layer of a block: c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj."""
    C = config.n_embd
    return [(C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)]


def forward_gemm_flops(config, batch, seq):
    """ACCOUNTING.md, written out for GPT-2: each linear Y = XW costs 2·M·K·N (one multiply and
    one add per weight per token), the tied LM head 2·M·C·Vp (over the vocabulary padded to a
    multiple of 64: 50,304 for GPT-2's 50,257), attention's two GEMMs (QK^T and probs·V)
    2·B·H·T·T·D each. -> (GEMM FLOPs, FLOPs of the fused bias adds: M·N per linear)."""
    C, H, L = config.n_embd, config.n_head, config.n_layer
    V = -(-config.vocab_size // 64) * 64
    M, D = batch * seq, config.n_embd // config.n_head
    attention = 2 * (2 * batch * H * seq * seq * D)
    per_layer = sum(2 * M * k * n for k, n in linear_shapes(config)) + attention
    bias = L * sum(M * n for _, n in linear_shapes(config))
    return L * per_layer + 2 * M * C * V, bias


# ---------------------------------------------------------------- FLOPs


def test_forward_matmul_flops_equal_the_formula(gpt2, step):
    prof = step[0]
    gemm, bias = forward_gemm_flops(gpt2[0].config, B, T)
    # the forward matmul kernels count the fused bias epilogue (M·N per linear) with the GEMM
    assert flops(prof, "forward", GEMMS) == gemm + bias
    assert predictions.gemm_flops(gpt2[0].config, B, T) == (gemm, bias)


def test_backward_gemms_are_twice_the_forward_gemms(gpt2, step):
    """dX = dY·W^T and dW = X^T·dY for every forward GEMM: exactly twice the forward GEMM FLOPs.
    The comparison leaves out the forward's fused bias adds: the bias gradient is a sum kernel
    over dY (M·N per linear), not a GEMM."""
    prof = step[0]
    config = gpt2[0].config
    gemm, bias = forward_gemm_flops(config, B, T)
    assert flops(prof, "backward", GEMMS) == 2 * (flops(prof, "forward", GEMMS) - bias) == 2 * gemm
    # the backward's sum kernels: every linear's bias gradient, and the position embedding's
    # gradient summed over the batch (wpe's (T, C) was broadcast over B in the forward)
    assert flops(prof, "backward", ("sum",)) == bias + B * T * config.n_embd


def test_gemms_are_2n_forward_and_4n_backward_per_token(gpt2, step):
    """Within 1%: the position embedding, layernorms and biases are parameters without a GEMM,
    attention's GEMMs have no parameters (and are small at T=8)."""
    prof = step[0]
    n = gpt2[0].num_parameters()
    assert flops(prof, "forward", GEMMS) / (B * T) / n == pytest.approx(2, rel=0.01)
    assert flops(prof, "backward", GEMMS) / (B * T) / n == pytest.approx(4, rel=0.01)


def test_backward_work_outside_the_records(gpt2, step):
    """What the backward launches outside any record: every parameter's gradient added into
    its .grad (N FLOPs, + pad·C for wte's padding rows; the tied wte twice, + Vp·C) and the
    residual stream's gradient summed over its two uses in each half of every block (2·L·B·T·C).
    At small batch that is a visible share of the backward: N/(B·T) per token on top of the
    4N."""
    c, n = gpt2[0].config, gpt2[0].num_parameters()
    Vp = 50_304
    outside = step[3]
    assert outside["forward"].launches == 0
    residual_sums = 2 * c.n_layer * B * T * c.n_embd
    assert (
        outside["backward"].flops
        == n + (Vp - c.vocab_size) * c.n_embd + Vp * c.n_embd + residual_sums
    )


# ---------------------------------------------------------------- memory

HALF = {"weights": 2, "gradients": 2, "master": 4, "adam_m": 4, "adam_v": 4}
FULL = {"weights": 4, "gradients": 4, "master": 0, "adam_m": 4, "adam_v": 4}


def stored_elements(model):
    """The N parameters plus wte's zero padding rows (vocabulary padded to a multiple of 64):
    every buffer of the training state holds both."""
    c = model.config
    return model.num_parameters() + (-(-c.vocab_size // 64) * 64 - c.vocab_size) * c.n_embd


def test_gpt2_fp32_state_is_16_bytes_per_parameter(gpt2):
    """16 bytes per stored element: 16 (N + 47·768) / N = 16.0046 bytes per parameter."""
    model, _, allocated = gpt2
    n, stored = model.num_parameters(), stored_elements(model)
    assert n == 124_439_808 and stored == n + 36_096
    assert {tag: allocated[tag] / stored for tag in PERSISTENT} == FULL
    assert sum(allocated.values()) == 16 * stored == 1_991_614_464


@pytest.mark.parametrize("dtype, expected", [("fp32", FULL), ("fp16", HALF), ("bf16", HALF)])
def test_state_bytes_per_parameter(dtype, expected):
    def build():
        model = GPT2(GPT2Config.from_preset("gpt2-mini")).flatten_parameters(dtype)
        return model, AdamW(model.named_parameters())

    (model, _), allocated = allocated_by(build)
    n = stored_elements(model)
    assert {tag: allocated[tag] / n for tag in PERSISTENT} == expected
    assert sum(allocated.values()) == 16 * n


def test_tracker_activations_equal_the_tapes_saved_bytes(gpt2, step):
    _, records, activations, _ = step
    assert activations > 0
    assert activations == sum(r["saved_bytes"] for r in records)
    # and the convention the report prints: (16·C + H·T) elements + two layernorms' fp32
    # mean and rstd, per token per layer
    c = gpt2[0].config
    per_layer = measure.group(records, lambda r: measure.layer_of(r["scope"]))
    blocks = [per_layer[f"transformer.h.{i}"]["saved_bytes"] for i in range(c.n_layer)]
    assert blocks == [B * T * ((16 * c.n_embd + c.n_head * T) * 4 + 16)] * c.n_layer


# ---------------------------------------------------------------- the tape listing


def test_tape_totals_equal_the_profilers(gpt2):
    model, optimizer, _ = gpt2
    result = inspect_tape.inspect(model, *measure.random_batch(model.config.vocab_size, B, T))
    optimizer.zero_grad()
    records, outside, prof = result["records"], result["outside_records"], result["profiler"]
    assert outside["forward"]["launches"] == 0  # every forward launch belongs to a record
    assert sum(r["fwd_flops"] for r in records) == prof["forward"]["flops"]
    # the backward adds gradients across a tensor's uses and into each .grad outside records
    assert outside["backward"]["launches"] > 0
    assert (
        sum(r["bwd_flops"] for r in records) + outside["backward"]["flops"]
        == prof["backward"]["flops"]
    )
    for groups in (result["per_op"], result["per_layer"]):
        for field in ("fwd_flops", "bwd_flops", "saved_bytes"):
            assert sum(g[field] for g in groups.values()) == sum(r[field] for r in records)
    json.dumps(result)  # what --json writes
    assert "equal" in inspect_tape.format_check(result)
    assert "DIFFERENT" not in inspect_tape.format_check(result)


def test_layer_of():
    assert measure.layer_of("transformer.h.3.mlp.c_fc") == "transformer.h.3"
    assert measure.layer_of("transformer.h.11") == "transformer.h.11"
    assert measure.layer_of("transformer.wte") == "transformer.wte"
    assert measure.layer_of("") == "(model)"


# ---------------------------------------------------------------- the trace


@pytest.fixture
def data_dir(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 50257, 4000)
    for name in ("train.bin", "val.bin"):
        write_tokens(tmp_path / name, tokens)
    return tmp_path


REQUIRED = ("name", "ph", "ts", "pid", "tid")


def test_memory_trace_writes_a_valid_chrome_trace_and_plot(data_dir, tmp_path, capsys):
    out = tmp_path / "trace"
    memory_trace.main(
        [
            "--model",
            "gpt2-tiny",
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--seq-len",
            "16",
            "--data-dir",
            str(data_dir),
            "--out-dir",
            str(out),
            "--device",
            "cpu",
        ]
    )
    with open(out / "trace.json") as f:
        events = json.load(f)["traceEvents"]
    for e in events:
        assert all(key in e for key in REQUIRED), e
        if e["ph"] == "X":
            assert e["dur"] > 0 and e["args"]["flops"] >= 0
        if e["ph"] == "C":
            assert set(e["args"]) == set(TRACKER.current)
    kinds = {e["ph"] for e in events}
    assert {"X", "C", "M"} <= kinds
    assert {e["cat"] for e in events if e["ph"] == "X"} == {"forward", "backward", "optimizer"}
    assert (out / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "activations" in printed and "temporaries" in printed


def test_phase_spans_follow_the_step():
    """A step is forward, backward, optimizer, in that order, one span each."""
    model = GPT2(GPT2Config.from_preset("gpt2-tiny")).flatten_parameters()
    optimizer = AdamW(model.named_parameters())
    x, y = measure.random_batch(model.config.vocab_size, 2, 8)
    with Profiler(timing=True) as prof:
        measure.forward_backward(model, x, y)
        optimizer.step()
        optimizer.zero_grad()
    spans = prof.phase_spans()
    assert [s[0] for s in spans] == ["forward", "backward", "optimizer"]
    assert all(start <= end for _, start, end in spans)
    assert all(a[2] <= b[1] for a, b in zip(spans, spans[1:]))


def test_a_deferred_profiler_counts_what_a_profiler_counts():
    """Profiler(deferred=True) counts a launch when its launches are read, not as it runs
    (but for those a tape record counts as they run): the same launches, phases, math labels,
    FLOPs, exps and bytes as a profiler that counts at once."""
    model = GPT2(GPT2Config.from_preset("gpt2-tiny")).flatten_parameters()
    optimizer = AdamW(model.named_parameters())
    x, y = measure.random_batch(model.config.vocab_size, 2, 8)

    def fields(prof):
        return [(k.name, k.phase, k.math, k.flops, k.exps, k.bytes) for k in prof.launches]

    profs = []
    for deferred in (False, True):
        with Profiler(deferred=deferred) as prof:
            measure.forward_backward(model, x, y)
            optimizer.step()
            optimizer.zero_grad()
            if deferred:  # the optimizer's launches wait (a tape record counts the others')
                assert [k[0] for k in prof._pending] == ["grad_norm_sq", "adamw_step", "fill"]
        profs.append(prof)
    assert fields(profs[0]) == fields(profs[1])
    assert {k.math for k in profs[1].launches} >= {"forward", "backward", "optimizer"}


# ---------------------------------------------------------------- the report


def test_report_for_a_small_model():
    config = GPT2Config.from_preset("gpt2-tiny")
    m = measure.measure(config, "bf16", batch_size=2, seq_len=16, warmup=0, options=NAIVE_PLAIN)
    text = report.format_report(m)
    for section in (
        "-- parameters N",
        "-- FLOPs per token",
        "-- persistent training memory",
        "-- activations saved",
        "-- kernel launches",
        "-- op census: one training",
        "-- op census: one decode step, M = 1",
    ):
        assert section in text
    assert "NO" not in text.split() and "DIFFERENT" not in text
    # the decode step is one token: its LM head is a (1, C) x (C, Vp) GEMM under no_grad
    head = [
        x
        for x in m.decode.launches
        if x.name == "matmul_nt" and x.flops == 2 * config.n_embd * config.padded_vocab_size
    ]
    assert len(head) == 1
    assert m.unowned["backward"].launches > 0 and m.unowned["forward"].launches == 0


@compiled.kernel
def _doubled(x, out):
    for i in numba.prange(x.shape[0]):
        out[i] = 2 * x[i]


def test_a_kernels_first_call_per_dtype_is_counted_as_a_compile():
    """The compiles that the report, generate.py and the decode meter keep out of their
    times: each new variant (a kernel's first call with its dtypes), compiled or loaded from
    Numba's disk cache, and nothing else."""
    x, out = np.arange(8, dtype=np.float32), np.empty(8, np.float32)
    before = compiles.so_far()
    _doubled(x, out)
    first = compiles.so_far() - before
    assert first.count == 1 and first.seconds > 0
    _doubled(x, out)
    assert compiles.so_far() - before == first  # warm: no compile
    _doubled(x.astype(np.float64), np.empty(8))  # another dtype: another variant
    assert (compiles.so_far() - before).count == 2
    np.testing.assert_array_equal(out, 2 * x)


def test_the_reports_times_hold_no_compile(monkeypatch):
    """The issue: a decode census with flash_attention_fwd at 699 ms and gelu_fwd at 137 ms
    of Numba compiles. A profiled step that compiled is run again, the decode step is profiled
    after an untimed one, and the compiles are a line of their own. (The compile is made up:
    which kernels are cold depends on what ran before in the process.)"""
    profiled = []
    watched = measure.watched
    monkeypatch.setattr(measure, "watched", lambda run: profiled.append(1) or watched(run))
    compiling = Compiles(1, 2.5)  # seen from the first profiled step on
    monkeypatch.setattr(compiles, "so_far", lambda: compiling if profiled else Compiles())
    config = GPT2Config.from_preset("gpt2-tiny")
    m = measure.measure(config, batch_size=1, seq_len=8, warmup=0)
    assert len(profiled) == 2 and m.compiles == compiling
    assert m.cached_positions == 9  # the prompt's 8, then the untimed token
    head = [x for x in m.decode.launches if x.name == "matmul_nt"]
    assert len(head) == 1  # one token profiled
    text = report.format_report(m)
    assert (
        "\n\n-- compiles: 1 kernel variant compiled (or loaded from Numba's disk cache) on "
        "first use, 2.50 s, kept out of every time\n\n"
    ) in text
    counts = report.format_report(m, counts_only=True)
    for timed in ("compiles", "op census", "ms measured", "achieved", "machine peaks", " on cpu"):
        assert timed not in counts


def test_nothing_in_proportion_to_the_batch_is_allocated_before_the_fit_check(capsys):
    """The issue: scripts/report.py drew its B x T batch first, 1.6 GB at B = 10^6."""
    tracemalloc.start()
    try:
        with pytest.raises(Refused):
            report_script.main(["--model", "gpt2-tiny", "--batch-size", str(10**6)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # the batch alone: 512 MB of int64 ids
    assert "error: gpt2-tiny's training step at --batch-size 1000000" in capsys.readouterr().err


def test_trainer_prints_the_report_at_the_end(data_dir, tmp_path, capsys):
    cfg = RunConfig(
        model="gpt2-tiny",
        data_dir=str(data_dir),
        batch_size=2,
        seq_len=16,
        steps=1,
        eval_every=0,
        out=str(tmp_path / "run"),
    )
    Trainer(cfg).run()
    printed = capsys.readouterr().out
    assert "== accounting:" in printed and "-- op census: one decode step" in printed


@pytest.mark.parametrize(
    "attention, lm_head, recompute",
    [
        ("naive", "plain", False),
        ("flash", "fused", False),
        ("flash", "plain", True),
        ("naive", "fused", True),
    ],
)
def test_memory_trades_predicted_equal_measured(attention, lm_head, recompute):
    """The saved bytes and the tracker's peak of a step, predicted from the config and the
    options, equal what the tape and the tracker measured: the formulas the largest-batch table
    uses are the ones the measurement confirms."""
    config = GPT2Config.from_preset("gpt2-tiny")
    options = ExecutionOptions(attention=attention, lm_head=lm_head, recompute=recompute)
    m = measure.measure(config, "fp32", batch_size=2, seq_len=48, warmup=0, options=options)
    per_layer = measure.group(m.tape, lambda r: measure.layer_of(r["scope"]))
    block = per_layer["transformer.h.0"]["saved_bytes"] / (2 * 48)
    assert block == predictions.predicted_activation_bytes(config, 48, "fp32", options)
    assert sum(r["saved_bytes"] for r in m.tape) == predictions.predicted_saved_bytes(
        config, 2, 48, "fp32", options
    )
    assert m.peak_bytes == predictions.predicted_peak_bytes(config, 2, 48, "fp32", options)
    text = report.format_report(m, budget_bytes=1e9)
    assert "largest batch at T = 48 in a budget of 1.0 GB" in text
    # FLOPs by the phase of their math first (2N + 4N), then by the one they ran in, and why
    assert "all: math of  GEMMs: math of  all: ran in  GEMMs: ran in" in text
    moved = lm_head == "fused" or recompute
    assert ("'ran in' differs from 'math of' because" in text) == moved
    assert ("'ran in' equals 'math of'" in text) != moved


def test_the_fused_heads_recompute_design_saves_what_is_predicted():
    """x, an fp32 log-sum-exp and the int64 target per token: no logits, no gradients."""
    config = GPT2Config.from_preset("gpt2-tiny")
    options = ExecutionOptions(lm_head_design="recompute")
    m = measure.measure(config, "fp32", batch_size=2, seq_len=48, warmup=0, options=options)
    assert sum(r["saved_bytes"] for r in m.tape) == predictions.predicted_saved_bytes(
        config, 2, 48, "fp32", options
    )
    assert predictions.predicted_head_bytes(config, 96, "fp32", options) == 96 * (32 * 4 + 4 + 8)
    assert "LM head fused (recompute)" in report.format_report(m, budget_bytes=1e9)


@pytest.mark.parametrize("block_rows", [256, 32], ids=["one-block", "three-blocks"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_fused_heads_peak_predicted_equal_measured(monkeypatch, dtype, block_rows):
    """The fused head's blocks: one (rows, Vp) fp32 buffer (its dlogits overwrite its logits),
    beside a block's dW share and from the second block on the sum so far, and in bf16 beside
    the logits GEMM's output while it is cast to fp32 (tests/test_predictions.py has the grid)."""
    monkeypatch.setattr(losses, "HEAD_BLOCK_ROWS", block_rows)
    config = GPT2Config.from_preset("gpt2-tiny")
    options = ExecutionOptions(attention="flash", lm_head="fused")
    m = measure.measure(config, dtype, batch_size=2, seq_len=48, warmup=0, options=options)
    assert m.peak_bytes == predictions.predicted_peak_bytes(config, 2, 48, dtype, options)


def test_largest_batch_fits_and_the_next_does_not():
    config = GPT2Config.from_preset("gpt2-mini")
    budget = 2e9
    for options in (NAIVE_PLAIN, ExecutionOptions(attention="flash", lm_head="fused")):
        b = predictions.largest_batch(config, 128, "fp32", budget, options)
        assert b > 0
        assert predictions.predicted_peak_bytes(config, b, 128, "fp32", options) <= budget
        assert predictions.predicted_peak_bytes(config, b + 1, 128, "fp32", options) > budget
