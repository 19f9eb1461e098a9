"""Flash attention (ops.FlashAttention, cpu.flash_attention_fwd / _bwd) against the naive
Attention record: the same outputs and gradients on ragged shapes (T not a multiple of the
block, T = 1, a KV-cache decode step and a prompt after a cache), in every dtype; finite
differences in float64 across several blocks; a tape record that saves O(T) bytes per head;
a GPT-2 with ExecutionOptions(attention="flash") equal to the naive one (training and
generation); and the FLOPs and bytes its launches are counted with. The CUDA kernels are
compared with these in test_cuda_kernels.py, their launches checked in
test_cuda_launch_args.py.
"""

import math

import numpy as np
import pytest
from gradcheck import gradcheck

import tinygrad_like as tg
from nn import GPT2, ExecutionOptions, GPT2Config
from tinygrad_like import Tensor, dtypes
from tinygrad_like import functional as F
from tinygrad_like.backend import cpu
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


def test_the_output_has_the_input_dtype_and_lse_is_fp32(rng):
    q, k, v, _ = inputs(rng, 1, 2, 5, 9, 4, BF16)
    out, lse = cpu.flash_attention_fwd(q, k, v, 0.5)
    assert (out.dtype, out.shape, lse.dtype, lse.shape) == (BF16, q.shape, F32, q.shape[:-1])
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(F32), k.astype(F32)) * 0.5
    s[..., np.triu(np.ones((5, 9), bool), k=9 - 5 + 1)] = -np.inf
    np.testing.assert_allclose(lse, np.log(np.exp(s).sum(-1)), rtol=1e-6)


# A decode step's rows (cpu.attention._attention_rows, Tq G <= DECODE_ROWS): (H, Hkv, Tq, Tk)
# with Tk of 1, a key block's end (64) and past it, ragged; Tq = 1, 2, 3; grouped-query heads
DECODE = [
    (2, 2, 1, 1),
    (2, 2, 1, 64),
    (3, 3, 2, 65),
    (2, 2, 3, 130),
    (4, 2, 3, 3),
    (6, 2, 2, 70),
    (4, 1, 1, 129),
]


def decode_inputs(rng, B, H, Hkv, Tq, Tk, D, dtype, length=200):
    """q a (B, H, Tq, D) view of a (B, Tq, 3 H D) projection, transposed; k, v the first Tk
    positions of (B, Hkv, length, D) caches: the strided views a model passes."""
    qkv = rand(rng, (B, Tq, 3 * H * D), dtype)
    q = qkv[..., : H * D].reshape(B, Tq, H, D).transpose(0, 2, 1, 3)
    k, v = (rand(rng, (B, Hkv, length, D), dtype)[:, :, :Tk] for _ in range(2))
    return q, k, v, rand(rng, q.shape, dtype)


@pytest.mark.parametrize("dtype", [F64, F32], ids=dtypes.name)
@pytest.mark.parametrize("shape", DECODE, ids=str)
def test_a_decode_step_equals_the_naive_attention(rng, dtype, shape):
    """Through the tape: out from the rows, the gradients from their lse."""
    H, Hkv, Tq, Tk = shape
    assert Tq * H // Hkv <= cpu.attention.DECODE_ROWS
    args = decode_inputs(rng, 2, H, Hkv, Tq, Tk, 16, dtype)
    assert_close(run(*args, flash=True), run(*args, flash=False), TOL[dtype])


@pytest.mark.parametrize("shape", DECODE, ids=str)
def test_a_decode_step_equals_the_blocks(rng, monkeypatch, shape):
    """out and lse of the rows against those of the query blocks, on contiguous inputs and on
    views whose rows are not contiguous (copied by the kernel)."""
    H, Hkv, Tq, Tk = shape
    q, k, v, _ = decode_inputs(rng, 2, H, Hkv, Tq, Tk, 16, F32)
    strided = k[..., ::-1], np.repeat(v, 2, axis=-1)[..., ::2]  # rows reversed, or strided
    got = [cpu.flash_attention_fwd(q, *kv, 0.3) for kv in ((k, v), strided)]
    monkeypatch.setattr(cpu.attention, "DECODE_ROWS", 0)
    for kv, (out, lse) in zip(((k, v), strided), got):
        want = cpu.flash_attention_fwd(*(np.ascontiguousarray(a) for a in (q, *kv)), 0.3)
        assert (out.dtype, lse.dtype, lse.shape) == (F32, F32, q.shape[:-1])
        assert_close([out, lse], want, TOL[F32])


def test_a_long_decode_step_runs_its_rows_across_the_cores(rng, monkeypatch):
    """k of 2^21 elements: prange's kernel (the tests above run its one-core twin)."""
    q, k, v, _ = decode_inputs(rng, 2, 4, 2, 1, 1 << 14, 32, F32, length=1 << 14)
    out, lse = cpu.flash_attention_fwd(q, k, v, 0.2)
    monkeypatch.setattr(cpu.attention, "DECODE_ROWS", 0)
    assert_close([out, lse], cpu.flash_attention_fwd(q, k, v, 0.2), TOL[F32])


@pytest.mark.parametrize("dtype", [F16, BF16], ids=dtypes.name)
def test_a_decode_step_in_two_byte_formats_is_close_to_fp32(rng, dtype):
    args = decode_inputs(rng, 2, 4, 2, 3, 70, 16, dtype)
    ref = run(*[a.astype(F32) for a in args], flash=False)
    assert_close(run(*args, flash=True), ref, 4 * TOL[dtype])
    out, lse = cpu.flash_attention_fwd(*args[:3], 0.25)
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
