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
    return bool(libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1))


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
_THREADS = max(1, min(os.cpu_count() or 1, 8))
_CHUNK = 1 << 17            # elements per chunk: with a few fp32 temporaries, fits in L2
_pool = None


def _in_parallel(n, body, per_row=1, chunk_rows=None):
    """Call body(lo, hi) over [0, n) rows: one block per core (one block when the work is
    small), each block in chunks of chunk_rows rows (default: about _CHUNK elements)."""
    global _pool
    chunk_rows = chunk_rows or max(1, _CHUNK // per_row)
    blocks = max(1, min(_THREADS, n * per_row // _CHUNK, n))

    def block(start, stop):
        for lo in range(start, stop, chunk_rows):
            body(lo, min(lo + chunk_rows, stop))
    if blocks == 1:
        block(0, n)
        return
    if _pool is None:
        _pool = ThreadPoolExecutor(_THREADS, thread_name_prefix="tg-cpu")
    edges = [n * i // blocks for i in range(blocks + 1)]
    for job in [_pool.submit(block, lo, hi) for lo, hi in zip(edges, edges[1:])]:
        job.result()


# ---------------------------------------------------------------- GEMMs
# A linear layer Y = X W (W stored [in, out], as GPT-2's checkpoints) needs three GEMMs of the
# same cost 2*M*K*N: forward X @ W, backward dX = dY @ W^T (matmul_nt) and dW = X^T @ dY
# (matmul_tn). Each is C (M, N) = op(A) (M, K) @ op(B) (K, N), the lettering of gemm.cu, with
# op a transpose of the operand's last two axes where the name says t. Leading dimensions are
# batch dimensions (attention's B, H).

def matmul(a, b, bias=None):
    """(..., M, K) @ (..., K, N) [+ bias (N,)] -> (..., M, N)."""
    y = np.matmul(_f32(a), _f32(b))
    if bias is not None:
        y += _f32(bias)
    return _round(y, a.dtype)


def matmul_nt(a, b):
    """(..., M, K) @ (..., N, K)^T -> (..., M, N)."""
    return _round(np.matmul(_f32(a), _f32(b).swapaxes(-1, -2)), a.dtype)


def matmul_tn(a, b):
    """(..., K, M)^T @ (..., K, N) -> (..., M, N)."""
    return _round(np.matmul(_f32(a).swapaxes(-1, -2), _f32(b)), a.dtype)


# ---------------------------------------------------------------- elementwise

def _binary(ufunc):
    """a (op) b with NumPy broadcasting; either side may be a Python scalar."""
    def kernel(a, b, out=None):
        dtype = np.result_type(*[x.dtype for x in (a, b) if isinstance(x, np.ndarray)])
        if dtype in (dtypes.float16, dtypes.bfloat16):
            return _round(np.asarray(ufunc(_f32(a), _f32(b))), dtype, out)
        return np.asarray(ufunc(a, b, out=out))  # asarray: 0-d results stay arrays
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
    dst.fill(value)
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


def _gelu_tanh(xf):
    """t = tanh(sqrt(2/pi) (x + 0.044715 x^3)), in a fresh buffer (x*x*x, not x**3: NumPy's
    float32 power is ~25x slower than two multiplies)."""
    t = xf * xf
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


def gelu_fwd(x):
    """GPT-2's GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    def body(out, x):
        xf = _f32(x)
        t = _gelu_tanh(xf)
        t += 1.0
        t *= xf
        t *= 0.5
        out[...] = t
    return _elementwise(x, body=body)


def gelu_bwd(x, dy):
    """dx = dy * (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2))."""
    def body(out, x, dy):
        xf = _f32(x)
        t = _gelu_tanh(xf)
        inner = xf * xf                    # 0.5 x sqrt(2/pi) (1 + 3 * 0.044715 x^2)
        inner *= 3 * 0.044715
        inner += 1.0
        inner *= xf
        inner *= 0.5 * _GELU_C
        sech2 = t * t                      # 1 - t^2
        np.subtract(1.0, sech2, out=sech2)
        inner *= sech2
        t += 1.0
        t *= 0.5
        t += inner
        t *= _f32(dy)
        out[...] = t
    return _elementwise(x, dy, body=body)


def dropout_fwd(x, p, seed):
    """Inverted dropout: keep with probability 1-p, scale kept values by 1/(1-p).
    Returns (y, mask) with mask in x's dtype holding 0 or 1/(1-p)."""
    keep = np.random.default_rng(seed).random(x.shape, dtype=np.float32) >= p
    mask = (keep / np.float32(1.0 - p)).astype(x.dtype)
    return mul(x, mask), mask


# ---------------------------------------------------------------- row reductions

def layernorm_fwd(x, weight, bias, eps=1e-5):
    """x (..., C) -> y (..., C), mean (...,) fp32, rstd (...,) fp32 (saved for backward)."""
    C = x.shape[-1]
    stat = dtypes.compute_dtype(x.dtype)
    xs = x.reshape(-1, C)
    y = np.empty(xs.shape, dtype=x.dtype)
    mean, rstd = np.empty(xs.shape[0], dtype=stat), np.empty(xs.shape[0], dtype=stat)
    w, b = _f32(weight), _f32(bias)

    def rows(lo, hi):
        xc = xs[lo:hi].astype(stat)                       # a private copy, centred in place
        mean[lo:hi] = xc.mean(axis=1)
        xc -= mean[lo:hi, None]
        rstd[lo:hi] = 1.0 / np.sqrt(np.mean(xc * xc, axis=1) + eps)
        xc *= rstd[lo:hi, None]
        xc *= w
        xc += b
        y[lo:hi] = xc
    _in_parallel(xs.shape[0], rows, per_row=C)
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
    w = _f32(weight)
    partials = {}

    def rows(lo, hi):
        dyf = _f32(dys[lo:hi])
        xhat = (_f32(xs[lo:hi]) - means[lo:hi]) * rstds[lo:hi]
        partials[lo] = (np.einsum("rc,rc->c", dyf, xhat), dyf.sum(axis=0))
        g = dyf * w
        d = g - g.mean(axis=1, keepdims=True)
        xhat *= np.mean(g * xhat, axis=1, keepdims=True)
        d -= xhat
        d *= rstds[lo:hi]
        dx[lo:hi] = d
    _in_parallel(xs.shape[0], rows, per_row=C)
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
        s = ss[lo:hi].astype(acc)                         # a private copy, worked in place
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


# Cross-entropy is two kernels over the (N, V) logits. The forward reads them once for the
# loss and the log-sum-exp; the backward reads them once more and writes dlogits with the
# upstream gradient (loss scale included) folded in, so small fp16 gradients are scaled before
# they are rounded. (Writing dlogits in the forward, llm.c style, would round them unscaled.)
# Both work a few rows at a time: each chunk (about 1.6 MB of fp32 at V = 50,257) stays in
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
            raise ValueError(f"target id {lo if lo < -1 else hi} out of range for vocab "
                             f"{n_classes}")


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
        e = np.exp(_minus_rowwise(x, m, np.empty(x.shape, acc)))
        lse[lo:hi] = np.log(e.sum(axis=1)) + m
        picked = np.take_along_axis(x, np.maximum(t, 0)[:, None], axis=1)[:, 0].astype(acc)
        losses[lo:hi] = np.where(t >= 0, lse[lo:hi] - picked, 0.0)
    _in_parallel(N, rows, chunk_rows=_CE_ROWS)
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
        np.exp(_minus_rowwise(logits[lo:hi, :V], lse[lo:hi], e), out=e)   # softmax, from the lse
        valid = t >= 0
        e *= (valid * d)[:, None]
        e[np.flatnonzero(valid), t[valid]] -= d                      # minus the one-hot target
        if logits.dtype != acc:
            dlogits[lo:hi, :V] = e
        dlogits[lo:hi, V:] = 0                                       # no gradient to padding
    _in_parallel(N, rows, chunk_rows=_CE_ROWS)
    return dlogits


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
    dweight = np.zeros((num_embeddings, C), dtype=dtypes.compute_dtype(dout.dtype))
    dweight[ids] = np.add.reduceat(_f32(dout.reshape(-1, C))[order], starts, axis=0)
    return _round(dweight, dout.dtype)


# ---------------------------------------------------------------- optimizer

def grad_norm_sq(grad):
    """Sum of squares of a flat gradient buffer in fp32 -> array (1,). inf/nan in the gradient
    make it non-finite, so the same number serves clipping and the overflow check."""
    g = _f32(grad)
    return np.array([np.dot(g, g)], dtype=g.dtype)


def adamw_step(master, grad, m, v, working, norm_sq, *, lr, beta1, beta2, eps, weight_decay,
               n_decay, step, inv_scale, max_norm):
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
    bc1, bc2 = 1 - beta1 ** step, 1 - beta2 ** step
    acc = master.dtype.type
    decay, lr_c, v_c = acc(1 - lr * weight_decay), acc(lr / bc1), acc(1 / np.sqrt(bc2))
    # one cache-sized chunk at a time: every buffer is read and written once per step, with no
    # N-sized temporaries
    def chunk(lo, hi):
        g = grad[lo:hi].astype(master.dtype)      # a private copy
        mc, vc, wc = m[lo:hi], v[lo:hi], master[lo:hi]
        g *= acc(g_coef)                          # unscaled, clipped gradient
        mc *= beta1
        d = np.multiply(g, 1 - beta1)
        mc += d                                   # m = b1 m + (1 - b1) g
        g *= g
        g *= 1 - beta2
        vc *= beta2
        vc += g                                   # v = b2 v + (1 - b2) g^2
        if weight_decay and lo < n_decay:         # decoupled decay, 2-D weights only
            wc[:n_decay - lo] *= decay
        np.sqrt(vc, out=d)
        d *= v_c
        d += eps
        np.divide(mc, d, out=d)
        d *= lr_c
        wc -= d
        if working is not None:
            working[lo:hi] = wc
    _in_parallel(master.shape[0], chunk)

