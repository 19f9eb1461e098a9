"""The int8-activation kernels on the CPU (spec.py: quantize_rows, qmatmul_int8x; cpu.py
re-exports them), quant.cu's twins. A row of W against a row of x is written in LLVM IR
(_row_dot), not as Numba loops: Numba runs LLVM's loop vectorizer but not its SLP vectorizer
(NUMBA_SLP_VECTORIZE=0), and a block's loop of 32 is unrolled whole before the loop vectorizer
sees it, so it compiles to 32 scalar multiply-adds. The IR multiplies unsigned by signed bytes,
a weight's int8 code plus 128 (its byte with the sign bit flipped) or an int4 nibble (q + 8) by
x's int8 codes, and subtracts 128 or 8 times the block's sum of x codes: on AVX-512 VNNI
vpdpbusd over 64 bytes, else one block's llvm.vector.reduce.add at a time (vpmaddwd on AVX2),
the same integers. quant.cu's twins multiply signed bytes by __dp4a, the same integers again,
then do spec.py's fp32 operations in spec.py's order as these do: the same bits.
"""

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ...backend.cpu.compiled import kernel
from ...backend.cpu.emit import F32, I8, I32, I64, Emit, splat
from ...backend.cpu.halves import f32, rounded
from ..elementwise import cpu as elementwise
from ..elementwise.cpu import add as elementwise_add
from ..elementwise.spec import then_epilogue
from .cpu_int8x_tiles import qmatmul_int8x_tiles
from .cpu_split import BLOCK_ROWS, DECODE_ONCE_FROM, SERIAL_BELOW, work
from .spec import TINY_BLOCK, X_BLOCK, int8x_out, x_blocks

_LANES = 8  # spec.py's fp32 lanes: block b is added into lane b % 8


def _quantize_row(context, builder, signature, args):
    """quantize_row(x, m, codes, scales)'s IR: row m of x (M, K) fp32 into its codes (M, K)
    int8 and scales (M, K / X_BLOCK) fp32, a block of X_BLOCK a vector: its largest magnitude as
    the largest of its bits with the sign cleared (a NaN's are above every number's: NaN if any
    is NaN, the same max in any order, as quant.cu's warp tree takes it), its scale, then each
    code: fp32's division and rint (round half to even), as quant.cu's __fdiv_rn and rintf, 0
    where the quotient is NaN. Each operation rounded on its own."""
    e = Emit(context, builder, signature.args, args)
    x, codes, scales = e.row(0, args[1]), e.row(2, args[1]), e.row(3, args[1])
    ints, floats = ir.VectorType(I32, X_BLOCK), ir.VectorType(F32, X_BLOCK)
    module = builder.module
    umax = cgutils.get_or_insert_function(
        module, ir.FunctionType(I32, [ints]), f"llvm.vector.reduce.umax.v{X_BLOCK}i32"
    )
    rint = cgutils.get_or_insert_function(
        module, ir.FunctionType(floats, [floats]), f"llvm.rint.v{X_BLOCK}f32"
    )
    with cgutils.for_range(builder, e.dim(3, 1)) as loop:
        b = loop.index
        v = e.load(x, e.at(b, 4 * X_BLOCK), F32, X_BLOCK)
        magnitudes = builder.and_(builder.bitcast(v, ints), splat(I32, X_BLOCK, 0x7FFFFFFF))
        largest = builder.bitcast(builder.call(umax, [magnitudes]), F32)
        tiny = builder.fcmp_ordered("<", largest, ir.Constant(F32, float(TINY_BLOCK)))
        scale = builder.select(
            tiny, ir.Constant(F32, 1.0), builder.fdiv(largest, ir.Constant(F32, 127.0))
        )
        builder.store(scale, builder.bitcast(builder.gep(scales, [e.at(b, 4)]), F32.as_pointer()))
        q = builder.call(rint, [builder.fdiv(v, e.broadcast(scale, X_BLOCK))])
        number = builder.fcmp_ordered("==", q, q)
        wide = builder.select(number, q, ir.Constant(floats, None))  # NaN -> 0
        c = builder.fptosi(wide, ir.VectorType(I8, X_BLOCK))
        at = builder.gep(codes, [e.at(b, X_BLOCK)])
        builder.store(c, builder.bitcast(at, c.type.as_pointer())).align = 1
    return context.get_dummy_value()


@intrinsic
def _quantize_row_ir(typingctx, x, m, codes, scales):
    return types.void(x, m, codes, scales), _quantize_row


@kernel
def _quantize_rows(x, codes, scales):
    # x (M, K) fp32, codes (M, K) int8, scales (M, K / X_BLOCK) fp32: a row of x per iteration
    # (quant.cu's quantize_rows: a warp per block), its blocks in _quantize_row's IR
    for m in prange(x.shape[0]):
        _quantize_row_ir(x, m, codes, scales)


def quantize_rows(x):
    M = x.shape[0]
    codes = np.empty(x.shape, np.int8)
    scales = np.empty((M, x_blocks(x)), np.float32)
    _quantize_rows(np.ascontiguousarray(f32(x), dtype=np.float32), codes, scales)
    return codes, scales


def _unsigned_codes(e, w, nibbles, lane):
    """A weight's bytes w <n x i8> as unsigned code values: an int8 code + 128 (w ^ 0x80) or,
    4-bit, each byte's low (lane 0) or high (lane 1) nibble."""
    n = w.type.count
    if not nibbles:
        return e.b.xor(w, splat(I8, n, 0x80))
    return e.b.and_(e.b.lshr(w, splat(I8, n, 4 * lane)), splat(I8, n, 15))


def _block_sum(e, w, x0, x1, b, nibbles):
    """Block b's sum of unsigned code values times x codes, an i32: int8 w (K,) bytes times x0
    (K,), or int4 w (K / 2,) bytes, their low nibbles times x0 (x's even elements, K / 2) and
    high nibbles times x1 (odd), as one <32 x i32> product summed (llvm.vector.reduce.add,
    which LLVM lowers to vpdpbusd on AVX-512 VNNI, vpmaddwd on AVX2)."""
    size = X_BLOCK // 2 if nibbles else X_BLOCK  # bytes of the block in w, x0 and x1
    w = e.load(w, e.at(b, size), I8, size)
    u, x = _unsigned_codes(e, w, nibbles, 0), e.load(x0, e.at(b, size), I8, size)
    if nibbles:  # the two halves side by side
        both = ir.Constant(ir.VectorType(I32, X_BLOCK), list(range(X_BLOCK)))
        u = e.b.shuffle_vector(u, _unsigned_codes(e, w, True, 1), both)
        x = e.b.shuffle_vector(x, e.load(x1, e.at(b, size), I8, size), both)
    wide = ir.VectorType(I32, X_BLOCK)
    products = e.b.mul(e.b.zext(u, wide), e.b.sext(x, wide))
    reduce = cgutils.get_or_insert_function(
        e.b.module, ir.FunctionType(I32, [wide]), f"llvm.vector.reduce.add.v{X_BLOCK}i32"
    )
    return e.b.call(reduce, [products])


def _pairs(e, a, b):
    """Neighbouring lanes of a then b added: <n x i32> twice -> <n x i32> of pair sums."""
    n = a.type.count
    pick = [ir.Constant(ir.VectorType(I32, n), list(range(k, 2 * n, 2))) for k in (0, 1)]
    return e.b.add(*(e.b.shuffle_vector(a, b, p) for p in pick))


def _chunk_sums(e, w, x0, x1, j, nibbles):
    """<8 x i32>: _block_sum of blocks 8 j .. 8 j + 7. On AVX-512 VNNI the products of 64
    bytes at a time summed four by four (each i32 lane within one block), then each block's
    lanes added: neighbouring pairs three times (int8) or twice, blocks kept in order."""
    if not e.has("avx512vnni"):
        sums = ir.Constant(ir.VectorType(I32, _LANES), None)
        for i in range(_LANES):
            block = _block_sum(e, w, x0, x1, e.at(j, _LANES, i), nibbles)
            sums = e.b.insert_element(sums, block, e.lane(i))
        return sums
    zero, parts = ir.Constant(ir.VectorType(I32, 16), None), []
    for h in range(2 if nibbles else 4):  # int4: 4 blocks a register, 4 lanes each
        at = e.at(j, _LANES * X_BLOCK // (2 if nibbles else 1), 64 * h)
        w64 = e.load(w, at, I8, 64)
        acc = e.dot_bytes(zero, _unsigned_codes(e, w64, nibbles, 0), e.load(x0, at, I8, 64))
        if nibbles:
            acc = e.dot_bytes(acc, _unsigned_codes(e, w64, True, 1), e.load(x1, at, I8, 64))
        parts.append(acc)
    while len(parts) > 1:
        parts = [_pairs(e, a, b) for a, b in zip(parts[::2], parts[1::2])]
    (t,) = parts  # <16 x i32>: two lanes a block, in order; its halves' neighbours added
    half = [ir.Constant(ir.VectorType(I32, 8), list(range(k, k + 8))) for k in (0, 8)]
    return _pairs(e, *(e.b.shuffle_vector(t, t, h) for h in half))


def _chunk_scales(e, ws, group_of, groups, nb, j):
    """<8 x float>: the weight scales of blocks 8 j .. 8 j + 7, ws[group_of[b]]: loaded as
    stored when each block is a group, one splat when the 8 share one, else one by one."""
    lanes = ir.VectorType(F32, _LANES)
    slot = cgutils.alloca_once(e.b, lanes)

    def scale(b):
        g = e.b.sext(e.load(group_of, e.at(b, 4), I32), I64)
        return e.load(ws, e.at(g, 4), F32)

    per_group = e.b.udiv(nb, groups)
    with e.b.if_else(e.b.icmp_unsigned("==", per_group, ir.Constant(I64, 1))) as (each, shared):
        with each:
            e.b.store(e.load(ws, e.at(j, 4 * _LANES), F32, _LANES), slot)
        with shared:
            v = ir.Constant(lanes, None)
            whole = e.b.icmp_unsigned(
                "==", e.b.urem(per_group, ir.Constant(I64, _LANES)), ir.Constant(I64, 0)
            )
            with e.b.if_else(whole) as (one, several):
                with one:
                    e.b.store(e.broadcast(scale(e.at(j, _LANES)), _LANES), slot)
                with several:
                    for i in range(_LANES):
                        v = e.b.insert_element(v, scale(e.at(j, _LANES, i)), e.lane(i))
                    e.b.store(v, slot)
    return e.b.load(slot)


def _row_dot(nibbles):
    """The intrinsic row_dot(codes, n, x0, x1, m, xoff, xs, scales, group_of) -> fp32 of a
    weight format (int4: nibbles): row n of W (codes (N, *) uint8, scales (N, G)) against row
    m of x (x0, x1: _block_sum's), y[m, n] before the bias in spec.py's fp32 order: blocks a
    chunk of 8 at a time (_chunk_sums), then the blocks past the last whole chunk one by one,
    t_b = (xs[m, b] * scales[n, group_of[b]]) * (sum_b - xoff[m, b]) added into lane b % 8;
    the lanes added last. Each fp32 operation rounded on its own (no fast-math flags: no FMA,
    no reordering). xoff (M, nb) int32: 128 or 8 times each block's sum of x codes (what the
    unsigned code values add); group_of (nb,) int32: each block's group."""

    def codegen(context, builder, signature, args):
        e = Emit(context, builder, signature.args, args)
        w, ws, group_of = e.row(0, args[1]), e.row(7, args[1]), e.row(8)
        x0, x1, xoff, xs = (e.row(i, args[4]) for i in (2, 3, 5, 6))
        nb, groups = e.dim(6, 1), e.dim(7, 1)
        whole = builder.udiv(nb, ir.Constant(I64, _LANES))
        lanes = ir.VectorType(F32, _LANES)
        total = cgutils.alloca_once_value(builder, ir.Constant(lanes, None))
        with cgutils.for_range(builder, whole) as loop:
            j, at = loop.index, e.at(loop.index, 4 * _LANES)  # 8 int32s or fp32s
            isum = builder.sub(_chunk_sums(e, w, x0, x1, j, nibbles), e.load(xoff, at, I32, 8))
            scale = builder.fmul(
                e.load(xs, at, F32, 8), _chunk_scales(e, ws, group_of, groups, nb, j)
            )
            t = builder.fmul(scale, builder.sitofp(isum, lanes))
            builder.store(builder.fadd(builder.load(total), t), total)
        start = builder.mul(whole, ir.Constant(I64, _LANES))
        with cgutils.for_range_slice(builder, start, nb, ir.Constant(I64, 1)) as (b, _):
            s = builder.sub(_block_sum(e, w, x0, x1, b, nibbles), e.load(xoff, e.at(b, 4), I32))
            g = builder.sext(e.load(group_of, e.at(b, 4), I32), I64)
            scale = builder.fmul(e.load(xs, e.at(b, 4), F32), e.load(ws, e.at(g, 4), F32))
            lane, v = builder.trunc(builder.sub(b, start), I32), builder.load(total)
            t = builder.fadd(
                builder.extract_element(v, lane), builder.fmul(scale, builder.sitofp(s, F32))
            )
            builder.store(builder.insert_element(v, t, lane), total)
        v = builder.load(total)
        pair = [
            builder.fadd(*(builder.extract_element(v, e.lane(i + d)) for d in (0, 4)))
            for i in range(4)
        ]
        return builder.fadd(builder.fadd(pair[0], pair[2]), builder.fadd(pair[1], pair[3]))

    @intrinsic
    def row_dot(typingctx, codes, n, x0, x1, m, xoff, xs, scales, group_of):
        return types.float32(codes, n, x0, x1, m, xoff, xs, scales, group_of), codegen

    return row_dot


_int8_row_dot, _int4_row_dot = _row_dot(False), _row_dot(True)


_OFFSET = {"int8": 128, "int4": 8}  # what a format's unsigned code values add to its codes


def _qmatmul_int8x_kernel(nibbles):
    """qmatmul_int8x for int8 (nibbles False) or int4 weights."""
    offset = np.int32(_OFFSET["int4" if nibbles else "int8"])

    @kernel(serial_below=SERIAL_BELOW, work=work)
    def _qmatmul_int8x(codes, scales, group_of, xq, x0, x1, xs, xoff, bias, y):
        # codes (N, K) or (N, K / 2) uint8, scales (N, K / group_size), group_of (K / 32,)
        # int32 each block's group, xq (M, K) int8 codes, xs (M, K / 32) their scales, bias
        # (N,) or (0,), y (M, N) fp32; scratch: xoff (M, K / 32) int32, and for int4 x0, x1
        # (M, K / 2) (x's even and odd codes, a byte's nibbles' partners), else x0 = x1 = xq.
        # First each block's offset (and the split), then a block of rows of W per iteration
        # (quant.cu's qmatmul_int8x: a warp per row), each dotted with every row of x (the
        # row_dot IR).
        M, nb = xs.shape
        N = codes.shape[0]
        for m in range(M):
            for b in range(nb):
                s = np.int32(0)
                for k in range(b * X_BLOCK, (b + 1) * X_BLOCK):
                    s += np.int32(xq[m, k])
                xoff[m, b] = offset * s
            if nibbles:
                for j in range(x0.shape[1]):
                    x0[m, j], x1[m, j] = xq[m, 2 * j], xq[m, 2 * j + 1]
        for r in prange(-(-N // BLOCK_ROWS)):
            for n in range(r * BLOCK_ROWS, min(N, (r + 1) * BLOCK_ROWS)):
                for m in range(M):
                    if nibbles:
                        d = _int4_row_dot(codes, n, x0, x1, m, xoff, xs, scales, group_of)
                    else:
                        d = _int8_row_dot(codes, n, x0, x1, m, xoff, xs, scales, group_of)
                    y[m, n] = d + bias[n] if bias.shape[0] else d

    return _qmatmul_int8x


_QMATMUL_INT8X = {f: _qmatmul_int8x_kernel(f == "int4") for f in ("int8", "int4")}


def qmatmul_int8x(
    xcodes,
    xscales,
    codes,
    scales,
    fmt,
    group_size,
    dtype,
    bias=None,
    add=None,
    then=None,
    aux=False,
):
    """The integer dot of each block (the IR above; a prompt's in cpu_int8x_tiles.py's tiles),
    scaled and summed in spec.py's fp32 order; rounded to dtype once; then + add by
    elementwise's add, written into y itself, or then= (as qmatmul)."""
    int8x_out(xcodes, xscales, codes, scales, fmt, group_size, dtype, bias, add)
    M, K = xcodes.shape
    xq = np.ascontiguousarray(xcodes)
    b = np.zeros(0, np.float32) if bias is None else np.ascontiguousarray(f32(bias), np.float32)
    scales = np.ascontiguousarray(scales, dtype=np.float32)
    xs = np.ascontiguousarray(xscales, dtype=np.float32)
    group_of = np.arange(xs.shape[1], dtype=np.int32) // np.int32(group_size // X_BLOCK)
    if M >= DECODE_ONCE_FROM:  # a prompt: tiles of rows of x by rows of W
        y = qmatmul_int8x_tiles(xq, xs, _OFFSET[fmt], codes, scales, group_of, fmt, b)
    else:
        y = np.empty((M, codes.shape[0]), np.float32)
        x0 = x1 = xq
        if fmt == "int4":
            x0, x1 = np.empty((M, K // 2), np.int8), np.empty((M, K // 2), np.int8)
        args = (np.ascontiguousarray(codes), scales, group_of, xq, x0, x1, xs)
        _QMATMUL_INT8X[fmt](*args, np.empty(xs.shape, np.int32), b, y)
    y = rounded(y, np.dtype(dtype))
    return then_epilogue(
        elementwise, y if add is None else elementwise_add(add, y, out=y), then, aux
    )
