"""GEMMs on CUDA (gemm.cu): C (..., M, N) = op(A) (..., M, K) op(B) (..., K, N). fp32 runs gemm_f32
(tiled shared memory), fp16/bf16 gemm_tc (mma.sync tensor cores, fp32 accumulation); fp64,
mixed dtypes and TG_MATMUL=cublas go to cupy.matmul (cuBLAS, fp32 compute): the yardstick for
the custom GEMMs, and the fallback should they misbehave. The epilogue's scale (one element)
and add (C's shape and dtype) are read in the custom kernels' store; out (C's shape and dtype)
may be add itself. The cast epilogue and then= are not in the store: elementwise's cast (then its
add) or the generated expression kernel then= names runs on C as a second device kernel of the
same launch, so the launch is one but C is still written and read back in device memory.
"""

import math
import os

import cupy
import numpy as np

from ... import dtypes
from ...backend.cuda.runtime import NULL, TRAINING, blocks_for, compiled
from ..elementwise import cuda as elementwise
from ..elementwise.cuda import add as elementwise_add
from ..elementwise.cuda import cast as elementwise_cast
from ..elementwise.cuda import mul as elementwise_mul
from ..elementwise.spec import then_epilogue


def _gemm_cupy(a, b, bias, ta, tb, scale, add, out):
    """cuBLAS through cupy.matmul (fp32 compute for fp32/fp16/bf16): fp64, mixed dtypes, and
    everything when TG_MATMUL=cublas. The epilogue as the unfused launches: C rounded to a's
    dtype, then elementwise's mul(C, scale) and add(add, C), into out when given."""
    y = cupy.matmul(a.swapaxes(-1, -2) if ta else a, b.swapaxes(-1, -2) if tb else b)
    if bias is not None:
        y = elementwise_add(y, bias)
    return _epilogue(y if y.dtype == a.dtype else y.astype(a.dtype), scale, add, out)


def _epilogue(c, scale, add, out):
    """The epilogue as the unfused launches do it, on C in a's dtype: elementwise's mul(C,
    scale), then add(add, C), into out when given (out may be add itself) -> out, or C."""
    if scale is not None:
        c = elementwise_mul(c, scale)
    if add is not None:
        c = elementwise_add(add, c, out=out)
    elif out is not None:
        out[...] = c
    return c if out is None else out


def _batched(x, batch):
    """x made contiguous with the batch shape, and the element stride between its matrices
    (0 when one matrix serves the whole batch)."""
    matrix = x.shape[-1] * x.shape[-2]
    if x.shape[:-2] == batch:
        return cupy.ascontiguousarray(x), matrix
    if math.prod(x.shape[:-2]) == 1:
        return cupy.ascontiguousarray(x), 0
    return cupy.ascontiguousarray(cupy.broadcast_to(x, batch + x.shape[-2:])), matrix


def _gemm(a, b, bias, ta, tb, scale=None, add=None, out=None):
    """(op(a) @ op(b) (+ bias)) (* scale) (+ add) over broadcast leading (batch) dims, into out
    when given; op transposes the last two axes when ta / tb. fp32 runs gemm_f32, fp16/bf16
    gemm_tc (tensor cores), see gemm.cu; scale (one element) and add (C's shape) are read in
    their store, where out may be add itself."""
    M, K = (a.shape[-1], a.shape[-2]) if ta else (a.shape[-2], a.shape[-1])
    N, Kb = (b.shape[-2], b.shape[-1]) if tb else (b.shape[-1], b.shape[-2])
    if K != Kb:
        raise ValueError(f"GEMM shapes do not match: {a.shape} and {b.shape} (ta={ta}, tb={tb})")
    if (
        os.environ.get("TG_MATMUL", "").lower() == "cublas"
        or a.dtype != b.dtype
        or a.dtype not in TRAINING
    ):
        return _gemm_cupy(a, b, bias, ta, tb, scale, add, out)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    shape = batch + (M, N)
    if out is not None and (out.shape != shape or not out.flags.c_contiguous):
        # the kernels write a C-contiguous C: a new one, then copied (add read before out written)
        out[...] = _gemm(a, b, bias, ta, tb, scale, add)
        return out
    if not ta and b.ndim == 2 and a.ndim > 2:  # X (..., K) @ W: one GEMM over all rows
        rows = math.prod(a.shape[:-1])  # not -1: that cannot be solved when K = 0
        add, flat = [None if x is None else x.reshape(rows, N) for x in (add, out)]
        c = _gemm(a.reshape(rows, K), b, bias, False, tb, scale, add, flat)
        return c.reshape(shape) if out is None else out
    nbatch, tile = math.prod(batch), (64 if a.dtype == dtypes.float32 else 128)
    if nbatch > 65535 or blocks_for(M, tile) > 65535:  # beyond the grid's y/z limits
        return _gemm_cupy(a, b, bias, ta, tb, scale, add, out)
    (a, stride_a), (b, stride_b) = _batched(a, batch), _batched(b, batch)
    c = cupy.empty(shape, dtype=a.dtype) if out is None else out
    if c.size == 0:
        return c
    if bias is not None:
        bias = cupy.ascontiguousarray(bias, dtype=a.dtype)
    if scale is not None:
        scale = cupy.ascontiguousarray(scale, dtype=a.dtype)
    if add is not None:
        add = cupy.ascontiguousarray(add)  # out itself when out is add: no copy
    if K == 0:  # an empty sum: C = bias (or 0), as np.matmul gives, then the epilogue; no GEMM
        # C made apart from c: c may be add itself, read by the add
        c0 = cupy.zeros(shape, a.dtype) if bias is None else cupy.broadcast_to(bias, shape)
        return _epilogue(c0, scale, add, c)
    vec = 16 // a.itemsize  # cp.async moves 16 bytes: contiguous dims and pointers must allow it
    aligned = (
        (M if ta else K) % vec == 0
        and (K if tb else N) % vec == 0
        and a.data.ptr % 16 == 0
        and b.data.ptr % 16 == 0
    )
    if a.dtype == dtypes.float32:
        kernel = compiled("gemm.cu", "gemm_f32", ta, tb, aligned)
    else:
        kernel = compiled("gemm.cu", "gemm_tc", a.dtype, ta, tb, aligned)
    kernel(
        (blocks_for(N, tile), blocks_for(M, tile), nbatch),
        (256,),
        (
            a,
            b,
            NULL if bias is None else bias,
            NULL if scale is None else scale,
            NULL if add is None else add,
            c,
            np.int32(M),
            np.int32(N),
            np.int32(K),
            np.int64(stride_a),
            np.int64(stride_b),
            np.int64(M * N),
        ),
    )
    return c


def _cast(c, cast, add, out):
    """The epilogue's cast, after the store's scale: elementwise's cast, then its add (a kernel
    each; the store cannot round C to one dtype and add in another)."""
    return _epilogue(elementwise_cast(c, cast), None, add, out)


def _epilogued(a, b, bias, ta, tb, scale, cast, add, out, then, aux):
    """_gemm with the whole epilogue: the store's scale and add, or the cast or then= after it."""
    if cast is not None:
        return _cast(_gemm(a, b, bias, ta, tb, scale), cast, add, out)
    return then_epilogue(elementwise, _gemm(a, b, bias, ta, tb, scale, add, out), then, aux)


def matmul(a, b, bias=None, scale=None, cast=None, add=None, out=None, then=None, aux=False):
    return _epilogued(a, b, bias, False, False, scale, cast, add, out, then, aux)


def matmul_nt(a, b, scale=None, cast=None, add=None, out=None, then=None, aux=False):
    return _epilogued(a, b, None, False, True, scale, cast, add, out, then, aux)


def matmul_tn(a, b, scale=None, cast=None, add=None, out=None, then=None, aux=False):
    return _epilogued(a, b, None, True, False, scale, cast, add, out, then, aux)
