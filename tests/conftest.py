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
