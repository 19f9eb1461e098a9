"""AdamW against a float64 reference written here, global-norm clipping, and the lr schedule.

The reference is PyTorch's AdamW (decoupled weight decay, bias-corrected moments, eps added
after the square root of the corrected second moment), with weight decay on the 2-D
parameters only and the gradients scaled by min(1, max_norm / (norm + 1e-6)) first.
"""

import math

import numpy as np
import pytest

from nn.flat import flatten_parameters
from nn.module import Parameter
from optim import AdamW, clip_grad_norm_, cosine_with_warmup
from tinygrad_like.distributed import MetaWorld

# ----------------------------------------------------------------------------- helpers

SHAPES = {  # given out of order on purpose: AdamW packs the 2-D ones first
    "bias": (3,),
    "w": (4, 3),
    "ln_gain": (5,),
    "emb": (6, 2),
    "conv": (2, 2, 3),  # 3-D counts as a weight: decayed
}


def make_params(rng):
    """name -> Parameter, laid out in one flat buffer (as a model takes its working dtype)."""
    return laid_out(
        {
            name: Parameter(rng.normal(0, 0.5, shape).astype(np.float32))
            for name, shape in SHAPES.items()
        }
    )


def laid_out(params):
    flatten_parameters(params.values())
    return params


def set_grads(params, grads):
    for name, p in params.items():
        p.grad.data[...] = grads[name]


def reference_adamw(
    init, grad_steps, lrs, betas, eps, wd, clip, decay_all=False, eps_before_correction=False
):
    """float64 AdamW: -> (params, m, v, norms) after every step in grad_steps.
    The two flags give common wrong variants, to show the comparison can tell them apart."""
    p = {k: v.astype(np.float64) for k, v in init.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    b1, b2 = betas
    norms = []
    for t, (grads, lr) in enumerate(zip(grad_steps, lrs), start=1):
        g = {k: x.astype(np.float32).astype(np.float64) for k, x in grads.items()}
        norm = math.sqrt(sum(float((x * x).sum()) for x in g.values()))
        norms.append(norm)
        coef = min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0
        for k in p:
            gk = g[k] * coef
            if p[k].ndim >= 2 or decay_all:
                p[k] = p[k] * (1 - lr * wd)
            m[k] = b1 * m[k] + (1 - b1) * gk
            v[k] = b2 * v[k] + (1 - b2) * gk * gk
            mhat = m[k] / (1 - b1**t)
            vhat = v[k] / (1 - b2**t)
            if eps_before_correction:  # Adam paper's "eps hat" form
                p[k] = p[k] - lr * mhat / ((np.sqrt(v[k]) + eps) / math.sqrt(1 - b2**t))
            else:
                p[k] = p[k] - lr * mhat / (np.sqrt(vhat) + eps)
    return p, m, v, norms


def grad_schedule(rng):
    """Three steps of gradients with very different global norms: ~20 (clipped at 1.0),
    ~2e-3 (where eps = 1e-3 is comparable to sqrt(v)), ~0.6 (unclipped)."""
    steps = []
    for scale in (4.0, 4e-4, 0.12):
        steps.append(
            {k: (rng.normal(0, 1, s) * scale).astype(np.float32) for k, s in SHAPES.items()}
        )
    return steps


# ----------------------------------------------------------------------------- AdamW


@pytest.mark.parametrize("clip", [0.0, 1.0], ids=["no-clip", "clip-1.0"])
def test_adamw_matches_reference(rng, clip):
    params = make_params(rng)
    init = {k: p.numpy().copy() for k, p in params.items()}
    betas, eps, wd = (0.8, 0.9), 1e-3, 0.3
    lrs = [1e-2, 5e-3, 2e-2]
    grads = grad_schedule(rng)
    opt = AdamW(params, lr=lrs[0], betas=betas, eps=eps, weight_decay=wd, grad_clip=clip)

    norms = []
    for g, lr in zip(grads, lrs):
        set_grads(params, g)
        norm, skipped = opt.step(lr=lr)
        opt.zero_grad()
        assert not skipped
        norms.append(norm)

    ref_p, ref_m, ref_v, ref_norms = reference_adamw(init, grads, lrs, betas, eps, wd, clip)
    # the returned norm is the global norm before clipping
    np.testing.assert_allclose(norms, ref_norms, rtol=1e-5)
    arrays, scalars = opt.state_dict()
    assert scalars["step"] == 3
    for k, p in params.items():
        np.testing.assert_allclose(p.numpy(), ref_p[k], rtol=1e-5, atol=1e-6, err_msg=k)
        np.testing.assert_allclose(arrays[f"m.{k}"], ref_m[k], rtol=1e-5, atol=1e-9, err_msg=k)
        np.testing.assert_allclose(arrays[f"v.{k}"], ref_v[k], rtol=1e-5, atol=1e-12, err_msg=k)
    # gradients are zero again after zero_grad()
    assert all(not p.grad.numpy().any() for p in params.values())


def test_adamw_reference_is_discriminating(rng):
    """The reference test above would notice the usual AdamW mistakes: clipping ignored,
    decay on every parameter, eps added before the bias correction."""
    params = make_params(rng)
    init = {k: p.numpy().copy() for k, p in params.items()}
    grads = grad_schedule(rng)
    lrs = [1e-2, 5e-3, 2e-2]
    opt = AdamW(params, lr=1e-2, betas=(0.8, 0.9), eps=1e-3, weight_decay=0.3, grad_clip=1.0)
    for g, lr in zip(grads, lrs):
        set_grads(params, g)
        opt.step(lr=lr)
        opt.zero_grad()
    got = np.concatenate([params[k].numpy().ravel() for k in SHAPES])

    def dist(clip=1.0, **variant):
        ref, _, _, _ = reference_adamw(init, grads, lrs, (0.8, 0.9), 1e-3, 0.3, clip, **variant)
        return np.abs(got - np.concatenate([ref[k].ravel() for k in SHAPES])).max()

    assert dist() < 1e-5
    assert dist(clip=0.0) > 1e-4
    assert dist(decay_all=True) > 1e-4
    assert dist(eps_before_correction=True) > 1e-4


def test_weight_decay_only_on_2d_params(rng):
    """Zero gradients: the Adam term is exactly 0, so only the decoupled decay acts, and only
    on parameters with ndim >= 2 (matmul weights, embeddings), never biases or gains."""
    params = make_params(rng)
    before = {k: p.numpy().copy() for k, p in params.items()}
    lr, wd = 0.1, 0.5
    opt = AdamW(params, lr=lr, weight_decay=wd)
    assert opt.n_decay == sum(int(np.prod(s)) for s in SHAPES.values() if len(s) >= 2)
    opt.step()
    for k, p in params.items():
        if p.ndim >= 2:
            np.testing.assert_array_equal(p.numpy(), before[k] * np.float32(1 - lr * wd))
        else:
            np.testing.assert_array_equal(p.numpy(), before[k])


def test_adamw_first_step_is_lr_times_sign(rng):
    """Bias correction: on step 1 mhat = g and vhat = g^2, so (no decay, tiny eps) every
    weight moves by lr * g / (|g| + eps) ~= lr * sign(g) whatever the betas."""
    w = Parameter(np.zeros(64, np.float32))
    flatten_parameters([w])
    opt = AdamW([w], lr=1e-2, betas=(0.5, 0.25), eps=1e-12, weight_decay=0.0)
    g = rng.normal(0, 1, 64).astype(np.float32)
    w.grad.data[...] = g
    opt.step()
    np.testing.assert_allclose(w.numpy(), -1e-2 * np.sign(g), rtol=1e-6)


def test_adamw_views_share_the_flat_buffers(rng):
    params = make_params(rng)
    opt = AdamW(params)
    for p in params.values():
        assert np.shares_memory(p.data, opt.master)  # fp32: the master is the weights
        assert np.shares_memory(p.grad.data, opt.grad)
    assert opt.working is None
    assert opt.master.dtype == np.float32 and opt.master.size == sum(
        p.numel() for p in params.values()
    )


def test_adamw_state_roundtrip_continues_identically(rng):
    """state_dict + master_state into a fresh optimizer, then the same steps: bit-identical."""
    grads = grad_schedule(rng) + grad_schedule(rng)
    params = make_params(rng)
    init = {k: p.numpy().copy() for k, p in params.items()}
    opt = AdamW(params, lr=1e-2, grad_clip=1.0)
    for g in grads[:3]:
        set_grads(params, g)
        opt.step()
        opt.zero_grad()
    arrays, scalars = opt.state_dict()
    weights = opt.master_state()

    clone = laid_out({k: Parameter(weights[k]) for k in SHAPES})
    opt2 = AdamW(clone, lr=1e-2, grad_clip=1.0)
    opt2.load_state_dict(arrays, scalars)
    assert opt2.step_count == 3
    for g in grads[3:]:
        set_grads(params, g)
        set_grads(clone, g)
        opt.step()
        opt2.step()
    for k in SHAPES:
        np.testing.assert_array_equal(params[k].numpy(), clone[k].numpy())
        assert not np.array_equal(params[k].numpy(), init[k])


def test_adamw_load_state_dict_mismatch_loads_nothing(rng):
    params = make_params(rng)
    opt = AdamW(params)
    arrays, scalars = opt.state_dict()
    arrays = {k: v + 1 for k, v in arrays.items()}
    bad = dict(arrays)
    del bad["m.bias"]
    with pytest.raises(ValueError, match="missing"):
        opt.load_state_dict(bad, dict(scalars, step=7))
    wrong_size = dict(arrays, **{"v.w": np.ones(5, np.float32)})
    with pytest.raises(ValueError, match="nothing loaded"):
        opt.load_state_dict(wrong_size, dict(scalars, step=7))
    assert opt.step_count == 0
    assert not opt.m.any() and not opt.v.any()


def test_adamw_rejects_no_parameters():
    with pytest.raises(ValueError, match="no parameters"):
        AdamW([])


def test_adamw_views_the_layout_it_is_given_and_rebinds_nothing(rng):
    """The working weights are the model's flat buffer, laid out (2-D first, zeros up to the
    shards) before AdamW: AdamW refuses parameters not laid out, or only some of a layout, or
    a layout that does not split into its ZeRO shards, and binds no parameter's data."""
    loose = {k: Parameter(rng.normal(0, 1, s).astype(np.float32)) for k, s in SHAPES.items()}
    with pytest.raises(ValueError, match="lay them out first"):
        AdamW(loose)
    flat = flatten_parameters(loose.values(), shards=3)  # 44 elements, 1 of padding
    assert [p.ndim >= 2 for p in flat.params] == sorted(
        (len(s) >= 2 for s in SHAPES.values()), reverse=True
    )
    assert flat.numel == 45 and flat.padding == 1 and flat.spans[-1][1] == 44
    with pytest.raises(ValueError, match="lay them out first"):
        AdamW({"w": loose["w"]})
    with pytest.raises(ValueError, match="into 4 equal shards"):
        AdamW(loose, comm=MetaWorld(0, 4), zero=1)
    data = {k: p.data for k, p in loose.items()}
    opt = AdamW(loose, comm=MetaWorld(1, 3), zero=1)
    assert opt.m.size == 15 and opt.shard == (15, 30) and opt.padding == 1
    assert all(p.data is data[k] and p.flat is flat for k, p in loose.items())


# ----------------------------------------------------------------------------- clipping


def test_clip_grad_norm_scales_to_max_norm(rng):
    ps = [Parameter(np.zeros(s, np.float32)) for s in [(3, 4), (7,), (2, 2)]]
    grads = [rng.normal(0, 3, p.shape).astype(np.float32) for p in ps]
    for p, g in zip(ps, grads):
        p.grad = type(p)(g.copy())
    total = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads))
    norm = clip_grad_norm_(ps, 1.0)
    assert norm == pytest.approx(total, rel=1e-6)
    after = math.sqrt(sum(float((p.grad.numpy().astype(np.float64) ** 2).sum()) for p in ps))
    assert after == pytest.approx(1.0, rel=1e-5)
    for p, g in zip(ps, grads):  # same direction: every gradient scaled by one factor
        np.testing.assert_allclose(p.grad.numpy(), g * (1.0 / (total + 1e-6)), rtol=1e-5)


def test_clip_grad_norm_below_threshold_is_untouched(rng):
    ps = [Parameter(np.zeros((5,), np.float32)), Parameter(np.zeros((2, 3), np.float32))]
    grads = [rng.normal(0, 0.01, p.shape).astype(np.float32) for p in ps]
    for p, g in zip(ps, grads):
        p.grad = type(p)(g.copy())
    ps.append(Parameter(np.zeros(3, np.float32)))  # no gradient: skipped
    norm = clip_grad_norm_(ps, 1.0)
    assert norm < 1.0
    for p, g in zip(ps, grads):
        np.testing.assert_array_equal(p.grad.numpy(), g)


def test_clip_grad_norm_takes_what_pytorch_users_pass(rng):
    """torch.nn.utils.clip_grad_norm_'s calling forms: one tensor, or a generator such as
    model.parameters()."""
    one = Parameter(np.zeros(4, np.float32))
    one.grad = type(one)(np.full(4, 2.0, np.float32))  # norm 4
    assert clip_grad_norm_(one, 1.0) == pytest.approx(4.0)
    np.testing.assert_allclose(one.grad.numpy(), 0.5 / (1 + 2.5e-7), rtol=1e-6)
    ps = [Parameter(np.zeros(3, np.float32)) for _ in range(2)]
    for p in ps:
        p.grad = type(p)(np.full(3, 1.0, np.float32))
    assert clip_grad_norm_((p for p in ps), 10.0) == pytest.approx(math.sqrt(6))


def test_adamw_fused_clip_equals_clip_then_step(rng):
    """AdamW(grad_clip=c) gives the same update as clip_grad_norm_(c) and an unclipped AdamW."""
    grads = grad_schedule(rng)
    a = make_params(rng)
    b = laid_out({k: Parameter(p.numpy().copy()) for k, p in a.items()})
    fused = AdamW(a, lr=1e-2, grad_clip=1.0)
    plain = AdamW(b, lr=1e-2, grad_clip=0.0)
    for g in grads:
        set_grads(a, g)
        set_grads(b, g)
        n1, _ = fused.step()
        n2 = clip_grad_norm_(list(b.values()), 1.0)
        plain.step()
        fused.zero_grad()
        plain.zero_grad()
        assert n1 == pytest.approx(n2, rel=1e-6)
    for k in SHAPES:
        np.testing.assert_allclose(a[k].numpy(), b[k].numpy(), rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- schedule


def test_schedule_warmup_is_a_linear_rise_to_max():
    lrs = [cosine_with_warmup(s, 1.0, 0.1, 10, 100) for s in range(10)]
    np.testing.assert_allclose(lrs, [(s + 1) / 10 for s in range(10)], rtol=1e-12)
    assert np.allclose(np.diff(lrs), 0.1)  # constant slope
    assert lrs[-1] == pytest.approx(1.0)  # reaches max_lr at the end of warmup
    assert cosine_with_warmup(10, 1.0, 0.1, 10, 100) == pytest.approx(1.0)


def test_schedule_cosine_to_min_then_flat():
    max_lr, min_lr, warmup, total = 6e-4, 6e-5, 10, 110
    decay = [cosine_with_warmup(s, max_lr, min_lr, warmup, total) for s in range(warmup, total + 1)]
    assert all(a >= b for a, b in zip(decay, decay[1:]))  # non-increasing
    assert decay[0] == pytest.approx(max_lr)
    assert decay[50] == pytest.approx((max_lr + min_lr) / 2)  # halfway: the midpoint
    assert decay[25] == pytest.approx(min_lr + (max_lr - min_lr) * (1 + math.cos(math.pi / 4)) / 2)
    assert decay[-1] == pytest.approx(min_lr)
    # cosine: slow at both ends, fastest in the middle
    drops = -np.diff(decay)
    assert drops[0] < drops[50] and drops[-1] < drops[50]
    for s in (total, total + 1, 10 * total):
        assert cosine_with_warmup(s, max_lr, min_lr, warmup, total) == min_lr
    after_warmup = [
        cosine_with_warmup(s, max_lr, min_lr, warmup, total) for s in range(warmup, 2 * total)
    ]
    assert min(after_warmup) == min_lr and max(after_warmup) <= max_lr * (1 + 1e-12)


def test_schedule_without_warmup_starts_at_max():
    assert cosine_with_warmup(0, 1e-3, 1e-4, 0, 50) == pytest.approx(1e-3)
    assert cosine_with_warmup(50, 1e-3, 1e-4, 0, 50) == 1e-4
