"""Mixed precision: loss scaling (overflow, growth, underflow), the fp32 master copy, fp16 and
bf16 training against fp32, bytes per parameter from the memory tracker, and checkpoints that
move between dtypes through the saved fp32 master."""

import gc

import ml_dtypes
import numpy as np
import pytest

import tinygrad_like.functional as F
from nn import GPT2, GPT2Config
from nn.flat import flatten_parameters
from nn.hf import read_state
from nn.module import Parameter
from optim import AdamW, LossScaler
from tinygrad_like import Tensor, dtypes
from tinygrad_like.memory import PERSISTENT, TRACKER
from training import checkpoint
from training.loop import RunConfig, Trainer

BF16 = np.dtype(ml_dtypes.bfloat16)


pytestmark = pytest.mark.usefixtures("one_blas_thread")


def tiny(data_dir, out, **overrides):
    cfg = dict(
        model="gpt2-tiny",
        data_dir=data_dir,
        batch_size=2,
        seq_len=16,
        steps=3,
        lr=5e-3,
        min_lr=5e-4,
        warmup=2,
        eval_every=0,
        out=str(out),
        quiet=True,
        seed=1337,
    )
    cfg.update(overrides)
    return RunConfig(**cfg)


def snapshot(opt):
    """Raw bytes of every persistent buffer the optimizer owns."""
    bufs = {"master": opt.master, "m": opt.m, "v": opt.v}
    if opt.working is not None:
        bufs["working"] = opt.working
    return {k: (b.dtype, b.tobytes()) for k, b in bufs.items()}


def some_params(rng):
    return [Parameter(rng.normal(0, 1, s).astype(np.float32)) for s in [(8, 4), (4,), (3, 5)]]


# ----------------------------------------------------------------------------- overflow


@pytest.mark.parametrize(
    "dtype, bad, use_scaler",
    [
        ("fp16", np.inf, True),
        ("fp16", np.nan, True),
        ("fp16", -np.inf, True),
        ("bf16", np.inf, False),
    ],
    ids=["fp16-inf", "fp16-nan", "fp16-neg-inf", "bf16-inf-no-scaler"],
)
def test_overflow_skips_step_and_changes_nothing(rng, dtype, bad, use_scaler):
    params = some_params(rng)
    flatten_parameters(params, dtype)
    opt = AdamW(params, lr=1e-2, weight_decay=0.1, grad_clip=1.0)
    scaler = LossScaler(init_scale=1024.0) if use_scaler else None
    for p in params:  # one good step: m, v non-zero
        p.grad.data[...] = rng.normal(0, 1, p.shape) * (scaler.scale if scaler else 1)
    _, skipped = opt.step(scaler)
    opt.zero_grad()
    assert not skipped and opt.step_count == 1

    for p in params:
        p.grad.data[...] = rng.normal(0, 1, p.shape) * (scaler.scale if scaler else 1)
    params[2].grad.data[1, 3] = bad  # one bad element, one tensor
    before = snapshot(opt)
    views = [p.numpy().copy() for p in params]
    norm, skipped = opt.step(scaler, lr=5e-2)

    assert skipped and norm == float("inf")
    assert snapshot(opt) == before  # master, m, v, working: bit-exact
    for p, v in zip(params, views):
        assert p.numpy().tobytes() == v.tobytes()
    assert opt.step_count == 1  # bias correction not advanced
    if scaler is not None:
        assert scaler.scale == 512.0 and scaler.good_steps == 0 and scaler.skipped_steps == 1

    # the next clean step goes through and moves the weights
    opt.zero_grad()
    for p in params:
        p.grad.data[...] = rng.normal(0, 1, p.shape) * (scaler.scale if scaler else 1)
    _, skipped = opt.step(scaler)
    assert not skipped and opt.step_count == 2
    assert snapshot(opt)["master"] != before["master"]


def test_overflow_in_a_gpt2_backward_is_skipped(shakespeare, tmp_path):
    """The same on the real model: fp16 training, a scaled backward, an inf injected into one
    weight gradient."""
    tr = Trainer(tiny(shakespeare, tmp_path, dtype="fp16"))
    _, _, _, skipped = tr.train_step()
    assert not skipped
    scale = tr.scaler.scale
    x, y = tr.train_data.next_batch()
    _, loss = tr.model(x, y)
    tr.scaler.scale_loss(loss).backward()
    grad = tr.model.transformer.h[0].mlp.c_fc.weight.grad
    assert grad.dtype == np.float16 and np.isfinite(tr.optimizer.grad.astype(np.float32)).all()
    grad.data[3, 5] = np.inf
    before = snapshot(tr.optimizer)
    weights = {k: p.numpy().tobytes() for k, p in tr.model.named_parameters()}
    norm, skipped = tr.optimizer.step(tr.scaler, lr=1e-3)
    assert skipped and norm == float("inf")
    assert snapshot(tr.optimizer) == before
    assert {k: p.numpy().tobytes() for k, p in tr.model.named_parameters()} == weights
    assert tr.scaler.scale == scale / 2 and tr.scaler.skipped_steps == 1
    assert tr.optimizer.step_count == 1


# ----------------------------------------------------------------------------- growth


def test_scale_doubles_after_growth_interval_good_steps(rng):
    w = Parameter(np.ones((4, 4), np.float32))
    flatten_parameters([w], "fp16")
    opt = AdamW([w], lr=1e-3)
    scaler = LossScaler(init_scale=1024.0, growth_interval=3)

    def step(ok=True):
        w.grad.data[...] = rng.normal(0, 1, (4, 4))
        if not ok:
            w.grad.data[0, 0] = np.inf
        _, skipped = opt.step(scaler)
        opt.zero_grad()
        assert skipped == (not ok)
        return scaler.scale

    assert [step(), step(), step()] == [1024.0, 1024.0, 2048.0]  # doubles on the 3rd
    assert [step(), step(), step()] == [2048.0, 2048.0, 4096.0]  # and every 3 after
    assert [step(), step(), step(ok=False)] == [4096.0, 4096.0, 2048.0]  # overflow halves...
    assert [step(), step(), step()] == [2048.0, 2048.0, 4096.0]  # ...and resets the count
    assert scaler.skipped_steps == 1 and opt.step_count == 11


def test_static_scale_never_changes(rng):
    w = Parameter(np.ones(4, np.float32))
    flatten_parameters([w], "fp16")
    opt = AdamW([w])
    scaler = LossScaler(init_scale=256.0, growth_interval=1, dynamic=False)
    for bad in (False, True, False, False):
        w.grad.data[...] = np.inf if bad else 1.0
        opt.step(scaler)
        assert scaler.scale == 256.0
    assert scaler.skipped_steps == 1


def test_scaler_rejects_non_positive_scale():
    for s in (0.0, -1.0):
        with pytest.raises(ValueError, match="positive"):
            LossScaler(init_scale=s)


# ----------------------------------------------------------------------------- underflow


def _underflow_loss(w, x):
    """fp32 loss = 1e-4 * sum(w * x) with x ~ 1e-4: dloss/dw = 1e-4 * x ~ 1e-8, below fp16's
    smallest subnormal (6e-8) by more than half of it, so it rounds to 0 in fp16."""
    return (w * x).sum().float() * 1e-4


def test_loss_scaling_rescues_gradients_that_flush_to_zero_in_fp16(rng):
    n = 64
    x16 = (rng.uniform(0.5, 2.0, n) * 1e-4).astype(np.float16)

    # fp32 reference gradient
    w32 = Parameter(np.ones(n, np.float32))
    _underflow_loss(w32, Tensor(x16.astype(np.float32))).backward()
    ref = w32.grad.numpy().astype(np.float64)
    assert (np.abs(ref) > 4e-9).all() and (np.abs(ref) < 3e-8).all()  # ~1e-8

    # fp16 without scaling: the gradient is lost, and the optimizer learns nothing
    w = Parameter(np.ones(n, np.float32))
    flatten_parameters([w], "fp16")
    opt = AdamW([w], lr=1e-3)
    x = Tensor(x16)
    _underflow_loss(w, x).backward()
    assert w.grad.dtype == np.float16
    assert not w.grad.numpy().any()
    opt.step()
    assert not opt.m.any()

    # fp16 with the loss scaler: every element survives, and unscales to the fp32 gradient
    w = Parameter(np.ones(n, np.float32))
    flatten_parameters([w], "fp16")
    opt = AdamW([w], lr=1e-3, betas=(0.9, 0.95))
    scaler = LossScaler()  # 2^16, the default
    scaler.scale_loss(_underflow_loss(w, x)).backward()
    g = w.grad.numpy()
    assert np.isfinite(g).all() and (g != 0).all()
    # fp16 rounds 1e-4, the scaled upstream gradient and the product: < 3 * 2^-11 relative
    np.testing.assert_allclose(g.astype(np.float64) / scaler.scale, ref, rtol=2e-3)
    _, skipped = opt.step(scaler)
    assert not skipped
    # after step 1, m = (1 - beta1) * unscaled gradient: the optimizer divided by the scale
    np.testing.assert_allclose(opt.m / (1 - 0.9), ref, rtol=2e-3)


def test_loss_scaling_rescues_small_cross_entropy_gradients_in_fp16():
    """The LM head's gradient: dlogit = p / N for a token of probability p over N rows. With
    p ~ 4e-8 and N = 4 that is ~1e-8: zero in fp16, but 7e-4 (normal) once scaled by 2^16."""
    N, V = 4, 8
    logits = np.zeros((N, V), np.float32)
    logits[:, 0] = -15.0
    targets = np.array([1, 2, 3, 4])
    x32 = Tensor(logits, requires_grad=True)
    F.cross_entropy(x32, targets).backward()
    ref = x32.grad.numpy().astype(np.float64)
    assert 5e-9 < ref[0, 0] < 2e-8

    scaler = LossScaler()
    x16 = Tensor(logits, requires_grad=True, dtype="fp16")
    scaler.scale_loss(F.cross_entropy(x16, targets)).backward()
    got = x16.grad.numpy().astype(np.float64) / scaler.scale
    assert x16.grad.dtype == np.float16
    assert (got[:, 0] != 0).all(), got[:, 0]
    np.testing.assert_allclose(got, ref, rtol=5e-3, atol=1e-12)


# ----------------------------------------------------------------------------- master copy


def test_master_copy_accumulates_updates_below_bf16_spacing():
    """lr * update = 1e-4 at a weight of 1.0, where bf16's spacing is 2^-8 below 1 (and 2^-7
    above). Naive bf16 weights never move; the fp32 master accumulates, and the bf16 working
    copy follows it once it crosses the rounding midpoint 1 - 2^-9 (after 20 steps)."""
    w = Parameter(np.ones(8, np.float32))
    flatten_parameters([w], "bf16")
    opt = AdamW([w], lr=1e-4, eps=1e-12, weight_decay=0.0)
    naive = np.ones(8, BF16)
    first_move = None
    for step in range(1, 61):
        w.grad.data[...] = 1.0  # Adam: mhat / sqrt(vhat) = 1, update = lr
        _, skipped = opt.step()
        opt.zero_grad()
        assert not skipped
        naive = (naive.astype(np.float32) - np.float32(1e-4)).astype(BF16)
        assert (naive == 1.0).all()  # rounds back to 1.0 every time
        assert w.dtype == BF16
        np.testing.assert_array_equal(w.numpy(), opt.master.astype(BF16))  # working = rounded
        if first_move is None and (w.numpy() != 1.0).any():
            first_move = step
        if step == 1:
            assert (w.numpy() == 1.0).all() and (opt.master < 1.0).all()
            np.testing.assert_allclose(opt.master, 1 - 1e-4, atol=1e-7)
    assert first_move == 20
    np.testing.assert_allclose(opt.master, 1 - 60e-4, atol=1e-5)
    assert (w.numpy() < 1.0).all()
    assert (np.abs(w.numpy().astype(np.float32) - opt.master) <= 2.0**-9).all()


# ----------------------------------------------------------------------------- loss curves

STEPS = 50


def _curve(shakespeare, out, dtype):
    tr = Trainer(
        tiny(shakespeare, out, dtype=dtype, steps=STEPS, seq_len=8, warmup=5, lr=5e-3, min_lr=5e-4)
    )
    history = tr.run()
    return np.array([r["loss"] for r in history]), history


@pytest.fixture(scope="module")
def fp32_curve(shakespeare, tmp_path_factory):
    losses, _ = _curve(shakespeare, tmp_path_factory.mktemp("fp32_curve"), "fp32")
    return losses


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_low_precision_tracks_fp32_loss_curve(shakespeare, tmp_path, fp32_curve, dtype):
    """Tolerances, from measurement on this setup (gpt2-tiny, 2 x 8 tokens a step, lr 5e-3,
    50 steps; 2 x 16 tokens gave the same picture): |loss - fp32 loss| has a mean of ~2e-4
    (fp16) and ~1e-3 (bf16), a maximum over the 50 steps of ~1e-3 / ~5e-3, and ~3e-4 / ~1e-3
    at the last step, while the loss itself falls by ~3 (10.8 -> ~7.7). The bounds (mean
    0.02, any step 0.1, last step 0.05) leave >= 10x headroom for other BLAS builds and
    summation orders, yet stay far below the drop: a 2-byte run that lost its master copy, or
    its loss scale, drifts away from fp32 by much more."""
    losses, history = _curve(shakespeare, tmp_path, dtype)
    assert fp32_curve[0] - fp32_curve[-5:].mean() > 2.0  # the run really learns
    diff = np.abs(losses - fp32_curve)
    assert diff.mean() < 0.02, diff.mean()
    assert diff.max() < 0.1, diff.max()
    assert diff[-1] < 0.05, diff[-1]
    if dtype == "fp16":
        assert all(np.isfinite(r["loss_scale"]) and r["loss_scale"] > 0 for r in history)
        assert history[-1]["skipped_total"] <= 5


# ----------------------------------------------------------------------------- memory

EXPECTED_BYTES = {
    "fp32": {"weights": 4, "gradients": 4, "master": 0, "adam_m": 4, "adam_v": 4},
    "fp16": {"weights": 2, "gradients": 2, "master": 4, "adam_m": 4, "adam_v": 4},
    "bf16": {"weights": 2, "gradients": 2, "master": 4, "adam_m": 4, "adam_v": 4},
}


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_bytes_per_parameter_by_consumer(dtype):
    config = GPT2Config.from_preset("gpt2-tiny")
    gc.collect()
    gc.disable()  # no unrelated collection in the middle of the measurement
    try:
        before = dict(TRACKER.current)
        model = GPT2(config, seed=0).flatten_parameters(dtype)
        opt = AdamW(model.named_parameters())
        after = dict(TRACKER.current)
    finally:
        gc.enable()
    # per element stored: the N parameters and wte's zero padding rows (real memory in every
    # buffer), so 16 bytes per parameter reads 16 (N + padding) / N when divided by N
    n = model.num_parameters() + config.padding_cost()["elements"]
    assert n == sum(p.numel() for p in model.parameters())
    per_param = {t: (after[t] - before[t]) / n for t in PERSISTENT}
    assert per_param == EXPECTED_BYTES[dtype]
    assert sum(per_param.values()) == 16

    # the same from the optimizer's own buffers and their tags (robust to other live models)
    by_tag = dict.fromkeys(PERSISTENT, 0)
    buffers = [opt.master, opt.grad, opt.m, opt.v]
    if opt.working is not None:
        buffers.append(opt.working)
    for buf in buffers:
        by_tag[TRACKER.tag_of(buf)] += buf.nbytes
    assert {t: b / n for t, b in by_tag.items()} == EXPECTED_BYTES[dtype]
    assert TRACKER.tag_of(opt.master) == ("weights" if dtype == "fp32" else "master")
    for name, p in model.named_parameters():
        assert p.dtype == dtypes.as_dtype(dtype), name
        assert TRACKER.tag_of(p.data) == "weights" and TRACKER.tag_of(p.grad.data) == "gradients"
        assert np.shares_memory(p.data, opt.master if opt.working is None else opt.working)


# ----------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize(
    "saved_in, loaded_in", [("bf16", "fp32"), ("fp16", "bf16"), ("fp32", "bf16")]
)
def test_checkpoint_changes_dtype_through_the_fp32_master(
    shakespeare, tmp_path, saved_in, loaded_in
):
    tr = Trainer(tiny(shakespeare, tmp_path, dtype=saved_in))
    tr.run()
    master = tr.optimizer.master_state()
    ck = checkpoint.find_checkpoint(str(tmp_path))
    saved = read_state(ck)
    assert set(saved) == set(master)
    for k in master:
        assert saved[k].dtype == np.float32
        np.testing.assert_array_equal(saved[k], master[k], err_msg=k)  # the master, not the copy
    if saved_in != "fp32":
        low = dtypes.as_dtype(saved_in)
        rounded = {k: v.astype(low).astype(np.float32) for k, v in master.items()}
        # the master holds more than the 2-byte working copy does, so "equal to the master"
        # is a real check
        assert any(not np.array_equal(saved[k], rounded[k]) for k in saved)
        for k, w in tr.model.state_dict().items():
            np.testing.assert_array_equal(w.astype(np.float32), rounded[k], err_msg=k)

    resumed = Trainer(tiny(shakespeare, tmp_path, dtype=loaded_in, steps=5, resume=str(tmp_path)))
    assert resumed.step == 3 and resumed.optimizer.step_count == 3
    want = dtypes.as_dtype(loaded_in)
    for k, w in resumed.optimizer.master_state().items():
        np.testing.assert_array_equal(w, saved[k], err_msg=k)  # exact fp32 master
    for k, w in resumed.model.state_dict().items():
        assert w.dtype == want
        np.testing.assert_array_equal(w, saved[k].astype(want), err_msg=k)
    arrays, _ = resumed.optimizer.state_dict()
    saved_arrays, _ = tr.optimizer.state_dict()
    for k in saved_arrays:
        np.testing.assert_array_equal(arrays[k], saved_arrays[k], err_msg=k)
    history = resumed.run()  # and it trains on
    assert [r["step"] for r in history] == [4, 5]
    assert all(np.isfinite(r["loss"]) for r in history)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_the_master_starts_from_the_fp32_weights_not_their_rounding(shakespeare, tmp_path, dtype):
    """The model takes its 2-byte dtype before AdamW is made; the master still starts from
    the fp32 values: a fresh model's as drawn (the trainer takes them before the cast), or
    any given ones (a checkpoint's), with the working weights their rounding."""
    fresh = Trainer(tiny(shakespeare, tmp_path, dtype=dtype))
    drawn = GPT2(GPT2Config.from_preset("gpt2-tiny"), seed=1337).state_dict()
    low = dtypes.as_dtype(dtype)
    for k, w in fresh.optimizer.master_state().items():
        np.testing.assert_array_equal(w, drawn[k], err_msg=k)
        np.testing.assert_array_equal(fresh.model.state_dict()[k], w.astype(low), err_msg=k)
    assert any(not np.array_equal(w.astype(low).astype(np.float32), w) for w in drawn.values())

    w = Parameter(np.zeros(4, np.float32))
    flatten_parameters([w], dtype)
    values = np.array([1 / 3, 1e-3, -7.1, 2.0**-20], np.float32)
    opt = AdamW([w], master={"0": values})
    np.testing.assert_array_equal(opt.master, values)
    np.testing.assert_array_equal(w.numpy(), values.astype(low))
    with pytest.raises(ValueError, match="master weights does not match the model"):
        AdamW([w], master={"w": values})


def test_init_from_bf16_checkpoint_in_fp32_uses_the_master(shakespeare, tmp_path):
    Trainer(tiny(shakespeare, tmp_path / "run", dtype="bf16")).run()
    saved = read_state(checkpoint.find_checkpoint(str(tmp_path / "run")))
    ft = Trainer(tiny(shakespeare, tmp_path / "ft", dtype="fp32", init_from=str(tmp_path / "run")))
    assert ft.step == 0 and ft.optimizer.step_count == 0
    for k, w in ft.model.state_dict().items():
        np.testing.assert_array_equal(w, saved[k], err_msg=k)


def test_fp16_resume_restores_the_loss_scale(shakespeare, tmp_path):
    tr = Trainer(tiny(shakespeare, tmp_path, dtype="fp16"))
    tr.scaler.scale = 1024.0
    tr.run()
    state = tr.scaler.state_dict()
    resumed = Trainer(tiny(shakespeare, tmp_path, dtype="fp16", steps=5, resume=str(tmp_path)))
    assert resumed.scaler.state_dict() == state
    assert resumed.scaler.scale == tr.scaler.scale == 1024.0
    assert resumed.scaler.good_steps == tr.scaler.good_steps == 3
