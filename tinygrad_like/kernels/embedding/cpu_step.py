"""embedding_fwd as an op of a compiled CPU step (backend/cpu/step_runner.py): the rows of the
weight the ids name, copied as bytes (cpu.py's weight[idx], any dtype), the ids split over the
threads. The ids are the step's input: checked on the host before each run (spec.check_ids,
the launch's own check)."""

import numba
import numpy as np

from ...backend.cpu.step_runner import Unsupported, form, i64_at, op, share, u8_at
from .spec import check_ids


@op
def _gather(t, T, a):
    # a: weight (V, row bytes), ids (n,) int64, out (n, row bytes); V, row bytes, n
    V, width, n = a[3], a[4], a[5]
    weight = numba.carray(u8_at(a[0]), (V, width))
    ids = numba.carray(i64_at(a[1]), (n,))
    out = numba.carray(u8_at(a[2]), (n, width))
    lo, hi = share(n, t, T)
    for r in range(lo, hi):
        out[r, :] = weight[ids[r]]


@form("embedding_fwd")
def _embedding_fwd(ops, outs, weight, idx):
    contiguous = weight.ndim == 2 and weight.flags.c_contiguous
    if not contiguous or idx.dtype != np.int64 or outs[0] is None:
        raise Unsupported("embedding_fwd: a C-contiguous 2-D weight and int64 ids")
    V = weight.shape[0]
    ops.check(("ids", id(idx), V), lambda: check_ids(idx, V), idx)
    rows = weight.view(np.uint8).reshape(V, -1)
    out = outs[0].view(np.uint8).reshape(idx.size, -1)
    ops.add(_gather, rows, idx, out, V, rows.shape[1], idx.size)
