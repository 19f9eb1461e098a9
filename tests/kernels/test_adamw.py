"""The optimizer's kernels (kernels/adamw) over AdamW's flat buffers: the gradient's sum of
squares (fp32 accumulation, not finite on an overflow, the same bits run after run) and the
fused update against the textbook AdamW in float64 (decoupled decay on the first n_decay
elements, bias-corrected moments, clipping by the unscaled norm, a working copy refreshed from
the master), skipped, writing nothing, when the norm is not finite.
"""

import math

import numpy as np
import pytest

from tinygrad_like.kernels.adamw.spec import Hyper, constants, hyper_of

from .check import BF16, F16, F32, F64, FLOATS, Case, cases, cpu, f64, gpu_only, rand

HP = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, n_decay=600, step=3)


def grad_norm_sq_ref(grad):
    return np.array([np.sum(f64(grad) ** 2)])


def gradient(put, dtype, n, bad):
    """A flat gradient of n elements, one of them bad (inf, -inf or nan) if asked."""
    g = rand(n, dtype, seed=1)
    if bad:
        g[n // 2] = float(bad)
    return put(g)


def not_finite(results, grad):
    assert not np.isfinite(results[0][0])


def adamw_ref(master, grad, m, v, working, norm_sq, c):
    """The textbook AdamW in float64 with the Hyper of the constants c -> master, m, v (and
    working, the master rounded); the arguments as they were when norm_sq is not finite (an
    overflow)."""
    h = hyper_of(c)
    if not np.isfinite(norm_sq[0]):
        return tuple(a for a in (master, m, v, working) if a is not None)
    master, m, v = (f64(a) for a in (master, m, v))
    g = f64(grad) * h.inv_scale
    if h.max_norm > 0:
        g *= min(1.0, h.max_norm / (math.sqrt(float(norm_sq[0])) * h.inv_scale + 1e-6))
    b1, b2, step = h.beta1, h.beta2, h.step
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    master[: h.n_decay] *= 1 - h.lr * h.weight_decay
    master -= h.lr * (m / (1 - b1**step)) / (np.sqrt(v / (1 - b2**step)) + h.eps)
    return (master, m, v) + (() if working is None else (master.astype(working.dtype),))


def buffers(put, P, G, max_norm, bad):
    """master, grad (in G, multiplied by the loss scale), m, v (in P), the working copy (None
    when G is P) and grad's norm_sq (the CPU's); one element of grad bad if asked."""
    n = 1037
    master, grad = rand(n, P, seed=1), rand(n, G, scale=1024.0, seed=2)
    m, v = rand(n, P, scale=0.01, seed=3), np.abs(rand(n, P, scale=1e-4, seed=4))
    if bad:
        grad[17] = float(bad)
    working = put(master.astype(G)) if G != P else None
    arrays = [put(a) for a in (master, grad, m, v)]
    hyper = Hyper(**HP, inv_scale=1 / 1024, max_norm=max_norm)
    return (*arrays[:4], working, put(cpu.grad_norm_sq(grad)), put(constants(hyper)))


def adamw_case(P, G, max_norm, bad=None):
    """The results' tolerances: the master's dtype, the working copy's (a rounded master) in a
    2-byte G; an overflow's, bit for bit."""
    working = (G if G in (F16, BF16) else P,) if G != P else ()
    return Case(
        "adamw_step",
        buffers,
        (P, G, max_norm, bad),
        ref=adamw_ref,
        tol=(P, P, P, *working),
        exact=bad is not None,
    )


PRECISIONS = [(F32, F32), (F32, F16), (F32, BF16), (F32, F64), (F64, F64)]
CASES = [
    *cases(
        "grad_norm_sq",
        gradient,
        [(d, n, None) for d in FLOATS for n in (300_007, 257, 1)],
        ref=grad_norm_sq_ref,
        repeatable=True,
    ),
    *cases(
        "grad_norm_sq",
        gradient,
        [(d, 300_007, b) for d in FLOATS for b in ("inf", "-inf", "nan")],
        ref=grad_norm_sq_ref,
        holds=not_finite,
    ),
    *[adamw_case(P, G, max_norm) for P, G in PRECISIONS for max_norm in (0.0, 1.0)],
    *[adamw_case(F32, G, 1.0, bad) for G in (F16, BF16) for bad in ("inf", "nan")],
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel(case, check):
    check(case)


# ---------------------------------------------------------------- what a case cannot say


@gpu_only
def test_cuda_adamw_step_never_waits_for_the_host(cuda, cuda_device):
    """Captured into a CUDA graph: any device-to-host read (e.g. float(norm_sq[0])) would make
    the capture fail."""
    gpu, cupy = cuda_device, cuda.xp
    *bufs, norm_sq, hyper = buffers(gpu.asarray, F32, BF16, 1.0, None)
    gpu.adamw_step(*bufs, norm_sq, hyper)  # compile and load outside the capture
    before = gpu.to_numpy(bufs[0])
    gpu.synchronize()  # the capture stream does not wait for the default stream
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        gpu.adamw_step(*bufs, norm_sq, hyper)
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    assert not np.array_equal(gpu.to_numpy(bufs[0]), before)


def test_cpu_grad_norm_sq_sums_squares_in_fp32():
    g = rand(1000, F32)
    out = cpu.grad_norm_sq(g)
    assert out.shape == (1,) and out.dtype == F32
    np.testing.assert_allclose(out[0], np.sum(f64(g) ** 2), rtol=1e-5)
    gb = g.astype(BF16)
    outb = cpu.grad_norm_sq(gb)
    assert outb.dtype == F32  # squares summed in fp32, not bf16
    np.testing.assert_allclose(outb[0], np.sum(f64(gb) ** 2), rtol=1e-5)
    big = np.full(10, 60000, np.float16)  # squares overflow fp16 but not fp32
    assert np.isfinite(cpu.grad_norm_sq(big)[0])


@pytest.mark.parametrize("max_norm", [0.0, 0.5], ids=["no-clip", "clip"])
@pytest.mark.parametrize(
    "working_dtype", [None, BF16, F16], ids=["fp32", "bf16-working", "fp16-working"]
)
def test_cpu_three_steps_follow_the_reference(working_dtype, max_norm):
    """Three steps in a row against the float64 AdamW: master, m and v within fp32 rounding,
    the working copy the master rounded, the gradient untouched."""
    N, scale = 20, 1.0 if working_dtype is None else 1024.0
    master = rand(N, F32)
    m, v = np.zeros(N, F32), np.zeros(N, F32)
    working = None if working_dtype is None else master.astype(working_dtype)
    hp = dict(HP, lr=1e-2, n_decay=12, inv_scale=1 / scale, max_norm=max_norm)
    ref = (f64(master), f64(m), f64(v))
    for step in (1, 2, 3):
        grad = (scale * rand(N, F32, seed=step)).astype(working_dtype or F32)
        norm_sq, grad_before = cpu.grad_norm_sq(grad), grad.copy()
        c = constants(Hyper(**dict(hp, step=step)))
        cpu.adamw_step(master, grad, m, v, working, norm_sq, c)
        assert grad.tobytes() == grad_before.tobytes()
        ref = adamw_ref(*ref[:1], grad, *ref[1:], None, norm_sq, c)
        for got, want in zip((master, m, v), ref):
            assert got.dtype == F32
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)
        if working is not None:
            np.testing.assert_array_equal(
                working.view(np.uint16), master.astype(working_dtype).view(np.uint16)
            )


def test_cpu_weight_decay_only_on_the_first_n_decay():
    N = 8
    master = rand(N, F32)
    before, grad = master.copy(), np.zeros(N, F32)  # zero gradient: only the decay moves
    zeros = np.zeros(N, F32)
    hyper = Hyper(
        0.1, 0.9, 0.999, 1e-8, weight_decay=0.5, n_decay=5, step=1, inv_scale=1.0, max_norm=0
    )
    norm_sq = cpu.grad_norm_sq(grad)
    cpu.adamw_step(master, grad, zeros, zeros.copy(), None, norm_sq, constants(hyper))
    np.testing.assert_allclose(master[:5], before[:5] * (1 - 0.1 * 0.5), rtol=1e-6)
    np.testing.assert_array_equal(master[5:], before[5:])


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
def test_cpu_half_norm_is_the_widened_gradients(dtype):
    """A 2-byte gradient's norm² (widened a part at a time inside one compiled launch) has the
    bits of the widened gradient's, over parts and a ragged last one; inf stays inf."""
    from tinygrad_like.kernels.adamw import cpu as adamw_cpu

    g = rand((5 * adamw_cpu._NORM_PART // 2 + 3,), F32).astype(dtype)
    want = cpu.grad_norm_sq(g.astype(F32))
    assert cpu.grad_norm_sq(g).tobytes() == want.tobytes()
    g[7] = np.inf
    assert np.isinf(cpu.grad_norm_sq(g)[0])
