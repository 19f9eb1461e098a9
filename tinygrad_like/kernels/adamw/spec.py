"""The optimizer's kernels over AdamW's flat buffers (optim/adamw.py): the gradient's sum of
squares (for clipping and the fp16 overflow check) and one fused update of every parameter.

cpu.py: cache-sized chunks, one block per core; cuda.py + adamw.cu: fixed partial sums, and an
update that never waits for the host (the overflow skip and the clipping coefficient decided on
the device from norm_sq).
"""

from typing import NamedTuple

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


# master, m, v and the working copy written in place; the working copy is only written (from
# master), not read: 28 bytes per parameter for a 2-byte dtype (read 4 + 2 + 4 + 4, write
# 4 + 4 + 4 + 2), the lecture's "roughly 28 bytes per parameter".
@kernel(shape=lambda *args: None, flops=per_element(12), writes=(0, 2, 3, 4), skips=(4,))
def adamw_step(master, grad, m, v, working, norm_sq, hyper):
    """One fused AdamW update over flat buffers, in place; returns nothing.
    master, m, v: fp32 (N,). grad: (N,) in the working dtype, multiplied by the loss scale.
    working: the 2-byte copy to refresh from master, or None when master is the working copy.
    norm_sq: (1,) sum of squares of the scaled gradient (grad_norm_sq); if it is not finite
    (overflow) the step is skipped and nothing changes. hyper: the step's Hyper. The first
    n_decay elements get weight decay; clipping to max_norm uses the unscaled norm, norm_sq's
    square root times inv_scale."""
