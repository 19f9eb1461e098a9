"""The CUDA device: CuPy arrays, the host functions and what the CUDA kernels
(kernels/<family>/cuda.py beside <family>.cu) share (runtime.py: loading a .cu file through
NVRTC with common.cuh pasted in, launch helpers, the memory pool's watcher). Nothing here
imports the CPU device.
"""

import cupy

from .runtime import (  # noqa: F401
    GPU,
    GRAPHS,
    HOLDS_VALUES,
    HOST_MEMORY,
    STEP_OPS,
    PoolWatcher,
    asarray,
    available_bytes,
    capture_graph,
    device_name,
    empty,
    instances,
    kernel_files,
    kernel_source,
    require_values,
    start_timer,
    supported_dtypes,
    synchronize,
    to_numpy,
    total_bytes,
)

name = "cuda"
xp = cupy  # the array module, for code that must allocate on this device
