"""The CPU device: NumPy arrays and the host functions (runtime.py: allocation, malloc's
settings, the thread pool, the BLAS's threads), compiled.py, the Numba machinery the CPU
kernels (kernels/<family>/cpu.py) are written in, and halves.py, their 2-byte conversions. The
CPU kernels are the numerical reference the CUDA kernels are tested against.
"""

import numpy as np

from .runtime import (  # noqa: F401
    GPU,
    GRAPHS,
    HOLDS_VALUES,
    HOST_MEMORY,
    STEP_OPS,
    asarray,
    available_bytes,
    capture_graph,
    empty,
    require_values,
    start_timer,
    supported_dtypes,
    synchronize,
    to_numpy,
    total_bytes,
)

name = "cpu"
xp = np  # the array module, for code that must allocate on this device
