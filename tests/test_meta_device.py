"""The meta device (backend/meta) counts a training step exactly as the CPU runs it: the same
launches in the same order with the same FLOPs, bytes and exps, the same tape, and the same
births and deaths of buffers in the memory tracker, for every execution option; without
allocating, so a 1.5B model's step is counted in seconds. What needs values is refused."""

import gc
import time

import numpy as np
import pytest

import tinygrad_like.ops as F
from nn import GPT2, ExecutionOptions, GPT2Config
from optim import AdamW, LossScaler, clip_grad_norm_
from scripts import accounting
from tinygrad_like import Tensor, backend, no_grad
from tinygrad_like.backend.meta import MetaArray, NoValues
from tinygrad_like.memory import TAGS, TRACKER, root
from tinygrad_like.profiler import Profiler
from training import measure, step
from training.args import Refused

TINY = GPT2Config.from_preset("gpt2-tiny")  # L=2, C=32, H=2, context 64
SMALL_VOCAB = GPT2Config(n_layer=1, n_head=3, n_embd=48, n_positions=80, vocab_size=300)
DROPOUT = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=500, dropout=0.1)

CASES = [  # config, dtype, batch, seq_len, options
    (TINY, "fp32", 1, 64, ExecutionOptions()),
    (TINY, "bf16", 2, 48, ExecutionOptions(attention="naive", lm_head="plain")),
    (TINY, "bf16", 1, 64, ExecutionOptions(recompute=True)),
    (TINY, "fp32", 3, 17, ExecutionOptions(attention="naive", recompute=True)),
    (SMALL_VOCAB, "fp32", 5, 64, ExecutionOptions(lm_head_design="recompute")),  # 2 head blocks
    (SMALL_VOCAB, "bf16", 6, 70, ExecutionOptions(lm_head="plain", recompute=True)),
    (DROPOUT, "bf16", 2, 33, ExecutionOptions()),
]
IDS = [f"{c.n_embd}C-{d}-B{b}xT{t}-{o.attention}-{o.lm_head}" for c, d, b, t, o in CASES]


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


def _recorded_step(device, config, dtype, B, T, options):
    """Every buffer's birth and death in one training step after a warm-up, as (tag, bytes),
    and the peak per tag above the step's start."""
    model = GPT2(config, device=device, options=options)
    optimizer = AdamW(model.named_parameters(), dtype=dtype)
    x, y = measure.random_batch(config.vocab_size, B, T)
    step.train_on(model, optimizer, [(x, y)])
    gc.collect()
    TRACKER.start_recording()
    try:
        with Profiler():  # so the launches run through the counting path, as measure's
            step.train_on(model, optimizer, [(x, y)])
    finally:
        events = TRACKER.stop_recording()
    start = {tag: n for _, tag, n in events[: len(TAGS)]}
    peaks = {tag: TRACKER.peak[tag] - start[tag] for tag in TAGS}
    return [(tag, delta) for _, tag, delta in events[len(TAGS) :]], peaks


@pytest.mark.parametrize("case", CASES[:4], ids=IDS[:4])
def test_every_allocation_and_free_is_the_cpus(case):
    cpu_events, cpu_peaks = _recorded_step("cpu", *case)
    meta_events, meta_peaks = _recorded_step("meta", *case)
    assert len(cpu_events) > 100
    assert meta_events == cpu_events
    assert meta_peaks == cpu_peaks


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
    model = GPT2(TINY, device="meta")
    optimizer = AdamW(model.named_parameters(), dtype="bf16", grad_clip=1.0)
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
    model = GPT2(TINY, device="meta")
    optimizer = AdamW(model.named_parameters(), dtype="fp16")
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
    accounting.main(["--model", "gpt2-tiny", "--device", "meta", "--dtype", "bf16"])
    out = capsys.readouterr().out
    assert "bf16 on meta" in out and "the step was counted, not run" in out
    with pytest.raises(Refused):
        accounting.main(["--model", "gpt2-tiny", "--device", "meta", "--data", str(tmp_path)])
    assert "error: the meta device holds shapes, not values: --data" in capsys.readouterr().err
    with pytest.raises(Refused):
        accounting.main(["--model", "gpt2-tiny", "--device", "meta", "--dtype", "fp16"])
    assert "error: the meta device holds shapes" in capsys.readouterr().err


def test_the_trainer_refuses_meta(capsys):
    from training import cli

    with pytest.raises(Refused):
        cli.main(["--device", "meta", "--steps", "1"])
    assert "error: the meta device holds shapes, not values: training" in capsys.readouterr().err


def test_ops_check_shapes_on_meta():
    a = Tensor(backend.get("meta").empty((2, 3), np.float32))
    b = Tensor(backend.get("meta").empty((4, 5), np.float32))
    with pytest.raises(ValueError):
        F.matmul(a, b)
    with pytest.raises(ValueError):
        a + b
