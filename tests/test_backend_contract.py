"""The backend contract: kernels.KERNELS (and kernels.HOST) is the list of functions every backend
implements. Both backend/cpu.py and backend/cuda.py define each with the same signature, neither
defines a public function outside the list unnoticed, every kernel the packages launch is in
the list, and the launch tables only name listed kernels. cuda.py is imported over the NumPy
stand-in for CuPy (tests/fake_cupy.py), so this runs without a GPU.
"""

import ast
import inspect
from pathlib import Path

import fake_cupy
import pytest

from tinygrad_like import dtypes, kernels
from tinygrad_like.backend import cpu

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("tinygrad_like", "nn", "optim", "training", "scripts", "examples")
# Public functions a backend may have outside the contract, each for a reason of its own.
EXTRAS = {
    "cpu": {
        "keep_freed_memory",  # malloc tuning, at import
        "check_ids",
        "check_targets",
    },  # range checks both backends run on the host
    "cuda": {
        "device_name",
        "PoolWatcher",  # the GPU's name (MFU); CuPy's pool, watched
        "kernel_source",
        "instances",
    },  # the .cu loading (check_kernels.sh uses it)
}


@pytest.fixture(scope="module")
def cuda():
    with fake_cupy.installed() as module:
        yield module


def _shape(fn):
    """What a call site depends on: parameter names, kinds and defaults, in order."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", kernels.KERNELS + kernels.HOST)
def test_both_backends_define_it_with_one_signature(cuda, name):
    for be in (cpu, cuda):
        assert callable(getattr(be, name, None)), f"backend {be.name} has no {name}"
    assert _shape(getattr(cpu, name)) == _shape(getattr(cuda, name)), name


def test_the_lists_have_no_repeats():
    names = kernels.KERNELS + kernels.HOST
    assert len(set(names)) == len(names)


def _public_functions(module):
    """Public callables defined in module itself (not imported into it)."""
    return {
        n
        for n, obj in vars(module).items()
        if callable(obj) and not n.startswith("_") and obj.__module__ == module.__name__
    }


def test_no_backend_has_a_kernel_outside_the_list(cuda):
    """A kernel added to one backend only fails here (or, once listed, in the test above)."""
    listed = set(kernels.KERNELS + kernels.HOST)
    for be in (cpu, cuda):
        assert _public_functions(be) - listed == EXTRAS[be.name], be.name


def _launches():
    """(file:line, kernel name or None when it is not a string literal) of every
    launch(...) / kernels.launch(...) call in the project's code."""
    for path in sorted(p for d in SOURCES for p in (ROOT / d).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            func = getattr(node, "func", None)
            called = getattr(func, "id", None) or getattr(func, "attr", None)
            if isinstance(node, ast.Call) and called == "launch":
                first = node.args[0] if node.args else None
                literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
                yield f"{path.relative_to(ROOT)}:{node.lineno}", first.value if literal else None


def test_every_launched_kernel_is_listed():
    found = list(_launches())
    assert len(found) > 50  # the scan sees ops.py, nn/ and optim/
    assert [site for site, name in found if name is None] == [], "launch names must be literals"
    assert [(site, name) for site, name in found if name not in kernels.KERNELS] == []


def test_every_listed_kernel_is_launched():
    assert set(kernels.KERNELS) - {name for _, name in _launches()} == set()


def test_launch_tables_name_only_listed_kernels():
    for table in (kernels.FLOPS, kernels.WRITES_ARGS, kernels.SKIPS_READING):
        assert set(table) - set(kernels.KERNELS) == set()


def test_supported_dtypes_are_the_training_formats(cuda):
    assert cpu.supported_dtypes() == cuda.supported_dtypes() == dtypes.TRAINING
