"""The meta device (backend/meta) counts a training step exactly as the CPU runs it: the same
launches in the same order with the same FLOPs, bytes and exps, the same tape, and the same
births and deaths of buffers in the memory tracker, for every execution option; without
allocating, so a 1.5B model's step is counted in seconds. What needs values is refused."""

import gc
import importlib
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import tinygrad_like.functional as F
from accounting import measure, report
from accounting.predictions import predicted_collectives, predicted_state_bytes, stored_elements
from nn import GPT2, ExecutionOptions, GPT2Config, LlamaConfig, build, from_preset
from optim import AdamW, LossScaler, clip_grad_norm_, step
from scripts import report as report_script
from tinygrad_like import Tensor, backend, distributed, no_grad
from tinygrad_like.backend.meta import MetaArray, NoValues
from tinygrad_like.memory import TAGS, TRACKER, root
from tinygrad_like.profiler import Profiler
from training.args import Refused

TINY = GPT2Config.from_preset("gpt2-tiny")  # L=2, C=32, H=2, context 64
SMALL_VOCAB = GPT2Config(n_layer=1, n_head=3, n_embd=48, n_positions=80, vocab_size=300)
DROPOUT = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=500, dropout=0.1)
LLAMA = from_preset("llama-tiny")  # L=2, C=32, 4 query heads sharing 2 K/V heads
LLAMA_MHA = LlamaConfig(1, 48, 3, 3, 80, 300, 80)  # one K/V head per query head

CASES = [  # config, dtype, batch, seq_len, options
    (TINY, "fp32", 1, 64, ExecutionOptions()),
    (TINY, "bf16", 2, 48, ExecutionOptions(attention="naive", lm_head="plain")),
    (TINY, "bf16", 1, 64, ExecutionOptions(recompute=True)),
    (TINY, "fp32", 3, 17, ExecutionOptions(attention="naive", recompute=True)),
    (SMALL_VOCAB, "fp32", 5, 64, ExecutionOptions(lm_head_design="recompute")),  # 2 head blocks
    (SMALL_VOCAB, "bf16", 6, 70, ExecutionOptions(lm_head="plain", recompute=True)),
    (DROPOUT, "bf16", 2, 33, ExecutionOptions()),
    (LLAMA, "fp32", 2, 40, ExecutionOptions()),
    (LLAMA, "bf16", 3, 64, ExecutionOptions(attention="naive", lm_head="plain")),
    (LLAMA, "bf16", 1, 33, ExecutionOptions(recompute=True, lm_head_design="recompute")),
    (LLAMA_MHA, "fp32", 5, 64, ExecutionOptions(attention="naive", recompute=True)),
]
IDS = [
    f"{type(c).__name__}-{c.n_embd}C-{d}-B{b}xT{t}-{o.attention}-{o.lm_head}"
    for c, d, b, t, o in CASES
]


def _launches(prof):
    return [(x.name, x.phase, x.math, x.flops, x.bytes, x.exps) for x in prof.launches]


def _tape(records):
    return [{k: v for k, v in r.items() if k != "seq"} for r in records]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_measured_step_counts_on_meta_what_it_counts_on_the_cpu(case):
    config, dtype, B, T, options = case
    got = {}
    for device in ("cpu", "meta"):
        m = measure.measure(config, dtype, device, B, T, warmup=1, options=options)
        got[device] = m
    cpu, meta = got["cpu"], got["meta"]
    assert _launches(meta.step) == _launches(cpu.step)
    assert _launches(meta.decode) == _launches(cpu.decode)
    assert _tape(meta.tape) == _tape(cpu.tape)
    for field in ("n_params", "parameters", "persistent", "activation_bytes", "peak_bytes"):
        assert getattr(meta, field) == getattr(cpu, field), field
    for phase, unowned in cpu.unowned.items():
        assert vars(meta.unowned[phase]) == vars(unowned), phase
    assert meta.skipped is None and meta.peak is None  # no overflow decision, nothing timed


def _recorded_step(device, config, dtype, B, T, options, comm=None, zero=0):
    """One training step after a warm-up: every buffer's birth and death as (tag, bytes), the
    peak per tag above the step's start, the launches and the collectives."""
    model = build(config, device=device, options=options)
    model.flatten_parameters(dtype, shards=comm.size if comm and zero else 1)
    optimizer = AdamW(model.named_parameters(), comm=comm, zero=zero)
    x, y = measure.random_batch(config.vocab_size, B, T)
    step.train_on(model, optimizer, [(x, y)])
    gc.collect()
    TRACKER.start_recording()
    try:
        with Profiler() as prof, optimizer.comm.recording() as collectives:
            step.train_on(model, optimizer, [(x, y)])
    finally:
        events = TRACKER.stop_recording()
    start = {tag: n for _, tag, n in events[: len(TAGS)]}
    peaks = {tag: TRACKER.peak[tag] - start[tag] for tag in TAGS}
    sent = [(c.name, c.what, c.nbytes, c.sent) for c in collectives]
    return [(tag, delta) for _, tag, delta in events[len(TAGS) :]], peaks, _launches(prof), sent


@pytest.mark.parametrize("case", CASES[:4] + CASES[7:9], ids=IDS[:4] + IDS[7:9])
def test_every_allocation_and_free_is_the_cpus(case):
    cpu = _recorded_step("cpu", *case)
    assert len(cpu[0]) > 100
    assert _recorded_step("meta", *case) == cpu


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_a_rank_of_a_zero_world_counts_on_meta_what_it_counts_on_the_cpu(zero):
    """MetaWorld runs one rank's side of every collective; on CPU buffers too (their sums are
    then wrong, their counts not), so the CPU's counts of rank 1 of 3 are there to compare."""
    case = (SMALL_VOCAB, "bf16", 2, 32, ExecutionOptions())
    cpu = _recorded_step("cpu", *case, comm=distributed.MetaWorld(1, 3), zero=zero)
    meta = _recorded_step("meta", *case, comm=distributed.MetaWorld(1, 3), zero=zero)
    assert meta == cpu
    whats = [what for _, what, _, _ in cpu[3]]
    # the loss is summed over the ranks when read, after the step's kernels (optim/step.py)
    assert whats == (["gradients", "norm²", "weights", "loss"] if zero else ["gradients", "loss"])


def test_a_world_of_ranks_is_measured_on_meta_only(monkeypatch, capsys):
    """Rank 0 of R is counted with one model: AdamW's R shards are equal, so every rank holds
    its bytes (the issue: a model was built per rank). R is bounded by the flat buffers'
    elements (a shard holds one at least), one line past it."""
    built = []
    monkeypatch.setattr(measure, "build", lambda *a, **k: built.append(1) or build(*a, **k))
    m = measure.measure(TINY, "bf16", "meta", 1, 32, zero=2, world_size=4)
    assert len(built) == 1 and m.world_size == 4
    per_param = predicted_state_bytes("bf16", zero=2, world=4)
    assert m.persistent == {tag: per_param[tag] * m.elements for tag in per_param}
    sent = [(c.name, c.what, c.nbytes) for c in m.collectives]
    assert sorted(sent) == sorted(predicted_collectives(m.elements, "bf16", 2, 4))
    assert "per rank of 4, ZeRO-2: rank 0's counted, and every rank holds as much" in (
        report.format_report(m)
    )
    with pytest.raises(ValueError, match="meta device only"):
        measure.measure(TINY, "fp32", "cpu", 1, 8, world_size=2)
    elements = stored_elements(TINY)
    argv = ["--model", "gpt2-tiny", "--device", "meta", "--zero", "1", "--world-size"]
    with pytest.raises(Refused):
        report_script.main(argv + [str(elements + 1)])
    assert capsys.readouterr().err == (
        f"error: --world-size {elements + 1:,} is more ranks than the model's {elements:,} "
        f"stored parameters (a rank's ZeRO shard holds one at least): use at most {elements:,}\n"
    )


def test_the_meta_device_allocates_nothing_in_proportion_to_the_batch():
    """The issue: the report drew a real B x T batch on meta, a MemoryError at B = 10^6. Its
    batch is shapes now, counted as the CPU counts its ids (the test above), and a step of a
    million sequences allocates no more than one of a single sequence."""
    peaks = {}
    for batch in (1, 10**6):
        tracemalloc.start()
        try:
            argv = ["--model", "gpt2-tiny", "--device", "meta", "--lm-head", "plain"]
            report_script.main(argv + ["--batch-size", str(batch), "--counts-only"])
            peaks[batch] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peaks[10**6] < 2 * peaks[1] + (16 << 20)  # the batch alone: 512 MB of int64 ids


def test_views_have_numpys_shapes_strides_and_base():
    host = np.empty((4, 6, 8), np.float32)
    meta = MetaArray(host.shape, host.dtype)
    assert meta.strides == host.strides and meta.nbytes == host.nbytes
    for view in (
        lambda a: a[1:3],
        lambda a: a[:, 2],
        lambda a: a[..., ::2],
        lambda a: a[None, 0, :, 1:],
        lambda a: a.transpose(2, 0, 1),
        lambda a: a.T[1:],
        lambda a: a[1:3].reshape(-1),
        lambda a: a[:, 1:].reshape(4, 5, 2, 4),
    ):
        h, m = view(host), view(meta)
        assert (m.shape, m.strides, m.dtype) == (h.shape, h.strides, h.dtype)
        assert root(m) is meta
    # a reshape NumPy cannot do as a view is a copy: a new buffer
    copied = meta.transpose(2, 0, 1).reshape(-1)
    assert copied.shape == (192,) and copied.base is None
    b = backend.meta.xp.broadcast_to(meta[:, :1], (4, 3, 8))
    s = np.broadcast_to(host[:, :1], (4, 3, 8))
    assert (b.shape, b.strides) == (s.shape, s.strides) and root(b) is meta
    parts = backend.meta.xp.split(meta, [2, 5], axis=1)
    assert [(p.shape, p.strides) for p in parts] == [
        (p.shape, p.strides) for p in np.split(host, [2, 5], axis=1)
    ]


def test_a_model_builds_on_meta_without_drawing_or_allocating():
    t0 = time.perf_counter()
    model = GPT2(GPT2Config.from_preset("gpt2-xl"), device="meta")  # 1.5B parameters
    assert time.perf_counter() - t0 < 1.0
    assert all(isinstance(p.data, MetaArray) for p in model.parameters())
    assert model.num_parameters() == GPT2Config.from_preset("gpt2-xl").num_parameters()


def test_the_reference_7b_builds_on_meta_at_once():
    config = from_preset("llama-7b")
    t0 = time.perf_counter()
    model = build(config, device="meta")
    assert time.perf_counter() - t0 < 1.0
    assert model.num_parameters() == config.num_parameters() == 6_738_415_616


def test_the_cpu_model_is_drawn_as_before():
    """Building through layers.parameter keeps the CPU's one stream of draws, in order."""
    model = GPT2(TINY, device="cpu", seed=3)
    rng = np.random.default_rng(3)
    wte = rng.normal(0.0, 0.02, (TINY.vocab_size, TINY.n_embd)).astype(np.float32)
    wpe = rng.normal(0.0, 0.02, (TINY.n_positions, TINY.n_embd)).astype(np.float32)
    c_attn = rng.normal(0.0, 0.02, (TINY.n_embd, 3 * TINY.n_embd)).astype(np.float32)
    state = model.state_dict()
    assert np.array_equal(state["transformer.wte.weight"], wte)
    assert np.array_equal(state["transformer.wpe.weight"], wpe)
    assert np.array_equal(state["transformer.h.0.attn.c_attn.weight"], c_attn)


def test_gpt2_124m_is_measured_on_meta_in_seconds():
    t0 = time.perf_counter()
    m = measure.measure(GPT2Config.from_preset("gpt2"), "bf16", "meta", 1, 1024)
    assert time.perf_counter() - t0 < 20
    assert m.step.by_phase()["forward"]["flops"] > 2 * m.n_params * 1024


# ---------------------------------------------------------------- what needs values


def test_reading_a_meta_array_raises_the_clear_error():
    a = backend.get("meta").empty((2, 3), np.float32)
    t = Tensor(a)
    for read in (
        lambda: np.asarray(a),
        lambda: float(a[0, 0]),
        lambda: bool(a),
        lambda: a == a,
        lambda: t.numpy(),
        lambda: t.item(),
        lambda: a.max(),
    ):
        with pytest.raises(NoValues, match="the meta device holds shapes, not values"):
            read()
    assert isinstance(NoValues("x"), RuntimeError)  # a CLI's `error:` line (training/args.py)


def test_a_loss_and_a_gradient_norm_are_refused_but_the_step_runs():
    model = GPT2(TINY, device="meta").flatten_parameters("bf16")
    optimizer = AdamW(model.named_parameters(), grad_clip=1.0)
    x, y = measure.random_batch(TINY.vocab_size, 2, 16)
    _, loss = model(x, y)
    with pytest.raises(NoValues):
        loss.item()
    loss.backward()
    assert optimizer.step() == (None, None)  # norm and overflow unknown
    assert step.train_on(model, optimizer, [(x, y)]) == (None, None, None)
    with pytest.raises(NoValues):
        clip_grad_norm_(model.parameters(), 1.0)


def test_fp16_is_refused_on_meta():
    with pytest.raises(NoValues, match="fp16's loss scaler"):
        measure.measure(TINY, "fp16", "meta")
    model = GPT2(TINY, device="meta").flatten_parameters("fp16")
    optimizer = AdamW(model.named_parameters())
    with pytest.raises(NoValues, match="overflow skip"):
        step.train_on(model, optimizer, [measure.random_batch(TINY.vocab_size, 1, 8)], LossScaler())


def test_generation_is_refused_on_meta():
    model = GPT2(TINY, device="meta")
    with pytest.raises(NoValues):
        model.generate([[1, 2, 3]], 2)
    with no_grad():  # a forward alone needs no values
        logits, _ = model(np.zeros((1, 4), np.int64))
    assert logits.shape == (1, 4, TINY.vocab_size)


def test_accounting_runs_on_meta_and_refuses_token_files(capsys, tmp_path):
    report_script.main(["--model", "gpt2-tiny", "--device", "meta", "--dtype", "bf16"])
    out = capsys.readouterr().out
    assert "bf16 on meta" in out and "the step was counted, not run" in out
    with pytest.raises(Refused):
        report_script.main(["--model", "gpt2-tiny", "--device", "meta", "--data", str(tmp_path)])
    assert "error: the meta device holds shapes, not values: --data" in capsys.readouterr().err
    with pytest.raises(Refused):
        report_script.main(["--model", "gpt2-tiny", "--device", "meta", "--dtype", "fp16"])
    assert "error: the meta device holds shapes" in capsys.readouterr().err


def test_the_trainer_refuses_meta(capsys):
    from training import cli

    with pytest.raises(Refused):
        cli.main(["--device", "meta", "--steps", "1"])
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        "error: --device meta cannot train: it holds shapes, not values (no token files, no "
        "loss); count a training step on it with python scripts/report.py --device meta"
    )


def test_ops_check_shapes_on_meta():
    a = Tensor(backend.get("meta").empty((2, 3), np.float32))
    b = Tensor(backend.get("meta").empty((4, 5), np.float32))
    with pytest.raises(ValueError):
        F.matmul(a, b)
    with pytest.raises(ValueError):
        a + b


def test_the_benchmark_refuses_meta(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    bench = importlib.import_module("bench")  # it imports its siblings by their names
    with pytest.raises(Refused):
        bench.main(["--model", "gpt2-tiny", "--seq-len", "32", "--device", "meta"])
    assert "error: --device meta counts a step without running it" in capsys.readouterr().err
