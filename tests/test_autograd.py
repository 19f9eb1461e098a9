"""The tape: what it records (order, op names, shapes, FLOPs), what backward frees, grad modes,
gradient accumulation, the weakly held tape, and the errors for bad input."""

import gc

import numpy as np
import pytest

import tinygrad_like as tg
from tinygrad_like import TAPE, Tensor, autograd
from tinygrad_like import functional as F
from tinygrad_like.memory import TRACKER


def leaf(rng, *shape, dtype=np.float64):
    return Tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)


def settled_activations():
    """Bytes counted as activations once garbage from earlier tests is gone."""
    gc.collect()
    return TRACKER.current["activations"]


# ---------------------------------------------------------------- what the tape records


def test_records_in_order_with_names_shapes_and_flops(rng):
    M, K, N = 4, 3, 5
    x, w, b = leaf(rng, M, K), leaf(rng, K, N), leaf(rng, N)
    pos = TAPE.position()
    y = F.linear(x, w, b)
    h = F.gelu(y)
    loss = h.sum()
    recs = TAPE.records(since=pos)
    assert [r.op for r in recs] == ["linear", "gelu", "sum"]
    assert [r.seq for r in recs] == sorted(r.seq for r in recs)
    lin, gelu, total = recs
    assert [s for s, _ in lin.inputs] == [(M, K), (K, N), (N,)]
    assert [s for s, _ in lin.outputs] == [(M, N)]
    assert all(d == np.float64 for _, d in lin.inputs + lin.outputs)
    assert gelu.inputs[0][0] == (M, N) and gelu.outputs[0][0] == (M, N)
    assert total.outputs[0][0] == ()
    assert lin.fwd_flops == 2 * M * K * N + M * N  # GEMM + fused bias
    assert gelu.fwd_flops == 9 * M * N
    assert total.fwd_flops == M * N
    assert lin.bwd_flops == 0 and lin.fwd_launches >= 1
    loss.backward()
    assert lin.bwd_flops == 2 * (2 * M * K * N) + M * N  # dx, dW GEMMs + the bias sum
    assert gelu.bwd_flops == 17 * M * N
    # the listing is the same data as dicts
    listing = TAPE.listing(since=pos)
    assert [d["op"] for d in listing] == ["linear", "gelu", "sum"]
    assert listing[0]["inputs"][0] == [[M, K], "float64"]
    assert listing[0]["fwd_flops"] == lin.fwd_flops and listing[0]["bwd_flops"] == lin.bwd_flops


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_linear_transposed_flops(rng, bias):
    """The tied LM head (weight stored (out, in)) costs the same as a plain linear layer."""
    M, K, N = 4, 3, 6
    x, w = leaf(rng, M, K), leaf(rng, N, K)
    b = leaf(rng, N) if bias else None
    pos = TAPE.position()
    y = F.linear(x, w, b, transposed=True)
    (rec,) = TAPE.records(since=pos)
    assert rec.op == "linear" and rec.outputs[0][0] == (M, N)
    assert rec.fwd_flops == 2 * M * K * N + (M * N if bias else 0)
    y.backward(np.ones((M, N)))
    assert rec.bwd_flops == 2 * (2 * M * K * N) + (M * N if bias else 0)
    assert w.grad.shape == (N, K)


def test_linear_without_bias_flops(rng):
    M, K, N = 6, 4, 3
    x, w = leaf(rng, 2, 3, K), leaf(rng, K, N)
    pos = TAPE.position()
    y = F.linear(x, w)
    (rec,) = TAPE.records(since=pos)
    assert rec.op == "linear" and rec.outputs[0][0] == (2, 3, N)
    assert rec.fwd_flops == 2 * M * K * N
    y.backward(np.ones(y.shape))
    assert rec.bwd_flops == 2 * (2 * M * K * N)


@pytest.mark.parametrize(
    "sa, sb, batch",
    [
        ((3, 4), (4, 5), 1),
        ((2, 3, 3, 4), (2, 3, 4, 5), 6),
        ((2, 3, 4), (4, 5), 2),
        ((3, 4), (2, 4, 5), 2),
    ],
)
def test_matmul_flops(rng, sa, sb, batch):
    M, K, N = sa[-2], sa[-1], sb[-1]
    a, b = leaf(rng, *sa), leaf(rng, *sb)
    pos = TAPE.position()
    y = a @ b
    (rec,) = TAPE.records(since=pos)
    assert rec.op == "matmul"
    assert rec.fwd_flops == 2 * batch * M * K * N
    y.backward(np.ones(y.shape))
    # two GEMMs of the same size (plus, for a shared 2-D a, the batch sum of its gradient)
    extra = batch * M * K if len(sa) == 2 and len(sb) > 2 else 0
    assert rec.bwd_flops == 2 * (2 * batch * M * K * N) + extra


def test_views_launch_no_flops(rng):
    x = leaf(rng, 2, 3, 4)
    pos = TAPE.position()
    y = x.reshape(6, 4)[1:3].transpose(0, 1)
    recs = TAPE.records(since=pos)
    assert [r.op for r in recs] == ["reshape", "getitem", "permute"]
    assert all(r.fwd_flops == 0 for r in recs)
    del y


def test_scope_names_records(rng):
    x = leaf(rng, 2, 2)
    pos = TAPE.position()
    with autograd.scope("h.0.mlp"):
        y = F.gelu(x)
    z = F.gelu(y)
    assert [r.scope for r in TAPE.records(since=pos)] == ["h.0.mlp", ""]
    del z


def test_position_is_a_bookmark(rng):
    x = leaf(rng, 2)
    y = F.gelu(x)
    pos = TAPE.position()
    assert TAPE.records(since=pos) == []
    z = F.gelu(y)
    assert len(TAPE.records(since=pos)) == 1
    assert y._record in TAPE.records() and z._record in TAPE.records()


# ---------------------------------------------------------------- what backward frees


def test_backward_releases_saved_tensors(rng):
    x, w, b = leaf(rng, 4, 3), leaf(rng, 3, 5), leaf(rng, 5)
    lw, lb = leaf(rng, 5), leaf(rng, 5)
    base = settled_activations()
    pos = TAPE.position()
    h = F.gelu(F.layer_norm(F.linear(x, w, b), lw, lb))
    loss = F.cross_entropy(h, np.array([0, 4, -1, 2]))
    recs = TAPE.records(since=pos)
    assert [r.op for r in recs] == ["linear", "layernorm", "gelu", "crossentropy"]
    saved = sum(r.saved_bytes for r in recs)
    assert saved > 0
    assert TRACKER.current["activations"] - base == saved
    assert all(r.ctx.saved != () and not r.freed for r in recs)
    loss.backward()
    assert all(r.freed for r in recs)
    assert all(r.ctx.saved == () for r in recs)
    assert TRACKER.current["activations"] == base
    assert x.grad is not None and lw.grad is not None


def test_backward_frees_only_the_records_it_reaches(rng):
    x = leaf(rng, 3)
    side = F.gelu(x)
    main = F.gelu(x)
    main.backward(np.ones(3))
    assert main._record.freed
    assert not side._record.freed and side._record.ctx.saved != ()
    side.backward(np.ones(3))  # still possible: its tape was not touched
    assert side._record.freed


def test_second_backward_through_freed_tape_raises(rng):
    x = leaf(rng, 3, 2)
    y = F.gelu(x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="freed"):
        y.backward()


def test_backward_through_freed_intermediate_raises(rng):
    x = leaf(rng, 3)
    h = F.gelu(x)
    (h + h).sum().backward()
    z = (h + 1.0).sum()  # a new op on top of a record whose saved tensors are gone
    with pytest.raises(RuntimeError, match="freed"):
        z.backward()


def test_record_without_backward_dies_with_its_outputs(rng):
    x, w = leaf(rng, 3, 4), leaf(rng, 4, 2)
    pos = TAPE.position()
    y = F.gelu(F.linear(x, w))
    assert [r.op for r in TAPE.records(since=pos)] == ["linear", "gelu"]
    del y
    gc.collect()
    assert TAPE.records(since=pos) == []


def test_intermediate_record_kept_alive_by_downstream(rng):
    x = leaf(rng, 3)
    pos = TAPE.position()
    h = F.gelu(x)
    y = F.gelu(h)
    del h
    gc.collect()
    assert [r.op for r in TAPE.records(since=pos)] == ["gelu", "gelu"]
    y.backward(np.ones(3))
    assert x.grad is not None


def test_record_without_backward_releases_activation_accounting(rng):
    x, w = leaf(rng, 3, 4), leaf(rng, 4, 2)
    base = settled_activations()
    y = F.linear(x, w)
    assert TRACKER.current["activations"] > base
    del y
    gc.collect()
    assert TRACKER.current["activations"] == base


def test_activations_of_dead_intermediates_are_released(rng):
    """Saved buffers that only the tape held die with their records and leave the accounting
    (the leaf is tagged as a weight, which the tracker never counts as an activation)."""
    x = leaf(rng, 16)
    TRACKER.register(x.data, "weights")
    base = settled_activations()
    pos = TAPE.position()
    h = F.gelu(x)
    y = F.gelu(h)  # saves h's buffer: 16 float64
    recs = TAPE.records(since=pos)
    assert [r.saved_bytes for r in recs] == [0, 16 * 8]
    assert TRACKER.current["activations"] - base == 16 * 8
    del h, y, recs
    gc.collect()
    assert TAPE.records(since=pos) == []
    assert TRACKER.current["activations"] == base


# ---------------------------------------------------------------- grad modes


def test_no_grad_records_nothing(rng):
    x, w = leaf(rng, 3, 4), leaf(rng, 4, 2)
    pos = TAPE.position()
    with tg.no_grad():
        assert not tg.is_grad_enabled()
        y = F.gelu(F.linear(x, w)) + x.sum()
        loss = F.cross_entropy(y, np.array([0, 1, 1]))
    assert tg.is_grad_enabled()
    assert TAPE.records(since=pos) == []
    assert not y.requires_grad and not loss.requires_grad
    assert y.is_leaf() and loss.is_leaf()
    with pytest.raises(RuntimeError, match="does not require grad"):
        loss.backward()


def test_enable_grad_inside_no_grad(rng):
    x = leaf(rng, 2)
    pos = TAPE.position()
    with tg.no_grad():
        with tg.enable_grad():
            y = F.gelu(x)
        z = F.gelu(x)
    assert y.requires_grad and not z.requires_grad
    assert [r.op for r in TAPE.records(since=pos)] == ["gelu"]


def test_inputs_without_grad_record_nothing(rng):
    x = Tensor(rng.standard_normal((2, 3)))
    pos = TAPE.position()
    y = F.gelu(x) * x
    assert not y.requires_grad and TAPE.records(since=pos) == []


def test_detach_cuts_the_graph(rng):
    x = leaf(rng, 3)
    d = F.gelu(x).detach()
    assert d.is_leaf() and not d.requires_grad
    y = F.gelu(x) + d
    y.backward(np.ones(3))
    x2 = Tensor(x.numpy(), requires_grad=True)
    F.gelu(x2).backward(np.ones(3))
    np.testing.assert_array_equal(x.grad.numpy(), x2.grad.numpy())


# ---------------------------------------------------------------- gradient sums


def _loss(x, w, b):
    return F.cross_entropy(F.gelu(F.linear(x, w, b)), np.array([1, 0, -1]))


def test_gradients_accumulate_across_backward_passes(rng):
    x, w, b = leaf(rng, 3, 4), leaf(rng, 4, 2), leaf(rng, 2)
    _loss(x, w, b).backward()
    once = [t.grad.numpy().copy() for t in (x, w, b)]
    grad_buffers = [t.grad for t in (x, w, b)]
    _loss(x, w, b).backward()
    for t, g1, buf in zip((x, w, b), once, grad_buffers):
        assert t.grad is buf  # accumulated in place, not replaced
        np.testing.assert_allclose(t.grad.numpy(), 2 * g1, rtol=1e-14)


def test_tensor_used_twice_gets_both_gradients(rng):
    a = rng.standard_normal((2, 3))
    x = Tensor(a, requires_grad=True)
    (x * x).backward(np.ones((2, 3)))
    np.testing.assert_allclose(x.grad.numpy(), 2 * a, rtol=1e-14)
    # a non-leaf used twice: the two incoming gradients are summed before its backward
    x2 = Tensor(a, requires_grad=True)
    h = F.gelu(x2)
    (h + h).backward(np.ones((2, 3)))
    x3 = Tensor(a, requires_grad=True)
    F.gelu(x3).backward(2 * np.ones((2, 3)))
    np.testing.assert_allclose(x2.grad.numpy(), x3.grad.numpy(), rtol=1e-14)


def test_leaf_used_in_two_branches(rng):
    a, w1, w2 = (rng.standard_normal(s) for s in [(3, 4), (4, 2), (4, 2)])
    x = Tensor(a, requires_grad=True)
    y = F.linear(x, Tensor(w1)) + F.gelu(F.linear(x, Tensor(w2)))
    g = rng.standard_normal((3, 2))
    y.backward(g)
    u = a @ w2
    c = np.sqrt(2 / np.pi)
    t = np.tanh(c * (u + 0.044715 * u**3))
    dgelu = 0.5 * (1 + t) + 0.5 * u * (1 - t * t) * c * (1 + 3 * 0.044715 * u * u)
    np.testing.assert_allclose(x.grad.numpy(), g @ w1.T + (g * dgelu) @ w2.T, rtol=1e-6)


def test_backward_defaults_and_leaf(rng):
    x = leaf(rng, 3)
    F.gelu(x).sum().backward()  # scalar: upstream gradient 1
    x2 = Tensor(x.numpy(), requires_grad=True)
    F.gelu(x2).backward(np.ones(3))
    np.testing.assert_array_equal(x.grad.numpy(), x2.grad.numpy())
    # backward on a leaf: its gradient is the upstream gradient (a private copy)
    g = np.arange(3.0)
    x3 = leaf(rng, 3)
    x3.backward(g)
    np.testing.assert_array_equal(x3.grad.numpy(), g)
    g[0] = 99
    assert x3.grad.numpy()[0] == 0


def test_upstream_gradient_as_tensor_and_not_modified(rng):
    x = leaf(rng, 2, 3)
    g = rng.standard_normal((2, 3))
    g_copy = g.copy()
    y = F.gelu(x)
    y.backward(Tensor(g))
    np.testing.assert_array_equal(g, g_copy)
    x2 = Tensor(x.numpy(), requires_grad=True)
    F.gelu(x2).backward(g)
    np.testing.assert_array_equal(x.grad.numpy(), x2.grad.numpy())


def test_fp32_leaf_gets_fp32_gradient(rng):
    x = leaf(rng, 3, 4, dtype=np.float32)
    w = leaf(rng, 4, 2, dtype=np.float32)
    loss = F.cross_entropy(F.linear(x, w), np.array([0, 1, 1]))
    assert loss.dtype == np.float32
    loss.backward()
    assert x.grad.dtype == np.float32 and w.grad.dtype == np.float32


# ---------------------------------------------------------------- bad input


def test_matmul_shape_mismatch_names_both_shapes():
    a, b = Tensor(np.ones((4, 3))), Tensor(np.ones((5, 2)))
    with pytest.raises(ValueError) as e:
        a @ b
    assert str(e.value) == "matmul: (4, 3) @ (5, 2): inner dimensions 3 and 5 differ"


def test_matmul_other_bad_shapes():
    with pytest.raises(ValueError, match=r"\(2, 3, 4, 5\) @ \(3, 5, 6\).*batch"):
        Tensor(np.ones((2, 3, 4, 5))) @ Tensor(np.ones((3, 5, 6)))
    with pytest.raises(ValueError, match="at least 2 dims"):
        Tensor(np.ones(3)) @ Tensor(np.ones((3, 2)))
    with pytest.raises(ValueError, match=r"linear: input \(2, 3\) @ weight \(4, 5\)"):
        F.linear(Tensor(np.ones((2, 3))), Tensor(np.ones((4, 5))))


def test_backward_non_scalar_needs_gradient(rng):
    y = F.gelu(leaf(rng, 2, 3))
    with pytest.raises(RuntimeError, match=r"non-scalar tensor of shape \(2, 3\)"):
        y.backward()
    with pytest.raises(ValueError, match=r"grad has shape \(3, 2\)"):
        y.backward(np.ones((3, 2)))


def test_int_tensor_cannot_require_grad():
    with pytest.raises(TypeError, match="floating-point"):
        Tensor(np.arange(3), requires_grad=True)
    with pytest.raises(TypeError):
        Tensor([1, 2, 3], requires_grad=True)
    assert Tensor([1.0, 2.0], requires_grad=True).dtype == np.float32


def test_out_of_range_ids_name_the_id_and_vocab():
    w = Tensor(np.ones((5, 3)), requires_grad=True)
    with pytest.raises(ValueError, match="token id 7 out of range for vocab 5"):
        F.embedding(np.array([1, 7, 2]), w)
    with pytest.raises(ValueError, match="token id -2 out of range for vocab 5"):
        F.embedding(np.array([1, -2]), w)
    logits = Tensor(np.zeros((3, 4)), requires_grad=True)
    with pytest.raises(ValueError, match="target id 9 out of range for vocab 4"):
        F.cross_entropy(logits, np.array([1, 9, -1]))
    with pytest.raises(ValueError, match="target id 4 out of range for vocab 4"):
        F.cross_entropy(logits, np.array([4, 0, 0]))
    with pytest.raises(ValueError, match="target id -3 out of range for vocab 4"):
        F.cross_entropy(logits, np.array([0, -3, 0]))
    with pytest.raises(TypeError, match="ids must be integers"):
        F.embedding(np.array([1.0]), w)


def test_other_bad_input():
    x = Tensor(np.ones((2, 3)), requires_grad=True)
    with pytest.raises(ValueError, match="every target is ignored"):
        F.cross_entropy(x, np.array([-1, -1]))
    with pytest.raises(ValueError, match=r"targets of shape \(2,\)"):
        F.cross_entropy(x, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="do not add up"):
        F.split(x, [1, 1], dim=1)
    with pytest.raises(TypeError, match="only ints, slices, None and"):
        x[np.array([0, 1])]
    with pytest.raises(ValueError, match="features"):
        F.layer_norm(x, Tensor(np.ones(4)), Tensor(np.zeros(4)))
    q = Tensor(np.ones((1, 1, 3, 2)))
    with pytest.raises(ValueError, match="at least as many keys as queries"):
        F.scaled_dot_product_attention(
            q, Tensor(np.ones((1, 1, 2, 2))), Tensor(np.ones((1, 1, 2, 2)))
        )
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor(np.ones(1)).backward()


def test_embedding_ids_as_list():
    w = Tensor(np.arange(10.0).reshape(5, 2), requires_grad=True)
    with pytest.raises(ValueError, match="token id 7 out of range for vocab 5"):
        F.embedding([1, 7], w)
    y = F.embedding([1, 1, 3], w)
    np.testing.assert_array_equal(y.numpy(), w.numpy()[[1, 1, 3]])
    y.backward(np.ones((3, 2)))
    np.testing.assert_array_equal(w.grad.numpy()[:, 0], [0, 2, 0, 1, 0])
