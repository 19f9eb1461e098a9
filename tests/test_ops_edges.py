"""The ops at the edges a PyTorch user expects (issue 26): 0-d tensors, empty dims, size-1
broadcasting, negative and out-of-range dims, non-contiguous inputs, fp16 and bf16 against fp32
computed and rounded once, and the invalid inputs PyTorch refuses. Expected values come from
NumPy formulas (PyTorch is not installed here); float64 gradients of the new ops are in
test_ops_gradcheck.py, the CUDA kernels against the CPU's in tests/kernels/.
"""

import warnings

import numpy as np
import pytest

from tinygrad_like import Tensor, dtypes
from tinygrad_like import functional as F
from tinygrad_like.profiler import Profiler

F16, BF16, F32, F64 = dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64
HALVES = [F16, BF16]
# one ulp of the 2-byte formats, relative: a result rounded once from fp32 is within it
ULP = {F16: 1e-3, BF16: 8e-3}


def t(a, dtype=None, grad=False):
    a = np.asarray(a, dtype=dtype if dtype is not None else np.float64)
    return Tensor(a, requires_grad=grad)


def randn(*shape, seed=0, dtype=np.float64):
    return np.asarray(np.random.default_rng(seed).standard_normal(shape)).astype(dtype)


def out_of_range(ndim, got):
    n = max(ndim, 1)
    return pytest.raises(
        IndexError,
        match=rf"Dimension out of range \(expected to be in range of \[{-n}, {n - 1}\], "
        rf"but got {got}\)",
    )


def rounded_once(f, x, dtype):
    """The reference for a 2-byte op: f on x in fp32, rounded once to dtype."""
    return np.asarray(f(x.astype(np.float32))).astype(dtype)


def assert_half(got, want, dtype):
    assert got.dtype == dtype
    np.testing.assert_allclose(
        got.astype(np.float64), want.astype(np.float64), rtol=ULP[dtype], atol=1e-6
    )


# ---------------------------------------------------------------- sum and mean


@pytest.mark.parametrize("dim", [0, -1])
def test_0d_reductions_take_dim_0_and_minus_1(dim):
    x = t(3.0, grad=True)
    for fn in (F.sum, F.mean):
        y = fn(x, dim)
        assert y.shape == () and y.item() == 3.0
        assert fn(x, dim, keepdim=True).shape == ()
    F.sum(x, dim).backward()
    assert x.grad.numpy() == 1.0
    for bad in (1, -2):
        with out_of_range(0, bad):
            F.sum(x, bad)


def test_out_of_range_dims_raise_instead_of_wrapping():
    x = t(randn(3, 4))
    for fn in (F.sum, F.mean, F.amax, F.var, F.softmax, F.log_softmax):
        with out_of_range(2, 2):
            fn(x, 2)
        with out_of_range(2, -3):
            fn(x, -3)
    with out_of_range(2, 2):
        F.sum(x, (0, 2))
    with out_of_range(2, 2):
        F.max(x, 2)


def test_negative_dims_and_tuples_as_numpy():
    a = randn(2, 3, 4)
    x = t(a)
    np.testing.assert_allclose(F.sum(x, -1).numpy(), a.sum(-1))
    np.testing.assert_allclose(F.sum(x, (0, -1)).numpy(), a.sum((0, 2)))
    np.testing.assert_allclose(F.mean(x, (-2,), keepdim=True).numpy(), a.mean(1, keepdims=True))


def test_repeated_dims_are_refused():
    x = t(randn(3, 4))
    for dims in [(0, 0), (1, -1)]:
        with pytest.raises(ValueError, match="appears multiple times"):
            F.sum(x, dims)
        with pytest.raises(ValueError, match="appears multiple times"):
            F.amax(x, dims)


def test_empty_dim_tuple_reduces_everything():
    """PyTorch's dim=() is every dim (NumPy's axis=() is none)."""
    a = randn(3, 4)
    x = t(a)
    np.testing.assert_allclose(F.sum(x, ()).numpy(), a.sum())
    np.testing.assert_allclose(F.mean(x, ()).numpy(), a.mean())
    np.testing.assert_allclose(x.sum(()).numpy(), a.sum())
    assert F.sum(x, (), keepdim=True).shape == (1, 1)


def test_keepdim_and_the_numpy_names_are_one():
    a = randn(3, 4)
    x = t(a)
    for got in (
        F.sum(x, 1, keepdim=True),
        F.sum(x, axis=1, keepdims=True),
        x.sum(1, keepdim=True),
        x.sum(axis=1, keepdims=True),
    ):
        np.testing.assert_allclose(got.numpy(), a.sum(1, keepdims=True))
    np.testing.assert_allclose(x.mean(axis=-1, keepdims=True).numpy(), a.mean(-1, keepdims=True))
    with pytest.raises(TypeError, match="dim or axis"):
        F.sum(x, 0, axis=1)


def test_empty_reductions():
    x = t(np.zeros((0, 3)))
    assert F.sum(x).item() == 0.0
    assert np.isnan(F.mean(x).item())  # PyTorch: nan, not a ZeroDivisionError
    assert np.isnan(F.mean(x, 0).numpy()).all() and F.mean(x, 0).shape == (3,)
    assert F.mean(x, 1).shape == (0,)
    assert F.sum(x, 0).numpy().tolist() == [0.0, 0.0, 0.0]


def test_sum_of_a_non_contiguous_tensor():
    a = randn(4, 5)
    np.testing.assert_allclose(F.sum(t(a.T), 0).numpy(), a.T.sum(0))


@pytest.mark.parametrize("dtype", HALVES, ids=dtypes.name)
def test_2_byte_sum_and_mean_accumulate_in_fp32_and_round_once(dtype):
    a = (randn(64, 33) * 10).astype(dtype)
    assert_half(F.sum(t(a, dtype), 0).numpy(), rounded_once(lambda v: v.sum(0), a, dtype), dtype)
    got = F.mean(t(a, dtype), 1).numpy()
    assert_half(got, rounded_once(lambda v: v.mean(1), a, dtype), dtype)


# ---------------------------------------------------------------- views: transpose, permute


def test_0d_transpose_and_permute():
    x = t(2.0)
    assert F.transpose(x, 0, 0).shape == () and F.transpose(x, -1, 0).item() == 2.0
    assert F.permute(x, ()).shape == ()
    with out_of_range(0, 1):
        F.transpose(x, 0, 1)


def test_permute_refuses_bad_dims():
    x = t(randn(3, 4))
    with out_of_range(2, 2):
        F.permute(x, (1, 2))  # was (4, 3)
    with pytest.raises(ValueError, match="appears multiple times"):
        F.permute(x, (1, 1))
    with pytest.raises(ValueError, match="1 dims"):
        F.permute(x, (0,))
    assert F.permute(x, (-1, 0)).shape == (4, 3)
    assert x.permute(-1, -2).shape == (4, 3)


def test_transpose_out_of_range_and_negative():
    x = t(randn(2, 3, 4))
    with out_of_range(3, 3):
        F.transpose(x, 0, 3)
    assert F.transpose(x, 0, -1).shape == (4, 3, 2)
    assert x.T.shape == (2, 4, 3)  # .T swaps the last two dims (PyTorch's .mT)


# ---------------------------------------------------------------- cat and split


def test_cat_dims():
    a, b = randn(2, 3), randn(2, 3, seed=1)
    with out_of_range(2, 2):
        F.cat([t(a), t(b)], 2)  # was axis 0
    np.testing.assert_array_equal(F.cat([t(a), t(b)], -1).numpy(), np.concatenate([a, b], -1))
    np.testing.assert_array_equal(
        F.cat([t(np.zeros((0, 3))), t(b)], 0).numpy(), b
    )  # an empty piece
    with pytest.raises(ValueError, match="zero-dimensional"):
        F.cat([t(1.0), t(2.0)])
    with pytest.raises(ValueError, match="non-empty"):
        F.cat([])
    with pytest.raises(ValueError, match="does not match"):
        F.cat([t(a), t(randn(3, 3))], 1)
    with pytest.raises(ValueError, match="does not match"):
        F.cat([t(a), t(randn(2, 3, 1))], 0)


def test_cat_of_non_contiguous_pieces_and_its_gradient():
    a, b = t(randn(3, 2), grad=True), t(randn(3, 4), grad=True)
    y = F.cat([a.T, b[:, 1:3].T], 1)  # two transposed views (2, 3)
    np.testing.assert_array_equal(y.numpy(), np.concatenate([a.numpy().T, b.numpy()[:, 1:3].T], 1))
    y.backward(np.ones((2, 6)))
    np.testing.assert_array_equal(a.grad.numpy(), np.ones((3, 2)))
    np.testing.assert_array_equal(b.grad.numpy(), [[0, 1, 1, 0]] * 3)


def test_split_dims_and_sizes():
    a = randn(4, 6)
    x = t(a)
    with out_of_range(2, 2):
        F.split(x, 2, 2)
    pieces = F.split(x, 4, 1)  # a shorter last piece
    assert [p.shape for p in pieces] == [(4, 4), (4, 2)]
    assert [p.shape for p in F.split(x, [1, 3], -2)] == [(1, 6), (3, 6)]
    with pytest.raises(ValueError, match="positive"):
        F.split(x, 0)
    with pytest.raises(ValueError, match="0-d"):
        F.split(t(1.0), 1)
    with pytest.raises(ValueError, match="add up"):
        F.split(x, [2, 5], 1)
    np.testing.assert_array_equal(F.split(t(a.T), 2, 0)[1].numpy(), a.T[2:4])  # non-contiguous


# ---------------------------------------------------------------- matmul and linear


def test_matmul_with_an_empty_inner_dim_is_zeros():
    a, b = t(np.zeros((5, 5, 0)), grad=True), t(np.zeros((0, 5)), grad=True)
    y = F.matmul(a, b)
    assert y.shape == (5, 5, 5) and not y.numpy().any()
    y.backward(np.ones((5, 5, 5)))
    assert a.grad.shape == (5, 5, 0) and b.grad.shape == (0, 5)
    assert F.matmul(t(np.zeros((0, 3))), t(randn(3, 4))).shape == (0, 4)


def test_linear_with_no_input_features_is_the_bias():
    x, w = t(np.zeros((2, 3, 0)), grad=True), t(np.zeros((0, 4)), grad=True)
    bias = t(randn(4), grad=True)
    y = F.linear(x, w, bias)
    assert y.shape == (2, 3, 4)
    np.testing.assert_array_equal(y.numpy(), np.broadcast_to(bias.numpy(), (2, 3, 4)))
    y.backward(np.ones((2, 3, 4)))
    assert x.grad.shape == (2, 3, 0) and w.grad.shape == (0, 4)
    np.testing.assert_array_equal(bias.grad.numpy(), np.full(4, 6.0))
    assert F.linear(t(np.zeros((3, 0))), t(np.zeros((4, 0))), transposed=True).shape == (3, 4)


def test_matmul_forms_that_are_not_supported_say_so():
    with pytest.raises(ValueError, match="at least 2 dims"):
        F.matmul(t(randn(3)), t(randn(3, 4)))
    with pytest.raises(ValueError, match="no batch broadcasting"):
        F.matmul(t(randn(2, 3, 4)), t(randn(1, 4, 5)))


# ---------------------------------------------------------------- invalid inputs


def test_embedding_weight_must_be_2d():
    for shape in [(1, 1, 1), (4,)]:
        with pytest.raises(ValueError, match="num_embeddings, embedding_dim"):
            F.embedding([0], t(np.zeros(shape)))


def test_layer_norm_weight_and_bias_must_be_c():
    x, w = t(randn(2, 3)), t(np.ones(3))
    with pytest.raises(ValueError, match=r"bias has shape \(4,\): need a bias of \(3,\)"):
        F.layer_norm(x, w, t(np.zeros(4)))
    with pytest.raises(ValueError, match=r"weight has shape \(3, 1\)"):
        F.layer_norm(x, t(np.ones((3, 1))), t(np.zeros(3)))


def test_cross_entropy_targets_out_of_range_with_another_ignore_index():
    logits = t(randn(3, 4))
    with pytest.raises(ValueError, match=r"target id -1 out of range for vocab 4"):
        F.cross_entropy(logits, [0, -1, 2], ignore_index=-100)  # was silently ignored
    with pytest.raises(ValueError, match="target id 4 out of range"):
        F.cross_entropy(logits, [0, 4, 2], ignore_index=-100)
    got = F.cross_entropy(logits, [0, -100, 2], ignore_index=-100).item()
    a = logits.numpy()
    lse = np.log(np.exp(a).sum(1))
    assert np.isclose(got, np.mean([lse[0] - a[0, 0], lse[2] - a[2, 2]]))
    with pytest.raises(TypeError, match="integer class ids"):
        F.cross_entropy(logits, [0.0, 1.0, 2.0])


def test_cross_entropy_of_3d_logits_says_which_form_it_takes():
    with pytest.raises(ValueError, match=r"takes \(N, C\) logits.*\(N, C, d\.\.\.\) form"):
        F.cross_entropy(t(randn(2, 3, 5)), np.zeros((2, 3), np.int64))


# ---------------------------------------------------------------- division's gradient


@pytest.mark.parametrize("dtype", HALVES, ids=dtypes.name)
def test_2_byte_division_gradient_does_not_square_the_denominator(dtype):
    """d(a/b)/db = -a / b^2: with b = 300, b^2 overflows fp16; computed in fp32 and rounded
    once it is -1.11e-5 (PyTorch's value), not -0."""
    a, b = t([1.0, 2.0, -1.0], dtype), t([300.0, -1000.0, 256.0], dtype, grad=True)
    (a / b).backward(np.ones(3))
    want = rounded_once(
        lambda v: -np.float32(1.0) * a.numpy().astype(np.float32) / v / v, b.numpy(), dtype
    )
    assert_half(b.grad.numpy(), want, dtype)
    assert b.grad.numpy()[0] != 0 and abs(float(b.grad.numpy()[0]) + 1.11e-5) < 1e-7
    s = t([300.0], dtype, grad=True)
    (2.0 / s).backward(np.ones(1))  # a Python scalar numerator
    assert abs(float(s.grad.numpy()[0]) + 2 / 300**2) < 1e-7


@pytest.mark.parametrize("dtype", [F64, F16], ids=dtypes.name)
def test_division_broadcasts_size_1_in_every_argument(dtype):
    a_np, b_np = randn(3, 1, seed=1), np.abs(randn(1, 4, seed=2)) + 1
    a, b = t(a_np, dtype, grad=True), t(b_np, dtype, grad=True)
    (a / b).backward(np.ones((3, 4)))
    a32, b32 = a.numpy().astype(np.float64), b.numpy().astype(np.float64)
    want_b = (-a32 / b32**2).sum(0, keepdims=True)
    tol = 1e-12 if dtype == F64 else 3e-3
    np.testing.assert_allclose(b.grad.numpy().astype(np.float64), want_b, rtol=tol)
    want_a = np.full((3, 1), (1 / b32).sum())
    np.testing.assert_allclose(a.grad.numpy().astype(np.float64), want_a, rtol=tol)


# ---------------------------------------------------------------- unary ops

UNARY = {  # NumPy's formula of each op and of its derivative
    "exp": (np.exp, np.exp),
    "log": (np.log, lambda x: 1 / x),
    "sqrt": (np.sqrt, lambda x: 0.5 / np.sqrt(x)),
    "rsqrt": (lambda x: 1 / np.sqrt(x), lambda x: -0.5 * x**-1.5),
    "tanh": (np.tanh, lambda x: 1 - np.tanh(x) ** 2),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), lambda x: np.exp(-x) / (1 + np.exp(-x)) ** 2),
    "silu": (
        lambda x: x / (1 + np.exp(-x)),
        lambda x: 1 / (1 + np.exp(-x)) + x * np.exp(-x) / (1 + np.exp(-x)) ** 2,
    ),
    "relu": (lambda x: np.where(x > 0, x, 0.0), lambda x: (x > 0).astype(x.dtype)),
}
POSITIVE = {"log", "sqrt", "rsqrt"}


def unary_input(op, *shape, seed=0, dtype=np.float64):
    x = randn(*shape, seed=seed) * 2
    return (np.abs(x) + 0.1 if op in POSITIVE else x).astype(dtype)


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_values_gradients_and_methods(op):
    a = unary_input(op, 3, 5)
    x = t(a, grad=True)
    f, df = UNARY[op]
    y = getattr(F, op)(x)
    np.testing.assert_allclose(y.numpy(), f(a), rtol=1e-12)
    if op != "silu":  # silu is functional only, as torch.nn.functional.silu
        np.testing.assert_array_equal(getattr(x, op)().numpy(), y.numpy())
    g = randn(3, 5, seed=1)
    y.backward(g)
    np.testing.assert_allclose(x.grad.numpy(), g * df(a), rtol=1e-10)


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_0d_empty_and_non_contiguous(op):
    f = UNARY[op][0]
    a = unary_input(op)  # 0-d
    x = t(a, grad=True)
    y = getattr(F, op)(x)
    assert y.shape == () and np.isclose(y.item(), f(a))
    y.backward()
    assert x.grad.shape == ()
    assert getattr(F, op)(t(np.zeros((0, 3)))).shape == (0, 3)
    b = unary_input(op, 4, 6)
    np.testing.assert_allclose(getattr(F, op)(t(b).T).numpy(), f(b.T), rtol=1e-12)
    with pytest.raises(TypeError, match="floating-point"):
        getattr(F, op)(Tensor(np.arange(3)))


@pytest.mark.parametrize("dtype", HALVES, ids=dtypes.name)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_in_2_bytes_is_fp32_rounded_once(op, dtype):
    a = unary_input(op, 8, 65, dtype=dtype)
    f, df = UNARY[op]
    x = t(a, dtype, grad=True)
    y = getattr(F, op)(x)
    assert_half(y.numpy(), rounded_once(f, a, dtype), dtype)
    g = randn(8, 65, seed=1).astype(dtype)
    y.backward(g)
    want = rounded_once(lambda v: g.astype(np.float32) * df(v), a, dtype)
    assert_half(x.grad.numpy(), want, dtype)


def test_unary_special_values_are_pytorch_s_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert F.log(t([0.0])).item() == -np.inf
        assert np.isnan(F.log(t([-1.0])).item()) and np.isnan(F.sqrt(t([-1.0])).item())
        assert F.rsqrt(t([0.0])).item() == np.inf
        assert F.exp(t([1000.0], F32)).item() == np.inf
        assert F.sigmoid(t([-1000.0, 1000.0], F32)).numpy().tolist() == [0.0, 1.0]
        assert F.silu(t([-1000.0], F32)).item() == 0.0
        r = F.relu(t([np.nan, -0.0, -2.0, 3.0])).numpy()
        assert np.isnan(r[0]) and r[1:].tolist() == [0.0, 0.0, 3.0]
        x = t([0.0, -1.0, 2.0], grad=True)
        F.relu(x).backward(np.ones(3))
        assert x.grad.numpy().tolist() == [0.0, 0.0, 1.0]  # PyTorch: no gradient at 0


def test_unary_ops_name_themselves_on_the_tape():
    x = t(randn(2), grad=True)
    assert F.silu(x)._record.op == "silu" and F.exp(x)._record.op == "exp"


# ---------------------------------------------------------------- softmax and log_softmax


def np_softmax(a, d):
    e = np.exp(a - a.max(d, keepdims=True))
    return e / e.sum(d, keepdims=True)


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_softmax_and_log_softmax_over_every_dim(dim):
    a = randn(2, 3, 4) * 3
    x = t(a)
    np.testing.assert_allclose(F.softmax(x, dim).numpy(), np_softmax(a, dim), rtol=1e-12)
    np.testing.assert_allclose(x.softmax(dim).numpy(), np_softmax(a, dim), rtol=1e-12)
    want = np.log(np_softmax(a, dim))
    np.testing.assert_allclose(F.log_softmax(x, dim).numpy(), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(x.log_softmax(dim).numpy(), want, rtol=1e-12, atol=1e-12)


def test_softmax_of_a_0d_tensor_and_empty_dims():
    for dim in (0, -1):
        assert F.softmax(t(5.0), dim).item() == 1.0 and F.log_softmax(t(5.0), dim).item() == 0.0
    with out_of_range(0, 1):
        F.softmax(t(5.0), 1)
    assert F.softmax(t(np.zeros((0, 3))), 1).shape == (0, 3)
    assert F.softmax(t(np.zeros((3, 0))), 1).shape == (3, 0)
    assert F.log_softmax(t(np.zeros((3, 0))), 0).shape == (3, 0)
    x = t(np.zeros((0, 4)), grad=True)
    F.softmax(x, 0).backward(np.zeros((0, 4)))
    assert x.grad.shape == (0, 4)


def test_softmax_is_stable_and_a_row_of_minus_inf_is_nan():
    a = np.array([[1000.0, 1000.0, -1000.0], [-np.inf, -np.inf, -np.inf]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = F.softmax(t(a), 1).numpy()
        ly = F.log_softmax(t(a), 1).numpy()
    np.testing.assert_allclose(y[0], [0.5, 0.5, 0.0])
    np.testing.assert_allclose(ly[0, :2], [np.log(0.5)] * 2)
    assert np.isnan(y[1]).all() and np.isnan(ly[1]).all()


def test_softmax_over_a_leading_dim_makes_one_counted_copy():
    x = t(randn(3, 4), grad=True)
    with Profiler() as prof:
        y = F.softmax(x, 0)
    assert [la.name for la in prof.launches] == ["contiguous", "softmax_fwd"]
    with Profiler() as prof:
        F.softmax(x, 1)
    assert [la.name for la in prof.launches] == ["softmax_fwd"]
    y.backward(randn(3, 4, seed=1))  # the transposed upstream gradient is copied too
    assert x.grad.shape == (3, 4)


def test_softmax_of_a_non_contiguous_input():
    a = randn(5, 4)
    np.testing.assert_allclose(F.softmax(t(a).T, -1).numpy(), np_softmax(a.T, -1), rtol=1e-12)
    np.testing.assert_allclose(F.softmax(t(a)[:, ::2], 1).numpy(), np_softmax(a[:, ::2], 1))


@pytest.mark.parametrize("dtype", HALVES, ids=dtypes.name)
def test_2_byte_softmax_is_fp32_rounded_once(dtype):
    a = (randn(6, 50) * 3).astype(dtype)
    x = t(a, dtype)
    assert_half(F.softmax(x, 1).numpy(), rounded_once(lambda v: np_softmax(v, 1), a, dtype), dtype)
    want = rounded_once(lambda v: np.log(np_softmax(v, 0)), a, dtype)
    assert_half(F.log_softmax(x, 0).numpy(), want, dtype)


def test_softmax_needs_floats():
    with pytest.raises(TypeError, match="floating-point"):
        F.softmax(Tensor(np.arange(3)), 0)


# ---------------------------------------------------------------- amax, max


def test_amax_over_dims_and_its_gradient_shared_by_ties():
    a = np.array([[1.0, 3.0, 3.0], [2.0, 0.0, -1.0]])
    x = t(a, grad=True)
    np.testing.assert_array_equal(F.amax(x, 1).numpy(), [3.0, 2.0])
    np.testing.assert_array_equal(F.amax(x, -2, keepdim=True).numpy(), [[2.0, 3.0, 3.0]])
    assert (
        F.amax(x).item() == 3.0 and F.amax(x, ()).item() == 3.0 and F.amax(x, (0, 1)).item() == 3.0
    )
    F.amax(x, 1).backward(np.array([1.0, 1.0]))
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 0.5, 0.5], [1, 0, 0]])
    y = t(a, grad=True)
    F.max(y).backward()  # no dim: as amax over everything
    np.testing.assert_array_equal(y.grad.numpy(), [[0, 0.5, 0.5], [0, 0, 0]])


def test_max_with_a_dim_returns_values_and_indices_and_the_gradient_goes_to_the_index():
    a = np.array([[1.0, 3.0, 3.0], [2.0, 0.0, -1.0]])
    x = t(a, grad=True)
    result = F.max(x, 1)
    values, indices = result
    assert result.values is values and result.indices is indices
    np.testing.assert_array_equal(values.numpy(), [3.0, 2.0])
    assert indices.dtype == np.int64 and indices.numpy().tolist() == [1, 0]  # the first tie
    values.backward(np.array([1.0, 1.0]))
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 1, 0], [1, 0, 0]])
    v, i = x.max(0, keepdim=True)
    assert v.shape == i.shape == (1, 3) and i.numpy().tolist() == [[1, 0, 0]]
    v, i = F.max(x, -1)
    assert i.numpy().tolist() == [1, 0]


def test_max_and_amax_edges():
    x0 = t(4.0, grad=True)
    v, i = F.max(x0, 0)
    assert v.shape == i.shape == () and v.item() == 4.0 and i.item() == 0
    v.backward()
    assert x0.grad.item() == 1.0
    assert F.amax(x0, -1).item() == 4.0
    with pytest.raises(IndexError, match="non-zero size"):
        F.amax(t(np.zeros((0, 3))), 0)
    with pytest.raises(IndexError, match="non-zero size"):
        F.max(t(np.zeros((0, 3))), 0)
    assert F.amax(t(np.zeros((0, 3))), 1).shape == (0,)
    assert np.isnan(F.amax(t([1.0, np.nan, 2.0])).item())  # NaN propagates
    assert F.max(t([1.0, np.nan, 2.0]), 0).indices.item() == 1
    a = randn(4, 5)
    np.testing.assert_array_equal(F.amax(t(a).T, 1).numpy(), a.T.max(1))  # non-contiguous
    np.testing.assert_array_equal(F.max(t(a).T, 0).indices.numpy(), a.T.argmax(0))


@pytest.mark.parametrize("dtype", HALVES, ids=dtypes.name)
def test_2_byte_amax_and_max_are_exact(dtype):
    a = randn(6, 40).astype(dtype)
    x = t(a, dtype, grad=True)
    got = F.amax(x, 1)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.numpy(), a.max(1))
    v, i = F.max(x, 0)
    np.testing.assert_array_equal(i.numpy(), a.astype(np.float32).argmax(0))
    v.backward(np.ones(40))
    assert x.grad.dtype == dtype and x.grad.numpy().astype(np.float32).sum() == 40


# ---------------------------------------------------------------- var


@pytest.mark.parametrize("dim", [None, 0, -1, (0, 2), ()])
@pytest.mark.parametrize("correction", [1, 0])
def test_var_as_numpy_ddof(dim, correction):
    a = randn(3, 4, 5)
    axis = None if dim in (None, ()) else dim
    want = a.var(axis=axis, ddof=correction)
    np.testing.assert_allclose(F.var(t(a), dim, correction=correction).numpy(), want, rtol=1e-12)
    got = t(a).var(dim, correction=correction, keepdim=True)
    np.testing.assert_allclose(got.numpy(), a.var(axis=axis, ddof=correction, keepdims=True))


def test_var_with_too_few_elements_divides_by_zero_as_pytorch():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NumPy's warning for 0 * inf, as for any 0 * inf here
        assert np.isnan(F.var(t([2.0])).item())  # 0 / 0
        assert np.isnan(F.var(t(2.0)).item())  # a 0-d tensor: one element
        assert np.isnan(F.var(t(np.zeros((0, 3))), 0).numpy()).all()
    assert F.var(t([1.0, 2.0]), correction=3).item() == np.inf  # 0.5 / 0
    with out_of_range(2, 2):
        F.var(t(randn(2, 3)), 2)


@pytest.mark.parametrize("dtype", HALVES, ids=dtypes.name)
def test_2_byte_var(dtype):
    a = randn(8, 64).astype(dtype)
    got = F.var(t(a, dtype), 1).numpy()
    assert got.dtype == dtype
    np.testing.assert_allclose(
        got.astype(np.float64), a.astype(np.float64).var(1, ddof=1), rtol=2e-2
    )


# ---------------------------------------------------------------- the meta device


def test_the_new_ops_count_on_meta_what_they_count_on_the_cpu():
    """Forward and backward of each new op on the meta device: the CPU's shapes, dtypes and
    launches (names, FLOPs, exps, bytes)."""
    cases = [
        *[lambda x, op=op: getattr(F, op)(x) for op in UNARY],
        lambda x: F.softmax(x, 0),
        lambda x: F.log_softmax(x, -1),
        lambda x: F.amax(x, (0, 2)),
        lambda x: F.max(x, 1).values,
        lambda x: F.var(x, -1),
        lambda x: x / F.exp(x),
    ]
    a = np.abs(randn(2, 3, 4, dtype=np.float32)) + 0.1
    for fn in cases:
        runs = []
        for device in ("cpu", "meta"):
            x = Tensor(a, device=device, requires_grad=True)
            with Profiler() as prof:
                y = fn(x)
                y.backward(np.ones(y.shape, np.float32))
            launches = [(la.name, la.flops, la.exps, la.bytes) for la in prof.launches]
            runs.append((y.shape, y.dtype, x.grad.shape, x.grad.dtype, launches))
        assert runs[0] == runs[1]
