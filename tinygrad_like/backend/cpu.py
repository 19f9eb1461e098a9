"""The CPU backend: every kernel as vectorized NumPy. This file is the numerical reference.

Rules every backend follows (the CUDA backend in cuda.py matches these names and signatures):
- Arrays in, arrays out; kernels never see Tensors or the tape.
- 2-byte inputs (fp16, bf16) are computed in fp32 and rounded once on the way out, which is
  what a tensor core or an fp32-accumulating CUDA kernel does. Reductions always accumulate
  in fp32 (or in fp64 when the inputs are fp64, for gradient checks).
- Outputs have the dtype of the main input unless the kernel says otherwise (statistics such
  as layernorm's mean/rstd and per-token losses are fp32).

Over 500 lines on purpose: it is the whole kernel contract (kernels.KERNELS) in one file, in the
same order as cuda.py, so that the reference and the CUDA glue read side by side.
"""

import ctypes
import ctypes.util
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import dtypes

name = "cpu"
xp = np  # the array module, for code that must allocate on this device


def keep_freed_memory():
    """Ask glibc's malloc to keep freed memory for reuse instead of handing it back to the OS.

    By default every array above 32 MB is mmapped on allocation and unmapped when freed, so the
    next step's (B*T, V) logits fault in 50,000 fresh zeroed pages again: a quarter second per
    step for gpt2-mini's cross-entropy alone. Keeping freed memory in the heap makes a training
    step reuse the same pages, as CuPy's memory pool does on the GPU. TG_CPU_KEEP_MEMORY=0 turns
    it off; other C libraries are left alone.
    """
    if os.environ.get("TG_CPU_KEEP_MEMORY", "1") == "0":
        return False
    path = ctypes.util.find_library("c")
    libc = ctypes.CDLL(path) if path else None
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
    return bool(libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


keep_freed_memory()


def supported_dtypes():
    """fp16 and bf16 are emulated: computed in fp32, stored and rounded in 2 bytes."""
    return dtypes.TRAINING


# ---------------------------------------------------------------- arrays and timing


def asarray(data, dtype=None):
    return np.asarray(data, dtype=dtype)


def to_numpy(a) -> np.ndarray:
    return np.asarray(a)


def empty(shape, dtype):
    return np.empty(shape, dtype=dtype)


def synchronize():
    pass


class _Timer:
    """Host timer; the CUDA backend returns CUDA events with the same .seconds()."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.t1 = None

    def stop(self):
        self.t1 = time.perf_counter()
        return self

    def seconds(self):
        return self.t1 - self.t0


def start_timer():
    return _Timer()


def _f32(a):
    """2-byte floats as fp32 for computation (fp32, fp64 and Python scalars pass through)."""
    half = getattr(a, "dtype", None) in (dtypes.float16, dtypes.bfloat16)
    return a.astype(np.float32) if half else a


def _round(a, dtype, out=None):
    """Round a computed result once to the output dtype (into out when given)."""
    if out is not None:
        out[...] = a
        return out
    return a if a.dtype == dtype else a.astype(dtype)


# NumPy's elementwise loops run on one core (BLAS uses them all), and each NumPy call is one
# pass over memory. So the row and elementwise kernels below split their rows into one block per
# core, run the blocks on a thread pool (NumPy releases the GIL inside its loops, so the blocks
# run at the same time), and inside a block work through chunks small enough (~128K elements)
# that their many passes hit the core's cache, not memory. The split depends only on the sizes
# and the core count, so results are deterministic.
# the cores this process may run on (one under mpirun's binding of a rank per core)
_THREADS = max(
    1,
    min(
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 8
    ),
)
_CHUNK = 1 << 17  # elements per chunk: with a few fp32 temporaries, fits in L2
_pool = None


def _in_parallel(n, body, per_row=1, chunk_rows=None, blocks=None):
    """Call body(lo, hi) over [0, n) rows: one block per core (one block when the work is
    small, or `blocks` blocks), each block in chunks of chunk_rows rows (default: about _CHUNK
    elements). This thread runs the first block itself: waking a sleeping core costs tens of
    microseconds here, so it wakes one fewer."""
    global _pool
    chunk_rows = chunk_rows or max(1, _CHUNK // per_row)
    blocks = blocks or max(1, min(_THREADS, n * per_row // _CHUNK, n))

    def block(start, stop):
        for lo in range(start, stop, chunk_rows):
            body(lo, min(lo + chunk_rows, stop))

    if blocks == 1:
        block(0, n)
        return
    if _pool is None:
        _pool = ThreadPoolExecutor(_THREADS - 1, thread_name_prefix="tg-cpu")
    edges = [n * i // blocks for i in range(blocks + 1)]
    jobs = [_pool.submit(block, lo, hi) for lo, hi in zip(edges[1:], edges[2:])]
    block(edges[0], edges[1])
    for job in jobs:
        job.result()


def _find_openblas():
    """(library, get, set) of the OpenBLAS that NumPy loaded (NumPy's wheels bundle it as
    scipy-openblas), get and set its thread count, or None (another BLAS, or no /proc to find
    it in)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return None
    for path in sorted(paths):
        lib = ctypes.CDLL(path)
        for prefix in ("scipy_openblas", "openblas"):
            for suffix in ("64_", "_64_", ""):
                get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                set_ = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                if get is not None and set_ is not None:
                    return lib, get, set_
    return None


_OPENBLAS = _find_openblas()
_BLAS_THREADS = _OPENBLAS[1:] if _OPENBLAS else None  # (get, set) of its thread count


def _blas_workers_sleep_when_idle():
    """Make OpenBLAS's idle worker threads sleep at once instead of spinning; -> whether they
    do (True also when the user set their timeout: their choice stands).

    After a threaded call each worker spins for 2^28 TSC cycles (blas_server.c's
    thread_timeout, about 0.1 s here: 0.12 s of CPU during a 0.2 s sleep after one 1024^3
    GEMM), and a row kernel's thread that lands on its core runs at half speed (a
    cross-entropy block right after the head's GEMM: 17.6 ms instead of 9.8).
    OPENBLAS_THREAD_TIMEOUT=4, the minimum (2^4 cycles), puts them to sleep right away (no CPU
    after the call; the next threaded call wakes them with a condition variable, which costs
    nothing measurable at the GEMMs below). OpenBLAS reads that variable when it loads, before
    this module can run, so it is set for a moment and re-read with the library's own
    openblas_read_env, and the workers are stopped; the next threaded call starts them again
    with the new timeout (exec_blas restarts a stopped pool, as after a fork)."""
    if any(v in os.environ for v in ("OPENBLAS_THREAD_TIMEOUT", "GOTO_THREAD_TIMEOUT")):
        return True
    lib = _OPENBLAS[0] if _OPENBLAS else None
    read_env = getattr(lib, "openblas_read_env", None)
    stop_workers = getattr(lib, "blas_thread_shutdown_", None)
    if read_env is None or stop_workers is None:
        return False
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = "4"
    try:
        read_env()
    finally:
        del os.environ["OPENBLAS_THREAD_TIMEOUT"]  # children start with OpenBLAS's default
    stop_workers()
    return True


class _one_blas_thread:
    """with _one_blas_thread(): BLAS calls in the block run on the calling thread only.

    For the GEMMs below that split their work across the cores themselves, each part one
    single-threaded BLAS call. The count is restored afterwards, so NumPy elsewhere (the MFU
    peak measurement, say) keeps its default."""

    def __enter__(self):
        self.previous = _BLAS_THREADS[0]() if _BLAS_THREADS else None
        if self.previous not in (None, 1):
            _BLAS_THREADS[1](1)

    def __exit__(self, *exc):
        if self.previous not in (None, 1):
            _BLAS_THREADS[1](self.previous)


# ---------------------------------------------------------------- GEMMs
# A linear layer Y = X W (W stored [in, out], as GPT-2's checkpoints) needs three GEMMs of the
# same cost 2*M*K*N: forward X @ W, backward dX = dY @ W^T (matmul_nt) and dW = X^T @ dY
# (matmul_tn). Each is C (M, N) = op(A) (M, K) @ op(B) (K, N), the lettering of gemm.cu, with
# op a transpose of the operand's last two axes where the name says t. Leading dimensions are
# batch dimensions (attention's B, H).

# How they use the two cores. Measured in the default training step (gpt2-mini, B=8, T=128,
# fp32; 2-core Xeon, AVX-512, NumPy 2.4's OpenBLAS 0.3.31; GFLOP/s, median of 13 steps taken
# in turn with the old way, in which every GEMM was split along M or N by us at one BLAS thread):
#                                                 split by us    as below
#   layers  X W (1024 x 128) @ (128 x 384) + b        124           139
#           dX = dY W^T (1024 x 128) @ (128 x 128)     92           138
#           dW = X^T dY (512 x 1024) @ (1024 x 128)   136           157   (K halves)
#   head    x wte^T (256 x 128) @ (128 x 50304)       176           197
#           dX (256 x 50304) @ (50304 x 128)          181           227   (K halves)
#           dW (50304 x 256) @ (256 x 128)            188           218
#   all 60 GEMMs of the step                          174           204   (254 -> 217 ms)
# So, with OpenBLAS's idle workers asleep (_blas_workers_sleep_when_idle), one threaded
# OpenBLAS call per GEMM: it hands out the parts to its workers without our pool's wake-up and
# wait (20-70 us a round trip, against 0.1-0.7 ms for a layer's GEMM). A long K (K >= 2
# max(M, N): the head's dX, the layers' dW) is cut in two halves, one per core, summed
# afterwards: for the head's dX each core reads half of wte (12.9 MB) instead of all of it.
# OpenBLAS alone did the layers' dW a little faster when the machine was quiet (188 against
# 157 GFLOP/s above), but its threads wait for each other at each of its K blocks by
# spinning, and with another process on one core its calls at K = 1024 stalled for tens of
# ms (matmul_tn 364 ms a step instead of 198); the two halves are independent calls.
# Without a way to put the workers to sleep (another BLAS, an OpenBLAS without those
# symbols) the GEMMs still split along M or N themselves at one BLAS thread, or the row
# kernels after them would run at half speed.
# Every element of C is one BLAS dot product over K (OpenBLAS threads split M and N only), or
# the fixed sum of its two halves whatever the core count, so results are deterministic and
# do not depend on the number of cores.
# Not reached: 85% of the 1024^3 peak (~300 GFLOP/s). OpenBLAS zeroes C in a pass of its own
# before it accumulates into it (beta = 0): 2.9 ms a core for the head's 51.5 MB of logits,
# and at K = 128 its kernel makes ~136 GFLOP/s a core even in cache (152 at K = 1024), so x
# wte^T tops out near 75% of the peak (220 GFLOP/s alone, ~200 in the step).

_GEMM_SPLIT = 1 << 22  # multiply-adds (batch*M*K*N) from which a GEMM uses all the cores
_LONG_K = 2  # K >= _LONG_K * max(M, N): a long K, cut in two halves
_BLAS_QUIET = _blas_workers_sleep_when_idle()


def _gemm(a, b, bias=None):
    """C (..., M, N) = a (..., M, K) @ b (..., K, N) [+ bias (N,)] in fp32, a and b possibly
    transposed views (BLAS reads them as they are, without a copy), on all the cores."""
    a, b = _f32(a), _f32(b)
    (M, K), N = a.shape[-2:], b.shape[-1]
    # multiply-adds: batch x M x K x N (a's batch or b's, whichever broadcasts over the other)
    big = max(math.prod(a.shape[:-2]), math.prod(b.shape[:-2])) * M * K * N >= _GEMM_SPLIT
    if big and K >= _LONG_K * max(M, N):
        c = _gemm_k_halves(a, b)
    elif _BLAS_QUIET:
        c = np.matmul(a, b)  # OpenBLAS threads it (below its own threshold it does not)
    else:
        c = _gemm_split(a, b, big)
    if bias is not None:
        c += _f32(bias)
    return c


def _gemm_k_halves(a, b):
    """a @ b as a[..., :K/2] @ b[:K/2] + a[..., K/2:] @ b[K/2:], the halves on two cores (one
    after the other on one core: the same sum), each one single-threaded BLAS call."""
    K = a.shape[-1]
    halves, parts = (slice(0, K // 2), slice(K // 2, K)), [None, None]

    def half(lo, hi):
        for i in range(lo, hi):
            parts[i] = np.matmul(a[..., halves[i]], b[..., halves[i], :])

    with _one_blas_thread():
        _in_parallel(2, half, chunk_rows=1, blocks=min(2, _THREADS))
    return np.add(parts[0], parts[1], out=parts[0])


def _gemm_split(a, b, big):
    """a @ b split across the cores (when big) along the longer of M and N, each part one
    single-threaded BLAS call that writes its slice of C."""
    M, N = a.shape[-2], b.shape[-1]
    c = np.empty(
        np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (M, N), dtype=np.result_type(a, b)
    )

    def columns(lo, hi):
        np.matmul(a, b[..., lo:hi], out=c[..., lo:hi])

    def rows(lo, hi):
        np.matmul(a[..., lo:hi, :], b, out=c[..., lo:hi, :])

    n, part = (N, columns) if N > M else (M, rows)
    with _one_blas_thread():
        _in_parallel(n, part, chunk_rows=n, blocks=_THREADS if big else 1)
    return c


def matmul(a, b, bias=None):
    """(..., M, K) @ (..., K, N) [+ bias (N,)] -> (..., M, N)."""
    return _round(_gemm(a, b, bias), a.dtype)


def matmul_nt(a, b):
    """(..., M, K) @ (..., N, K)^T -> (..., M, N)."""
    return _round(_gemm(a, b.swapaxes(-1, -2)), a.dtype)


def matmul_tn(a, b):
    """(..., K, M)^T @ (..., K, N) -> (..., M, N)."""
    return _round(_gemm(a.swapaxes(-1, -2), b), a.dtype)


# ---------------------------------------------------------------- elementwise


def _splits(a, b, out, dtype):
    """Whether a (op) b runs in flat blocks: a large C-contiguous a of the result dtype, b of
    its shape (C-contiguous) or one value, out None or C-contiguous of a's shape."""
    if not (
        isinstance(a, np.ndarray)
        and a.dtype == dtype
        and a.size >= 2 * _CHUNK
        and a.flags.c_contiguous
    ):
        return False
    if out is not None and not (out.shape == a.shape and out.flags.c_contiguous):
        return False
    if not isinstance(b, np.ndarray):
        return True  # a Python scalar
    return (b.size == 1 and b.ndim <= a.ndim) or (b.shape == a.shape and b.flags.c_contiguous)


def _binary(ufunc):
    """a (op) b with NumPy broadcasting; either side may be a Python scalar. A large a with a b
    of its shape or one value (the residual adds, dW summed over the LM head's row blocks,
    gradients scaled in place) runs in flat blocks, one per core."""

    def kernel(a, b, out=None):
        dtype = np.result_type(*[x.dtype for x in (a, b) if isinstance(x, np.ndarray)])
        if dtype in (dtypes.float16, dtypes.bfloat16):
            return _round(np.asarray(ufunc(_f32(a), _f32(b))), dtype, out)
        if not _splits(a, b, out, dtype):
            return np.asarray(ufunc(a, b, out=out))  # asarray: 0-d results stay arrays
        out = np.empty(a.shape, dtype) if out is None else out
        fa, fo = a.reshape(-1), out.reshape(-1)
        fb = b.reshape(-1) if isinstance(b, np.ndarray) else b  # (n,), (1,) or a scalar
        one = not isinstance(b, np.ndarray) or b.size == 1
        _in_parallel(
            fa.size, lambda lo, hi: ufunc(fa[lo:hi], fb if one else fb[lo:hi], out=fo[lo:hi])
        )
        return out

    kernel.__name__ = ufunc.__name__
    return kernel


add = _binary(np.add)
sub = _binary(np.subtract)
mul = _binary(np.multiply)
div = _binary(np.divide)


def neg(a):
    return np.asarray(np.negative(a))


def contiguous(a):
    """A C-contiguous copy (reshaping a transposed view needs one; made explicit so it counts)."""
    return np.ascontiguousarray(a)


def cast(a, dtype):
    return a.astype(dtype)


def copy(dst, src):
    """dst[...] = src (in place; dst may be a view, e.g. a slice of a KV cache)."""
    dst[...] = src
    return dst


def fill(dst, value):
    """dst[...] = value, in place. A contiguous dst (the flat gradient buffers, 29 MB for
    gpt2-mini) is filled in blocks, one per core: one core's memset runs at about half the
    machine's write bandwidth (3.1 ms -> 1.7 ms for 7.26M fp32 on 2 cores)."""
    flat = dst.reshape(-1) if dst.flags.c_contiguous else None
    if flat is None:
        dst.fill(value)
    else:
        _in_parallel(flat.shape[0], lambda lo, hi: flat[lo:hi].fill(value), chunk_rows=1 << 20)
    return dst


def concat(arrays, axis):
    return np.concatenate(arrays, axis=axis)


def index_bwd(dy, shape, index):
    """Gradient of x[index] for a basic index (ints, slices, None, ...: ops.getitem allows only
    these, so no element is hit twice): zeros of x's shape with dy written at index."""
    dx = np.zeros(shape, dtype=dy.dtype)
    dx[index] = dy
    return dx


def sum(a, axis=None, keepdims=False):
    """Sum in fp32 (fp64 for fp64 inputs), result in a's dtype."""
    total = np.sum(a, axis=axis, keepdims=keepdims, dtype=dtypes.compute_dtype(a.dtype))
    return _round(np.asarray(total), a.dtype)


_GELU_C = math.sqrt(2.0 / math.pi)  # a Python float: fp32 arrays stay fp32, fp64 stay exact


def _gelu_tanh(xf, x2=None):
    """t = tanh(sqrt(2/pi) (x + 0.044715 x^3)), in a fresh buffer (x*x*x, not x**3: NumPy's
    float32 power is ~25x slower than two multiplies). x2: x*x when the caller has it."""
    t = xf * xf if x2 is None else x2 * 0.044715
    if x2 is None:
        t *= 0.044715
    t += 1.0
    t *= xf
    t *= _GELU_C
    return np.tanh(t, out=t)


def _elementwise(x, *others, body):
    """Run body(out_block, x_block, *other_blocks) over flat blocks in parallel -> out."""
    out = np.empty(x.shape, dtype=x.dtype)
    flat = [a.reshape(-1) for a in (out, x) + others]
    _in_parallel(x.size, lambda lo, hi: body(*[a[lo:hi] for a in flat]))
    return out


def _into(out, a, b, ufunc):
    """out[...] = ufunc(a, b), computed straight into out when out has a's dtype (one pass
    fewer than a temporary and a copy), else rounded into it."""
    if out.dtype == a.dtype:
        ufunc(a, b, out=out)
    else:
        out[...] = ufunc(a, b, out=a)


def gelu_fwd(x):
    """GPT-2's GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""

    def body(out, x):
        xf = _f32(x)
        t = _gelu_tanh(xf)
        t += 1.0
        t *= xf
        _into(out, t, 0.5, np.multiply)

    return _elementwise(x, body=body)


def gelu_bwd(x, dy):
    """dx = dy * (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)).
    18 passes over each chunk, 3 temporaries: x^2 is computed once for t and inner, and its
    buffer then holds 1 - t^2 (the same operations as computing each on its own)."""

    def body(out, x, dy):
        xf = _f32(x)
        x2 = xf * xf
        t = _gelu_tanh(xf, x2)
        inner = x2 * (3 * 0.044715)  # 0.5 x sqrt(2/pi) (1 + 3 * 0.044715 x^2)
        inner += 1.0
        inner *= xf
        inner *= 0.5 * _GELU_C
        sech2 = np.multiply(t, t, out=x2)  # 1 - t^2
        np.subtract(1.0, sech2, out=sech2)
        inner *= sech2
        t += 1.0
        t *= 0.5
        t += inner
        _into(out, t, _f32(dy), np.multiply)

    return _elementwise(x, dy, body=body)


def dropout_fwd(x, p, seed):
    """Inverted dropout: keep with probability 1-p, scale kept values by 1/(1-p).
    Returns (y, mask) with mask in x's dtype holding 0 or 1/(1-p)."""
    keep = np.random.default_rng(seed).random(x.shape, dtype=np.float32) >= p
    mask = (keep / np.float32(1.0 - p)).astype(x.dtype)
    return mul(x, mask), mask


# ---------------------------------------------------------------- row reductions
# NumPy runs a broadcast a (r, C) * w (C,) as r inner loops of C elements, and at C = 128 the
# per-loop overhead doubles the pass (1024 x 128 fp32: 0.04 ms, 0.017 ms flat). So weight-like
# (C,) operands are tiled to _TILE elements once per call, and a block of rows is viewed as
# fewer, longer rows that the tiled vector broadcasts along: the same elementwise operations,
# bit for bit.
_TILE = 1 << 13


def _row_tiled(vec, rows):
    """vec (C,) repeated k = min(rows, _TILE // C) times -> (k C,): no more copies than rows
    (a decode step's one row gets vec itself, a copy fewer per call)."""
    k = max(1, min(rows, _TILE // vec.shape[0]))
    return vec if k == 1 else np.tile(vec, k)


def _long_rows(a, *tiled):
    """a (r, C) contiguous -> a viewed as (r / j, j C) and each tiled vector cut to (j C,),
    j the largest count of rows that divides r and fits the tiles."""
    r, C = a.shape
    j = math.gcd(r, tiled[0].shape[0] // C) if r else 1
    return (a.reshape(r // j, j * C),) + tuple(t[: j * C] for t in tiled)


def layernorm_fwd(x, weight, bias, eps=1e-5):
    """x (..., C) -> y (..., C), mean (...,) fp32, rstd (...,) fp32 (saved for backward)."""
    C = x.shape[-1]
    stat = dtypes.compute_dtype(x.dtype)
    xs = x.reshape(-1, C)
    y = np.empty(xs.shape, dtype=x.dtype)
    mean, rstd = np.empty(xs.shape[0], dtype=stat), np.empty(xs.shape[0], dtype=stat)
    wt, bt = _row_tiled(_f32(weight), xs.shape[0]), _row_tiled(_f32(bias), xs.shape[0])

    def rows(lo, hi):
        # six passes over the (r, C) chunk: row sums by einsum (3x faster than .mean here), the
        # centred copy xc, its sum of squares (einsum, no x*x temporary), * rstd, * w, + b
        # straight into y. Same formula as rownorm.cu: mean = sum(x)/C, var = sum((x-mean)^2)/C,
        # y = ((x - mean) rstd) w + b (einsum sums in another order than np.mean: an ulp).
        xr = xs[lo:hi]
        mu = np.einsum("rc->r", xr, dtype=stat)
        mu /= C
        xc = np.subtract(xr, mu[:, None], dtype=stat)  # (r, C), a private buffer
        var = np.einsum("rc,rc->r", xc, xc)
        var /= C
        var += eps
        rs = np.divide(1.0, np.sqrt(var, out=var), out=var)
        mean[lo:hi], rstd[lo:hi] = mu, rs
        xc *= rs[:, None]
        xl, wl, bl = _long_rows(xc, wt, bt)
        xl *= wl
        if y.dtype == stat:
            np.add(xl, bl, out=y[lo:hi].reshape(xl.shape))
        else:
            xl += bl
            y[lo:hi] = xc

    # half the default chunk: x's rows, xc and y's rows then stay in L2 (512 rows at C = 128)
    _in_parallel(xs.shape[0], rows, per_row=C, chunk_rows=max(1, _CHUNK // 2 // C))
    return y.reshape(x.shape), mean.reshape(x.shape[:-1]), rstd.reshape(x.shape[:-1])


def layernorm_bwd(dy, x, weight, mean, rstd):
    """-> dx (..., C), dweight (C,), dbias (C,).
    With xhat = (x - mean) rstd and g = dy * weight:
    dx = rstd (g - mean(g) - xhat mean(g xhat)), dweight = sum(dy xhat), dbias = sum(dy).
    dweight and dbias are summed per row block, then over the blocks in order."""
    C = x.shape[-1]
    dys, xs = dy.reshape(-1, C), x.reshape(-1, C)
    means, rstds = mean.reshape(-1, 1), rstd.reshape(-1, 1)
    dx = np.empty(xs.shape, dtype=x.dtype)
    stat = dtypes.compute_dtype(x.dtype)
    wt = _row_tiled(_f32(weight), xs.shape[0])
    partials = {}

    def rows(lo, hi):
        # per (r, C) chunk: two temporaries (xhat, g), row means by einsum (no g * xhat
        # temporary), w through the long-row view (see _row_tiled), rstd straight into dx
        dyf = _f32(dys[lo:hi])
        xhat = np.subtract(xs[lo:hi], means[lo:hi], dtype=stat)
        xhat *= rstds[lo:hi]
        partials[lo] = (np.einsum("rc,rc->c", dyf, xhat), dyf.sum(axis=0))
        dl, wl = _long_rows(dyf, wt)
        g = np.multiply(dl, wl).reshape(dyf.shape)  # dy w
        mean_g = np.einsum("rc->r", g)[:, None]
        mean_g /= C
        mean_gx = np.einsum("rc,rc->r", g, xhat)[:, None]
        mean_gx /= C
        xhat *= mean_gx
        g -= mean_g
        g -= xhat  # g - mean(g) - xhat mean(g xhat)
        if dx.dtype == stat:
            np.multiply(g, rstds[lo:hi], out=dx[lo:hi])
        else:
            g *= rstds[lo:hi]
            dx[lo:hi] = g

    # half the default chunk, as layernorm_fwd: the rows and both temporaries stay in L2
    _in_parallel(xs.shape[0], rows, per_row=C, chunk_rows=max(1, _CHUNK // 2 // C))
    zero_rows = [(np.zeros(C), np.zeros(C))]  # no rows: dweight = dbias = zeros (C,)
    blocks = [partials[k] for k in sorted(partials)] or zero_rows
    dweight = np.sum([p[0] for p in blocks], axis=0)
    dbias = np.sum([p[1] for p in blocks], axis=0)
    return dx.reshape(x.shape), _round(dweight, weight.dtype), _round(dbias, weight.dtype)


_CAUSAL_MASKS = {}


def _future_mask(Tq, Tk, dtype):
    """(Tq, Tk) additive mask: -inf where query i (the last Tq of Tk positions) would look at a
    future key, 0 elsewhere. Adding it is one vectorized pass, unlike a boolean scatter."""
    key = (Tq, Tk, dtype)
    if key not in _CAUSAL_MASKS:
        future = np.triu(np.ones((Tq, Tk), dtype=bool), k=Tk - Tq + 1)
        _CAUSAL_MASKS[key] = np.where(future, -np.inf, 0.0).astype(dtype)
    return _CAUSAL_MASKS[key]


def softmax_causal_fwd(scores, scale):
    """scores (..., Tq, Tk) -> probs of softmax(scale * scores) over keys, future keys masked.
    Query i is position Tk - Tq + i, so Tq < Tk serves a KV-cache decode step."""
    Tq, Tk = scores.shape[-2:]
    acc = dtypes.compute_dtype(scores.dtype)
    mask = _future_mask(Tq, Tk, acc)
    ss = scores.reshape(-1, Tq, Tk)
    probs = np.empty(ss.shape, dtype=scores.dtype)

    def heads(lo, hi):
        s = ss[lo:hi].astype(acc)  # a private copy, worked in place
        s *= acc.type(scale)
        s += mask
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        probs[lo:hi] = s

    _in_parallel(ss.shape[0], heads, per_row=Tq * Tk)
    return probs.reshape(scores.shape)


def softmax_causal_bwd(probs, dprobs, scale):
    """dscores = scale * probs * (dprobs - sum(dprobs * probs over keys)); masked entries get 0
    because their probs are 0."""
    Tq, Tk = probs.shape[-2:]
    ps, dps = probs.reshape(-1, Tq, Tk), dprobs.reshape(-1, Tq, Tk)
    dscores = np.empty(ps.shape, dtype=probs.dtype)

    def heads(lo, hi):
        p, dp = _f32(ps[lo:hi]), _f32(dps[lo:hi])
        ds = dp - np.sum(dp * p, axis=-1, keepdims=True)
        ds *= p
        ds *= scale
        dscores[lo:hi] = ds

    _in_parallel(ps.shape[0], heads, per_row=Tq * Tk)
    return dscores.reshape(probs.shape)


# ---------------------------------------------------------------- flash attention
# Causal attention in blocks of queries and keys (FlashAttention-2, Dao 2023): the scores of a
# (query block, key block) pair live only while that pair is worked on, so memory is O(T·D) per
# head, never the (Tq, Tk) matrix, and key blocks wholly after a query block are skipped. Each
# pair is a few batched matmuls over a range of the B*H heads at once. Query i is at position
# Tk - Tq + i, as in softmax_causal_fwd (Tq < Tk: a KV-cache decode step or a prompt after one).
# Block sizes, measured (forward + backward, fp32) on a 2-core Xeon with AVX-512: 64 x 64 beat
# 32, 128 and 256 at gpt2-mini's (B, H, T, D) = (8, 4, 128, 32) and at GPT-2's (1, 12, 1024, 64)
# (72 ms there, 110-200 ms for the others). Smaller blocks pay NumPy's per-call overhead more
# often; larger ones compute more of the masked half of each diagonal block (and, when that
# was measured, OpenBLAS threaded each GEMM from 128 on, fighting the head threads).
# The scores of a pair are kept transposed, sT (heads, keys, queries) = k_j (q_i scale)^T, with
# q pre-transposed once per call: the softmax's max and sum over keys are then reductions over
# an outer axis, which NumPy vectorizes across the queries (over the last axis, 64 at a time,
# the max alone took 40% of the forward: 0.12 ms for 16 heads' 64 x 64 block, 0.034 ms this
# way). The matmuls that need s itself take sT.swapaxes, which BLAS reads at no cost. BLAS runs
# single-threaded here (_one_blas_thread): the heads are split across the cores instead.
FLASH_BQ = 64  # queries per block (kernels.py counts FLOPs by it; attention.cu's tiles too)
FLASH_BK = 64  # keys per block
_CAUSAL_MASKS_T = {}


def _flash_pair(Tq, Tk, i0, i1, j0, dtype):
    """For query block [i0, i1) and the key block starting at j0: the end j1 of the keys it
    sees (the block cut at its last query's position) and the pair's additive mask, transposed
    as the scores are: (j1 - j0, bq), -inf where a key comes after a query (a view of a cached
    transpose of the naive softmax's mask), or None when every query sees every key."""
    first = Tk - Tq + i0  # position of the block's first query
    j1 = min(j0 + FLASH_BK, first + i1 - i0)
    if j1 - 1 <= first:
        return j1, None
    key = (Tq, Tk, dtype)
    if key not in _CAUSAL_MASKS_T:
        _CAUSAL_MASKS_T[key] = np.ascontiguousarray(_future_mask(Tq, Tk, dtype).T)  # (Tk, Tq)
    return j1, _CAUSAL_MASKS_T[key][j0:j1, i0:i1]


def _heads_t(a, scale=None):
    """a (B, H, T, D) (any strides) -> (B, H, D, T) contiguous in the compute dtype, times
    scale if given."""
    B, H, T, D = a.shape
    out = np.empty((B, H, D, T), dtype=dtypes.compute_dtype(a.dtype))
    if scale is None:
        np.copyto(out, a.swapaxes(-1, -2))
    else:
        np.multiply(_f32(a).swapaxes(-1, -2), scale, out=out)
    return out


def _by_heads(H, body, work):
    """Run body(h0, h1) over head ranges, one per core when the work (scores per head) is large
    enough, with BLAS on one thread. Heads are independent, so the split changes no result.
    (q, k, v come in as strided views of the (B, T, 3C) projection, so the kernels index
    (B, H', ...) ranges of them rather than reshape to B*H heads, which would copy.)"""
    with _one_blas_thread():
        _in_parallel(H, body, per_row=work, chunk_rows=H)


def flash_attention_fwd(q, k, v, scale):
    """q (B, H, Tq, D), k and v (B, H, Tk, D), Tk >= Tq -> out (B, H, Tq, D) =
    softmax(scale q k^T, future keys masked) v, and lse (B, H, Tq) fp32 (fp64 for fp64): the
    log-sum-exp of each query's scaled scores, all that backward needs of the softmax.
    Per query block, over its key blocks in order, the online softmax keeps m (running max),
    lsum (running sum of exp(s - m)), both (B, H', 1, bq) over the heads [h0, h1), and o
    (running sum of exp(s - m) v, (B, H', bq, D)); a block with a larger max rescales lsum and o by
    exp(m_old - m_new). Key 0 is in the first block and every query sees it, so m is finite
    from then on (no -inf minus -inf); that first block sets m, lsum and o directly (what the
    update gives from m = -inf, lsum = o = 0, bit for bit)."""
    B, H, Tq, D = q.shape
    Tk = k.shape[-2]
    acc = dtypes.compute_dtype(q.dtype)
    qT = _heads_t(q, acc.type(scale))  # (B, H, D, Tq), scaled
    ks, vs = _f32(k), _f32(v)  # (B, H, Tk, D)
    out = np.empty(q.shape, dtype=q.dtype)
    lse = np.empty(q.shape[:-1], dtype=acc)

    def heads(h0, h1):
        for i0 in range(0, Tq, FLASH_BQ):
            i1 = min(i0 + FLASH_BQ, Tq)
            qTi = qT[:, h0:h1, :, i0:i1]  # (B, H', D, bq)
            for j0 in range(0, Tk - Tq + i1, FLASH_BK):  # no key after the block
                j1, maskT = _flash_pair(Tq, Tk, i0, i1, j0, acc)
                sT = np.matmul(ks[:, h0:h1, j0:j1], qTi)  # (B, H', n, bq) = s^T
                if maskT is not None:
                    sT += maskT
                if j0 == 0:
                    m = sT.max(axis=-2, keepdims=True)  # (B, H', 1, bq)
                    sT -= m
                    np.exp(sT, out=sT)  # p^T, unnormalized
                    lsum = sT.sum(axis=-2, keepdims=True)
                    o = np.matmul(sT.swapaxes(-1, -2), vs[:, h0:h1, j0:j1])  # (B, H', bq, D)
                    continue
                m_new = np.maximum(m, sT.max(axis=-2, keepdims=True))
                sT -= m_new
                np.exp(sT, out=sT)
                alpha = np.exp(m - m_new)
                lsum *= alpha
                lsum += sT.sum(axis=-2, keepdims=True)
                o *= alpha.swapaxes(-1, -2)  # (B, H', bq, 1)
                o += np.matmul(sT.swapaxes(-1, -2), vs[:, h0:h1, j0:j1])
                m = m_new
            if out.dtype == acc:
                np.divide(o, lsum.swapaxes(-1, -2), out=out[:, h0:h1, i0:i1])
            else:
                o /= lsum.swapaxes(-1, -2)
                out[:, h0:h1, i0:i1] = o
            lse[:, h0:h1, i0:i1] = (m + np.log(lsum))[..., 0, :]

    _by_heads(H, heads, B * Tq * Tk)
    return out, lse


def flash_attention_bwd(q, k, v, out, lse, dout, scale):
    """-> dq (B, H, Tq, D), dk and dv (B, H, Tk, D) of flash_attention_fwd, from its inputs, its
    out and lse, and dout (B, H, Tq, D). FlashAttention-2's backward: with Di = rowsum(dout *
    out) (B, H, Tq), each block pair's probabilities are recomputed as p = exp(s - lse), then
    dv += p^T dout, dp = dout v^T, ds = p (dp - Di), dq += scale ds k, dk += scale ds^T q, over
    the same block pairs as the forward. Key blocks are the outer loop, as in attention.cu: a
    key block's dk, dv are complete after one sweep of its query blocks; dq is summed over
    the key blocks in order. The first term of each sum is written, not added to zeros (the
    same bits, one pass fewer). p and ds are kept
    transposed, (B, H', keys, queries), as the forward's scores."""
    B, H, Tq, D = q.shape
    Tk = k.shape[-2]
    acc = dtypes.compute_dtype(q.dtype)
    scale = acc.type(scale)
    ks, vs, dos = _f32(k), _f32(v), _f32(dout)  # (B, H, T, D)
    Di = np.einsum("bhtd,bhtd->bht", dos, _f32(out), dtype=acc)[..., None, :]
    lseT = lse.astype(acc, copy=False)[..., None, :]  # Di, lseT: (B, H, 1, Tq)
    qT, doT = _heads_t(q, scale), _heads_t(dout)  # (B, H, D, Tq)
    qh = _f32(q) * scale  # (B, H, Tq, D)
    dq = np.empty(q.shape, dtype=acc)  # set by key block 0 (every query sees key 0)
    dk, dv = np.empty(k.shape, dtype=acc), np.empty(v.shape, dtype=acc)

    def heads(h0, h1):
        # Query blocks are taken a few at a time (span queries), as many as keep p^T and ds^T
        # (B, H', bk, span) near _CHUNK elements: fewer, larger GEMMs (NumPy calls BLAS once per
        # head and pair). The queries are independent, so only dk and dv's sums change order.
        span = FLASH_BQ * max(1, _CHUNK // (B * (h1 - h0) * FLASH_BK * FLASH_BQ))
        for j0 in range(0, Tk, FLASH_BK):
            kj, vj = ks[:, h0:h1, j0 : j0 + FLASH_BK], vs[:, h0:h1, j0 : j0 + FLASH_BK]
            dkj, dvj = dk[:, h0:h1, j0 : j0 + FLASH_BK], dv[:, h0:h1, j0 : j0 + FLASH_BK]
            first = max(0, j0 - (Tk - Tq)) // FLASH_BQ * FLASH_BQ  # the first query block
            for i0 in range(first, Tq, span):  # that sees key j0
                i1 = min(i0 + span, Tq)
                j1, maskT = _flash_pair(Tq, Tk, i0, i1, j0, acc)
                n = j1 - j0  # the keys it sees
                pT = np.matmul(kj[..., :n, :], qT[:, h0:h1, :, i0:i1])  # (B, H', n, bq)
                if maskT is not None:
                    pT += maskT
                pT -= lseT[:, h0:h1, :, i0:i1]
                np.exp(pT, out=pT)  # p^T
                dsT = np.matmul(vj[..., :n, :], doT[:, h0:h1, :, i0:i1])  # dp^T
                dsT -= Di[:, h0:h1, :, i0:i1]
                dsT *= pT  # ds^T
                if j0 == 0:
                    np.matmul(dsT.swapaxes(-1, -2), kj[..., :n, :], out=dq[:, h0:h1, i0:i1])
                else:
                    dq[:, h0:h1, i0:i1] += np.matmul(dsT.swapaxes(-1, -2), kj[..., :n, :])
                doi, qi = dos[:, h0:h1, i0:i1], qh[:, h0:h1, i0:i1]  # qi carries the scale
                if i0 == first:
                    np.matmul(pT, doi, out=dvj[..., :n, :])
                    np.matmul(dsT, qi, out=dkj[..., :n, :])
                    dvj[..., n:, :] = 0
                    dkj[..., n:, :] = 0
                else:
                    dvj[..., :n, :] += np.matmul(pT, doi)
                    dkj[..., :n, :] += np.matmul(dsT, qi)
        dq[:, h0:h1] *= scale

    _by_heads(H, heads, B * Tq * Tk)
    return _round(dq, q.dtype), _round(dk, k.dtype), _round(dv, v.dtype)


# Cross-entropy is two kernels over the (N, V) logits. The forward reads them once for the
# loss and the log-sum-exp; the backward reads them once more and writes dlogits with the
# upstream gradient (loss scale included) folded in, so small fp16 gradients are scaled before
# they are rounded. (Writing dlogits in the forward, llm.c style, would round them unscaled.)
# A caller that knows dloss in the forward and keeps dlogits in fp32 (the fused LM head's
# precompute design) runs cross_entropy_fwd_bwd instead: both in one pass, one exp per logit.
# All work a few rows at a time: each chunk (about 1.6 MB of fp32 at V = 50,257) stays in
# cache across the max, exp, sum and scale steps, so each pass touches memory once.
_CE_ROWS = 8


def _minus_rowwise(x, row_values, out):
    """out = x - row_values[:, None] in fp32, reading x (any float dtype) once."""
    if x.dtype == out.dtype:
        return np.subtract(x, row_values[:, None], out=out)
    out[...] = x
    out -= row_values[:, None]
    return out


def check_targets(targets, n_classes):
    """Raise ValueError unless every target is -1 (ignored) or in [0, n_classes): the kernels
    index each row with it, past the row's end (CUDA) or, in a padded row, at a padding column.
    Both backends call it; on CuPy min and max are device reductions, read by int()."""
    if targets.size:
        lo, hi = int(targets.min()), int(targets.max())
        if lo < -1 or hi >= n_classes:
            raise ValueError(
                f"target id {lo if lo < -1 else hi} out of range for vocab {n_classes}"
            )


def cross_entropy_fwd(logits, targets, n_classes=None):
    """logits (N, Vp), targets (N,) int with -1 = ignore -> (losses (N,) fp32, 0 if ignored;
    lse (N,) fp32, the log-sum-exp of each row, saved for backward), over the first
    V = n_classes columns (default all Vp; the columns past V are padding and are not read).
    Stable for large logits: the row max is subtracted before exp."""
    acc = dtypes.compute_dtype(logits.dtype)
    N, Vp = logits.shape
    V = Vp if n_classes is None else n_classes
    check_targets(targets, V)
    losses, lse = np.empty(N, dtype=acc), np.empty(N, dtype=acc)

    def rows(lo, hi):
        x, t = logits[lo:hi, :V], targets[lo:hi]
        m = x.max(axis=1).astype(acc)
        e = _minus_rowwise(x, m, np.empty(x.shape, acc))
        np.exp(e, out=e)
        lse[lo:hi] = np.log(e.sum(axis=1)) + m
        picked = np.take_along_axis(x, np.maximum(t, 0)[:, None], axis=1)[:, 0].astype(acc)
        losses[lo:hi] = np.where(t >= 0, lse[lo:hi] - picked, 0.0)

    _in_parallel(N, rows, per_row=V, chunk_rows=_CE_ROWS)
    return losses, lse


def cross_entropy_bwd(logits, lse, targets, dloss, n_classes=None):
    """dlogits (N, Vp) = dloss * (softmax(logits) - onehot(target)) in the first V = n_classes
    columns (default all Vp) and exactly 0 in the padding columns past V, zero rows for ignored
    targets; dloss is a 1-element array (the upstream gradient over the count of targets)."""
    acc = dtypes.compute_dtype(logits.dtype)
    d = acc.type(np.asarray(dloss).reshape(-1)[0])
    N, Vp = logits.shape
    V = Vp if n_classes is None else n_classes
    check_targets(targets, V)
    dlogits = np.empty(logits.shape, dtype=logits.dtype)

    def rows(lo, hi):
        t = targets[lo:hi]
        e = dlogits[lo:hi, :V] if logits.dtype == acc else np.empty((hi - lo, V), acc)  # fp32
        np.exp(_minus_rowwise(logits[lo:hi, :V], lse[lo:hi], e), out=e)  # softmax, from the lse
        valid = t >= 0
        e *= (valid * d)[:, None]
        e[np.flatnonzero(valid), t[valid]] -= d  # minus the one-hot target
        if logits.dtype != acc:
            dlogits[lo:hi, :V] = e
        dlogits[lo:hi, V:] = 0  # no gradient to padding

    _in_parallel(N, rows, per_row=V, chunk_rows=_CE_ROWS)
    return dlogits


def cross_entropy_fwd_bwd(logits, targets, dloss, n_classes=None, out=None):
    """cross_entropy_fwd's losses and cross_entropy_bwd's dlogits in one pass over each row:
    logits (N, Vp), targets (N,) int with -1 = ignore, dloss a 1-element array -> (losses (N,)
    fp32, dlogits (N, Vp) in the logits' dtype, 0 in the padding columns past V = n_classes).
    One exp per logit: e = exp(logit - max) sums to the row's s, which gives the loss
    (log s + max - logit[target], bitwise cross_entropy_fwd's), and e * dloss / s is the
    softmax part of dlogits: in fp32 a few ulps from cross_entropy_bwd's exp(logit - lse) *
    dloss, and closer to the exact value (logit - lse, rounded before its exp, is the larger
    error: off by a median 4 ulps against 1-3, at most 34 against 21, on GPT-2 rows). No lse:
    nobody needs it after. dlogits are written into out when given, which may be logits
    itself (a chunk of rows is read before it is overwritten), so no second (N, Vp) array
    exists. (softmax.cu's twin takes the exp twice: on a GPU bytes, not exps, bound it.)"""
    acc = dtypes.compute_dtype(logits.dtype)
    d = acc.type(np.asarray(dloss).reshape(-1)[0])
    N, Vp = logits.shape
    V = Vp if n_classes is None else n_classes
    check_targets(targets, V)
    losses = np.empty(N, dtype=acc)
    dlogits = np.empty(logits.shape, dtype=logits.dtype) if out is None else out

    def rows(lo, hi):
        x, t = logits[lo:hi, :V], targets[lo:hi]
        valid = t >= 0
        m = x.max(axis=1).astype(acc)  # both read x before
        picked = np.take_along_axis(x, np.maximum(t, 0)[:, None], axis=1)[:, 0].astype(acc)
        e = dlogits[lo:hi, :V] if logits.dtype == acc else np.empty((hi - lo, V), acc)  # fp32
        np.exp(_minus_rowwise(x, m, e), out=e)  # e (rows, V) overwrites it; the one exp
        s = e.sum(axis=1)
        losses[lo:hi] = np.where(valid, np.log(s) + m - picked, 0.0)
        e *= (valid * d / s)[:, None]  # softmax * dloss
        e[np.flatnonzero(valid), t[valid]] -= d  # minus the one-hot target
        if logits.dtype != acc:
            dlogits[lo:hi, :V] = e
        dlogits[lo:hi, V:] = 0  # no gradient to padding

    _in_parallel(N, rows, per_row=V, chunk_rows=_CE_ROWS)
    return losses, dlogits


# ---------------------------------------------------------------- embedding


def check_ids(idx, num_embeddings):
    """Raise ValueError unless every id is in [0, num_embeddings) (ops.embedding's message for
    host ids): NumPy would wrap a negative id around and raise IndexError for a large one, a
    CUDA kernel would read or write out of bounds. Both backends call it; on CuPy min and max
    are device reductions whose results int() reads back (a host sync)."""
    if idx.size:
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= num_embeddings:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} out of range for vocab {num_embeddings}")


def embedding_fwd(weight, idx):
    """weight (V, C), idx (...) int in [0, V) -> (..., C): a gather."""
    check_ids(idx, weight.shape[0])
    return weight[idx]


def embedding_bwd(dout, idx, num_embeddings):
    """dout (..., C) -> dweight (V, C), rows of repeated ids summed in a fixed order (sorted),
    so the result is deterministic."""
    check_ids(idx, num_embeddings)
    C = dout.shape[-1]
    flat_idx = idx.reshape(-1)
    order = np.argsort(flat_idx, kind="stable")
    ids, starts = np.unique(flat_idx[order], return_index=True)
    sums = np.add.reduceat(_f32(dout.reshape(-1, C))[order], starts, axis=0)  # (ids, C)
    # dweight (V, C) is mostly zero rows (wte: 25.8 MB of fp32 for 1024 ids): zeroed with the
    # parallel fill (np.zeros on reused heap memory is one core's memset), in dout's dtype
    # directly, so only the touched rows are rounded (each once, as before).
    dweight = fill(np.empty((num_embeddings, C), dtype=dout.dtype), 0)
    dweight[ids] = sums
    return dweight


# ---------------------------------------------------------------- optimizer

_NORM_PART = 1 << 18  # elements per partial sum of grad_norm_sq (1 MB of fp32)


def grad_norm_sq(grad):
    """Sum of squares of a flat gradient buffer in fp32 -> array (1,). inf/nan in the gradient
    make it non-finite, so the same number serves clipping and the overflow check."""
    g = _f32(grad)
    # A dot product per fixed part of _NORM_PART elements, the parts shared among the cores
    # (one core streams at half the memory bandwidth), then the partials summed in order: the
    # parts depend only on the size, so the result is the same for any core count.
    n_parts = -(-g.shape[0] // _NORM_PART)
    partials = np.zeros(n_parts, dtype=g.dtype)

    def parts(p0, p1):
        for p in range(p0, p1):
            part = g[p * _NORM_PART : (p + 1) * _NORM_PART]
            partials[p] = np.dot(part, part)

    with _one_blas_thread():  # each dot on its own thread: no OpenBLAS split either
        _in_parallel(n_parts, parts, per_row=_NORM_PART)
    return np.array([np.sum(partials)], dtype=g.dtype)


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
    """One fused AdamW update over flat buffers, in place. Returns nothing.

    master, m, v: fp32 (N,). grad: (N,) in the working dtype, multiplied by the loss scale.
    working: the 2-byte copy to refresh from master, or None when master is the working copy.
    norm_sq: (1,) sum of squares of the scaled gradient; if it is not finite (overflow) the
    step is skipped and nothing changes. The first n_decay elements get weight decay (the 2-D
    weights are packed first). Clipping to max_norm (0 = off) uses the unscaled norm.
    """
    scaled_norm_sq = float(norm_sq[0])
    if not np.isfinite(scaled_norm_sq):
        return
    g_coef = inv_scale
    if max_norm > 0:
        norm = np.sqrt(scaled_norm_sq) * inv_scale
        g_coef *= min(1.0, max_norm / (norm + 1e-6))
    # the bias corrections fold into two scalars: update = lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
    bc1, bc2 = 1 - beta1**step, 1 - beta2**step
    acc = master.dtype.type
    decay, lr_c, v_c = acc(1 - lr * weight_decay), acc(lr / bc1), acc(1 / np.sqrt(bc2))

    # one cache-sized chunk at a time: every buffer is read and written once per step, with no
    # N-sized temporaries
    def chunk(lo, hi):
        g = np.multiply(grad[lo:hi], acc(g_coef), dtype=master.dtype)  # unscaled, clipped
        mc, vc, wc = m[lo:hi], v[lo:hi], master[lo:hi]
        mc *= beta1
        d = np.multiply(g, 1 - beta1)
        mc += d  # m = b1 m + (1 - b1) g
        g *= g
        g *= 1 - beta2
        vc *= beta2
        vc += g  # v = b2 v + (1 - b2) g^2
        if weight_decay and lo < n_decay:  # decoupled decay, 2-D weights only
            wc[: n_decay - lo] *= decay
        np.sqrt(vc, out=d)
        d *= v_c
        d += eps
        np.divide(mc, d, out=d)
        d *= lr_c
        wc -= d
        if working is not None:
            working[lo:hi] = wc

    _in_parallel(master.shape[0], chunk)
