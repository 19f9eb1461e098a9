"""Softmaxes over rows (kernels/softmax): the naive attention's causal softmax (query i at
position Tk - Tq + i: a KV-cache decode step, a prompt after a cache), softmax and log_softmax
over rows, and cross-entropy over (N, Vp) logits whose columns past V = n_classes are padding,
targets -1 ignored; against float64 formulas. Masked scores and padding columns get exactly 0.

2-byte formats: statistics (per-row losses, log-sum-exps) in fp32, each result rounded once.
"""

import numpy as np
import pytest

from tinygrad_like import Tensor, dtypes, kernels, profiler
from tinygrad_like import functional as F
from tinygrad_like.kernels.softmax import cpu as softmax_cpu

from .check import BF16, EPS, F16, F32, F64, FLOATS, cases, cpu, f64, label, rand

HALF = [F16, BF16]

# ---------------------------------------------------------------- the causal softmax


def future(Tq, Tk):
    """(Tq, Tk): the keys after each query's position Tk - Tq + i."""
    return np.arange(Tk)[None, :] > (Tk - Tq + np.arange(Tq))[:, None]


def softmax_causal_fwd_ref(scores, scale):
    s = np.where(future(*scores.shape[-2:]), -np.inf, f64(scores) * scale)
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def softmax_causal_bwd_ref(probs, dprobs, scale):
    p, dp = f64(probs), f64(dprobs)
    return scale * p * (dp - (dp * p).sum(-1, keepdims=True))


def causal(put, dtype, Tq, Tk, size, direction):
    """Scores (2, 3, Tq, Tk) of a size; or the CPU's probabilities of them and their
    gradient."""
    scores = rand((2, 3, Tq, Tk), dtype, scale=size, seed=1)
    if direction == "fwd":
        return put(scores), 0.125
    dprobs = rand((2, 3, Tq, Tk), dtype, seed=2)
    return put(cpu.softmax_causal_fwd(scores, 0.125)), put(dprobs), 0.125


def masked_exactly_zero(results, scores, *rest):
    """The future keys get exactly 0 (not just small), the others more (scores of a modest
    size); a first query that sees only the first key gives it exactly 1."""
    Tq, Tk = scores.shape[-2:]
    out = f64(results[0])
    assert not out[..., future(Tq, Tk)].any()
    if len(rest) == 1 and np.abs(f64(scores)).max() < 100:  # the forward
        assert np.all(out[..., ~future(Tq, Tk)] > 0)
        if Tq == Tk:
            assert np.all(out[..., 0, 0] == 1.0)


# (Tq, Tk): full, a KV-cache chunk, a decode step; small ones
CAUSAL = [(37, 37), (5, 70), (1, 33), (4, 4), (2, 6), (1, 3)]

# ---------------------------------------------------------------- softmax over rows


def softmax_fwd_ref(x):
    e = np.exp(f64(x) - f64(x).max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def log_softmax_fwd_ref(x):
    s = f64(x) - f64(x).max(-1, keepdims=True)
    return s - np.log(np.exp(s).sum(-1, keepdims=True))


def softmax_bwd_ref(y, dy):
    return f64(y) * (f64(dy) - (f64(dy) * f64(y)).sum(-1, keepdims=True))


def log_softmax_bwd_ref(y, dy):
    return f64(dy) - np.exp(f64(y)) * f64(dy).sum(-1, keepdims=True)


def over_rows(put, dtype, shape, kernel):
    """x of shape (rows of the last axis); for a backward the CPU forward's y, and dy."""
    x, dy = rand(shape, dtype, scale=3.0, seed=1), rand(shape, dtype, seed=2)
    if kernel.endswith("fwd"):
        return put(x)
    return put(getattr(cpu, kernel.replace("bwd", "fwd"))(x)), put(dy)


# ragged, a row of one, rows of one, one row past a warp, a vocabulary-wide row
ROWS = [(3, 37, 70), (4, 1), (2, 1500), (1, 1), (4, 33)]
ROW_KERNELS = {
    "softmax_fwd": softmax_fwd_ref,
    "softmax_bwd": softmax_bwd_ref,
    "log_softmax_fwd": log_softmax_fwd_ref,
    "log_softmax_bwd": log_softmax_bwd_ref,
}

# ---------------------------------------------------------------- cross-entropy


def ce_fwd_ref(logits, targets, n_classes=None):
    """The losses (0 where ignored) and each row's log-sum-exp over the first n_classes."""
    lf = f64(logits)[:, :n_classes]
    m = lf.max(1, keepdims=True)
    lse = np.log(np.exp(lf - m).sum(1)) + m[:, 0]
    valid = targets >= 0
    picked = lf[np.arange(len(targets)), np.where(valid, targets, 0)]
    return np.where(valid, lse - picked, 0.0), lse


def ce_bwd_ref(logits, lse, targets, dloss, n_classes=None):
    """dloss (softmax - onehot) from the given lse, 0 in the padding and the ignored rows."""
    V = logits.shape[1] if n_classes is None else n_classes
    p = np.zeros(logits.shape)
    p[:, :V] = np.exp(f64(logits)[:, :V] - f64(lse)[:, None])
    valid = targets >= 0
    p[np.flatnonzero(valid), targets[valid]] -= 1
    p[~valid] = 0
    return f64(dloss)[0] * p


def ce_fwd_bwd_ref(logits, targets, dloss, n_classes=None, out=None):
    losses, lse = ce_fwd_ref(logits, targets, n_classes)
    return losses, ce_bwd_ref(logits, lse, targets, dloss, n_classes)


def gpt2_vocab(dtype):
    """(the statistics' dtype, logits (33, 50257) with one row of large logits (the max must be
    subtracted), targets with ignored rows and the last class)."""
    N, V = 33, 50257
    logits = rand((N, V), np.float64, scale=4.0, seed=1)
    logits[3] += 1000.0 if dtype != F16 else 100.0
    targets = np.random.default_rng(2).integers(0, V, N)
    targets[[0, 7, 8, 32]] = -1
    targets[5] = V - 1
    return dtypes.compute_dtype(dtype), logits.astype(dtype), targets


def padded(dtype, N, V, Vp):
    """(the statistics' dtype, logits (N, Vp) whose padding columns past V are huge, targets
    with every fourth ignored and the last class used)."""
    logits = rand((N, Vp), dtype, scale=3.0, seed=5)
    logits[:, V:] = 1e4 if dtype != F16 else 6e4
    targets = np.random.default_rng(6).integers(0, V, N)
    targets[::4] = -1
    targets[-1] = V - 1
    return dtypes.compute_dtype(dtype), logits, targets


def cross_entropy(put, dtype, rows, kernel):
    """The kernel's arguments on rows: "gpt2" (33 rows of GPT-2's vocabulary, all columns
    classes), or (N, V, Vp) padded rows; the backward's lse is the CPU forward's, dloss 1 over
    the count of targets (gpt2) or 0.5; "in place" writes dlogits over the logits."""
    if rows == "gpt2":
        stat, logits, targets = gpt2_vocab(dtype)
        V, dloss = {}, np.array([1.0 / (targets >= 0).sum()], stat)
    else:
        stat, logits, targets = padded(dtype, *rows[:3])
        V, dloss = {"n_classes": rows[1]}, np.array([0.5], stat)
    if kernel == "cross_entropy_fwd":
        return put(logits), put(targets), V
    if kernel == "cross_entropy_bwd":
        lse = cpu.cross_entropy_fwd(logits, targets, **V)[1]
        return put(logits), put(lse), put(targets), put(dloss), V
    if len(rows) == 4:  # in place: out = the logits
        in_place = put(logits)
        return in_place, put(targets), put(dloss), {**V, "out": in_place}
    return put(logits), put(targets), put(dloss), V


def nothing_from_padding_or_ignored_rows(results, logits, *rest, n_classes=None, out=None):
    """dlogits (the last result) is exactly 0 in the padding columns and the ignored rows."""
    targets = rest[1] if len(rest) == 3 else rest[0]  # bwd: lse, targets, dloss
    dlogits = f64(results[-1])
    assert not dlogits[targets < 0].any()
    assert n_classes is None or not dlogits[:, n_classes:].any()


def counted(put, dtype, N, ignored):
    """N targets in [0, 50), `ignored` of them -1."""
    targets = np.random.default_rng(3).integers(0, 50, N)
    targets[:ignored] = -1
    return put(targets), dtype


def inverse_count_ref(targets, dtype):
    """1 / the count in fp64, rounded once to dtype: bit for bit."""
    return np.asarray(np.float64(1.0) / np.count_nonzero(targets >= 0), dtype)


ROWS_CE = ["gpt2", (33, 50257, 50304), (5, 11, 64), (1, 7, 8)]
IN_PLACE = [(5, 11, 64, "in place"), (1, 7, 8, "in place")]
CE = {
    "cross_entropy_fwd": ce_fwd_ref,
    "cross_entropy_bwd": ce_bwd_ref,
    "cross_entropy_fwd_bwd": ce_fwd_bwd_ref,
}

CASES = [
    *cases(
        "inverse_count",
        counted,
        [(d, N, k) for d in (F32, F64) for N, k in ((1, 0), (7, 3), (1024, 1000))],
        ref=inverse_count_ref,
        exact=True,
    ),
    *cases(
        "softmax_causal_fwd",
        causal,
        [(d, *t, 3.0, "fwd") for d in FLOATS for t in CAUSAL] + [(F32, 3, 3, 1e4, "fwd")],
        ref=softmax_causal_fwd_ref,
        holds=masked_exactly_zero,
    ),
    *cases(
        "softmax_causal_bwd",
        causal,
        [(d, *t, 3.0, "bwd") for d in FLOATS for t in CAUSAL],
        ref=softmax_causal_bwd_ref,
        holds=masked_exactly_zero,
    ),
    *[
        c
        for kernel, ref in ROW_KERNELS.items()
        for c in cases(kernel, over_rows, [(d, s, kernel) for d in FLOATS for s in ROWS], ref=ref)
    ],
    *cases(
        "cross_entropy_fwd",
        cross_entropy,
        [(d, r, "cross_entropy_fwd") for d in FLOATS for r in ROWS_CE],
        ref=ce_fwd_ref,
    ),
    *[
        c
        for kernel in ("cross_entropy_bwd", "cross_entropy_fwd_bwd")
        for c in cases(
            kernel,
            cross_entropy,
            [(d, r, kernel) for d in FLOATS for r in ROWS_CE]
            + [(d, r, kernel) for d in FLOATS for r in IN_PLACE if kernel.endswith("fwd_bwd")],
            ref=CE[kernel],
            holds=nothing_from_padding_or_ignored_rows,
        )
    ],
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel(case, check):
    check(case)


# ---------------------------------------------------------------- what a case cannot say


@pytest.mark.parametrize("bad", [11, 15, 63, 64, 99, -2])
def test_a_target_out_of_range_is_refused_before_any_launch(device, bad):
    """The kernels index each row with its target: one past V (even inside the padding) is
    refused on the host, with ops.cross_entropy's message."""
    logits, lse = device.asarray(rand((4, 64), F32)), device.asarray(np.zeros(4, F32))
    targets, dloss = device.asarray(np.array([0, bad, -1, 10])), device.asarray(np.ones(1, F32))
    for call in (
        lambda: device.cross_entropy_fwd(logits, targets, 11),
        lambda: device.cross_entropy_bwd(logits, lse, targets, dloss, 11),
        lambda: device.cross_entropy_fwd_bwd(logits, targets, dloss, 11),
    ):
        with pytest.raises(ValueError, match=f"target id {bad} out of range for vocab 11"):
            call()


@pytest.mark.parametrize("bad", [11, 99, -2])
def test_the_op_refuses_a_target_out_of_range_alike(bad):
    logits, targets = rand((4, 16), F32), np.array([0, bad, -1, 10])
    with pytest.raises(ValueError, match=f"target id {bad} out of range for vocab 11"):
        F.cross_entropy(Tensor(logits), targets, n_classes=11)


@pytest.mark.parametrize("dtype", FLOATS, ids=dtypes.name)
@pytest.mark.parametrize("N,V,Vp", ROWS_CE[1:], ids=label)
def test_fwd_bwd_in_place_is_the_copys_bits(device, dtype, N, V, Vp):
    """dlogits written over the logits (the fused head's call) are the bits written to a new
    array."""
    _, logits, targets = padded(dtype, N, V, Vp)
    dloss = device.asarray(np.array([0.5], dtypes.compute_dtype(dtype)))
    targets = device.asarray(targets)
    new = device.cross_entropy_fwd_bwd(device.asarray(logits), targets, dloss, V)
    in_place = device.asarray(logits)
    got = device.cross_entropy_fwd_bwd(in_place, targets, dloss, V, out=in_place)
    assert got[1] is in_place
    for a, b in zip(got, new):
        assert device.to_numpy(a).tobytes() == device.to_numpy(b).tobytes()


@pytest.mark.parametrize("N,V,Vp", [(33, 50257, 50304), (9, 50, 64)], ids=label)
def test_cpu_bf16_cross_entropy_a_row_at_a_time_is_the_widened_logits_bits(N, V, Vp):
    """bf16 logits into bf16 dlogits run a row at a time (softmax/cpu.py's _ce_bf16): the bits of
    widening the logits, the fp32 kernel, then rounding dlogits, for the forward, the backward
    and both in one pass (padding columns, ignored targets)."""
    _, logits, targets = padded(BF16, N, V, Vp)
    wide, dloss = f64(logits).astype(F32), np.array([0.25], F32)
    got_losses, got_lse = cpu.cross_entropy_fwd(logits, targets, V)
    want_losses, want_lse = cpu.cross_entropy_fwd(wide, targets, V)
    assert got_losses.tobytes() == want_losses.tobytes() and got_lse.tobytes() == want_lse.tobytes()
    got = cpu.cross_entropy_bwd(logits, got_lse, targets, dloss, V)
    want = cpu.cross_entropy_bwd(wide, want_lse, targets, dloss, V).astype(BF16)
    assert got.dtype == BF16 and got.tobytes() == want.tobytes()
    got = cpu.cross_entropy_fwd_bwd(logits, targets, dloss, V)
    want = cpu.cross_entropy_fwd_bwd(wide, targets, dloss, V)
    assert got[0].tobytes() == want[0].tobytes()
    assert got[1].tobytes() == want[1].astype(BF16).tobytes()


def test_cpu_half_rows_widened_in_blocks_match_one_block(monkeypatch):
    """2-byte scores are widened a block of whole (Tq, Tk) matrices at a time (the causal rule
    reads row % Tq): blocks of 3 matrices give the bits of one block of all 12."""
    scores = rand((4, 3, 5, 7), F16, scale=3, seed=1)
    dprobs = rand((4, 3, 5, 7), F16, seed=2)
    whole = cpu.softmax_causal_fwd(scores, 0.5), cpu.softmax_causal_bwd(scores, dprobs, 0.5)
    monkeypatch.setattr(softmax_cpu, "_WIDEN_ELEMENTS", 3 * 5 * 7)
    blocks = cpu.softmax_causal_fwd(scores, 0.5), cpu.softmax_causal_bwd(scores, dprobs, 0.5)
    for got, want in zip(blocks, whole):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [F32, np.float64], ids=dtypes.name)
def test_cpu_softmax_at_scale_1_reads_x_with_the_bits_of_a_scaled_copy(dtype):
    """At scale 1 the rows are read where they are; at another scale a scaled copy is made
    first: rows 2x at scale 0.5 (x, exactly) give softmax_fwd's bits, ragged lengths, zeros of
    both signs and infinities included."""
    for C in (1, 15, 16, 33, 1000):
        x = rand((5, C), dtype, scale=4, seed=C)
        x[0, :2] = [-0.0, 0.0][: min(C, 2)]
        x[1, -1] = -np.inf
        copied = cpu.softmax_causal_fwd((2 * x).reshape(5, 1, C), 0.5).reshape(5, C)
        assert cpu.softmax_fwd(x).tobytes() == copied.tobytes(), C


def test_cpu_softmax_of_a_row_of_minus_inf_is_nan():
    x = np.array([[-np.inf] * 3, [0.0, 1.0, 2.0]], F32)
    for fn in (cpu.softmax_fwd, cpu.log_softmax_fwd):
        y = fn(x)
        assert np.all(np.isnan(y[0])) and np.all(np.isfinite(y[1])), fn.__name__


@pytest.mark.parametrize("dtype", HALF, ids=dtypes.name)
def test_cpu_cross_entropy_of_half_logits_is_fp32_accurate(dtype):
    """The reduction runs in fp32 on the rounded logits: fp32 accuracy; and the only error
    against fp32 logits is the input rounding (|dloss| <= 2 max|dlogit|)."""
    logits, targets = rand((6, 50), F32, scale=3), np.array([3, -1, 49, 0, 7, 7])
    lh = logits.astype(dtype)
    losses, lse = cpu.cross_entropy_fwd(lh, targets)
    assert losses.dtype == F32 and losses.shape == (6,) and lse.dtype == F32 and losses[1] == 0
    np.testing.assert_allclose(losses, ce_fwd_ref(lh, targets)[0], rtol=1e-5, atol=1e-5)
    bound = 2 * EPS[dtype] * np.abs(logits).max()
    np.testing.assert_allclose(losses, ce_fwd_ref(logits, targets)[0], rtol=0, atol=bound)


@pytest.mark.parametrize("N", [5, 21], ids=["5-rows", "21-rows"])
@pytest.mark.parametrize("dtype", [F32, *HALF], ids=dtypes.name)
def test_cpu_cross_entropy_fwd_then_bwd(dtype, N):
    """Losses at fp32's accuracy, dlogits within one rounding of float64's, each row's summing
    to 0."""
    V = 11
    logits, targets = rand((N, V), dtype, scale=2), np.random.default_rng(0).integers(0, V, N)
    targets[[0, 2, N - 1]] = [0, -1, V - 1]
    losses, lse = cpu.cross_entropy_fwd(logits, targets)
    dlogits = cpu.cross_entropy_bwd(logits, lse, targets, np.array([0.25], F32))
    want_losses, want_lse = ce_fwd_ref(logits, targets)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-5)
    want = ce_bwd_ref(logits, want_lse, targets, np.array([0.25]))
    np.testing.assert_allclose(f64(dlogits), want, rtol=EPS[dtype], atol=1e-7)
    assert np.all(f64(dlogits)[2] == 0) and losses[2] == 0
    np.testing.assert_allclose(f64(dlogits)[targets >= 0].sum(1), 0, atol=V * EPS[dtype])


@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtypes.name)
def test_cpu_cross_entropy_of_large_logits_is_finite(dtype):
    logits, targets = rand((3, 8), dtype, scale=1e4), np.array([1, 2, 3])
    losses, lse = cpu.cross_entropy_fwd(logits, targets)
    assert np.all(np.isfinite(losses))
    np.testing.assert_allclose(losses, ce_fwd_ref(logits, targets)[0], rtol=1e-6, atol=1e-3)
    dlogits = cpu.cross_entropy_bwd(logits, lse, targets, np.array([1.0], F32))
    assert np.all(np.isfinite(f64(dlogits)))


@pytest.mark.parametrize("dtype", [F32, *HALF], ids=dtypes.name)
def test_cpu_cross_entropy_over_the_first_n_classes_is_that_of_the_n_columns(dtype):
    """Rows of Vp = 16 columns, V = 11 classes (the padded LM head): the losses and lse bit for
    bit those of the V columns alone, and so are dlogits there."""
    N, V, Vp = 9, 11, 16
    _, logits, targets = padded(dtype, N, V, Vp)
    plain = np.ascontiguousarray(logits[:, :V])
    losses, lse = cpu.cross_entropy_fwd(logits, targets, V)
    want_losses, want_lse = cpu.cross_entropy_fwd(plain, targets)
    np.testing.assert_array_equal(losses, want_losses)
    np.testing.assert_array_equal(lse, want_lse)
    dlogits = cpu.cross_entropy_bwd(logits, lse, targets, np.array([0.5], F32), V)
    plain_dlogits = cpu.cross_entropy_bwd(plain, want_lse, targets, np.array([0.5], F32))
    np.testing.assert_array_equal(dlogits[:, :V], plain_dlogits)


@pytest.mark.parametrize(
    "N, V, Vp",
    [(1, 11, 16), (21, 11, 16), (37, 7001, 7040)],
    ids=["1-row", "21-rows", "37-rows-split-over-cores"],
)
@pytest.mark.parametrize("dtype", [F32, *HALF], ids=dtypes.name)
def test_cpu_cross_entropy_fwd_bwd_equals_fwd_then_bwd(dtype, N, V, Vp):
    """The one-pass kernel against the two it replaces in the fused head, on rows over the
    cores, ignored targets and huge padding columns: the losses bit for bit, dlogits to the
    fused head's fp32 tolerance before rounding (dloss / s scales exp(logit - max), where the
    backward rounds logit - lse, up to ~2^-19 here, before its exp), 0 in the padding and in
    ignored rows."""
    _, logits, targets = padded(dtype, N, V, Vp)
    dloss = np.array([0.37], F32)
    want_losses, lse = cpu.cross_entropy_fwd(logits, targets, V)
    want = cpu.cross_entropy_bwd(logits, lse, targets, dloss, V)
    losses, dlogits = cpu.cross_entropy_fwd_bwd(logits, targets, dloss, V)
    np.testing.assert_array_equal(losses, want_losses)
    tol = max(EPS[dtype], 1e-5)  # absolute: p - 1 at the target cancels
    np.testing.assert_allclose(f64(dlogits), f64(want), rtol=tol, atol=tol * dloss[0])
    assert not f64(dlogits)[:, V:].any() and not f64(dlogits)[targets < 0].any()
    in_place = logits.copy()
    got = cpu.cross_entropy_fwd_bwd(in_place, targets, dloss, V, out=in_place)
    assert got[1] is in_place
    np.testing.assert_array_equal(got[0], losses)
    np.testing.assert_array_equal(f64(in_place), f64(dlogits))


def test_cross_entropy_counts_the_classes_not_the_padding():
    """FLOPs and bytes of the launches: 4 FLOPs per class per row; the forward reads N·V
    logits, the backward reads N·V and writes the whole N·Vp dlogits (zeros included)."""
    N, V, Vp = 6, 11, 16
    x = Tensor(rand((N, Vp), F32), requires_grad=True)
    targets = np.random.default_rng(0).integers(0, V, N)
    with profiler.Profiler() as prof:
        F.cross_entropy(x, targets, n_classes=V).backward()
    ce = {x.name: x for x in prof.launches if x.name.startswith("cross_entropy")}
    assert ce["cross_entropy_fwd"].flops == ce["cross_entropy_bwd"].flops == 4 * N * V
    stats, ids = 4 * N, 8 * N  # fp32 losses or lse per row; int64 targets
    assert ce["cross_entropy_fwd"].bytes == 4 * N * V + ids + 2 * stats
    assert ce["cross_entropy_bwd"].bytes == 4 * N * V + stats + ids + 4 + 4 * N * Vp


def test_cross_entropy_fwd_bwd_counts_one_exp_per_class_and_its_bytes():
    """The one-pass kernel: 5 FLOPs and one exp per class per row; it reads the N·V logits, the
    targets and dloss and writes the losses and the whole N·Vp dlogits, also in place (out = the
    logits, whose bytes are then written, not read, twice)."""
    N, V, Vp = 6, 11, 16
    logits, targets = rand((N, Vp), F32), np.random.default_rng(0).integers(0, V, N)
    dloss = np.ones(1, F32)
    with profiler.Profiler() as prof:
        kernels.launch("cross_entropy_fwd_bwd", logits, targets, dloss, n_classes=V)
        kernels.launch("cross_entropy_fwd_bwd", logits, targets, dloss, n_classes=V, out=logits)
    for launch in prof.launches:
        assert (launch.flops, launch.exps) == (5 * N * V, N * V)
        assert launch.bytes == 4 * N * V + 8 * N + 4 + 4 * N + 4 * N * Vp


def test_cross_entropy_through_the_op_in_bf16_gives_an_fp32_loss():
    logits, targets = rand((4, 9), F32, scale=2), np.array([8, 0, -1, 3])
    x = Tensor(logits, requires_grad=True)
    loss = F.cross_entropy(x.bfloat16(), targets)
    assert loss.dtype == F32
    ref = ce_fwd_ref(logits.astype(BF16), targets)[0][[0, 1, 3]].mean()
    np.testing.assert_allclose(loss.item(), ref, rtol=1e-5)
    loss.backward()
    assert x.grad.dtype == F32 and np.all(x.grad.numpy()[2] == 0)
