"""Grouped-query attention and the other shapes of F.scaled_dot_product_attention, naive and
flash, on the CPU: q (B, H, Tq, D) against k, v (B, Hkv, Tk, D), query head h reading kv head
h // (H / Hkv), against a float64 NumPy reference that repeats k and v explicitly (Hugging
Face's repeat_kv); Hkv = 1 (multi-query) and Hkv = H included, Tq < Tk (a KV-cache decode step),
ragged flash blocks, 2-byte dtypes; the FLOPs and bytes counted (those of H full heads, no
repeated k or v); broadcast operands (the gradient summed back to each one's shape), 2-D and
3-D inputs, scale=, and the one-line errors for what is not supported. The kernels' own
grouped-query cases, on every device: tests/kernels/test_attention.py.
"""

import math

import numpy as np
import pytest
from gradcheck import gradcheck

from tinygrad_like import Tensor, dtypes
from tinygrad_like import functional as F
from tinygrad_like.kernels.attention import spec as attention

F16, BF16, F32, F64 = dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64
TOL = {F64: 1e-10, F32: 1e-5, F16: 2e-3, BF16: 1.6e-2}  # relative to the largest value
GROUPS = [(4, 2), (4, 1), (3, 3), (6, 2), (8, 4)]  # (H, Hkv): MQA, MHA, G = 3


def reference(q, k, v, dout, scale=None):
    """-> out, dq, dk, dv in float64 for q (..., H, Tq, D), k, v (..., Hkv, Tk, D), dout like
    out: k and v repeated to H heads (kv head j -> heads j G ... j G + G - 1), the causal mask
    aligned bottom-right, dk and dv summed back over each group."""
    q, k, v, dout = (np.asarray(a, np.float64) for a in (q, k, v, dout))
    G = q.shape[-3] // k.shape[-3]
    kr, vr = np.repeat(k, G, axis=-3), np.repeat(v, G, axis=-3)
    Tq, Tk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(D) if scale is None else scale
    s = scale * q @ kr.swapaxes(-1, -2)
    s[..., np.triu(np.ones((Tq, Tk), bool), k=Tk - Tq + 1)] = -np.inf
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = dout @ vr.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dk, dv = scale * ds.swapaxes(-1, -2) @ q, p.swapaxes(-1, -2) @ dout

    def per_kv_head(g):  # (..., H, Tk, D) -> (..., Hkv, Tk, D)
        return g.reshape(*g.shape[:-3], -1, G, *g.shape[-2:]).sum(-3)

    return [p @ vr, scale * ds @ kr, per_kv_head(dk), per_kv_head(dv)]


def run(q, k, v, dout, flash, **kwargs):
    """-> out, dq, dk, dv as float64 NumPy arrays, through one tape record."""
    leaves = [Tensor(a, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, flash=flash, **kwargs)
    out.backward(dout)
    return [a.astype(F64) for a in (out.numpy(), *(t.grad.numpy() for t in leaves))]


def assert_close(got, ref, tol):
    for g, r in zip(got, ref):
        assert g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol * max(np.abs(r).max(), 1.0))


def inputs(rng, B, H, Hkv, Tq, Tk, D, dtype=F64):
    """q and dout as (B, T, H, D) transposed to (B, H, T, D), as a model makes them; k, v
    contiguous (B, Hkv, Tk, D), as a KV cache holds them."""
    q, dout = (rng.standard_normal((B, Tq, H, D)).astype(dtype).swapaxes(1, 2) for _ in "qd")
    k, v = (rng.standard_normal((B, Hkv, Tk, D)).astype(dtype) for _ in "kv")
    return q, k, v, dout


@pytest.fixture
def small_blocks(monkeypatch):
    """Flash blocks of 4 queries and 3 keys: ragged, and many block pairs per head."""
    monkeypatch.setattr(attention, "FLASH_BQ", 4)
    monkeypatch.setattr(attention, "FLASH_BK", 3)


@pytest.mark.parametrize("flash", [False, True], ids=["naive", "flash"])
@pytest.mark.parametrize("dtype", [F64, F32], ids=dtypes.name)
@pytest.mark.parametrize("H,Hkv", GROUPS, ids=str)
@pytest.mark.parametrize("Tq,Tk", [(9, 9), (5, 11), (1, 7)], ids=["Tq=Tk", "Tq<Tk", "decode"])
def test_grouped_query_attention_equals_repeated_kv(
    rng, small_blocks, flash, dtype, H, Hkv, Tq, Tk
):
    args = inputs(rng, 2, H, Hkv, Tq, Tk, 5, dtype)
    assert_close(run(*args, flash=flash), reference(*args), TOL[dtype])


@pytest.mark.parametrize("flash", [False, True], ids=["naive", "flash"])
def test_grouped_query_attention_in_default_blocks(rng, flash):
    """The spec's own 64-blocks, ragged: 130 queries, a prompt of 20 after 110 cached keys."""
    for Tq, Tk in [(130, 130), (20, 130)]:
        args = inputs(rng, 1, 4, 2, Tq, Tk, 8)
        assert_close(run(*args, flash=flash), reference(*args), TOL[F64])


@pytest.mark.parametrize("flash", [False, True], ids=["naive", "flash"])
@pytest.mark.parametrize("dtype", [F16, BF16], ids=dtypes.name)
def test_two_byte_formats_are_close_to_the_reference(rng, flash, dtype):
    args = inputs(rng, 1, 6, 2, 70, 70, 16, dtype)
    assert_close(run(*args, flash=flash), reference(*args), 4 * TOL[dtype])


@pytest.mark.parametrize("flash", [False, True], ids=["naive", "flash"])
def test_finite_difference_gradients_fp64(rng, small_blocks, flash):
    q, k, v, _ = inputs(rng, 1, 4, 2, 5, 7, 3)
    gradcheck(lambda *t: F.scaled_dot_product_attention(*t, flash=flash), q, k, v)


def record_of(H, Hkv, flash, contiguous_q=True, B=2, T=70, D=8):
    rng = np.random.default_rng(0)
    q, k, v, _ = inputs(rng, B, H, Hkv, T, T, D, F32)
    q = np.ascontiguousarray(q) if contiguous_q else q
    leaves = [Tensor(a, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, flash=flash)
    out.backward(np.ones(out.shape, F32))
    return out._record


@pytest.mark.parametrize("flash", [False, True], ids=["naive", "flash"])
def test_flops_are_those_of_full_heads_and_bytes_those_of_the_kv_heads(flash):
    """GQA computes as many scores as H full heads (FLOPs per query head) and reads and
    writes k, v, dk, dv of Hkv heads: the bytes of H heads less those of the heads it lacks."""
    B, H, Hkv, T, D = 2, 4, 2, 70, 8
    gqa, mha = record_of(H, Hkv, flash), record_of(H, H, flash)
    assert (gqa.fwd_flops, gqa.bwd_flops) == (mha.fwd_flops, mha.bwd_flops)
    assert (gqa.fwd_launches, gqa.bwd_launches) == (mha.fwd_launches, mha.bwd_launches)
    kv_heads = (H - Hkv) * B * T * D * 4  # the heads GQA lacks of one of k, v, dk, dv (fp32)
    assert mha.fwd_bytes - gqa.fwd_bytes == 2 * kv_heads  # k and v read
    assert mha.bwd_bytes - gqa.bwd_bytes == 4 * kv_heads  # k and v read, dk and dv written
    if flash:
        scores = attention.flash_scores(np.empty((B, H, T, D)), np.empty((B, Hkv, T, D)))
        assert scores == B * H * (64 * 64 + 6 * 70)
        assert gqa.fwd_flops == (4 * D + 5) * scores


def test_a_transposed_query_is_copied_once_by_the_naive_record():
    """q as (B, T, H, D) -> (B, H, T, D) cannot be viewed as a group's (G Tq) rows: one
    counted copy of q in the forward (and of the output gradient in the backward when it is
    such a view too), G > 1 only."""
    B, H, T, D = 2, 4, 70, 8
    for Hkv, copies in [(2, 1), (4, 0)]:
        view, contiguous = (record_of(H, Hkv, False, c) for c in (False, True))
        assert view.fwd_launches - contiguous.fwd_launches == copies
        assert view.fwd_bytes - contiguous.fwd_bytes == copies * 2 * B * H * T * D * 4


@pytest.mark.parametrize("flash", [False, True], ids=["naive", "flash"])
def test_a_broadcast_query_gets_its_gradient_summed_back(rng, flash):
    """Issue 26: q (4, 3, 8) against k = v (4, 4, 6, 8) is q broadcast over the batch: its
    gradient is the sum over the batch, in q's shape."""
    q, k = rng.standard_normal((4, 3, 8)), rng.standard_normal((4, 4, 6, 8))
    dout = rng.standard_normal((4, 4, 3, 8))
    leaves = [Tensor(a, requires_grad=True) for a in (q, k)]
    out = F.scaled_dot_product_attention(leaves[0], leaves[1], leaves[1], flash=flash)
    out.backward(dout)
    ref = reference(np.broadcast_to(q, (4, 4, 3, 8)), k, k, dout)
    assert_close(
        [out.numpy(), leaves[0].grad.numpy(), leaves[1].grad.numpy()],
        [ref[0], ref[1].sum(0), ref[2] + ref[3]],
        TOL[F64],
    )


@pytest.mark.parametrize("flash", [False, True], ids=["naive", "flash"])
def test_broadcast_keys_values_and_heads(rng, flash):
    """k shared by the batch, v by the kv heads, a q of one head against 2 kv heads: each
    gradient is summed over what its operand was broadcast along."""
    q, k, v = (rng.standard_normal(s) for s in [(3, 1, 5, 4), (1, 2, 7, 4), (3, 1, 7, 4)])
    dout = rng.standard_normal((3, 2, 5, 4))
    full = [np.broadcast_to(a, s) for a, s in zip((q, k, v), [(3, 2, 5, 4)] + [(3, 2, 7, 4)] * 2)]
    out, dq, dk, dv = reference(*full, dout)
    want = [out, dq.sum(1, keepdims=True), dk.sum(0, keepdims=True), dv.sum(1, keepdims=True)]
    assert_close(run(q, k, v, dout, flash), want, TOL[F64])


@pytest.mark.parametrize("flash", [False, True], ids=["naive", "flash"])
@pytest.mark.parametrize("shape", [(3, 6, 4), (6, 4)], ids=["3-D", "2-D"])
def test_inputs_of_fewer_dims(rng, flash, shape):
    """(H, T, D) and (T, D): a batch of one, and one head."""
    q, k, v, dout = (rng.standard_normal(shape) for _ in range(4))
    ref = reference(*(a.reshape((1,) * (4 - len(shape)) + shape) for a in (q, k, v, dout)))
    assert_close(run(q, k, v, dout, flash), [r.reshape(shape) for r in ref], TOL[F64])


@pytest.mark.parametrize("flash", [False, True], ids=["naive", "flash"])
def test_scale(rng, flash):
    args = inputs(rng, 1, 4, 2, 5, 8, 4)
    assert_close(run(*args, flash=flash, scale=0.3), reference(*args, scale=0.3), TOL[F64])


def test_the_flash_record_saves_kv_heads_only(rng):
    q, k, v, _ = inputs(rng, 1, 8, 2, 64, 64, 8, F32)
    out = F.scaled_dot_product_attention(
        *(Tensor(a, requires_grad=True) for a in (q, k, v)), flash=True
    )
    saved = [a.shape for a in out._record.ctx.saved]  # q, k, v, out, lse
    assert saved == [(1, 8, 64, 8), (1, 2, 64, 8), (1, 2, 64, 8), (1, 8, 64, 8), (1, 8, 64)]


@pytest.mark.parametrize(
    "q,k,v,error,message",
    [
        ((8,), (3, 8), (3, 8), ValueError, r"need q \(\.\.\., Tq, D\) and k, v"),
        ((2, 4, 3, 8), (2, 2, 3, 6), (2, 2, 3, 6), ValueError, "need equal head dims"),
        ((2, 4, 3, 8), (2, 2, 3, 8), (2, 2, 5, 8), ValueError, r"need k and v of one \(Tk, D\)"),
        ((2, 4, 5, 8), (2, 2, 3, 8), (2, 2, 3, 8), ValueError, "at least as many keys"),
        ((2, 4, 3, 8), (2, 3, 3, 8), (2, 3, 3, 8), ValueError, "q's 4 heads a multiple of k and"),
        ((2, 4, 3, 8), (3, 2, 3, 8), (3, 2, 3, 8), ValueError, "leading dims .* broadcast"),
        ((2, 4, 3, 8), (2, 2, 3, 8), (2, 4, 3, 8), ValueError, r"\(and k's and v's heads\)"),
    ],
)
@pytest.mark.parametrize("flash", [False, True], ids=["naive", "flash"])
def test_unsupported_shapes_are_one_clear_error(q, k, v, error, message, flash):
    args = [Tensor(np.ones(s)) for s in (q, k, v)]
    with pytest.raises(error, match=message) as info:
        F.scaled_dot_product_attention(*args, flash=flash)
    assert f"q {q}, k {k}, v {v}" in str(info.value) and "\n" not in str(info.value)


def test_mixed_dtypes_are_a_type_error():
    q, kv = Tensor(np.ones((1, 2, 3, 4), F32)), Tensor(np.ones((1, 2, 3, 4), F64))
    with pytest.raises(TypeError, match="need one dtype, got float32, float64, float64"):
        F.scaled_dot_product_attention(q, kv, kv, flash=True)
