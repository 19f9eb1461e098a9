"""The CUDA backend: every kernel of the contract (backend/contract.py) on CuPy arrays, run by
the project's own kernels in the .cu files beside their modules (compiled with NVRTC through
cupy.RawModule), with CuPy itself where a custom kernel would add nothing.

One module per kernel family, each beside its .cu file: gemm, elementwise, rownorm, softmax,
attention, rotary, embedding, adamw, quant; runtime holds what is not a kernel (the host functions,
loading the .cu files, launch helpers, the memory pool's watcher). Nothing here imports the CPU
backend. The package exposes the contract's names (contract.implement) and the runtime's
device_name, PoolWatcher, kernel_source and instances, and what the device is (GPU,
HOLDS_VALUES, RANKS_SHARE_MEMORY, require_values).
"""

import cupy

from .. import contract
from .runtime import (  # noqa: F401
    GPU,
    HOLDS_VALUES,
    RANKS_SHARE_MEMORY,
    PoolWatcher,
    device_name,
    instances,
    kernel_source,
    require_values,
)

name = "cuda"
xp = cupy  # the array module, for code that must allocate on this device

contract.implement(__name__, globals())
