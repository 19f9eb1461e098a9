"""The record a kernel is declared with, once, in its family's spec.py.

A family is a folder, kernels/<family>/: spec.py declares its kernels (below), cpu.py and cuda.py
(beside <family>.cu) implement them under the same names and signatures, and the meta device
runs each record's shape rule (kernels/meta.py). A record is a stub, its name, signature and
docstring, decorated with:
- shape(*args, **kwargs): what the kernel returns, without computing it: an Out(shape, dtype) for
  each new array, an argument itself where the kernel returns one it wrote in place (copy, fill,
  out=), a tuple of these for several outputs, None for none. It raises what the kernels raise
  for operands that do not fit (NumPy's broadcasting errors). The meta device's outputs are these;
  the tests hold the CPU and CUDA kernels' outputs to them.
- how a launch is counted (kernels.count):
  flops(result, *args, **kwargs), from the shapes: a GEMM counts one multiply and one add per term
  (2 M K N, plus M N for a fused bias); elementwise and row kernels count arithmetic per element
  (exp, tanh and sqrt count as 1; a kernel declared by its expression, elementwise/expr.py,
  counts each operation of it); data movement (gathers, casts, copies) counts 0, only bytes.
  exps(result, *args, **kwargs): exp / tanh evaluations, which on a CPU can bound a kernel of their
  own (one per element or score exponentiated; a log or sqrt per row is left out).
  bytes: every array argument read once and every new output written once, corrected by `writes`
  (argument positions written in place), `skips` (argument positions not read), `reads` (bytes
  read, for a kernel that reads only part of an argument) and `written` (bytes written in place,
  for one that writes only part of one).
- epilogue: the keyword parameters by which a captured step folds an elementwise launch into its
  first output (tinygrad_like/graph/fuse.py): scale= (times a 0-d array), add= (plus an array of
  its shape), out= (written into add itself), cast= (it in another dtype), then= (an elementwise
  expression kernel run on it). Each must give the unfused launches' bits.

Adding a kernel: its record in its family's spec.py, its function in cpu.py and cuda.py (and the
.cu code), its cases in tests/kernels/test_<family>.py, and the op that launches it (functions.py).
"""

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from .. import dtypes


class Out(NamedTuple):
    """A new array a kernel returns: its shape and dtype (a shape rule's answer)."""

    shape: tuple
    dtype: np.dtype


@dataclass(frozen=True)
class Kernel:
    name: str
    family: str  # the folder it lives in: kernels/<family>/
    signature: Callable  # the stub: parameters and docstring
    shape: Callable  # (*args, **kwargs) -> what it returns (see above)
    flops: Callable = None  # (result, *args, **kwargs) -> FLOPs; None: 0
    exps: Callable = None  # (result, *args, **kwargs) -> exp/tanh evaluations; None: 0
    writes: tuple = ()  # argument positions written in place
    skips: tuple = ()  # argument positions not read
    reads: Callable = None  # (outs, *args, **kwargs) -> bytes read; None: from skips
    written: Callable = None  # (outs, *args, **kwargs) -> bytes written in place; None: writes
    epilogue: tuple = ()  # the epilogue parameters it takes (fuse.py folds into its first output)


KERNELS = {}  # name -> Kernel, in declaration order (family by family, as kernels/ imports them)


def kernel(shape, **counting):
    """Declare the stub below as a kernel of its spec's family, its outputs as `shape` says,
    counted as `counting` says."""

    def declare(stub):
        family = stub.__module__.split(".")[-2]  # tinygrad_like.kernels.<family>.spec
        KERNELS[stub.__name__] = Kernel(stub.__name__, family, stub, shape, **counting)
        return stub

    return declare


# ---------------------------------------------------------------- shape rules


def like(a, dtype=None):
    """A new array of a's shape and dtype (or this dtype)."""
    return Out(tuple(a.shape), np.dtype(a.dtype if dtype is None else dtype))


def like_arg(i):
    """A shape rule: one new array like argument i."""
    return lambda *args, **kwargs: like(args[i])


def per_row(x):
    """One statistic per row of x (..., C): (...,) in x's compute dtype (fp32, fp64 for fp64)."""
    return Out(tuple(x.shape[:-1]), dtypes.compute_dtype(x.dtype))


# ---------------------------------------------------------------- counting rules


def per_element(n, of=0):
    """n per element of argument `of` (0 = the first input)."""
    return lambda result, *args, **kw: n * args[of].size


def per_output(result, *args, **kw):
    """One per output element (binary ops, whatever broadcast their inputs)."""
    return result.size
