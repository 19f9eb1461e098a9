"""Flash attention (F.scaled_dot_product_attention(flash=True), over kernels/attention's
flash_attention_fwd / _bwd) against the naive Attention record: the same outputs and gradients
on ragged shapes (T not a multiple of the block, T = 1, a KV-cache decode step and a prompt after
a cache), in every dtype; finite differences in float64 across several blocks; a tape record that
saves O(T) bytes per head; a GPT-2 with ExecutionOptions(attention="flash") equal to the naive
one (training and generation); and the FLOPs and bytes its launches are counted with. The
kernels themselves, on every device: tests/kernels/test_attention.py.
"""

import math

import numpy as np
import pytest
from gradcheck import gradcheck
from kernels.test_attention import DECODE, decode_inputs

import tinygrad_like as tg
from nn import GPT2, ExecutionOptions, GPT2Config
from tinygrad_like import Tensor, dtypes, kernels
from tinygrad_like import functional as F
from tinygrad_like.kernels.attention import cpu as attention_cpu
from tinygrad_like.kernels.attention import spec as attention

F16, BF16, F32, F64 = dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64
# (B, H, Tq, Tk, D): T = 1; ragged against the 64-blocks; a decode step; a prompt after a cache
SHAPES = [
    (2, 3, 1, 1, 8),
    (1, 2, 63, 63, 16),
    (2, 2, 65, 65, 8),
    (1, 2, 130, 130, 8),
    (2, 2, 1, 70, 16),
    (1, 3, 20, 150, 8),
]
TOL = {F64: 1e-10, F32: 1e-5, F16: 2e-3, BF16: 1.6e-2}  # relative to the largest value


def rand(rng, shape, dtype=F64):
    return rng.standard_normal(shape).astype(dtype)


def run(q, k, v, dout, flash):
    """-> out, dq, dk, dv as float64 NumPy arrays, through one tape record."""
    leaves = [Tensor(a, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, flash=flash)
    out.backward(dout)
    return [a.astype(F64) for a in (out.numpy(), *(t.grad.numpy() for t in leaves))]


def inputs(rng, B, H, Tq, Tk, D, dtype):
    return (
        rand(rng, (B, H, Tq, D), dtype),
        rand(rng, (B, H, Tk, D), dtype),
        rand(rng, (B, H, Tk, D), dtype),
        rand(rng, (B, H, Tq, D), dtype),
    )


def assert_close(got, ref, tol):
    """Relative to each array's largest value, or to 1 (the inputs' scale) for a zero array:
    at T = 1 dq and dk are 0, exactly on the naive side, rounding-small on the flash side."""
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol * max(np.abs(r).max(), 1.0))


@pytest.mark.parametrize("dtype", [F64, F32], ids=dtypes.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_and_gradients_equal_the_naive_attention(rng, dtype, shape):
    args = inputs(rng, *shape, dtype)
    assert_close(run(*args, flash=True), run(*args, flash=False), TOL[dtype])


@pytest.mark.parametrize("dtype", [F16, BF16], ids=dtypes.name)
def test_two_byte_formats_are_close_to_the_fp32_result(rng, dtype):
    """Both records get the same rounded inputs; flash computes in fp32 and rounds once, the
    naive record also rounds the scores and probabilities between its kernels."""
    args = inputs(rng, 1, 2, 130, 130, 16, dtype)
    ref = run(*[a.astype(F32) for a in args], flash=False)
    for flash in (True, False):
        assert_close(run(*args, flash=flash), ref, 4 * TOL[dtype])


@pytest.mark.parametrize("dtype", [F64, F32], ids=dtypes.name)
@pytest.mark.parametrize("shape", DECODE, ids=str)
def test_a_decode_step_equals_the_naive_attention(rng, dtype, shape):
    """Through the tape: out from the rows, the gradients from their lse."""
    H, Hkv, Tq, Tk = shape
    assert Tq * H // Hkv <= attention_cpu.DECODE_ROWS
    args = decode_inputs(rng, 2, H, Hkv, Tq, Tk, 16, dtype)
    assert_close(run(*args, flash=True), run(*args, flash=False), TOL[dtype])


@pytest.mark.parametrize("dtype", [F16, BF16], ids=dtypes.name)
def test_a_decode_step_in_two_byte_formats_is_close_to_fp32(rng, dtype):
    args = decode_inputs(rng, 2, 4, 2, 3, 70, 16, dtype)
    ref = run(*[a.astype(F32) for a in args], flash=False)
    assert_close(run(*args, flash=True), ref, 4 * TOL[dtype])
    out, lse = kernels.on("cpu").flash_attention_fwd(*args[:3], 0.25)
    assert (out.dtype, lse.dtype) == (dtype, F32)


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 2 queries and 3 keys, so that a few positions span many block pairs."""
    monkeypatch.setattr(attention, "FLASH_BQ", 2)
    monkeypatch.setattr(attention, "FLASH_BK", 3)


@pytest.mark.parametrize("Tq, Tk", [(5, 5), (3, 7), (1, 4)], ids=["Tq=Tk", "Tq<Tk", "decode"])
def test_finite_difference_gradients_across_blocks_fp64(rng, small_blocks, Tq, Tk):
    q, k, v = rand(rng, (1, 2, Tq, 3)), rand(rng, (1, 2, Tk, 3)), rand(rng, (1, 2, Tk, 3))
    gradcheck(lambda *t: F.scaled_dot_product_attention(*t, flash=True), q, k, v)
    args = q, k, v, rand(rng, q.shape)
    assert_close(run(*args, flash=True), run(*args, flash=False), TOL[F64])


def record_of(T, flash, B=2, H=2, D=8, dtype=F32):
    rng = np.random.default_rng(0)
    q, k, v = (Tensor(rand(rng, (B, H, T, D), dtype), requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, flash=flash)
    return out, out._record


def test_the_record_saves_q_k_v_out_and_lse_only():
    out, record = record_of(64, flash=True)
    assert [a.shape for a in record.ctx.saved] == [(2, 2, 64, 8)] * 4 + [(2, 2, 64)]
    assert record.ctx.saved[3] is out.data
    per_token = [record_of(T, flash=True)[1].saved_bytes / T for T in (64, 256)]
    assert per_token[0] == per_token[1] == 2 * 2 * (4 * 8 + 1) * 4  # B H (4 D + 1) fp32
    naive = [record_of(T, flash=False)[1].saved_bytes / T for T in (64, 256)]
    assert naive[1] - naive[0] == 2 * 2 * (256 - 64) * 4  # the probabilities


def test_flops_and_bytes_of_the_launches():
    """T = 130 in blocks of 64: the query blocks see 64, 128 and 130 keys."""
    B, H, T, D = 2, 2, 130, 8
    out, record = record_of(T, flash=True, B=B, H=H, D=D)
    scores = B * H * (64 * 64 + 64 * 128 + 2 * 130)
    assert attention.flash_scores(out.data, out.data) == scores
    assert record.fwd_flops == (4 * D + 5) * scores and record.fwd_launches == 1
    qkv = B * H * T * D * 4
    assert record.fwd_bytes == 4 * qkv + B * H * T * 4  # reads q, k, v; writes out, lse
    out.backward(np.ones(out.shape, F32))
    assert record.bwd_flops == (10 * D + 4) * scores and record.bwd_launches == 1
    assert record.bwd_bytes == 5 * qkv + B * H * T * 4 + 3 * qkv  # + dout; writes dq, dk, dv


CONFIG = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=160, vocab_size=50)


def models(dtype):
    """The same GPT-2 with each attention, the plain head (its logits are compared too)."""
    return [
        GPT2(CONFIG, seed=1, options=ExecutionOptions(attention=a, lm_head="plain")).to(dtype)
        for a in ("flash", "naive")
    ]


@pytest.mark.parametrize("dtype,tol", [("fp64", 1e-10), ("fp32", 1e-5)])
def test_gpt2_with_flash_attention_equals_naive(dtype, tol):
    idx = np.random.default_rng(2).integers(0, 50, (2, 131))
    results = []
    for model in models(dtype):
        logits, loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        results.append(
            [logits.numpy(), loss.numpy()] + [p.grad.numpy() for p in model.parameters()]
        )
    assert_close(*results, tol)


def test_gpt2_generation_with_a_kv_cache_is_the_same():
    """The prompt fills the cache (Tq = Tk), then each decode step is Tq = 1 < Tk, no_grad."""
    prompt = np.random.default_rng(3).integers(0, 50, (2, 70))
    flash, naive = (m.generate(prompt, 8, temperature=0) for m in models("fp64"))
    np.testing.assert_array_equal(flash, naive)
    with tg.no_grad():
        y = F.scaled_dot_product_attention(
            *(Tensor(np.ones((1, 1, 1, 4))) for _ in range(3)), flash=True
        )
    assert y._record is None and math.isclose(float(y.numpy()[0, 0, 0, 0]), 1.0)
