"""The CPU backend: every kernel of the contract (backend/contract.py) in NumPy, or as a loop
compiled by Numba (compiled.py) where NumPy would make one pass per operator: the
numerical reference the CUDA backend is tested against.

One module per kernel family, named as the .cu files are and each beside its CUDA twin in
reading order: gemm, elementwise, rownorm, softmax, attention, rotary, embedding, adamw;
runtime holds what is not a kernel (the host functions, malloc's settings, the thread pool, the
BLAS's threads). The package exposes the contract's names, gathered by contract.implement, and
what the device is (runtime's GPU, HOLDS_VALUES, RANKS_SHARE_MEMORY, require_values).
"""

import numpy as np

from .. import contract
from .runtime import GPU, HOLDS_VALUES, RANKS_SHARE_MEMORY, require_values  # noqa: F401

name = "cpu"
xp = np  # the array module, for code that must allocate on this device

contract.implement(__name__, globals())
