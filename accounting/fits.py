"""A model that does not fit is refused at start, before its first big allocation: the bytes a
run needs follow from its shape (accounting/report.py's predictions), and the memory there is
from the kernel or the GPU. A refusal is one line (DoesNotFit, exit code 2)."""

from nn.lm import kv_bytes_per_element
from tinygrad_like import backend, dtypes

from . import predictions


class DoesNotFit(ValueError):
    """What a run needs is more than the memory available."""


def check(needed, device, what, fix):
    """DoesNotFit when needed bytes exceed the memory available on device; what needs them
    and fix (what to change) are words for the one line. The meta device allocates nothing:
    whatever it counts fits."""
    have = backend.get(device).available_bytes()
    if have is not None and needed > have:
        raise DoesNotFit(
            f"{what} needs about {needed / 1e9:,.2f} GB and {device} has {have / 1e9:,.2f} GB "
            f"available: {fix}"
        )


def generation_bytes(config, dtype, tokens, device, kv_dtype=None, batch=1, stored=None):
    """Loading a checkpoint and generating `tokens` positions of `batch` sequences: the fp32
    model as built, beside the file's fp32 arrays (on a CPU) or its cast to dtype (on a GPU,
    the arrays are on the host), and the KV cache's keys and values in kv_dtype (default
    dtype; an fp8 format's codes and scales, nn/lm.py kv_bytes_per_element). stored: the bytes
    of a quantized checkpoint's tensors, which become the model as they are read (on a GPU,
    copied from the host), no fp32 model built."""
    size, host = dtypes.as_dtype(dtype).itemsize, backend.get(device).HOST_MEMORY
    kv_size = kv_bytes_per_element(kv_dtype or dtype, config.head_dim)
    if stored is not None:
        weights = stored * (1 if host else 2)
    else:
        weights = predictions.stored_elements(config) * (4 + (4 if host else size))
    return weights + batch * tokens * config.kv_cache_bytes_per_token(kv_size)
