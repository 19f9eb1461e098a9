"""GEMMs on the CPU (gemm.cu's twin): C (..., M, N) = op(A) (..., M, K) op(B) (..., K, N) in
fp32 through a BLAS, 2-byte inputs widened and the result rounded once; bf16 operands by
AVX-512 BF16's dot products where the CPU has them (cpu_bf16.py: no widening, twice an FMA's
multiply-adds an instruction, as a tensor core's bf16 mma), the result rounded once the same.

Which BLAS (cpu_blas.py): NumPy's (OpenBLAS in NumPy's wheels), or MKL where the `mkl` extra is
installed and this machine measured it faster at the training step's own GEMM shapes
(tinygrad_like/gemm_library.py: OpenBLAS on an AMD EPYC, MKL 2-16% slower there), a bf16
step's bf16 GEMMs then MKL's rather than cpu_bf16.py's where that measured faster. A GEMM that
adds into its own output (add= and out= the same array: the fused head's dW summed over its
blocks) is one cblas_sgemm with beta = 1 where that gives the unfused bits (cpu_accumulate.py):
no add pass, no (Vp, C) temporary per block.

How they use the cores. With the BLAS's idle workers asleep (runtime.BLAS_QUIET for OpenBLAS),
a GEMM is one threaded BLAS call: it hands its parts to its workers without a wake-up and join
of our thread pool, which costs a sizeable fraction of a layer's GEMM. A long K (K >= 2 max(M,
N): the LM head's dX, the layers' dW) is cut in two halves, one per core, summed afterwards:
each core then reads half of the long operand, and the halves are independent calls (OpenBLAS's
own threads wait for each other at every K block by spinning, which stalls when another process
holds a core). Without a way to put the workers to sleep (an OpenBLAS without those symbols) a
GEMM is split along M or N by us at one BLAS thread, or the row kernels after it would share
their cores with spinning workers.
Every element of C is one BLAS dot product over K (OpenBLAS threads split M and N only), or the
fixed sum of its two halves whatever the core count. One BLAS thread count gives the same bits
every time; on some CPUs (an AMD EPYC, for one) OpenBLAS's threaded kernels round apart from its
one-thread kernels, so runs at different OPENBLAS_NUM_THREADS may differ in the last bits.
"""

import math

import numpy as np

from ...backend.cpu.halves import f32, rounded
from ...backend.cpu.runtime import THREADS, in_parallel
from ...dtypes import bfloat16
from ..elementwise import cpu as elementwise
from ..elementwise.cpu import add as elementwise_add
from ..elementwise.cpu import cast as elementwise_cast
from ..elementwise.cpu import mul as elementwise_mul
from ..elementwise.spec import then_epilogue
from . import cpu_blas
from .cpu_accumulate import accumulated
from .cpu_bf16 import HAS_DOT, matmul_bf16
from .cpu_gemv import GEMV_BELOW, gemv

_GEMM_SPLIT = 1 << 22  # multiply-adds (batch*M*K*N) from which a GEMM uses all the cores
_LONG_K = 2  # K >= _LONG_K * max(M, N): a long K, cut in two halves


def _gemm(a, b, bias=None):
    """C (..., M, N) = a (..., M, K) @ b (..., K, N) [+ bias (N,)] in fp32, a and b possibly
    transposed views (BLAS reads them as they are, without a copy), on all the cores."""
    c = _bf16_gemm(a, b)
    if c is not None:
        return c if bias is None else np.add(c, f32(bias), out=c)
    c = gemv(a, b)  # a decode step's few rows: cpu_gemv.py's compiled GEMVs
    if c is not None:
        return c if bias is None else np.add(c, f32(bias), out=c)
    a, b = f32(a), f32(b)
    (M, K), N = a.shape[-2:], b.shape[-1]
    # multiply-adds: batch x M x K x N (a's batch or b's, whichever broadcasts over the other)
    big = max(math.prod(a.shape[:-2]), math.prod(b.shape[:-2])) * M * K * N >= _GEMM_SPLIT
    if big and K >= _LONG_K * max(M, N):
        c = _gemm_k_halves(a, b)
    elif cpu_blas.quiet():
        c = cpu_blas.matmul(a, b)  # the BLAS threads it (below its own threshold it does not)
    else:
        c = _gemm_split(a, b, big)
    if bias is not None:
        c += f32(bias)
    return c


def _bf16_gemm(a, b, widened=False, out=None, add=False):
    """a @ b where both are bf16, b 2-D and a of at least GEMV_BELOW rows (its batch
    dimensions merged into them): by the BLAS's bf16 GEMM where this machine chose one
    (cpu_blas.py: MKL's), else by cpu_bf16.py's bf16 dot products where the CPU has the
    instruction; else None (widened, BLAS's). widened: C rounded to bf16 and widened back into
    out (fp32, C's shape, contiguous; a new one when None; add: added to what it holds), by
    cpu_bf16.py alone (else None)."""
    if a.dtype != bfloat16 or b.dtype != bfloat16 or b.ndim != 2:
        return None
    rows = a.size // a.shape[-1] if a.shape[-1] else 0
    if rows < GEMV_BELOW:
        return None
    a2, shape = a.reshape(rows, a.shape[-1]), a.shape[:-1] + (b.shape[1],)
    if widened:
        if not HAS_DOT or cpu_blas.has_bf16() or not (out is None or out.flags.c_contiguous):
            return None
        out = np.empty(shape, np.float32) if out is None else out
        matmul_bf16(a2, b, out=out.reshape(rows, b.shape[1]), add=add)
        return out
    c = cpu_blas.bf16_matmul(a2, b)
    if c is None and not HAS_DOT:
        return None
    c = matmul_bf16(a2, b) if c is None else c
    return c.reshape(shape)


def _gemm_k_halves(a, b):
    """a @ b as a[..., :K/2] @ b[:K/2] + a[..., K/2:] @ b[K/2:], the halves on two cores (one
    after the other on one core: the same sum), each one single-threaded BLAS call."""
    K = a.shape[-1]
    halves, parts = (slice(0, K // 2), slice(K // 2, K)), [None, None]

    def half(lo, hi):
        for i in range(lo, hi):
            parts[i] = cpu_blas.matmul(a[..., halves[i]], b[..., halves[i], :])

    with cpu_blas.one_thread():
        in_parallel(2, half, chunk_rows=1, blocks=min(2, THREADS))
    return np.add(parts[0], parts[1], out=parts[0])


def _gemm_split(a, b, big):
    """a @ b split across the cores (when big) along the longer of M and N, each part one
    single-threaded BLAS call that writes its slice of C."""
    M, N = a.shape[-2], b.shape[-1]
    c = np.empty(
        np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (M, N), dtype=np.result_type(a, b)
    )

    def columns(lo, hi):
        cpu_blas.matmul(a, b[..., lo:hi], out=c[..., lo:hi])

    def rows(lo, hi):
        cpu_blas.matmul(a[..., lo:hi, :], b, out=c[..., lo:hi, :])

    n, part = (N, columns) if N > M else (M, rows)
    with cpu_blas.one_thread():
        in_parallel(n, part, chunk_rows=n, blocks=THREADS if big else 1)
    return c


def _epilogue(c, dtype, scale, cast, add, out):
    """C (fp32) rounded once to dtype, then [* scale] [as cast] [+ add] by elementwise's mul,
    cast and add (the bits of the launches a step made after the GEMM), written into C itself,
    or into out (add's own bytes when a gradient accumulates). A pass over C after BLAS wrote
    it: C of a layer's step size is still in the cache, where the unfused add would read it
    back and write a third array."""
    c = rounded(c, dtype)
    if scale is not None:
        c = elementwise_mul(c, scale, out=c)
    if cast is not None:
        c = elementwise_cast(c, cast)
    if add is not None:
        return elementwise_add(add, c, out=c if out is None else out)
    if out is not None:
        out[...] = c
        return out
    return c


def _product(a, b, dtype, bias=None, scale=None, cast=None, add=None, out=None):
    """a @ b with the epilogue; into add itself by one accumulating GEMM where that gives the
    same bits (cpu_accumulate.py: a gradient summed in place, the LM head's dW in fp32), or,
    bf16 operands cast to fp32 [and added into add], by cpu_bf16.py's GEMM rounding and
    widening its sums as it stores them (a bf16 step's LM head dW, summed in fp32)."""
    fp32 = add is not None and add.dtype == np.float32
    plain = bias is None and scale is None and add is out
    if fp32 and plain and cast is None:
        unfused = lambda: rounded(_gemm(a, b), dtype)  # noqa: E731
        done = accumulated(f32(a), f32(b), out, unfused)
        if done is not None:
            return done
    if plain and dtype == bfloat16 and cast is not None and np.dtype(cast) == np.float32:
        done = _bf16_gemm(a, b, widened=True, out=out, add=add is not None)
        if done is not None:
            return done
    return _epilogue(_gemm(a, b, bias), dtype, scale, cast, add, out)


def matmul(a, b, bias=None, scale=None, cast=None, add=None, out=None, then=None, aux=False):
    return then_epilogue(
        elementwise, _product(a, b, a.dtype, bias, scale, cast, add, out), then, aux
    )


def matmul_nt(a, b, scale=None, cast=None, add=None, out=None, then=None, aux=False):
    c = _product(a, b.swapaxes(-1, -2), a.dtype, None, scale, cast, add, out)
    return then_epilogue(elementwise, c, then, aux)


def matmul_tn(a, b, scale=None, cast=None, add=None, out=None, then=None, aux=False):
    c = _product(a.swapaxes(-1, -2), b, a.dtype, None, scale, cast, add, out)
    return then_epilogue(elementwise, c, then, aux)
