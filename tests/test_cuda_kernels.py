"""The CUDA backend (backend/cuda/, its modules and .cu files) against the CPU reference
(backend/cpu/).

Every kernel runs on the same inputs on both devices, in every dtype, on ragged shapes (sizes
that are not multiples of any tile or warp). Tolerances, per output dtype, relative to the
element and (absolute part) to the largest reference value:
  fp64 1e-9 (cuBLAS / other summation orders), fp32 1e-4,
  fp16 2e-3 (two ulps of fp16: both sides compute in fp32 and round once, and may round a
  near-tie differently), bf16 1.6e-2 (two ulps of bf16).
Statistics (layernorm mean/rstd, per-row losses, norms) are fp32 on both sides and are held to
the fp32 tolerance. Casts and the overflow skip are exact; embedding_bwd, layernorm_bwd and
grad_norm_sq must be bit-identical from run to run.

On a GPU (CuPy sees one) this runs the real thing. Without one, the same tests run the same
backend code over the NumPy stand-in for CuPy (tests/fake_cupy.py) with every kernel executed on
the CPU (tests/cuda_on_cpu: each .cu compiled with the C++ compiler, CUDA threads as fibers, in
forward, reverse and shuffled orders); skipped only when there is no C++ compiler either. A few
shapes are smaller there (GPT2_GEMM) and the tests of the GPU's own machinery (CUDA graphs,
events, the memory pool) need the GPU.
"""

import sys

import numpy as np
import pytest

from tinygrad_like.backend import cuda_available
from tinygrad_like.kernels.elementwise import spec as elementwise
from tinygrad_like.kernels.kvcache import spec as kvcache

ON_GPU = cuda_available()
if ON_GPU:
    import cupy

    from tinygrad_like.backend import cuda
else:
    import cuda_on_cpu
    import fake_cupy

    if not cuda_on_cpu.available():
        pytest.skip("no CUDA device and no C++ compiler", allow_module_level=True)
    cupy = cuda = None  # set by the module fixture below

import test_kv_fp8  # noqa: E402

from tinygrad_like import dtypes, formats, quant  # noqa: E402
from tinygrad_like.backend import cpu  # noqa: E402

gpu_only = pytest.mark.skipif(not ON_GPU, reason="the GPU's own machinery (no CPU equivalent)")


@pytest.fixture(scope="module", autouse=True)
def device():
    """The CUDA backend: the real one, or the stand-in's with the kernels run on the CPU (all
    .cu files built first, in parallel)."""
    global cuda, cupy
    if ON_GPU:
        yield
        return
    with fake_cupy.installed(execute=True) as module:
        cuda, cupy = module, sys.modules["cupy"]
        cuda_on_cpu.build(
            [
                (src, tuple(cuda.instances(src)))
                for src in (cuda.kernel_source(f) for f in cuda.kernel_files())
            ]
        )
        yield
    cuda = cupy = None


F16, BF16, F32, F64 = dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64
FLOATS = [F32, F16, BF16, F64]
TRAINING = [F32, F16, BF16]
TOL = {F64: (1e-9, 1e-12), F32: (1e-4, 1e-5), F16: (2e-3, 1e-3), BF16: (1.6e-2, 1e-2)}
ids = dtypes.name


def f64(x):
    return np.asarray(x).astype(np.float64)


def rand(shape, dtype, scale=1.0, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def dev(x):
    """NumPy arrays (also inside tuples) -> device arrays; anything else unchanged."""
    if isinstance(x, np.ndarray):
        return cuda.asarray(x)
    if isinstance(x, tuple):
        return tuple(dev(i) for i in x)
    return x


def both(kernel, *args, **kwargs):
    """(result on the GPU, result of cpu.py) for the same inputs."""
    got = getattr(cuda, kernel)(*[dev(a) for a in args], **{k: dev(v) for k, v in kwargs.items()})
    return got, getattr(cpu, kernel)(*args, **kwargs)


def close(got, ref, tol_dtype=None, magnitude=0.0):
    """got (device) matches ref (NumPy) in shape, dtype and value, at the tolerance of tol_dtype
    (default: the result's dtype). The absolute part is relative to the largest reference value,
    or to `magnitude` when larger: the size of terms that cancel in the result."""
    got, ref = cuda.to_numpy(got), np.asarray(ref)
    assert (got.shape, got.dtype) == (ref.shape, ref.dtype)
    rtol, atol = TOL[np.dtype(tol_dtype or ref.dtype)]
    ref64 = ref.astype(np.float64)
    scale = max(float(np.abs(ref64).max(initial=0.0)), magnitude)
    np.testing.assert_allclose(got.astype(np.float64), ref64, rtol=rtol, atol=atol * scale)


# ---------------------------------------------------------------- GEMMs

# (M, K, N): ragged everywhere; aligned K and N (the cp.async path) with a ragged M; one tile
# or less; several tiles with a ragged K tail.
GEMM_SHAPES = [(77, 45, 131), (257, 200, 136), (1, 8, 5), (300, 70, 260), (128, 64, 96)]


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
@pytest.mark.parametrize("M,K,N", GEMM_SHAPES)
def test_gemm_three_layouts(dtype, M, K, N):
    x, w, dy = rand((M, K), dtype, seed=1), rand((K, N), dtype, seed=2), rand((M, N), dtype, seed=3)
    bias = rand(N, dtype, seed=4)
    close(*both("matmul", x, w))  # forward X W
    close(*both("matmul", x, w, bias=bias))  # with the bias epilogue
    close(*both("matmul_nt", dy, w))  # dX = dY W^T
    close(*both("matmul_tn", x, dy))  # dW = X^T dY


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
@pytest.mark.parametrize("T,D", [(37, 24), (64, 64)])
def test_gemm_batched(dtype, T, D):
    """Attention's GEMMs over [B, H, T, D], and leading dims on one side only."""
    q, k, v = (rand((2, 3, T, D), dtype, seed=s) for s in (1, 2, 3))
    att, datt = rand((2, 3, T, T), dtype, seed=4), rand((2, 3, T, T), dtype, seed=5)
    close(*both("matmul_nt", q, k))  # scores = Q K^T
    close(*both("matmul", att, v))  # out = P V
    close(*both("matmul", datt, k))  # dQ = dS K
    close(*both("matmul_tn", datt, q))  # dK = dS^T Q
    close(*both("matmul_tn", att, v))  # dV = P^T dOut
    w, bias = rand((D, 40), dtype, seed=6), rand(40, dtype, seed=7)
    close(*both("matmul", q, w, bias=bias))  # (B, H, T, D) @ (D, 40): leading dims into M
    close(*both("matmul", q, rand((3, D, 40), dtype, seed=8)))  # broadcast over the batch
    close(*both("matmul_nt", rand((2, 3, T, 40), dtype, seed=9), w))


# GPT-2's c_attn GEMM (B T, C) @ (C, 3C). Executed on the CPU, the tensor-core GEMM's emulation
# runs at ~0.2 GFLOP/s (10 s for this one): there, K = 768 with fewer rows and columns.
GPT2_GEMM = (1024, 768, 2304) if ON_GPU else (130, 768, 264)


@pytest.mark.parametrize("dtype", TRAINING, ids=ids)
def test_gemm_gpt2_shape_and_strided_input(dtype):
    M, K, N = GPT2_GEMM
    x, w = rand((M, K), dtype, seed=1), rand((K, N), dtype, scale=0.05, seed=2)
    bias = rand(N, dtype, seed=3)
    close(*both("matmul", x, w, bias=bias))
    got = cuda.matmul(dev(np.ascontiguousarray(x.T)).T, dev(w))  # a transposed view
    close(got, cpu.matmul(x, w))


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
def test_gemm_with_k_zero(dtype):
    """K = 0: C = bias or 0. cuda.py fills it without a launch; the kernels themselves, launched
    directly, must give the same (no k-tile runs, and no cp.async is left in flight)."""
    x, w, bias = np.zeros((37, 0), dtype), np.zeros((0, 133), dtype), rand(133, dtype)
    close(*both("matmul", x, w, bias=bias))
    close(*both("matmul_nt", np.zeros((2, 5, 0), dtype), np.zeros((7, 0), dtype)))
    close(*both("matmul_tn", np.zeros((0, 37), dtype), np.zeros((0, 133), dtype)))
    if dtype == F64:
        return
    for aligned in (False, True):
        kernel = (
            cuda.runtime.compiled("gemm.cu", "gemm_f32", False, False, aligned)
            if dtype == F32
            else cuda.runtime.compiled("gemm.cu", "gemm_tc", dtype, False, False, aligned)
        )
        tile = 64 if dtype == F32 else 128
        operand = cupy.zeros(64, dtype)  # a valid address for A and B; with K = 0 none is read
        c = cupy.full((37, 133), 7, dtype)
        kernel(
            (cuda.runtime.blocks_for(133, tile), cuda.runtime.blocks_for(37, tile), 1),
            (256,),
            (
                operand,
                operand,
                dev(bias),
                c,
                np.int32(37),
                np.int32(133),
                np.int32(0),
                np.int64(0),
                np.int64(0),
                np.int64(37 * 133),
            ),
        )
        close(c, np.broadcast_to(bias, (37, 133)))


@pytest.mark.parametrize("dtype", TRAINING, ids=ids)
def test_gemm_cublas_switch(dtype, monkeypatch):
    monkeypatch.setenv("TG_MATMUL", "cublas")
    x, w, dy = rand((77, 45), dtype, seed=1), rand((45, 131), dtype, seed=2), rand((77, 131), dtype)
    bias = rand(131, dtype)
    close(*both("matmul", x, w, bias=bias))
    close(*both("matmul_nt", dy, w))
    close(*both("matmul_tn", x, dy))


# ---------------------------------------------------------------- elementwise


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary(dtype, op):
    a = rand((37, 129), dtype, seed=1)
    b = (np.abs(rand((37, 129), np.float64, seed=2)) + 0.5).astype(dtype)  # safe divisor
    close(*both(op, a, b))  # same shape: the custom kernel
    close(*both(op, a, 2.5))  # scale by a scalar
    close(*both(op, 2.5, b))  # scalar on the left
    close(*both(op, a, b[0]))  # broadcasting: CuPy's fallback
    out_gpu, out_cpu = cuda.empty(a.shape, dtype), np.empty(a.shape, dtype)
    got = getattr(cuda, op)(dev(a), dev(b), out=out_gpu)
    assert got is out_gpu
    close(got, getattr(cpu, op)(a, b, out=out_cpu))


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
def test_neg_copy_fill_concat_sum(dtype):
    a = rand((5, 33, 17), dtype)
    close(*both("neg", a))
    got = cuda.contiguous(dev(a).swapaxes(0, 1))
    assert got.flags.c_contiguous
    close(got, np.ascontiguousarray(a.swapaxes(0, 1)))
    close(*both("concat", (a, a[:, :3]), 1))
    close(*both("sum", a, axis=(0, 1)))
    close(*both("sum", a, axis=-1, keepdims=True))
    close(*both("sum", a), tol_dtype=dtype)
    dst = cuda.empty((5, 40, 17), dtype)
    cuda.fill(dst, 0.0)
    cuda.copy(dst[:, 3:36], dev(a))
    ref = np.zeros((5, 40, 17), dtype)
    ref[:, 3:36] = a
    close(dst, ref)


CASTS = [(s, d) for s in TRAINING for d in TRAINING] + [(F64, F32), (F32, F64)]


@pytest.mark.parametrize("src,dst", CASTS, ids=ids)
def test_cast_is_exact(src, dst):
    a = rand((3, 1001), src, scale=300.0)
    got, ref = both("cast", a, dst)
    assert got.dtype == ref.dtype
    np.testing.assert_array_equal(cuda.to_numpy(got).astype(np.float64), ref.astype(np.float64))


def test_index_bwd():
    dy = rand((4, 6, 8), F32)
    idx = np.array([0, 2, 2, 5, 0, 1])
    close(*both("index_bwd", dy, (4, 7, 8), (slice(None), idx)))  # repeated ids: summed
    close(*both("index_bwd", dy[:, :3], (4, 7, 8), (slice(None), slice(1, 4))))


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
def test_gelu(dtype):
    x, dy = rand((7, 1001), dtype, scale=3.0, seed=1), rand((7, 1001), dtype, seed=2)
    close(*both("gelu_fwd", x))
    close(*both("gelu_bwd", x, dy))


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
def test_div_bwd(dtype):
    """-(dy (a / b)) / b, with |b| up to 1000: b * b would overflow fp16 (the kernel path, a
    scalar numerator, and the broadcasting fallback)."""
    a, dy = rand((7, 1001), dtype, seed=1), rand((7, 1001), dtype, seed=2)
    b = (
        np.random.default_rng(3).uniform(256, 1000, (7, 1001)) * np.sign(rand((7, 1001), F32))
    ).astype(dtype)
    got, ref = both("div_bwd", a, b, dy)
    close(got, ref)
    exact = -f64(dy) * f64(a) / f64(b) ** 2
    assert np.all(cuda.to_numpy(got)[np.abs(exact) > 1e-6] != 0)  # not flushed to 0
    close(*both("div_bwd", 2.5, b, dy))
    close(*both("div_bwd", a, b[:, :1], dy))


# the unary ops' inputs: log, sqrt and rsqrt on (0.1, 4), the others on normal values
UNARY_INPUT = {"log": True, "sqrt": True, "rsqrt": True}


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
@pytest.mark.parametrize("op", list(elementwise.UNARY_OPS))
def test_unary(dtype, op):
    x = rand((7, 1001), dtype, scale=2.0, seed=1)  # exp(8) fits fp16
    if UNARY_INPUT.get(op):
        x = (np.abs(x.astype(np.float64)) + 0.1).astype(dtype)
    dy = rand((7, 1001), dtype, seed=2)
    close(*both("unary_fwd", x, op))
    close(*both("unary_bwd", x, dy, op))
    close(*both("unary_fwd", x.T, op))  # non-contiguous


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
def test_amax_argmax_and_their_gradients(dtype):
    x = rand((5, 33, 17), dtype, seed=1)
    x[:, 3] = x[:, 4]  # ties
    for axis in [(0, 2), (1,), (0, 1, 2)]:
        (y, y_ref) = both("amax", x, axis=axis, keepdims=True)
        close(y, y_ref)
        dy = rand(y_ref.shape, dtype, seed=2)
        close(*both("amax_bwd", x, y_ref, dy, axis))
    got, ref = both("argmax", x, 1)
    np.testing.assert_array_equal(cuda.to_numpy(got), ref)
    close(*both("max_bwd", rand((5, 1, 17), dtype, seed=3), ref, x.shape, 1))


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
@pytest.mark.parametrize("shape", [(3, 37, 70), (4, 1), (2, 1500)], ids=str)
def test_softmax_and_log_softmax_rows(dtype, shape):
    x, dy = rand(shape, dtype, scale=3.0, seed=1), rand(shape, dtype, seed=2)
    for fwd, bwd in [("softmax_fwd", "softmax_bwd"), ("log_softmax_fwd", "log_softmax_bwd")]:
        got, ref = both(fwd, x)
        close(got, ref)
        close(*both(bwd, ref, dy))


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
def test_dropout(dtype):
    x = rand((64, 1000), dtype)
    y, mask = cuda.dropout_fwd(dev(x), 0.25, seed=7)
    y_again, mask_again = cuda.dropout_fwd(dev(x), 0.25, seed=7)
    m = cuda.to_numpy(mask).astype(np.float64)
    keep_value = np.float64(np.asarray(np.float32(1.0) / np.float32(0.75)).astype(dtype))
    assert set(np.unique(m)) <= {0.0, keep_value}
    assert abs((m != 0).mean() - 0.75) < 0.01
    close(y, cpu.mul(x, cuda.to_numpy(mask)))
    np.testing.assert_array_equal(cuda.to_numpy(mask_again), cuda.to_numpy(mask))
    other_seed = cuda.to_numpy(cuda.dropout_fwd(dev(x), 0.25, seed=8)[1])
    assert not np.array_equal(other_seed, cuda.to_numpy(mask))


# ---------------------------------------------------------------- row reductions


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
def test_layernorm(dtype):
    x = (rand((3, 37, 100), dtype, scale=2.0, seed=1).astype(np.float64) + 0.5).astype(dtype)
    w, b, dy = rand(100, dtype, seed=2), rand(100, dtype, seed=3), rand((3, 37, 100), dtype, seed=4)
    (y, mean, rstd), (y_ref, mean_ref, rstd_ref) = both("layernorm_fwd", x, w, b)
    close(y, y_ref)
    close(mean, mean_ref)
    close(rstd, rstd_ref)
    got, ref = both("layernorm_bwd", dy, x, w, mean_ref, rstd_ref)
    for g, r in zip(got, ref):
        close(g, r)
    again = cuda.layernorm_bwd(dev(dy), dev(x), dev(w), dev(mean_ref), dev(rstd_ref))
    for g, r in zip(again[1:], got[1:]):  # dweight, dbias: no atomics, bit-identical
        np.testing.assert_array_equal(cuda.to_numpy(g), cuda.to_numpy(r))


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
def test_rmsnorm(dtype):
    x = rand((3, 37, 100), dtype, scale=2.0, seed=1)
    w, dy = rand(100, dtype, seed=2), rand((3, 37, 100), dtype, seed=4)
    (y, rstd), (y_ref, rstd_ref) = both("rmsnorm_fwd", x, w)
    close(y, y_ref)
    close(rstd, rstd_ref)
    (dx, dw), (dx_ref, dw_ref) = both("rmsnorm_bwd", dy, x, w, rstd_ref)
    close(dx, dx_ref)
    close(dw, dw_ref)
    again = cuda.rmsnorm_bwd(dev(dy), dev(x), dev(w), dev(rstd_ref))[1]  # no atomics
    np.testing.assert_array_equal(cuda.to_numpy(again), cuda.to_numpy(dw))


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
def test_layernorm_without_rows(dtype):
    """Zero rows: no launch (a grid of 0 blocks is invalid); dweight, dbias zeros (C,) as cpu.py."""
    stat = dtypes.compute_dtype(dtype)
    x, w, stats = np.zeros((0, 3, 100), dtype), rand(100, dtype), np.zeros((0, 3), stat)
    y, mean, rstd = cuda.layernorm_fwd(dev(x), dev(w), dev(w))
    assert y.shape == x.shape and mean.shape == rstd.shape == (0, 3)
    got, ref = both("layernorm_bwd", x, x, w, stats, stats)
    for g, r in zip(got, ref):
        close(g, r)
    assert cuda.layernorm_bwd(
        dev(np.zeros((4, 0), dtype)),
        dev(np.zeros((4, 0), dtype)),
        dev(np.zeros(0, dtype)),
        dev(np.zeros(4, stat)),
        dev(np.zeros(4, stat)),
    )[1].shape == (0,)  # no columns either


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
@pytest.mark.parametrize("Tq,Tk", [(37, 37), (5, 70), (1, 33)])  # full, KV-cache chunk, decode step
def test_softmax_causal(dtype, Tq, Tk):
    s, dp = rand((2, 3, Tq, Tk), dtype, scale=3.0, seed=1), rand((2, 3, Tq, Tk), dtype, seed=2)
    got, ref = both("softmax_causal_fwd", s, 0.125)
    close(got, ref)
    assert not cuda.to_numpy(got)[..., np.triu(np.ones((Tq, Tk), bool), Tk - Tq + 1)].any()
    close(*both("softmax_causal_bwd", ref, dp, 0.125))


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
def test_cross_entropy_gpt2_vocab(dtype):
    N, V = 33, 50257
    logits = rand((N, V), np.float64, scale=4.0, seed=1)
    logits[3] += 1000.0 if dtype != F16 else 100.0  # large logits: needs the max subtracted
    logits = logits.astype(dtype)
    targets = np.random.default_rng(2).integers(0, V, N)
    targets[[0, 7, 8, 32]] = -1  # ignored rows
    targets[5] = V - 1  # the last column
    stat = dtypes.compute_dtype(dtype)
    dloss = np.array([1.0 / (targets >= 0).sum()], dtype=stat)
    (losses, lse), (losses_ref, lse_ref) = both("cross_entropy_fwd", logits, targets)
    close(losses, losses_ref, tol_dtype=stat)
    close(lse, lse_ref, tol_dtype=stat)
    dlogits, dlogits_ref = both("cross_entropy_bwd", logits, lse_ref, targets, dloss)
    close(dlogits, dlogits_ref)
    assert not cuda.to_numpy(dlogits)[targets < 0].any()


# ---------------------------------------------------------------- embedding


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
def test_embedding(dtype):
    V, C = 1000, 70
    weight, dout = rand((V, C), dtype, seed=1), rand((4, 33, C), dtype, seed=2)
    idx = np.random.default_rng(3).integers(0, 12, (4, 33))  # many repeated ids
    idx[0, :5] = V - 1
    close(*both("embedding_fwd", weight, idx))
    got, ref = both("embedding_bwd", dout, idx, V)
    close(got, ref)
    again = cuda.embedding_bwd(dev(dout), dev(idx), V)
    np.testing.assert_array_equal(cuda.to_numpy(again), cuda.to_numpy(got))  # deterministic


@pytest.mark.parametrize("bad", [1000, -1])
def test_embedding_ids_out_of_range_raise(bad):
    """The ValueError of cpu.py, raised before any launch (the kernels do no bounds check)."""
    weight, dout = rand((1000, 70), F32), rand((2, 3, 70), F32)
    idx = np.array([[0, 5, bad], [999, 1, 2]])
    for kernel, args in [("embedding_fwd", (weight, idx)), ("embedding_bwd", (dout, idx, 1000))]:
        with pytest.raises(ValueError) as on_cpu:
            getattr(cpu, kernel)(*args)
        with pytest.raises(ValueError) as on_gpu:
            getattr(cuda, kernel)(*[dev(a) for a in args])
        assert str(on_gpu.value) == str(on_cpu.value)


# ---------------------------------------------------------------- quantized weights

QUANT_FORMATS = list(formats.FORMATS)


def quantized(fmt, N, K, group_size=None, seed=0):
    """(codes, scales, group_size) of a random (N, K) weight quantized by quant.quantize (host)."""
    qw = quant.quantize(rand((N, K), F32, seed=seed), fmt, group_size)
    return qw.codes, qw.scales, qw.group_size


@pytest.mark.parametrize("dtype", [F32, BF16], ids=ids)
@pytest.mark.parametrize("fmt", QUANT_FORMATS)
def test_qmatmul(fmt, dtype):
    """Ragged N (not a multiple of a block's 8 rows), K several groups (and one scale per output
    channel), M = 1 (decode), 3 and 17 (past the kernel's 8 rows of x a pass), with and without
    a bias: the CPU twin's result at the output dtype's tolerance."""
    N, K = 37, 96
    for group_size in (32, None) if fmt not in ("bf16", "fp16") else (None,):
        codes, scales, g = quantized(fmt, N, K, group_size)
        bias = rand(N, dtype, seed=5)
        for M in (1, 3, 17):
            x = rand((M, K), dtype, seed=M)
            close(*both("qmatmul", x, codes, scales, fmt, g))
            close(*both("qmatmul", x, codes, scales, fmt, g, bias=bias))


@pytest.mark.parametrize("dtype", [F16, F64], ids=ids)
def test_qmatmul_other_x_dtypes(dtype):
    for fmt in ("int4", "fp8_e4m3", "bf16"):
        codes, scales, g = quantized(fmt, 11, 64)
        x, bias = rand((3, 64), dtype, seed=1), rand(11, dtype, seed=2)
        got, ref = both("qmatmul", x, codes, scales, fmt, g, bias=bias)
        close(got, ref, tol_dtype=F32 if dtype == F64 else None)  # both computed in fp32


@pytest.mark.parametrize("fmt", QUANT_FORMATS)
def test_qembedding(fmt):
    """Gathered rows (repeated ids, the last row) decoded bit for bit as the CPU twin does."""
    codes, scales, g = quantized(fmt, 50, 64, seed=2)
    idx = np.random.default_rng(3).integers(0, 10, (4, 5))
    idx[0, 0] = 49
    got, ref = both("qembedding", codes, scales, idx, fmt, g)
    assert (got.shape, got.dtype) == (ref.shape, ref.dtype) == ((4, 5, 64), F32)
    np.testing.assert_array_equal(cuda.to_numpy(got).view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("fmt", QUANT_FORMATS)
def test_quant_decode_of_every_code(fmt):
    """Every code of a format (all 2^16 bit patterns of bf16 / fp16: subnormals, infinities,
    NaNs), scale 1, gathered by qembedding: ml_dtypes' values (quant.dequantize), bit for bit
    apart from the NaNs' payloads."""
    f = formats.FORMATS[fmt]
    n = 1 << f.bits
    if f.bits == 16:
        codes, scales, g = np.arange(n, dtype=np.uint16).reshape(1, n), None, None
    else:
        codes = np.arange(256, dtype=np.uint8).reshape(1, 256)
        g = codes.shape[1] * (8 // f.bits)
        scales = np.ones((1, 1), np.float32)
    want = quant.dequantize(quant.QuantizedWeight(fmt, codes, scales, g, (1, g or n)))
    got = cuda.to_numpy(
        cuda.qembedding(dev(codes), dev(scales), dev(np.zeros(1, np.int64)), fmt, g)
    )
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_qembedding_ids_out_of_range_raise():
    codes, scales, g = quantized("int8", 20, 32)
    for bad in (20, -1):
        idx = np.array([0, bad])
        with pytest.raises(ValueError) as on_cpu:
            cpu.qembedding(codes, scales, idx, "int8", g)
        with pytest.raises(ValueError) as on_gpu:
            cuda.qembedding(dev(codes), dev(scales), dev(idx), "int8", g)
        assert str(on_gpu.value) == str(on_cpu.value)


# ---------------------------------------------------------------- the fp8 KV cache


@pytest.mark.parametrize("fmt", kvcache.KV_FORMATS)
@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
def test_kv_quantize(fmt, dtype):
    """Rows of every magnitude (subnormal codes, an all-zero row, -0.0, a NaN), ragged against
    a block's 8 warps and a warp's lanes, x in each dtype: the CPU twin's codes and scales, bit
    for bit (which are quant.quantize's: tests/test_kv_fp8.py)."""
    x = test_kv_fp8.rows_of_every_magnitude((3, 2, 13, 40)).astype(dtype)
    (codes, scales), (want_codes, want_scales) = both("kv_quantize", x, fmt)
    np.testing.assert_array_equal(cuda.to_numpy(codes), want_codes)
    np.testing.assert_array_equal(
        cuda.to_numpy(scales).view(np.uint32), want_scales.view(np.uint32)
    )


@pytest.mark.parametrize("fmt", kvcache.KV_FORMATS)
@pytest.mark.parametrize("dtype", [F32, BF16], ids=ids)
@pytest.mark.parametrize("B,H,Hkv,Tq,L,length,D", test_kv_fp8.ATTENTION_SHAPES)
def test_qattention(fmt, dtype, B, H, Hkv, Tq, L, length, D):
    """kvcache.cu's block per query row against cpu.qattention (the same blocks of keys and
    products but for q . k's summation order and expf) at the output dtype's tolerance, and
    against the NumPy dequantize-then-attention reference at fp32's (rounded to bf16: bf16's)."""
    caches = test_kv_fp8.quantized_cache(B, Hkv, L, D, fmt)
    q = rand((B, H, Tq, D), dtype, seed=2)
    args = (q, *caches, fmt, length, 1 / np.sqrt(D))
    got, ref = both("qattention", *args)
    close(got, ref)
    kc, ks, vc, vs = caches
    k, v = test_kv_fp8.dequantized(kc, ks, fmt), test_kv_fp8.dequantized(vc, vs, fmt)
    want = test_kv_fp8.attention_reference(q.astype(F32), k, v, length, 1 / np.sqrt(D))
    close(got, want.astype(dtype))


# ---------------------------------------------------------------- optimizer


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
def test_grad_norm_sq(dtype):
    g = rand(300_007, dtype, seed=1)
    got, ref = both("grad_norm_sq", g)
    close(got, ref, tol_dtype=dtypes.compute_dtype(dtype))
    np.testing.assert_array_equal(cuda.to_numpy(cuda.grad_norm_sq(dev(g))), cuda.to_numpy(got))
    for bad in (np.inf, -np.inf, np.nan):
        g_bad = g.copy()
        g_bad[123_456] = bad
        assert not np.isfinite(cuda.to_numpy(cuda.grad_norm_sq(dev(g_bad)))[0])


ADAMW = dict(
    lr=1e-3,
    beta1=0.9,
    beta2=0.95,
    eps=1e-8,
    weight_decay=0.1,
    n_decay=600,
    step=3,
    inv_scale=1 / 1024,
)


def adamw_buffers(P, G, n=1037):
    master = rand(n, P, seed=1)
    grad = rand(n, G, scale=1024.0, seed=2)  # multiplied by the loss scale
    m, v = rand(n, P, scale=0.01, seed=3), np.abs(rand(n, P, scale=1e-4, seed=4))
    working = master.astype(G) if G != P else None
    return master, grad, m, v, working


@pytest.mark.parametrize(
    "P,G", [(F32, F32), (F32, F16), (F32, BF16), (F32, F64), (F64, F64)], ids=ids
)
@pytest.mark.parametrize("max_norm", [0.0, 1.0])
def test_adamw_step(P, G, max_norm):
    bufs = adamw_buffers(P, G)
    ref = [None if b is None else b.copy() for b in bufs]
    cpu.adamw_step(*ref, cpu.grad_norm_sq(ref[1]), max_norm=max_norm, **ADAMW)
    gpu = [None if b is None else dev(b) for b in bufs]
    assert cuda.adamw_step(*gpu, cuda.grad_norm_sq(gpu[1]), max_norm=max_norm, **ADAMW) is None
    working_tol = G if G in (F16, BF16) else P  # a rounded copy of the master
    for g, r, tol in zip(gpu, ref, (P, G, P, P, working_tol)):
        if r is not None:
            close(g, r, tol_dtype=tol)


@pytest.mark.parametrize("bad", [np.inf, np.nan])
@pytest.mark.parametrize("P,G", [(F32, F16), (F32, BF16)], ids=ids)
def test_adamw_overflow_skips_the_step(P, G, bad):
    master, grad, m, v, working = adamw_buffers(P, G)
    grad[17] = bad
    gpu = [dev(b) for b in (master, grad, m, v, working)]
    cuda.adamw_step(*gpu, cuda.grad_norm_sq(gpu[1]), max_norm=1.0, **ADAMW)
    for g, before in zip(gpu, (master, grad, m, v, working)):
        assert cuda.to_numpy(g).tobytes() == before.tobytes()  # bit-identical: nothing written


@gpu_only
def test_adamw_step_never_waits_for_the_host():
    """Captured into a CUDA graph: any device-to-host read (e.g. float(norm_sq[0])) would make
    the capture fail."""
    gpu = [dev(b) for b in adamw_buffers(F32, BF16)]
    norm_sq = cuda.grad_norm_sq(gpu[1])
    cuda.adamw_step(*gpu, norm_sq, max_norm=1.0, **ADAMW)  # compile and load outside the capture
    before = cuda.to_numpy(gpu[0])
    cuda.synchronize()  # the capture stream does not wait for the default stream
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        cuda.adamw_step(*gpu, norm_sq, max_norm=1.0, **ADAMW)
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    assert not np.array_equal(cuda.to_numpy(gpu[0]), before)


# ---------------------------------------------------------------- timing and memory


@gpu_only
def test_timer_and_pool_watcher():
    timer = cuda.start_timer()
    cuda.matmul(dev(rand((512, 512), F32)), dev(rand((512, 512), F32)))
    assert timer.stop().seconds() > 0
    with cuda.PoolWatcher() as watcher:
        start = watcher.report()["used_bytes"]
        x = cupy.zeros(1 << 20, dtype=np.uint8)
        assert watcher.report()["used_bytes"] >= start + (1 << 20)
        del x
    report = watcher.report()
    assert report["used_bytes"] == start
    assert report["peak_used_bytes"] >= start + (1 << 20)
    assert report["pool_total_bytes"] >= report["used_bytes"]


# ---------------------------------------------------------------- the padded vocabulary


def padded_rows(dtype, N, V, Vp):
    """-> (the accumulation dtype, logits (N, Vp) whose padding columns past V are huge,
    targets (N,) with every fourth ignored and the last class used)."""
    logits = rand((N, Vp), dtype, scale=3.0, seed=5)
    logits[:, V:] = 1e4 if dtype != F16 else 6e4
    targets = np.random.default_rng(6).integers(0, V, N)
    targets[::4] = -1
    targets[-1] = V - 1
    return dtypes.compute_dtype(dtype), logits, targets


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
@pytest.mark.parametrize("N,V,Vp", [(33, 50257, 50304), (5, 11, 64), (1, 7, 8)])
def test_cross_entropy_over_the_first_n_classes_of_padded_rows(dtype, N, V, Vp):
    """Rows of Vp columns, V classes (the padded LM head), against cpu.py: the padding columns
    (huge here, so a kernel that read them would show) take no probability, and the backward
    writes exactly 0 there."""
    stat, logits, targets = padded_rows(dtype, N, V, Vp)
    (losses, lse), (losses_ref, lse_ref) = both("cross_entropy_fwd", logits, targets, V)
    close(losses, losses_ref, stat)
    close(lse, lse_ref, stat)
    dloss = np.array([0.5], stat)
    dlogits, dlogits_ref = both("cross_entropy_bwd", logits, lse_ref, targets, dloss, V)
    close(dlogits, dlogits_ref)
    assert not cuda.to_numpy(dlogits)[:, V:].astype(np.float64).any()


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
@pytest.mark.parametrize("N,V,Vp", [(33, 50257, 50304), (5, 11, 64), (1, 7, 8)])
def test_cross_entropy_fwd_bwd_over_padded_rows(dtype, N, V, Vp):
    """The one-launch kernel against cpu.py's, on the padded rows above, also writing its
    dlogits over the logits (the fused head's call)."""
    stat, logits, targets = padded_rows(dtype, N, V, Vp)
    dloss = np.array([0.5], stat)
    (losses, dlogits), (losses_ref, dlogits_ref) = both(
        "cross_entropy_fwd_bwd", logits, targets, dloss, V
    )
    close(losses, losses_ref, stat)
    close(dlogits, dlogits_ref)
    assert not cuda.to_numpy(dlogits)[:, V:].astype(np.float64).any()
    in_place = dev(logits)
    got = cuda.cross_entropy_fwd_bwd(in_place, dev(targets), dev(dloss), V, out=in_place)
    assert got[1] is in_place
    np.testing.assert_array_equal(cuda.to_numpy(in_place), cuda.to_numpy(dlogits))


@pytest.mark.parametrize("bad", [11, 63, 64, -2])
def test_cross_entropy_refuses_a_target_out_of_range_before_launching(bad):
    """As cpu.py: the kernels index the row with the target, so one past V (even inside the
    padding) is refused on the host, with the same message."""
    logits, lse = dev(rand((3, 64), F32)), dev(np.zeros(3, F32))
    targets = dev(np.array([0, bad, -1]))
    for call in (
        lambda: cuda.cross_entropy_fwd(logits, targets, 11),
        lambda: cuda.cross_entropy_bwd(logits, lse, targets, dev(np.ones(1, F32)), 11),
        lambda: cuda.cross_entropy_fwd_bwd(logits, targets, dev(np.ones(1, F32)), 11),
    ):
        with pytest.raises(ValueError, match=f"target id {bad} out of range for vocab 11"):
            call()


# ---------------------------------------------------------------- flash attention


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
@pytest.mark.parametrize(
    "Tq,Tk",
    [(1, 1), (63, 63), (65, 65), (130, 130), (1, 130), (20, 150)],
    ids=["T=1", "T=63", "T=65", "T=130", "decode", "prompt-after-cache"],
)
def test_flash_attention(dtype, Tq, Tk):
    """attention.cu against cpu.flash_attention_fwd / _bwd at D = 64, GPT-2's head size, on
    query and key counts ragged against both tile sizes (64, and 32 in fp64); q, k, v
    transposed views, as GPT-2 passes them. The backward runs twice: bit-identical."""
    B, H, D = 2, 3, 64
    q, dout = (rand((B, Tq, H, D), dtype, seed=s).swapaxes(1, 2) for s in (1, 2))
    k, v = (rand((B, Tk, H, D), dtype, seed=s).swapaxes(1, 2) for s in (3, 4))
    stat = dtypes.compute_dtype(dtype)
    (out, lse), (out_ref, lse_ref) = both("flash_attention_fwd", q, k, v, 0.125)
    close(out, out_ref)
    close(lse, lse_ref, stat)
    args = (q, k, v, out_ref, lse_ref, dout, 0.125)
    got, ref = both("flash_attention_bwd", *args)
    # dq = scale ds k and dk = scale ds^T q, with ds = p (dout v^T - Di) a difference of terms of
    # the size of |dout| |v|^T that cancel (exactly when Tq = Tk = 1: out = v, so dq and dk are
    # pure rounding on both sides): their absolute tolerance is scaled to those terms
    terms = 0.125 * float((np.abs(f64(dout)) @ np.abs(f64(v)).swapaxes(-1, -2)).max())
    for g, r, other in zip(got, ref, (k, q, None)):
        close(g, r, magnitude=0.0 if other is None else terms * float(np.abs(f64(other)).max()))
    again = cuda.flash_attention_bwd(*[dev(a) for a in args])
    for g, a in zip(got, again):
        np.testing.assert_array_equal(cuda.to_numpy(g), cuda.to_numpy(a))


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
@pytest.mark.parametrize("H,Hkv", [(4, 2), (3, 1)], ids=["GQA", "MQA"])
@pytest.mark.parametrize("Tq,Tk", [(65, 65), (1, 70), (20, 100)], ids=["T=65", "decode", "prompt"])
def test_flash_attention_grouped_query(dtype, H, Hkv, Tq, Tk):
    """k, v with Hkv heads for q's H (query head h reads kv head h // G, G = H / Hkv), against
    cpu.flash_attention_fwd / _bwd (tested against a float64 reference in test_gqa.py). The
    forward and dq are those of k and v repeated to H heads, bit for bit (each block reads its
    kv head as the repeat would give it); dk, dv are the repeat's summed over each group, up to
    rounding (one block sums the G heads, in acc_t)."""
    B, D, G = 2, 32, H // Hkv
    q, dout = (rand((B, Tq, H, D), dtype, seed=s).swapaxes(1, 2) for s in (1, 2))
    k, v = (rand((B, Hkv, Tk, D), dtype, seed=s) for s in (3, 4))
    stat = dtypes.compute_dtype(dtype)
    (out, lse), (out_ref, lse_ref) = both("flash_attention_fwd", q, k, v, 0.125)
    close(out, out_ref)
    close(lse, lse_ref, stat)
    args = (q, k, v, out_ref, lse_ref, dout, 0.125)
    got, ref = both("flash_attention_bwd", *args)
    assert [g.shape for g in got] == [q.shape, k.shape, v.shape]
    terms = 0.125 * float((np.abs(f64(dout)) @ np.abs(f64(np.repeat(v, G, 1))).mT).max())
    for g, r, other in zip(got, ref, (k, q, None)):
        close(g, r, magnitude=0.0 if other is None else G * terms * float(np.abs(f64(other)).max()))
    kr, vr = (np.repeat(a, G, axis=1) for a in (k, v))  # Hugging Face's repeat_kv
    repeated = cuda.flash_attention_fwd(*[dev(a) for a in (q, kr, vr)], 0.125)
    for a, b in zip((out, lse), repeated):
        np.testing.assert_array_equal(cuda.to_numpy(a), cuda.to_numpy(b))
    dq, dk, dv = cuda.flash_attention_bwd(
        *[dev(a) for a in (q, kr, vr, out_ref, lse_ref, dout)], 0.125
    )
    np.testing.assert_array_equal(cuda.to_numpy(got[0]), cuda.to_numpy(dq))
    for g, full in zip(got[1:], (dk, dv)):
        summed = f64(cuda.to_numpy(full)).reshape(B, Hkv, G, Tk, D).sum(2).astype(dtype)
        close(g, summed, magnitude=G * terms * float(np.abs(f64(q)).max()))


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
@pytest.mark.parametrize(
    "B,H,Tq,Tk", [(0, 3, 5, 5), (2, 0, 5, 5), (2, 3, 0, 5), (2, 3, 0, 0)], ids=str
)
def test_flash_attention_without_heads_or_queries(dtype, B, H, Tq, Tk):
    """B·H = 0 launches nothing (a grid y of 0 is invalid); Tq = 0 gives dk = dv = 0 (no query
    sees a key) on both sides, the CPU's too (not uninitialized memory)."""
    q, k = rand((B, H, Tq, 16), dtype, seed=1), rand((B, H, Tk, 16), dtype, seed=2)
    stat = dtypes.compute_dtype(dtype)
    (out, lse), (out_ref, lse_ref) = both("flash_attention_fwd", q, k, k, 0.25)
    close(out, out_ref)
    close(lse, lse_ref, stat)
    np.full(4 * k.size + 64, np.nan)  # a freed buffer of NaNs, for np.empty to find
    got, ref = both("flash_attention_bwd", q, k, k, out_ref, lse_ref, q, 0.25)
    for g, r in zip(got, ref):
        close(g, r)
        assert not cuda.to_numpy(g).astype(np.float64).any() and not r.astype(np.float64).any()


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
def test_flash_attention_head_dim_128(dtype):
    """D = 128 needs up to 232 KB of shared memory per block in fp32 (the backward's dk/dv
    kernel): run where the device's opt-in limit allows it (an H200's 227 KB), refused with
    the limit named where it does not (an A100's 163 KB)."""
    B, H, T, D = 1, 2, 70, 128
    q, k, v, dout = (rand((B, H, T, D), dtype, seed=s) for s in (1, 2, 3, 4))
    acc, tile = dtypes.compute_dtype(dtype).itemsize, 32 if dtype == F64 else 64
    need = (6 * tile * (D + 1) + 2 * tile * (tile + 1) + 2 * tile) * acc  # dk/dv's tiles
    runtime = cupy.cuda.runtime
    optin = runtime.getDeviceAttribute(runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin, 0)
    (out, lse), (out_ref, lse_ref) = both("flash_attention_fwd", q, k, v, 0.125)
    close(out, out_ref)
    args = (q, k, v, out_ref, lse_ref, dout, 0.125)
    if need > optin:
        with pytest.raises(ValueError, match=f"more than the {optin} this GPU"):
            cuda.flash_attention_bwd(*[dev(a) for a in args])
        return
    got, ref = both("flash_attention_bwd", *args)
    terms = 0.125 * float((np.abs(f64(dout)) @ np.abs(f64(v)).swapaxes(-1, -2)).max())
    for g, r, other in zip(got, ref, (k, q, None)):
        close(g, r, magnitude=0.0 if other is None else terms * float(np.abs(f64(other)).max()))


# ---------------------------------------------------------------- Llama's kernels


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
def test_swiglu(dtype):
    g, u = rand((7, 1001), dtype, scale=3.0, seed=1), rand((7, 1001), dtype, seed=2)
    dy = rand((7, 1001), dtype, seed=3)
    close(*both("swiglu_fwd", g, u))
    (dg, du), (dg_ref, du_ref) = both("swiglu_bwd", g, u, dy)
    close(dg, dg_ref)
    close(du, du_ref)


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
@pytest.mark.parametrize("T,start", [(37, 0), (1, 40)])  # a prompt, a decode step's one row
def test_rotary(dtype, T, start):
    acc = dtypes.compute_dtype(dtype)
    angles = np.outer(np.arange(48), 10000.0 ** (-np.arange(0, 24, 2) / 24))  # (48, 12)
    cos, sin = (t(angles)[start : start + T].astype(acc) for t in (np.cos, np.sin))
    x = rand((2, 3, T, 24), dtype, scale=2.0, seed=1)
    close(*both("rotary_fwd", x, cos, sin))
    close(*both("rotary_bwd", x, cos, sin))
    # q as the model passes it: (B, T, H, D) viewed as (B, H, T, D)
    xt = rand((2, T, 3, 24), dtype, seed=2)
    got = cuda.rotary_fwd(dev(xt).transpose(0, 2, 1, 3), dev(cos), dev(sin))
    close(got, cpu.rotary_fwd(xt.transpose(0, 2, 1, 3), cos, sin))
