"""An fp8 KV cache on the CPU (kvcache.cu's twin; the layout: spec.py): kv_quantize, one row
of D per prange iteration (kvcache.cu: a warp per row), and qattention, one (batch, head, query)
row per prange iteration (kvcache.cu: a block per row).

qattention walks its row's keys 0 ... its position in blocks of _KEYS (attention/spec.py
FLASH_BK), as kvcache.cu does: the block's scores s = (q . k) x the key's row scale x scale,
each key's codes decoded into an fp32 row of D (quant/cpu.py's minifloat_value times
minifloat_scale: ml_dtypes' value, exactly) and dotted with q by compiled.vector_dot
(reassociated, so that it vectorizes, as the quantized GEMV's dot); then the online softmax
(attention.softmax_block, which the unquantized decode step's rows share): m_new = max(m, the
block's scores), alpha = exp(m - m_new), p = exp(s - m_new), lsum = lsum alpha + sum(p), o = o
alpha + sum over the block's keys, in order, of (p x the value's row scale) x v, v decoded as it
is read. At the end out = o / lsum, in fp32, rounded once to q's dtype. The CUDA twin computes
the same products in the same order but for q . k's sum (there a warp's lanes and warp_sum, here
vector_dot's partial sums), its expf (here vector_math.exp) and, on a GPU, its fused multiply-adds:
the two agree to fp32 rounding, not bit for bit.
kv_quantize is the CUDA twin's bit for bit: the max of a row (exact), one fp32 divide and
minifloat_code's integer rounding.
"""

import numpy as np
from numba import prange

from ...backend.cpu.compiled import device, f32_from_bits, kernel, vector_dot
from ...backend.cpu.halves import f32, rounded
from ...formats import FORMATS
from ..attention.cpu import DECODE_SERIAL_BELOW, flash_attention_fwd, softmax_block
from ..attention.spec import FLASH_BK
from ..quant.cpu import minifloat_scale, minifloat_value
from .spec import check_kv_attention, check_kv_format, check_positions, check_write

_KEYS = FLASH_BK  # keys per block of qattention's online softmax (kvcache.cu KV_KEYS)

i32 = np.int32  # the encoder computes in int32 throughout, as quant/cpu.py's decoders


@device
def minifloat_code(bits, exp_bits, man_bits, qmax_bits, nan_code):
    """The byte of the small float (1 sign, exp_bits exponent and man_bits mantissa bits, bias
    2^(exp_bits - 1) - 1) nearest to the fp32 whose int32 bits are given, ties to even, its
    magnitude first clipped to qmax_bits (the fp32 bits of the format's largest value; a
    magnitude's bits order as its value does); a NaN is nan_code (the format's NaN without its
    sign) with the NaN's sign: ml_dtypes' cast of the clipped value, and kvcache.cu's
    minifloat_code, bit for bit. A normal of the format rounds away fp32's low 23 - man_bits
    mantissa bits (a carry moves into the exponent, as it should) and is rebiased; a subnormal
    (or zero) is the significand, its implicit 1 included, shifted to units of the smallest
    subnormal 2^(1 - bias - man_bits) with the same rounding. No branch: both are computed and
    one selected."""
    width = i32(exp_bits + man_bits)
    sign = (bits >> i32(31)) & i32(1)
    magnitude = bits & i32(0x7FFFFFFF)
    nan = magnitude > i32(0x7F800000)
    magnitude = min(magnitude, qmax_bits)
    bias = (i32(1) << i32(exp_bits - 1)) - i32(1)
    e = magnitude >> i32(23)
    low = i32(23 - man_bits)
    normal = (
        (magnitude + (i32(1) << (low - i32(1))) - i32(1) + ((magnitude >> low) & i32(1))) >> low
    ) - ((i32(127) - bias) << i32(man_bits))
    significand = (magnitude & i32(0x7FFFFF)) | (i32(e > i32(0)) << i32(23))
    # 24 - man_bits .. 25 for a subnormal (25 and past: it rounds to 0); clamped for a normal,
    # whose shift is unused
    shift = max(min(i32(151) - bias - i32(man_bits) - max(e, i32(1)), i32(25)), i32(1))
    subnormal = (
        significand + (i32(1) << (shift - i32(1))) - i32(1) + ((significand >> shift) & i32(1))
    ) >> shift
    code = normal if e >= i32(128) - bias else subnormal
    return (sign << width) | (i32(nan_code) if nan else code)


@kernel
def _kv_quantize(bits, codes, scales, qmax, qmax_bits, nan_code, exp_bits, man_bits):
    # bits (N, D) int32: the fp32 rows' bits; codes (N, D) uint8, scales (N,) fp32 written. A
    # row's max |x| is the max of its magnitudes' bits (exact, and a NaN is the largest), then
    # scale = max / qmax (1 unless max > 0, as quant.quantize), codes of x / scale.
    N, D = bits.shape
    for n in prange(N):
        row = bits[n]
        top = i32(0)
        for d in range(D):
            top = max(top, row[d] & i32(0x7FFFFFFF))
        amax = f32_from_bits(top)
        scale = amax / qmax if amax > np.float32(0) else np.float32(1)
        scaled = np.empty(D, np.float32)
        for d in range(D):
            scaled[d] = f32_from_bits(row[d]) / scale
        scaled_bits = scaled.view(np.int32)
        for d in range(D):
            codes[n, d] = minifloat_code(scaled_bits[d], exp_bits, man_bits, qmax_bits, nan_code)
        scales[n] = scale


def _cached_elements(k_codes, k_scales, v_codes, v_scales, q, length, *rest):
    """The keys qattention reads, B Hkv length D: its work for compiled.kernel's one-core rule
    (the cache's capacity, L, is not: a B = 1 cache went to both cores at 43 positions)."""
    B, Hkv, _, D = k_codes.shape
    return B * Hkv * length * D


def _qattention_kernel(exp_bits, man_bits, specials):
    """The qattention of one format, compiled with its fields as constants (as quant/cpu.py's
    _qmatmul_kernel), so that LLVM folds the decode into a few vector instructions."""

    @kernel(serial_below=DECODE_SERIAL_BELOW, work=_cached_elements)
    def _qattention(k_codes, k_scales, v_codes, v_scales, q, length, scale, out):
        # k_codes, v_codes (B, Hkv, L, D) uint8, k_scales, v_scales (B, Hkv, L) fp32, q and out
        # (B, H, Tq, D) fp32: a row (b, h, i) per iteration, its keys 0 ... length - Tq + i in
        # blocks of _KEYS (the module's docstring). One core below DECODE_SERIAL_BELOW cached
        # elements in use (_cached_elements; attention's decode rows keep the same rule), the
        # work of a row growing with them.
        B, Hkv, _, D = k_codes.shape
        H, Tq = q.shape[1], q.shape[2]
        G = H // Hkv
        rebias = minifloat_scale(exp_bits)
        for r in prange(B * H * Tq):
            b, h, i = r // (H * Tq), r // Tq % H, r % Tq
            kc, vc = k_codes[b, h // G], v_codes[b, h // G]  # (L, D)
            ks, vs = k_scales[b, h // G], v_scales[b, h // G]  # (L,)
            qr = q[b, h, i]
            seen = length - Tq + i + 1  # the keys this query sees
            s, o = np.empty(_KEYS, np.float32), np.zeros(D, np.float32)
            key = np.empty(D, np.float32)
            m, lsum = np.float32(-np.inf), np.float32(0)
            for j0 in range(0, seen, _KEYS):
                n = min(_KEYS, seen - j0)
                for c in range(n):
                    for d in range(D):  # the key decoded into a row, then dotted with q
                        value = minifloat_value(kc[j0 + c, d], exp_bits, man_bits, specials)
                        key[d] = value * rebias
                    s[c] = vector_dot(qr, key) * ks[j0 + c] * scale
                m, lsum = softmax_block(s[:n], m, lsum, o)
                for c in range(n):
                    w = s[c] * vs[j0 + c]
                    for d in range(D):
                        value = minifloat_value(vc[j0 + c, d], exp_bits, man_bits, specials)
                        o[d] += w * (value * rebias)
            for d in range(D):
                out[b, h, i, d] = o[d] / lsum

    return _qattention


_QATTENTION = {}  # fields -> its kernel, made when first used


def kv_quantize(x, fmt):
    check_kv_format(fmt)
    f = FORMATS[fmt]
    exp_bits, man_bits, _ = f.fields
    rows = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    codes = np.empty(rows.shape, np.uint8)
    scales = np.empty(rows.shape[0], np.float32)
    qmax = np.float32(f.qmax)
    _kv_quantize(
        rows.view(np.int32),
        codes,
        scales,
        qmax,
        qmax.view(np.int32),
        f.nan_code,
        exp_bits,
        man_bits,
    )
    return codes.reshape(x.shape), scales.reshape(x.shape[:-1])


def kv_write(cache, new, positions):
    check_write(cache, new, positions)
    cache[:, :, positions] = new
    return cache


def kv_attention(q, k, v, positions, scale):
    """flash_attention_fwd's kernels (a decode step's compiled rows, a prompt's blocks) on the
    cache cut to its length, read from positions on the host."""
    length = check_positions("kv_attention", q, k, positions)
    return flash_attention_fwd(q, k[:, :, :length], v[:, :, :length], scale)[0]


def qattention(q, k_codes, k_scales, v_codes, v_scales, fmt, positions, scale):
    """Computed in fp32 (a 2-byte or fp64 q read as fp32): see the module's docstring."""
    length = check_kv_attention(q, k_codes, k_scales, v_codes, v_scales, fmt, positions)
    fields = FORMATS[fmt].fields
    if fields not in _QATTENTION:
        _QATTENTION[fields] = _qattention_kernel(*fields)
    qs = np.ascontiguousarray(f32(q), dtype=np.float32)
    out = np.empty(q.shape, np.float32)
    _QATTENTION[fields](k_codes, k_scales, v_codes, v_scales, qs, length, np.float32(scale), out)
    return rounded(out, q.dtype)
