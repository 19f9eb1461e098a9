"""The CUDA backend: cpu.py's kernel interface on CuPy arrays, run by the project's own kernels
in kernels/*.cu (compiled with NVRTC through cupy.RawModule), with CuPy itself where a custom
kernel would add nothing: fp64 GEMMs (cuBLAS), binary ops that broadcast, sums over arbitrary
axes, copies, fills, concatenation and index gradients.

Names, signatures, dtype rules and results are cpu.py's (the reference). What a caller can
notice: launches are asynchronous (synchronize() or to_numpy() waits), dropout draws from its
own random stream, and adamw_step never waits for the host: the overflow skip and the clipping
coefficient are decided on the device from norm_sq.

Over 500 lines on purpose: the whole kernel contract, in cpu.py's order, to read beside it.

TG_MATMUL=cublas sends matmul / matmul_nt / matmul_tn to cupy.matmul (cuBLAS, fp32 compute):
the yardstick for the custom GEMMs, and the fallback should they misbehave.

NVRTC needs a CUDA toolkit's headers (cuda_fp16.h, cuda_bf16.h), which CuPy finds in this
order: the nvidia-cuda-runtime wheel, conda, $CUDA_PATH or $CUDA_HOME (newer cuda-pathfinder
releases also the system's toolkit). When neither variable is set, importing this module sets
CUDA_PATH to the toolkit of the nvcc on PATH (_cuda_path_from_nvcc).
"""

import math
import os
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import cupy
import numpy as np
from cupy.cuda.memory_hook import MemoryHook

from .. import dtypes
from .cpu import check_ids, check_targets

name = "cuda"
xp = cupy

_KERNEL_DIR = Path(__file__).with_name("kernels")
_CTYPES = {
    dtypes.float32: "float",
    dtypes.float16: "__half",
    dtypes.bfloat16: "__nv_bfloat16",
    dtypes.float64: "double",
}
_HALF = (dtypes.float16, dtypes.bfloat16)
_TRAINING = tuple(dtypes.BY_NAME[n] for n in dtypes.TRAINING)  # dtypes with custom GEMMs/casts
_NULL = np.uint64(0)  # a null pointer argument
_BLOCK = 256  # threads per block of the flat and one-warp-per-row kernels


def supported_dtypes():
    """fp16 and bf16 run natively: tensor-core GEMMs, fp32-accumulating kernels."""
    return dtypes.TRAINING


# ---------------------------------------------------------------- arrays and timing


def asarray(data, dtype=None):
    return cupy.asarray(data, dtype=dtype)


def to_numpy(a) -> np.ndarray:
    return cupy.asnumpy(a)


def empty(shape, dtype):
    return cupy.empty(shape, dtype=dtype)


def synchronize():
    cupy.cuda.Device().synchronize()


def device_name():
    """The current GPU's name, e.g. 'NVIDIA H200' (training/mfu.py picks its peak by it)."""
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else name


class _Timer:
    """CUDA events around a launch; .seconds() waits for the end event only when asked."""

    def __init__(self):
        self.start, self.end = cupy.cuda.Event(), cupy.cuda.Event()
        self.start.record()

    def stop(self):
        self.end.record()
        return self

    def seconds(self):
        self.end.synchronize()
        return cupy.cuda.get_elapsed_time(self.start, self.end) / 1e3


def start_timer():
    return _Timer()


class PoolWatcher(MemoryHook):
    """Cross-checks memory.TRACKER against CuPy's real memory pool. Inside `with PoolWatcher() as
    w:` every pool allocation and free is seen; w.report() gives the pool's bytes in use now and
    at their peak (blocks rounded up to 512 bytes, as the pool hands them out) and the bytes the
    pool holds from the driver, to set beside TRACKER.total() and TRACKER.peak_total."""

    name = "PoolWatcher"

    def __init__(self):
        super().__init__()
        self.pool = cupy.get_default_memory_pool()
        self.used = self.peak = self.pool.used_bytes()
        self.live = {}  # pointer -> bytes, for blocks allocated while watching

    def malloc_postprocess(self, **kw):
        self.live[kw["mem_ptr"]] = kw["mem_size"]
        self.used += kw["mem_size"]
        self.peak = max(self.peak, self.used)

    def free_postprocess(self, **kw):
        self.used -= self.live.pop(kw["mem_ptr"], 0)

    def report(self):
        return {
            "used_bytes": self.used,
            "peak_used_bytes": self.peak,
            "pool_total_bytes": self.pool.total_bytes(),
        }


# ---------------------------------------------------------------- loading the .cu files


def kernel_source(filename):
    """A .cu file with common.cuh pasted over its #include line: one self-contained source, so
    CuPy's compile cache keys on everything the kernels depend on."""
    common = (_KERNEL_DIR / "common.cuh").read_text()
    return (_KERNEL_DIR / filename).read_text().replace('#include "common.cuh"', common)


def instances(source):
    """The template instances a .cu file lists (&name<args>) under #ifdef TG_CHECK_INSTANTIATE,
    whitespace removed: the one list both NVRTC (name_expressions) and nvcc compile."""
    listing = source.split("#ifdef TG_CHECK_INSTANTIATE", 1)[1]
    return ["".join(m.split()) for m in re.findall(r"&(\w+\s*<[^>]*>)", listing)]


def _cuda_path_from_nvcc():
    """Point CUDA_PATH at the toolkit of the nvcc on PATH when neither CUDA_PATH nor CUDA_HOME
    is set and that toolkit has both headers. -> the folder set, or None.

    CuPy 14 ships no CUDA headers and NVRTC has none built in: CuPy passes -I<the folder of
    cuda_runtime.h> as cuda.pathfinder finds it (see above), and where it finds none every
    compile, CuPy's own kernels' too, fails with 'Failed to find CUDA headers'. CuPy asks once
    per process, so this runs at import, before anything is compiled. nvcc --dryrun prints the
    toolkit root it runs from (TOP), also through a wrapper script."""
    nvcc = shutil.which("nvcc")
    if os.environ.get("CUDA_PATH") or os.environ.get("CUDA_HOME") or nvcc is None:
        return None
    try:
        dryrun = subprocess.run(
            [nvcc, "--dryrun", "-E", "-x", "cu", os.devnull],
            capture_output=True,
            text=True,
            timeout=30,
        ).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    top = re.search(r"^#\$ TOP=(.+)$", dryrun, re.M)
    root = os.path.normpath(top.group(1).strip()) if top else None
    if root is None or not all(
        os.path.isfile(os.path.join(root, "include", h)) for h in ("cuda_fp16.h", "cuda_bf16.h")
    ):
        return None
    os.environ["CUDA_PATH"] = root
    return root


_cuda_path_from_nvcc()


@lru_cache(maxsize=None)
def _module(filename):
    source = kernel_source(filename)
    return cupy.RawModule(code=source, options=("-std=c++17",), name_expressions=instances(source))


def _param(p):
    if isinstance(p, bool):
        return "true" if p else "false"
    return str(p) if isinstance(p, int) else _CTYPES[np.dtype(p)]


@lru_cache(maxsize=None)
def _kernel(filename, kernel, *params):
    """The compiled instance kernel<params> (params: dtypes, bools, ints) of a .cu file."""
    return _module(filename).get_function(f"{kernel}<{','.join(_param(p) for p in params)}>")


def _acc(dtype):
    """The NumPy scalar type of a kernel's acc_t<T> argument (fp32, or fp64 for fp64)."""
    return dtypes.compute_dtype(dtype).type


def _blocks(n, per_block=_BLOCK):
    return (n + per_block - 1) // per_block


def _flat(filename, kernel, params, n, *args):
    """Launch a one-thread-per-element kernel over n elements."""
    if n:
        _kernel(filename, kernel, *params)((_blocks(n),), (_BLOCK,), args)


def _per_row(filename, kernel, dtype, rows, *args):
    """Launch a one-warp-per-row kernel: 8 rows per 256-thread block."""
    if rows:
        _kernel(filename, kernel, dtype)((_blocks(rows, _BLOCK // 32),), (_BLOCK,), args)


def _f32(x):
    """2-byte float arrays as fp32 (anything else unchanged), as cpu.py's _f32."""
    return x.astype(dtypes.float32) if isinstance(x, cupy.ndarray) and x.dtype in _HALF else x


# ---------------------------------------------------------------- GEMMs


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
        or a.dtype not in _TRAINING
    ):
        return _gemm_cupy(a, b, bias, ta, tb)
    if not ta and b.ndim == 2 and a.ndim > 2:  # X (..., K) @ W: one GEMM over all rows
        rows = math.prod(a.shape[:-1])  # not -1: that cannot be solved when K = 0
        return _gemm(a.reshape(rows, K), b, bias, False, tb).reshape(a.shape[:-1] + (N,))
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    nbatch, tile = math.prod(batch), (64 if a.dtype == dtypes.float32 else 128)
    if nbatch > 65535 or _blocks(M, tile) > 65535:  # beyond the grid's y/z limits
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
        kernel = _kernel("gemm.cu", "gemm_f32", ta, tb, aligned)
    else:
        kernel = _kernel("gemm.cu", "gemm_tc", a.dtype, ta, tb, aligned)
    kernel(
        (_blocks(N, tile), _blocks(M, tile), nbatch),
        (256,),
        (
            a,
            b,
            _NULL if bias is None else bias,
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
    """(..., M, K) @ (..., K, N) [+ bias (N,)] -> (..., M, N)."""
    return _gemm(a, b, bias, False, False)


def matmul_nt(a, b):
    """(..., M, K) @ (..., N, K)^T -> (..., M, N)."""
    return _gemm(a, b, None, False, True)


def matmul_tn(a, b):
    """(..., K, M)^T @ (..., K, N) -> (..., M, N)."""
    return _gemm(a, b, None, True, False)


# ---------------------------------------------------------------- elementwise


def _binary(op, ufunc):
    """a (op) b with NumPy broadcasting; either side may be a Python scalar. Same shapes (or a
    scalar) run elementwise.cu's binary kernel; broadcasting and mixed dtypes run CuPy's ufunc,
    2-byte floats computed in fp32 and rounded once, as cpu.py does."""

    def kernel(a, b, out=None):
        arrays = [x for x in (a, b) if isinstance(x, cupy.ndarray)]
        dtype = np.result_type(*[x.dtype for x in arrays])
        shape = arrays[0].shape
        plain = [
            x.dtype == dtype and x.shape == shape and x.flags.c_contiguous
            for x in arrays + ([] if out is None else [out])
        ]
        if dtype in _CTYPES and all(plain):
            y = cupy.empty(shape, dtype=dtype) if out is None else out
            ptrs = [x if isinstance(x, cupy.ndarray) else _NULL for x in (a, b)]
            scalars = [_acc(dtype)(0 if isinstance(x, cupy.ndarray) else x) for x in (a, b)]
            _flat(
                "elementwise.cu",
                "binary",
                (dtype, op),
                y.size,
                *ptrs,
                *scalars,
                y,
                np.int64(y.size),
            )
            return y
        if dtype in _HALF:
            y = ufunc(_f32(a), _f32(b))
            if out is None:
                return y.astype(dtype)
            out[...] = y
            return out
        return ufunc(a, b, out=out)

    return kernel


add = _binary(0, cupy.add)
sub = _binary(1, cupy.subtract)
mul = _binary(2, cupy.multiply)
div = _binary(3, cupy.divide)


def neg(a):
    return mul(a, -1.0) if a.dtype in _CTYPES else cupy.negative(a)


def contiguous(a):
    return cupy.ascontiguousarray(a)


def cast(a, dtype):
    dtype = np.dtype(dtype)
    if a.dtype == dtype or a.dtype not in _TRAINING or dtype not in _TRAINING:
        return a.astype(dtype)
    a = cupy.ascontiguousarray(a)
    y = cupy.empty(a.shape, dtype=dtype)
    _flat("elementwise.cu", "cast", (a.dtype, dtype), a.size, a, y, np.int64(a.size))
    return y


def copy(dst, src):
    """dst[...] = src (in place; dst may be a view, e.g. a slice of a KV cache)."""
    dst[...] = src
    return dst


def fill(dst, value):
    dst.fill(value)
    return dst


def concat(arrays, axis):
    return cupy.concatenate(arrays, axis=axis)


def index_bwd(dy, shape, index):
    """Gradient of x[index] for a basic index, as cpu.index_bwd: zeros with dy written."""
    dx = cupy.zeros(shape, dtype=dy.dtype)
    dx[index] = dy
    return dx


def sum(a, axis=None, keepdims=False):
    """Sum in fp32 (fp64 for fp64 inputs), result in a's dtype."""
    s = cupy.sum(a, axis=axis, keepdims=keepdims, dtype=dtypes.compute_dtype(a.dtype))
    return s.astype(a.dtype, copy=False)


def gelu_fwd(x):
    x = cupy.ascontiguousarray(x)
    y = cupy.empty_like(x)
    _flat("elementwise.cu", "gelu_fwd", (x.dtype,), x.size, x, y, np.int64(x.size))
    return y


def gelu_bwd(x, dy):
    x, dy = cupy.ascontiguousarray(x), cupy.ascontiguousarray(dy, dtype=x.dtype)
    dx = cupy.empty_like(x)
    _flat("elementwise.cu", "gelu_bwd", (x.dtype,), x.size, x, dy, dx, np.int64(x.size))
    return dx


def dropout_fwd(x, p, seed):
    """Inverted dropout -> (y, mask), mask in x's dtype holding 0 or 1/(1-p). The stream is a
    hash of (seed, element index): the same seed gives the same mask, but not NumPy's."""
    x = cupy.ascontiguousarray(x)
    y, mask = cupy.empty_like(x), cupy.empty_like(x)
    key = np.uint64(np.random.default_rng(seed).integers(2**63))  # any seed NumPy accepts
    scale = np.float32(1.0) / np.float32(1.0 - p)
    _flat(
        "elementwise.cu",
        "dropout_fwd",
        (x.dtype,),
        x.size,
        x,
        y,
        mask,
        np.int64(x.size),
        np.float32(p),
        scale,
        key,
    )
    return y, mask


# ---------------------------------------------------------------- row reductions


def _rows(x):
    """x contiguous, with the (rows, C) the row kernels view it as (either may be 0)."""
    x = cupy.ascontiguousarray(x)
    return x, math.prod(x.shape[:-1]), x.shape[-1]


def _check_same_dtype(*arrays):
    if len({a.dtype for a in arrays}) != 1:
        got = ", ".join(str(a.dtype) for a in arrays)
        raise TypeError(f"the CUDA kernel needs one dtype, got {got}")


def layernorm_fwd(x, weight, bias, eps=1e-5):
    """x (..., C) -> y (..., C), mean (...,) fp32, rstd (...,) fp32 (saved for backward)."""
    _check_same_dtype(x, weight, bias)
    x, rows, C = _rows(x)
    stat = dtypes.compute_dtype(x.dtype)
    y = cupy.empty_like(x)
    mean, rstd = cupy.empty(x.shape[:-1], dtype=stat), cupy.empty(x.shape[:-1], dtype=stat)
    _per_row(
        "rownorm.cu",
        "layernorm_fwd",
        x.dtype,
        rows,
        x,
        cupy.ascontiguousarray(weight),
        cupy.ascontiguousarray(bias),
        y,
        mean,
        rstd,
        np.int32(rows),
        np.int32(C),
        stat.type(eps),
    )
    return y, mean, rstd


def layernorm_bwd(dy, x, weight, mean, rstd):
    """-> dx (..., C), dweight (C,), dbias (C,); dweight/dbias summed deterministically: partial
    sums per chunk of rows, then one ordered pass over the chunks (see rownorm.cu)."""
    _check_same_dtype(dy, x, weight)
    x, rows, C = _rows(x)
    dy, weight = cupy.ascontiguousarray(dy), cupy.ascontiguousarray(weight)
    stat = dtypes.compute_dtype(x.dtype)
    mean, rstd = cupy.ascontiguousarray(mean, dtype=stat), cupy.ascontiguousarray(rstd, dtype=stat)
    dx = cupy.empty_like(x)
    if dx.size == 0:  # no rows (or columns): nothing to sum, and a 0-block grid is invalid
        return dx, cupy.zeros(C, dtype=x.dtype), cupy.zeros(C, dtype=x.dtype)
    _per_row(
        "rownorm.cu",
        "layernorm_bwd_dx",
        x.dtype,
        rows,
        dy,
        x,
        weight,
        mean,
        rstd,
        dx,
        np.int32(rows),
        np.int32(C),
    )
    rows_per_block = max(1, _blocks(rows, 256))  # at most 256 chunks: the partials stay small
    nblocks = _blocks(rows, rows_per_block)
    partial = cupy.empty((nblocks, 2, C), dtype=stat)
    dweight, dbias = cupy.empty(C, dtype=x.dtype), cupy.empty(C, dtype=x.dtype)
    _kernel("rownorm.cu", "layernorm_bwd_partials", x.dtype)(
        (nblocks,),
        (_BLOCK,),
        (dy, x, mean, rstd, partial, np.int32(rows), np.int32(C), np.int32(rows_per_block)),
    )
    _kernel("rownorm.cu", "layernorm_bwd_reduce", x.dtype)(
        (_blocks(C),), (_BLOCK,), (partial, dweight, dbias, np.int32(nblocks), np.int32(C))
    )
    return dx, dweight, dbias


def softmax_causal_fwd(scores, scale):
    """scores (..., Tq, Tk) -> probs of softmax(scale * scores) over keys, future keys masked;
    query i is position Tk - Tq + i (a KV-cache decode step when Tq < Tk)."""
    s, rows, Tk = _rows(scores)
    p = cupy.empty_like(s)
    _per_row(
        "softmax.cu",
        "softmax_causal_fwd",
        s.dtype,
        rows,
        s,
        p,
        np.int32(rows),
        np.int32(s.shape[-2]),
        np.int32(Tk),
        _acc(s.dtype)(scale),
    )
    return p


def softmax_causal_bwd(probs, dprobs, scale):
    """dscores = scale * probs * (dprobs - sum(dprobs * probs over keys))."""
    _check_same_dtype(probs, dprobs)
    p, rows, Tk = _rows(probs)
    dp = cupy.ascontiguousarray(dprobs)
    ds = cupy.empty_like(p)
    _per_row(
        "softmax.cu",
        "softmax_causal_bwd",
        p.dtype,
        rows,
        p,
        dp,
        ds,
        np.int32(rows),
        np.int32(Tk),
        _acc(p.dtype)(scale),
    )
    return ds


# attention.cu's dynamic shared memory per block, in elements of the acc type: (D + 1)-pitched
# tiles, (TILE + 1)-pitched score tiles, per-row vectors (see each kernel's comment). At D = 64
# the backward's dk/dv kernel needs 134 KB in fp32 and 117 KB in fp64 (32-row tiles).
_FLASH_SMEM = {
    "flash_attention_fwd": (3, 1, 3),
    "flash_attention_bwd_dq": (5, 2, 2),
    "flash_attention_bwd_dkdv": (6, 2, 2),
}
_SMEM_OPTIN = 163 * 1024  # the most shared memory an sm_80 block may opt into (sm_90: 227 KB)


def _attention_shapes(q, k, v):
    """-> B, H, Tq, Tk, D of q (B, H, Tq, D), k and v (B, H, Tk, D) with Tk >= Tq, else raise."""
    if (
        q.ndim != 4
        or k.shape != v.shape
        or k.shape[:2] + k.shape[3:] != q.shape[:2] + q.shape[3:]
        or k.shape[2] < q.shape[2]
    ):
        raise ValueError(
            f"flash attention: q {q.shape}, k {k.shape}, v {v.shape}: need "
            "(B, H, Tq, D) and (B, H, Tk, D) with Tk >= Tq"
        )
    B, H, Tq, D = q.shape
    if B * H > 65535:  # grid y
        raise ValueError(f"flash attention: {B * H} heads is more than one grid holds (65535)")
    return B, H, Tq, k.shape[2], D


def _flash(kernel, dtype, n, BH, D, *args):
    """Launch an attention.cu kernel: one block per (tile of the n queries or keys, head)."""
    acc = dtypes.compute_dtype(dtype)
    tile = 32 if acc.itemsize == 8 else 64  # attention.cu's tile<A>()
    wide, square, rows = _FLASH_SMEM[kernel]
    smem = (wide * tile * (D + 1) + square * tile * (tile + 1) + rows * tile) * acc.itemsize
    if smem > _SMEM_OPTIN:
        raise ValueError(
            f"flash attention: head dim {D} needs {smem} bytes of shared memory "
            f"per block, more than the {_SMEM_OPTIN} an sm_80 block may use"
        )
    if n:
        fn = _kernel("attention.cu", kernel, dtype)
        fn.max_dynamic_shared_size_bytes = smem  # above 48 KB a kernel must opt in
        fn((_blocks(n, tile), BH), (_BLOCK,), args, shared_mem=smem)


def flash_attention_fwd(q, k, v, scale):
    """q (B, H, Tq, D), k and v (B, H, Tk, D), Tk >= Tq -> out (B, H, Tq, D), lse (B, H, Tq)
    fp32 (fp64 for fp64), as cpu.flash_attention_fwd; one block per (query tile, head)."""
    _check_same_dtype(q, k, v)
    B, H, Tq, Tk, D = _attention_shapes(q, k, v)
    q, k, v = (cupy.ascontiguousarray(a) for a in (q, k, v))  # GPT-2's are transposed views
    acc = dtypes.compute_dtype(q.dtype)
    out, lse = cupy.empty_like(q), cupy.empty((B, H, Tq), dtype=acc)
    _flash(
        "flash_attention_fwd",
        q.dtype,
        Tq,
        B * H,
        D,
        q,
        k,
        v,
        out,
        lse,
        np.int32(Tq),
        np.int32(Tk),
        np.int32(D),
        acc.type(scale),
    )
    return out, lse


def flash_attention_bwd(q, k, v, out, lse, dout, scale):
    """-> dq (B, H, Tq, D), dk, dv (B, H, Tk, D), as cpu.flash_attention_bwd. Three launches:
    Di = rowsum(dout * out), then dq (one block per query tile) and dk, dv (one block per key
    tile), each summed over the other side's tiles in a fixed order: deterministic, at the
    price of recomputing the scores and dout v^T once more (see attention.cu)."""
    _check_same_dtype(q, k, v, out, dout)
    B, H, Tq, Tk, D = _attention_shapes(q, k, v)
    if out.shape != q.shape or dout.shape != q.shape or lse.shape != q.shape[:-1]:
        raise ValueError(
            f"flash attention backward: out {out.shape}, dout {dout.shape} and "
            f"lse {lse.shape} must be q's {q.shape} and {q.shape[:-1]}"
        )
    q, k, v, out, dout = (cupy.ascontiguousarray(a) for a in (q, k, v, out, dout))
    acc = dtypes.compute_dtype(q.dtype)
    lse = cupy.ascontiguousarray(lse, dtype=acc)
    Di = cupy.empty(lse.shape, dtype=acc)
    dq, dk, dv = cupy.empty_like(q), cupy.empty_like(k), cupy.empty_like(v)
    rows, sizes = B * H * Tq, (np.int32(Tq), np.int32(Tk), np.int32(D), acc.type(scale))
    _per_row(
        "attention.cu",
        "flash_attention_bwd_rowdot",
        q.dtype,
        rows,
        dout,
        out,
        Di,
        np.int32(rows),
        np.int32(D),
    )
    _flash("flash_attention_bwd_dq", q.dtype, Tq, B * H, D, q, k, v, dout, lse, Di, dq, *sizes)
    _flash(
        "flash_attention_bwd_dkdv", q.dtype, Tk, B * H, D, q, k, v, dout, lse, Di, dk, dv, *sizes
    )
    return dq, dk, dv


def _loss_rows(logits, targets, n_classes):
    """-> contiguous logits (N, Vp), int64 targets checked against V, N, V, Vp. The check is a
    device reduction and a host read: the kernels index each row with its target."""
    logits = cupy.ascontiguousarray(logits)
    N, Vp = logits.shape
    V = Vp if n_classes is None else n_classes
    targets = cupy.ascontiguousarray(targets, dtype=cupy.int64)
    check_targets(targets, V)
    return logits, targets, N, V, Vp


def cross_entropy_fwd(logits, targets, n_classes=None):
    """logits (N, Vp), targets (N,) int, -1 = ignore -> (losses (N,) fp32, 0 if ignored;
    lse (N,) fp32) over the first V = n_classes columns (default all Vp), as cpu.py. One block
    per row (see softmax.cu)."""
    logits, targets, N, V, Vp = _loss_rows(logits, targets, n_classes)
    acc = dtypes.compute_dtype(logits.dtype)
    losses, lse = cupy.empty(N, dtype=acc), cupy.empty(N, dtype=acc)
    if N:
        _kernel("softmax.cu", "cross_entropy_fwd", logits.dtype)(
            (N,), (512,), (logits, targets, losses, lse, np.int32(V), np.int32(Vp))
        )
    return losses, lse


def cross_entropy_bwd(logits, lse, targets, dloss, n_classes=None):
    """dlogits (N, Vp) = dloss * (softmax - onehot(target)) in the first V = n_classes columns
    (default all Vp), 0 in the padding columns past V, zero rows for ignored targets, as cpu.py.
    dloss is a 1-element device array, read by the kernel (no host synchronization for it; the
    target check in _loss_rows is one)."""
    logits, targets, N, V, Vp = _loss_rows(logits, targets, n_classes)
    acc = dtypes.compute_dtype(logits.dtype)
    dlogits = cupy.empty_like(logits)
    if N:
        _kernel("softmax.cu", "cross_entropy_bwd", logits.dtype)(
            (N,),
            (512,),
            (
                logits,
                cupy.ascontiguousarray(lse, dtype=acc),
                targets,
                cupy.ascontiguousarray(dloss, dtype=acc).reshape(1),
                dlogits,
                np.int32(V),
                np.int32(Vp),
            ),
        )
    return dlogits


def cross_entropy_fwd_bwd(logits, targets, dloss, n_classes=None, out=None):
    """(losses (N,) fp32, dlogits (N, Vp)) of cross_entropy_fwd and cross_entropy_bwd in one
    launch, one block per row (see softmax.cu), as cpu.py; dlogits into out when given (logits
    itself, say), which must be a C-contiguous array of the logits' shape and dtype."""
    logits, targets, N, V, Vp = _loss_rows(logits, targets, n_classes)
    acc = dtypes.compute_dtype(logits.dtype)
    if out is not None and not (
        out.shape == logits.shape and out.dtype == logits.dtype and out.flags.c_contiguous
    ):
        raise ValueError(
            f"cross_entropy_fwd_bwd: out {out.shape} {out.dtype} must be a "
            f"C-contiguous {logits.shape} {logits.dtype} array"
        )
    losses = cupy.empty(N, dtype=acc)
    dlogits = cupy.empty_like(logits) if out is None else out
    if N:
        _kernel("softmax.cu", "cross_entropy_fwd_bwd", logits.dtype)(
            (N,),
            (512,),
            (
                logits,
                targets,
                cupy.ascontiguousarray(dloss, dtype=acc).reshape(1),
                losses,
                dlogits,
                np.int32(V),
                np.int32(Vp),
            ),
        )
    return losses, dlogits


# ---------------------------------------------------------------- embedding


def embedding_fwd(weight, idx):
    """weight (V, C), idx (...) int in [0, V) -> (..., C): a gather. Ids out of range raise
    cpu.py's ValueError, checked here (one device min/max, read by the host) before the launch:
    the kernel does no bounds check."""
    weight = cupy.ascontiguousarray(weight)
    idx = cupy.ascontiguousarray(idx, dtype=cupy.int64)
    check_ids(idx, weight.shape[0])
    out = cupy.empty(idx.shape + weight.shape[1:], dtype=weight.dtype)
    if idx.size:
        _kernel("embedding.cu", "embedding_fwd", weight.dtype)(
            (idx.size,), (_BLOCK,), (weight, idx, out, np.int32(weight.shape[1]))
        )
    return out


def embedding_bwd(dout, idx, num_embeddings):
    """dout (..., C) -> dweight (V, C); repeated ids summed in increasing position, the order of
    cpu.py's stable sort, by one block per id: deterministic. Ids are checked as in
    embedding_fwd (a negative one would write before dweight)."""
    C = dout.shape[-1]
    dout = cupy.ascontiguousarray(dout).reshape(-1, C)
    flat = cupy.ascontiguousarray(idx, dtype=cupy.int64).reshape(-1)
    check_ids(flat, num_embeddings)
    n = flat.size
    keys = cupy.sort(flat * n + cupy.arange(n, dtype=cupy.int64))  # unique: id-major, then position
    dweight = cupy.zeros((num_embeddings, C), dtype=dout.dtype)
    if n:
        _kernel("embedding.cu", "embedding_bwd", dout.dtype)(
            (n,), (_BLOCK,), (dout, keys, dweight, np.int32(n), np.int32(C))
        )
    return dweight


# ---------------------------------------------------------------- optimizer


def grad_norm_sq(grad):
    """Sum of squares of a gradient buffer in fp32 (fp64 for fp64) -> device array (1,), in two
    fixed-order passes (deterministic). inf/nan in the gradient make it non-finite."""
    g = cupy.ascontiguousarray(grad).reshape(-1)
    acc = dtypes.compute_dtype(g.dtype)
    nblocks = max(1, min(1024, _blocks(g.size)))
    partial, out = cupy.empty(nblocks, dtype=acc), cupy.empty(1, dtype=acc)
    _kernel("adamw.cu", "sum_partials", g.dtype, True)(
        (nblocks,), (_BLOCK,), (g, partial, np.int64(g.size))
    )
    _kernel("adamw.cu", "sum_partials", acc, False)(
        (1,), (1024,), (partial, out, np.int64(nblocks))
    )
    return out


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
    """One fused AdamW update over flat buffers, in place (see cpu.adamw_step). norm_sq stays on
    the device: the kernel skips the step when it is inf/nan and derives the clipping
    coefficient from it, so nothing here waits for the GPU."""
    for a in (master, grad, m, v) + (() if working is None else (working,)):
        if not a.flags.c_contiguous or a.size != master.size:
            raise ValueError("adamw_step updates flat contiguous buffers of one size in place")
    P = master.dtype.type  # every constant rounded once to the master's dtype, as cpu.py's acc
    bc1, bc2 = 1 - beta1**step, 1 - beta2**step
    norm_sq = cupy.ascontiguousarray(norm_sq, dtype=dtypes.compute_dtype(grad.dtype))
    _flat(
        "adamw.cu",
        "adamw_step",
        (master.dtype, grad.dtype),
        master.size,
        master,
        grad,
        m,
        v,
        _NULL if working is None else working,
        norm_sq,
        np.int64(master.size),
        np.int64(n_decay),
        np.float64(inv_scale),
        np.float64(max_norm),
        P(beta1),
        P(1 - beta1),
        P(beta2),
        P(1 - beta2),
        P(eps),
        P(1 - lr * weight_decay),
        P(lr / bc1),
        P(1 / np.sqrt(bc2)),
    )
