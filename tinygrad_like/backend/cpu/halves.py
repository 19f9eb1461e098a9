"""2-byte floats on the CPU: fp32 <-> bf16 and fp16, each way one compiled loop over the cores.

Numba has no fp16 or bf16 arithmetic, so a 2-byte array reaches the CPU kernels widened to fp32
(f32) and their results are rounded once to the 2-byte format (rounded); elementwise's cast is
converted. NumPy converts fp16 one element at a time, and ml_dtypes (NumPy's bf16) does too,
on one core: in a bf16 or fp16 training step that is a pass per GEMM operand and result at the
speed of a scalar loop. Here:
- bf16 -> fp32: the 16 bits moved up (exact);
- fp32 -> bf16: rounded to nearest, ties to even, on the bits (ml_dtypes' rounding: overflow to
  inf, subnormals rounded alike); a NaN becomes the quiet NaN of its sign, as ml_dtypes makes it;
- fp16 -> fp32: compiled.half_to_f32 (x86's F16C, AArch64's fcvtl; exact);
- fp32 -> fp16: LLVM's fptrunc to half (F16C's vcvtps2ph, IEEE's round to nearest even) where
  the CPU converts halves itself, NumPy's conversion elsewhere.
A signaling fp16 NaN, or an fp32 one rounded to fp16, comes out quiet where NumPy's keeps it
signaling (the hardware's conversions quiet it): the only bits that differ from NumPy's. Every
other value gives NumPy's (ml_dtypes') bits: tests/kernels/test_cpu_halves.py checks every
2-byte value widened and fp32's rounding boundaries, scripts/check_halves.py every fp32 value
rounded. Below SMALL elements NumPy converts (a compiled call costs more than the
conversion of a decode step's rows).

A compiled kernel may also read and write bf16 and fp16 where they lie, as their bits (bits():
bf16 as uint16, fp16 as int16, where the CPU converts halves itself): value() widens an element
as it is loaded, stored() rounds one as it is stored, and the row helpers (row_in, row_out,
row_done) do it a row at a time through a scratch row, so that one kernel body serves fp32,
fp64 and the 2-byte formats and gives the fp32 kernel's bits rounded once, with no widened copy
of an operand made first; copy_into is such a copy between any strides.
"""

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core.registry import cpu_target
from numba.extending import intrinsic, overload

from ... import dtypes
from .compiled import (
    _converts_half,
    bits_from_f32,
    device,
    f32_from_bf16_bits,
    f32_from_f16_bits,
    kernel,
)

SMALL = 1 << 12  # fewer elements than this: NumPy's conversion
HALVES = (np.dtype(dtypes.bfloat16), np.dtype(dtypes.float16))
_HARDWARE_HALF = _converts_half(cpu_target.target_context)  # fptrunc to half compiles here
# the 2-byte formats a compiled kernel reads and writes as their bits (bits(), value(), stored())
IN_PLACE = HALVES if _HARDWARE_HALF else HALVES[:1]


@intrinsic
def _f16_bits_from_f32(typingctx, x):
    """The bits of fp32 x rounded to fp16 (CUDA's __half_as_ushort(__float2half_rn(x))): LLVM's
    fptrunc, on a CPU that converts halves itself (_HARDWARE_HALF)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


@kernel
def _bf16_widened(bits, out):
    """out (n,) uint32: the fp32 bits of the bf16s whose bits are bits (n,) uint16."""
    for i in prange(bits.size):
        out[i] = np.uint32(bits[i]) << np.uint32(16)


@device
def bf16_bits(w):
    """The bf16 bits of the fp32 whose bits are w (uint32): the top 16 after adding half an ulp
    of bf16 less one, plus the kept last bit (ties to even); a NaN its sign's quiet NaN."""
    if w & np.uint32(0x7FFFFFFF) > np.uint32(0x7F800000):
        return np.uint16(((w >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0))
    even = (w >> np.uint32(16)) & np.uint32(1)
    return np.uint16((w + np.uint32(0x7FFF) + even) >> np.uint32(16))


@device
def through_bf16(v):
    """fp32 v rounded to bf16 (rounded's bits), as the fp32 it stands for."""
    return f32_from_bf16_bits(bf16_bits(bits_from_f32(v)))


# A row kernel reads a bf16 operand where it lies, as its bits (operand()), and widens a row at
# a time into a scratch row of the core's (row_in); it writes a bf16 result into a scratch row,
# rounded into the result's bits when the row is done (row_out, row_done). Over fp32 or fp64
# arrays the same calls are the arrays' own rows: one kernel body serves every dtype, and a
# 2-byte result is the fp32 kernel's rounded once (no widened copy of the whole operand made
# first, no fp32 result rounded after).


def value(x):
    """x in the compute type: a 2-byte float's bits (an element of bits()) widened."""


def stored(a, v):
    """v as an element of a: rounded to a 2-byte float's bits where a holds bits."""


def row_in(a, row, scratch):
    """Row `row` of a (rows, C) to read: a's own row, or a 2-byte float's bits widened into
    scratch (C,) fp32, which is returned."""


def row_out(a, row, scratch):
    """Where row `row` of the result a (rows, C) is computed: a's own row, or for a 2-byte
    float's bits scratch (C,) fp32, to be rounded into a by row_done."""


def row_done(a, row, values):
    """values (row_out's) rounded into row `row` of a 2-byte float's bits a; nothing for a
    float a."""


def through(a, v):
    """v as the result a holds it: rounded to its 2-byte format and widened back for bits a
    (what an add after the kernel reads), v itself for a float a."""


def _holds_bits(a):
    """Whether a kernel's argument a (a Numba type) is an array of a 2-byte float's bits: bf16's
    (uint16) or fp16's (int16)."""
    return isinstance(a, types.Array) and a.dtype in (types.uint16, types.int16)


@device
def f16_rounded_bits(v):
    """fp32 v rounded to fp16, as its bits in an int16 (bits()'s fp16 element)."""
    return np.int16(_f16_bits_from_f32(v))


@overload(value, jit_options={"cache": True})
def _value(x):
    if x == types.uint16:
        return lambda x: f32_from_bf16_bits(x)
    if x == types.int16:
        return lambda x: f32_from_f16_bits(np.int32(x))
    return lambda x: x


@overload(stored, jit_options={"cache": True})
def _stored(a, v):
    if _holds_bits(a) and a.dtype == types.uint16:
        return lambda a, v: bf16_bits(bits_from_f32(v))
    if _holds_bits(a):
        return lambda a, v: f16_rounded_bits(v)
    return lambda a, v: v


@overload(row_in, jit_options={"cache": True})
def _row_in(a, row, scratch):
    if _holds_bits(a):

        def widened(a, row, scratch):
            for c in range(scratch.shape[0]):
                scratch[c] = value(a[row, c])
            return scratch

        return widened
    return lambda a, row, scratch: a[row]


@overload(row_out, jit_options={"cache": True})
def _row_out(a, row, scratch):
    if _holds_bits(a):
        return lambda a, row, scratch: scratch
    return lambda a, row, scratch: a[row]


@overload(row_done, jit_options={"cache": True})
def _row_done(a, row, values):
    if _holds_bits(a):

        def rounded_row(a, row, values):
            for c in range(values.shape[0]):
                a[row, c] = stored(a, values[c])

        return rounded_row
    return lambda a, row, values: None


@overload(through, jit_options={"cache": True})
def _through(a, v):
    if _holds_bits(a):
        return lambda a, v: value(stored(a, v))
    return lambda a, v: v


def bits(a):
    """a as a compiled kernel reads or writes it in place, any strides: a bf16 array as its
    bits (uint16), an fp16 one as int16 where the CPU converts halves (IN_PLACE; value() widens
    an element, stored() rounds one), any other as it is."""
    if a.dtype not in IN_PLACE:
        return a
    return a.view(np.uint16 if a.dtype == dtypes.bfloat16 else np.int16)


@kernel
def _copied(src, dst, scale, scaled, rows):
    # src, dst (P, Q, R, S, U), each fp32, fp64 or a 2-byte float's bits: dst = src (x scale where
    # scaled), widened and rounded element by element; a (P, Q) pair per iteration. dst's rows (U,)
    # are contiguous, and src's where rows: typed so (a view, no copy), the loop over a row then
    # vectorizes (an any-strides view's does not; nor does a loop with a branch inside, hence four
    # loops)
    P, Q, R, S, U = dst.shape
    for pq in prange(P * Q):
        p, q = pq // Q, pq % Q
        for r in range(R):
            for s in range(S):
                d = np.ascontiguousarray(dst[p, q, r, s])
                if rows:
                    x = np.ascontiguousarray(src[p, q, r, s])
                    if scaled:
                        for u in range(U):
                            d[u] = stored(dst, value(x[u]) * scale)
                    else:
                        for u in range(U):
                            d[u] = stored(dst, value(x[u]))
                elif scaled:
                    for u in range(U):
                        d[u] = stored(dst, value(src[p, q, r, s, u]) * scale)
                else:
                    for u in range(U):
                        d[u] = stored(dst, value(src[p, q, r, s, u]))


def copy_into(dst, src, scale=None):
    """dst[...] = src (times scale, in the compute type, where given), both of one shape of at
    most 5 axes longer than 1, any strides, in fp32, fp64, bf16 or fp16: one compiled pass over
    the cores (a 2-byte float widened or rounded as it is read or written, NumPy's bits but for
    a signaling fp16 NaN, above), where NumPy's assignment converts bf16 one element at a time
    on one core. -> dst"""
    src = f32(src) if src.dtype in HALVES and src.dtype not in IN_PLACE else src
    # the axes of length 1 dropped (a loop of one turn innermost would not vectorize), then
    # length-1 axes put in front: views, never copies
    axes = tuple(i for i, n in enumerate(dst.shape) if n == 1)
    shape = tuple(n for n in dst.shape if n != 1)
    if len(shape) > 5:
        raise ValueError(f"copy_into: {dst.ndim} axes of more than one element, at most 5")
    as5 = lambda a: bits(a).squeeze(axes).reshape((1,) * (5 - len(shape)) + shape)  # noqa: E731
    s5, d5 = as5(src), as5(dst)
    if (dst.dtype in HALVES and dst.dtype not in IN_PLACE) or d5.strides[-1] != d5.itemsize:
        dst[...] = src if scale is None else f32(src) * scale  # NumPy's assignment
        return dst
    compute = dtypes.compute_dtype(src.dtype).type
    scaling = compute(1 if scale is None else scale)
    _copied(s5, d5, scaling, scale is not None, s5.strides[-1] == s5.itemsize)
    return dst


def operand(a, stat):
    """a (..., C) as a row kernel reads it, (rows, C) C-contiguous: a 2-byte float's bits, read
    where they lie (row_in widens them); any other dtype in stat (fp32 or fp64), widened or
    copied only where it must be."""
    C = a.shape[-1]
    if a.dtype in IN_PLACE:
        return bits(np.ascontiguousarray(a.reshape(-1, C)))
    return np.ascontiguousarray(f32(a.reshape(-1, C)), dtype=stat)


def result(shape, dtype, stat):
    """(the array to return, what a row kernel writes) for a result of dtype: a 2-byte array and
    its bits (row_out, row_done), or an array in stat, rounded to dtype after (finished)."""
    if np.dtype(dtype) in IN_PLACE:
        out = np.empty(shape, dtype)
        return out, bits(out.reshape(-1, shape[-1]))
    out = np.empty(shape, stat)
    return out, out.reshape(-1, shape[-1])


def finished(out, dtype):
    """result()'s array as dtype: a 2-byte one as it is (rounded row by row), another rounded."""
    return out if out.dtype == np.dtype(dtype) else rounded(out, dtype)


@kernel
def _bf16_rounded(bits, out):
    """out (n,) uint16: the bf16 bits of the fp32s whose bits are bits (n,) uint32."""
    for i in prange(bits.size):
        out[i] = bf16_bits(np.uint32(bits[i]))


@kernel
def _bf16_binary(a, b, out, op):
    """out (n,) = a (n,) (op) b (n,) or b (1,), all the bits of bf16s: each pair widened, added
    (op 0), subtracted (1), multiplied (2) or divided (3) in fp32, the result rounded once."""
    step = np.intp(b.size != 1)  # b's index: i, or 0 for all i
    for i in prange(out.size):
        x = f32_from_bf16_bits(a[i])
        y = f32_from_bf16_bits(b[i * step])
        if op == 0:
            z = x + y
        elif op == 1:
            z = x - y
        elif op == 2:
            z = x * y
        else:
            z = x / y
        out[i] = bf16_bits(bits_from_f32(z))


@kernel
def _f16_widened(bits, out):
    """out (n,) fp32: the fp16s whose bits are bits (n,) uint16."""
    for i in prange(bits.size):
        out[i] = f32_from_f16_bits(np.int32(bits[i]))


@kernel
def _f16_rounded(x, out):
    """out (n,) uint16: the fp16 bits of the fp32s x (n,)."""
    for i in prange(x.size):
        out[i] = _f16_bits_from_f32(x[i])


def f32(a):
    """2-byte floats as fp32 for computation (fp32, fp64 and Python scalars pass through)."""
    dtype = getattr(a, "dtype", None)
    if dtype not in HALVES:
        return a
    if a.size < SMALL:
        return a.astype(np.float32)
    if a.ndim >= 2 and not a.flags.c_contiguous and a.swapaxes(-1, -2).flags.c_contiguous:
        return f32(a.swapaxes(-1, -2)).swapaxes(-1, -2)  # a transpose: widened where it lies
    a = np.ascontiguousarray(a)
    out = np.empty(a.shape, np.float32)
    flat = a.reshape(-1).view(np.uint16)
    if dtype == dtypes.bfloat16:
        _bf16_widened(flat, out.reshape(-1).view(np.uint32))
    else:
        _f16_widened(flat, out.reshape(-1))
    return out


def rounded(a, dtype, out=None):
    """Round a computed result once to the output dtype (into out when given). A value past the
    format's range becomes inf on every path, without NumPy's warning (an fp16 step's overflow
    is what its loss scaler looks for)."""
    dtype = np.dtype(dtype)
    if out is None and a.dtype == dtype:  # nothing to round: every fp32 kernel's result
        return a
    fast = a.dtype == np.float32 and dtype in HALVES and a.size >= SMALL
    fast = fast and (dtype == dtypes.bfloat16 or _HARDWARE_HALF)
    if out is not None and not (
        fast and out.dtype == dtype and out.flags.c_contiguous and out.shape == a.shape
    ):
        with np.errstate(over="ignore"):
            out[...] = a
        return out
    if not fast:
        with np.errstate(over="ignore"):
            return a if a.dtype == dtype else a.astype(dtype)
    result = np.empty(a.shape, dtype) if out is None else out
    flat, into = np.ascontiguousarray(a).reshape(-1), result.reshape(-1).view(np.uint16)
    if dtype == dtypes.bfloat16:
        _bf16_rounded(flat.view(np.uint32), into)
    else:
        _f16_rounded(flat, into)
    return result


_OPS = {np.add: 0, np.subtract: 1, np.multiply: 2, np.divide: 3}


def bf16_binary(ufunc, a, b, out):
    """out = ufunc(a, b) for bf16 a and b (of a's shape, or one element) into bf16 out, all
    C-contiguous: one compiled pass, the bits of widening both, ufunc in fp32 and rounding."""
    bits = lambda x: x.reshape(-1).view(np.uint16)  # noqa: E731
    _bf16_binary(bits(a), bits(b), bits(out), _OPS[ufunc])
    return out


def converted(a, dtype):
    """a in dtype: widened or rounded as above between fp32 and a 2-byte format, NumPy's
    conversion otherwise."""
    dtype = np.dtype(dtype)
    if a.dtype in HALVES and dtype == np.float32:
        return f32(a)
    if a.dtype == np.float32 and dtype in HALVES:
        return rounded(a, dtype)
    return a.astype(dtype)
