"""The kernels' declarations hold. Every record of kernels.KERNELS (kernels/<family>/spec.py) is
implemented on the CPU and on CUDA (kernels/<family>/cpu.py and cuda.py) under its name, with
its stub's signature, and run by the meta device as its shape rule; every device has every host
function (backend/host.py) in its runtime, with its signature; no family module has a public
function outside its spec unnoticed; each family has its .cu file; the CUDA and meta code
imports nothing of the CPU's; every kernel the project launches is declared, every declared
kernel is launched, and every declared kernel has its cases in tests/kernels/test_<family>.py.
The CUDA modules are imported over the NumPy stand-in for CuPy (tests/fake_cupy.py), so this
runs without a GPU.
"""

import ast
import importlib
import inspect
import sys
import types
from pathlib import Path

import pytest

from tinygrad_like import dtypes, kernels
from tinygrad_like.backend import cpu, meta
from tinygrad_like.backend.host import FACTS, HOST
from tinygrad_like.kernels.elementwise import cuda_source
from tinygrad_like.kernels.record import KERNELS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tinygrad_like"
SOURCES = ("tinygrad_like", "nn", "optim", "training", "accounting", "scripts", "examples")
FAMILIES = sorted({k.family for k in KERNELS.values()})
# Public functions a family module may have outside its spec, each for a reason of its own: the
# CPU quant kernels' decode functions, named as quant.cu's device functions (their twins), the
# fp8 KV cache's encoder, kvcache.cu's minifloat_code, and the online softmax of a key block
# that the CPU attention's decode rows share with the fp8 cache's qattention.
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


def _shape(fn):
    """What a call site depends on: parameter names, kinds and defaults, in order."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def _module(family, device):
    return importlib.import_module(f"{kernels.__name__}.{family}.{device}")


@pytest.mark.parametrize("name", list(KERNELS))
def test_every_kernel_is_implemented_on_every_device_with_its_signature(stand_in, name):
    k = KERNELS[name]
    for device, be in (("cpu", cpu), ("cuda", stand_in)):
        fn = getattr(_module(k.family, device), name, None)
        assert callable(fn), f"kernels/{k.family}/{device}.py has no {name}"
        assert getattr(kernels.on(be), name) is fn
        assert _shape(fn) == _shape(k.signature), f"{device}: {name}"
    on_meta = getattr(kernels.on("meta"), name)
    assert (on_meta.__name__, on_meta.__doc__) == (name, k.signature.__doc__)


@pytest.mark.parametrize("fn", HOST, ids=lambda f: f.__name__)
def test_every_device_has_the_host_function_in_its_runtime(stand_in, fn):
    for be in (cpu, stand_in, meta):
        found = getattr(be, fn.__name__)
        assert found is getattr(importlib.import_module(f"{be.__name__}.runtime"), fn.__name__)
        assert getattr(kernels.on(be), fn.__name__) is found
        assert _shape(found) == _shape(fn), f"{be.name}.{fn.__name__}"


@pytest.mark.parametrize("fact", FACTS)
def test_every_device_says_each_fact_in_its_runtime(stand_in, fact):
    for be in (cpu, stand_in, meta):
        found = getattr(be, fact)
        assert isinstance(found, bool), f"{be.name}.{fact}"
        assert found is getattr(importlib.import_module(f"{be.__name__}.runtime"), fact)


def test_the_names_have_no_repeats():
    assert not set(KERNELS) & {f.__name__ for f in HOST}


def _public_functions(module):
    """Public callables defined in module itself (not imported into it)."""
    return {
        n
        for n, obj in vars(module).items()
        if callable(obj) and not n.startswith("_") and obj.__module__ == module.__name__
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_no_family_module_has_a_kernel_outside_its_spec(stand_in, family):
    """A kernel added to one device only fails here (or, once declared, in the tests above)."""
    declared = {k.name for k in KERNELS.values() if k.family == family}
    for device in ("cpu", "cuda"):
        extra = _public_functions(_module(family, device)) - declared
        assert extra == EXTRAS.get((device, family), set()), f"kernels/{family}/{device}.py"


def test_each_family_has_its_cu_file_and_the_runtime_serves_the_generated_ones(stand_in):
    for family in FAMILIES:
        assert (PACKAGE / "kernels" / family / f"{family}.cu").is_file(), family
    generated = list(cuda_source.SOURCES)  # elementwise's expressions.cu
    assert stand_in.kernel_files() == sorted([f"{family}.cu" for family in FAMILIES] + generated)


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            yield from [node.module or ""] + [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            yield from [a.name for a in node.names]


CUDA_AND_META = sorted(
    [*PACKAGE.glob("kernels/*/cuda.py"), PACKAGE / "kernels" / "meta.py"]
    + [*(PACKAGE / "backend" / "cuda").glob("*.py"), *(PACKAGE / "backend" / "meta").glob("*.py")]
)


@pytest.mark.parametrize("path", CUDA_AND_META, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_cuda_and_meta_code_imports_nothing_of_the_cpu(path):
    assert not [n for n in _imports(path) if n == "cpu" or n.endswith(".cpu")]


def _launches():
    """(file:line, kernel name or None when it is not a string literal) of every
    launch(...) / kernels.launch(...) call in the project's code (a CUDA graph's
    graph.launch(stream) is CuPy's, not the launch point)."""
    for path in sorted(p for d in SOURCES for p in (ROOT / d).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            func = getattr(node, "func", None)
            called = getattr(func, "id", None) or getattr(func, "attr", None)
            owner = getattr(getattr(func, "value", None), "id", "kernels")
            if isinstance(node, ast.Call) and called == "launch" and owner == "kernels":
                first = node.args[0] if node.args else None
                literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
                yield f"{path.relative_to(ROOT)}:{node.lineno}", first.value if literal else None


def test_every_launched_kernel_is_declared():
    found = list(_launches())
    assert len(found) > 50  # the scan sees functions.py, nn/ and optim/
    assert [site for site, name in found if name is None] == [], "launch names must be literals"
    assert [(site, name) for site, name in found if name not in KERNELS] == []


def test_every_declared_kernel_is_launched():
    assert set(KERNELS) - {name for _, name in _launches()} == set()


def test_every_kernel_has_its_cases():
    """tests/kernels/test_<family>.py's CASES launch each of the family's kernels."""
    for family in FAMILIES:
        tested = {
            case.kernel for case in importlib.import_module(f"{__package__}.test_{family}").CASES
        }
        declared = {k.name for k in KERNELS.values() if k.family == family}
        assert tested == declared, f"tests/kernels/test_{family}.py"


def test_a_missing_kernel_fails_when_the_device_is_gathered(monkeypatch):
    """kernels.on names the module where a kernel that is not there belongs."""
    device = types.ModuleType("halfdevice")
    device.name = "halfdevice"
    for fn in HOST:
        setattr(device, fn.__name__, getattr(cpu, fn.__name__))
    for fact in FACTS:
        setattr(device, fact, getattr(cpu, fact))
    for family in FAMILIES:
        name = f"{kernels.__name__}.{family}.halfdevice"
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    first = next(iter(KERNELS.values()))
    with pytest.raises(ImportError, match=f"{first.family}.halfdevice has no {first.name}, "):
        kernels.on(device)


def test_supported_dtypes_are_the_training_formats(stand_in):
    assert cpu.supported_dtypes() == stand_in.supported_dtypes() == dtypes.TRAINING
    # fp16 trains with a loss scaler whose overflow skip reads the gradient norm: no values
    assert meta.supported_dtypes() == tuple(d for d in dtypes.TRAINING if d != "fp16")
