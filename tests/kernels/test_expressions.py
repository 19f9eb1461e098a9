"""The expression language the elementwise kernels are declared in (kernels/elementwise/expr.py)
and its generators: the tree keeps the written order, equal subtrees are one node, the counts
come from the tree, what cannot be compiled the same way everywhere is refused, and a formula
declared here becomes a compiled CPU kernel and a CUDA kernel with its instances. (The declared
kernels' values: test_elementwise.py.)"""

import math

import numpy as np
import pytest

from tinygrad_like.kernels.elementwise import cuda_source, expr, numba_source, spec
from tinygrad_like.kernels.elementwise.expr import Const, Input, Op, exp, tanh, where

x, dy = Input("x"), Input("dy")


def test_operators_build_the_written_order():
    assert (x + 1.0) * x * 0.5 == Op(
        "mul", (Op("mul", (Op("add", (x, Const(1.0))), x)), Const(0.5))
    )
    assert 1.0 - x == Op("sub", (Const(1.0), x))  # the reflected operators keep the sides
    assert 2 / x == Op("div", (Const(2.0), x))


def test_equal_subtrees_are_one_node_and_counted_once():
    e = expr.Expression("t", (x, dy), (dy * (1.0 - tanh(x) * tanh(x)),))
    assert [n.op for n in e.ops] == ["tanh", "mul", "sub", "mul"]
    assert e.counts() == (4, 1)  # one tanh: one FLOP and one exp
    gelu = expr.EXPRESSIONS["gelu_fwd"]
    assert gelu.counts() == (9, 1)  # 0.5 x (1 + tanh(c (x + 0.044715 x^3))), as written
    relu = spec.UNARY["relu"][0]
    assert relu.counts() == (1, 0)  # a where counts, its comparison does not


def test_what_is_not_one_formula_everywhere_is_refused():
    with pytest.raises(ValueError, match="constants only"):
        Op("add", (Const(1.0), Const(2.0)))  # a kernel would round it, Python would not
    with pytest.raises(TypeError, match="no truth value"):
        bool(x > 0.0)
    with pytest.raises(TypeError, match="must be a comparison"):
        where(x, 1.0, 0.0)
    with pytest.raises(ValueError, match="must be a tuple of its parameters"):
        expr.declare("bad_rows", ("x", "b"), lambda x, b: x + b, rows="b")
    with pytest.raises(ValueError, match="no literal"):
        expr.literal(math.inf)


@pytest.fixture
def softplus():
    """softplus(x + b), b a row vector, declared here as one formula (and forgotten after)."""
    yield expr.declare("test_softplus", ("x", "b"), lambda x, b: expr.log(1.0 + exp(x + b)), ("b",))
    del expr.EXPRESSIONS["test_softplus"]


def test_the_shape_rule_checks_the_operands(softplus):
    x2, b = np.zeros((3, 4), np.float32), np.zeros(4, np.float32)
    assert softplus.shape(x2, b).shape == (3, 4)
    with pytest.raises(ValueError, match=r"b has shape \(3,\), need \(4,\)"):
        softplus.shape(x2, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="no rows"):
        softplus.shape(np.float32(1.0), b)
    with pytest.raises(ValueError, match="dy has shape"):
        expr.EXPRESSIONS["gelu_bwd"].shape(x2, np.zeros((4, 3), np.float32))


def test_a_new_formula_is_a_cpu_and_a_cuda_kernel(softplus):
    """softplus(x + b) of one formula: its Numba kernel compiles and runs (against NumPy's
    evaluation of the same expression, and log1p(exp(x + b)) in float64), and its CUDA kernel
    is one more entry of the generated file's kind."""
    a = np.random.default_rng(0).standard_normal((5, 7))
    b = np.random.default_rng(1).standard_normal(7)
    out = np.empty_like(a)
    numba_source.compiled("test_softplus")(a, b, out)
    np.testing.assert_allclose(out, np.log1p(np.exp(a + b)), rtol=1e-14)
    (numpy,) = expr.evaluate(softplus, [a, b], np)  # NumPy's own exp and log: an ulp apart
    np.testing.assert_allclose(numpy, out, rtol=1e-15)
    text = cuda_source.kernel_source(softplus)
    assert "__global__ void test_softplus(const T* x, const T* b, T* out0" in text
    assert "to_acc(b[i % cols])" in text and "tg_log(" in text
    listing = cuda_source.source().split("#ifdef TG_CHECK_INSTANTIATE")[1]
    assert all(f"&{name}<__nv_bfloat16>" in listing for name in expr.EXPRESSIONS)


def test_the_fused_kernels_keep_the_unfused_bits_in_fp32():
    """bias_gelu and bias_residual keep the order of the kernels they replace (add, then GELU;
    add, then add): their fp32 results are those kernels' bit for bit, on the CPU."""
    from tinygrad_like import kernels
    from tinygrad_like.backend import cpu

    k = kernels.on(cpu)
    rng = np.random.default_rng(0)
    x, v = (rng.standard_normal((33, 96), dtype=np.float32) * 3 for _ in range(2))
    b = rng.standard_normal(96, dtype=np.float32)
    assert np.array_equal(k.bias_gelu(v, b), k.gelu_fwd(k.add(v, b)))
    assert np.array_equal(k.bias_residual(x, v, b), k.add(x, k.add(v, b)))


@pytest.mark.parametrize("half", ["bf16", "fp16"])
@pytest.mark.parametrize("name", sorted(expr.EXPRESSIONS))
def test_2_byte_operands_are_read_as_bits_with_the_fp32_kernels_bits(name, half):
    """Every declared kernel's 2-byte twin (numba_source's bits=True: elements widened as they
    are loaded, rounded as they are stored) gives the fp32 kernel's results on the widened
    operands, rounded once, row vectors included; NaN, infinities and values past the format's
    range among the operands (a NaN result's sign and payload aside)."""
    from tinygrad_like import dtypes, kernels
    from tinygrad_like.backend import cpu

    dtype = dtypes.as_dtype(half)
    k = kernels.on(cpu)
    e = expr.EXPRESSIONS[name]
    rng = np.random.default_rng(0)
    shape = (70, 96)
    args = []
    for n, i in enumerate(e.inputs):
        a = (rng.standard_normal(shape[-1:] if i.row else shape) * 4).astype(np.float32)
        if not i.row:
            a.reshape(-1)[n : n + 3] = [np.nan, np.inf, -3e38]
        with np.errstate(over="ignore"):  # -3e38 overflows fp16: -inf
            args.append(a.astype(dtype))
    direction, _, op = name.partition("unary_")[2].partition("_")
    run = (lambda *a: getattr(k, f"unary_{direction}")(*a, op)) if op else getattr(k, name)
    got, want = run(*args), run(*(a.astype(np.float32) for a in args))
    got, want = (r if isinstance(r, tuple) else (r,) for r in (got, want))
    for g, w in zip(got, want):
        assert g.dtype == dtype
        with np.errstate(all="ignore"):
            w = w.astype(dtype)
        nan = np.isnan(w)  # a NaN's sign is the compiled loop's, in either kernel
        assert (np.isnan(g) == nan).all() and g[~nan].tobytes() == w[~nan].tobytes()
