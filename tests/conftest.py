"""Shared fixtures for the tinygrad_like tests.

The finite-difference helper lives in tests/gradcheck.py; this file makes it importable as
`from gradcheck import gradcheck` whatever directory pytest is started from.
"""

import os
import sys

import numpy as np
import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture
def rng():
    """A fresh, fixed-seed generator per test, so every test is reproducible on its own."""
    return np.random.default_rng(1234)


@pytest.fixture(scope="module")
def one_blas_thread():
    """gpt2-tiny's GEMMs are far too small to gain from a second BLAS thread, and on a busy
    2-core machine OpenBLAS's spinning threads make them up to 100x slower. Modules that train
    tiny models use this (pytestmark) to keep their run time steady; the limit is lifted after
    the module. threadpoolctl is optional: without it nothing changes."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(scope="session")
def shakespeare(tmp_path_factory):
    """The default corpus prepared once per session (shared by every test file that asks)."""
    from training.corpus import prepare

    d = tmp_path_factory.getbasetemp() / "shakespeare_data"
    if not (d / "val.bin").is_file():
        prepare(d)
    return str(d)
