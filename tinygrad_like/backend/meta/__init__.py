"""The meta backend: every kernel of the contract (backend/contract.py) on arrays that carry a
shape and a dtype and no data (array.MetaArray). Each kernel returns outputs of the shapes and
dtypes its CPU twin returns, without computing, so kernels.launch counts FLOPs, bytes and exps
and the memory tracker counts every buffer's birth and death exactly as on the CPU, while
nothing is allocated: gpt2-xl's training step at B = 1, T = 1024 (a 28 GB peak) is counted in
under a second in 50 MB of host memory.

What needs values is refused with array.NoValues (a RuntimeError): a loss, a gradient norm, the
fp16 loss scaler's overflow skip, ids read from a token file.

One module per kernel family, as backend/cpu: gemm, elementwise, rownorm, softmax, attention,
embedding, adamw; runtime holds the host functions; array the MetaArray and the `xp` functions
(broadcast_to, split) that make views of it.
"""

from .. import contract
from . import array as xp  # noqa: F401 (the array module, for code that must make views)
from .array import MetaArray, NoValues  # noqa: F401
from .runtime import GPU, HOLDS_VALUES, RANKS_SHARE_MEMORY, require_values  # noqa: F401

name = "meta"

contract.implement(__name__, globals())
