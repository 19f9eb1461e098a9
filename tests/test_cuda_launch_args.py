"""backend/cuda/'s kernel launches, checked without a GPU.

Every CUDA backend function that launches a .cu kernel runs over the NumPy stand-in for CuPy
(tests/fake_cupy.py) in every dtype it takes, on ragged, one-row, transposed (non-contiguous)
and offset (a non-zero start) inputs. The stand-in checks each launch as CuPy would pack it:
argument count and order, scalar types, pointer dtypes, null pointers, contiguity, grid and
block limits; here each launched instance is also checked against the compile list (what the
.cu file names under TG_CHECK_INSTANTIATE, NVRTC's name_expressions). The stand-in computes
nothing, so values are checked only where the host computes them (K = 0 GEMMs, zero-row
layernorm_bwd, AdamW's constants, the id checks). The last tests inject mismatches and show
that the stand-in refuses them.
"""

import functools
import re
import sys
from pathlib import Path

import fake_cupy
import numpy as np
import pytest

from tinygrad_like import dtypes, formats, kernels, quant
from tinygrad_like.backend import cpu
from tinygrad_like.kernels.elementwise import spec as elementwise
from tinygrad_like.kernels.kvcache import spec as kvcache

F16, BF16, F32, F64 = dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64
FLOATS = [F32, F16, BF16, F64]
ids = dtypes.name
# Run by CuPy itself in backend/cuda (copies, fills, concatenation, sums, index gradients).
NO_CUSTOM_KERNEL = {
    *("contiguous", "copy", "fill", "concat", "index_bwd", "sum"),
    *("amax", "argmax", "amax_bwd", "max_bwd"),
}
# fp64 GEMMs and casts from fp64 go to cuBLAS / astype: no launch of ours (driver, dtype).
CUPY_ONLY = {("gemms", F64), ("cast", F64)}
LAYOUTS = ("contiguous", "transposed", "offset")
KERNEL_DIR = Path(cpu.__file__).parents[1] / "cuda"  # the .cu files


@pytest.fixture(scope="module")
def cuda():
    with fake_cupy.installed() as module:
        yield module


@pytest.fixture
def launches(cuda):
    fake_cupy.LAUNCHES.clear()
    return fake_cupy.LAUNCHES


def rand(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def place(cuda, x, layout="contiguous"):
    """Host x on the device: contiguous; transposed (a view of the last two axes of a contiguous
    transpose; for 1-D, every other element); or offset (contiguous, starting one element into
    a larger buffer, so the pointer is not 16-byte aligned)."""
    if layout == "transposed" and x.ndim >= 2:
        return cuda.asarray(np.ascontiguousarray(x.swapaxes(-1, -2))).swapaxes(-1, -2)
    if layout == "transposed":
        return cuda.asarray(np.repeat(x, 2))[::2]
    if layout == "offset":
        buf = cuda.asarray(np.zeros(x.size + 1, x.dtype))
        buf[1:] = x.reshape(-1)
        return buf[1:].reshape(x.shape)
    return cuda.asarray(x)


DRIVERS = {}  # kernel name -> driver(cuda, dtype): calls it the ways the tests want


def drives(*names):
    def register(fn):
        DRIVERS.update(dict.fromkeys(names, fn))
        return fn

    return register


@drives("matmul", "matmul_nt", "matmul_tn")
def gemms(cuda, dtype):
    for M, K, N in [(77, 45, 131), (1, 8, 5), (128, 64, 96)]:  # ragged, one row, aligned
        x, w, dy = rand((M, K), dtype), rand((K, N), dtype), rand((M, N), dtype)
        bias = rand(N, dtype)
        for layout in LAYOUTS:
            p = functools.partial(place, cuda, layout=layout)
            cuda.matmul(p(x), p(w))
            cuda.matmul(p(x), p(w), bias=p(bias))
            cuda.matmul_nt(p(dy), p(w))
            cuda.matmul_tn(p(x), p(dy))
    T, D = 37, 24  # attention's batched GEMMs
    q, k = (place(cuda, rand((2, 3, T, D), dtype, seed=s)) for s in (1, 2))
    att = place(cuda, rand((2, 3, T, T), dtype))
    w, bias = place(cuda, rand((D, 40), dtype)), place(cuda, rand(40, dtype))
    cuda.matmul_nt(q, k)
    cuda.matmul(att, q)
    cuda.matmul_tn(att, q)
    cuda.matmul(q, w, bias=bias)  # leading dims folded into M
    cuda.matmul(q, place(cuda, rand((3, D, 40), dtype)))  # broadcast over the batch
    cuda.matmul_nt(place(cuda, rand((2, 3, T, 40), dtype)), w)


@drives("add", "sub", "mul", "div", "neg")
def binary(cuda, dtype):
    for shape in [(37, 129), (1,), (5, 3)]:
        a, b = rand(shape, dtype, seed=1), rand(shape, dtype, seed=2)
        for layout in LAYOUTS:  # transposed: CuPy's ufunc; the others: the custom kernel
            da, db = place(cuda, a, layout), place(cuda, b, layout)
            for op in (cuda.add, cuda.sub, cuda.mul, cuda.div):
                op(da, db)
                op(da, 2.5)
                op(2.5, db)
                op(da, db, out=cuda.empty(shape, dtype))
            cuda.neg(da)
        cuda.add(place(cuda, a), place(cuda, b[..., :1]))  # broadcasting: CuPy's


@drives("div_bwd")
def div_bwd(cuda, dtype):
    for shape in [(37, 129), (1,), (5, 3)]:
        a, dy = rand(shape, dtype, seed=1), rand(shape, dtype, seed=3)
        b = (np.abs(rand(shape, F32, seed=2)) + 1).astype(dtype)  # no overflow in the fallback
        for layout in LAYOUTS:  # transposed: CuPy's ufuncs; the others: the custom kernel
            da, db, ddy = (place(cuda, v, layout) for v in (a, b, dy))
            cuda.div_bwd(da, db, ddy)
            cuda.div_bwd(2.5, db, ddy)  # a scalar numerator: the null pointer
        cuda.div_bwd(place(cuda, a), place(cuda, b[..., :1]), place(cuda, dy))  # broadcasting


@drives("unary_fwd", "unary_bwd")
def unary(cuda, dtype):
    for shape in [(7, 1001), (1,), ()]:
        for layout in LAYOUTS:
            x, dy = place(cuda, rand(shape, dtype), layout), place(cuda, rand(shape, dtype), layout)
            for op in elementwise.UNARY_OPS:
                cuda.unary_fwd(x, op)
                cuda.unary_bwd(x, dy, op)


@drives("cast")
def cast(cuda, dtype):
    for dst in FLOATS:
        for layout in LAYOUTS:
            cuda.cast(place(cuda, rand((3, 1001), dtype), layout), dst)


@drives("gelu_fwd", "gelu_bwd", "dropout_fwd")
def activations(cuda, dtype):
    for shape in [(7, 1001), (1, 1)]:
        for layout in LAYOUTS:
            x, dy = place(cuda, rand(shape, dtype), layout), place(cuda, rand(shape, dtype), layout)
            cuda.gelu_fwd(x)
            cuda.gelu_bwd(x, dy)
            cuda.dropout_fwd(x, 0.25, seed=7)


@drives("layernorm_fwd", "layernorm_bwd")
def layernorm(cuda, dtype):
    stat = dtypes.compute_dtype(dtype)
    for shape in [(3, 37, 100), (1, 5), (2, 1500)]:
        C = shape[-1]
        for layout in LAYOUTS:
            x, dy = place(cuda, rand(shape, dtype), layout), place(cuda, rand(shape, dtype), layout)
            w, b = place(cuda, rand(C, dtype), layout), place(cuda, rand(C, dtype), layout)
            cuda.layernorm_fwd(x, w, b)
            mean, rstd = (place(cuda, rand(shape[:-1], stat), layout) for _ in range(2))
            cuda.layernorm_bwd(dy, x, w, mean, rstd)


@drives("rmsnorm_fwd", "rmsnorm_bwd")
def rmsnorm(cuda, dtype):
    stat = dtypes.compute_dtype(dtype)
    for shape in [(3, 37, 100), (1, 5), (2, 1500)]:
        for layout in LAYOUTS:
            x, dy = place(cuda, rand(shape, dtype), layout), place(cuda, rand(shape, dtype), layout)
            w = place(cuda, rand(shape[-1], dtype), layout)
            cuda.rmsnorm_fwd(x, w)
            cuda.rmsnorm_bwd(dy, x, w, place(cuda, rand(shape[:-1], stat), layout))


@drives("softmax_causal_fwd", "softmax_causal_bwd")
def softmax(cuda, dtype):
    for shape in [(2, 3, 37, 37), (1, 1, 5, 70), (1, 1, 1, 33)]:  # full, KV-cache chunk, decode
        for layout in LAYOUTS:
            s, dp = place(cuda, rand(shape, dtype), layout), place(cuda, rand(shape, dtype), layout)
            cuda.softmax_causal_fwd(s, 0.125)
            cuda.softmax_causal_bwd(s, dp, 0.125)


@drives("softmax_fwd", "softmax_bwd", "log_softmax_fwd", "log_softmax_bwd")
def softmax_rows(cuda, dtype):
    for shape in [(2, 37, 70), (1, 1), (3, 1), (4, 33)]:  # ragged, one element, C = 1, > a warp
        for layout in LAYOUTS:
            x, dy = place(cuda, rand(shape, dtype), layout), place(cuda, rand(shape, dtype), layout)
            for fwd, bwd in [
                (cuda.softmax_fwd, cuda.softmax_bwd),
                (cuda.log_softmax_fwd, cuda.log_softmax_bwd),
            ]:
                bwd(fwd(x), dy)


@drives("flash_attention_fwd", "flash_attention_bwd")
def flash_attention(cuda, dtype):
    stat = dtypes.compute_dtype(dtype)
    for B, H, Hkv, Tq, Tk, D in [
        (2, 3, 3, 65, 65, 64),
        (1, 2, 2, 1, 70, 64),
        (1, 1, 1, 130, 130, 24),
        (1, 1, 1, 20, 150, 8),
        (2, 4, 2, 65, 65, 64),
        (1, 3, 1, 1, 70, 16),
    ]:  # ragged, decode, prompt + cache; grouped-query, multi-query decode
        for layout in LAYOUTS:
            q, dout, out, k, v = (
                place(cuda, rand((B, heads, T, D), dtype, seed), layout)
                for seed, (heads, T) in enumerate(((H, Tq),) * 3 + ((Hkv, Tk),) * 2)
            )
            cuda.flash_attention_fwd(q, k, v, 0.125)
            lse = place(cuda, rand((B, H, Tq), stat), layout)
            cuda.flash_attention_bwd(q, k, v, out, lse, dout, 0.125)


@drives("cross_entropy_fwd", "cross_entropy_bwd", "cross_entropy_fwd_bwd")
def cross_entropy(cuda, dtype):
    stat = dtypes.compute_dtype(dtype)
    for N, V in [(33, 1001), (1, 7)]:
        targets = np.random.default_rng(1).integers(0, V - 2, N)
        targets[::5] = -1  # ignored rows
        for layout in LAYOUTS:
            logits, t = place(cuda, rand((N, V), dtype), layout), place(cuda, targets, layout)
            dloss = cuda.asarray(np.array([0.1], stat))
            cuda.cross_entropy_fwd(logits, t)
            lse = place(cuda, rand(N, stat), layout)
            cuda.cross_entropy_bwd(logits, lse, t, dloss)
            cuda.cross_entropy_fwd_bwd(logits, t, dloss, V - 2)  # two padding columns
            padded = cuda.asarray(rand((N, V), dtype))  # dlogits over the logits
            cuda.cross_entropy_fwd_bwd(padded, t, dloss, V - 2, out=padded)


@drives("embedding_fwd", "embedding_bwd")
def embedding(cuda, dtype):
    V, C = 1000, 70
    for shape in [(4, 33), (1,)]:
        idx = np.random.default_rng(3).integers(0, 12, shape)
        idx.reshape(-1)[0] = V - 1
        for layout in LAYOUTS:
            weight = place(cuda, rand((V, C), dtype), layout)
            cuda.embedding_fwd(weight, place(cuda, idx, layout))
            cuda.embedding_fwd(weight, place(cuda, idx.astype(np.int32), layout))
            dout = place(cuda, rand(shape + (C,), dtype), layout)
            cuda.embedding_bwd(dout, place(cuda, idx, layout), V)


@drives("qmatmul", "qembedding")
def quantized(cuda, dtype):
    """Every format, x in dtype: ragged N, one row of x and 17 (past a pass's 8), a bias; the
    gather with int64 and int32 ids."""
    for fmt in formats.FORMATS:
        for N, K, M in [(37, 96, 17), (1, 32, 1)]:
            qw = quant.quantize(
                rand((N, K), F32), fmt, None if formats.FORMATS[fmt].bits == 16 else 32
            )
            x, bias = rand((M, K), dtype), rand(N, dtype)
            idx = np.random.default_rng(3).integers(0, N, (4, 3))
            for layout in LAYOUTS:
                p = functools.partial(place, cuda, layout=layout)
                codes, scales = p(qw.codes), None if qw.scales is None else p(qw.scales)
                cuda.qmatmul(p(x), codes, scales, fmt, qw.group_size)
                cuda.qmatmul(p(x), codes, scales, fmt, qw.group_size, bias=p(bias))
                for ids in (idx, idx.astype(np.int32)):
                    cuda.qembedding(codes, scales, p(ids), fmt, qw.group_size)


@drives("kv_quantize", "qattention")
def kv_cache(cuda, dtype):
    """Both fp8 formats, x and q in dtype: rows ragged against a block's 8 warps and one row;
    a decode step (GQA) and a prompt (MQA) over caches longer than what is stored, the head
    dim ragged against a warp."""
    for fmt in kvcache.KV_FORMATS:
        for B, H, Hkv, Tq, L, length, D in [(2, 4, 2, 1, 40, 33, 24), (1, 3, 1, 5, 9, 5, 64)]:
            for layout in LAYOUTS:
                p = functools.partial(place, cuda, layout=layout)
                codes, scales = cuda.kv_quantize(p(rand((B, Hkv, L, D), dtype)), fmt)
                cuda.kv_quantize(p(rand((1, D), dtype)), fmt)
                q = p(rand((B, H, Tq, D), dtype))
                cuda.qattention(q, codes, scales, codes, scales, fmt, length, 0.125)


@drives("rotary_fwd", "rotary_bwd")
def rotary(cuda, dtype):
    acc = dtypes.compute_dtype(dtype)
    for B, H, T, D in [(2, 3, 37, 24), (1, 2, 1, 64), (1, 1, 5, 2)]:  # ragged, decode, one pair
        for layout in LAYOUTS:
            x = place(cuda, rand((B, H, T, D), dtype), layout)
            cos, sin = (place(cuda, rand((T, D // 2), acc, seed), layout) for seed in (1, 2))
            cuda.rotary_fwd(x, cos, sin)
            cuda.rotary_bwd(x, cos, sin)


@drives("swiglu_fwd", "swiglu_bwd")
def swiglu(cuda, dtype):
    for shape in [(7, 1001), (1, 1)]:
        for layout in LAYOUTS:
            g, u, dy = (place(cuda, rand(shape, dtype, seed), layout) for seed in range(3))
            cuda.swiglu_fwd(g, u)
            cuda.swiglu_bwd(g, u, dy)


@drives("grad_norm_sq")
def grad_norm_sq(cuda, dtype):
    for n in (300_007, 257, 1):
        for layout in LAYOUTS:
            cuda.grad_norm_sq(place(cuda, rand(n, dtype), layout))


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


def adamw_buffers(cuda, P, G, n=1037):
    """(master, grad, m, v, working) on the device, working None when G is P."""
    bufs = [rand(n, P), rand(n, G), rand(n, P), np.abs(rand(n, P))]
    return [cuda.asarray(b) for b in bufs] + [None if G == P else cuda.asarray(rand(n, G))]


@drives("adamw_step")
def adamw(cuda, dtype):
    for P in (F32, F64) if dtype == F64 else (F32,):  # dtype is the gradient's
        for max_norm in (0.0, 1.0):
            bufs = adamw_buffers(cuda, P, dtype)
            cuda.adamw_step(*bufs, cuda.grad_norm_sq(bufs[1]), max_norm=max_norm, **ADAMW)


# ---------------------------------------------------------------- every kernel, every dtype


def test_every_launching_kernel_has_a_driver():
    assert NO_CUSTOM_KERNEL <= set(kernels.KERNELS)
    assert set(DRIVERS) == set(kernels.KERNELS) - NO_CUSTOM_KERNEL


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
@pytest.mark.parametrize(
    "driver", sorted(set(DRIVERS.values()), key=lambda d: d.__name__), ids=lambda d: d.__name__
)
def test_launches_pack_their_arguments(cuda, launches, driver, dtype):
    driver(cuda, dtype)
    assert launches or (driver.__name__, dtype) in CUPY_ONLY, "no launch"
    for launch in launches:  # the compile list: NVRTC compiles only these
        assert launch.name in cuda.instances(launch.source), launch.name


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=ids)
def test_gemms_run_every_layout_aligned_and_not(cuda, launches, dtype):
    gemms(cuda, dtype)
    kernel = "gemm_f32<" if dtype == F32 else f"gemm_tc<{cuda.runtime.CTYPES[dtype]},"
    want = {
        f"{kernel}{ta},{tb},{aligned}>"
        for ta, tb in [("false", "false"), ("false", "true"), ("true", "false")]
        for aligned in ("false", "true")
    }
    assert {launch.name for launch in launches} == want


def test_the_cupy_kernels_launch_nothing_of_ours(cuda, launches):
    a = place(cuda, rand((5, 33, 17), F32), "transposed")
    cuda.contiguous(a)
    cuda.copy(cuda.empty((5, 33, 17), F32), a)
    cuda.fill(cuda.empty(7, F16), 0.0)
    cuda.concat([a, a[:, :3]], 1)
    cuda.index_bwd(place(cuda, rand((4, 3), F32)), (4, 7), (slice(None), slice(1, 4)))
    cuda.sum(a, axis=(0, 1))
    y = cuda.amax(a, axis=(0, 2), keepdims=True)
    cuda.amax_bwd(a, y, y, (0, 2))
    idx = cuda.argmax(place(cuda, rand((5, 33, 17), BF16)), 1)
    cuda.max_bwd(place(cuda, rand((5, 1, 17), F16)), idx, (5, 33, 17), 1)
    assert launches == []


def test_unary_ops_are_numbered_as_in_the_contract(cuda):
    """elementwise.cu's UnaryOp enum names elementwise.UNARY_OPS in order: the index is the
    template argument the backend passes."""
    source = (KERNEL_DIR / "elementwise.cu").read_text()
    enum = re.search(r"enum UnaryOp \{([^}]*)\}", source).group(1)
    numbered = dict(re.findall(r"(\w+) = (\d+)", enum))
    assert {name.lower(): int(i) for name, i in numbered.items()} == {
        op: elementwise.unary_op(op) for op in elementwise.UNARY_OPS
    }
    with pytest.raises(ValueError, match="unknown unary op 'gelu'"):
        cuda.unary_fwd(cuda.empty(3, F32), "gelu")


def test_quant_formats_are_numbered_as_in_quant_cu(cuda):
    """quant.cu's QuantFormat enum and cuda/quant.py's FORMATS name the formats in one order
    (the index is the template argument), the formats of formats.FORMATS, each with its code
    dtype."""
    source = (KERNEL_DIR / "quant.cu").read_text()
    enum = re.search(r"enum QuantFormat \{([^}]*)\}", source).group(1)
    numbered = {name.lower(): int(i) for name, i in re.findall(r"(\w+) = (\d+)", enum)}
    assert numbered == {fmt: spec[0] for fmt, spec in cuda.formats.FORMATS.items()}
    assert set(numbered) == set(formats.FORMATS)
    for fmt, (_, code_dtype, per_code, _) in cuda.formats.FORMATS.items():
        assert np.dtype(code_dtype).itemsize * 8 == formats.FORMATS[fmt].bits * per_code


def test_quant_arguments_that_do_not_fit_are_refused(cuda, launches):
    qw = quant.quantize(rand((6, 64), F32), "int4", 32)
    x, codes, scales = (
        cuda.asarray(rand((2, 64), F32)),
        cuda.asarray(qw.codes),
        cuda.asarray(qw.scales),
    )
    bf16 = quant.quantize(rand((6, 64), F32), "bf16")
    cases = [
        (ValueError, "unknown quantized format 'int2'", (x, codes, scales, "int2", 32)),
        (
            TypeError,
            "int8 codes must be a 2-D uint8",
            (x, cuda.asarray(bf16.codes), scales, "int8", 32),
        ),
        (
            ValueError,
            "group_size 24 must be a positive even divisor",
            (x, codes, scales, "int4", 24),
        ),
        (ValueError, "group_size 1 must be a positive even divisor", (x, codes, scales, "int4", 1)),
        (
            ValueError,
            r"scales must have shape \(6, 2\), got \(6, 4\)",
            (x, codes, cuda.asarray(np.ones((6, 4), F32)), "int4", 32),
        ),
        (ValueError, r"scales must have shape \(6, 2\), got None", (x, codes, None, "int4", 32)),
        (
            ValueError,
            "bf16 weights have no scales",
            (x, cuda.asarray(bf16.codes), scales, "bf16", None),
        ),
        (ValueError, r"x \(2, 32\) must be \(M, 64\)", (x[:, :32], codes, scales, "int4", 32)),
        (
            TypeError,
            "floating-point x",
            (cuda.asarray(np.ones((2, 64), np.int32)), codes, scales, "int4", 32),
        ),
    ]
    for error, match, args in cases:
        with pytest.raises(error, match=match):
            cuda.qmatmul(*args)
    with pytest.raises(ValueError, match=r"bias \(5,\) must be \(6,\)"):
        cuda.qmatmul(x, codes, scales, "int4", 32, bias=cuda.asarray(rand(5, F32)))
    with pytest.raises(ValueError, match="token id 6 out of range for vocab 6"):
        cuda.qembedding(codes, scales, cuda.asarray(np.array([0, 6])), "int4", 32)
    assert launches == []


def test_row_kernels_without_rows_launch_nothing(cuda, launches):
    for kernel in (cuda.softmax_fwd, cuda.log_softmax_fwd):
        assert kernel(cuda.empty((0, 5), F32)).shape == (0, 5)
    for op in elementwise.UNARY_OPS:
        assert cuda.unary_fwd(cuda.empty((3, 0), F16), op).shape == (3, 0)
    assert launches == []


# ---------------------------------------------------------------- what the host computes


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
def test_gemm_with_k_zero_is_bias_or_zero_without_a_launch(cuda, launches, dtype):
    """C = bias (or 0), as cpu.py's np.matmul gives, filled on the host: no kernel launched."""
    bias = rand(5, dtype)
    cases = [
        ("matmul", np.zeros((3, 0), dtype), np.zeros((0, 5), dtype), {"bias": bias}),
        ("matmul", np.zeros((2, 3, 0), dtype), np.zeros((0, 5), dtype), {}),
        ("matmul_nt", np.zeros((2, 4, 0), dtype), np.zeros((6, 0), dtype), {}),
        ("matmul_tn", np.zeros((0, 3), dtype), np.zeros((0, 5), dtype), {}),
    ]
    for kernel, a, b, kw in cases:
        got = getattr(cuda, kernel)(
            cuda.asarray(a), cuda.asarray(b), **{k: cuda.asarray(v) for k, v in kw.items()}
        )
        ref = getattr(cpu, kernel)(a, b, **kw)
        assert got.shape == ref.shape and got.dtype == ref.dtype
        np.testing.assert_array_equal(cuda.to_numpy(got), ref)
    assert launches == []


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
@pytest.mark.parametrize("shape", [(0, 5), (2, 0, 7), (3, 0)], ids=str)
def test_layernorm_bwd_without_rows_or_columns(cuda, launches, dtype, shape):
    stat = dtypes.compute_dtype(dtype)
    x, w = cuda.asarray(np.zeros(shape, dtype)), cuda.asarray(rand(shape[-1], dtype))
    mean = rstd = cuda.asarray(np.zeros(shape[:-1], stat))
    dx, dweight, dbias = cuda.layernorm_bwd(x, x, w, mean, rstd)
    assert dx.shape == shape and dx.dtype == dtype
    for d in (dweight, dbias):
        assert d.shape == (shape[-1],) and d.dtype == dtype and not d.any()
    assert launches == []
    if shape[-1]:  # cpu.py needs C > 0 to reshape; its zero-row result is the same zeros
        for d, ref in zip(
            (dweight, dbias),
            cpu.layernorm_bwd(*(cuda.to_numpy(a) for a in (x, x, w, mean, rstd)))[1:],
        ):
            assert ref.shape == d.shape and ref.dtype == d.dtype and not ref.any()
    cuda.layernorm_fwd(x, w, w)  # a 0-row forward launches nothing; 0 columns is a valid launch


@pytest.mark.parametrize("bad", [1000, 50_300, -1])
def test_embedding_ids_out_of_range_raise_cpu_py_s_error(cuda, launches, bad):
    weight, idx = rand((1000, 8), F32), np.array([[3, bad], [0, 999]])
    for kernel, args in [
        ("embedding_fwd", (weight, idx)),
        ("embedding_bwd", (rand((2, 2, 8), F32), idx, 1000)),
    ]:
        with pytest.raises(ValueError) as on_cpu:
            getattr(cpu, kernel)(*args)
        with pytest.raises(ValueError) as on_cuda:
            getattr(cuda, kernel)(
                *[cuda.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
            )
        assert (
            str(on_cuda.value) == str(on_cpu.value) == f"token id {bad} out of range for vocab 1000"
        )
    assert launches == []  # checked on the host, before the launch


def test_cross_entropy_fwd_bwd_refuses_an_out_it_cannot_write(cuda, launches):
    """The kernel writes out as a C-contiguous (N, Vp) array of the logits' dtype."""
    logits, t = cuda.asarray(rand((4, 16), F32)), cuda.asarray(np.array([0, 3, -1, 9]))
    for out in (
        cuda.empty((4, 16), F16),
        cuda.empty((4, 32), F32)[:, ::2],
        cuda.empty((16, 4), F32),
    ):
        with pytest.raises(ValueError, match="C-contiguous"):
            cuda.cross_entropy_fwd_bwd(logits, t, cuda.asarray(np.ones(1, F32)), out=out)
    assert launches == []


def test_flash_attention_refuses_heads_that_do_not_group(cuda, launches):
    """k and v need a number of heads that divides q's (grouped-query attention), and one
    shape; refused on the host, with the shapes named."""
    q = cuda.asarray(rand((1, 4, 8, 16), F32))
    for k, v in [((1, 3, 8, 16),) * 2, ((1, 2, 8, 16), (1, 4, 8, 16)), ((2, 2, 8, 16),) * 2]:
        need = "need (B, H, Tq, D) and (B, Hkv, Tk, D) with H a multiple of Hkv and Tk >= Tq"
        with pytest.raises(ValueError, match=re.escape(f"k {k}, v {v}: {need}")):
            cuda.flash_attention_fwd(
                q, cuda.asarray(rand(k, F32)), cuda.asarray(rand(v, F32)), 0.25
            )
    assert launches == []


@pytest.mark.parametrize("P,G", [(F32, F16), (F32, F64), (F64, F64)], ids=ids)
def test_adamw_constants_are_rounded_once_to_the_master_dtype(cuda, launches, P, G):
    """cpu.adamw_step keeps decay, lr/bc1 and 1/sqrt(bc2) in the master's dtype (acc(...)); the
    kernel gets the same values (in fp64 runs, not fp32 roundings of them)."""
    bufs = adamw_buffers(cuda, P, G)
    cuda.adamw_step(*bufs, cuda.grad_norm_sq(bufs[1]), max_norm=1.0, **ADAMW)
    (launch,) = [la for la in launches if la.name.startswith("adamw_step")]
    lr, beta1, beta2, step = ADAMW["lr"], ADAMW["beta1"], ADAMW["beta2"], ADAMW["step"]
    acc = P.type
    want = (
        acc(1 - lr * ADAMW["weight_decay"]),
        acc(lr / (1 - beta1**step)),
        acc(1 / np.sqrt(1 - beta2**step)),
    )
    got = launch.args[-3:]
    assert [type(g) for g in got] == [acc] * 3 and got == want
    assert launch.args[5].dtype == dtypes.compute_dtype(G)  # norm_sq as grad_norm_sq gave it
    if P == F64:
        assert got != tuple(acc(np.float32(c)) for c in want)


# ---------------------------------------------------------------- the stand-in refuses mismatches


def _tamper(cuda, monkeypatch, change):
    """Make every launch pass change(args) instead of its arguments."""
    real = cuda.runtime.compiled

    def tampered(*key):
        kernel = real(*key)
        return lambda grid, block, args: kernel(grid, block, change(args))

    for module in list(sys.modules.values()):  # every module of the package that launches
        if getattr(module, "__name__", "").startswith(cuda.__name__ + "."):
            if getattr(module, "compiled", None) is real:
                monkeypatch.setattr(module, "compiled", tampered)


def test_a_widened_int_is_refused(cuda, monkeypatch):
    x, w = place(cuda, rand((4, 64), F16)), place(cuda, rand(64, F16))
    _tamper(
        cuda,
        monkeypatch,
        lambda args: tuple(np.int64(a) if type(a) is np.int32 else a for a in args),
    )
    with pytest.raises(fake_cupy.LaunchError, match=r"rows\): np.int64 for a int"):
        cuda.layernorm_fwd(x, w, w)


def test_swapped_arguments_are_refused(cuda, monkeypatch):
    """adamw_step's n_decay (long long) and inv_scale (double) swapped. (Two arguments of one
    type swapped would pass: packing cannot tell them apart.)"""
    bufs = adamw_buffers(cuda, F32, BF16)
    _tamper(
        cuda,
        monkeypatch,
        lambda args: args[:7] + (args[8], args[7]) + args[9:] if len(args) > 9 else args,
    )
    with pytest.raises(fake_cupy.LaunchError, match="n_decay"):
        cuda.adamw_step(*bufs, cuda.grad_norm_sq(bufs[1]), max_norm=1.0, **ADAMW)


def test_bad_pointers_and_scalars_are_refused(cuda):
    gelu = cuda.runtime.compiled("elementwise.cu", "gelu_fwd", F16)
    x16, y16 = cuda.empty(300, F16), cuda.empty(300, F16)
    n = np.int64(300)
    gelu((2,), (256,), (x16, y16, n))  # the right packing passes
    bad = {
        "a float32 array for a __half": (cuda.empty(300, F32), y16, n),
        "non-contiguous": (cuda.empty(600, F16)[::2], y16, n),
        "never tests it for null": (x16, cuda.runtime.NULL, n),
        "ndarray for a __half": (np.empty(300, F16), y16, n),  # a host array
        "int for a long long": (x16, y16, 300),  # a Python int
        "float64 for a long long": (x16, y16, np.float64(300)),
        "takes a tuple of 3 arguments": (x16, y16),
    }
    for message, args in bad.items():
        with pytest.raises(fake_cupy.LaunchError, match=message):
            gelu((2,), (256,), args)
    binary = cuda.runtime.compiled("elementwise.cu", "binary", F32, 2)  # null a: the scalar sa
    binary(
        (1,),
        (256,),
        (
            cuda.runtime.NULL,
            cuda.empty(5, F32),
            np.float32(2),
            np.float32(0),
            cuda.empty(5, F32),
            np.int64(5),
        ),
    )
    with pytest.raises(fake_cupy.LaunchError, match="float64 for a float"):
        binary(
            (1,),
            (256,),
            (
                cuda.runtime.NULL,
                cuda.empty(5, F32),
                np.float64(2),
                np.float32(0),
                cuda.empty(5, F32),
                np.int64(5),
            ),
        )


@pytest.mark.parametrize(
    "grid,block",
    [
        ((0,), (256,)),
        ((2**31,), (256,)),
        ((1, 65536), (256,)),
        ((1, 1, 65536), (32,)),
        ((1,), (1025,)),
        ((1,), (32, 32, 2)),
        ((1,), (256, 1, 65)),
        ([1], (256,)),
    ],
)
def test_launch_shapes_beyond_the_limits_are_refused(cuda, grid, block):
    gelu = cuda.runtime.compiled("elementwise.cu", "gelu_fwd", F32)
    with pytest.raises(fake_cupy.LaunchError, match="grid|block"):
        gelu(grid, block, (cuda.empty(1, F32), cuda.empty(1, F32), np.int64(1)))


def test_instances_outside_the_compile_list_are_refused(cuda):
    with pytest.raises(fake_cupy.LaunchError, match="not in name_expressions"):
        cuda.runtime.compiled("gemm.cu", "gemm_tc", F64, False, False, True)  # no fp64 tensor cores
    source = cuda.kernel_source("elementwise.cu")
    with pytest.raises(fake_cupy.LaunchError, match="does not fit"):
        fake_cupy.RawModule(code=source, name_expressions=["gelu_fwd<true>"])
    with pytest.raises(fake_cupy.LaunchError, match="names no kernel"):
        fake_cupy.RawModule(code=source, name_expressions=["gelu<float>"])


@pytest.mark.parametrize("filename", sorted(p.name for p in KERNEL_DIR.glob("*.cu")))
def test_every_kernel_of_a_file_is_in_its_compile_list(cuda, filename):
    source = cuda.kernel_source(filename)
    module = fake_cupy.RawModule(code=source, name_expressions=cuda.instances(source))
    assert set(module.templates) == {name.split("<")[0] for name in module.kernels}
