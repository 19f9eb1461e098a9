"""GEMMs on CUDA (gemm.cu): C (..., M, N) = op(A) (..., M, K) op(B) (..., K, N). fp32 runs gemm_f32
(tiled shared memory), fp16/bf16 gemm_tc (mma.sync tensor cores, fp32 accumulation); fp64,
mixed dtypes and TG_MATMUL=cublas go to cupy.matmul (cuBLAS, fp32 compute): the yardstick for
the custom GEMMs, and the fallback should they misbehave.
"""

import math
import os

import cupy
import numpy as np

from ... import dtypes
from ...backend.cuda.runtime import NULL, TRAINING, blocks_for, compiled
from ..elementwise.cuda import add


def _gemm_cupy(a, b, bias, ta, tb):
    """cuBLAS through cupy.matmul (fp32 compute for fp32/fp16/bf16): fp64, mixed dtypes, and
    everything when TG_MATMUL=cublas."""
    y = cupy.matmul(a.swapaxes(-1, -2) if ta else a, b.swapaxes(-1, -2) if tb else b)
    if bias is not None:
        y = add(y, bias)
    return y if y.dtype == a.dtype else y.astype(a.dtype)


def _batched(x, batch):
    """x made contiguous with the batch shape, and the element stride between its matrices
    (0 when one matrix serves the whole batch)."""
    matrix = x.shape[-1] * x.shape[-2]
    if x.shape[:-2] == batch:
        return cupy.ascontiguousarray(x), matrix
    if math.prod(x.shape[:-2]) == 1:
        return cupy.ascontiguousarray(x), 0
    return cupy.ascontiguousarray(cupy.broadcast_to(x, batch + x.shape[-2:])), matrix


def _gemm(a, b, bias, ta, tb):
    """op(a) @ op(b) (+ bias) over broadcast leading (batch) dims; op transposes the last two
    axes when ta / tb. fp32 runs gemm_f32, fp16/bf16 gemm_tc (tensor cores), see gemm.cu."""
    M, K = (a.shape[-1], a.shape[-2]) if ta else (a.shape[-2], a.shape[-1])
    N, Kb = (b.shape[-2], b.shape[-1]) if tb else (b.shape[-1], b.shape[-2])
    if K != Kb:
        raise ValueError(f"GEMM shapes do not match: {a.shape} and {b.shape} (ta={ta}, tb={tb})")
    if (
        os.environ.get("TG_MATMUL", "").lower() == "cublas"
        or a.dtype != b.dtype
        or a.dtype not in TRAINING
    ):
        return _gemm_cupy(a, b, bias, ta, tb)
    if not ta and b.ndim == 2 and a.ndim > 2:  # X (..., K) @ W: one GEMM over all rows
        rows = math.prod(a.shape[:-1])  # not -1: that cannot be solved when K = 0
        return _gemm(a.reshape(rows, K), b, bias, False, tb).reshape(a.shape[:-1] + (N,))
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    nbatch, tile = math.prod(batch), (64 if a.dtype == dtypes.float32 else 128)
    if nbatch > 65535 or blocks_for(M, tile) > 65535:  # beyond the grid's y/z limits
        return _gemm_cupy(a, b, bias, ta, tb)
    (a, stride_a), (b, stride_b) = _batched(a, batch), _batched(b, batch)
    c = cupy.empty(batch + (M, N), dtype=a.dtype)
    if c.size == 0:
        return c
    if bias is not None:
        bias = cupy.ascontiguousarray(bias, dtype=a.dtype)
    if K == 0:  # an empty sum: C = bias (or 0), as np.matmul gives; no kernel to launch
        c[...] = 0 if bias is None else bias
        return c
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


def matmul(a, b, bias=None):
    return _gemm(a, b, bias, False, False)


def matmul_nt(a, b):
    return _gemm(a, b, None, False, True)


def matmul_tn(a, b):
    return _gemm(a, b, None, True, False)
