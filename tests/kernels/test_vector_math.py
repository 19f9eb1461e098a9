"""The device functions the CPU kernels share (backend/cpu/vector_math.py): fp32 exp and log
against the exact value, and fma rounded once."""

import numba
import numpy as np
from numba import prange

from tinygrad_like.backend.cpu.vector_math import exp, fma, log


@numba.njit(error_model="numpy")
def _exps(x, out):
    for i in prange(x.shape[0]):
        out[i] = exp(x[i])


@numba.njit(error_model="numpy")
def _logs(x, out):
    for i in prange(x.shape[0]):
        out[i] = log(x[i])


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


def test_fp32_log_is_within_about_an_ulp_of_the_exact_value():
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            np.exp(rng.uniform(-87, 88, 1 << 18)).astype(np.float32),
            np.linspace(0.5, 2, 1 << 18, dtype=np.float32),
            (rng.uniform(0, 1, 1 << 12) * 1e-38).astype(np.float32),  # subnormals
        ]
    )
    y = np.empty_like(x)
    _logs(x, y)
    exact = np.log(x.astype(np.float64))
    finite = np.isfinite(exact)
    ulps = np.abs(y - exact)[finite] / np.spacing(np.abs(exact[finite]).astype(np.float32))
    assert ulps.max() <= 1.05
    specials = np.array([0.0, -0.0, -1.0, np.inf, -np.inf, np.nan, 1.0], np.float32)
    y = np.empty_like(specials)
    _logs(specials, y)
    np.testing.assert_array_equal(y, [-np.inf, -np.inf, np.nan, np.inf, np.nan, np.nan, 0.0])


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
