"""Every kernel on the meta device: its record's shape rule, run on arrays that carry a shape and
a dtype and no data (backend/meta/array.py MetaArray). A kernel returns what its CPU twin
returns, with the same shapes and dtypes, the same tuples, and the same arguments back where the
CPU kernel returns one it wrote in place (copy, fill, out=), without computing or reading
anything; so kernels.launch counts FLOPs, bytes and exps and the memory tracker counts every
buffer's birth and death exactly as on the CPU, while nothing is allocated.
"""

from ..backend.meta import MetaArray
from .record import Out


def made(result):
    """A shape rule's answer as the meta device's arrays: each Out a new MetaArray, an argument
    returned as it is."""
    if isinstance(result, Out):
        return MetaArray(result.shape, result.dtype)
    if isinstance(result, tuple):
        return tuple(made(r) for r in result)
    return result


def shape_only(k):
    """Kernel k (a record) on the meta device."""

    def run(*args, **kwargs):
        return made(k.shape(*args, **kwargs))

    run.__name__ = run.__qualname__ = k.name
    run.__doc__ = k.signature.__doc__
    return run
