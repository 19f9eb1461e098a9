"""The decode step's GEMV on the CPU (cpu.py's qmatmul with fewer than DECODE_ONCE_FROM rows of x,
fp32 activations; and kernels/gemm/cpu_gemv.py's, whose fp32 weights are its unquantized
format): each code decoded as it is read, a row of W against a row of x written in LLVM IR
(_row_dot), as cpu_int8x.py's integer dot is. The same dot as a Numba loop (the code this
replaced) streamed the weights well below one core's read bandwidth, its 4-bit groups' loops
unrolled whole before LLVM's loop vectorizer saw them (cpu_int8x.py: why; docs/decode.md: the
figures). The IR decodes WIDTH codes into one <16 x float> (a zmm
on AVX-512, two ymm on AVX2) by the bit operations of cpu.py's decode functions (quant.cu's:
the same values) and multiply-adds them into SUMS independent vector sums, added in a fixed
tree at the end: a row's bits depend on the CPU (llvm.fmuladd fuses where it has FMA), never
on the run or the core count, and are held to qmatmul's tolerance, as BLAS's sgemv is.
quant.cu's qmatmul gives a row a warp, its lanes' sums added by warp_sum.

8- and 16-bit rows (one scale a row, or none): sum_k value(codes[k]) x[k], times the format's
rebias (a power of two), times the row's scale by the kernel. 4-bit rows of groups of
group_bytes (a multiple of 16) bytes: each group's sum over its bytes of low nibble x x's even
element + high nibble x odd element (x0, x1), multiply-added with its scale into a sum.
"""

import functools

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ...backend.cpu.compiled import half_to_f32, kernel
from ...backend.cpu.emit import F32, I32, I64, Emit, splat
from ...formats import FORMATS, NAN_ONLY
from .cpu_split import BLOCK_ROWS, SERIAL_BELOW

WIDTH = 16  # codes decoded into one vector
SUMS = 4  # independent vector sums: a multiply-add's latency over its throughput
NIBBLE_BYTES = WIDTH  # a 4-bit row's bytes per step: 2 WIDTH codes, one vector of each nibble


def rebias(exp_bits):
    """What a small float's values (fp16 bits over minifloat_scale) are multiplied by: 2^(15 -
    bias), bias = 2^(exp_bits - 1) - 1; 1 for integers (exp_bits 0) and bf16 (8)."""
    return 1.0 if exp_bits in (0, 8) else 2.0 ** (16 - 2 ** (exp_bits - 1))


def _values(e, c, bits, fields):
    """<n x float>: the values before their scale (and rebias) of codes c <n x i32> of a
    format (_codes: int8's sign-extended, the others' zero-extended): cpu.py's int8_value,
    int4_value and minifloat_value, vector by vector."""
    exp_bits, man_bits, specials = fields
    n, b = c.type.count, e.b

    def const(v):
        return splat(I32, n, v)

    f32s = ir.VectorType(F32, n)
    if exp_bits == 0:  # int8's codes sign-extended (_codes), or an int4 nibble q + 8
        return b.sitofp(b.sub(c, const(8)) if bits == 4 else c, f32s)
    if exp_bits == 8:  # bf16: fp32's top half
        return b.bitcast(b.shl(c, const(16)), f32s)
    if (exp_bits, man_bits) == (5, 10):  # fp16 itself
        return half_to_f32(e.context, b, c)
    sign, unit = 1 << (exp_bits + man_bits), 1 << (10 - man_bits)
    # c's sign extended and times unit, masked to fp16's sign and the bits below the magnitude
    half = b.and_(
        b.mul(b.sub(b.xor(c, const(sign)), const(sign)), const(unit)),
        const(0x8000 | (sign - 1) * unit),
    )
    if specials == NAN_ONLY:  # all ones carries into fp16's fifth exponent bit
        half = b.or_(half, b.and_(b.add(half, const(unit)), const(0x4000)))
    return half_to_f32(e.context, b, half)


def _fmuladd(e, a, x, acc):
    kind = a.type
    fn = cgutils.get_or_insert_function(
        e.b.module, ir.FunctionType(kind, [kind] * 3), f"llvm.fmuladd.v{kind.count}f32"
    )
    return e.b.call(fn, [a, x, acc])


def _lanes_sum(e, v):
    """A <n x float>'s lanes added in a fixed tree: its halves, until one is left."""
    while v.type.count > 1:
        h = v.type.count // 2
        lo, hi = (ir.Constant(ir.VectorType(I32, h), list(range(k, k + h))) for k in (0, h))
        v = e.b.fadd(e.b.shuffle_vector(v, v, lo), e.b.shuffle_vector(v, v, hi))
    return e.b.extract_element(v, e.lane(0))


def _codes(e, w, k, n, size, signed=False):
    """<n x i32>: n codes of size bytes from element k of a row, zero- (or sign-) extended."""
    codes, wide = e.load(w, e.at(k, size), ir.IntType(8 * size), n), ir.VectorType(I32, n)
    return e.b.sext(codes, wide) if signed else e.b.zext(codes, wide)


def _wide_row(e, w, x, K, bits, fields, sums):
    """The 8-, 16- or 32-bit (fp32) row: SUMS vectors of WIDTH at a time into sums, then
    single vectors into the first, then the last K % WIDTH elements one at a time -> the sum
    (before rebias)."""
    size = bits // 8

    def step(k, n, total):
        if bits == 32:  # fp32 weights: the values themselves
            values = e.load(w, e.at(k, 4), F32, n)
        else:
            values = _values(e, _codes(e, w, k, n, size, fields[0] == 0), bits, fields)
        return _fmuladd(e, values, e.load(x, e.at(k, 4), F32, n), total)

    with cgutils.for_range(e.b, e.b.udiv(K, ir.Constant(I64, WIDTH * SUMS))) as loop:
        for i, s in enumerate(sums):
            e.b.store(step(e.at(loop.index, WIDTH * SUMS, WIDTH * i), WIDTH, e.b.load(s)), s)
    ones = e.b.udiv(K, ir.Constant(I64, WIDTH))
    start = e.b.mul(e.b.udiv(K, ir.Constant(I64, WIDTH * SUMS)), ir.Constant(I64, SUMS))
    with cgutils.for_range_slice(e.b, start, ones, ir.Constant(I64, 1)) as (j, _):
        e.b.store(step(e.at(j, WIDTH), WIDTH, e.b.load(sums[0])), sums[0])
    tail = cgutils.alloca_once_value(e.b, ir.Constant(ir.VectorType(F32, 1), None))
    past = e.b.mul(ones, ir.Constant(I64, WIDTH))
    with cgutils.for_range_slice(e.b, past, K, ir.Constant(I64, 1)) as (k, _):
        e.b.store(step(k, 1, e.b.load(tail)), tail)
    return e.b.fadd(_total(e, sums), e.b.extract_element(e.b.load(tail), e.lane(0)))


def _nibble_values(e, nibbles, fields):
    """<WIDTH x float>: the values (before rebias) of the 4-bit codes in the low 4 bits of
    nibbles <WIDTH x i32> (the bits above them ignored): on AVX-512 one permute from a table of
    the 16 values (vpermps reads an index's low 4 bits), else _values' bit operations."""
    if e.has("avx512f"):
        table = ir.Constant(ir.VectorType(F32, WIDTH), nibble_table(fields))
        kind = ir.VectorType(F32, WIDTH)
        fn = cgutils.get_or_insert_function(
            e.b.module,
            ir.FunctionType(kind, [kind, nibbles.type]),
            "llvm.x86.avx512.permvar.sf.512",
        )
        return e.b.call(fn, [table, nibbles])
    return _values(e, e.b.and_(nibbles, splat(I32, WIDTH, 15)), 4, fields)


def nibble_table(fields):
    """The 16 values (before rebias) of a 4-bit format's codes: int4's q (the nibble less 8),
    or fp4 E2M1's over rebias (a power of two: exact)."""
    if fields[0] == 0:
        return [float(q - 8) for q in range(16)]
    values = np.arange(16, dtype=np.uint8).view(FORMATS["fp4_e2m1"].element).astype(np.float32)
    return [float(v) / rebias(fields[0]) for v in values]


def _nibble_row(e, w, x0, x1, ws, C, bits, fields, group_bytes, sums):
    """The 4-bit row of C bytes: groups of group_bytes, SUMS groups at a time (one a sum), then
    the last C / group_bytes % SUMS into the first: each group's products (NIBBLE_BYTES bytes a
    step) then times its scale -> the sum (before rebias)."""

    def group(g, total):
        products = None
        for c in range(group_bytes // NIBBLE_BYTES):
            at = e.at(g, group_bytes, NIBBLE_BYTES * c)  # the step's first byte
            pairs = _codes(e, w, at, WIDTH, 1)
            for nibble, x in ((pairs, x0), (e.b.lshr(pairs, splat(I32, WIDTH, 4)), x1)):
                values = _nibble_values(e, nibble, fields)
                xs = e.load(x, e.at(at, 4), F32, WIDTH)
                products = (
                    e.b.fmul(values, xs) if products is None else _fmuladd(e, values, xs, products)
                )
        scale = e.broadcast(e.load(ws, e.at(g, 4), F32), WIDTH)
        return _fmuladd(e, products, scale, total)

    groups = e.b.udiv(C, ir.Constant(I64, group_bytes))
    with cgutils.for_range(e.b, e.b.udiv(groups, ir.Constant(I64, SUMS))) as loop:
        for i, s in enumerate(sums):
            e.b.store(group(e.at(loop.index, SUMS, i), e.b.load(s)), s)
    start = e.b.mul(e.b.udiv(groups, ir.Constant(I64, SUMS)), ir.Constant(I64, SUMS))
    with cgutils.for_range_slice(e.b, start, groups, ir.Constant(I64, 1)) as (g, _):
        e.b.store(group(g, e.b.load(sums[0])), sums[0])
    return _total(e, sums)


def _total(e, sums):
    """The SUMS vectors added pairwise in order, then their lanes (_lanes_sum)."""
    vectors = [e.b.load(s) for s in sums]
    while len(vectors) > 1:
        vectors = [e.b.fadd(a, b) for a, b in zip(vectors[::2], vectors[1::2])]
    return _lanes_sum(e, vectors[0])


@intrinsic
def _row_dot(
    typingctx, codes, n, x, x0, x1, m, scales, bits, exp_bits, man_bits, specials, group_bytes
):
    """row_dot(codes, n, x, x0, x1, m, scales, bits, exp_bits, man_bits, specials, group_bytes)
    -> fp32: row n of W (codes (N, *), scales (N, G)) against row m of x (M, K) fp32 (4-bit:
    of x0, x1 (M, K / 2), its even and odd elements), times the format's rebias; the last five
    are the kernel's constants (bits, Format.fields, the 4-bit group's bytes or 0)."""
    constants = (bits, exp_bits, man_bits, specials, group_bytes)
    if not all(isinstance(c, types.IntegerLiteral) for c in constants):
        return None  # Numba tries again with the literal values
    bits, exp_bits, man_bits, specials, group_bytes = (c.literal_value for c in constants)
    fields = (exp_bits, man_bits, specials)

    def codegen(context, builder, signature, args):
        e = Emit(context, builder, signature.args, args)
        w, zero = e.row(0, args[1]), ir.Constant(ir.VectorType(F32, WIDTH), None)
        sums = [cgutils.alloca_once_value(builder, zero) for _ in range(SUMS)]
        if bits == 4:
            x0, x1, ws = e.row(3, args[5]), e.row(4, args[5]), e.row(6, args[1])
            total = _nibble_row(e, w, x0, x1, ws, e.dim(0, 1), bits, fields, group_bytes, sums)
        else:
            total = _wide_row(e, w, e.row(2, args[5]), e.dim(2, 1), bits, fields, sums)
        factor = rebias(exp_bits)
        return total if factor == 1 else builder.fmul(total, ir.Constant(F32, factor))

    return types.float32(*(codes, n, x, x0, x1, m, scales), *constants), codegen


@functools.cache
def _gemv_kernel(bits, exp_bits, man_bits, specials, group_bytes):
    """The GEMV of one format (its bits and fields) and 4-bit group, its constants compiled in."""

    @kernel(serial_below=SERIAL_BELOW)
    def _gemv(codes, scales, x, x0, x1, bias, y):
        # codes (N, *), scales (N, G) or (N, 0), x (M, K) fp32, M < DECODE_ONCE_FROM; x0, x1
        # (M, K / 2): x's even and odd elements for 4-bit codes, else (M, 0); bias (N,) or
        # (0,), y (M, N) fp32: a block of rows of W per iteration (quant.cu's qmatmul: a warp
        # per row), each row dotted with each row of x. No software prefetch: asking for the
        # next rows' lines slowed the head's GEMV (bf16 30 -> 26 GB/s with 4 KB ahead, fp16
        # 30 -> 15; AMD EPYC Zen 4), where the hardware prefetcher alone keeps up.
        M, N = x.shape[0], codes.shape[0]
        for b in prange(-(-N // BLOCK_ROWS)):
            for n in range(b * BLOCK_ROWS, min(N, (b + 1) * BLOCK_ROWS)):
                for m in range(M):
                    d = _row_dot(
                        codes,
                        n,
                        x,
                        x0,
                        x1,
                        m,
                        scales,
                        bits,
                        exp_bits,
                        man_bits,
                        specials,
                        group_bytes,
                    )
                    if group_bytes == 0 and scales.shape[1]:
                        d *= scales[n, 0]
                    y[m, n] = d + bias[n] if bias.shape[0] else d

    return _gemv


def gemv(codes, scales, group_size, bits, fields, xs, bias, y):
    """y (M, N) = xs (M, K) W^T + bias, fp32, W's codes decoded as they are read: 8- and 16-bit
    codes of one scale a row (or none), or 4-bit codes in groups of a multiple of NIBBLE_BYTES
    bytes; False (nothing done) for any other layout, which cpu.py decodes a row at a time."""
    K = xs.shape[1]
    group_bytes = group_size // 2 if bits == 4 else 0
    if bits == 4 and group_bytes % NIBBLE_BYTES:
        return False
    if bits != 4 and (codes.shape[1] != K or scales.shape[1] > 1):
        return False
    x0 = x1 = np.empty((xs.shape[0], 0), np.float32)
    if bits == 4:
        x0, x1 = np.ascontiguousarray(xs[:, 0::2]), np.ascontiguousarray(xs[:, 1::2])
    _gemv_kernel(bits, *fields, group_bytes)(codes, scales, xs, x0, x1, bias, y)
    return True


# ---------------------------------------------------------------- a prompt's rows of W


@intrinsic
def _decode_into(typingctx, out, r, codes, n, scales, bits, exp_bits, man_bits, specials):
    """decode_into(out, r, codes, n, scales, bits, exp_bits, man_bits, specials): row r of out
    (R, K) fp32 = row n of W decoded, each group's values times (its scale times rebias),
    cpu.py's decode_row's operations and bits (but for a signaling NaN of bf16 or fp16, which
    LLVM's fold of the times 1 leaves unquieted), WIDTH elements (4-bit: 2 WIDTH) a store; the
    groups (K / scales.shape[1], or K unscaled) whole vectors (decode_rows checks)."""
    constants = (bits, exp_bits, man_bits, specials)
    if not all(isinstance(c, types.IntegerLiteral) for c in constants):
        return None  # Numba tries again with the literal values
    bits, exp_bits, man_bits, specials = (c.literal_value for c in constants)
    fields = (exp_bits, man_bits, specials)
    step = 2 * WIDTH if bits == 4 else WIDTH  # elements a store

    def codegen(context, builder, signature, args):
        e = Emit(context, builder, signature.args, args)
        dst, w, ws = e.row(0, args[1]), e.row(2, args[3]), e.row(4, args[3])
        K, b = e.dim(0, 1), builder
        groups = e.dim(4, 1) if bits != 16 else ir.Constant(I64, 1)  # 16-bit: unscaled
        per_group = b.udiv(b.udiv(K, groups), ir.Constant(I64, step))
        interleave = ir.Constant(
            ir.VectorType(I32, 2 * WIDTH), [j // 2 + WIDTH * (j % 2) for j in range(2 * WIDTH)]
        )
        with cgutils.for_range(b, groups) as group:
            scale = e.load(ws, e.at(group.index, 4), F32) if bits != 16 else ir.Constant(F32, 1)
            factor = b.fmul(scale, ir.Constant(F32, rebias(exp_bits)))
            splat_factor = e.broadcast(factor, WIDTH)
            with cgutils.for_range(b, per_group) as chunk:
                k = b.add(
                    b.mul(group.index, b.mul(per_group, ir.Constant(I64, step))),
                    b.mul(chunk.index, ir.Constant(I64, step)),
                )
                if bits == 4:
                    pairs = _codes(e, w, b.udiv(k, ir.Constant(I64, 2)), WIDTH, 1)
                    lo, hi = (
                        b.fmul(_nibble_values(e, nibbles, fields), splat_factor)
                        for nibbles in (pairs, b.lshr(pairs, splat(I32, WIDTH, 4)))
                    )
                    values = b.shuffle_vector(lo, hi, interleave)
                else:
                    codes = _codes(e, w, k, WIDTH, bits // 8, exp_bits == 0)
                    values = b.fmul(_values(e, codes, bits, fields), splat_factor)
                at = b.bitcast(b.gep(dst, [e.at(k, 4)]), values.type.as_pointer())
                b.store(values, at).align = 1
        return context.get_dummy_value()

    return types.void(out, r, codes, n, scales, *constants), codegen


@functools.cache
def _decode_kernel(bits, exp_bits, man_bits, specials):
    @kernel(serial_below=SERIAL_BELOW)
    def _decode(out, codes, scales, ids):
        # out (R, K) fp32, codes (N, *), scales (N, G) or (N, 0), ids (R,) int64: a row of
        # out per iteration (quant.cu's qembedding: a block per row); out first: one core
        # below SERIAL_BELOW elements of it.
        for r in prange(ids.shape[0]):
            _decode_into(out, r, codes, ids[r], scales, bits, exp_bits, man_bits, specials)

    return _decode


def decode_rows(out, codes, scales, group_size, bits, fields, ids):
    """out (R, K) fp32 = rows ids (R,) of W decoded (cpu.py's decode_row's bits), where each
    group (group_size elements, a row's K unscaled) is whole vectors (WIDTH elements, 2 WIDTH
    4-bit); False (nothing done) for any other layout."""
    if group_size % (2 * WIDTH if bits == 4 else WIDTH):
        return False
    _decode_kernel(bits, *fields)(out, codes, scales, ids)
    return True
