"""Every differentiable op against central finite differences in float64, plus the forward
values that have a plain NumPy reference (attention, cross-entropy, GELU, layer norm, cast,
dropout).

Analytic gradients come from .backward(G) with a random upstream G; numeric ones perturb each
input element by +-1e-6 (see gradcheck.py). Shapes are tiny on purpose: each input element
costs two forward passes.
"""

import math

import numpy as np
import pytest
from gradcheck import gradcheck

import tinygrad_like as tg
from tinygrad_like import TAPE, Tensor, dtypes
from tinygrad_like import functional as F
from tinygrad_like.autograd import Function
from tinygrad_like.kernels import launch
from tinygrad_like.kernels.elementwise import spec as elementwise
from tinygrad_like.profiler import Profiler


def randn(rng, *shape):
    return np.asarray(rng.standard_normal(shape))  # shape (): a 0-d array, not a NumPy scalar


def positive(rng, *shape):
    """Values in [0.5, 1.5] (or their negatives): safe denominators."""
    return np.asarray(rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape))


# ---------------------------------------------------------------- elementwise arithmetic

BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
}


@pytest.mark.parametrize("op", sorted(BINARY))
@pytest.mark.parametrize(
    "shapes",
    [
        ((3, 4), (3, 4)),  # same shape
        ((4, 1, 3), (5, 1)),  # both sides broadcast
        ((2, 3), (3,)),  # leading dim added to b
        ((1, 3), (2, 1)),
        ((2, 3), ()),
    ],  # 0-d tensor operand
    ids=["same", "4x1x3+5x1", "row", "outer", "0d"],
)
def test_binary_broadcasting(rng, op, shapes):
    a, b = randn(rng, *shapes[0]), positive(rng, *shapes[1])
    leaves = gradcheck(BINARY[op], a, b)
    expected = {"add": a + b, "sub": a - b, "mul": a * b, "div": a / b}[op]
    out = BINARY[op](*leaves)
    assert out.shape == np.broadcast_shapes(a.shape, b.shape)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12)


def test_binary_broadcast_gradient_is_reduced_to_input_shape(rng):
    a = Tensor(randn(rng, 4, 1, 3), requires_grad=True)
    b = Tensor(randn(rng, 5, 1), requires_grad=True)
    (a + b).backward(np.ones((4, 5, 3)))
    np.testing.assert_array_equal(a.grad.numpy(), np.full((4, 1, 3), 5.0))
    np.testing.assert_array_equal(b.grad.numpy(), np.full((5, 1), 12.0))


_SCALAR_OPS = [
    pytest.param(lambda x: x + 2.0, id="x+2"),
    pytest.param(lambda x: 2.0 + x, id="2+x"),
    pytest.param(lambda x: x - 2.0, id="x-2"),
    pytest.param(lambda x: 2 - x, id="2-x"),
    pytest.param(lambda x: -x, id="neg"),
    pytest.param(lambda x: x * 3.0, id="x*3"),
    pytest.param(lambda x: 3 * x, id="3*x"),
    pytest.param(lambda x: x / 2.0, id="x/2"),
    pytest.param(lambda x: 2 / x, id="2/x"),
]


@pytest.mark.parametrize("fn", _SCALAR_OPS)
def test_scalar_operand_either_side(rng, fn):
    gradcheck(fn, positive(rng, 2, 3))


def test_scalar_operands_forward_without_grad(rng):
    """The forward values of scalar arithmetic (these do not touch the tape)."""
    a = positive(rng, 2, 3)
    x = Tensor(a)
    for got, want in [
        (2 - x, 2 - a),
        (2 / x, 2 / a),
        (x * 3, a * 3),
        (x / 2, a / 2),
        (2 + x, 2 + a),
        (x - 2, a - 2),
        (-x, -a),
    ]:
        assert got.dtype == np.float64 and not got.requires_grad
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-15)


def test_scalar_keeps_fp32(rng):
    """A Python float operand does not promote an fp32 tensor to fp64."""
    x = Tensor(randn(rng, 3).astype(np.float32))
    assert (2.5 - x).dtype == np.float32 and (x + 1.0).dtype == np.float32
    assert (2.5 / x).dtype == np.float32


def test_numpy_scalar_operand(rng):
    a = positive(rng, 2, 3)
    x = Tensor(a, requires_grad=True)
    y = x / np.sqrt(np.float64(4.0))  # np.float64 is a float subclass: taken as a scalar
    np.testing.assert_allclose(y.numpy(), a / 2)
    y.backward(np.ones((2, 3)))
    np.testing.assert_allclose(x.grad.numpy(), np.full((2, 3), 0.5))


def test_tensor_from_numpy_scalar():
    t = Tensor(np.float32(1.5))
    assert t.device == "cpu" and t.shape == () and t.item() == 1.5


def test_constant_array_operand_gets_no_gradient(rng):
    """A NumPy array operand becomes a constant: gradients flow only to the tensor."""
    a, c = randn(rng, 2, 3), randn(rng, 3)
    gradcheck(lambda x: x - c, a)
    x, k = Tensor(a, requires_grad=True), Tensor(c)
    (x * k).backward(np.ones((2, 3)))
    assert k.grad is None
    np.testing.assert_allclose(x.grad.numpy(), np.broadcast_to(c, (2, 3)))


def test_product_and_quotient_chain(rng):
    gradcheck(
        lambda a, b, c: (a * b - c) / (b * b + c * c),
        randn(rng, 3, 2),
        randn(rng, 3, 2),
        positive(rng, 3, 2),
    )


# ---------------------------------------------------------------- reductions

AXES = [
    pytest.param(None, False, id="all"),
    pytest.param(None, True, id="all-keep"),
    pytest.param(0, False, id="0"),
    pytest.param(-1, True, id="-1-keep"),
    pytest.param((0, 2), False, id="(0,2)"),
    pytest.param((1, -1), True, id="(1,-1)-keep"),
]


@pytest.mark.parametrize("axis, keepdims", AXES)
def test_sum(rng, axis, keepdims):
    a = randn(rng, 2, 3, 4)
    leaves = gradcheck(lambda x: x.sum(axis=axis, keepdims=keepdims), a)
    out = F.sum(leaves[0], axis, keepdims)
    np.testing.assert_allclose(out.numpy(), a.sum(axis=axis, keepdims=keepdims), rtol=1e-12)


@pytest.mark.parametrize("axis, keepdims", AXES)
def test_mean_forward(rng, axis, keepdims):
    a = randn(rng, 2, 3, 4)
    with tg.no_grad():
        out = Tensor(a).mean(axis=axis, keepdims=keepdims)
    np.testing.assert_allclose(out.numpy(), a.mean(axis=axis, keepdims=keepdims), rtol=1e-12)


@pytest.mark.parametrize("axis, keepdims", AXES)
def test_mean(rng, axis, keepdims):
    gradcheck(lambda x: x.mean(axis=axis, keepdims=keepdims), randn(rng, 2, 3, 4))


# ---------------------------------------------------------------- views


@pytest.mark.parametrize(
    "fn, shape",
    [
        pytest.param(lambda x: x.reshape(4, 6), (4, 6), id="reshape"),
        pytest.param(lambda x: x.reshape((6, -1)), (6, 4), id="reshape-tuple"),
        pytest.param(lambda x: x.view(-1), (24,), id="view"),
        pytest.param(lambda x: x.transpose(), (2, 4, 3), id="transpose"),
        pytest.param(lambda x: x.transpose(0, 2), (4, 3, 2), id="transpose-0-2"),
        pytest.param(lambda x: x.T, (2, 4, 3), id="T"),
        pytest.param(lambda x: x.permute(2, 0, 1), (4, 2, 3), id="permute"),
        pytest.param(lambda x: x.permute((-1, 1, 0)), (4, 3, 2), id="permute-neg"),
        pytest.param(
            lambda x: x.transpose(1, 2).reshape(2, 12), (2, 12), id="transpose-then-reshape"
        ),
    ],
)
def test_view_ops(rng, fn, shape):
    leaves = gradcheck(fn, randn(rng, 2, 3, 4))
    assert fn(leaves[0]).shape == shape


def test_view_values(rng):
    a = randn(rng, 2, 3, 4)
    x = Tensor(a)
    np.testing.assert_array_equal(x.reshape(4, 6).numpy(), a.reshape(4, 6))
    np.testing.assert_array_equal(x.view(-1).numpy(), a.reshape(-1))
    np.testing.assert_array_equal(x.transpose().numpy(), a.swapaxes(-2, -1))
    np.testing.assert_array_equal(x.transpose(0, 2).numpy(), a.swapaxes(0, 2))
    np.testing.assert_array_equal(x.T.numpy(), a.swapaxes(-2, -1))
    np.testing.assert_array_equal(x.permute(2, 0, 1).numpy(), a.transpose(2, 0, 1))
    np.testing.assert_array_equal(x.permute(-1, 1, 0).numpy(), a.transpose(2, 1, 0))


@pytest.mark.parametrize(
    "index",
    [
        pytest.param((slice(None), slice(1, 3)), id="[:,1:3]"),
        pytest.param((slice(None, None, 2),), id="[::2]"),
        pytest.param((slice(None, None, -1), slice(None), slice(1, None, 2)), id="[::-1,:,1::2]"),
        pytest.param(1, id="[1]"),
        pytest.param((0, -1), id="[0,-1]"),
        pytest.param((slice(None), -2, slice(0, 3)), id="[:,-2,0:3]"),
        pytest.param((None,), id="[None]"),
        pytest.param((slice(None), None, 1), id="[:,None,1]"),
        pytest.param((Ellipsis, 2), id="[...,2]"),
        pytest.param((0, Ellipsis, None), id="[0,...,None]"),
        pytest.param((Ellipsis, slice(1, None), None), id="[...,1:,None]"),
    ],
)
def test_getitem(rng, index):
    a = randn(rng, 2, 3, 4)
    leaves = gradcheck(lambda x: x[index], a)
    np.testing.assert_array_equal(leaves[0][index].numpy(), a[index])


def test_getitem_same_element_twice_accumulates(rng):
    a = randn(rng, 3, 4)
    gradcheck(lambda x: x[1] * x[1:2] + x[:, 0:1], a)


@pytest.mark.parametrize(
    "split_size, dim, sizes",
    [(2, -1, [2, 2, 1]), ([1, 3, 1], 1, [1, 3, 1]), (1, 0, [1, 1])],
    ids=["2-last-with-remainder", "sizes-dim1", "1-dim0"],
)
def test_split_all_parts(rng, split_size, dim, sizes):
    a = randn(rng, 2, 5)
    leaves = gradcheck(lambda x: F.split(x, split_size, dim), a)
    parts = F.split(leaves[0], split_size, dim)
    assert [p.shape[dim] for p in parts] == sizes
    np.testing.assert_array_equal(np.concatenate([p.numpy() for p in parts], axis=dim), a)


def test_split_unused_parts_get_zero_gradient(rng):
    """Only the middle chunk reaches the loss: the others are filled with zeros."""
    a = randn(rng, 2, 6)
    leaves = gradcheck(lambda x: x.split(2, dim=1)[1], a)
    g = leaves[0].grad.numpy()
    assert np.all(g[:, :2] == 0) and np.all(g[:, 4:] == 0)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat(rng, dim):
    a, b, c = randn(rng, 2, 3), randn(rng, 2, 3), randn(rng, 2, 3)
    leaves = gradcheck(lambda x, y, z: F.cat([x, y, z], dim=dim), a, b, c)
    np.testing.assert_array_equal(
        F.cat(leaves, dim=dim).numpy(), np.concatenate([a, b, c], axis=dim)
    )


def test_cat_with_constant_part(rng):
    a, const = randn(rng, 2, 3), Tensor(randn(rng, 1, 3))
    gradcheck(lambda x: F.cat([const, x, const], dim=0), a)
    assert const.grad is None


def test_split_then_cat_roundtrip(rng):
    gradcheck(lambda x: F.cat(list(reversed(F.split(x, 2, dim=0))), dim=0), randn(rng, 5, 2))


# ---------------------------------------------------------------- matmul and linear


@pytest.mark.parametrize(
    "sa, sb",
    [((3, 4), (4, 5)), ((2, 3, 4, 5), (2, 3, 5, 6)), ((2, 4, 5), (5, 6)), ((4, 5), (2, 5, 6))],
    ids=["2d", "batched-4d", "batched@2d", "2d@batched"],
)
def test_matmul(rng, sa, sb):
    a, b = randn(rng, *sa), randn(rng, *sb)
    leaves = gradcheck(lambda x, y: x @ y, a, b)
    out = leaves[0] @ leaves[1]
    np.testing.assert_allclose(out.numpy(), np.matmul(a, b), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "sa, sb",
    [((4, 3), (5, 4)), ((2, 5, 4), (6, 5)), ((5, 4), (2, 6, 5))],
    ids=["2d", "batched@2d", "2d@batched"],
)
def test_matmul_non_contiguous_inputs(rng, sa, sb):
    """Transposed views (not copies) as the leaves' buffers."""
    a, b = randn(rng, *sa).swapaxes(-1, -2), randn(rng, *sb).swapaxes(-1, -2)
    assert not a.flags.c_contiguous and not b.flags.c_contiguous
    leaves = gradcheck(lambda x, y: x @ y, a, b)
    assert not leaves[0].data.flags.c_contiguous  # gradcheck kept the views
    np.testing.assert_allclose((leaves[0] @ leaves[1]).numpy(), np.matmul(a, b), rtol=1e-12)


def test_matmul_with_transpose_op(rng):
    gradcheck(lambda x, y: x.T @ y, randn(rng, 4, 3), randn(rng, 4, 2))
    gradcheck(lambda x, y: x @ y.transpose(1, 2), randn(rng, 2, 3, 4), randn(rng, 2, 5, 4))


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("xshape", [(3, 4), (2, 3, 4)], ids=["2d", "3d"])
def test_linear(rng, bias, xshape):
    x, w, b = randn(rng, *xshape), randn(rng, 4, 5), randn(rng, 5)
    args = (x, w, b) if bias else (x, w)
    leaves = gradcheck(lambda *t: F.linear(*t), *args)
    expected = x @ w + (b if bias else 0)
    np.testing.assert_allclose(F.linear(*leaves).numpy(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_linear_transposed_weight(rng, bias):
    """transposed=True: weight stored (out, in), as the tied LM head (logits = x wte^T)."""
    x, w, b = randn(rng, 2, 3, 4), randn(rng, 5, 4), randn(rng, 5)
    args = (x, w, b) if bias else (x, w)
    fn = lambda *t: F.linear(*t[:2], t[2] if bias else None, transposed=True)  # noqa: E731
    leaves = gradcheck(fn, *args)
    expected = x @ w.T + (b if bias else 0)
    np.testing.assert_allclose(fn(*leaves).numpy(), expected, rtol=1e-12, atol=1e-12)
    assert leaves[1].grad.shape == (5, 4)


def test_linear_non_contiguous_input(rng):
    x = randn(rng, 2, 4, 3).swapaxes(1, 2)  # (2, 3, 4), not contiguous
    assert not x.flags.c_contiguous
    gradcheck(lambda t, w, b: F.linear(t, w, b), x, randn(rng, 4, 5), randn(rng, 5))


def test_linear_constant_weight(rng):
    """Only x requires grad: the weight and bias gradients are dropped, x's is right."""
    w, b = Tensor(randn(rng, 4, 2)), Tensor(randn(rng, 2))
    gradcheck(lambda x: F.linear(x, w, b), randn(rng, 3, 4))
    assert w.grad is None and b.grad is None


# ---------------------------------------------------------------- GPT-2's layers


def test_embedding_repeated_ids(rng):
    ids = np.array([[1, 2, 1], [4, 1, 0]])
    leaves = gradcheck(lambda w, i: F.embedding(i, w), randn(rng, 6, 3), ids)
    w = leaves[0]
    np.testing.assert_array_equal(F.embedding(ids, w).numpy(), w.numpy()[ids])
    assert np.all(w.grad.numpy()[[3, 5]] == 0)  # unused rows get exactly zero


def test_embedding_ids_as_tensor(rng):
    ids = Tensor(np.array([3, 3, 3, 0]))
    assert ids.dtype == np.int64
    leaves = gradcheck(lambda w: F.embedding(ids, w), randn(rng, 4, 2))
    g = np.ones((4, 2))
    w = Tensor(leaves[0].numpy(), requires_grad=True)
    F.embedding(ids, w).backward(g)
    np.testing.assert_array_equal(w.grad.numpy(), [[1, 1], [0, 0], [0, 0], [3, 3]])


def _gelu_ref(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def test_gelu(rng):
    a = 2 * randn(rng, 3, 4)
    leaves = gradcheck(F.gelu, a)
    np.testing.assert_allclose(F.gelu(leaves[0]).numpy(), _gelu_ref(a), rtol=1e-6, atol=1e-7)


def test_gelu_0d():
    gradcheck(F.gelu, np.array(0.7))


# ---------------------------------------------------------------- issue 26's ops (PyTorch's names)


@pytest.mark.parametrize("op", list(elementwise.UNARY_OPS))
@pytest.mark.parametrize("shape", [(3, 4), ()], ids=["3x4", "0d"])
def test_unary(rng, op, shape):
    a = 2 * randn(rng, *shape, 2)  # the last dim: a transposed (non-contiguous) view below
    if op in ("log", "sqrt", "rsqrt"):
        a = np.abs(a) + 0.2
    if op == "relu":  # away from the kink
        a = np.where(np.abs(a) < 0.1, 0.5, a)
    gradcheck(getattr(F, op), np.array(a[..., 0]))  # a copy: 0-d stays 0-d
    if shape:
        gradcheck(lambda x: getattr(F, op)(x.T), a.T)


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_over_any_dim(rng, fn, dim):
    gradcheck(lambda x: fn(x, dim), 2 * randn(rng, 2, 3, 4))


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_0d_and_transposed_input(rng, fn):
    gradcheck(lambda x: fn(x, 0), randn(rng))
    gradcheck(lambda x: fn(x.T, 1), randn(rng, 3, 5))  # a non-contiguous row input


@pytest.mark.parametrize("dim, keepdim", [(1, False), ((0, 2), True), ((), False), (-1, True)])
def test_amax(rng, dim, keepdim):
    gradcheck(lambda x: F.amax(x, dim, keepdim), randn(rng, 2, 3, 4))  # no ties


@pytest.mark.parametrize("dim, keepdim", [(0, False), (-1, True)])
def test_max_with_dim(rng, dim, keepdim):
    gradcheck(lambda x: F.max(x, dim, keepdim).values, randn(rng, 3, 4))


@pytest.mark.parametrize("dim, correction", [(None, 1), (0, 1), ((0, 2), 0), (-1, 2)])
def test_var(rng, dim, correction):
    gradcheck(lambda x: F.var(x, dim, correction=correction), randn(rng, 2, 3, 4))


def test_reductions_of_0d_and_over_no_dims(rng):
    gradcheck(lambda x: F.sum(x, 0), randn(rng))
    gradcheck(lambda x: F.mean(x, ()), randn(rng, 2, 3))
    gradcheck(lambda x: F.transpose(x, 0, 0) * 2.0, randn(rng))


def _layer_norm_ref(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def test_layer_norm(rng):
    x, w, b = randn(rng, 2, 3, 5), 1 + 0.5 * randn(rng, 5), randn(rng, 5)
    leaves = gradcheck(lambda *t: F.layer_norm(*t), x, w, b)
    np.testing.assert_allclose(
        F.layer_norm(*leaves).numpy(), _layer_norm_ref(x, w, b), rtol=1e-10, atol=1e-12
    )


def test_rms_norm(rng):
    x, w = randn(rng, 2, 3, 5), 1 + 0.5 * randn(rng, 5)
    leaves = gradcheck(lambda *t: F.rms_norm(*t), x, w)
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(F.rms_norm(*leaves).numpy(), want, rtol=1e-10, atol=1e-12)


def test_rms_norm_non_contiguous_and_eps(rng):
    x = randn(rng, 5, 3).T  # (3, 5) view
    gradcheck(lambda t, w: F.rms_norm(t, w, eps=1e-3), x, randn(rng, 5))


def test_rms_norm_refuses_a_weight_of_another_size(rng):
    with pytest.raises(ValueError, match=r"need a weight of \(5,\)"):
        F.rms_norm(Tensor(randn(rng, 2, 5)), Tensor(randn(rng, 4)))


def test_layer_norm_non_contiguous_and_eps(rng):
    x = randn(rng, 5, 3).T  # (3, 5) view
    gradcheck(lambda t, w, b: F.layer_norm(t, w, b, eps=1e-3), x, randn(rng, 5), randn(rng, 5))


def _causal_attention_ref(q, k, v):
    """Plain NumPy: query i sits at position Tk - Tq + i and sees keys 0 .. Tk - Tq + i."""
    Tq, Tk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    out = np.zeros(q.shape)
    for idx in np.ndindex(*q.shape[:-2]):
        for i in range(Tq):
            pos = Tk - Tq + i
            s = k[idx][: pos + 1] @ q[idx][i] / math.sqrt(D)
            p = np.exp(s - s.max())
            p /= p.sum()
            out[idx][i] = p @ v[idx][: pos + 1]
    return out


@pytest.mark.parametrize("Tq, Tk", [(3, 3), (2, 5), (1, 4)], ids=["Tq=Tk", "Tq<Tk", "decode-1"])
def test_attention(rng, Tq, Tk):
    B, H, D = 1, 2, 4
    q, k, v = randn(rng, B, H, Tq, D), randn(rng, B, H, Tk, D), randn(rng, B, H, Tk, D)
    leaves = gradcheck(F.scaled_dot_product_attention, q, k, v)
    out = F.scaled_dot_product_attention(*leaves)
    np.testing.assert_allclose(out.numpy(), _causal_attention_ref(q, k, v), rtol=1e-10, atol=1e-12)


def test_attention_first_query_sees_only_first_key(rng):
    q, k, v = randn(rng, 1, 1, 3, 2), randn(rng, 1, 1, 3, 2), randn(rng, 1, 1, 3, 2)
    out = F.scaled_dot_product_attention(Tensor(q), Tensor(k), Tensor(v)).numpy()
    np.testing.assert_allclose(out[0, 0, 0], v[0, 0, 0], rtol=1e-12)


def test_attention_gpt2_layout(rng):
    """qkv (B, T, 3C) -> split -> view (B, T, H, D) -> transpose: non-contiguous q, k, v."""
    B, T, H, D = 1, 3, 2, 2
    C = H * D

    def block(qkv):
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v)
        return y.transpose(1, 2).reshape(B, T, C)

    qkv = randn(rng, B, T, 3 * C)
    leaves = gradcheck(block, qkv)
    q, k, v = (qkv[..., i * C : (i + 1) * C].reshape(B, T, H, D).swapaxes(1, 2) for i in range(3))
    ref = _causal_attention_ref(q, k, v).swapaxes(1, 2).reshape(B, T, C)
    np.testing.assert_allclose(block(leaves[0]).numpy(), ref, rtol=1e-10, atol=1e-12)


def _ce_ref(logits, targets):
    logits = logits.astype(np.float64)
    m = logits.max(1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(1)) + m[:, 0]
    valid = targets >= 0
    rows = np.arange(len(targets))[valid]
    return float(np.mean(lse[valid] - logits[rows, targets[valid]]))


def test_cross_entropy_with_ignored_targets(rng):
    logits, targets = randn(rng, 5, 4), np.array([1, -1, 3, 1, -1])
    leaves = gradcheck(lambda x: F.cross_entropy(x, targets), logits)
    loss = F.cross_entropy(leaves[0], targets)
    assert loss.shape == ()
    np.testing.assert_allclose(loss.item(), _ce_ref(logits, targets), rtol=1e-12)
    g = leaves[0].grad.numpy()
    assert np.all(g[[1, 4]] == 0)  # ignored rows get no gradient


def test_cross_entropy_many_rows(rng):
    """More rows than one chunk of the CPU kernel, ignored targets on both sides of a chunk
    boundary."""
    logits = randn(rng, 19, 3)
    targets = rng.integers(0, 3, 19)
    targets[[0, 7, 8, 18]] = -1
    leaves = gradcheck(lambda x: F.cross_entropy(x, targets), logits)
    np.testing.assert_allclose(
        F.cross_entropy(leaves[0], targets).item(), _ce_ref(logits, targets), rtol=1e-12
    )
    assert np.all(leaves[0].grad.numpy()[[0, 7, 8, 18]] == 0)


def test_cross_entropy_gradient_formula(rng):
    """dL/dlogits = (softmax - onehot) / count, scaled by the upstream gradient."""
    logits, targets = randn(rng, 3, 4), np.array([0, 3, -1])
    x = Tensor(logits, requires_grad=True)
    F.cross_entropy(x, Tensor(targets)).backward(np.array(2.0))
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    p[[0, 1], [0, 3]] -= 1
    p[2] = 0
    np.testing.assert_allclose(x.grad.numpy(), 2.0 * p / 2, rtol=1e-6)


def test_cross_entropy_custom_ignore_index(rng):
    logits = randn(rng, 3, 4)
    t = np.array([2, -100, 0])
    got = F.cross_entropy(Tensor(logits), t, ignore_index=-100).item()
    np.testing.assert_allclose(got, _ce_ref(logits, np.array([2, -1, 0])), rtol=1e-12)


def test_cross_entropy_over_the_first_n_classes(rng):
    """Rows of 7 columns, 5 classes (a padded vocabulary): the loss is the plain log-softmax
    over the 5, and the finite differences agree that the 2 padding columns get no gradient."""
    logits, targets = randn(rng, 4, 7), np.array([4, -1, 0, 2])
    logits[:, 5:] += 30.0  # padding columns that would dominate the softmax if counted
    leaves = gradcheck(lambda x: F.cross_entropy(x, targets, n_classes=5), logits)
    loss = F.cross_entropy(leaves[0], targets, n_classes=5)
    np.testing.assert_allclose(loss.item(), _ce_ref(logits[:, :5], targets), rtol=1e-12)
    assert np.all(leaves[0].grad.numpy()[:, 5:] == 0)


@pytest.mark.parametrize("n_classes", [0, 8])
def test_cross_entropy_n_classes_must_fit_the_rows(rng, n_classes):
    with pytest.raises(ValueError, match=f"n_classes {n_classes} must be in \\[1, 7\\]"):
        F.cross_entropy(Tensor(randn(rng, 2, 7)), np.array([0, 1]), n_classes=n_classes)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cross_entropy_large_logits_stable(rng, dtype):
    logits = (1e4 * randn(rng, 4, 6)).astype(dtype)
    logits[0] = 1e4  # a row of equal huge logits: loss log(6)
    targets = np.array([2, 0, 5, -1])
    x = Tensor(logits, requires_grad=True)
    loss = F.cross_entropy(x, targets)
    assert np.isfinite(loss.item())
    np.testing.assert_allclose(loss.item(), _ce_ref(logits, targets), rtol=1e-6)
    loss.backward()
    g = x.grad.numpy()
    assert np.all(np.isfinite(g)) and np.all(np.abs(g) <= 1.0)
    with tg.no_grad():  # the forward-only kernel agrees
        np.testing.assert_allclose(
            F.cross_entropy(Tensor(logits), targets).item(), loss.item(), rtol=1e-6
        )


def test_dropout_p0_is_identity_without_record(rng):
    x = Tensor(randn(rng, 3, 4), requires_grad=True)
    pos = TAPE.position()
    assert F.dropout(x, 0.0) is x
    assert F.dropout(x, 0.5, training=False) is x
    assert TAPE.records(since=pos) == []


def test_dropout_seeded_and_deterministic(rng):
    a = randn(rng, 4, 8)
    tg.manual_seed(7)
    y1 = F.dropout(Tensor(a), 0.25).numpy()
    tg.manual_seed(7)
    y2 = F.dropout(Tensor(a), 0.25).numpy()
    y3 = F.dropout(Tensor(a), 0.25).numpy()  # next draw from the same stream
    np.testing.assert_array_equal(y1, y2)
    assert not np.array_equal(y1, y3)
    kept = y1 != 0
    np.testing.assert_allclose(y1[kept], a[kept] / 0.75, rtol=1e-6)
    assert 0 < kept.sum() < a.size


def test_dropout_gradcheck_fixed_mask(rng):
    def fn(x):
        tg.manual_seed(11)  # the same mask on every forward
        return F.dropout(x, 0.5)

    leaves = gradcheck(fn, randn(rng, 3, 5))
    y = fn(Tensor(leaves[0].numpy()))
    mask = y.numpy() / leaves[0].numpy()
    assert set(np.round(np.unique(mask), 6)) <= {0.0, 2.0}


def test_dropout_bad_p():
    x = Tensor(np.ones(3))
    for p in (1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="dropout probability"):
            F.dropout(x, p)


# ---------------------------------------------------------------- cast


@pytest.mark.parametrize("to", ["fp16", "bf16"])
def test_cast_fp32_to_half_and_back(rng, to):
    a = randn(rng, 3, 4).astype(np.float32)
    x = Tensor(a, requires_grad=True)
    h = F.cast(x, to)
    assert h.dtype == dtypes.as_dtype(to) and h.requires_grad
    np.testing.assert_array_equal(h.numpy(), a.astype(dtypes.as_dtype(to)))
    g = randn(rng, 3, 4)
    h.backward(g)
    assert x.grad.dtype == np.float32  # the gradient has the input's dtype
    np.testing.assert_array_equal(x.grad.numpy(), g.astype(dtypes.as_dtype(to)).astype(np.float32))
    # and up again: a half leaf's gradient is half
    y = Tensor(a.astype(dtypes.as_dtype(to)), requires_grad=True)
    f = y.float()
    assert f.dtype == np.float32
    np.testing.assert_array_equal(f.numpy(), a.astype(dtypes.as_dtype(to)).astype(np.float32))
    f.backward(g.astype(np.float32))
    assert y.grad.dtype == dtypes.as_dtype(to)
    np.testing.assert_array_equal(y.grad.numpy(), g.astype(np.float32).astype(y.dtype))


def test_cast_methods_and_noop(rng):
    x = Tensor(randn(rng, 2, 2).astype(np.float32), requires_grad=True)
    assert x.half().dtype == np.float16
    assert x.bfloat16().dtype == dtypes.bfloat16
    assert x.to("fp16").dtype == np.float16
    assert x.float() is x and x.to(np.float32) is x


def test_cast_gradcheck_fp64_roundtrip(rng):
    """fp64 -> fp64 is a no-op; fp64 -> fp32 -> fp64 passes the gradient through a cast."""
    a = randn(rng, 3)
    x = Tensor(a, requires_grad=True)
    y = F.cast(F.cast(x, "fp32") * Tensor(np.ones(3, np.float32)), "fp64")
    g = randn(rng, 3)
    y.backward(g)
    assert x.grad.dtype == np.float64
    np.testing.assert_array_equal(x.grad.numpy(), g.astype(np.float32).astype(np.float64))


# ---------------------------------------------------------------- the checker itself


class _WrongScale(Function):
    """y = 3 x with a deliberately wrong backward (2 g)."""

    @staticmethod
    def forward(ctx, x):
        return launch("mul", x, 3.0)

    @staticmethod
    def backward(ctx, g):
        return launch("mul", g, 2.0)


def test_gradcheck_catches_a_wrong_gradient(rng):
    with pytest.raises(AssertionError, match="gradient of input 0"):
        gradcheck(_WrongScale.apply, randn(rng, 2, 2))


# ---------------------------------------------------------------- a small composite


def test_mlp_block_composite(rng):
    """ln -> linear -> gelu -> linear -> residual, as in a GPT-2 block."""

    def block(x, lw, lb, w1, b1, w2):
        h = F.gelu(F.linear(F.layer_norm(x, lw, lb), w1, b1))
        return x + F.linear(h, w2)

    gradcheck(
        block,
        randn(rng, 2, 2, 3),
        1 + 0.1 * randn(rng, 3),
        randn(rng, 3),
        randn(rng, 3, 4),
        randn(rng, 4),
        randn(rng, 4, 3),
    )


def test_view_never_copies_and_reshape_does(rng):
    """PyTorch's rule: view() raises where only a copy could give the shape; reshape() copies
    there (one counted contiguous launch); both are views where the strides allow one."""
    x = Tensor(randn(rng, 2, 3, 4))
    t = x.transpose(1, 2)  # (2, 4, 3), not contiguous
    with pytest.raises(RuntimeError, match="use reshape"):
        t.view(2, 12)
    with Profiler() as prof:
        flat = t.reshape(2, 12)
    assert [launch.name for launch in prof.launches] == ["contiguous"]
    np.testing.assert_array_equal(flat.numpy(), x.numpy().swapaxes(1, 2).reshape(2, 12))
    column = x[:, :, 1:3]  # a column slice: splittable
    with Profiler() as prof:
        split = column.view(2, 3, 2, 1)
    assert prof.launches == [] and np.shares_memory(split.data, x.data)
