"""The CPU kernels (backend/cpu/, the numerical reference) and the profiler.

2-byte formats: every kernel computes in fp32 and rounds once on the way out, and reductions
accumulate in fp32. So a kernel's fp16/bf16 result must equal (or sit within one rounding of)
the fp32 computation on the same, already rounded, inputs, and be within the format's
precision of the fp32 result on the unrounded inputs. The tolerances below are stated in
units of the format's machine epsilon EPS[dtype] (fp16 2**-10, bf16 2**-7).
"""

import math

import numpy as np
import pytest

from tinygrad_like import Tensor, dtypes, kernels, profiler
from tinygrad_like import functional as F
from tinygrad_like.backend import cpu
from tinygrad_like.backend.cpu import softmax

HALF = [pytest.param(dtypes.float16, id="fp16"), pytest.param(dtypes.bfloat16, id="bf16")]
EPS = {dtypes.float16: 2.0**-10, dtypes.bfloat16: 2.0**-7, dtypes.float32: 2.0**-23}
F32 = dtypes.float32  # np.dtype, the key type of EPS


def rnd(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(F32)


def up(a):
    return a.astype(F32)


# ---------------------------------------------------------------- GEMMs

GEMMS = {  # kernel -> (shape a, shape b, fp32 reference)
    "matmul": ((2, 3, 64), (2, 64, 5), lambda a, b: a @ b),
    "matmul_nt": ((2, 3, 64), (2, 5, 64), lambda a, b: a @ b.swapaxes(-1, -2)),
    "matmul_tn": ((2, 64, 3), (2, 64, 5), lambda a, b: a.swapaxes(-1, -2) @ b),
}


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", sorted(GEMMS))
def test_gemm_half_rounds_once(rng, name, dtype):
    sa, sb, ref = GEMMS[name]
    a, b = rnd(rng, *sa), rnd(rng, *sb)
    ah, bh = a.astype(dtype), b.astype(dtype)
    out = getattr(cpu, name)(ah, bh)
    assert out.dtype == dtype
    # fp32 arithmetic on the rounded inputs, rounded once: bit for bit
    want = ref(up(ah), up(bh)).astype(dtype)
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))
    # and within 4 eps (two input roundings, one output rounding) of fp32 on the originals,
    # relative to sum |a||b|
    bound = 4 * EPS[dtype] * ref(np.abs(a), np.abs(b))
    assert np.all(np.abs(up(out) - ref(a, b)) <= bound)


@pytest.mark.parametrize("dtype", HALF)
def test_matmul_bias_added_before_rounding(rng, dtype):
    a, b, bias = rnd(rng, 4, 32), rnd(rng, 32, 6), rnd(rng, 6)
    ah, bh, biash = a.astype(dtype), b.astype(dtype), bias.astype(dtype)
    out = cpu.matmul(ah, bh, bias=biash)
    expected = (up(ah) @ up(bh) + up(biash)).astype(dtype)
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))


def test_gemm_fp32_and_fp64_keep_dtype(rng):
    a, b = rnd(rng, 3, 4), rnd(rng, 4, 2)
    assert cpu.matmul(a, b).dtype == F32
    np.testing.assert_allclose(cpu.matmul(a, b), a @ b, rtol=1e-6)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert cpu.matmul_nt(a64, b64.T.copy()).dtype == np.float64
    np.testing.assert_array_equal(cpu.matmul_tn(a64.T.copy(), b64), a64 @ b64)


# ---------------------------------------------------------------- elementwise


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(
    "name, ufunc", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("div", np.divide)]
)
def test_binary_half_rounds_once(rng, name, ufunc, dtype):
    a, b = rnd(rng, 3, 4).astype(dtype), (rnd(rng, 4) + 3).astype(dtype)
    out = getattr(cpu, name)(a, b)
    assert out.dtype == dtype
    want = ufunc(up(a), up(b)).astype(dtype)
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))
    # a Python scalar operand does not promote, and out= writes in place
    dst = np.empty((3, 4), dtype)
    assert getattr(cpu, name)(a, 1.5, out=dst) is dst
    want = ufunc(up(a), np.float32(1.5)).astype(dtype)
    np.testing.assert_array_equal(dst.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("dtype", HALF)
def test_sum_accumulates_in_fp32(dtype):
    """4096 ones: fp32 accumulation gives 4096 (exact in both formats); a running sum in the
    2-byte format would stall at 2048 (fp16) or 256 (bf16)."""
    x = np.ones(4096, dtype)
    assert float(np.cumsum(x, dtype=dtype)[-1]) < 4096  # what naive accumulation would do
    out = cpu.sum(x)
    assert out.dtype == dtype and out.shape == ()
    assert float(out) == 4096.0
    rows = cpu.sum(np.ones((2, 4096), dtype), axis=1, keepdims=True)
    assert rows.shape == (2, 1) and np.all(up(rows) == 4096)


@pytest.mark.parametrize("dtype", HALF)
def test_gelu_half_matches_fp32(rng, dtype):
    x = rnd(rng, 8, 16, scale=2).astype(dtype)
    dy = rnd(rng, 8, 16).astype(dtype)
    y, dx = cpu.gelu_fwd(x), cpu.gelu_bwd(x, dy)
    assert y.dtype == dtype and dx.dtype == dtype
    y32, dx32 = cpu.gelu_fwd(up(x)), cpu.gelu_bwd(up(x), up(dy))
    # one output rounding: within eps of the fp32 result on the same inputs
    np.testing.assert_allclose(up(y), y32, rtol=EPS[dtype], atol=1e-6)
    np.testing.assert_allclose(up(dx), dx32, rtol=EPS[dtype], atol=1e-6)
    xs = up(x).astype(np.float64)
    ref = 0.5 * xs * (1 + np.tanh(math.sqrt(2 / math.pi) * (xs + 0.044715 * xs**3)))
    np.testing.assert_allclose(y32, ref, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- layer norm


def _ln_ref(x, w, b, eps=1e-5):
    x = x.astype(np.float64)
    mu = x.mean(-1)
    rstd = 1 / np.sqrt(((x - mu[..., None]) ** 2).mean(-1) + eps)
    return (x - mu[..., None]) * rstd[..., None] * w + b, mu, rstd


@pytest.mark.parametrize("dtype", HALF)
def test_layernorm_half_reduces_in_fp32(rng, dtype):
    x = (rnd(rng, 3, 4, 32, scale=3) + 5).astype(dtype)  # an offset mean stresses the variance
    w, b = (1 + 0.1 * rnd(rng, 32)).astype(dtype), (0.1 * rnd(rng, 32)).astype(dtype)
    y, mean, rstd = cpu.layernorm_fwd(x, w, b)
    assert y.dtype == dtype and mean.dtype == F32 and rstd.dtype == F32
    assert mean.shape == rstd.shape == (3, 4)
    ref_y, ref_mu, ref_rstd = _ln_ref(up(x), up(w), up(b))
    np.testing.assert_allclose(mean, ref_mu, rtol=1e-6)
    np.testing.assert_allclose(rstd, ref_rstd, rtol=1e-5)
    np.testing.assert_allclose(up(y), ref_y, rtol=EPS[dtype], atol=EPS[dtype] * 1e-2)
    # backward: half in and out, fp32 inside; compare with the fp32 kernel on the same inputs
    dy = rnd(rng, 3, 4, 32).astype(dtype)
    dx, dw, db = cpu.layernorm_bwd(dy, x, w, mean, rstd)
    assert dx.dtype == dw.dtype == db.dtype == dtype
    dx32, dw32, db32 = cpu.layernorm_bwd(up(dy), up(x), up(w), mean, rstd)
    for got, want in [(dx, dx32), (dw, dw32), (db, db32)]:
        scale = np.abs(want).max()
        np.testing.assert_allclose(up(got), want, rtol=EPS[dtype], atol=EPS[dtype] * 1e-2 * scale)


def _rms_ref(x, w, eps=1e-6):
    rstd = 1 / np.sqrt((x * x).mean(-1) + eps)
    return x * rstd[..., None] * w, rstd


@pytest.mark.parametrize("dtype", [F32, *HALF])
def test_rmsnorm_reduces_in_fp32_against_float64(rng, dtype):
    """Forward against the float64 formula; backward against the float64 gradient of it."""
    x = rnd(rng, 3, 5, 48, scale=3).astype(dtype)
    w = (1 + 0.1 * rnd(rng, 48)).astype(dtype)
    y, rstd = cpu.rmsnorm_fwd(x, w)
    assert y.dtype == dtype and rstd.dtype == F32 and rstd.shape == (3, 5)
    x64, w64 = up(x).astype(np.float64), up(w).astype(np.float64)
    ref_y, ref_rstd = _rms_ref(x64, w64)
    tol = 1e-5 if dtype == F32 else EPS[dtype]  # fp32: a few ulps of a computed result
    np.testing.assert_allclose(rstd, ref_rstd, rtol=1e-6)
    np.testing.assert_allclose(up(y), ref_y, rtol=tol, atol=tol * 1e-2)
    dy = rnd(rng, 3, 5, 48).astype(dtype)
    dx, dw = cpu.rmsnorm_bwd(dy, x, w, rstd)
    assert dx.dtype == dw.dtype == dtype and dw.shape == (48,)
    xhat, g = x64 * ref_rstd[..., None], up(dy).astype(np.float64) * w64
    ref_dx = ref_rstd[..., None] * (g - xhat * (g * xhat).mean(-1, keepdims=True))
    ref_dw = (up(dy).astype(np.float64) * xhat).reshape(-1, 48).sum(0)
    for got, want in [(dx, ref_dx), (dw, ref_dw)]:
        scale = np.abs(want).max()
        np.testing.assert_allclose(up(got), want, rtol=tol, atol=tol * 1e-2 * scale)


def test_rmsnorm_without_rows(rng):
    x, w = np.zeros((0, 8), F32), rnd(rng, 8)
    y, rstd = cpu.rmsnorm_fwd(x, w)
    assert y.shape == (0, 8) and rstd.shape == (0,)
    dx, dw = cpu.rmsnorm_bwd(x, x, w, rstd)
    assert dx.shape == (0, 8) and np.array_equal(dw, np.zeros(8, F32))


def test_layernorm_fp32_against_float64(rng):
    x, w, b = rnd(rng, 5, 16), rnd(rng, 16), rnd(rng, 16)
    y, mean, rstd = cpu.layernorm_fwd(x, w, b)
    ref_y, ref_mu, ref_rstd = _ln_ref(x, w.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rstd, ref_rstd, rtol=1e-5)
    dy = rnd(rng, 5, 16)
    dx, dw, db = cpu.layernorm_bwd(dy, x, w, mean, rstd)
    xhat = (x - ref_mu[:, None]) * ref_rstd[:, None]
    np.testing.assert_allclose(db, dy.sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, (dy * xhat).sum(0), rtol=1e-4, atol=1e-5)
    g = dy * w
    ref_dx = ref_rstd[:, None] * (
        g - g.mean(1, keepdims=True) - xhat * (g * xhat).mean(1, keepdims=True)
    )
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- causal softmax


@pytest.mark.parametrize("Tq, Tk", [(4, 4), (2, 6), (1, 3)])
@pytest.mark.parametrize("dtype", [pytest.param(F32, id="fp32")] + HALF)
def test_softmax_causal_rows_sum_to_one_masked_exactly_zero(rng, dtype, Tq, Tk):
    scores = rnd(rng, 2, 3, Tq, Tk, scale=4).astype(dtype)
    probs = cpu.softmax_causal_fwd(scores, 0.5)
    assert probs.dtype == dtype
    future = np.arange(Tk)[None, :] > (Tk - Tq + np.arange(Tq))[:, None]
    assert np.all(probs[..., future] == 0)  # exactly zero, not just small
    assert np.all(up(probs)[..., ~future] > 0)
    np.testing.assert_allclose(up(probs).sum(-1), 1.0, atol=Tk * EPS[dtype])
    # against a float64 softmax of the same (rounded) scores
    s = np.where(future, -np.inf, up(scores).astype(np.float64) * 0.5)
    ref = np.exp(s - s.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    np.testing.assert_allclose(up(probs), ref, rtol=2 * EPS[dtype], atol=1e-7)
    if Tq == Tk:  # the first query sees only the first key
        assert np.all(up(probs)[..., 0, 0] == 1.0)


def test_softmax_causal_large_scores_stable(rng):
    scores = rnd(rng, 1, 1, 3, 3, scale=1e4)
    probs = cpu.softmax_causal_fwd(scores, 1.0)
    assert np.all(np.isfinite(probs))
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize("dtype", [pytest.param(F32, id="fp32")] + HALF)
def test_softmax_causal_bwd(rng, dtype):
    probs = cpu.softmax_causal_fwd(rnd(rng, 2, 3, 5), 0.7)  # fp32 probs
    dprobs = rnd(rng, 2, 3, 5)
    ph, dph = probs.astype(dtype), dprobs.astype(dtype)
    ds = cpu.softmax_causal_bwd(ph, dph, 0.7)
    assert ds.dtype == dtype
    p64, dp64 = up(ph).astype(np.float64), up(dph).astype(np.float64)
    ref = 0.7 * p64 * (dp64 - (dp64 * p64).sum(-1, keepdims=True))
    np.testing.assert_allclose(up(ds), ref, rtol=2 * EPS[dtype], atol=1e-6)
    assert np.all(ds[..., np.triu(np.ones((3, 5), bool), k=3)] == 0)  # masked: exactly zero


def test_softmax_causal_half_rows_widened_in_blocks_match_one_block(rng, monkeypatch):
    """2-byte scores are widened a block of whole (Tq, Tk) matrices at a time (the causal rule
    reads row % Tq): blocks of 3 matrices give the bits of one block of all 12."""
    scores = rnd(rng, 4, 3, 5, 7, scale=3).astype(dtypes.float16)
    dprobs = rnd(rng, 4, 3, 5, 7).astype(dtypes.float16)
    whole = cpu.softmax_causal_fwd(scores, 0.5), cpu.softmax_causal_bwd(scores, dprobs, 0.5)
    monkeypatch.setattr(softmax, "_WIDEN_ELEMENTS", 3 * 5 * 7)
    blocks = cpu.softmax_causal_fwd(scores, 0.5), cpu.softmax_causal_bwd(scores, dprobs, 0.5)
    for got, want in zip(blocks, whole):
        np.testing.assert_array_equal(got, want)


def test_softmax_of_a_row_of_minus_inf_is_nan():
    x = np.array([[-np.inf] * 3, [0.0, 1.0, 2.0]], F32)
    for fn in (cpu.softmax_fwd, cpu.log_softmax_fwd):
        y = fn(x)
        assert np.all(np.isnan(y[0])) and np.all(np.isfinite(y[1])), fn.__name__


# ---------------------------------------------------------------- cross-entropy


def _ce_rows(logits, targets):
    lf = logits.astype(np.float64)
    m = lf.max(1, keepdims=True)
    lse = np.log(np.exp(lf - m).sum(1)) + m[:, 0]
    valid = targets >= 0
    picked = lf[np.arange(len(targets)), np.where(valid, targets, 0)]
    return np.where(valid, lse - picked, 0.0)


@pytest.mark.parametrize("dtype", HALF)
def test_cross_entropy_half_logits_fp32_losses(rng, dtype):
    logits, targets = rnd(rng, 6, 50, scale=3), np.array([3, -1, 49, 0, 7, 7])
    lh = logits.astype(dtype)
    losses, lse = cpu.cross_entropy_fwd(lh, targets)
    assert losses.dtype == F32 and losses.shape == (6,) and lse.dtype == F32
    assert losses[1] == 0
    # the reduction runs in fp32 on the rounded logits: fp32 accuracy
    np.testing.assert_allclose(losses, _ce_rows(up(lh), targets), rtol=1e-5, atol=1e-5)
    # and the only error against fp32 logits is the input rounding (|dloss| <= 2 max|dlogit|)
    np.testing.assert_allclose(
        losses, _ce_rows(logits, targets), rtol=0, atol=2 * EPS[dtype] * np.abs(logits).max()
    )


@pytest.mark.parametrize("N", [5, 21], ids=["5-rows", "21-rows"])
@pytest.mark.parametrize("dtype", [pytest.param(F32, id="fp32")] + HALF)
def test_cross_entropy_fwd_then_bwd(rng, dtype, N):
    V = 11
    logits, targets = rnd(rng, N, V, scale=2), rng.integers(0, V, N)
    targets[[0, 2, N - 1]] = [0, -1, V - 1]
    lh = logits.astype(dtype)
    losses, lse = cpu.cross_entropy_fwd(lh, targets)
    dlogits = cpu.cross_entropy_bwd(lh, lse, targets, np.array([0.25], F32))
    assert losses.dtype == F32 and losses.shape == (N,) and dlogits.dtype == dtype
    np.testing.assert_allclose(losses, _ce_rows(up(lh), targets), rtol=1e-5, atol=1e-5)
    valid = targets >= 0
    lf = up(lh).astype(np.float64)
    p = np.exp(lf - lf.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.flatnonzero(valid), targets[valid]] -= 1
    p[~valid] = 0
    np.testing.assert_allclose(up(dlogits), 0.25 * p, rtol=EPS[dtype], atol=1e-7)
    assert np.all(up(dlogits)[2] == 0) and losses[2] == 0
    np.testing.assert_allclose(up(dlogits)[valid].sum(1), 0, atol=V * EPS[dtype])


@pytest.mark.parametrize("dtype", [pytest.param(F32, id="fp32"), HALF[1]])
def test_cross_entropy_large_logits(rng, dtype):
    logits = rnd(rng, 3, 8, scale=1e4).astype(dtype)
    targets = np.array([1, 2, 3])
    losses, lse = cpu.cross_entropy_fwd(logits, targets)
    assert np.all(np.isfinite(losses))
    np.testing.assert_allclose(losses, _ce_rows(up(logits), targets), rtol=1e-6, atol=1e-3)
    dlogits = cpu.cross_entropy_bwd(logits, lse, targets, np.array([1.0], F32))
    assert np.all(np.isfinite(up(dlogits)))


@pytest.mark.parametrize("dtype", [pytest.param(F32, id="fp32")] + HALF)
def test_cross_entropy_over_the_first_n_classes_of_padded_rows(rng, dtype):
    """Rows of Vp = 16 columns, V = 11 classes (the padded LM head): the padding columns, here
    huge so that reading them would show, take no probability; their dlogits are exactly 0
    and the rest equal the kernels on the V columns alone."""
    N, V, Vp = 9, 11, 16
    logits = rnd(rng, N, Vp, scale=2)
    logits[:, V:] = 1e4
    targets = rng.integers(0, V, N)
    targets[[0, 3]] = [-1, V - 1]
    lh, plain = logits.astype(dtype), np.ascontiguousarray(logits[:, :V]).astype(dtype)
    losses, lse = cpu.cross_entropy_fwd(lh, targets, V)
    want_losses, want_lse = cpu.cross_entropy_fwd(plain, targets)
    np.testing.assert_array_equal(losses, want_losses)
    np.testing.assert_array_equal(lse, want_lse)
    np.testing.assert_allclose(losses, _ce_rows(up(plain), targets), rtol=1e-5, atol=1e-5)
    dlogits = cpu.cross_entropy_bwd(lh, lse, targets, np.array([0.5], F32), V)
    assert dlogits.shape == (N, Vp) and dlogits.dtype == dtype
    np.testing.assert_array_equal(
        dlogits[:, :V], cpu.cross_entropy_bwd(plain, want_lse, targets, np.array([0.5], F32))
    )
    assert np.all(up(dlogits)[:, V:] == 0)


@pytest.mark.parametrize(
    "N, V, Vp",
    [(1, 11, 16), (21, 11, 16), (37, 7001, 7040)],
    ids=["1-row", "21-rows", "37-rows-split-over-cores"],
)
@pytest.mark.parametrize("dtype", [pytest.param(F32, id="fp32")] + HALF)
def test_cross_entropy_fwd_bwd_equals_fwd_then_bwd(rng, dtype, N, V, Vp):
    """The one-pass kernel against the two it replaces in the fused head, on
    rows over the cores, ignored targets and huge padding columns that
    reading them would show: the losses bit for bit, dlogits to the fused head's fp32
    tolerance before rounding (dloss / s scales exp(logit - max), where the backward rounds
    logit - lse, up to ~2^-19 here, before its exp), 0 in the padding and in ignored rows; in
    place (out = the logits) the same bits."""
    logits = rnd(rng, N, Vp, scale=3)
    logits[:, V:] = 1e4
    targets = rng.integers(0, V, N)
    targets[::4] = -1
    targets[-1] = V - 1
    lh, dloss = logits.astype(dtype), np.array([0.37], F32)
    want_losses, lse = cpu.cross_entropy_fwd(lh, targets, V)
    want = cpu.cross_entropy_bwd(lh, lse, targets, dloss, V)
    losses, dlogits = cpu.cross_entropy_fwd_bwd(lh, targets, dloss, V)
    assert losses.dtype == F32 and dlogits.dtype == dtype and dlogits.shape == (N, Vp)
    np.testing.assert_array_equal(losses, want_losses)
    tol = max(EPS[dtype], 1e-5)  # absolute: p - 1 at the target cancels
    np.testing.assert_allclose(up(dlogits), up(want), rtol=tol, atol=tol * dloss[0])
    assert not up(dlogits)[:, V:].any() and not up(dlogits)[targets < 0].any()
    in_place = lh.copy()
    got = cpu.cross_entropy_fwd_bwd(in_place, targets, dloss, V, out=in_place)
    assert got[1] is in_place
    np.testing.assert_array_equal(got[0], losses)
    np.testing.assert_array_equal(up(in_place), up(dlogits))


@pytest.mark.parametrize("bad", [11, 15, 99, -2])
def test_cross_entropy_kernels_refuse_a_target_out_of_range(rng, bad):
    """The same error as ops.cross_entropy, also for a target that lands in a padding column."""
    logits, targets = rnd(rng, 4, 16), np.array([0, bad, -1, 10])
    lse = np.zeros(4, F32)
    for call in (
        lambda: cpu.cross_entropy_fwd(logits, targets, 11),
        lambda: cpu.cross_entropy_bwd(logits, lse, targets, np.ones(1, F32), 11),
        lambda: cpu.cross_entropy_fwd_bwd(logits, targets, np.ones(1, F32), 11),
        lambda: F.cross_entropy(Tensor(logits), targets, n_classes=11),
    ):
        with pytest.raises(ValueError, match=f"target id {bad} out of range for vocab 11"):
            call()


def test_cross_entropy_counts_the_classes_not_the_padding(rng):
    """FLOPs and bytes of the launches: 4 FLOPs per class per row; the forward reads N·V
    logits, the backward reads N·V and writes the whole N·Vp dlogits (zeros included)."""
    N, V, Vp = 6, 11, 16
    x = Tensor(rnd(rng, N, Vp), requires_grad=True)
    targets = rng.integers(0, V, N)
    with profiler.Profiler() as prof:
        F.cross_entropy(x, targets, n_classes=V).backward()
    ce = {x.name: x for x in prof.launches if x.name.startswith("cross_entropy")}
    assert ce["cross_entropy_fwd"].flops == ce["cross_entropy_bwd"].flops == 4 * N * V
    stats, ids = 4 * N, 8 * N  # fp32 losses or lse per row; int64 targets
    assert ce["cross_entropy_fwd"].bytes == 4 * N * V + ids + 2 * stats
    assert ce["cross_entropy_bwd"].bytes == 4 * N * V + stats + ids + 4 + 4 * N * Vp


def test_cross_entropy_fwd_bwd_counts_one_exp_per_class_and_its_bytes(rng):
    """The one-pass kernel: 5 FLOPs and one exp per class per row; it reads the N·V logits, the
    targets and dloss and writes the losses and the whole N·Vp dlogits, also in place (out = the
    logits, whose bytes are then written, not read, twice)."""
    N, V, Vp = 6, 11, 16
    logits, targets, dloss = rnd(rng, N, Vp), rng.integers(0, V, N), np.ones(1, F32)
    with profiler.Profiler() as prof:
        kernels.launch("cross_entropy_fwd_bwd", logits, targets, dloss, n_classes=V)
        kernels.launch("cross_entropy_fwd_bwd", logits, targets, dloss, n_classes=V, out=logits)
    for launch in prof.launches:
        assert (launch.flops, launch.exps) == (5 * N * V, N * V)
        assert launch.bytes == 4 * N * V + 8 * N + 4 + 4 * N + 4 * N * Vp


def test_cross_entropy_through_ops_bf16_gives_fp32_loss(rng):
    logits, targets = rnd(rng, 4, 9, scale=2), np.array([8, 0, -1, 3])
    x = Tensor(logits, requires_grad=True)
    loss = F.cross_entropy(x.bfloat16(), targets)
    assert loss.dtype == F32
    ref = _ce_rows(up(logits.astype(dtypes.bfloat16)), targets)[[0, 1, 3]].mean()
    np.testing.assert_allclose(loss.item(), ref, rtol=1e-5)
    loss.backward()
    assert x.grad.dtype == F32 and np.all(x.grad.numpy()[2] == 0)


# ---------------------------------------------------------------- embedding


@pytest.mark.parametrize("dtype", [pytest.param(F32, id="fp32")] + HALF)
def test_embedding_bwd_repeated_ids_deterministic(rng, dtype):
    ids = rng.integers(0, 5, size=(4, 16))  # 64 ids over 8 rows: many repeats, rows 5-7 unused
    ids[0, :4] = 2
    dout = rnd(rng, 4, 16, 3).astype(dtype)
    d1 = cpu.embedding_bwd(dout, ids, 8)
    d2 = cpu.embedding_bwd(dout.copy(), ids.copy(), 8)
    assert d1.dtype == dtype and d1.shape == (8, 3)
    np.testing.assert_array_equal(d1.view(np.uint8), d2.view(np.uint8))  # bit for bit
    ref = np.zeros((8, 3))
    np.add.at(ref, ids.reshape(-1), up(dout).reshape(-1, 3).astype(np.float64))
    # accumulated in fp32, rounded once
    np.testing.assert_allclose(up(d1), ref, rtol=EPS[dtype], atol=1e-5)
    assert np.all(up(d1)[5:] == 0)
    np.testing.assert_array_equal(cpu.embedding_fwd(up(dout)[0], ids[0]), up(dout)[0][ids[0]])


# ---------------------------------------------------------------- optimizer kernels


def test_grad_norm_sq(rng):
    g = rnd(rng, 1000)
    out = cpu.grad_norm_sq(g)
    assert out.shape == (1,) and out.dtype == F32
    np.testing.assert_allclose(out[0], np.sum(g.astype(np.float64) ** 2), rtol=1e-5)
    gb = g.astype(dtypes.bfloat16)
    outb = cpu.grad_norm_sq(gb)
    assert outb.dtype == F32  # squares summed in fp32, not bf16
    np.testing.assert_allclose(outb[0], np.sum(up(gb).astype(np.float64) ** 2), rtol=1e-5)
    g[3] = np.inf
    assert np.isinf(cpu.grad_norm_sq(g)[0])
    g[3] = np.nan
    assert np.isnan(cpu.grad_norm_sq(g)[0])
    big = np.full(10, 60000, np.float16)  # squares overflow fp16 but not fp32
    assert np.isfinite(cpu.grad_norm_sq(big)[0])


def _adamw_ref(
    master,
    grad,
    m,
    v,
    norm_sq,
    *,
    lr,
    beta1,
    beta2,
    eps,
    weight_decay,
    n_decay,
    step,
    inv_scale,
    max_norm,
):
    """The textbook AdamW (decoupled decay, bias-corrected moments) in float64."""
    master, m, v = (a.astype(np.float64) for a in (master, m, v))
    g = grad.astype(np.float64) * inv_scale
    if max_norm > 0:
        norm = math.sqrt(float(norm_sq[0])) * inv_scale
        g *= min(1.0, max_norm / (norm + 1e-6))
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    master[:n_decay] *= 1 - lr * weight_decay
    mhat, vhat = m / (1 - beta1**step), v / (1 - beta2**step)
    master -= lr * mhat / (np.sqrt(vhat) + eps)
    return master, m, v


HP = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, n_decay=12)


@pytest.mark.parametrize("max_norm", [0.0, 0.5], ids=["no-clip", "clip"])
@pytest.mark.parametrize(
    "working_dtype",
    [None, dtypes.bfloat16, dtypes.float16],
    ids=["fp32", "bf16-working", "fp16-working"],
)
def test_adamw_step_matches_reference(rng, working_dtype, max_norm):
    N, scale = 20, 1.0 if working_dtype is None else 1024.0
    master = rnd(rng, N)
    m, v = np.zeros(N, F32), np.zeros(N, F32)
    working = None if working_dtype is None else master.astype(working_dtype)
    ref = (master.astype(np.float64), m.astype(np.float64), v.astype(np.float64))
    for step in (1, 2, 3):
        grad = (scale * rnd(rng, N)).astype(working_dtype or F32)
        grad_before = grad.copy()
        norm_sq = cpu.grad_norm_sq(grad)
        cpu.adamw_step(
            master,
            grad,
            m,
            v,
            working,
            norm_sq,
            step=step,
            inv_scale=1 / scale,
            max_norm=max_norm,
            **HP,
        )
        np.testing.assert_array_equal(grad.view(np.uint8), grad_before.view(np.uint8))
        ref = _adamw_ref(
            *ref[:1],
            grad,
            *ref[1:],
            norm_sq,
            step=step,
            inv_scale=1 / scale,
            max_norm=max_norm,
            **HP,
        )
        for got, want in zip((master, m, v), ref):
            assert got.dtype == F32
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)
        if working is not None:
            np.testing.assert_array_equal(
                working.view(np.uint16), master.astype(working_dtype).view(np.uint16)
            )
    assert ref[0][HP["n_decay"] :].shape == (N - HP["n_decay"],)


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_adamw_step_skipped_when_norm_not_finite(rng, bad):
    N = 16
    master, m, v = rnd(rng, N), np.abs(rnd(rng, N)), np.abs(rnd(rng, N))
    grad = rnd(rng, N).astype(np.float16)
    grad[5] = np.inf
    working = master.astype(np.float16)
    before = [a.copy() for a in (master, grad, m, v, working)]
    norm_sq = np.array([bad], F32)
    assert (
        cpu.adamw_step(
            master, grad, m, v, working, norm_sq, step=4, inv_scale=1 / 1024, max_norm=1.0, **HP
        )
        is None
    )
    for got, want in zip((master, grad, m, v, working), before):
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_adamw_weight_decay_only_on_first_n(rng):
    N = 8
    master = rnd(rng, N)
    before = master.copy()
    grad = np.zeros(N, F32)  # zero gradient: only the decay moves the weights
    cpu.adamw_step(
        master,
        grad,
        np.zeros(N, F32),
        np.zeros(N, F32),
        None,
        cpu.grad_norm_sq(grad),
        lr=0.1,
        beta1=0.9,
        beta2=0.999,
        eps=1e-8,
        weight_decay=0.5,
        n_decay=5,
        step=1,
        inv_scale=1.0,
        max_norm=0.0,
    )
    np.testing.assert_allclose(master[:5], before[:5] * (1 - 0.1 * 0.5), rtol=1e-6)
    np.testing.assert_array_equal(master[5:], before[5:])


# ---------------------------------------------------------------- the rest


@pytest.mark.parametrize("dtype", [pytest.param(F32, id="fp32")] + HALF)
def test_dropout_fwd_seeded(rng, dtype):
    x = rnd(rng, 100, 100).astype(dtype)
    y1, mask1 = cpu.dropout_fwd(x, 0.3, seed=123)
    y2, mask2 = cpu.dropout_fwd(x, 0.3, seed=123)
    _, mask3 = cpu.dropout_fwd(x, 0.3, seed=124)
    assert y1.dtype == mask1.dtype == dtype
    np.testing.assert_array_equal(up(mask1), up(mask2))
    np.testing.assert_array_equal(up(y1), up(y2))
    assert not np.array_equal(up(mask1), up(mask3))
    assert set(np.unique(up(mask1))) == {0.0, float(up(np.array(1 / 0.7, dtype)))}
    assert abs((mask1 != 0).mean() - 0.7) < 0.02
    np.testing.assert_array_equal(up(y1), up((up(x) * up(mask1)).astype(dtype)))


def test_index_bwd_and_concat(rng):
    g = rnd(rng, 2, 2)
    dx = cpu.index_bwd(g, (3, 4), (slice(1, 3), slice(None, None, 2)))
    expected = np.zeros((3, 4), F32)
    expected[1:3, ::2] = g
    np.testing.assert_array_equal(dx, expected)
    a, b = rnd(rng, 2, 3), rnd(rng, 2, 1)
    np.testing.assert_array_equal(cpu.concat([a, b], 1), np.concatenate([a, b], 1))


def test_cast_roundtrip_values(rng):
    x = rnd(rng, 64)
    for dtype in (dtypes.float16, dtypes.bfloat16):
        h = cpu.cast(x, dtype)
        assert h.dtype == dtype
        np.testing.assert_allclose(up(h), x, rtol=EPS[dtype] / 2 + 1e-12, atol=1e-7)
        np.testing.assert_array_equal(up(cpu.cast(up(h), dtype)), up(h))  # exact back and forth


# ---------------------------------------------------------------- profiler


def test_profiler_linear_forward_backward(rng):
    M, K, N = 6, 5, 4
    x = Tensor(rnd(rng, 2, 3, K), requires_grad=True)
    w, b = Tensor(rnd(rng, K, N), requires_grad=True), Tensor(rnd(rng, N), requires_grad=True)
    g = rnd(rng, 2, 3, N)
    with profiler.Profiler() as p:
        y = F.linear(x, w, b)
        y.backward(g)
    assert p.launches and {la.phase for la in p.launches} == {"forward", "backward"}
    assert all(la.device == "cpu" for la in p.launches)
    fwd = [la for la in p.launches if la.phase == "forward"]
    assert any(la.name == "matmul" for la in fwd)
    bwd_names = [la.name for la in p.launches if la.phase == "backward"]
    assert "matmul_nt" in bwd_names and "matmul_tn" in bwd_names and "sum" in bwd_names
    phases = p.by_phase()
    assert phases["forward"]["flops"] == 2 * M * K * N + M * N
    assert phases["backward"]["flops"] == 2 * (2 * M * K * N) + M * N
    assert phases["optimizer"]["launches"] == 0 and phases["other"]["launches"] == 0
    assert sum(r["launches"] for r in phases.values()) == len(p.launches)
    census = p.census()
    assert sum(r["calls"] for r in census) == len(p.launches)
    assert sum(r["flops"] for r in census) == sum(la.flops for la in p.launches)
    assert len({r["kernel"] for r in census}) == len(census)
    assert all(la.bytes > 0 for la in p.launches if la.name.startswith("matmul"))
    trace = p.chrome_trace_events()
    assert len(trace) == len(profiler.PHASES) + len(p.launches)
    assert "matmul" in profiler.format_census(census)
    # the launch counts agree with the tape record's
    rec = y._record
    assert rec.fwd_flops == phases["forward"]["flops"]
    assert rec.bwd_flops == phases["backward"]["flops"]


def test_profiler_phases_timing_and_inactivity(rng):
    g = rnd(rng, 64)
    kernels.launch("grad_norm_sq", g)  # no profiler: nothing is kept anywhere
    with profiler.Profiler(timing=True) as p:
        with profiler.phase("optimizer"):
            kernels.launch("grad_norm_sq", g)
        kernels.launch("neg", g)
    assert [(la.name, la.phase) for la in p.launches] == [
        ("grad_norm_sq", "optimizer"),
        ("neg", "forward"),
    ]
    assert p.launches[0].flops == 2 * 64 and p.launches[1].flops == 64
    assert all(la.seconds >= 0 for la in p.launches)
    assert p.by_phase()["optimizer"]["flops"] == 128
    kernels.launch("neg", g)
    assert len(p.launches) == 2  # the profiler stopped recording on exit
    assert abs(sum(r["share"] for r in p.census()) - 1.0) < 1e-9
