"""GEMMs (kernels/gemm): a linear layer's three, Y = X W (matmul, with the bias epilogue),
dX = dY W^T (matmul_nt) and dW = X^T dY (matmul_tn), and attention's batched ones, against
float64 products: ragged shapes (not multiples of any tile or warp), aligned ones (the cp.async
path), one tile or less, K = 0, GPT-2's c_attn shape, a transposed operand. The epilogue (C
times a 0-d scale, plus add, into a new C or into add itself) on each, its bits those of the
unfused mul and add.

2-byte formats: the CPU multiplies in fp32 and rounds once, as a tensor core does: bit for bit
the fp32 product of the rounded inputs, rounded. The CPU's splits over its cores:
test_cpu_threads.py.
"""

import numpy as np
import pytest

from tinygrad_like import dtypes, kernels

from . import check
from .check import (
    BF16,
    EPS,
    F16,
    F32,
    F64,
    FLOATS,
    ON_GPU,
    TRAINING,
    Case,
    cases,
    close,
    cpu,
    f64,
    gpu_only,
    rand,
)

HALF = [F16, BF16]


def epilogued(c, scale, add):
    """A reference's epilogue: c times scale (a 0-d array) plus add (C's shape), each optional."""
    return c * (1 if scale is None else f64(scale)) + (0 if add is None else f64(add))


def matmul_ref(a, b, bias=None, scale=None, add=None, out=None):
    return epilogued(f64(a) @ f64(b) + (0 if bias is None else f64(bias)), scale, add)


def matmul_nt_ref(a, b, scale=None, add=None, out=None):
    return epilogued(f64(a) @ f64(b).swapaxes(-1, -2), scale, add)


def matmul_tn_ref(a, b, scale=None, add=None, out=None):
    return epilogued(f64(a).swapaxes(-1, -2) @ f64(b), scale, add)


# ---------------------------------------------------------------- a linear layer's GEMMs


def layer(put, dtype, M, K, N, call):
    """A linear layer's operands x (M, K), w (K, N), dy (M, N) and bias (N,), as `call` takes
    them: the forward X W, with the bias, dX = dY W^T, dW = X^T dY."""
    x, w, dy, bias = (
        put(rand(s, dtype, seed=i)) for i, s in enumerate([(M, K), (K, N), (M, N), N])
    )
    return {
        "x w": (x, w),
        "x w + bias": (x, w, {"bias": bias}),
        "dy w^T": (dy, w),
        "x^T dy": (x, dy),
    }[call]


LAYER_CALLS = [
    ("matmul", "x w", matmul_ref),
    ("matmul", "x w + bias", matmul_ref),
    ("matmul_nt", "dy w^T", matmul_nt_ref),
    ("matmul_tn", "x^T dy", matmul_tn_ref),
]
# (M, K, N): ragged everywhere; aligned K and N (the cp.async path) with a ragged M; one tile
# or less; several tiles with a ragged K tail; aligned; a decode step's few rows (the CPU's
# GEMVs, cpu_gemv.py: K past its vectors of 64 and 16 with a tail, and short of them)
LAYER = [(77, 45, 131), (257, 200, 136), (1, 8, 5), (300, 70, 260), (128, 64, 96)]
LAYER += [(1, 200, 131), (3, 45, 260)]
# GPT-2's c_attn GEMM (B T, C) @ (C, 3C). Executed on the CPU, the tensor-core GEMM's emulation
# runs at ~0.2 GFLOP/s (10 s for this one): there, K = 768 with fewer rows and columns.
GPT2_GEMM = (1024, 768, 2304) if ON_GPU else (130, 768, 264)


def gpt2(put, dtype, M, K, N, transposed):
    """x (M, K) and w (K, N) at GPT-2's scale: with a bias (N,), or x a transposed view of a
    (K, M) array."""
    x = rand((M, K), dtype, seed=1)
    w, bias = put(rand((K, N), dtype, scale=0.05, seed=2)), put(rand(N, dtype, seed=3))
    if transposed:
        return put(np.ascontiguousarray(x.T)).T, w
    return put(x), w, {"bias": bias}


def attention(put, dtype, T, D, call):
    """Attention's GEMMs over (B, H) = (2, 3): q, k, v (2, 3, T, D), probabilities and their
    gradient (2, 3, T, T); and (B, H, T, D) against one matrix (its leading dims folded into M),
    against a batch of 3 (broadcast), and with a bias."""
    q, k, v = (put(rand((2, 3, T, D), dtype, seed=s)) for s in (1, 2, 3))
    att, datt = (put(rand((2, 3, T, T), dtype, seed=s)) for s in (4, 5))
    w, bias = put(rand((D, 40), dtype, seed=6)), put(rand(40, dtype, seed=7))
    return {
        "q k^T": (q, k),
        "p v": (att, v),
        "ds k": (datt, k),
        "ds^T q": (datt, q),
        "p^T dout": (att, v),
        "x w + bias": (q, w, {"bias": bias}),
        "x w batch": (q, put(rand((3, D, 40), dtype, seed=8))),
        "dy w^T": (put(rand((2, 3, T, 40), dtype, seed=9)), w),
    }[call]


ATTENTION_CALLS = [
    ("matmul_nt", "q k^T", matmul_nt_ref),
    ("matmul", "p v", matmul_ref),
    ("matmul", "ds k", matmul_ref),
    ("matmul_tn", "ds^T q", matmul_tn_ref),
    ("matmul_tn", "p^T dout", matmul_tn_ref),
    ("matmul", "x w + bias", matmul_ref),
    ("matmul", "x w batch", matmul_ref),
    ("matmul_nt", "dy w^T", matmul_nt_ref),
]


# ---------------------------------------------------------------- the add epilogue


def epilogue(put, dtype, B, M, K, N, call, mode):
    """call's operands as layer's, x and dy with a leading batch of B (B = 0: none; w stays
    2-D), and the epilogue's add (C's shape): mode "add" C + add into a new C, "out=add" into
    add itself (a gradient accumulated in place), "out=add^T" into add a transposed view (not
    C-contiguous: C computed apart, then copied), "scale, out=add" C times a 0-d scale, then
    into add."""
    lead = (B,) if B else ()
    x, w, dy, bias = (
        put(rand(s, dtype, seed=i)) for i, s in enumerate([lead + (M, K), (K, N), lead + (M, N), N])
    )
    operands, c = {
        "x w": ((x, w), (M, N)),
        "x w + bias": ((x, w, {"bias": bias}), (M, N)),
        "dy w^T": ((dy, w), (M, K)),
        "x^T dy": ((x, dy), (K, N)),
    }[call]
    if mode == "out=add^T":
        add = put(rand(lead + c[::-1], dtype, seed=4)).swapaxes(-1, -2)
    else:
        add = put(rand(lead + c, dtype, seed=4))
    kw = {"add": add} | ({} if mode == "add" else {"out": add})
    if mode.startswith("scale"):
        kw["scale"] = put(np.asarray(0.37, dtype))
    if isinstance(operands[-1], dict):
        return *operands[:-1], operands[-1] | kw
    return *operands, kw


# (B, M, K, N): ragged, 2-D operands; aligned (the cp.async path) with x and dy (2, M, *): x w
# and dy w^T fold the batch into M (one GEMM over all rows), x^T dy is a batch of 2 GEMMs
EPILOGUE = [(0, 77, 45, 131), (2, 40, 64, 72)]
EPILOGUE_CASES = [
    *[
        case
        for kernel, call, ref in LAYER_CALLS
        for case in cases(
            kernel,
            epilogue,
            [
                (d, *s, call, mode)
                for d in TRAINING
                for s in EPILOGUE
                for mode in ("add", "out=add", "scale, out=add")
            ],
            ref=ref,
        )
    ],
    *[
        case
        for kernel, call, ref in LAYER_CALLS
        for case in cases(
            kernel, epilogue, [(d, *EPILOGUE[1], call, "out=add^T") for d in TRAINING], ref=ref
        )
    ],
]


def k_zero(put, dtype, a, b, bias, mode=None):
    """Operands with K = 0: C = the bias, or 0 (cuda.py fills it without a launch); mode as
    epilogue's, C + add (matmul's C: a (..., M, 0) @ b (0, N))."""
    kw = {"bias": put(rand(b[-1], dtype))} if bias else {}
    if mode:
        add = put(rand(a[:-2] + (a[-2], b[-1]), dtype, seed=4))
        kw |= {"add": add} | ({} if mode == "add" else {"out": add})
    return put(np.zeros(a, dtype)), put(np.zeros(b, dtype)), kw


CASES = [
    *[
        case
        for kernel, call, ref in LAYER_CALLS
        for case in cases(kernel, layer, [(d, *s, call) for d in FLOATS for s in LAYER], ref=ref)
    ],
    *[
        case
        for kernel, call, ref in ATTENTION_CALLS
        for case in cases(
            kernel,
            attention,
            [(d, T, D, call) for d in FLOATS for T, D in [(37, 24), (64, 64)]],
            ref=ref,
        )
    ],
    *cases(
        "matmul",
        gpt2,
        [(d, *GPT2_GEMM, t) for d in TRAINING for t in (False, True)],
        ref=matmul_ref,
    ),
    *cases("matmul", k_zero, [(d, (37, 0), (0, 133), True) for d in FLOATS], ref=matmul_ref),
    *cases("matmul_nt", k_zero, [(d, (2, 5, 0), (7, 0), False) for d in FLOATS], ref=matmul_nt_ref),
    *cases("matmul_tn", k_zero, [(d, (0, 37), (0, 133), False) for d in FLOATS], ref=matmul_tn_ref),
    *EPILOGUE_CASES,
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel(case, check):
    check(case)


# K = 0 with the epilogue: C = bias (or 0) + add, the add elementwise's (cuda.py launches no
# GEMM). Apart from CASES, whose GEMM cases launch GEMMs only (test_cuda_launches.py).
K_ZERO_ADD = cases(
    "matmul",
    k_zero,
    [
        (d, (2, 37, 0), (0, 133), bias, mode)
        for d in TRAINING
        for bias in (False, True)
        for mode in ("add", "out=add")
    ],
    ref=matmul_ref,
)


@pytest.mark.parametrize("case", K_ZERO_ADD, ids=str)
def test_kernel_with_k_zero_and_add(case, check):
    check(case)


# ---------------------------------------------------------------- the CPU's rounding

FP32_GEMMS = {  # kernel -> (shape a, shape b, the product in fp32)
    "matmul": ((2, 3, 64), (2, 64, 5), lambda a, b: a @ b),
    "matmul_nt": ((2, 3, 64), (2, 5, 64), lambda a, b: a @ b.swapaxes(-1, -2)),
    "matmul_tn": ((2, 64, 3), (2, 64, 5), lambda a, b: a.swapaxes(-1, -2) @ b),
}


@pytest.mark.parametrize("k", [3, 256, 1500])  # one K block of OpenBLAS's, and past it
def test_cpu_accumulating_gemm_gives_the_unfused_bits(k):
    """matmul_tn(a, b, add=out, out=out), the LM head's dW summed over its blocks: one sgemm
    with beta = 1 where the first call of the shape found it gives the unfused bits (a K past
    OpenBLAS's K block may not: then the add, as before). Either way, the first call and the
    later ones: the bits of matmul_tn, then elementwise's add."""
    from tinygrad_like.kernels.gemm import cpu_accumulate, cpu_blas

    a, b = rand((k, 300), F32, seed=1), rand((k, 40), F32, seed=2)
    out = rand((300, 40), F32, seed=3)
    for _ in range(2):  # the call that tries both ways, then the one that uses what it found
        want = cpu.add(out, cpu.matmul_tn(a, b)).tobytes()
        assert cpu.matmul_tn(a, b, add=out, out=out) is out
        assert out.tobytes() == want
    if cpu_blas.sgemm() is not None:
        key = (cpu_blas.used(), 300, k, 40, cpu_blas.TRANS, cpu_blas.NO_TRANS)
        assert key in cpu_accumulate._SAME_BITS


@pytest.mark.parametrize(
    "kernel, k, m, n",
    [("matmul_tn", 37, 300, 45), ("matmul_tn", 40, 24, 256), ("matmul_tn", 70, 96, 100)]
    + [("matmul", 64, 40, 96)],
)
def test_cpu_bf16_gemm_cast_to_fp32_is_the_unfused_cast_and_add(kernel, k, m, n):
    """bf16 operands with cast=fp32 [and add=g, out=g fp32], the bf16 step's LM head dW summed
    in fp32 over its blocks: cpu_bf16.py rounds and widens each sum as it stores it (flipped
    into a transposed C, straight, with a ragged last panel); the bits of the GEMM rounded to
    bf16, elementwise's cast to fp32, then its add."""
    shapes = {"matmul_tn": ((k, m), (k, n)), "matmul": ((m, k), (k, n))}[kernel]
    a, b = (rand(shape, BF16, seed=i) for i, shape in enumerate(shapes))
    gemm = getattr(cpu, kernel)
    c = cpu.cast(gemm(a, b), F32)
    assert gemm(a, b, cast=F32).tobytes() == c.tobytes()
    g = rand((m, n), F32, seed=3)
    want = cpu.add(g, c).tobytes()
    assert gemm(a, b, cast=F32, add=g, out=g) is g
    assert g.tobytes() == want


@pytest.mark.parametrize("dtype", HALF, ids=dtypes.name)
@pytest.mark.parametrize("kernel", sorted(FP32_GEMMS))
def test_cpu_half_rounds_once(kernel, dtype):
    sa, sb, product = FP32_GEMMS[kernel]
    a, b = rand(sa, F32, seed=1), rand(sb, F32, seed=2)
    ah, bh = a.astype(dtype), b.astype(dtype)
    out = getattr(cpu, kernel)(ah, bh)
    assert out.dtype == dtype
    # fp32 arithmetic on the rounded inputs, rounded once: bit for bit
    want = product(ah.astype(F32), bh.astype(F32)).astype(dtype)
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))
    # and within 4 eps (two input roundings, one output rounding) of fp32 on the originals,
    # relative to sum |a||b|
    bound = 4 * EPS[dtype] * product(np.abs(a), np.abs(b))
    assert np.all(np.abs(out.astype(F32) - product(a, b)) <= bound)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtypes.name)
@pytest.mark.parametrize("kernel", sorted(FP32_GEMMS))
def test_cpu_epilogue_is_the_unfused_add(kernel, dtype):
    """C + add has the bits of the GEMM (with its bias for matmul) then elementwise's
    add(add, C); out=add writes add itself and returns it; C * scale + add those of mul, then
    add."""
    sa, sb, _ = FP32_GEMMS[kernel]
    a, b = rand(sa, dtype, seed=1), rand(sb, dtype, seed=2)
    kw = {"bias": rand(5, dtype, seed=3)} if kernel == "matmul" else {}
    gemm = getattr(cpu, kernel)
    c = gemm(a, b, **kw)
    add, scale = rand(c.shape, dtype, seed=4), np.asarray(0.37, dtype)
    want = cpu.add(add, c).tobytes()
    assert gemm(a, b, add=add, **kw).tobytes() == want
    out = add.copy()
    assert gemm(a, b, add=out, out=out, **kw) is out
    assert out.tobytes() == want
    scaled = cpu.add(add, cpu.mul(c, scale)).tobytes()
    assert gemm(a, b, scale=scale, add=add, **kw).tobytes() == scaled


@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtypes.name)
@pytest.mark.parametrize("shape", [(77, 45, 131), (1, 200, 131), (2, 3, 9, 16, 40)])
def test_then_epilogues_are_the_unfused_kernels(device, dtype, shape):
    """then= has the bits of the GEMM (with its bias) then the elementwise kernel on C, and
    aux=True returns C after its outputs: GPT-2's fc and GELU, the GELU's gradient of dY W^T,
    Llama's SwiGLU of its up projection and that SwiGLU's two gradients (a training step's
    rows, batched, and a decode step's one)."""
    *lead, M, K, N = shape
    shapes = [(*lead, M, K), (K, N), N, (*lead, M, N), (*lead, M, K), (*lead, M, N)]
    x, w, bias, dy, pre, gate = (
        device.asarray(rand(s, dtype, seed=i)) for i, s in enumerate(shapes)
    )
    as_bytes = lambda *a: b"".join(device.to_numpy(x).tobytes() for x in a)  # noqa: E731
    c = device.matmul(x, w, bias=bias)
    act = device.matmul(x, w, bias=bias, then=("gelu_fwd", ()))
    assert as_bytes(act) == as_bytes(device.gelu_fwd(c))
    act, kept = device.matmul(x, w, bias=bias, then=("gelu_fwd", ()), aux=True)
    assert as_bytes(act, kept) == as_bytes(device.gelu_fwd(c), c)
    dh = device.matmul_nt(dy, w, then=("gelu_bwd", (pre,)))  # dY W^T, through the GELU
    assert as_bytes(dh) == as_bytes(device.gelu_bwd(pre, device.matmul_nt(dy, w)))
    h, kept = device.matmul(x, w, then=("swiglu_fwd", (gate,)), aux=True)
    up = device.matmul(x, w)
    assert as_bytes(h, kept) == as_bytes(device.swiglu_fwd(gate, up), up)
    grads = device.matmul(x, w, then=("swiglu_bwd", (gate, dy)))
    assert as_bytes(*grads) == as_bytes(*device.swiglu_bwd(gate, dy, up))


@pytest.mark.parametrize(
    "dtype, to", [(BF16, F32), (F32, BF16)], ids=["bf16 to fp32", "fp32 to bf16"]
)
@pytest.mark.parametrize("kernel", sorted(FP32_GEMMS))
@pytest.mark.parametrize("scaled", [True, False], ids=["scaled", "unscaled"])
def test_cast_epilogue_is_the_unfused_cast(device, kernel, dtype, to, scaled):
    """cast= has the bits of the GEMM (times its scale) then elementwise's cast, then its add
    (into add itself with out=add): the LM head's fp32 dW scaled and cast to the bf16 gradient
    it accumulates into; a bf16 step's head dW shares cast and summed in fp32."""
    sa, sb, _ = FP32_GEMMS[kernel]
    a, b = device.asarray(rand(sa, dtype, seed=1)), device.asarray(rand(sb, dtype, seed=2))
    gemm, as_bytes = getattr(device, kernel), lambda x: device.to_numpy(x).tobytes()
    scale = device.asarray(np.asarray(0.37, dtype)) if scaled else None
    c = device.cast(device.mul(gemm(a, b), scale) if scaled else gemm(a, b), to)
    assert as_bytes(gemm(a, b, scale=scale, cast=to)) == as_bytes(c)
    grad = rand(c.shape, to, seed=3)
    want = as_bytes(device.add(device.asarray(grad), c))
    g = device.asarray(grad)
    assert gemm(a, b, scale=scale, cast=to, add=g, out=g) is g
    assert as_bytes(g) == want


def test_a_then_epilogue_takes_no_other():
    """The records' rule (what the meta device runs): then= comes after the bias, alone, and
    names an elementwise expression kernel."""
    meta = kernels.on("meta")
    a, b = meta.empty((3, 4), F32), meta.empty((4, 5), F32)
    with pytest.raises(ValueError, match="then= takes no"):
        meta.matmul(a, b, add=meta.empty((3, 5), F32), then=("gelu_fwd", ()))
    with pytest.raises(ValueError, match="not an elementwise expression"):
        meta.matmul(a, b, then=("softmax_fwd", ()))
    with pytest.raises(ValueError, match="give then="):
        meta.matmul(a, b, aux=True)
    made = meta.matmul(a, b, then=("swiglu_bwd", (meta.empty((3, 5), F32),) * 2), aux=True)
    assert [x.shape for x in made] == [(3, 5)] * 3


@pytest.mark.parametrize("dtype", HALF, ids=dtypes.name)
def test_cpu_matmul_bias_added_before_rounding(dtype):
    a, b, bias = rand((4, 32), dtype, seed=1), rand((32, 6), dtype, seed=2), rand(6, dtype, seed=3)
    out = cpu.matmul(a, b, bias=bias)
    want = (a.astype(F32) @ b.astype(F32) + bias.astype(F32)).astype(dtype)
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))


def test_cpu_fp32_and_fp64_keep_their_dtype():
    a, b = rand((3, 4), F32, seed=1), rand((4, 2), F32, seed=2)
    assert cpu.matmul(a, b).dtype == F32
    np.testing.assert_allclose(cpu.matmul(a, b), a @ b, rtol=1e-6)
    a64, b64 = a.astype(F64), b.astype(F64)
    assert cpu.matmul_nt(a64, b64.T.copy()).dtype == F64
    np.testing.assert_array_equal(cpu.matmul_tn(a64.T.copy(), b64), a64 @ b64)


# ---------------------------------------------------------------- CUDA's own paths


@pytest.mark.parametrize("dtype", TRAINING, ids=dtypes.name)
def test_cuda_kernels_with_k_zero(cuda, dtype):
    """K = 0: cuda.py fills C without a launch (the cases above); the kernels themselves,
    launched directly, must give the same: bias or 0 (no k-tile runs, and no cp.async is left
    in flight), plus add when given (here out=add, C accumulated in place)."""
    runtime, cupy = cuda.runtime, cuda.xp
    bias, add = rand(133, dtype), rand((37, 133), dtype, seed=1)
    for aligned, plus in [(False, False), (True, False), (False, True), (True, True)]:
        kernel = (
            runtime.compiled("gemm.cu", "gemm_f32", False, False, aligned)
            if dtype == F32
            else runtime.compiled("gemm.cu", "gemm_tc", dtype, False, False, aligned)
        )
        tile = 64 if dtype == F32 else 128
        operand = cupy.zeros(64, dtype)  # a valid address for A and B; with K = 0 none is read
        c = cuda.asarray(add) if plus else cupy.full((37, 133), 7, dtype)
        sizes = (np.int32(37), np.int32(133), np.int32(0), np.int64(0), np.int64(0))
        grid = (runtime.blocks_for(133, tile), runtime.blocks_for(37, tile), 1)
        epilogue = (cuda.asarray(bias), runtime.NULL, c if plus else runtime.NULL, c)
        kernel(grid, (256,), (operand, operand, *epilogue, *sizes, np.int64(37 * 133)))
        want = cpu.add(add, np.broadcast_to(bias, (37, 133))) if plus else bias
        close(cuda.to_numpy(c), np.broadcast_to(want, (37, 133)))


@pytest.mark.parametrize("dtype", TRAINING, ids=dtypes.name)
@pytest.mark.parametrize("call", range(len(LAYER_CALLS)), ids=lambda i: LAYER_CALLS[i][1])
def test_cuda_epilogue_is_the_unfused_add(cuda_device, dtype, call):
    """The fused add has the bits of the GEMM then elementwise's add(add, C) on the device too
    (ragged and aligned, 2-D and batched): C rounded in the store, then added as add rounds."""
    gpu = cuda_device
    kernel, name, _ = LAYER_CALLS[call]
    for s in EPILOGUE:
        *operands, kw = epilogue(gpu.asarray, dtype, *s, name, "add")
        add, gemm = kw.pop("add"), getattr(gpu, kernel)
        c = gemm(*operands, **kw)
        want = gpu.to_numpy(gpu.add(add, c)).tobytes()
        assert gpu.to_numpy(gemm(*operands, add=add, **kw)).tobytes() == want
        scale = gpu.asarray(np.asarray(0.37, dtype))
        scaled = gpu.to_numpy(gpu.add(add, gpu.mul(c, scale))).tobytes()
        assert gpu.to_numpy(gemm(*operands, scale=scale, add=add, **kw)).tobytes() == scaled
        assert gemm(*operands, add=add, out=add, **kw) is add
        assert gpu.to_numpy(add).tobytes() == want


@pytest.mark.parametrize("dtype", TRAINING, ids=dtypes.name)
def test_cuda_cublas_switch(cuda, monkeypatch, dtype):
    """TG_MATMUL=cublas: a linear layer's three GEMMs through cupy.matmul, the CPU's results."""
    monkeypatch.setenv("TG_MATMUL", "cublas")
    for kernel, call, _ in LAYER_CALLS:
        check.on_cuda(Case(kernel, layer, (dtype, *LAYER[0], call)), cuda)
        for mode in ("add", "out=add", "out=add^T", "scale, out=add"):
            check.on_cuda(Case(kernel, epilogue, (dtype, *EPILOGUE[1], call, mode)), cuda)


@gpu_only
def test_cuda_timer_and_pool_watcher(cuda, cuda_device):
    cupy, gpu = cuda.xp, cuda_device
    timer = cuda.start_timer()
    gpu.matmul(cuda.asarray(rand((512, 512), F32)), cuda.asarray(rand((512, 512), F32)))
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


@pytest.mark.parametrize("dtype", HALF, ids=dtypes.name)
@pytest.mark.parametrize("kernel", ["matmul", "matmul_nt"])
def test_cpu_decode_gemv_of_2_byte_weights_gives_the_widened_bits(kernel, dtype):
    """A decode step's GEMM (one row of x) against a 2-byte W: matmul_nt's W (N, K) (a tied LM
    head) read as its 2-byte codes, each widened in registers (no widened copy of W per call),
    matmul's (K, N) widened first: either way the fp32 GEMV's bits on the widened operands,
    rounded once."""
    x = rand((1, 100), F32, seed=1).astype(dtype)
    w = rand((40, 100) if kernel == "matmul_nt" else (100, 40), F32, seed=2).astype(dtype)
    want = getattr(cpu, kernel)(x.astype(F32), w.astype(F32)).astype(dtype)
    got = getattr(cpu, kernel)(x, w)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("rows", [1, 3])
def test_cpu_decode_gemv_rows_a_pass_give_the_same_bits(rows):
    """fp32's column GEMV (cpu_gemv._columns, GPT-2's Conv1D layout) one row of W a pass over
    its partial sums and four: each sum adds the rows one by one in k's order either way, so
    the bits are the same, whichever of the two fp32_rows measures faster on the machine (K
    with a tail past the fours in each half; fp32_rows answers 1 or 4)."""
    from tinygrad_like.kernels.gemm import cpu_gemv

    x, w = rand((rows, 203), F32, seed=1), rand((203, 131), F32, seed=2)
    got = {}
    for per_pass in (1, 4):
        partial = np.empty((2, rows, 131), F32)
        cpu_gemv._COLUMNS[np.dtype(F32), per_pass](x, w, partial)
        got[per_pass] = partial
    np.testing.assert_array_equal(got[1].view(np.uint32), got[4].view(np.uint32))
    np.testing.assert_allclose(got[1].sum(0), x.astype(F64) @ w.astype(F64), rtol=1e-5, atol=1e-5)
    assert cpu_gemv.fp32_rows() in (1, 4)
