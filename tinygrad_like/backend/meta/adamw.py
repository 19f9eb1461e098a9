"""The optimizer's kernels on the meta device (adamw.py's shapes): the sum of squares (1,) in
the compute dtype, and an update in place that returns nothing, as the CPU's."""

from ... import dtypes
from .runtime import new


def grad_norm_sq(grad):
    return new((1,), dtypes.compute_dtype(grad.dtype))


def adamw_step(
    master,
    grad,
    m,
    v,
    working,
    norm_sq,
    *,
    lr,
    beta1,
    beta2,
    eps,
    weight_decay,
    n_decay,
    step,
    inv_scale,
    max_norm,
):
    """Nothing to update: the step's counts are its arguments' bytes (contract.adamw_step)."""
