"""The meta device: arrays that carry a shape and a dtype and no data (array.MetaArray), and the
host functions (runtime.py). Its kernels are the records' shape rules (kernels/meta.py), so
kernels.launch counts FLOPs, bytes and exps and the memory tracker counts every buffer's birth
and death exactly as on the CPU, while nothing is allocated: gpt2-xl's training step at B = 1,
T = 1024 (a 28 GB peak) is counted in under a second in 50 MB of host memory.

What needs values is refused with array.NoValues (a RuntimeError): a loss, a gradient norm, the
fp16 loss scaler's overflow skip, ids read from a token file.
"""

from . import array as xp  # noqa: F401 (the array module, for code that must make views)
from .array import MetaArray, NoValues  # noqa: F401
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

name = "meta"
