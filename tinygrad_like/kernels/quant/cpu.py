"""Quantized weights on the CPU (quant.cu's twin): a GEMM and a gather that decode the stored
codes as they read them (the layout: tinygrad_like/formats.py).

qmatmul takes one output channel (a row of W (N, K)) at a time, as quant.cu gives each row a
block: the row's codes are decoded into a K-long fp32 scratch row (in L1; decode_row: each
group of group_size elements to fp32 times its scale), then the row is dotted with each of the
M rows of x (compiled.vector_dot, reassociated so that LLVM vectorizes it; a warp's lanes and
warp_sum on the GPU); a decode step's few rows of x go through _decode_dot instead, each code
decoded as it is read. Rows go a block of _BLOCK_ROWS per prange iteration (the scratch made
once per block). The decode functions below are quant.cu's device functions of the same
names: bit operations from the code to the fp32 value, exact (every format's values are fp32
values), so both backends decode the same bits; one function, minifloat_value, serves every
small float by its fields (tinygrad_like/formats.py FORMATS[fmt].fields), through fp16
(compiled.f32_from_f16_bits) where quant.cu goes straight to fp32's bits: the same values.

int8 activations (spec.py: quantize_rows, qmatmul_int8x). A row of W against a row of x is
written in LLVM IR (_row_dot), not as Numba loops: Numba runs LLVM's loop vectorizer but not
its SLP vectorizer (NUMBA_SLP_VECTORIZE=0), and a block's loop of 32 is unrolled whole before
the loop vectorizer sees it, so it compiles to 32 scalar multiply-adds. The IR multiplies
unsigned by signed bytes, a weight's int8 code plus 128 (its byte with the sign bit flipped)
or an int4 nibble (q + 8) by x's int8 codes, and subtracts 128 or 8 times the block's sum of
x codes: on AVX-512 VNNI vpdpbusd over 64 bytes, else one block's llvm.vector.reduce.add at a
time (vpmaddwd on AVX2), the same integers. quant.cu's twins multiply signed bytes by __dp4a,
the same integers again, then do spec.py's fp32 operations in spec.py's order as these do:
the same bits.
"""

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ...backend.cpu.compiled import (
    device,
    f32_from_bits,
    f32_from_f16_bits,
    kernel,
    prefetch,
    vector_dot,
)
from ...backend.cpu.runtime import f32, rounded
from ...formats import FINITE, FORMATS, NAN_ONLY
from ..elementwise.cpu import add as elementwise_add
from ..embedding.spec import check_ids
from .spec import TINY_BLOCK, X_BLOCK, int8x_out, x_blocks

_BLOCK_ROWS = 8  # rows of W per prange iteration

# The decode functions compute in int32 throughout (every constant an int32): Numba widens an
# int32 mixed with a Python int to int64, and its loops then do not vectorize.
i32 = np.int32


@device
def int8_value(code):
    """The int8 whose two's-complement bits are the byte code: code - 256 when the sign bit is
    set."""
    return (i32(code) ^ i32(0x80)) - i32(0x80)


@device
def int4_value(nibble):
    """The int4 value q in [-7, 7] of a nibble stored as q + 8."""
    return i32(nibble) - i32(8)


@device
def int4_float(nibble):
    """int4_value(nibble) as fp32, made from bits: the fp32 2^23 + nibble less 2^23 + 8, exact.
    The same value as np.float32(int4_value(nibble)); this form LLVM vectorizes (Numba widens
    the integer one to 64-bit lanes)."""
    return f32_from_bits(i32(nibble) | i32(0x4B000000)) - np.float32(8388616.0)


@device
def minifloat_value(code, exp_bits, man_bits, specials):
    """A small float's value over minifloat_scale(exp_bits), exactly: the fp16 (compiled.
    f32_from_f16_bits) with code's sign, code's exponent as the low bits of fp16's and code's
    mantissa as the top bits of fp16's, so that the multiply by minifloat_scale rebiases the
    exponent; a subnormal (exponent 0) is an fp16 subnormal. fp16 and fp8 E5M2 (exp_bits 5,
    IEEE) are fp16 themselves, their infinities and NaNs fp16's; an E4M3 NaN (NAN_ONLY: every
    bit of the magnitude set) gets fp16's exponent of all ones; no smaller format (fp4 E2M1:
    FINITE) reaches it. bf16 is fp32's top half (its scale 1). (1 sign, exp_bits <= 5 exponent
    and man_bits <= 10 mantissa bits, bias 2^(exp_bits - 1) - 1.) The values of quant.cu's
    minifloat_value and bf16_value, bit for bit (a NaN's payload aside: here E4M3's NaN keeps
    its mantissa). No branch: the loops calling it vectorize."""
    c = i32(code)
    if exp_bits == 8 and man_bits == 7:  # bf16: fp32's top half, its specials included
        return f32_from_bits(c << i32(16))
    sign = i32(1) << i32(exp_bits + man_bits)  # code's sign bit
    unit = i32(1) << (i32(10) - i32(man_bits))  # code's last place in fp16's bits
    # code as a signed integer (as int8_value: a sign extension) times unit: the magnitude in
    # place, the sign in fp16's bit 15 and the bits below it down to the magnitude, cleared
    half = ((c ^ sign) - sign) * unit & (i32(0x8000) | (sign - i32(1)) * unit)
    if specials == NAN_ONLY:  # E4M3: a magnitude of all ones carries into fp16's fifth
        half |= (half + unit) & i32(0x4000)  # exponent bit, the other four set already
    return f32_from_f16_bits(half)


@device
def minifloat_scale(exp_bits):
    """2^(15 - bias), bias = 2^(exp_bits - 1) - 1 (1 for bf16, exp_bits 8): what
    minifloat_value is multiplied by (exactly) to make the value."""
    if exp_bits == 8:
        return np.float32(1)
    return f32_from_bits((i32(143) - (i32(1) << i32(exp_bits - 1))) << i32(23))


@device
def element_value(code, exp_bits, man_bits, specials):
    """An 8- or 16-bit code's value before its scale: int8_value (exp_bits 0) or
    minifloat_value, as fp32 (quant.cu's element_value)."""
    if exp_bits == 0:
        return np.float32(int8_value(code))
    return minifloat_value(code, exp_bits, man_bits, specials)


@device
def nibble_value(nibble, exp_bits, man_bits):
    """A 4-bit code's value before its scale: int4_float (exp_bits 0) or fp4 E2M1's
    minifloat_value."""
    if exp_bits == 0:
        return int4_float(nibble)
    return minifloat_value(nibble, exp_bits, man_bits, FINITE)


@device
def decode_row(codes, scales, group_size, exp_bits, man_bits, specials, w):
    """w (K,) fp32 = the row whose codes (K,) or (K / 2,) and scales (K / group_size,) (empty
    for the unscaled formats) are given, in the format of these fields (Format.fields): each
    group's values (element_value, nibble_value) times its scale times minifloat_scale (a power
    of two: the product is the scaled value, exactly), a loop per group that vectorizes. A
    4-bit byte holds elements 2j (low nibble) and 2j + 1 (high)."""
    rebias = minifloat_scale(exp_bits) if exp_bits else np.float32(1)
    for group in range(w.shape[0] // group_size):
        lo = group * group_size
        factor = (scales[group] if scales.shape[0] else np.float32(1)) * rebias
        values = w[lo : lo + group_size]
        if codes.shape[0] < w.shape[0]:
            pairs = codes[lo // 2 : (lo + group_size) // 2]
            for j in range(group_size // 2):
                values[2 * j] = nibble_value(pairs[j] & 15, exp_bits, man_bits) * factor
                values[2 * j + 1] = nibble_value(pairs[j] >> 4, exp_bits, man_bits) * factor
        else:
            row = codes[lo : lo + group_size]
            for k in range(group_size):
                values[k] = element_value(row[k], exp_bits, man_bits, specials) * factor


@device
def _decode_dot(codes, scales, x0, x1, exp_bits, man_bits, specials, group_bytes):
    """The decode-step dot, inlined into a kernel made per format (_qmatmul_kernel), whose
    fields (and, 4-bit, group bytes) are its constants, so that LLVM folds the decode into a
    few vector instructions; reassociated by the kernel's fastmath, as compiled.vector_dot.
    8- and 16-bit codes (K,) with one scale a row: sum_k value(codes[k]) x0[k] (the caller
    multiplies by the scale; x1 unused). 4-bit bytes (K / 2,): x0, x1 (K / 2,) are x's even
    and odd elements (a byte's low and high nibble), each group's bytes a loop of a constant
    trip count (unrolled whole), times its scale: sum_g scales[g] sum_j (lo_j x0_j + hi_j x1_j).
    quant.cu's qmatmul decodes the same bits a warp's lane at a time."""
    s = np.float32(0)
    if group_bytes == 0:
        for k in range(x0.shape[0]):
            s += element_value(codes[k], exp_bits, man_bits, specials) * x0[k]
    else:
        for g in range(codes.shape[0] // group_bytes):
            lo, t = g * group_bytes, np.float32(0)
            for j in range(group_bytes):
                b = i32(codes[lo + j])
                low, high = b & i32(15), b >> i32(4)
                t += (
                    nibble_value(low, exp_bits, man_bits) * x0[lo + j]
                    + nibble_value(high, exp_bits, man_bits) * x1[lo + j]
                )
            s += scales[g] * t
    return s * minifloat_scale(exp_bits) if exp_bits else s


# Below this much work (_qmatmul_work) a qmatmul runs on one core: a parallel launch costs
# 60-100 us, and two cores streaming weights from memory share its bandwidth. Measured (AMD
# EPYC family 25 model 1, 2 vCPUs, M = 1, K = 768, us serial / parallel), weights from memory
# (40 matrices in turn): int4 0.88M codes 298 / 343, 1.18M 397-436 / 481-562; int8 2.36M
# 180-191 / 255-290; bf16 2.36M 436-469 / 503-565; the LM head (38.6M codes, repeated): int8
# 2,959 / 1,572, bf16 6,066 / 2,557, int4 (19.3M) 6,491 / 3,282.
_QMATMUL_SERIAL_BELOW = 1 << 22
_DECODE_ONCE_FROM = 4  # rows of x from which a row of W is decoded once, not at every row
_GROUP_BYTES = (16, 32, 64)  # the 4-bit groups (32, 64, 128 elements) with a decode-step dot
# How far ahead of the row it decodes the decode-step dot asks for codes (prefetch): streaming
# one core's GEMV from memory, the hardware prefetcher alone let an int8 GEMV of the head read
# 8.4 GB/s, and 12.2-12.9 with rows 2 to 16 ahead asked for (AMD EPYC Zen 3, 12 GB/s read).
_PREFETCH_BYTES = 4096


def _qmatmul_work(codes, scales, group_size, x, *rest):
    """A qmatmul's work for compiled.kernel's one-core rule: its codes, times x's rows when
    each decoded row of W is dotted with them all (from _DECODE_ONCE_FROM rows: a prompt)."""
    return codes.size * (x.shape[0] if x.shape[0] >= _DECODE_ONCE_FROM else 1)


def _qmatmul_kernel(exp_bits, man_bits, specials, group_bytes):
    """The qmatmul of one format (and 4-bit group), compiled with its fields as constants."""

    @kernel(serial_below=_QMATMUL_SERIAL_BELOW, work=_qmatmul_work, fastmath=True)
    def _qmatmul(codes, scales, group_size, x, x0, x1, bias, y):
        # codes (N, *), scales (N, G) or (N, 0), x (M, K) fp32, bias (N,) or (0,), y (M, N)
        # fp32; x0, x1 (M, K / 2): x's even and odd elements, or empty (M, 0) when the 4-bit
        # dot is not used: a block of rows of W per iteration (quant.cu's qmatmul: a block per
        # row). A few rows of x (a decode step) go through _decode_dot, each code decoded as read;
        # else each row of W is decoded once into w (decode_row) and dotted with every row of x.
        # one core below _QMATMUL_SERIAL_BELOW's work (_qmatmul_work, compiled.kernel's rule).
        M, K = x.shape
        N = codes.shape[0]
        direct = M < _DECODE_ONCE_FROM and (
            group_bytes > 0 or (codes.shape[1] == K and scales.shape[1] <= 1)
        )
        row_bytes = codes.shape[1] * codes.itemsize
        ahead, line = 1 + _PREFETCH_BYTES // row_bytes, max(1, 64 // codes.itemsize)
        for b in prange(-(-N // _BLOCK_ROWS)):
            w = np.empty(K, np.float32)
            for n in range(b * _BLOCK_ROWS, min(N, (b + 1) * _BLOCK_ROWS)):
                if direct:
                    for col in range(0, codes.shape[1], line):  # the row ahead's cache lines
                        prefetch(codes, min(n + ahead, N - 1), col)
                    for m in range(M):
                        if group_bytes:  # a constant: one branch compiled
                            d = _decode_dot(
                                codes[n],
                                scales[n],
                                x0[m],
                                x1[m],
                                exp_bits,
                                man_bits,
                                specials,
                                group_bytes,
                            )
                        else:
                            d = _decode_dot(
                                codes[n],
                                scales[n],
                                x[m],
                                x[m],
                                exp_bits,
                                man_bits,
                                specials,
                                group_bytes,
                            )
                            d *= scales[n, 0] if scales.shape[1] else np.float32(1)
                        y[m, n] = d + bias[n] if bias.shape[0] else d
                    continue
                decode_row(codes[n], scales[n], group_size, exp_bits, man_bits, specials, w)
                for m in range(M):
                    d = vector_dot(x[m], w)
                    y[m, n] = d + bias[n] if bias.shape[0] else d

    return _qmatmul


_QMATMUL = {}  # (fields, group bytes) -> its kernel, made when first used


@kernel
def _qembedding(out, codes, scales, group_size, exp_bits, man_bits, specials, idx):
    # out (T, K) fp32, idx (T,): the row of each id decoded straight into its output row
    # (quant.cu's qembedding: a block per id). out first: one core below SERIAL_BELOW elements.
    for t in prange(idx.shape[0]):
        row = idx[t]
        decode_row(codes[row], scales[row], group_size, exp_bits, man_bits, specials, out[t])


def _kernel_args(codes, scales, fmt, group_size):
    """The compiled kernels' form of a weight: codes, scales (an (N, 0) array when there are
    none: one signature for every format), the group size and its format's fields."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}: use one of {', '.join(FORMATS)}")
    if scales is None:
        scales, group_size = np.empty((codes.shape[0], 0), np.float32), codes.shape[1]
    return (codes, scales, group_size) + FORMATS[fmt].fields


def qmatmul(x, codes, scales, fmt, group_size, bias=None, add=None):
    """W decoded row by row inside the kernel, accumulated in fp32 and rounded once (2-byte x:
    computed in fp32); then + add (M, N) by elementwise's add, written into y itself: a pass
    over y while it is in the cache (a decode step's M is 1), the bits of the unfused add."""
    codes, scales, group_size, *fields = _kernel_args(codes, scales, fmt, group_size)
    xs = np.ascontiguousarray(f32(x), dtype=np.float32)
    b = np.zeros(0, np.float32) if bias is None else np.ascontiguousarray(f32(bias), np.float32)
    y = np.empty((x.shape[0], codes.shape[0]), np.float32)
    group_bytes = group_size // 2 if FORMATS[fmt].bits == 4 else 0
    x0 = x1 = np.empty((xs.shape[0], 0), np.float32)
    if group_bytes in _GROUP_BYTES and xs.shape[0] < _DECODE_ONCE_FROM:
        x0, x1 = np.ascontiguousarray(xs[:, 0::2]), np.ascontiguousarray(xs[:, 1::2])
    else:
        group_bytes = 0  # the 4-bit dot's constant is unused: one kernel for every other group
    key = (*fields, group_bytes)
    if key not in _QMATMUL:
        _QMATMUL[key] = _qmatmul_kernel(*key)
    _QMATMUL[key](codes, scales, group_size, xs, x0, x1, b, y)
    y = rounded(y, x.dtype)
    return y if add is None else elementwise_add(add, y, out=y)


def qembedding(codes, scales, idx, fmt, group_size):
    check_ids(idx, codes.shape[0])
    args = _kernel_args(codes, scales, fmt, group_size)
    K = codes.shape[1] * (2 if FORMATS[fmt].bits == 4 else 1)
    flat = np.ascontiguousarray(idx.reshape(-1), dtype=np.int64)
    out = np.empty((flat.shape[0], K), np.float32)
    _qembedding(out, *args, flat)
    return out.reshape(idx.shape + (K,))


# ---------------------------------------------------------------- int8 activations

_I8, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
_LANES = 8  # spec.py's fp32 lanes: block b is added into lane b % 8


@kernel
def _quantize_rows(x, codes, scales):
    # x (M, K) fp32, codes (M, K) int8, scales (M, K / X_BLOCK) fp32: a row of x per
    # iteration (quant.cu's quantize_rows: a warp per block), each block's largest magnitude
    # (NaN if any is NaN: the same max in any order, as the warp's tree takes it), its scale,
    # then each code: fp32's division and np.rint (round half to even), as quant.cu's
    # __fdiv_rn and rintf. No fast-math: each operation rounded on its own.
    for m in prange(x.shape[0]):
        for b in range(scales.shape[1]):
            block = x[m, b * X_BLOCK : (b + 1) * X_BLOCK]
            top = np.float32(0)
            for v in block:
                a = abs(v)
                top = a if a > top or a != a else top
            scale = np.float32(1) if top < TINY_BLOCK else top / np.float32(127)
            scales[m, b] = scale
            for j in range(X_BLOCK):
                q = np.rint(block[j] / scale)
                codes[m, b * X_BLOCK + j] = np.int8(q) if q == q else np.int8(0)


def quantize_rows(x):
    M = x.shape[0]
    codes = np.empty(x.shape, np.int8)
    scales = np.empty((M, x_blocks(x)), np.float32)
    _quantize_rows(np.ascontiguousarray(f32(x), dtype=np.float32), codes, scales)
    return codes, scales


class _Emit:
    """LLVM IR over one builder: loads at byte offsets of an i8* (a row of a C-contiguous
    Numba array), constants; ints are i64 offsets, i32 lanes."""

    def __init__(self, context, builder, kinds, args):
        self.context, self.b, self.kinds, self.args = context, builder, kinds, args

    def row(self, i, row=None):
        """An i8* to row `row` of argument i (2-D), or to its start (1-D)."""
        kind = self.kinds[i]
        array = self.context.make_array(kind)(self.context, self.b, self.args[i])
        index = [row, ir.Constant(_I64, 0)][-kind.ndim :]
        at = cgutils.get_item_pointer(self.context, self.b, kind, array, index, wraparound=False)
        return self.b.bitcast(at, _I8.as_pointer())

    def dim(self, i, axis):
        shape = self.context.make_array(self.kinds[i])(self.context, self.b, self.args[i]).shape
        return self.b.extract_value(shape, axis)

    def at(self, j, step, plus=0):
        """The offset j * step + plus."""
        return self.b.add(self.b.mul(j, ir.Constant(_I64, step)), ir.Constant(_I64, plus))

    def load(self, base, offset, kind, n=None):
        """<n x kind> (or one kind when n is None) at base + offset bytes, unaligned."""
        pointee = kind if n is None else ir.VectorType(kind, n)
        load = self.b.load(self.b.bitcast(self.b.gep(base, [offset]), pointee.as_pointer()))
        load.align = 1
        return load

    def lane(self, i):
        return ir.Constant(_I32, i)


def _splat(kind, n, v):
    return ir.Constant(ir.VectorType(kind, n), [v] * n)


def _unsigned_codes(e, w, nibbles, lane):
    """A weight's bytes w <n x i8> as unsigned code values: an int8 code + 128 (w ^ 0x80) or,
    4-bit, each byte's low (lane 0) or high (lane 1) nibble."""
    n = w.type.count
    if not nibbles:
        return e.b.xor(w, _splat(_I8, n, 0x80))
    return e.b.and_(e.b.lshr(w, _splat(_I8, n, 4 * lane)), _splat(_I8, n, 15))


def _block_sum(e, w, x0, x1, b, nibbles):
    """Block b's sum of unsigned code values times x codes, an i32: int8 w (K,) bytes times x0
    (K,), or int4 w (K / 2,) bytes, their low nibbles times x0 (x's even elements, K / 2) and
    high nibbles times x1 (odd), as one <32 x i32> product summed (llvm.vector.reduce.add,
    which LLVM lowers to vpdpbusd on AVX-512 VNNI, vpmaddwd on AVX2)."""
    size = X_BLOCK // 2 if nibbles else X_BLOCK  # bytes of the block in w, x0 and x1
    w = e.load(w, e.at(b, size), _I8, size)
    u, x = _unsigned_codes(e, w, nibbles, 0), e.load(x0, e.at(b, size), _I8, size)
    if nibbles:  # the two halves side by side
        both = ir.Constant(ir.VectorType(_I32, X_BLOCK), list(range(X_BLOCK)))
        u = e.b.shuffle_vector(u, _unsigned_codes(e, w, True, 1), both)
        x = e.b.shuffle_vector(x, e.load(x1, e.at(b, size), _I8, size), both)
    wide = ir.VectorType(_I32, X_BLOCK)
    products = e.b.mul(e.b.zext(u, wide), e.b.sext(x, wide))
    reduce = cgutils.get_or_insert_function(
        e.b.module, ir.FunctionType(_I32, [wide]), f"llvm.vector.reduce.add.v{X_BLOCK}i32"
    )
    return e.b.call(reduce, [products])


def _pairs(e, a, b):
    """Neighbouring lanes of a then b added: <n x i32> twice -> <n x i32> of pair sums."""
    n = a.type.count
    pick = [ir.Constant(ir.VectorType(_I32, n), list(range(k, 2 * n, 2))) for k in (0, 1)]
    return e.b.add(*(e.b.shuffle_vector(a, b, p) for p in pick))


def _vnni(e, acc, u, x):
    """acc <16 x i32> + the sums of each 4 neighbouring products of u (unsigned bytes) and x
    (signed), <64 x i8> each: AVX-512 VNNI's vpdpbusd, which LLVM's reduction of one block
    (_block_sum) also compiles to, but here four blocks of int4 (two of int8) a register."""
    v16 = ir.VectorType(_I32, 16)
    fn = cgutils.get_or_insert_function(
        e.b.module, ir.FunctionType(v16, [v16] * 3), "llvm.x86.avx512.vpdpbusd.512"
    )
    return e.b.call(fn, [acc, e.b.bitcast(u, v16), e.b.bitcast(x, v16)])


def _chunk_sums(e, w, x0, x1, j, nibbles):
    """<8 x i32>: _block_sum of blocks 8 j .. 8 j + 7. On AVX-512 VNNI the products of 64
    bytes at a time summed four by four (each i32 lane within one block), then each block's
    lanes added: neighbouring pairs three times (int8) or twice, blocks kept in order."""
    if "+avx512vnni" not in e.context.codegen().magic_tuple()[2].split(","):
        sums = ir.Constant(ir.VectorType(_I32, _LANES), None)
        for i in range(_LANES):
            block = _block_sum(e, w, x0, x1, e.at(j, _LANES, i), nibbles)
            sums = e.b.insert_element(sums, block, e.lane(i))
        return sums
    zero, parts = ir.Constant(ir.VectorType(_I32, 16), None), []
    for h in range(2 if nibbles else 4):  # int4: 4 blocks a register, 4 lanes each
        at = e.at(j, _LANES * X_BLOCK // (2 if nibbles else 1), 64 * h)
        w64 = e.load(w, at, _I8, 64)
        acc = _vnni(e, zero, _unsigned_codes(e, w64, nibbles, 0), e.load(x0, at, _I8, 64))
        if nibbles:
            acc = _vnni(e, acc, _unsigned_codes(e, w64, True, 1), e.load(x1, at, _I8, 64))
        parts.append(acc)
    while len(parts) > 1:
        parts = [_pairs(e, a, b) for a, b in zip(parts[::2], parts[1::2])]
    (t,) = parts  # <16 x i32>: two lanes a block, in order; its halves' neighbours added
    half = [ir.Constant(ir.VectorType(_I32, 8), list(range(k, k + 8))) for k in (0, 8)]
    return _pairs(e, *(e.b.shuffle_vector(t, t, h) for h in half))


def _chunk_scales(e, ws, group_of, groups, nb, j):
    """<8 x float>: the weight scales of blocks 8 j .. 8 j + 7, ws[group_of[b]]: loaded as
    stored when each block is a group, one splat when the 8 share one, else one by one."""
    lanes = ir.VectorType(_F32, _LANES)
    slot = cgutils.alloca_once(e.b, lanes)

    def scale(b):
        g = e.b.sext(e.load(group_of, e.at(b, 4), _I32), _I64)
        return e.load(ws, e.at(g, 4), _F32)

    per_group = e.b.udiv(nb, groups)
    with e.b.if_else(e.b.icmp_unsigned("==", per_group, ir.Constant(_I64, 1))) as (each, shared):
        with each:
            e.b.store(e.load(ws, e.at(j, 4 * _LANES), _F32, _LANES), slot)
        with shared:
            v = ir.Constant(lanes, None)
            whole = e.b.icmp_unsigned(
                "==", e.b.urem(per_group, ir.Constant(_I64, _LANES)), ir.Constant(_I64, 0)
            )
            with e.b.if_else(whole) as (one, several):
                with one:
                    first = e.b.insert_element(v, scale(e.at(j, _LANES)), e.lane(0))
                    e.b.store(e.b.shuffle_vector(first, v, _splat(_I32, _LANES, 0)), slot)
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
        e = _Emit(context, builder, signature.args, args)
        w, ws, group_of = e.row(0, args[1]), e.row(7, args[1]), e.row(8)
        x0, x1, xoff, xs = (e.row(i, args[4]) for i in (2, 3, 5, 6))
        nb, groups = e.dim(6, 1), e.dim(7, 1)
        whole = builder.udiv(nb, ir.Constant(_I64, _LANES))
        lanes = ir.VectorType(_F32, _LANES)
        total = cgutils.alloca_once_value(builder, ir.Constant(lanes, None))
        with cgutils.for_range(builder, whole) as loop:
            j, at = loop.index, e.at(loop.index, 4 * _LANES)  # 8 int32s or fp32s
            isum = builder.sub(_chunk_sums(e, w, x0, x1, j, nibbles), e.load(xoff, at, _I32, 8))
            scale = builder.fmul(
                e.load(xs, at, _F32, 8), _chunk_scales(e, ws, group_of, groups, nb, j)
            )
            t = builder.fmul(scale, builder.sitofp(isum, lanes))
            builder.store(builder.fadd(builder.load(total), t), total)
        start = builder.mul(whole, ir.Constant(_I64, _LANES))
        with cgutils.for_range_slice(builder, start, nb, ir.Constant(_I64, 1)) as (b, _):
            s = builder.sub(_block_sum(e, w, x0, x1, b, nibbles), e.load(xoff, e.at(b, 4), _I32))
            g = builder.sext(e.load(group_of, e.at(b, 4), _I32), _I64)
            scale = builder.fmul(e.load(xs, e.at(b, 4), _F32), e.load(ws, e.at(g, 4), _F32))
            lane, v = builder.trunc(builder.sub(b, start), _I32), builder.load(total)
            t = builder.fadd(
                builder.extract_element(v, lane), builder.fmul(scale, builder.sitofp(s, _F32))
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


def _qmatmul_int8x_kernel(nibbles):
    """qmatmul_int8x for int8 (nibbles False) or int4 weights."""
    offset = np.int32(8 if nibbles else 128)  # what the unsigned code values add to the codes

    @kernel(serial_below=_QMATMUL_SERIAL_BELOW, work=_qmatmul_work)
    def _qmatmul_int8x(codes, scales, group_size, xq, x0, x1, xs, xoff, group_of, bias, y):
        # codes (N, K) or (N, K / 2) uint8, scales (N, K / group_size), xq (M, K) int8 codes,
        # xs (M, K / 32) their scales, bias (N,) or (0,), y (M, N) fp32; scratch: xoff (M,
        # K / 32) int32, group_of (K / 32,) int32, and for int4 x0, x1 (M, K / 2) (x's even
        # and odd codes, a byte's nibbles' partners), else x0 = x1 = xq. First each block's
        # offset, group (and the split), then a block of rows of W per iteration (quant.cu's
        # qmatmul_int8x: a warp per row), each dotted with every row of x (the row_dot IR).
        M, nb = xs.shape
        N = codes.shape[0]
        for b in range(nb):
            group_of[b] = b // (group_size // X_BLOCK)
        for m in range(M):
            for b in range(nb):
                s = np.int32(0)
                for k in range(b * X_BLOCK, (b + 1) * X_BLOCK):
                    s += np.int32(xq[m, k])
                xoff[m, b] = offset * s
            if nibbles:
                for j in range(x0.shape[1]):
                    x0[m, j], x1[m, j] = xq[m, 2 * j], xq[m, 2 * j + 1]
        for r in prange(-(-N // _BLOCK_ROWS)):
            for n in range(r * _BLOCK_ROWS, min(N, (r + 1) * _BLOCK_ROWS)):
                for m in range(M):
                    if nibbles:
                        d = _int4_row_dot(codes, n, x0, x1, m, xoff, xs, scales, group_of)
                    else:
                        d = _int8_row_dot(codes, n, x0, x1, m, xoff, xs, scales, group_of)
                    y[m, n] = d + bias[n] if bias.shape[0] else d

    return _qmatmul_int8x


_QMATMUL_INT8X = {f: _qmatmul_int8x_kernel(f == "int4") for f in ("int8", "int4")}


def qmatmul_int8x(xcodes, xscales, codes, scales, fmt, group_size, dtype, bias=None, add=None):
    """The integer dot of each block (the IR above), scaled and summed in spec.py's fp32 order;
    rounded to dtype once; then + add by elementwise's add, written into y itself (as
    qmatmul)."""
    int8x_out(xcodes, xscales, codes, scales, fmt, group_size, dtype, bias, add)
    M, K = xcodes.shape
    xq = np.ascontiguousarray(xcodes)
    b = np.zeros(0, np.float32) if bias is None else np.ascontiguousarray(f32(bias), np.float32)
    y = np.empty((M, codes.shape[0]), np.float32)
    x0 = x1 = xq
    if fmt == "int4":
        x0, x1 = np.empty((M, K // 2), np.int8), np.empty((M, K // 2), np.int8)
    xoff, group_of = np.empty(xscales.shape, np.int32), np.empty(xscales.shape[1], np.int32)
    scales = np.ascontiguousarray(scales, dtype=np.float32)
    xs = np.ascontiguousarray(xscales, dtype=np.float32)
    args = (np.ascontiguousarray(codes), scales, group_size, xq, x0, x1, xs, xoff, group_of, b, y)
    _QMATMUL_INT8X[fmt](*args)
    y = rounded(y, np.dtype(dtype))
    return y if add is None else elementwise_add(add, y, out=y)
