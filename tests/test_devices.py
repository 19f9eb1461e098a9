"""What differs by device is the device's to say (its backend's runtime.py, asked through
backend.get(name) or backend.of(array)), and a program resolves its device once, where it
reads its command line (backend.resolve)."""

import re
from pathlib import Path

import fake_cupy
import numpy as np
import pytest

from tinygrad_like import backend
from tinygrad_like.backend import cpu, meta
from tinygrad_like.backend.meta import NoValues

ROOT = Path(__file__).resolve().parents[1]
# tests of a device by its name, or the meta device's refusal raised by name, outside the
# backends; torch_gpt2.py's are PyTorch's own device types
BY_NAME = re.compile(r'[=!]= "(cpu|cuda|meta)"|NoValues\(')
TORCHS = {"scripts/torch_gpt2.py"}


def test_each_device_says_what_it_is():
    with fake_cupy.installed() as cuda:
        facts = {be.name: (be.HOLDS_VALUES, be.GPU, be.HOST_MEMORY) for be in (cpu, cuda, meta)}
        cuda.require_values("a loss")
    assert facts == {
        "cpu": (True, False, True),
        "cuda": (True, True, False),
        "meta": (False, False, False),
    }
    cpu.require_values("a loss")  # holds values: nothing to refuse
    with pytest.raises(NoValues, match="shapes, not values: a loss needs the values"):
        meta.require_values("a loss")
    host = [[1, 2]], np.zeros(2), cpu.empty((2,), np.float32)
    assert all(backend.holds_values(data) for data in host)
    assert not backend.holds_values(meta.empty((2,), np.float32))


def test_a_device_is_resolved_and_checked_in_one_place():
    assert backend.resolve() == backend.default_device() in backend.DEVICES
    assert [backend.resolve(d) for d in ("cpu", "meta")] == ["cpu", "meta"]
    with pytest.raises(ValueError, match="unknown device 'tpu': use one of cpu, cuda, meta"):
        backend.resolve("tpu")
    if not backend.cuda_available():
        with pytest.raises(RuntimeError, match="no GPU is usable"):
            backend.resolve("cuda")


def test_no_device_is_tested_by_name_outside_the_backends():
    packages = ("tinygrad_like", "nn", "optim", "training", "accounting", "scripts", "examples")
    found = [
        f"{name}:{n}: {line.strip()}"
        for path in sorted(p for top in packages for p in (ROOT / top).rglob("*.py"))
        if not (name := path.relative_to(ROOT).as_posix()).startswith("tinygrad_like/backend/")
        and name not in TORCHS
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if BY_NAME.search(line.split("#")[0])
    ]
    assert not found, "\n".join(found)
