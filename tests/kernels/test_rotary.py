"""Rotary position embeddings (kernels/rotary), Hugging Face Llama's rotate-half convention,
against the float64 formula: a prompt, a decode step's one row at a later position, one channel
pair, and q as the model passes it ((B, T, H, D) viewed as (B, H, T, D)). The tables cos, sin
are in the compute dtype (fp32, fp64 for fp64); the backward is the opposite turn.
"""

import numpy as np
import pytest

from tinygrad_like import dtypes

from .check import BF16, F16, F32, FLOATS, cases, cpu, f64, rand


def rotary_ref(x, cos, sin):
    """y1 = x1 cos - x2 sin, y2 = x2 cos + x1 sin, x1 and x2 the two halves of D."""
    x, cos, sin = f64(x), f64(cos), f64(sin)
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rotary_bwd_ref(dy, cos, sin):
    return rotary_ref(dy, cos, -f64(sin))


def tables(T, D, start, dtype):
    """cos, sin (T, D/2) of positions start ... start + T - 1, in dtype's compute dtype."""
    angles = np.outer(np.arange(48), 10000.0 ** (-np.arange(0, D, 2) / D))  # (48, D/2)
    acc = dtypes.compute_dtype(dtype)
    return [f(angles)[start : start + T].astype(acc) for f in (np.cos, np.sin)]


def heads(put, dtype, B, H, T, D, start, transposed):
    """x (B, H, T, D), or a view of (B, T, H, D) as the model passes q; the tables."""
    cos, sin = tables(T, D, start, dtype)
    if transposed:
        x = put(rand((B, T, H, D), dtype, seed=2)).transpose(0, 2, 1, 3)
    else:
        x = put(rand((B, H, T, D), dtype, scale=2.0, seed=1))
    return x, put(cos), put(sin)


# (B, H, T, D, start): a prompt, a decode step's row at position 40, one channel pair
SHAPES = [(2, 3, 37, 24, 0), (2, 3, 1, 24, 40), (1, 2, 1, 64, 40), (1, 1, 5, 2, 0)]
GRID = [(d, *s, False) for d in FLOATS for s in SHAPES]
CASES = [
    *cases("rotary_fwd", heads, GRID, ref=rotary_ref),
    *cases(
        "rotary_fwd", heads, [(d, *s, True) for d in FLOATS for s in SHAPES[:2]], ref=rotary_ref
    ),
    *cases("rotary_bwd", heads, GRID, ref=rotary_bwd_ref),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel(case, check):
    check(case)


# ---------------------------------------------------------------- the CPU's rounding


def random_tables(T, h, seed=0):
    angles = np.random.default_rng(seed).uniform(-4, 4, (T, h))
    return np.cos(angles), np.sin(angles)


def test_cpu_against_the_formula_in_float64():
    x, dy = rand((2, 3, 7, 10), np.float64, seed=1), rand((2, 3, 7, 10), np.float64, seed=2)
    cos, sin = random_tables(7, 5)
    np.testing.assert_allclose(cpu.rotary_fwd(x, cos, sin), rotary_ref(x, cos, sin), rtol=1e-15)
    np.testing.assert_allclose(
        cpu.rotary_bwd(dy, cos, sin), rotary_bwd_ref(dy, cos, sin), rtol=1e-15
    )


@pytest.mark.parametrize("dtype", [F16, BF16], ids=dtypes.name)
def test_cpu_half_rounds_once(dtype):
    x = rand((2, 3, 7, 10), dtype)
    cos, sin = (t.astype(F32) for t in random_tables(7, 5))
    for kernel, s in [(cpu.rotary_fwd, sin), (cpu.rotary_bwd, -sin)]:
        y = kernel(x, cos, sin)
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h].astype(F32), x[..., h:].astype(F32)
        want = np.concatenate([x1 * cos - x2 * s, x2 * cos + x1 * s], axis=-1).astype(dtype)
        np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))


def test_cpu_rotary_of_a_strided_view():
    """q of (B, T, H, D) viewed as (B, H, T, D), as the model passes it."""
    x = rand((2, 7, 3, 8), F32).transpose(0, 2, 1, 3)
    cos, sin = (t.astype(F32) for t in random_tables(7, 4))
    np.testing.assert_allclose(
        cpu.rotary_fwd(x, cos, sin), rotary_ref(x, cos, sin), rtol=1e-6, atol=1e-6
    )
