"""The backend contract (backend/contract.py) holds: backend/cpu, backend/cuda and backend/meta
define every declared kernel in the module of its family, and every host function in runtime,
with the stub's signature; no family module has a public function outside the contract
unnoticed; every kernel the packages launch is declared and every declared kernel is launched;
the CUDA and meta backends import nothing from the CPU backend. The CUDA package is imported
over the NumPy stand-in for CuPy (tests/fake_cupy.py), so this runs without a GPU.
"""

import ast
import importlib
import inspect
from pathlib import Path

import fake_cupy
import pytest

from tinygrad_like import dtypes
from tinygrad_like.backend import contract, cpu, meta

ROOT = Path(__file__).resolve().parents[1]
BACKEND = ROOT / "tinygrad_like" / "backend"
SOURCES = ("tinygrad_like", "nn", "optim", "training", "scripts", "examples")
FAMILIES = sorted({k.family for k in contract.KERNELS.values()})
# Public functions a family module may have outside the contract, each for a reason of its own:
# the CPU quant kernels' decode functions, named as quant.cu's device functions (their twins),
# the fp8 KV cache's encoder, kvcache.cu's minifloat_code, and the online softmax of a key
# block that the CPU attention's decode rows share with the fp8 cache's qattention.
EXTRAS = {
    ("cpu", "attention"): {"softmax_block"},
    ("cpu", "kvcache"): {"minifloat_code"},
    ("cpu", "quant"): {
        "int8_value",
        "int4_value",
        "int4_float",
        "minifloat_value",
        "minifloat_scale",
        "element_value",
        "nibble_value",
        "decode_row",
    },
}


@pytest.fixture(scope="module")
def cuda():
    with fake_cupy.installed() as module:
        yield module


def _shape(fn):
    """What a call site depends on: parameter names, kinds and defaults, in order."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def _module(backend, where):
    return importlib.import_module(f"{backend.__name__}.{where}")


@pytest.mark.parametrize("name", list(contract.KERNELS))
def test_every_backend_defines_the_kernel_in_its_family_with_its_signature(cuda, name):
    k = contract.KERNELS[name]
    for be in (cpu, cuda, meta):
        fn = getattr(_module(be, k.family), name, None)
        assert callable(fn), f"{be.__name__}.{k.family} has no {name}"
        assert getattr(be, name) is fn
        assert _shape(fn) == _shape(k.signature), f"{be.name}.{name}"


@pytest.mark.parametrize("name", list(contract.HOST))
def test_every_backend_defines_the_host_function_in_runtime(cuda, name):
    for be in (cpu, cuda, meta):
        fn = getattr(_module(be, "runtime"), name)
        assert getattr(be, name) is fn
        assert _shape(fn) == _shape(contract.HOST[name]), f"{be.name}.{name}"


def test_the_names_have_no_repeats():
    assert not set(contract.KERNELS) & set(contract.HOST)


def _public_functions(module):
    """Public callables defined in module itself (not imported into it)."""
    return {
        n
        for n, obj in vars(module).items()
        if callable(obj) and not n.startswith("_") and obj.__module__ == module.__name__
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_no_family_module_has_a_kernel_outside_the_contract(cuda, family):
    """A kernel added to one backend only fails here (or, once declared, in the tests above)."""
    declared = {k.name for k in contract.KERNELS.values() if k.family == family}
    for be in (cpu, cuda, meta):
        extra = _public_functions(_module(be, family)) - declared
        assert extra == EXTRAS.get((be.name, family), set()), f"{be.name}.{family}"


def test_each_cuda_family_has_its_cu_file():
    for family in FAMILIES:
        assert (BACKEND / "cuda" / f"{family}.cu").is_file(), family


@pytest.mark.parametrize("backend", ["cuda", "meta"])
def test_the_other_backends_import_nothing_of_the_cpu_backend(backend):
    for path in sorted((BACKEND / backend).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
                assert not any(n == "cpu" or n.endswith(".cpu") for n in names), path.name


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


def test_every_launched_kernel_is_declared():
    found = list(_launches())
    assert len(found) > 50  # the scan sees ops.py, nn/ and optim/
    assert [site for site, name in found if name is None] == [], "launch names must be literals"
    assert [(site, name) for site, name in found if name not in contract.KERNELS] == []


def test_every_declared_kernel_is_launched():
    assert set(contract.KERNELS) - {name for _, name in _launches()} == set()


def test_a_missing_kernel_fails_at_import(tmp_path, monkeypatch):
    """contract.implement names the module where a kernel that is not there belongs."""
    pkg = tmp_path / "halfbackend"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for family in FAMILIES + ["runtime"]:
        (pkg / f"{family}.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="halfbackend.gemm has no matmul"):
        contract.implement("halfbackend", {})


def test_supported_dtypes_are_the_training_formats(cuda):
    assert cpu.supported_dtypes() == cuda.supported_dtypes() == dtypes.TRAINING
    # fp16 trains with a loss scaler whose overflow skip reads the gradient norm: no values
    assert meta.supported_dtypes() == tuple(d for d in dtypes.TRAINING if d != "fp16")
