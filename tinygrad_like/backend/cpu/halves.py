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
"""

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core.registry import cpu_target
from numba.extending import intrinsic

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
