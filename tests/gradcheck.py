"""Central finite-difference gradient checks for tinygrad_like ops (float64 only).

gradcheck(fn, *inputs) wraps each float64 NumPy array of `inputs` in a leaf Tensor that
requires grad (other inputs, e.g. integer ids, pass through unchanged), runs fn once with grad
enabled, calls .backward(G) with a random upstream gradient G and compares every leaf's .grad
with the central difference (f(x + eps e_j) - f(x - eps e_j)) / (2 eps) of the scalar
<fn(x), G>, evaluated under no_grad() by perturbing the leaf's own buffer in place (so a
non-contiguous view passed in stays non-contiguous).
"""

import numpy as np

import tinygrad_like as tg
from tinygrad_like import Tensor

RTOL = 1e-6
ATOL = 1e-6
EPS = 1e-6


def _outputs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _pairing(outs, upstream):
    """<fn(x), G> in float64 NumPy (no tape involved)."""
    return float(sum(np.sum(o.numpy().astype(np.float64) * g) for o, g in zip(outs, upstream)))


def analytic_grads(fn, *inputs, seed=0):
    """-> (leaves, outputs, upstream gradients): one forward with grad, one backward."""
    rng = np.random.default_rng(seed)
    leaves = [Tensor(a, requires_grad=True) if _differentiable(a) else a for a in inputs]
    outs = _outputs(fn(*leaves))
    upstream = [rng.standard_normal(o.shape) for o in outs]
    if len(outs) == 1:
        outs[0].backward(upstream[0])
    else:  # several outputs (split): backpropagate sum_k <out_k, G_k> in one sweep
        total = None
        for o, g in zip(outs, upstream):
            term = (o * Tensor(g)).sum()
            total = term if total is None else total + term
        total.backward()
    return leaves, outs, upstream


def numeric_grad(fn, leaves, index, upstream, eps=EPS):
    """d<fn(leaves), upstream>/d leaves[index] by central differences."""
    buf = leaves[index].data
    grad = np.zeros(buf.shape, dtype=np.float64)
    with tg.no_grad():
        for j in np.ndindex(*buf.shape):
            orig = buf[j]
            buf[j] = orig + eps
            plus = _pairing(_outputs(fn(*leaves)), upstream)
            buf[j] = orig - eps
            minus = _pairing(_outputs(fn(*leaves)), upstream)
            buf[j] = orig
            grad[j] = (plus - minus) / (2 * eps)
    return grad


def gradcheck(fn, *inputs, rtol=RTOL, atol=ATOL, eps=EPS, seed=0):
    """Assert analytic == numeric gradients for every float64 input; returns the leaves."""
    for a in inputs:
        if isinstance(a, np.ndarray) and a.dtype.kind == "f":
            assert a.dtype == np.float64, "gradcheck needs float64 inputs"
    leaves, outs, upstream = analytic_grads(fn, *inputs, seed=seed)
    checked = 0
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, Tensor):
            continue
        assert leaf.grad is not None, f"input {i} got no gradient"
        assert leaf.grad.shape == leaf.shape, (i, leaf.grad.shape, leaf.shape)
        assert leaf.grad.dtype == np.float64, (i, leaf.grad.dtype)
        expected = numeric_grad(fn, leaves, i, upstream, eps)
        np.testing.assert_allclose(
            leaf.grad.numpy(),
            expected,
            rtol=rtol,
            atol=atol,
            err_msg=f"gradient of input {i} (shape {leaf.shape})",
        )
        checked += 1
    assert checked, "gradcheck found no float64 input to check"
    return leaves


def _differentiable(a):
    return isinstance(a, np.ndarray) and a.dtype == np.float64
