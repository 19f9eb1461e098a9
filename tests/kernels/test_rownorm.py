"""Row normalizations (kernels/rownorm): GPT-2's layernorm and Llama's RMSNorm, forward and
backward, against float64 formulas; rows ragged against a warp, one row, a vocabulary-wide row,
no rows. The statistics are fp32 (fp64 for fp64) whatever x's dtype; the weight gradients are
summed in a fixed order (the same bits run after run). The backward's add epilogue (dx + add)
has the bits of the unfused add.
"""

import numpy as np
import pytest

from tinygrad_like import dtypes

from .check import BF16, EPS, F16, F32, FLOATS, TRAINING, cases, cpu, f64, rand

HALF = [F16, BF16]
# rows of 100 (ragged against a warp) with an offset mean, one row of 5, two of 1500, none
SHAPES = [(3, 37, 100), (1, 5), (2, 1500), (0, 3, 100)]


def layernorm_fwd_ref(x, w, b, eps=1e-5):
    x = f64(x)
    mean = x.mean(-1)
    rstd = 1 / np.sqrt(((x - mean[..., None]) ** 2).mean(-1) + eps)
    return (x - mean[..., None]) * rstd[..., None] * f64(w) + f64(b), mean, rstd


def layernorm_bwd_ref(dy, x, w, mean, rstd, add=None):
    dy, rstd = f64(dy), f64(rstd)[..., None]
    xhat = (f64(x) - f64(mean)[..., None]) * rstd
    g = dy * f64(w)
    dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    rows = (-1, x.shape[-1])
    dx = dx if add is None else dx + f64(add)
    return dx, (dy * xhat).reshape(rows).sum(0), dy.reshape(rows).sum(0)


def rmsnorm_fwd_ref(x, w, eps=1e-6):
    x = f64(x)
    rstd = 1 / np.sqrt((x * x).mean(-1) + eps)
    return x * rstd[..., None] * f64(w), rstd


def rmsnorm_bwd_ref(dy, x, w, rstd, add=None):
    dy, rstd = f64(dy), f64(rstd)[..., None]
    xhat, g = f64(x) * rstd, dy * f64(w)
    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdims=True))
    dx = dx if add is None else dx + f64(add)
    return dx, (dy * xhat).reshape(-1, x.shape[-1]).sum(0)


def rows(dtype, shape):
    """x (an offset mean), weight, bias and dy."""
    x = (f64(rand(shape, dtype, scale=2.0, seed=1)) + 0.5).astype(dtype)
    C = shape[-1]
    return x, rand(C, dtype, seed=2), rand(C, dtype, seed=3), rand(shape, dtype, seed=4)


def plus(put, dtype, shape, epilogue):
    """The backward's keyword arguments: epilogue "add", dx + add (x's shape); None, none."""
    return {"add": put(rand(shape, dtype, seed=5))} if epilogue == "add" else {}


def layernorm(put, dtype, shape, direction, epilogue=None):
    """The forward's x, weight, bias; or the backward's dy, x, weight and the CPU forward's
    mean and rstd, and the epilogue's add (plus)."""
    x, w, b, dy = rows(dtype, shape)
    if direction == "fwd":
        return put(x), put(w), put(b)
    _, mean, rstd = cpu.layernorm_fwd(x, w, b)
    return put(dy), put(x), put(w), put(mean), put(rstd), plus(put, dtype, shape, epilogue)


def rmsnorm(put, dtype, shape, direction, epilogue=None):
    x, w, _, dy = rows(dtype, shape)
    if direction == "fwd":
        return put(x), put(w)
    rstd = cpu.rmsnorm_fwd(x, w)[1]
    return put(dy), put(x), put(w), put(rstd), plus(put, dtype, shape, epilogue)


GRID = [(d, s) for d in FLOATS for s in SHAPES]
ADD = [(d, s, "bwd", "add") for d in TRAINING for s in SHAPES]  # the backward's dx + add
CASES = [
    *cases("layernorm_fwd", layernorm, [(*g, "fwd") for g in GRID], ref=layernorm_fwd_ref),
    *cases(
        "layernorm_bwd",
        layernorm,
        [(*g, "bwd") for g in GRID],
        ref=layernorm_bwd_ref,
        repeatable=True,
    ),
    *cases("rmsnorm_fwd", rmsnorm, [(*g, "fwd") for g in GRID], ref=rmsnorm_fwd_ref),
    *cases(
        "rmsnorm_bwd", rmsnorm, [(*g, "bwd") for g in GRID], ref=rmsnorm_bwd_ref, repeatable=True
    ),
    *cases("layernorm_bwd", layernorm, ADD, ref=layernorm_bwd_ref, repeatable=True),
    *cases("rmsnorm_bwd", rmsnorm, ADD, ref=rmsnorm_bwd_ref, repeatable=True),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel(case, check):
    check(case)


# ---------------------------------------------------------------- what a case cannot say


@pytest.mark.parametrize("dtype", FLOATS, ids=dtypes.name)
def test_cuda_layernorm_bwd_without_columns(cuda_device, dtype):
    """C = 0 (the CPU needs C > 0 to reshape): dweight and dbias of shape (0,)."""
    gpu, stat = cuda_device, dtypes.compute_dtype(dtype)
    x, stats = gpu.asarray(np.zeros((4, 0), dtype)), gpu.asarray(np.zeros(4, stat))
    dx, dweight, dbias = gpu.layernorm_bwd(x, x, gpu.asarray(np.zeros(0, dtype)), stats, stats)
    assert dx.shape == (4, 0) and dweight.shape == dbias.shape == (0,)


def unfused_and_fused(device, dtype, kernel):
    """kernel's results on device without the epilogue, then dx + add by elementwise's add, and
    its results with add=: each as bytes."""
    make = layernorm if kernel == "layernorm_bwd" else rmsnorm
    *args, kw = make(device.asarray, dtype, SHAPES[0], "bwd", "add")
    plain = list(getattr(device, kernel)(*args))
    plain[0] = device.add(kw["add"], plain[0])
    fused = getattr(device, kernel)(*args, **kw)
    return [[device.to_numpy(r).tobytes() for r in rs] for rs in (plain, fused)]


@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtypes.name)
@pytest.mark.parametrize("kernel", ["layernorm_bwd", "rmsnorm_bwd"])
def test_cpu_bwd_add_is_the_unfused_add(kernel, dtype):
    """dx + add has the bits of the backward's dx then elementwise's add(add, dx) (a 2-byte dx
    rounded first); the weight gradients are the plain backward's."""
    plain, fused = unfused_and_fused(cpu, dtype, kernel)
    assert fused == plain


@pytest.mark.parametrize("dtype", TRAINING, ids=dtypes.name)
@pytest.mark.parametrize("kernel", ["layernorm_bwd", "rmsnorm_bwd"])
def test_cuda_bwd_add_is_the_unfused_add(cuda_device, kernel, dtype):
    """The same on the device: the add in the dx kernel's store, the bits of the add after it."""
    plain, fused = unfused_and_fused(cuda_device, dtype, kernel)
    assert fused == plain


@pytest.mark.parametrize("dtype", HALF, ids=dtypes.name)
def test_cpu_layernorm_half_reduces_in_fp32(dtype):
    """Statistics in fp32 against float64 on the rounded inputs; y within one rounding of it;
    the backward within one rounding of the fp32 kernel on the same inputs."""
    x = (rand((3, 4, 32), F32, scale=3, seed=1) + 5).astype(dtype)  # an offset mean stresses var
    w = (1 + 0.1 * rand(32, F32, seed=2)).astype(dtype)
    b = (0.1 * rand(32, F32, seed=3)).astype(dtype)
    y, mean, rstd = cpu.layernorm_fwd(x, w, b)
    ref_y, ref_mu, ref_rstd = layernorm_fwd_ref(x, w, b)
    np.testing.assert_allclose(mean, ref_mu, rtol=1e-6)
    np.testing.assert_allclose(rstd, ref_rstd, rtol=1e-5)
    np.testing.assert_allclose(y.astype(F32), ref_y, rtol=EPS[dtype], atol=EPS[dtype] * 1e-2)
    dy = rand((3, 4, 32), dtype, seed=4)
    got = cpu.layernorm_bwd(dy, x, w, mean, rstd)
    want = cpu.layernorm_bwd(dy.astype(F32), x.astype(F32), w.astype(F32), mean, rstd)
    for g, r in zip(got, want):
        scale = np.abs(r).max()
        np.testing.assert_allclose(
            g.astype(F32), r, rtol=EPS[dtype], atol=EPS[dtype] * 1e-2 * scale
        )


@pytest.mark.parametrize("dtype", [F32, *HALF], ids=dtypes.name)
def test_cpu_rmsnorm_reduces_in_fp32_against_float64(dtype):
    """rstd within 1e-6 of float64, y and the gradients within a few fp32 ulps (one rounding of
    a 2-byte result)."""
    x = rand((3, 5, 48), F32, scale=3, seed=1).astype(dtype)
    w = (1 + 0.1 * rand(48, F32, seed=2)).astype(dtype)
    y, rstd = cpu.rmsnorm_fwd(x, w)
    ref_y, ref_rstd = rmsnorm_fwd_ref(x, w)
    tol = 1e-5 if dtype == F32 else EPS[dtype]
    np.testing.assert_allclose(rstd, ref_rstd, rtol=1e-6)
    np.testing.assert_allclose(y.astype(F32), ref_y, rtol=tol, atol=tol * 1e-2)
    dy = rand((3, 5, 48), dtype, seed=3)
    for got, want in zip(cpu.rmsnorm_bwd(dy, x, w, rstd), rmsnorm_bwd_ref(dy, x, w, ref_rstd)):
        scale = np.abs(want).max()
        np.testing.assert_allclose(got.astype(F32), want, rtol=tol, atol=tol * 1e-2 * scale)


def test_cpu_layernorm_fp32_against_float64():
    x, w, b = rand((5, 16), F32, seed=1), rand(16, F32, seed=2), rand(16, F32, seed=3)
    y, mean, rstd = cpu.layernorm_fwd(x, w, b)
    ref_y, ref_mu, ref_rstd = layernorm_fwd_ref(x, w, b)
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rstd, ref_rstd, rtol=1e-5)
    dy = rand((5, 16), F32, seed=4)
    got = cpu.layernorm_bwd(dy, x, w, mean, rstd)
    want = layernorm_bwd_ref(dy, x, w, ref_mu, ref_rstd)
    for g, r, rtol in zip(got, want, (1e-4, 1e-4, 1e-5)):
        np.testing.assert_allclose(g, r, rtol=rtol, atol=1e-5)


@pytest.mark.parametrize("dtype", HALF, ids=dtypes.name)
@pytest.mark.parametrize("epilogue", [None, "add"])
def test_cpu_half_rows_are_the_fp32_kernels_rounded(epilogue, dtype):
    """2-byte operands are read where they lie and widened a row at a time: the results are the
    fp32 kernels' on the widened operands, rounded once (dx + add: the add of the rounded dx,
    as elementwise's add after the kernel), the statistics and the weight gradients the fp32
    kernels' bits."""
    shape = (70, 96)  # three row blocks, the last ragged
    x, w, b, dy = rows(dtype, shape)
    kw = plus(lambda a: a, dtype, shape, epilogue)
    wide = {k: v.astype(F32) for k, v in kw.items()}
    rnd = lambda a: a.astype(dtype)  # noqa: E731 (NumPy, ml_dtypes: round to nearest even)
    as_bytes = lambda rs: [np.asarray(r).tobytes() for r in rs]  # noqa: E731
    y, mean, rstd = cpu.layernorm_fwd(x, w, b)
    y32, mean32, rstd32 = cpu.layernorm_fwd(x.astype(F32), w, b)
    assert as_bytes([y, mean, rstd]) == as_bytes([rnd(y32), mean32, rstd32])
    got = cpu.layernorm_bwd(dy, x, w, mean, rstd, **kw)
    dx32, dw32, db32 = cpu.layernorm_bwd(dy.astype(F32), x.astype(F32), w, mean, rstd)
    dx = rnd(dx32) if epilogue is None else rnd(rnd(dx32).astype(F32) + wide["add"])
    assert as_bytes(got) == as_bytes([dx, rnd(dw32), rnd(db32)])
    y, rstd = cpu.rmsnorm_fwd(x, w)
    y32, rstd32 = cpu.rmsnorm_fwd(x.astype(F32), w)
    assert as_bytes([y, rstd]) == as_bytes([rnd(y32), rstd32])
    got = cpu.rmsnorm_bwd(dy, x, w, rstd, **kw)
    dx32, dw32 = cpu.rmsnorm_bwd(dy.astype(F32), x.astype(F32), w, rstd)
    dx = rnd(dx32) if epilogue is None else rnd(rnd(dx32).astype(F32) + wide["add"])
    assert as_bytes(got) == as_bytes([dx, rnd(dw32)])
