"""The LM head fused with cross-entropy (F.linear_cross_entropy, ExecutionOptions.lm_head): the loss
and every gradient equal the plain head's (Linear + CrossEntropy) in both designs, with ignored
targets, a last block of fewer rows, the padded vocabulary and fp16 under a loss scale of 2^16;
what it saves; where its FLOPs are counted; and a GPT2 that trains to the plain head's losses."""

import gc

import numpy as np
import pytest

import tinygrad_like.functional as F
from accounting.measure import random_batch
from nn import GPT2, ExecutionOptions, GPT2Config
from optim import AdamW
from optim.step import train_on
from tinygrad_like import TAPE, Tensor, losses, no_grad
from tinygrad_like.profiler import GEMMS, Profiler

DESIGNS = F.HEAD_DESIGNS
N, C, VP, V = 29, 16, 128, 120  # 29 rows: blocks of 8, the last one of 5; 8 padding columns
BLOCK = 8

pytestmark = pytest.mark.usefixtures("one_blas_thread")


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(losses, "HEAD_BLOCK_ROWS", BLOCK)


def head(lm_head, design="precompute"):
    """GPT2's options for this head (attention as the reference computes it)."""
    return ExecutionOptions(attention="naive", lm_head=lm_head, lm_head_design=design)


def head_inputs(rng, dtype, w_std=0.5):
    x = rng.normal(0, 1, (N, C))
    w = rng.normal(0, w_std, (VP, C))
    w[V:] = 0  # the padding rows, as GPT2 keeps them
    t = rng.integers(0, V, N)
    t[[0, 9, 17]] = -1  # ignored
    return x.astype(dtype), w.astype(dtype), t


def loss_and_grads(x, w, t, design=None, scale=1.0):
    """-> (loss, dx, dw) of the plain head (design None) or the fused one."""
    xt, wt = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    if design is None:
        loss = F.cross_entropy(F.linear(xt, wt, transposed=True), t, n_classes=V)
    else:
        loss = F.linear_cross_entropy(xt, wt, t, n_classes=V, design=design)
    F.mul(loss, scale).backward()
    return loss.item(), xt.grad.numpy(), wt.grad.numpy()


@pytest.mark.parametrize("design", DESIGNS)
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-10), (np.float32, 1e-5)])
def test_loss_and_gradients_equal_the_plain_heads(rng, small_blocks, design, dtype, tol):
    x, w, t = head_inputs(rng, dtype)
    plain = loss_and_grads(x, w, t)
    fused = loss_and_grads(x, w, t, design)
    for got, want in zip(fused, plain):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    assert fused[1].dtype == fused[2].dtype == dtype
    assert np.all(fused[2][V:] == 0)  # no gradient to the padding rows
    assert np.abs(fused[1][[0, 9, 17]]).max() == 0  # ignored rows get no gradient


@pytest.mark.parametrize("design", DESIGNS)
def test_fp16_with_a_loss_scale_of_2_16_keeps_every_gradient_the_plain_head_keeps(
    rng, small_blocks, design
):
    x, w, t = head_inputs(rng, np.float64, w_std=2.0)  # peaked softmax: many tiny gradients
    scale = 2.0**16
    exact = loss_and_grads(x, w, t)  # float64, unscaled
    x16, w16 = x.astype(np.float16), w.astype(np.float16)
    plain = loss_and_grads(x16, w16, t, scale=scale)
    fused = loss_and_grads(x16, w16, t, design, scale=scale)
    unscaled_dw = loss_and_grads(x16, w16, t)[2]
    assert np.sum((plain[2] != 0) & (unscaled_dw == 0)) > 0  # some exist only thanks to the scale
    assert fused[0] == pytest.approx(plain[0], rel=1e-6)
    for got, want, ref in zip(fused[1:], plain[1:], exact[1:]):
        assert got.dtype == np.float16
        assert np.sum((want != 0) & (got == 0)) == 0  # nothing flushed that plain keeps
        scaled_ref = ref * scale
        err_plain = np.abs(want.astype(np.float64) - scaled_ref).max()
        err_fused = np.abs(got.astype(np.float64) - scaled_ref).max()
        assert err_fused <= 1.5 * err_plain + 1e-3 * np.abs(scaled_ref).max()
    assert np.all(fused[2][V:] == 0)


def head_records(model, x, y):
    """The tape records of the LM head and the loss after one forward (and the loss)."""
    since = TAPE.position()
    _, loss = model(x, y)
    return [r for r in TAPE.records(since) if r.scope in ("lm_head", "loss")], loss


def test_saved_bytes_at_gpt2_mini_b8_t128():
    """Plain saves the (N, Vp) logits (205.9 MB); recompute under 1% of that (x, lse, the
    targets); precompute its fp32 dX (N, C) and dW (Vp, C) and nothing else."""
    cfg = GPT2Config.from_preset("gpt2-mini")
    x, y = random_batch(cfg.vocab_size, 8, 128)
    n, vp, c = 8 * 128, cfg.padded_vocab_size, cfg.n_embd
    saved = {}
    for design, options in (
        (None, head("plain")),
        ("recompute", head("fused", "recompute")),
        ("precompute", head("fused", "precompute")),
    ):
        records, loss = head_records(GPT2(cfg, options=options), x, y)
        saved[design] = sum(r.saved_bytes for r in records)
        del records, loss
        gc.collect()
    assert saved[None] >= n * vp * 4
    assert saved["recompute"] < 0.01 * saved[None]
    assert saved["precompute"] == 4 * (n + vp) * c


@pytest.mark.parametrize("design", DESIGNS)
def test_flops_by_phase_and_by_math(rng, small_blocks, design):
    """recompute: the plain head's GEMMs plus one more logits GEMM (2*N*C*Vp), run in the
    backward phase as forward math; precompute: the plain head's GEMMs, the backward ones run
    in the forward phase as backward math. Both add each block's dW but the first into the sum
    in the dW GEMM's epilogue (Vp*C FLOPs a block, counted with the GEMM)."""
    x, w, t = head_inputs(rng, np.float32)
    profiles = {}
    for name in (None, design):
        with Profiler() as prof:
            loss_and_grads(x, w, t, name)
        profiles[name] = (
            {p: r["flops"] for p, r in prof.by_phase(GEMMS).items()},
            {p: r["flops"] for p, r in prof.by_phase(GEMMS, by="math").items()},
        )
    (plain, plain_math), (phase, math) = profiles[None], profiles[design]
    head, sums = 2 * N * C * VP, (-(-N // BLOCK) - 1) * VP * C
    assert plain == plain_math and plain["forward"] == head and plain["backward"] == 2 * head
    if design == "recompute":
        assert phase == {**plain, "backward": 3 * head + sums}
        assert math == {**plain, "forward": 2 * head, "backward": 2 * head + sums}
    else:
        assert phase == {**plain, "forward": 3 * head + sums, "backward": 0}
        assert math == {**plain, "backward": 2 * head + sums}


@pytest.mark.parametrize("design", DESIGNS)
def test_gpt2_fused_trains_to_the_plain_heads_losses(small_blocks, design):
    cfg = GPT2Config.from_preset("gpt2-tiny")
    batches = [random_batch(cfg.vocab_size, 2, 13, seed=s) for s in range(3)]  # 26 rows
    losses = {}
    for lm_head in ("plain", "fused"):
        model = GPT2(cfg, options=head(lm_head, design)).flatten_parameters()
        opt = AdamW(model.named_parameters(), lr=1e-2)
        losses[lm_head] = [train_on(model, opt, [b])[0] for b in batches]
    np.testing.assert_allclose(losses["fused"], losses["plain"], rtol=1e-5)


@pytest.mark.parametrize("design", DESIGNS)
def test_gpt2_fused_returns_no_logits_with_targets_and_the_plain_ones_without(small_blocks, design):
    cfg = GPT2Config.from_preset("gpt2-tiny")
    x, y = random_batch(cfg.vocab_size, 2, 13)
    plain, fused = GPT2(cfg, options=head("plain")), GPT2(cfg, options=head("fused", design))
    logits, loss = fused(x, y)
    assert logits is None and loss.item() == pytest.approx(plain(x, y)[1].item(), rel=1e-6)
    with no_grad():
        np.testing.assert_array_equal(fused(x)[0].numpy(), plain(x)[0].numpy())
        with Profiler() as prof:  # evaluation: the loss alone
            loss = fused(x, y)[1]
    assert loss.item() == pytest.approx(plain(x, y)[1].item(), rel=1e-6)
    assert not any(k.name in ("matmul_tn", "cross_entropy_bwd") for k in prof.launches)


def test_bad_arguments_are_refused(rng):
    x, w, t = head_inputs(rng, np.float32)
    with pytest.raises(ValueError, match="unknown design 'lazy'"):
        F.linear_cross_entropy(Tensor(x), Tensor(w), t, design="lazy")
    with pytest.raises(ValueError, match="need x"):
        F.linear_cross_entropy(Tensor(x), Tensor(w[:, :4]), t)
    with pytest.raises(ValueError, match="target id 130 out of range for vocab 120"):
        F.linear_cross_entropy(Tensor(x), Tensor(w), np.full(N, 130), n_classes=V)
    with pytest.raises(ValueError, match="every target is ignored"):
        F.linear_cross_entropy(Tensor(x), Tensor(w), np.full(N, -1))
