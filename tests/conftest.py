"""Shared fixtures for the tinygrad_like tests.

The finite-difference helper lives in tests/gradcheck.py; this file makes it importable as
`from gradcheck import gradcheck` whatever directory pytest is started from.
"""

import dataclasses
import gc
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


# Made-up CPU peaks (round numbers) for the whole session, cached in a folder of its own
# ($XDG_CACHE_HOME): no test measures them in-process or depends on how busy the host is, and
# none writes the user's ~/.cache. Set in pytest_configure, before the test modules are
# imported: some build their subprocesses' environment then (test_faults.ENV). A subprocess
# with other BLAS variables is another machine to the cache (tinygrad_like/peaks.py) and
# measures its own, once, into the same folder. pytest-xdist's workers inherit the controller's
# folder (_CACHE_OWNER names it) rather than each making its own: Numba compiles each kernel
# once for the whole run, not once per worker (its cache and the peaks' are written file by
# file, atomically), and only the controller removes the folder. TG_QUIET=1: a Numba
# compile's announcement ("compiled cpu.<kernel> in N s", printed by whichever test first meets
# a cold cache) would otherwise be a second line beside the one-line errors the tests read.
# TG_BLAS=openblas: the trainer's GEMMs on NumPy's OpenBLAS as it loaded, chosen without
# measuring (gemm_library.py), so that no test spends seconds timing libraries at its step's
# shapes or runs its GEMMs on other kernels (other bits) than the test before it;
# tests/test_gemm_library.py unsets it where it tests the choice.
_SESSION = {}
_CACHE_OWNER = "TINYGRAD_LIKE_TEST_CACHE"


def pytest_configure(config):
    from tinygrad_like import peaks

    made_up = peaks.Peaks(
        device="cpu",
        machine="made-up test machine",
        # above any CPU's: a report's own GEMMs would raise a lower one (peaks.beaten) in the
        # session's cache, and the tests after it would divide by another peak
        matmul={"fp32": 1e14},
        copy_bw=1e10,
        read_bw=5e9,
        exp_rate=1e9,
        launch_s=1e-6,
        how=dict.fromkeys(("matmul_fp32", "copy", "read", "exp", "launch"), "made up"),
        when="the tests' start",
    )
    names = ("XDG_CACHE_HOME", peaks.REMEASURE, "TG_QUIET", "TG_BLAS", _CACHE_OWNER)
    _SESSION.update(peaks=made_up, env={k: os.environ.get(k) for k in names})
    inherited = os.environ.get(_CACHE_OWNER) if os.environ.get("PYTEST_XDIST_WORKER") else None
    _SESSION["folder"] = inherited or tempfile.mkdtemp(prefix="tinygrad_like-test-cache-")
    _SESSION["owner"] = inherited is None
    os.environ["XDG_CACHE_HOME"] = os.environ[_CACHE_OWNER] = _SESSION["folder"]
    os.environ["TG_QUIET"] = "1"
    os.environ["TG_BLAS"] = "openblas"
    os.environ.pop(peaks.REMEASURE, None)
    if _SESSION["owner"]:
        path = peaks.cache_path("cpu")
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(dataclasses.asdict(made_up)))


def pytest_unconfigure(config):
    for name, value in _SESSION.get("env", {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if _SESSION.get("owner"):
        shutil.rmtree(_SESSION["folder"], ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def _collector_skips_what_lives_on():
    """At each test module's start, the garbage collected and what survives frozen
    (gc.freeze): the compiled kernels, caches and imports a worker holds are never scanned
    again, so the full collections of the memory tracker's readings (memory.settled,
    accounting/measure.py) cost what the test made, not the worker's whole history. What a
    test makes is collected as before; a frozen object that a later module drops in a cycle
    stays."""
    gc.collect()
    gc.freeze()
    yield


@pytest.fixture(scope="session")
def machine_peaks():
    """The session's made-up CPU peaks, the ones the cache holds."""
    return _SESSION["peaks"]


@pytest.fixture
def rng():
    """A fresh, fixed-seed generator per test, so every test is reproducible on its own."""
    return np.random.default_rng(1234)


@pytest.fixture(scope="module")
def one_blas_thread():
    """gpt2-tiny's GEMMs are far too small to gain from a second BLAS thread, and on a busy
    2-core machine OpenBLAS's spinning threads make them up to 100x slower. Modules that train
    tiny models use this (pytestmark) to keep their run time steady; the limit is lifted after
    the module."""
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
