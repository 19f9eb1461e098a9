"""A prompt's int8-activation GEMM on the CPU (cpu_int8x.py's qmatmul_int8x from
DECODE_ONCE_FROM rows of x): tiles of RM rows of x by RN rows of W, the same bits as a row at a
time (spec.py's fp32 order), with no horizontal sum per block.

A row at a time (cpu_int8x._row_dot) sums a block's 32 products across the lanes of its
register: vpdpbusd leaves eight partial sums a block, and folding them costs more instructions
than the products. Here a chunk of eight blocks is laid out block-interleaved (lane j of every
32-byte word holds four codes of block j), so that vpdpbusd sums each block whole in its own
lane: after a block's 32 / 4 words (W's unsigned code values a byte each: an int8 code + 128,
an int4 nibble), lane j of the accumulator is block j's exact integer sum minus x's offset (the
sum starts there), the vector spec.py's fp32 order then takes as it is: t = (xs * ws) * sum for
the eight blocks at once, added into the eight fp32 lanes (block b into lane b % 8, blocks in
order), the lanes added last in spec.py's tree. Integer sums are exact in any order, so the bits
are _row_dot's. A tile's 4 x 4 sums share each load of x and of W four ways.

Layouts (pack_rows, a chunk a vector transpose): x's codes packed once a call, a row per prange
iteration (rows padded to RM, blocks to whole chunks, with zero codes and zero scales: a padded
block adds +0.0 to a lane, which is never -0.0, so the sums keep their bits); W's a tile at a
time into a scratch of RN rows, which stays in L1 while every row of x passes it. Without
AVX-512 VNNI the IR forms the same integer sums from widened products.
"""

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ...backend.cpu.compiled import device, kernel
from ...backend.cpu.emit import F32, I8, I32, I64, Emit, splat
from .cpu_split import SERIAL_BELOW
from .spec import X_BLOCK

RM, RN = 4, 4  # a tile: rows of x by rows of W
CHUNK = 8  # blocks side by side in the lanes of a word
_WORD = 4 * CHUNK  # bytes of a packed word: four codes of each of the chunk's blocks
_WORDS = X_BLOCK // 4  # packed words a block
_STORED = {"int8": X_BLOCK, "int4": X_BLOCK // 2, "x": X_BLOCK}  # bytes of a block as stored


def _tile(context, builder, signature, args):
    """tile(wp, xp, m0, nxoff, xs, ws, out)'s IR: out (RM, RN) fp32 = rows m0 .. m0 + RM - 1
    of x against the RN rows of W in wp, before the bias. wp (RN, chunks x 64) uint32: W's
    unsigned code values a byte each, packed; xp (Mp, chunks x 64) uint32: x's codes, packed;
    nxoff (int32, minus cpu_int8x's xoff: the integer sums' start) and xs (fp32) (Mp, chunks x
    8); ws (RN, chunks x 8) fp32."""
    e = Emit(context, builder, signature.args, args)
    rows = [builder.add(args[2], ir.Constant(I64, s)) for s in range(RM)]
    W, WS = ([e.row(i, ir.Constant(I64, r)) for r in range(RN)] for i in (0, 5))
    X, XO, XS = ([e.row(i, m) for m in rows] for i in (1, 3, 4))
    lanes = ir.VectorType(F32, CHUNK)
    totals = [[cgutils.alloca_once_value(builder, ir.Constant(lanes, None)) for _ in W] for _ in X]
    chunks = builder.udiv(e.dim(4, 1), ir.Constant(I64, CHUNK))
    with cgutils.for_range(builder, chunks) as loop:
        at = e.at(loop.index, 4 * CHUNK)  # the chunk's 8 int32s or fp32s
        start = [e.load(p, at, I32, CHUNK) for p in XO]  # sum - xoff: the sums start at -xoff
        acc = [[start[s]] * RN for s in range(RM)]
        for i in range(_WORDS):  # a block's words
            w = [e.load(p, e.at(loop.index, CHUNK * _WORD, i * _WORD), I8, _WORD) for p in W]
            for s in range(RM):
                x = e.load(X[s], e.at(loop.index, CHUNK * _WORD, i * _WORD), I8, _WORD)
                acc[s] = [e.dot_bytes(acc[s][r], w[r], x) for r in range(RN)]
        for s in range(RM):
            xs = e.load(XS[s], at, F32, CHUNK)
            for r in range(RN):
                scale = builder.fmul(xs, e.load(WS[r], at, F32, CHUNK))
                t = builder.fmul(scale, builder.sitofp(acc[s][r], lanes))
                builder.store(builder.fadd(builder.load(totals[s][r]), t), totals[s][r])
    out = e.row(6, ir.Constant(I64, 0))
    for s in range(RM):
        for r in range(RN):
            v = builder.load(totals[s][r])
            pair = [
                builder.fadd(*(builder.extract_element(v, e.lane(i + d)) for d in (0, 4)))
                for i in range(4)
            ]
            y = builder.fadd(builder.fadd(pair[0], pair[2]), builder.fadd(pair[1], pair[3]))
            at = builder.gep(out, [ir.Constant(I64, 4 * (s * RN + r))])
            builder.store(y, builder.bitcast(at, F32.as_pointer()))
    return context.get_dummy_value()


@intrinsic
def _tile_dot(typingctx, wp, xp, m0, nxoff, xs, ws, out):
    return types.void(wp, xp, m0, nxoff, xs, ws, out), _tile


def _transposed(b, rows):
    """The 8 x 8 words rows (8 <8 x i32>, row j word i) transposed: row i holds word i of every
    row, by three stages of shuffles each swapping one bit of the row index with the word's."""
    kind = ir.VectorType(I32, CHUNK)
    for bit in (1, 2, 4):
        low = ir.Constant(kind, [c if not c & bit else CHUNK + (c ^ bit) for c in range(CHUNK)])
        high = ir.Constant(kind, [c ^ bit if not c & bit else CHUNK + c for c in range(CHUNK)])
        new = list(rows)
        for j in range(CHUNK):
            if not j & bit:
                new[j] = b.shuffle_vector(rows[j], rows[j | bit], low)
                new[j | bit] = b.shuffle_vector(rows[j], rows[j | bit], high)
        rows = new
    return rows


def _pack(kind):
    """The intrinsic pack(src, n, dst, r): the whole chunks of row n of src (uint32, four
    stored bytes each) into row r of dst, a byte a code (_unpacked's values), block-interleaved:
    a chunk at a time, each block's 32 codes a vector, the chunk's 8 x 8 words transposed."""
    stored, v8 = _STORED[kind], ir.VectorType(I32, CHUNK)

    def codegen(context, builder, signature, args):
        e = Emit(context, builder, signature.args, args)
        src, dst = e.row(0, args[1]), e.row(2, args[3])
        size = builder.mul(e.dim(0, 1), ir.Constant(I64, 4))  # bytes of a row of src
        chunks = builder.udiv(size, ir.Constant(I64, CHUNK * stored))
        with cgutils.for_range(builder, chunks) as loop:
            rows = []
            for j in range(CHUNK):
                block = e.load(src, e.at(loop.index, CHUNK * stored, j * stored), I8, stored)
                if kind == "int4":  # low nibbles and high, interleaved: codes 2p, 2p + 1
                    low = builder.and_(block, splat(I8, stored, 15))
                    high = builder.lshr(block, splat(I8, stored, 4))
                    order = [k // 2 + (stored if k % 2 else 0) for k in range(_WORD)]
                    block = builder.shuffle_vector(
                        low, high, ir.Constant(ir.VectorType(I32, _WORD), order)
                    )
                elif kind == "int8":  # an int8 code + 128
                    block = builder.xor(block, splat(I8, _WORD, 0x80))
                rows.append(builder.bitcast(block, v8))
            for i, row in enumerate(_transposed(builder, rows)):
                at = builder.gep(dst, [e.at(loop.index, CHUNK * _WORD, i * _WORD)])
                builder.store(row, builder.bitcast(at, v8.as_pointer())).align = 1
        return context.get_dummy_value()

    @intrinsic
    def pack(typingctx, src, n, dst, r):
        return types.void(src, n, dst, r), codegen

    return pack


@device
def _unpacked(w, kind, half):
    """Four stored bytes w (a uint32) as four code values a byte each: an int8 code + 128 (the
    sign bit flipped), int4's nibbles of w's low (half 0) or high two bytes, each byte's low
    nibble first (code 2p, then 2p + 1), or x's codes as they are."""
    if kind == "int8":
        return w ^ np.uint32(0x80808080)
    if kind == "x":
        return w
    w = w >> np.uint32(16 * half)
    v = np.uint32(0)
    for k in range(4):
        v |= ((w >> np.uint32(4 * k)) & np.uint32(15)) << np.uint32(8 * k)
    return v


def _pack_rows(kind):
    """pack_rows(src, n, dst, r): row n of src (uint32 (rows, blocks x words as stored)) into
    row r of dst (uint32, zero past its blocks): _pack's whole chunks, then a last one's
    blocks."""
    pack, stored = _pack(kind), _STORED[kind] // 4

    @device
    def pack_rows(src, n, dst, r):
        pack(src, n, dst, r)
        nb = src.shape[1] // stored
        for b in range(nb - nb % CHUNK, nb):
            c, j = b // CHUNK, b % CHUNK
            for i in range(_WORDS):
                w = src[n, b * stored + (i // 2 if kind == "int4" else i)]
                dst[r, (c * _WORDS + i) * CHUNK + j] = _unpacked(w, kind, i % 2)

    return pack_rows


_pack_x, _pack_int8, _pack_int4 = (_pack_rows(kind) for kind in ("x", "int8", "int4"))


@kernel(work=lambda xq, *rest: xq.size * 4)
def _packed_x(xq, offset, xp, nxoff):
    # xq (M, K / 4) uint32: x's int8 codes; xp (Mp, nbp x 8) uint32 and nxoff (Mp, nbp) int32,
    # zero past x's rows and blocks: a row per iteration, packed, and minus offset times each
    # block's sum of codes (what the unsigned code values add), the integer sums' start.
    for m in prange(xq.shape[0]):
        _pack_x(xq, m, xp, m)
        codes = xq[m].view(np.int8)
        for b in range(xq.shape[1] // _WORDS):
            s = np.int32(0)
            for k in range(b * X_BLOCK, (b + 1) * X_BLOCK):
                s += np.int32(codes[k])
            nxoff[m, b] = -offset * s


def _tiles_kernel(nibbles):
    """The tiled qmatmul_int8x for int8 (nibbles False) or int4 weights. (A closure over a
    bool, not over its pack_rows: Numba keys a closure's disk cache by its cells' pickled
    bytes, and a compiled function's differ in every process.)"""

    def work(codes, scales, group_of, xp, *rest):  # a GEMM's work: W's words times x's rows
        return codes.size * xp.shape[0]

    @kernel(serial_below=SERIAL_BELOW, work=work)
    def _qmatmul_int8x_tiles(codes, scales, group_of, xp, nxoff, xs, bias, y):
        # codes (N, nb x stored / 4) uint32 (W's bytes four at a time), scales (N, G) fp32,
        # group_of (nb,) each block's group, xp (Mp, nbp x 8) uint32 packed, nxoff and xs (Mp,
        # nbp), bias (N,) or (0,), y (M, N) fp32. RN rows of W per prange iteration (quant.cu's
        # qmatmul_int8x: a warp per row), packed into wp with the scale of each block (0 past
        # the last) into wt, then every RM rows of x against them.
        N, nbp, M = codes.shape[0], xs.shape[1], y.shape[0]
        for t in prange(-(-N // RN)):
            wp = np.zeros((RN, nbp * _WORDS), np.uint32)
            wt = np.zeros((RN, nbp), np.float32)
            out = np.empty((RM, RN), np.float32)
            for r in range(RN):
                n = min(t * RN + r, N - 1)  # a short last tile repeats W's last row
                for b in range(group_of.shape[0]):
                    wt[r, b] = scales[n, group_of[b]]
                if nibbles:
                    _pack_int4(codes, n, wp, r)
                else:
                    _pack_int8(codes, n, wp, r)
            for m0 in range(0, xp.shape[0], RM):
                _tile_dot(wp, xp, m0, nxoff, xs, wt, out)
                for s in range(min(RM, M - m0)):
                    for r in range(min(RN, N - t * RN)):
                        n = t * RN + r
                        y[m0 + s, n] = out[s, r] + bias[n] if bias.shape[0] else out[s, r]

    return _qmatmul_int8x_tiles


_TILES = {fmt: _tiles_kernel(fmt == "int4") for fmt in ("int8", "int4")}


def qmatmul_int8x_tiles(xq, xs, offset, codes, scales, group_of, fmt, bias):
    """y (M, N) fp32 = x (codes xq (M, K) int8, scales xs (M, K / X_BLOCK)) against W (codes,
    scales, group_of: each block's group), + bias ((N,) fp32 or (0,)): cpu_int8x's values
    (offset: what its unsigned code values add, 128 or 8), a tile at a time."""
    M, nb = xs.shape
    rows, nbp = -(-M // RM) * RM, -(-nb // CHUNK) * CHUNK
    xp, nxoff = np.zeros((rows, nbp * _WORDS), np.uint32), np.zeros((rows, nbp), np.int32)
    _packed_x(xq.view(np.uint32), np.int32(offset), xp, nxoff)
    xs_p = np.zeros((rows, nbp), np.float32)
    xs_p[:M, :nb] = xs
    y = np.empty((M, codes.shape[0]), np.float32)
    w = np.ascontiguousarray(codes).view(np.uint32), scales, group_of
    _TILES[fmt](*w, xp, nxoff, xs_p, bias, y)
    return y
