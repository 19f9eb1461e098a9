"""tinygrad_like: a small tape-based autograd for GPT-2 where every FLOP and byte is counted."""

from . import dtypes, functional  # functional: Tensor's operators and methods
from .autograd import TAPE, enable_grad, is_grad_enabled, no_grad
from .backend import default_device
from .rng import get_rng_state, manual_seed, set_rng_state
from .tensor import Tensor

__all__ = [
    "Tensor",
    "no_grad",
    "enable_grad",
    "is_grad_enabled",
    "TAPE",
    "dtypes",
    "functional",
    "default_device",
    "manual_seed",
    "get_rng_state",
    "set_rng_state",
]
