"""Causal attention in blocks (kernels/attention: flash_attention_fwd / _bwd) against the
float64 attention: query and key counts ragged against the blocks, T = 1, a KV-cache decode
step and a prompt after a cache, grouped-query and multi-query heads, no heads or no queries,
ragged head dims; q and dout as the model passes them, (B, T, H, D) viewed as (B, H, T, D).

The attention op's own tests (against the naive attention, the tape, GPT-2): tests/
test_flash_attention.py and test_gqa.py. The CPU's split over its cores: test_cpu_threads.py.
"""

import itertools

import numba
import numpy as np
import pytest

from tinygrad_like import dtypes
from tinygrad_like.backend.cpu.vector_math import exp
from tinygrad_like.kernels.attention import cpu as attention_cpu

from .check import F32, F64, FLOATS, cases, close, cpu, f64, rand


def attention_ref(q, k, v, dout, scale):
    """-> out, lse, dq, dk, dv in float64 for q (B, H, Tq, D), k, v (B, Hkv, Tk, D), dout like
    out: k and v repeated to H heads (Hugging Face's repeat_kv), the causal mask aligned
    bottom-right, dk and dv summed back over each group."""
    q, k, v, dout = (f64(a) for a in (q, k, v, dout))
    G, Tq, Tk = q.shape[1] // max(k.shape[1], 1), q.shape[2], k.shape[2]
    kr, vr = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    s = scale * q @ kr.swapaxes(-1, -2)
    s[..., np.triu(np.ones((Tq, Tk), bool), k=Tk - Tq + 1)] = -np.inf
    m = s.max(-1, keepdims=True, initial=-np.inf)
    e = np.exp(s - m)
    lse = (np.log(e.sum(-1, keepdims=True)) + m)[..., 0]
    p = e / e.sum(-1, keepdims=True)
    dp = dout @ vr.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dk, dv = scale * ds.swapaxes(-1, -2) @ q, p.swapaxes(-1, -2) @ dout

    def per_kv_head(g):  # (B, H, Tk, D) -> (B, Hkv, Tk, D)
        return g.reshape(g.shape[0], k.shape[1], G, *g.shape[2:]).sum(2)

    return p @ vr, lse, scale * ds @ kr, per_kv_head(dk), per_kv_head(dv)


def flash_fwd_ref(q, k, v, scale):
    return attention_ref(q, k, v, np.zeros(q.shape), scale)[:2]


def flash_bwd_ref(q, k, v, out, lse, dout, scale):
    return attention_ref(q, k, v, dout, scale)[2:]


def cancelling_terms(q, k, v, *rest):
    """dq = scale ds k and dk = scale ds^T q, with ds = p (dout v^T - Di) a difference of terms
    of the size of |dout| |v|^T that cancel (exactly when Tq = Tk = 1: out = v, so dq and dk are
    pure rounding): their absolute tolerance is scaled to those terms (G of them summed for
    dk)."""
    dout, scale = rest[-2:]
    G = q.shape[1] // max(k.shape[1], 1)
    vr = np.abs(np.repeat(f64(v), G, axis=1))
    terms = scale * float((np.abs(f64(dout)) @ vr.swapaxes(-1, -2)).max(initial=0.0))
    return G * terms * np.abs(f64(k)).max(initial=0.0), G * terms * np.abs(f64(q)).max(initial=0), 0


def heads(put, dtype, B, H, Hkv, Tq, Tk, D, direction):
    """q and dout (B, H, Tq, D) as views of (B, Tq, H, D); k and v (B, Hkv, Tk, D), views of
    (B, Tk, Hkv, D) too for multi-head attention (GPT-2's), contiguous for grouped-query
    (a KV cache's); the backward's out and lse are the CPU forward's."""
    q, dout = (rand((B, Tq, H, D), dtype, seed=s) for s in (1, 2))
    if H == Hkv:
        k, v = (rand((B, Tk, Hkv, D), dtype, seed=s) for s in (3, 4))
    else:
        k, v = (rand((B, Hkv, Tk, D), dtype, seed=s).swapaxes(1, 2) for s in (3, 4))
    args = [put(a).swapaxes(1, 2) for a in (q, k, v)] + [0.125]  # a view of put(k.T): k
    if direction == "fwd":
        return tuple(args)
    out, lse = cpu.flash_attention_fwd(*(a.swapaxes(1, 2) for a in (q, k, v)), 0.125)
    if Tq == 0:
        np.full(4 * k.size + 64, np.nan)  # a freed buffer of NaNs, for np.empty to find
    return (*args[:3], put(out), put(lse), put(dout).swapaxes(1, 2), 0.125)


# (Tq, Tk) of multi-head attention at D = 64, GPT-2's head size, ragged against the blocks (64,
# and 32 in fp64): T = 1, 63, 65, 130, a decode step, a prompt after a cache
MHA = [(1, 1), (63, 63), (65, 65), (130, 130), (1, 130), (20, 150)]
# (H, Hkv, Tq, Tk) of grouped-query (G = 2) and multi-query attention at D = 32
GQA = [(H, Hkv, *t) for H, Hkv in [(4, 2), (3, 1)] for t in [(65, 65), (1, 70), (20, 100)]]
# (B, H, Hkv, Tq, Tk, D): ragged head dims
RAGGED = [(1, 1, 1, 130, 130, 24), (1, 1, 1, 20, 150, 8), (1, 3, 1, 1, 70, 16)]
# (B, H, Tq, Tk): no batch, no heads (nothing launched: a grid of 0 is invalid), no queries (no
# key seen: dk = dv = 0, not uninitialized memory) at D = 16
EMPTY = [(0, 3, 5, 5), (2, 0, 5, 5), (2, 3, 0, 5), (2, 3, 0, 0)]
SHAPES = (
    [(2, 3, 3, *t, 64) for t in MHA]
    + [(2, *g, 32) for g in GQA]
    + RAGGED
    + [(B, H, H, Tq, Tk, 16) for B, H, Tq, Tk in EMPTY]
)
CASES = [
    *cases(
        "flash_attention_fwd",
        heads,
        [(d, *s, "fwd") for d in FLOATS for s in SHAPES],
        ref=flash_fwd_ref,
    ),
    *cases(
        "flash_attention_bwd",
        heads,
        [(d, *s, "bwd") for d in FLOATS for s in SHAPES],
        ref=flash_bwd_ref,
        magnitude=cancelling_terms,
        repeatable=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel(case, check):
    check(case)


# ---------------------------------------------------------------- what a case cannot say


@pytest.mark.parametrize("dtype", FLOATS, ids=dtypes.name)
@pytest.mark.parametrize("H,Hkv,Tq,Tk", GQA, ids=str)
def test_cuda_grouped_query_is_the_repeated_kv_heads(cuda_device, dtype, H, Hkv, Tq, Tk):
    """The forward and dq of k and v with Hkv heads are those of k and v repeated to H heads,
    bit for bit (each block reads its kv head as the repeat would give it); dk, dv are the
    repeat's summed over each group, up to rounding (one block sums the G heads, in acc_t)."""
    gpu, G = cuda_device, H // Hkv
    q, k, v, out, lse, dout, scale = heads(np.asarray, dtype, 2, H, Hkv, Tq, Tk, 32, "bwd")
    kr, vr = (np.repeat(a, G, axis=1) for a in (k, v))
    grouped = gpu.flash_attention_fwd(*map(gpu.asarray, (q, k, v)), scale)
    repeated = gpu.flash_attention_fwd(*map(gpu.asarray, (q, kr, vr)), scale)
    for a, b in zip(grouped, repeated):
        assert gpu.to_numpy(a).tobytes() == gpu.to_numpy(b).tobytes()
    got = gpu.flash_attention_bwd(*map(gpu.asarray, (q, k, v, out, lse, dout)), scale)
    dq, dk, dv = gpu.flash_attention_bwd(*map(gpu.asarray, (q, kr, vr, out, lse, dout)), scale)
    assert gpu.to_numpy(got[0]).tobytes() == gpu.to_numpy(dq).tobytes()
    size = cancelling_terms(q, k, v, out, lse, dout, scale)[1]
    for g, full in zip(got[1:], (dk, dv)):
        summed = f64(gpu.to_numpy(full)).reshape(2, Hkv, G, Tk, 32).sum(2).astype(dtype)
        close(gpu.to_numpy(g), summed, magnitude=size)


@pytest.mark.parametrize("dtype", FLOATS, ids=dtypes.name)
def test_cuda_head_dim_128(cuda, cuda_device, dtype):
    """D = 128 needs up to 232 KB of shared memory per block in fp32 (the backward's dk/dv
    kernel): run where the device's opt-in limit allows it (an H200's 227 KB), refused with
    the limit named where it does not (an A100's 163 KB)."""
    gpu, runtime = cuda_device, cuda.xp.cuda.runtime
    args = heads(np.asarray, dtype, 1, 2, 2, 70, 70, 128, "bwd")
    q, k, v = args[:3]
    acc, tile = dtypes.compute_dtype(dtype).itemsize, 32 if dtype == F64 else 64
    need = (6 * tile * (128 + 1) + 2 * tile * (tile + 1) + 2 * tile) * acc  # dk/dv's tiles
    optin = runtime.getDeviceAttribute(runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin, 0)
    for got, want in zip(gpu.flash_attention_fwd(*map(gpu.asarray, (q, k, v)), 0.125), args[3:5]):
        close(gpu.to_numpy(got), want)
    on_device = [gpu.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
    if need > optin:
        with pytest.raises(ValueError, match=f"more than the {optin} this GPU"):
            gpu.flash_attention_bwd(*on_device)
        return
    sizes = cancelling_terms(*args)
    for got, want, size in zip(
        gpu.flash_attention_bwd(*on_device), cpu.flash_attention_bwd(*args), sizes
    ):
        close(gpu.to_numpy(got), want, magnitude=size)


def test_cpu_output_has_the_input_dtype_and_lse_is_fp32():
    q, k, v = (rand((1, 2, T, 4), dtypes.bfloat16, seed=s) for s, T in ((1, 5), (2, 9), (3, 9)))
    out, lse = cpu.flash_attention_fwd(q, k, v, 0.5)
    assert (out.dtype, out.shape, lse.dtype, lse.shape) == (q.dtype, q.shape, F32, q.shape[:-1])
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(F32), k.astype(F32)) * 0.5
    s[..., np.triu(np.ones((5, 9), bool), k=9 - 5 + 1)] = -np.inf
    np.testing.assert_allclose(lse, np.log(np.exp(s).sum(-1)), rtol=1e-6)


# A decode step's rows (cpu.py _attention_rows, Tq G <= DECODE_ROWS): (H, Hkv, Tq, Tk) with Tk
# of 1, a key block's end (64) and past it, ragged; Tq = 1, 2, 3; grouped-query heads
DECODE = [
    (2, 2, 1, 1),
    (2, 2, 1, 64),
    (3, 3, 2, 65),
    (2, 2, 3, 130),
    (4, 2, 3, 3),
    (6, 2, 2, 70),
    (4, 1, 1, 129),
]


def decode_inputs(rng, B, H, Hkv, Tq, Tk, D, dtype, length=200):
    """q a (B, H, Tq, D) view of a (B, Tq, 3 H D) projection, transposed; k, v the first Tk
    positions of (B, Hkv, length, D) caches: the strided views a model passes; and dout."""
    qkv = rng.standard_normal((B, Tq, 3 * H * D)).astype(dtype)
    q = qkv[..., : H * D].reshape(B, Tq, H, D).transpose(0, 2, 1, 3)
    k, v = (rng.standard_normal((B, Hkv, length, D)).astype(dtype)[:, :, :Tk] for _ in "kv")
    return q, k, v, rng.standard_normal(q.shape).astype(dtype)


def assert_close(got, ref, tol):
    """Relative to each array's largest value, or to 1 (the inputs' scale) for a zero array."""
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol * max(np.abs(r).max(), 1.0))


@pytest.mark.parametrize("shape", DECODE, ids=str)
def test_cpu_a_decode_step_equals_the_blocks(monkeypatch, shape):
    """out and lse of the rows against those of the query blocks, on contiguous inputs and on
    views whose rows are not contiguous (copied by the kernel)."""
    H, Hkv, Tq, Tk = shape
    q, k, v, _ = decode_inputs(np.random.default_rng(0), 2, H, Hkv, Tq, Tk, 16, F32)
    strided = k[..., ::-1], np.repeat(v, 2, axis=-1)[..., ::2]  # rows reversed, or strided
    got = [cpu.flash_attention_fwd(q, *kv, 0.3) for kv in ((k, v), strided)]
    monkeypatch.setattr(attention_cpu, "DECODE_ROWS", 0)
    for kv, (out, lse) in zip(((k, v), strided), got):
        want = cpu.flash_attention_fwd(*(np.ascontiguousarray(a) for a in (q, *kv)), 0.3)
        assert (out.dtype, lse.dtype, lse.shape) == (F32, F32, q.shape[:-1])
        assert_close([out, lse], want, 1e-5)


def test_cpu_a_long_decode_step_runs_its_rows_across_the_cores(monkeypatch):
    """k of 2^21 elements: prange's kernel (the tests above run its one-core twin)."""
    q, k, v, _ = decode_inputs(np.random.default_rng(0), 2, 4, 2, 1, 1 << 14, 32, F32, 1 << 14)
    out, lse = cpu.flash_attention_fwd(q, k, v, 0.2)
    monkeypatch.setattr(attention_cpu, "DECODE_ROWS", 0)
    assert_close([out, lse], cpu.flash_attention_fwd(q, k, v, 0.2), 1e-5)


@pytest.mark.parametrize("dtype", [F32, F64], ids=dtypes.name)
def test_cpu_decode_rows_add_p_v_in_key_order(dtype):
    """_add_rows (o += p v over a block's keys, four keys a pass over o) gives the bits of the
    key-by-key loop: o + p[0] v[0], then + p[1] v[1], ..., each product rounded (NumPy's fp32
    and fp64 steps), over ragged key counts and head dims."""
    rng = np.random.default_rng(0)
    for n in range(10):
        for D in (1, 7, 16, 33, 64):
            p, v, o = (rng.standard_normal(s).astype(dtype) for s in (n, (n, D), D))
            want = o.copy()
            for c in range(n):
                want = want + p[c] * v[c]
            attention_cpu._add_rows(o, p, v)
            assert o.tobytes() == want.tobytes(), (n, D)


@numba.njit
def exps_then_masked(s, shift, masked):
    """The reference of _exp_after: every exp taken, then the masked ones made 0."""
    for r in range(s.shape[0]):
        s[r] = exp(s[r] - shift[r])
    s[:masked] = 0


@pytest.mark.parametrize("dtype", [F32, F64], ids=dtypes.name)
def test_cpu_block_pairs_skip_the_exps_of_masked_runs_with_the_same_bits(dtype):
    """_exp_after takes no exp for the whole LANES-column runs of the masked columns, and gives
    the bits of an exp of every column with the masked ones made 0, whether the masked scores
    are -inf (the forward's mask writes them) or scores (the backward's)."""
    rng = np.random.default_rng(1)
    for cols in (1, 16, 40, 64):
        for masked, inf in itertools.product(sorted({0, 1, 15, 16, 17, cols // 2, cols}), [0, 1]):
            s, shift = rng.standard_normal((2, cols)).astype(dtype)
            s[: min(masked, cols) * inf] = -np.inf
            want = s.copy()
            exps_then_masked(want, shift, min(masked, cols))
            attention_cpu._exp_after(s, shift, min(masked, cols))
            assert s.tobytes() == want.tobytes(), (cols, masked)
