"""The optimizer's kernels over AdamW's flat buffers (optim/adamw.py): the gradient's sum of
squares (for clipping and the fp16 overflow check) and one fused update of every parameter.

cpu.py: cache-sized chunks, one block per core; cuda.py + adamw.cu: fixed partial sums, and an
update that never waits for the host (the overflow skip and the clipping coefficient decided on
the device from norm_sq).
"""

from typing import NamedTuple

import numpy as np

from ... import dtypes
from ..record import Out, kernel, per_element


@kernel(shape=lambda grad: Out((1,), dtypes.compute_dtype(grad.dtype)), flops=per_element(2))
def grad_norm_sq(grad):
    """Sum of squares of a flat gradient buffer in fp32 -> (1,); not finite on overflow."""


class Hyper(NamedTuple):
    """The scalars of one AdamW step, as AdamW sets them."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float  # decoupled, on the first n_decay elements only
    n_decay: int  # the 2-D weights, packed first
    step: int  # 1, 2, ...: the bias corrections' exponent
    inv_scale: float  # 1 / the fp16 loss scale (1.0 without one)
    max_norm: float  # clip the unscaled gradient to this global norm (0: off)


# What adamw_step reads of a step: one fp64 vector, Hyper's fields (in its order, 0 ... 8), then
# what the host derives from them (9 ...), so that both backends round the same fp64 values to
# the master's dtype. AdamW writes it into a device buffer by a host call before the step's
# launches: a CUDA graph of the step reads this step's, never the captured one's.
DECAY, LR_BC1, INV_SQRT_BC2, ONE_MINUS_BETA1, ONE_MINUS_BETA2 = 9, 10, 11, 12, 13
N_CONSTANTS = 14


def constants(h):
    """Hyper h -> (N_CONSTANTS,) fp64: its fields, then the decay factor of the first n_decay
    weights (1 - lr wd, or 1), lr / (1 - beta1^step), 1 / sqrt(1 - beta2^step), 1 - beta1 and
    1 - beta2 (the bias corrections folded into two scalars: update = lr/bc1 m / (sqrt(v) /
    sqrt(bc2) + eps))."""
    bc1, bc2 = 1 - h.beta1**h.step, 1 - h.beta2**h.step
    decay = 1 - h.lr * h.weight_decay if h.weight_decay else 1.0
    derived = (decay, h.lr / bc1, 1 / np.sqrt(bc2), 1 - h.beta1, 1 - h.beta2)
    return np.array([*h, *derived], np.float64)


def hyper_of(c):
    """The Hyper of a host copy of constants c."""
    return Hyper(
        *(int(x) if f in ("n_decay", "step") else float(x) for f, x in zip(Hyper._fields, c))
    )


# master, m, v and the working copy written in place; the working copy is only written (from
# master), not read: 28 bytes per parameter for a 2-byte dtype (read 4 + 2 + 4 + 4, write
# 4 + 4 + 4 + 2), the lecture's "roughly 28 bytes per parameter".
@kernel(shape=lambda *args: None, flops=per_element(12), writes=(0, 2, 3, 4), skips=(4, 6))
def adamw_step(master, grad, m, v, working, norm_sq, constants):
    """One fused AdamW update over flat buffers, in place; returns nothing.
    master, m, v: fp32 (N,). grad: (N,) in the working dtype, multiplied by the loss scale.
    working: the 2-byte copy to refresh from master, or None when master is the working copy.
    norm_sq: (1,) sum of squares of the scaled gradient (grad_norm_sq); if it is not finite
    (overflow) the step is skipped and nothing changes. constants: (N_CONSTANTS,) fp64 on the
    device, constants(the step's Hyper) (its 112 bytes left out of the count). The first n_decay
    elements get weight decay; clipping to max_norm uses the unscaled norm, norm_sq's square
    root times inv_scale."""
