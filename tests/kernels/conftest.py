"""The devices the kernel tests run on.

cuda: the CUDA device (its backend module). On a GPU (CuPy sees one) the real one. Without one,
the same backend code over the NumPy stand-in for CuPy (tests/fake_cupy.py), every kernel
executed on the CPU (tests/cuda_on_cpu: each .cu compiled with the C++ compiler, CUDA threads as
fibers, in forward, reverse and shuffled orders); skipped only when there is no C++ compiler
either. The tests of the GPU's own machinery (CUDA graphs, events, the memory pool) are marked
check.gpu_only.
"""

import cuda_on_cpu
import fake_cupy
import pytest

from tinygrad_like import kernels

from . import check as checks
from .check import ON_GPU


@pytest.fixture(scope="module")
def cuda():
    """The CUDA backend: the real one, or the stand-in's with the kernels run on the CPU (all
    .cu files built first, in parallel: the build is cached, by content, across sessions).
    Its xp is CuPy, or the stand-in for it."""
    if ON_GPU:
        from tinygrad_like.backend import cuda

        yield cuda
        return
    if not cuda_on_cpu.available():
        pytest.skip("no CUDA device and no C++ compiler")
    with fake_cupy.installed(execute=True) as module:
        sources = [module.kernel_source(f) for f in module.kernel_files()]
        cuda_on_cpu.build([(src, tuple(module.instances(src))) for src in sources])
        yield module


@pytest.fixture
def cuda_device(cuda):
    """The CUDA device as code running on it sees it (kernels.on): its kernels by name and its
    host functions."""
    return kernels.on(cuda)


@pytest.fixture(params=["cpu", "cuda"])
def device(request):
    """Each device that computes, as code running on it sees it (kernels.on): its kernels by
    name and its host functions (asarray, to_numpy)."""
    if request.param == "cpu":
        return kernels.on("cpu")
    return request.getfixturevalue("cuda_device")


@pytest.fixture(params=["cpu", "cuda", "meta"])
def check(request):
    """check(case) on each device (check.py): the CPU against the case's reference, CUDA
    against the CPU, the meta device's shapes and counts against the CPU's."""
    if request.param == "cuda":
        cuda = request.getfixturevalue("cuda")
        return lambda case: checks.on_cuda(case, cuda)
    return checks.on_cpu if request.param == "cpu" else checks.on_meta


@pytest.fixture(scope="module")
def stand_in():
    """The CUDA backend over the stand-in for CuPy, computing nothing: every launch checked
    (argument packing, launch shapes, the compile list) and recorded in fake_cupy.LAUNCHES."""
    with fake_cupy.installed() as module:
        yield module


@pytest.fixture
def launches(stand_in):
    fake_cupy.LAUNCHES.clear()
    return fake_cupy.LAUNCHES
