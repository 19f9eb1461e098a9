"""The device functions the CPU kernels share (backend/cpu/compiled.py): fp32 exp against the
exact value, and fma rounded once."""

import numba
import numpy as np
from numba import prange

from tinygrad_like.backend.cpu.compiled import exp, fma


@numba.njit(error_model="numpy")
def _exps(x, out):
    for i in prange(x.shape[0]):
        out[i] = exp(x[i])


@numba.njit(error_model="numpy")
def _fmas(a, b, c, out):
    for i in range(a.shape[0]):
        out[i] = fma(a[i], b[i], c[i])


def test_fp32_exp_is_within_about_an_ulp_of_the_exact_value():
    x = np.concatenate(
        [
            np.linspace(-87.3, 88.7, 1 << 20, dtype=np.float32),
            np.random.default_rng(0).standard_normal(1 << 16).astype(np.float32) * 4,
        ]
    )
    y = np.empty_like(x)
    _exps(x, y)
    exact = np.exp(x.astype(np.float64))
    normal = exact > np.finfo(np.float32).tiny
    ulps = np.abs(y[normal] - exact[normal]) / np.spacing(exact[normal].astype(np.float32))
    assert ulps.max() <= 1.05


def test_fp32_exp_past_its_range_and_of_specials():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 88.8, 89.0, -87.31, -104.0], np.float32)
    y = np.empty_like(x)
    _exps(x, y)
    assert np.isnan(y[0])
    np.testing.assert_array_equal(y[1:], [np.inf, 0, 1, 1, np.inf, np.inf, 0, 0])


def test_fma_rounds_once():
    """a b - round(a b) is the product's rounding error, which a multiply then an add loses."""
    a = np.float32(1) + np.spacing(np.float32(1)) * np.arange(1, 65, dtype=np.float32)
    b = a[::-1].copy()
    product = a * b  # rounded
    out = np.empty_like(a)
    _fmas(a, b, -product, out)
    exact = a.astype(np.float64) * b.astype(np.float64) - product.astype(np.float64)
    np.testing.assert_array_equal(out, exact.astype(np.float32))
    assert np.any(out != 0)
