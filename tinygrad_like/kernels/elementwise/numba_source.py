"""The CPU kernel of an expression (expr.py): Numba source text generated from it, compiled and
cached on disk as compiled.py's kernels are.

The source is one function over arrays in the compute type, the inputs then one array per
output, read as the hand-written kernels read (elementwise.cu's thread per element): a prange
loop over the flat (n,) elements, each Op one line in the expression's order. With a row vector
input (C,) the others are (rows, C) and the loop runs over the rows (split over the cores) and,
inside, over the columns, so that b[col] needs no division. exp, log and tanh are
vector_math.py's (in fp32 polynomials LLVM vectorizes); sqrt and erf are Python's math
module's, which Numba compiles in fp32 for fp32 (sqrt one instruction, erff a call per
element). The loops compile four vectors interleaved (compiled.kernel's interleave).

Its 2-byte twin (bits=True) reads and writes bf16 or fp16 arrays as their bits (halves.bits),
each element widened as it is loaded and rounded as it is stored (halves.value, halves.stored),
computing in fp32: the fp32 kernel's bits on the widened inputs, rounded once, with no widened
copy of an input or fp32 copy of an output passing through memory.

Numba caches a compiled function by its source file, so each kernel's source is written to a
file of its own, named by the kernel and a hash of the text, beside Numba's cache
(numba.config.CACHE_DIR/generated/): written once (the file's mtime is part of Numba's cache
key), imported, and compiled through compiled.kernel (the parallel twin and the serial one, the
first compile printed with its time). An edited formula makes a new file, so a new compile.
"""

import hashlib
import importlib.util
import os
import sys
from functools import lru_cache
from pathlib import Path

import numba

from ...backend.cpu.compiled import kernel
from .expr import EXPRESSIONS, Dialect, code

_PRELUDE = """\
# Generated from the expression of kernels/elementwise/spec.py's {name} by
# kernels/elementwise/numba_source.py: do not edit.
import math

import numpy as np
from numba import prange

from tinygrad_like.backend.cpu.vector_math import exp, log, tanh
from tinygrad_like.backend.cpu.halves import stored, value
"""
NUMBA = Dialect(
    "_A({})",  # the compute type, x.dtype.type
    {"exp": "exp", "tanh": "tanh", "log": "log", "sqrt": "math.sqrt", "erf": "math.erf"},
    "{1} if {0} else {2}",
)
# A kernel's work is its FLOPs per element (an exp or tanh counted as EXP_FLOPS) times its
# elements, in units of ELEMENT_FLOPS: compiled.kernel runs it on one core below
# compiled.SERIAL_BELOW units (times the pool's hand-off), where the parallel launch's
# hand-off costs more than a second core gains a cheap kernel (measured on 2 vCPUs: relu on 524K
# elements 60 us on one core, 112 on two; rsqrt's 2 FLOPs on as many, even; GELU's 19, 403
# against 279).
EXP_FLOPS = 10
ELEMENT_FLOPS = 64


def source(e, bits=False):
    """The Python source of expression e's kernel: def <name>(*inputs, *outputs), over flat
    (n,) arrays, or, with a row vector input, the others (rows, C) and the vector (C,); bits:
    the 2-byte twin's (the module's docstring)."""
    names = {i: f"in_{i.name}" for i in e.inputs}
    body = []
    for k, n in enumerate(e.ops):
        names[n] = f"t{k}"
        body.append(f"t{k} = {code(n, names, NUMBA)}")
    outs = [f"_out{k}" for k in range(len(e.outputs))]
    first = next(i.name for i in e.inputs if not i.row)
    if e.rows:  # 2-D indexes: a flat one computed from row and column keeps LLVM from vectorizing
        at, row_at = "[_row, _col]", "[_col]"
        head = [
            f"for _row in prange({first}.shape[0]):",
            f"    for _col in range({first}.shape[1]):",
        ]
    else:
        at = row_at = "[_i]"
        head = [f"for _i in prange({first}.shape[0]):"]
    indent = "    " * len(head)
    load, store = ("value({})", "stored({}, {})") if bits else ("{}", "{1}")
    loads = [
        f"in_{i.name} = " + load.format(f"{i.name}{row_at if i.row else at}") for i in e.inputs
    ]
    stores = [f"{o}{at} = " + store.format(o, names[n]) for o, n in zip(outs, e.outputs)]
    params = ", ".join([i.name for i in e.inputs] + outs)
    lines = ["_A = np.float32" if bits else f"_A = {first}.dtype.type"] + head
    lines += [indent + s for s in loads + body + stores]
    return (
        _PRELUDE.format(name=e.name)
        + f"\n\ndef {e.name}({params}):\n"
        + "".join(f"    {s}\n" for s in lines)
    )


def _written(e, bits):
    """The file holding e's source (written now if it is not there yet: atomically, so that
    processes compiling at once each read a whole file)."""
    text = source(e, bits)
    folder = Path(numba.config.CACHE_DIR) / "generated"
    path = folder / f"{e.name}_{hashlib.sha256(text.encode()).hexdigest()[:16]}.py"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


@lru_cache(maxsize=None)
def compiled(name, bits=False):
    """The compiled kernel of EXPRESSIONS[name] (compiled.kernel's: prange over the cores, the
    serial twin below its size threshold), called with C-contiguous arrays in the compute type
    (source's: flat, or (rows, C) beside a row vector (C,)), or with bits, 2-byte arrays' bits:
    the inputs, then an output per formula output."""
    e = EXPRESSIONS[name]
    path = _written(e, bits)
    module_name = f"tinygrad_like_generated.{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # Numba's cache looks a function's globals up by module
    spec.loader.exec_module(module)
    flops, exps = e.counts()
    cost = (flops + EXP_FLOPS * exps) / ELEMENT_FLOPS
    # interleaved: each element is one long chain of dependent vector ops (an exp's polynomial,
    # a divide), and four independent ones in flight keep the vector units busy
    return kernel(getattr(module, name), work=lambda first, *_: first.size * cost, interleave=4)
