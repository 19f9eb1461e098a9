"""bf16 GEMMs on the CPU with AVX-512 BF16's dot product (cpu.py's _gemm for bf16 operands):
C (M, N) fp32 = A (M, K) bf16 @ B (K, N) bf16, no operand widened to fp32 first.

vdpbf16ps multiplies the pair of bf16 values in each 32-bit lane of two registers and adds both
products to that lane's fp32 accumulator: 32 multiply-adds an instruction on 16 lanes, twice an
fp32 FMA's (the rate oneDNN's bf16 GEMMs, PyTorch's autocast, run at). A bf16 product is exact
in fp32 (8 + 8 significant bits), so C differs from the widened fp32 GEMM only in the order of
its sums, and where the instruction treats subnormal inputs and results as zero.

A tile is MR rows of A by NR columns of B, its MR x 2 registers of fp32 sums kept in registers
over a block of KC pairs of K (gemm.cu's tile in shared memory, a thread's accumulators in
registers): each step loads the pairs (B[2p, n], B[2p + 1, n]) of NR columns (two registers),
and for each row broadcasts A's pair (A[m, 2p], A[m, 2p + 1]) and adds its dot into the row's
two registers. Every element of C is one fp32 sum over the pairs p = 0, 1, ... in order, carried
through memory between blocks of K unchanged: the same bits for any core count and any blocking.
K odd is padded with a zero pair half (0 x 0 adds +0.0).

Layouts: A as its pairs, (M, K / 2) uint32, which a row-major bf16 A already is (read where it
is); another layout is packed once, or, where B^T's rows are pairs or B is the smaller (dW = X^T
dY), the GEMM runs as C^T = B^T A^T, stored back transposed (a pair's two products are
symmetric: the same bits). B in panels of NR columns, (N / NR, K / 2, NR) uint32, packed once a
call: a panel's block of KC pairs (32 KB) stays in the caches while every row tile of A passes
it; or, where A is one group of row tiles (each block of B read once), B's own rows, each
step's two runs of NR interleaved by a shuffle. A program is one panel (and a range of row
tiles where there are few panels), as the CUDA kernels' blocks are output tiles.

Without AVX-512 BF16 the same kernel adds the two products of each pair as separate fp32
multiplies and adds (tests run it on any CPU): its sums then differ from the instruction's in
the last place (a third of the elements, on Zen 4) and keep subnormal products, which the
instruction flushes to zero; cpu.py calls it only where the instruction is there (HAS_DOT).
"""

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ...backend.cpu.compiled import device, kernel, use_pool
from ...backend.cpu.emit import F32, I32, I64, Emit, cpu_has, splat
from ...backend.cpu.halves import through_bf16
from ...backend.cpu.runtime import THREADS
from ...dtypes import as_dtype, bfloat16

I16, ONE = ir.IntType(16), ir.Constant(I64, 1)
MR, NR = 8, 32  # a tile: rows of A by columns of B (two registers of 16 fp32 sums)
KC = 256  # pairs of K a block: a panel's block is KC x NR x 4 bytes = 32 KB
GROUP = 16  # row tiles taken through all of K together: their rows of A, KC pairs each, 128 KB
HAS_DOT = cpu_has("avx512bf16")  # vdpbf16ps: cpu.py takes this path for bf16 only then


class _BFloat(ir.Type):
    """LLVM's bfloat, which llvmlite does not name: the dot intrinsic's operand type."""

    def _to_string(self):
        return "bfloat"

    def __eq__(self, other):
        return isinstance(other, _BFloat)

    def __hash__(self):
        return hash("bfloat")


def _dot(e, acc, a, b):
    """acc <16 x float> + in each lane the two products of the lane's bf16 pairs in a and b
    (<16 x i32> each): vdpbf16ps, else widened (a bf16 is the top half of its fp32) and added
    product by product."""
    v16, builder = acc.type, e.b
    if e.has("avx512bf16"):
        pairs = ir.VectorType(_BFloat(), 32)
        fn = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(v16, [v16, pairs, pairs]),
            "llvm.x86.avx512bf16.dpbf16ps.512",
        )
        return builder.call(fn, [acc, builder.bitcast(a, pairs), builder.bitcast(b, pairs)])

    def even(x):  # the pair's first value, shifted into an fp32's top half
        return builder.bitcast(builder.shl(x, splat(I32, 16, 16)), v16)

    def odd(x):
        return builder.bitcast(builder.and_(x, splat(I32, 16, -65536)), v16)

    acc = builder.fadd(acc, builder.fmul(even(a), even(b)))
    return builder.fadd(acc, builder.fmul(odd(a), odd(b)))


def _b_pairs(e, B, p, rows_b):
    """The pairs (B[2p, n], B[2p + 1, n]) of the tile's NR columns: two <16 x i32>, loaded from
    a panel (B: its row, an i8*) or, rows_b, made from B's rows 2p and 2p + 1 themselves (B:
    (the bits array's argument index, the first column's byte offset)): the two runs of NR
    bf16 interleaved by a shuffle."""
    if not rows_b:
        return [e.load(B, e.at(p, 4 * NR, 64 * h), I32, 16) for h in (0, 1)]
    index, offset = B
    two = e.b.mul(p, ir.Constant(I64, 2))
    lo, hi = (e.load(e.row(index, k), offset, I16, NR) for k in (two, e.b.add(two, ONE)))
    kind = ir.VectorType(I32, NR)  # a shuffle mask: 16 columns, each its two values
    return [
        e.b.bitcast(
            e.b.shuffle_vector(lo, hi, ir.Constant(kind, [x for n in half for x in (n, NR + n)])),
            ir.VectorType(I32, 16),
        )
        for half in (range(16), range(16, NR))
    ]


def _tile_codegen(rows_b):
    """The IR of tile(a, m0, b, j, p0, p1, c, r0, c0, rows, fresh): the tile of rows m0 .. m0 +
    MR - 1 of A (a (M, K / 2) uint32; rows past M - 1 read row M - 1) by columns j NR .. j NR +
    NR - 1 of B (b: panels (NB, K / 2 x NR) uint32, or with rows_b B's bits (K, N) uint16,
    contiguous along N), over pairs p0 .. p1 - 1, its sums in c (fp32) at rows r0 .. r0 + rows -
    1 and columns c0 .. c0 + NR - 1: started from zero (fresh) or from what c holds there."""

    def codegen(context, builder, signature, args):
        e = Emit(context, builder, signature.args, args)
        _, m0, _, j, p0, p1, _, r0, c0, rows, fresh = args
        v16 = ir.VectorType(F32, 16)
        last = builder.sub(e.dim(0, 0), ONE)
        A = []
        for r in range(MR):
            m = builder.add(m0, ir.Constant(I64, r))
            A.append(e.row(0, builder.select(builder.icmp_signed(">", m, last), last, m)))
        B = (2, e.at(j, 2 * NR)) if rows_b else e.row(2, j)
        C = [
            builder.gep(e.row(6, builder.add(r0, ir.Constant(I64, r))), [e.at(c0, 4)])
            for r in range(MR)
        ]
        here = [builder.icmp_signed("<", ir.Constant(I64, r), rows) for r in range(MR)]
        acc = [
            [cgutils.alloca_once_value(builder, ir.Constant(v16, None)) for _ in (0, 1)] for _ in A
        ]
        resume = builder.icmp_signed("==", fresh, ir.Constant(I64, 0))
        for r in range(MR):
            with builder.if_then(builder.and_(resume, here[r])):
                for h in (0, 1):
                    builder.store(e.load(C[r], ir.Constant(I64, 64 * h), F32, 16), acc[r][h])
        with cgutils.for_range_slice(builder, p0, p1, ONE) as (p, _):
            b = _b_pairs(e, B, p, rows_b)
            for r in range(MR):
                a = e.broadcast(e.load(A[r], e.at(p, 4), I32), 16)
                for h in (0, 1):
                    builder.store(_dot(e, builder.load(acc[r][h]), a, b[h]), acc[r][h])
        for r in range(MR):
            with builder.if_then(here[r]):
                for h in (0, 1):
                    at = builder.bitcast(
                        builder.gep(C[r], [ir.Constant(I64, 64 * h)]), v16.as_pointer()
                    )
                    builder.store(builder.load(acc[r][h]), at).align = 4
        return context.get_dummy_value()

    return codegen


@intrinsic
def _tile_dot(typingctx, a, m0, bp, j, p0, p1, c, r0, c0, rows, fresh):
    return types.void(a, m0, bp, j, p0, p1, c, r0, c0, rows, fresh), _tile_codegen(False)


@intrinsic
def _tile_dot_rows(typingctx, a, m0, b, j, p0, p1, c, r0, c0, rows, fresh):
    return types.void(a, m0, b, j, p0, p1, c, r0, c0, rows, fresh), _tile_codegen(True)


@device
def _pair(lo, hi):
    return np.uint32(lo) | (np.uint32(hi) << np.uint32(16))


@kernel(work=lambda x, pairs: x.size)
def _pairs(x, pairs):
    # x (M, K) uint16 (bf16's bits), any strides; pairs (M, K2) uint32: (x[m, 2p], x[m, 2p +
    # 1]) a word, zero past K. Sixteen rows per program, k outer: a transposed x is read along
    # its rows, and the sixteen rows of pairs being written stay in L1.
    M, K = x.shape
    for block in prange(-(-M // 16)):
        for p in range(pairs.shape[1]):
            for m in range(block * 16, min(M, block * 16 + 16)):
                hi = x[m, 2 * p + 1] if 2 * p + 1 < K else np.uint16(0)
                pairs[m, p] = _pair(x[m, 2 * p], hi)


@kernel(work=lambda x, panels: x.size)
def _panels(x, panels):
    # x (K, N) uint16 (bf16's bits), any strides; panels (NB, K2 x NR) uint32: panel j's pair p
    # of column n at p NR + n % NR, zero past K and N. A panel a program; a whole pair of rows
    # of a whole panel without a test per element (a row-major x's two runs of NR, vectorized).
    K, N = x.shape
    for j in prange(panels.shape[0]):
        n0 = j * NR
        width = min(NR, N - n0)
        for p in range(panels.shape[1] // NR):
            if width == NR and 2 * p + 1 < K:
                for q in range(NR):
                    panels[j, p * NR + q] = _pair(x[2 * p, n0 + q], x[2 * p + 1, n0 + q])
            else:
                for q in range(NR):
                    lo = x[2 * p, n0 + q] if q < width else np.uint16(0)
                    hi = x[2 * p + 1, n0 + q] if q < width and 2 * p + 1 < K else np.uint16(0)
                    panels[j, p * NR + q] = _pair(lo, hi)


def _gemm_kernel(rows_b):
    """The GEMM over B's panels, or (rows_b) over B's own rows (K, N) uint16, contiguous along N
    and N a multiple of NR: the pairs made in the tile, no packing pass. (A closure over a bool:
    Numba caches one kernel for each.)"""

    def work(a, b, c, parts, transposed, widened):
        return c.size * a.shape[1]

    @kernel(work=work)
    def _gemm(a, b, c, parts, transposed, widened):
        # D (M, N) = A B: a (M, K2) uint32 pairs, b B's panels or rows; c fp32, D (M, N) or,
        # transposed, D^T (N, M). A program is panel t // parts and the t % parts-th range of
        # row tiles, GROUP tiles at a time: for each block of KC pairs, every tile of the group.
        # A panel past N's end, or every panel of a transposed D, or every panel when widened,
        # sums into a strip of the group's rows by NR columns (16 KB: in L1), copied out after
        # the group's last block; widened (1, or 2 to add to what c holds): each sum rounded
        # to bf16 and widened back as it is copied out.
        M, K2 = a.shape
        N = c.shape[0] if transposed else c.shape[1]
        tiles = -(-M // MR)
        per = -(-tiles // parts)
        panels = b.shape[1] // NR if rows_b else b.shape[0]
        for t in prange(panels * parts):
            j, first = t // parts, t % parts * per
            n0, direct = j * NR, (j + 1) * NR <= N and not transposed and not widened
            strip = np.empty((0 if direct else GROUP * MR, NR), np.float32)
            for i0 in range(first, min(tiles, first + per), GROUP):
                i1 = min(tiles, first + per, i0 + GROUP)
                for p0 in range(0, K2, KC):
                    fresh, p1 = 1 if p0 == 0 else 0, min(K2, p0 + KC)
                    for i in range(i0, i1):
                        rows, m0 = min(MR, M - i * MR), i * MR
                        out, r0, c0 = (c, m0, n0) if direct else (strip, m0 - i0 * MR, 0)
                        if rows_b:
                            _tile_dot_rows(a, m0, b, j, p0, p1, out, r0, c0, rows, fresh)
                        else:
                            _tile_dot(a, m0, b, j, p0, p1, out, r0, c0, rows, fresh)
                if not direct:
                    for q in range(min(NR, N - n0)):
                        for m in range(i0 * MR, min(M, i1 * MR)):
                            r, col = (n0 + q, m) if transposed else (m, n0 + q)
                            v = strip[m - i0 * MR, q]
                            if widened:
                                v = through_bf16(v)
                            c[r, col] = c[r, col] + v if widened == 2 else v

    return _gemm


_GEMM = {rows_b: _gemm_kernel(rows_b) for rows_b in (False, True)}


def _rows_are_pairs(x):
    """Whether x (M, K) bf16's rows are its pairs as they lie (K even, contiguous along K)."""
    return x.shape[1] % 2 == 0 and x.strides[1] == 2


def matmul_bf16(a, b, flip=None, out=None, add=False):
    """C (M, N) fp32 = a (M, K) @ b (K, N), both bf16 (any strides: transposed views too), by
    the tiles above; C the fp32 sums, for cpu.py's epilogue to round; or, given out (M, N) fp32
    C-contiguous, C rounded to bf16 and widened back into out (add: added to what out holds),
    the bits of that epilogue (rounded, cast to fp32, added) without a pass over an fp32 C of
    its own (the fused LM head's dW, summed in fp32 over its blocks). The operand whose rows
    are broadcast (A) is a itself, or b^T for C^T = b^T a^T (flip: None chooses) where a's rows
    are not its pairs (dW = X^T dY: the LM head's long dY then a panel operand, read along its
    rows, not across them), or where b's panels would cost more than a's (a prompt's x W^T)."""
    (M, K), N = a.shape, b.shape[1]
    if a.dtype != bfloat16 or b.dtype != bfloat16 or b.shape[0] != K:
        raise ValueError(f"matmul_bf16: {a.shape} {a.dtype} @ {b.shape} {b.dtype}")
    c = np.empty((M, N), np.float32) if out is None else out
    widened = 0 if out is None else 2 if add else 1
    if K == 0 or M == 0 or N == 0:
        if widened == 2:
            np.add(c, np.float32(0), out=c)  # what adding a C of zeros gives
        else:
            c[...] = 0
        return c
    # A's pairs packed from a strided a (dW's X^T) cost more than a panel's and far more than
    # a strip's copy-out (measured on the GEMMs of GPT-2's step): flip where a needs them and
    # b^T does not, or b is the smaller to pack; where neither needs them, flip when b's panels
    # cost more than a's and C's copy-out, about six panel elements an element of C (measured:
    # a prompt's few rows of x against a weight W^T flip, the LM head's logits do not)
    if flip is None:
        if _rows_are_pairs(a):
            flip = _rows_are_pairs(b.T) and b.size > a.size + 6 * c.size
        else:
            flip = _rows_are_pairs(b.T) or b.size < a.size
    if flip:
        a, b = b.T, a.T
    K2 = -(-K // 2)
    if _rows_are_pairs(a):
        pairs = a.view(np.uint16).view(np.uint32)
    else:
        pairs = np.empty((a.shape[0], K2), np.uint32)
        _pairs(a.view(np.uint16), pairs)
    # B's rows as they lie, paired in the tile, where A is one group of tiles (each block of B
    # read once: a packing pass would cost as much again); else panels, which every group
    # reads from the caches (B's rows themselves would be a stride apart, often the same sets)
    rows_b = a.shape[0] <= GROUP * MR and b.strides[1] == 2 and b.shape[1] % NR == K % 2 == 0
    if rows_b:
        b_tiles = b.view(np.uint16)
    else:
        b_tiles = np.empty((-(-b.shape[1] // NR), K2 * NR), np.uint32)
        _panels(b.view(np.uint16), b_tiles)
    parts = min(-(-a.shape[0] // MR), -(-4 * THREADS // -(-b.shape[1] // NR)))  # 4 a core
    _GEMM[rows_b](pairs, b_tiles, c, parts, flip, widened)
    return c


def use_training_pool(dtype):
    """Hand a training step's parallel kernels to the pool that suits who runs its GEMMs
    (backend/cpu/compiled.py use_pool) -> the pool. OpenMP's where they are this module's
    compiled loops (bf16 where the CPU has the dot product: cpu.py routes them here): each of
    the step's launches then finds its threads awake, which spin libgomp's own count. Numba's
    workqueue where they are OpenBLAS's (fp32, 2-byte inputs widened): its threads sleep at
    once and leave the cores to OpenBLAS's. Measured both ways: docs/performance.md, "Which
    pool a step runs on"."""
    if HAS_DOT and as_dtype(dtype) == bfloat16:
        return use_pool("omp", spin=None)
    return use_pool("workqueue")
