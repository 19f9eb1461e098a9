"""Elementwise kernels and data movement (kernels/elementwise): binary arithmetic (broadcast, a
Python scalar on either side, out=), div's gradient, the unary ops and their gradients, max and
its gradients, GELU, SwiGLU, dropout, casts, copies, fills, concatenation,
index gradients and sums, against float64 formulas; data movement, bit for bit. The kernels
generated from expressions (expr.py) pass the same cases as the hand-written ones.

2-byte formats: computed in fp32 and rounded once; sums accumulate in fp32.
"""

import math

import numpy as np
import pytest

from tinygrad_like import dtypes
from tinygrad_like.kernels.elementwise.spec import UNARY_OPS

from .check import BF16, EPS, F16, F32, F64, FLOATS, cases, close, cpu, f64, rand

HALF = [F16, BF16]

# ---------------------------------------------------------------- binary arithmetic

UFUNCS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


def binary_ref(op):
    return lambda a, b, out=None: UFUNCS[op](f64(a), f64(b))


def binary(put, dtype, shape, operands):
    """a and b of shape (b away from 0: a safe divisor) as `operands` pairs them: both arrays,
    a Python scalar on either side, b's first row broadcast, or an out= to write."""
    a = rand(shape, dtype, seed=1)
    b = (np.abs(rand(shape, F64, seed=2)) + 0.5).astype(dtype)
    return {
        "a b": (put(a), put(b)),
        "a 2.5": (put(a), 2.5),
        "2.5 b": (2.5, put(b)),
        "a b[:1]": (put(a), put(b[..., :1])),
        "out=": (put(a), put(b), {"out": put(np.zeros(shape, dtype))}),
    }[operands]


OPERANDS = ["a b", "a 2.5", "2.5 b", "a b[:1]", "out="]
# ragged against a block; one element; a few (the flat kernel's edges)
SHAPES = [(37, 129), (1,), (5, 3)]


def neg(put, dtype, shape):
    return put(rand(shape, dtype))


def div_bwd_ref(a, b, dy):
    return -f64(dy) * f64(a) / f64(b) ** 2


def div_bwd(put, dtype, operands):
    """-(dy (a / b)) / b with |b| in [256, 1000]: b * b would overflow fp16 (the kernel, a
    scalar numerator, and the broadcasting fallback)."""
    a, dy = rand((7, 1001), dtype, seed=1), rand((7, 1001), dtype, seed=2)
    sign = np.sign(rand((7, 1001), F32, seed=4))
    b = (np.random.default_rng(3).uniform(256, 1000, (7, 1001)) * sign).astype(dtype)
    return {"a b dy": (put(a), put(b), put(dy)), "2.5 b dy": (2.5, put(b), put(dy))}.get(
        operands, (put(a), put(b[:, :1]), put(dy))
    )


def not_flushed(results, a, b, dy):
    """div_bwd's fp16 results are not flushed to 0 where the exact gradient is not tiny."""
    exact = div_bwd_ref(a, b, dy)
    assert np.all(results[0][np.abs(exact) > 1e-6] != 0)


def div_bwd_small(put, dtype, shape):
    """Small shapes, b in [1, 5) (no overflow in the fallback)."""
    a, dy = rand(shape, dtype, seed=1), rand(shape, dtype, seed=3)
    return put(a), put((np.abs(rand(shape, F32, seed=2)) + 1).astype(dtype)), put(dy)


# ---------------------------------------------------------------- the unary ops


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


UNARY_REF = {  # op -> (op(x), op'(x)) in float64
    "exp": (np.exp, np.exp),
    "log": (np.log, lambda x: 1 / x),
    "sqrt": (np.sqrt, lambda x: 0.5 / np.sqrt(x)),
    "rsqrt": (lambda x: 1 / np.sqrt(x), lambda x: -0.5 / np.sqrt(x) / x),
    "tanh": (np.tanh, lambda x: 1 - np.tanh(x) ** 2),
    "sigmoid": (sigmoid, lambda x: sigmoid(x) * (1 - sigmoid(x))),
    "silu": (lambda x: x * sigmoid(x), lambda x: sigmoid(x) * (1 + x * (1 - sigmoid(x)))),
    "relu": (lambda x: np.maximum(x, 0), lambda x: (x > 0).astype(np.float64)),
}


def unary_fwd_ref(x, op):
    return UNARY_REF[op][0](f64(x))


def unary_bwd_ref(x, dy, op):
    return f64(dy) * UNARY_REF[op][1](f64(x))


def unary(put, dtype, op, shape, call):
    """x (log, sqrt and rsqrt on (0.1, 4), the others normal, exp(8) fitting fp16) and dy of
    shape, as `call` takes them: forward, backward, or the forward of x transposed."""
    x = rand(shape, dtype, scale=2.0, seed=1)
    if op in ("log", "sqrt", "rsqrt"):
        x = (np.abs(f64(x)) + 0.1).astype(dtype)
    dy = rand(shape, dtype, seed=2)
    return {"x": (put(x), op), "x dy": (put(x), put(dy), op), "x^T": (put(x).T, op)}[call]


# ---------------------------------------------------------------- max and its gradients


def ties(dtype):
    """(5, 33, 17) with rows 3 and 4 of axis 1 equal: ties."""
    x = rand((5, 33, 17), dtype, seed=1)
    x[:, 3] = x[:, 4]
    return x


def amax_ref(a, axis=None, keepdims=False):
    return f64(a).max(axis=axis, keepdims=keepdims)


def argmax_ref(a, axis):
    return np.expand_dims(np.argmax(f64(a), axis), axis)


def amax_bwd_ref(x, y, dy, axis):
    hit = f64(x) == f64(y)
    return hit * f64(dy) / hit.sum(axis=axis, keepdims=True)


def max_bwd_ref(dy, idx, shape, axis):
    dx = np.zeros(shape)
    np.put_along_axis(dx, idx, f64(dy), axis)
    return dx


def amax(put, dtype, axis):
    return put(ties(dtype)), {"axis": axis, "keepdims": True}


def amax_bwd(put, dtype, axis):
    """x with ties, its max y over axis (the CPU's) and dy of y's shape."""
    x = ties(dtype)
    y = cpu.amax(x, axis=axis, keepdims=True)
    return put(x), put(y), put(rand(y.shape, dtype, seed=2)), axis


def argmax(put, dtype):
    return put(ties(dtype)), 1


def max_bwd(put, dtype):
    """dy (5, 1, 17) scattered to (5, 33, 17) at the CPU's argmax over axis 1."""
    idx = cpu.argmax(ties(dtype), 1)
    return put(rand((5, 1, 17), dtype, seed=3)), put(idx), (5, 33, 17), 1


# ---------------------------------------------------------------- GELU and SwiGLU

C = math.sqrt(2 / math.pi)


def gelu_fwd_ref(x):
    x = f64(x)
    return 0.5 * x * (1 + np.tanh(C * (x + 0.044715 * x**3)))


def gelu_bwd_ref(x, dy):
    x = f64(x)
    t = np.tanh(C * (x + 0.044715 * x**3))
    return f64(dy) * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * C * (1 + 3 * 0.044715 * x**2))


def gelu(put, dtype, shape, call):
    x, dy = rand(shape, dtype, scale=3.0, seed=1), rand(shape, dtype, seed=2)
    return (put(x),) if call == "fwd" else (put(x), put(dy))


def swiglu_fwd_ref(gate, up):
    return f64(gate) * sigmoid(f64(gate)) * f64(up)


def swiglu_bwd_ref(gate, up, dy):
    g, u, dy = f64(gate), f64(up), f64(dy)
    s = sigmoid(g)
    return dy * u * s * (1 + g * (1 - s)), dy * g * s


def swiglu(put, dtype, shape, call):
    g, u, dy = (
        rand(shape, dtype, scale=3.0, seed=1),
        rand(shape, dtype, seed=2),
        rand(shape, dtype, seed=3),
    )
    return (put(g), put(u)) if call == "fwd" else (put(g), put(u), put(dy))


ROW_SHAPES = [(7, 129), (2, 3, 64), (1, 1)]  # (..., C) beside a bias (C,)


def bias_gelu(put, dtype, shape):
    v, b = rand(shape, dtype, scale=3.0, seed=1), rand(shape[-1:], dtype, seed=2)
    return put(v), put(b)


def bias_gelu_ref(v, b):
    return gelu_fwd_ref(f64(v) + f64(b))


def bias_residual(put, dtype, shape):
    x, v, b = (
        rand(shape, dtype, seed=1),
        rand(shape, dtype, seed=2),
        rand(shape[-1:], dtype, seed=3),
    )
    return put(x), put(v), put(b)


def bias_residual_ref(x, v, b):
    return f64(x) + f64(v) + f64(b)


# ---------------------------------------------------------------- dropout


def dropout(put, dtype, shape):
    return put(rand(shape, dtype)), 0.25, 7


def a_dropout_mask(results, x, p, seed):
    """mask holds 0 or 1/(1-p) in x's dtype, about 1-p of it kept; y = x mask."""
    y, mask = (f64(r) for r in results)
    keep = float(np.asarray(np.float32(1.0) / np.float32(1 - p)).astype(x.dtype))
    assert set(np.unique(mask)) <= {0.0, keep}
    if mask.size >= 1000:
        assert abs((mask != 0).mean() - (1 - p)) < 0.01
    close(y, f64(x) * mask, x.dtype)


# ---------------------------------------------------------------- data movement


def same(a, *args, **kwargs):
    return f64(a)


def contiguous(put, dtype, transposed):
    a = put(rand((5, 33, 17), dtype))
    return a.swapaxes(0, 1) if transposed else a


def cast(put, src, dst):
    return put(rand((3, 1001), src, scale=300.0)), dst


def copy(put, dtype):
    """a (5, 33, 17) into rows 3 to 35 of a (5, 40, 17) buffer: a strided view."""
    return put(np.zeros((5, 40, 17), dtype))[:, 3:36], put(rand((5, 33, 17), dtype))


def fill(put, dtype):
    """A value whose bits are not all zero (a 2-byte float's fill writes them through a uint16
    view)."""
    return put(np.full((5, 40, 17), 7, dtype)), -1.5


def concat(put, dtype):
    a = put(rand((5, 33, 17), dtype))
    return (a, a[:, :3]), 1


def concat_ref(arrays, axis):
    return np.concatenate([f64(a) for a in arrays], axis)


def copy_ref(dst, src):
    return np.broadcast_to(f64(src), dst.shape)


def fill_ref(dst, value):
    return np.full(dst.shape, value, np.float64)


def index_bwd(put, dtype, dy_shape, shape, index):
    """dy of x[index]'s shape (index: ints, slices and host index arrays)."""
    return put(rand(dy_shape, dtype)), shape, index


def index_bwd_ref(dy, shape, index):
    dx = np.zeros(shape)
    dx[index] = f64(dy)
    return dx


IDS = np.array([0, 2, 2, 5, 0, 1])  # repeated: the last written wins, as NumPy assigns
INDEX = [
    ((4, 6, 8), (4, 7, 8), (slice(None), IDS)),
    ((4, 3, 8), (4, 7, 8), (slice(None), slice(1, 4))),
    ((2, 2), (3, 4), (slice(1, 3), slice(None, None, 2))),
]


def sum_ref(a, axis=None, keepdims=False):
    return f64(a).sum(axis=axis, keepdims=keepdims)


def total(put, dtype, axes):
    """a (5, 33, 17) summed over axes: two, the last kept, all."""
    a = put(rand((5, 33, 17), dtype))
    return {"0 1": (a, {"axis": (0, 1)}), "-1 kept": (a, {"axis": -1, "keepdims": True})}.get(
        axes, (a,)
    )


CASES = [
    *[
        c
        for op in UFUNCS
        for c in cases(
            op,
            binary,
            [(d, s, o) for d in FLOATS for s in SHAPES for o in OPERANDS],
            ref=binary_ref(op),
        )
    ],
    *cases(
        "neg",
        neg,
        [(d, s) for d in FLOATS for s in [(5, 33, 17), (1,), (5, 3)]],
        ref=lambda a: -f64(a),
    ),
    *cases("div_bwd", div_bwd, [(d, "a b dy") for d in FLOATS], ref=div_bwd_ref, holds=not_flushed),
    *cases(
        "div_bwd",
        div_bwd,
        [(d, o) for d in FLOATS for o in ("2.5 b dy", "a b[:1] dy")],
        ref=div_bwd_ref,
    ),
    *cases(
        "div_bwd", div_bwd_small, [(d, s) for d in FLOATS for s in [(1,), (5, 3)]], ref=div_bwd_ref
    ),
    *cases(
        "unary_fwd",
        unary,
        [(d, op, (7, 1001), call) for d in FLOATS for op in UNARY_OPS for call in ("x", "x^T")]
        + [(d, op, s, "x") for d in FLOATS for op in UNARY_OPS for s in [(1,), ()]],
        ref=unary_fwd_ref,
    ),
    *cases(
        "unary_bwd",
        unary,
        [(d, op, s, "x dy") for d in FLOATS for op in UNARY_OPS for s in [(7, 1001), (1,), ()]],
        ref=unary_bwd_ref,
    ),
    *cases("amax", amax, [(d, a) for d in FLOATS for a in [(0, 2), (1,), (0, 1, 2)]], ref=amax_ref),
    *cases(
        "amax_bwd",
        amax_bwd,
        [(d, a) for d in FLOATS for a in [(0, 2), (1,), (0, 1, 2)]],
        ref=amax_bwd_ref,
    ),
    *cases("argmax", argmax, [(d,) for d in FLOATS], ref=argmax_ref),
    *cases("max_bwd", max_bwd, [(d,) for d in FLOATS], ref=max_bwd_ref, exact=True),
    *cases(
        "gelu_fwd",
        gelu,
        [(d, s, "fwd") for d in FLOATS for s in [(7, 1001), (1, 1)]],
        ref=gelu_fwd_ref,
    ),
    *cases(
        "gelu_bwd",
        gelu,
        [(d, s, "bwd") for d in FLOATS for s in [(7, 1001), (1, 1)]],
        ref=gelu_bwd_ref,
    ),
    *cases(
        "swiglu_fwd",
        swiglu,
        [(d, s, "fwd") for d in FLOATS for s in [(7, 1001), (1, 1)]],
        ref=swiglu_fwd_ref,
    ),
    *cases(
        "swiglu_bwd",
        swiglu,
        [(d, s, "bwd") for d in FLOATS for s in [(7, 1001), (1, 1)]],
        ref=swiglu_bwd_ref,
    ),
    *cases("bias_gelu", bias_gelu, [(d, s) for d in FLOATS for s in ROW_SHAPES], ref=bias_gelu_ref),
    *cases(
        "bias_residual",
        bias_residual,
        [(d, s) for d in FLOATS for s in ROW_SHAPES],
        ref=bias_residual_ref,
    ),
    *cases(
        "dropout_fwd",
        dropout,
        [(d, s) for d in FLOATS for s in [(64, 1000), (1, 1)]],
        holds=a_dropout_mask,
        repeatable=True,
        vs_cpu=False,
    ),
    *cases(
        "contiguous",
        contiguous,
        [(d, t) for d in FLOATS for t in (True, False)],
        ref=same,
        exact=True,
    ),
    *cases(
        "cast",
        cast,
        [(s, d) for s in FLOATS for d in FLOATS],
        ref=lambda a, dtype: a.astype(dtype),
        exact=True,
    ),
    *cases("copy", copy, [(d,) for d in FLOATS], ref=copy_ref, exact=True),
    *cases("fill", fill, [(d,) for d in FLOATS], ref=fill_ref, exact=True),
    *cases("concat", concat, [(d,) for d in FLOATS], ref=concat_ref, exact=True),
    *cases("index_bwd", index_bwd, [(F32, *i) for i in INDEX], ref=index_bwd_ref, exact=True),
    *cases("sum", total, [(d, a) for d in FLOATS for a in ("0 1", "-1 kept", "all")], ref=sum_ref),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel(case, check):
    check(case)


# ---------------------------------------------------------------- what a case cannot say


def test_contiguous_makes_a_c_contiguous_copy(device):
    a = device.asarray(rand((5, 33, 17), F32)).swapaxes(0, 1)
    assert device.contiguous(a).flags.c_contiguous


def test_copy_into_a_slice_writes_nothing_outside_it(device):
    a = rand((5, 33, 17), F32)
    dst = device.empty((5, 40, 17), F32)
    device.fill(dst, 0.0)
    device.copy(dst[:, 3:36], device.asarray(a))
    want = np.zeros((5, 40, 17), F32)
    want[:, 3:36] = a
    np.testing.assert_array_equal(device.to_numpy(dst), want)


@pytest.mark.parametrize("dtype", FLOATS, ids=dtypes.name)
def test_dropout_seeds(device, dtype):
    """The same seed draws the same mask (and y), another seed another mask."""
    x = device.asarray(rand((100, 100), dtype))
    draws = [
        [device.to_numpy(r).tobytes() for r in device.dropout_fwd(x, 0.3, s)] for s in (1, 1, 2)
    ]
    assert draws[0] == draws[1] and draws[0][1] != draws[2][1]


@pytest.mark.parametrize("dtype", HALF, ids=dtypes.name)
@pytest.mark.parametrize("op", list(UFUNCS))
def test_cpu_binary_half_rounds_once(op, dtype):
    ufunc = UFUNCS[op]
    a, b = rand((3, 4), dtype, seed=1), (rand(4, F32, seed=2) + 3).astype(dtype)
    out = getattr(cpu, op)(a, b)
    want = ufunc(a.astype(F32), b.astype(F32)).astype(dtype)
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))
    # a Python scalar operand does not promote, and out= writes in place
    dst = np.empty((3, 4), dtype)
    assert getattr(cpu, op)(a, 1.5, out=dst) is dst
    want = ufunc(a.astype(F32), np.float32(1.5)).astype(dtype)
    np.testing.assert_array_equal(dst.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("dtype", HALF, ids=dtypes.name)
def test_cpu_sum_accumulates_in_fp32(dtype):
    """4096 ones: fp32 accumulation gives 4096 (exact in both formats); a running sum in the
    2-byte format would stall at 2048 (fp16) or 256 (bf16)."""
    x = np.ones(4096, dtype)
    assert float(np.cumsum(x, dtype=dtype)[-1]) < 4096  # what naive accumulation would do
    out = cpu.sum(x)
    assert out.dtype == dtype and out.shape == ()
    assert float(out) == 4096.0
    rows = cpu.sum(np.ones((2, 4096), dtype), axis=1, keepdims=True)
    assert rows.shape == (2, 1) and np.all(rows.astype(F32) == 4096)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtypes.name)
def test_sum_epilogue_is_the_unfused_add(device, dtype):
    """sum's add= has the bits of the sum then elementwise's add(add, sum); out=add accumulates
    into add itself and returns it (a bias's gradient: dY's rows summed into it)."""
    dy, grad = device.asarray(rand((3, 7, 40), dtype, seed=1)), rand(40, dtype, seed=2)
    want = device.to_numpy(device.add(device.asarray(grad), device.sum(dy, axis=(0, 1))))
    got = device.sum(dy, axis=(0, 1), add=device.asarray(grad))
    assert device.to_numpy(got).tobytes() == want.tobytes()
    g = device.asarray(grad)
    assert device.sum(dy, axis=(0, 1), add=g, out=g) is g
    assert device.to_numpy(g).tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", HALF, ids=dtypes.name)
def test_cpu_gelu_half_is_the_fp32_result_rounded(dtype):
    x, dy = rand((8, 16), dtype, scale=2, seed=1), rand((8, 16), dtype, seed=2)
    y, dx = cpu.gelu_fwd(x), cpu.gelu_bwd(x, dy)
    y32, dx32 = cpu.gelu_fwd(x.astype(F32)), cpu.gelu_bwd(x.astype(F32), dy.astype(F32))
    # one output rounding: within eps of the fp32 result on the same inputs
    np.testing.assert_allclose(y.astype(F32), y32, rtol=EPS[dtype], atol=1e-6)
    np.testing.assert_allclose(dx.astype(F32), dx32, rtol=EPS[dtype], atol=1e-6)
    np.testing.assert_allclose(y32, gelu_fwd_ref(x), rtol=1e-5, atol=1e-6)


def test_cpu_cast_rounds_to_nearest_and_back_exactly():
    x = rand(64, F32)
    for dtype in HALF:
        h = cpu.cast(x, dtype)
        np.testing.assert_allclose(h.astype(F32), x, rtol=EPS[dtype] / 2 + 1e-12, atol=1e-7)
        np.testing.assert_array_equal(cpu.cast(h.astype(F32), dtype).astype(F32), h.astype(F32))


@pytest.mark.parametrize("dtype", [F32, *HALF], ids=dtypes.name)
def test_cpu_dropout_is_x_times_its_mask(dtype):
    x = rand((100, 100), dtype)
    y, mask = cpu.dropout_fwd(x, 0.3, seed=123)
    assert set(np.unique(mask.astype(F32))) == {0.0, float(np.array(1 / 0.7, dtype).astype(F32))}
    assert abs((mask != 0).mean() - 0.7) < 0.02
    want = (x.astype(F32) * mask.astype(F32)).astype(dtype)
    np.testing.assert_array_equal(y.astype(F32), want.astype(F32))


def test_cpu_swiglu_against_the_formula_in_float64():
    g, u, dy = (rand((4, 33), F64, scale=3, seed=s) for s in (1, 2, 3))
    np.testing.assert_allclose(cpu.swiglu_fwd(g, u), swiglu_fwd_ref(g, u), rtol=1e-14)
    for got, want in zip(cpu.swiglu_bwd(g, u, dy), swiglu_bwd_ref(g, u, dy)):
        np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("dtype", HALF, ids=dtypes.name)
def test_cpu_swiglu_half_rounds_once(dtype):
    g, u, dy = (rand(300, dtype, seed=s) for s in (1, 2, 3))
    y = cpu.swiglu_fwd(g, u)
    gf, uf, df = (a.astype(F32) for a in (g, u, dy))
    s = 1 / (np.exp(-gf) + 1)
    np.testing.assert_array_equal(y.view(np.uint16), (s * gf * uf).astype(dtype).view(np.uint16))
    dg, du = cpu.swiglu_bwd(g, u, dy)
    np.testing.assert_array_equal(du.view(np.uint16), (gf * s * df).astype(dtype).view(np.uint16))
    want = (((1 - s) * gf + 1) * s * uf * df).astype(dtype)
    np.testing.assert_array_equal(dg.view(np.uint16), want.view(np.uint16))


def test_cpu_swiglu_saturates_without_nan():
    g = np.array([-1000.0, -90.0, 0.0, 90.0, 1000.0], F32)
    y = cpu.swiglu_fwd(g, np.ones_like(g))
    dg, du = cpu.swiglu_bwd(g, np.ones_like(g), np.ones_like(g))
    assert np.isfinite(y).all() and np.isfinite(dg).all() and np.isfinite(du).all()
    np.testing.assert_array_equal(y[[0, 2, 4]], [0.0, 0.0, 1000.0])


@pytest.mark.parametrize("dtype", [BF16, F16], ids=dtypes.name)
@pytest.mark.parametrize("shape", [(1024, 768), (3, 70000), (24581, 7), (1, 9000), (0, 7), (5, 3)])
def test_cpu_sum_of_half_columns_is_numpys(dtype, shape):
    """A 2-byte matrix's columns (a bias's gradient) summed by elementwise/cpu.py's
    _column_sums: the bits of NumPy's fp32 sum rounded, infinities, NaN and zeros of both signs
    included, keepdims too."""
    a = (np.random.default_rng(3).standard_normal(shape, dtype=F32) * 10).astype(dtype)
    if shape == (5, 3):
        a[:, 0], a[0, 1], a[:, 2], a[3, 2] = np.inf, np.nan, -0.0, 0.0
    want = np.asarray(np.sum(a, axis=0, dtype=F32)).astype(dtype)
    assert cpu.sum(a, axis=0).tobytes() == want.tobytes()
    kept = cpu.sum(a, axis=0, keepdims=True)
    assert kept.shape == (1, shape[1]) and kept.tobytes() == want.tobytes()
