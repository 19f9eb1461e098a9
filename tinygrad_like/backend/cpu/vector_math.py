"""The math functions the CPU kernels call per element, where the CUDA kernels call CUDA's
expf, logf, tanhf and fmaf: in fp32, exp, log and tanh are polynomials of fused multiply-adds
that LLVM vectorizes (Numba's own math.exp and math.log are a call of libm per element, never
vectorized), each about an ulp from the exact value (tests/kernels/test_vector_math.py), the
same bits for every core count and on every CPU with FMA; for other types, Python's math
module's.
"""

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .compiled import bits_from_f32, f32_from_bits


@intrinsic
def fma(typingctx, a, b, c):
    """a b + c for fp32 a, b, c, rounded once (CUDA's fmaf, C's fmaf): LLVM's llvm.fma, one
    vector instruction on a CPU with FMA (every x86 since 2013, AArch64), the same bits
    everywhere. Where a kernel writes it, never where LLVM chooses (no fast-math contract)."""

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        llvm_fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(f32, [f32] * 3), "llvm.fma.f32"
        )
        return builder.call(llvm_fma, args)

    return types.float32(types.float32, types.float32, types.float32), codegen


def exp(x):
    """e^x (math.exp); in fp32 a polynomial LLVM can vectorize, within about an ulp of the
    exact value (1.01 ulps at most over [-87.3, 88.7], tests/kernels/test_vector_math.py)."""
    return math.exp(x)


_ROUND = np.float32(1.5 * 2**23)  # x + _ROUND - _ROUND: x rounded to an integer (|x| < 2^22)


@overload(exp, jit_options={"cache": True})
def _exp(x):
    if x != types.float32:
        return lambda x: math.exp(x)

    def exp_f32(x):
        # Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2 (ln2 in two parts, the first exact in
        # n ln2), e^r by a degree-6 polynomial in Horner's form, each step a fused multiply-add,
        # 2^n put into the exponent bits. Past the fp32 range it is 0 or inf; nan stays nan.
        xc = min(max(x, np.float32(-87.5)), np.float32(88.72283))
        n = xc * np.float32(1.44269504) + _ROUND - _ROUND  # round to nearest, no call
        r = fma(n, np.float32(-0.693359375), xc)
        r = fma(n, np.float32(2.12194440e-4), r)
        p = fma(np.float32(1.9875691500e-4), r, np.float32(1.3981999507e-3))
        p = fma(p, r, np.float32(8.3334519073e-3))
        p = fma(p, r, np.float32(4.1665795894e-2))
        p = fma(p, r, np.float32(1.6666665459e-1))
        p = fma(p, r, np.float32(5.0000001201e-1))
        p = fma(p, r * r, r) + np.float32(1.0)
        # 2^n as two factors, so n = 128 (x near 88.7) needs no fp32 exponent of 255
        k = np.int32(n)
        y = p * f32_from_bits(((k >> 1) + 127) << 23) * f32_from_bits((k - (k >> 1) + 127) << 23)
        if x < np.float32(-87.3):
            y = np.float32(0.0)
        if x > np.float32(88.72284):
            y = np.float32(np.inf)
        return x if x != x else y

    return exp_f32


def log(x):
    """log(x) (math.log); in fp32 a polynomial LLVM can vectorize, within about an ulp of the
    exact value (tests/kernels/test_vector_math.py): Numba's own is a call of logf per element."""
    return math.log(x)


@overload(log, jit_options={"cache": True})
def _log(x):
    if x != types.float32:
        return lambda x: math.log(x)

    def log_f32(x):
        # Cephes' logf: x = m 2^e, m in [sqrt(1/2), sqrt(2)) (a subnormal x scaled by 2^23
        # first), log x = e ln2 (ln2 in two parts) + log(1 + f), f = m - 1, by f - f^2 / 2 + a
        # degree-8 polynomial times f^3, in Horner's form of fused multiply-adds. log(0) = -inf,
        # log of a negative or nan is nan, log(inf) = inf.
        tiny = x < np.float32(1.17549435e-38)
        b = np.int32(bits_from_f32(x * np.float32(8388608.0) if tiny else x))
        e = np.float32(np.int32(b >> 23)) - np.float32(149.0 if tiny else 126.0)  # in int32
        m = f32_from_bits((b & np.int32(0x007FFFFF)) | np.int32(0x3F000000))  # [0.5, 1)
        if m < np.float32(0.707106781186547524):
            e = e - np.float32(1.0)
            f = m + m - np.float32(1.0)
        else:
            f = m - np.float32(1.0)
        z = f * f
        p = fma(np.float32(7.0376836292e-2), f, np.float32(-1.1514610310e-1))
        p = fma(p, f, np.float32(1.1676998740e-1))
        p = fma(p, f, np.float32(-1.2420140846e-1))
        p = fma(p, f, np.float32(1.4249322787e-1))
        p = fma(p, f, np.float32(-1.6668057665e-1))
        p = fma(p, f, np.float32(2.0000714765e-1))
        p = fma(p, f, np.float32(-2.4999993993e-1))
        p = fma(p, f, np.float32(3.3333331174e-1))
        y = fma(e, np.float32(-2.12194440e-4), p * f * z)
        y = fma(e, np.float32(0.693359375), f + fma(z, np.float32(-0.5), y))
        if x == np.float32(0.0):
            y = np.float32(-np.inf)
        if x < np.float32(0.0):
            y = np.float32(np.nan)
        if x == np.float32(np.inf):
            y = x
        return x if x != x else y

    return log_f32


def tanh(x):
    """tanh(x) (math.tanh); in fp32 1 - 2 / (e^2x + 1) through exp: absolute error an ulp of 1,
    all that GELU's 1 + t and 1 - t^2 can see."""
    return math.tanh(x)


@overload(tanh, jit_options={"cache": True})
def _tanh(x):
    if x != types.float32:
        return lambda x: math.tanh(x)
    one, two = np.float32(1), np.float32(2)
    return lambda x: one - two / (exp(x + x) + one)
