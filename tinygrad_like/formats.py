"""The quantized weight formats: what each stores (bits, how a code decodes, its largest value,
its default group), and the layout every backend's kernels and the checkpoint files share.

A weight W (N, K), N output channels of K inputs, is stored one row per output channel (the row
a decode GEMV streams):
- codes: (N, K) uint8 for the 8-bit formats, (N, K/2) uint8 for the 4-bit ones (element 2j in
  the low nibble, 2j + 1 in the high one), (N, K) uint16 bit patterns for bf16 / fp16;
- scales: (N, K / group_size) fp32, one per group of group_size elements of a row (group_size
  = K: one per output channel), None for bf16 / fp16.
An element is code value x its group's scale. The scale maps the group's largest magnitude to
the format's largest value (qmax), so the whole group uses the format's range; an all-zero
group gets scale 1. quant.py quantizes and holds such weights; kernels/quant decodes them.
"""

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from . import dtypes

# What a small float's largest exponent field means: nothing special (fp4 E2M1), NaN only
# where every other bit is set too (fp8 E4M3 "fn": no infinities), or IEEE infinities and NaNs
# (fp16, bf16, fp8 E5M2).
FINITE, NAN_ONLY, IEEE = range(3)


@dataclass(frozen=True)
class Format:
    """bits: per element; decode: "int" (a signed integer: int8 two's complement, int4 the
    nibble q + 8), "float" (a small float whose bits `element` defines, rounded by ml_dtypes) or
    "bits" (bf16 / fp16 bit patterns, unscaled); element: the dtype of the code values (None
    for int4, which NumPy has not); qmax: the largest code value, the scale's divisor (None:
    unscaled); fields: what the kernels decode by, (exp_bits, man_bits, specials) of a float
    (1 sign bit besides; specials FINITE, NAN_ONLY or IEEE), exp_bits 0 for an integer;
    group_size: the default, None for one scale per output channel (K)."""

    bits: int
    decode: str
    element: object
    qmax: float
    fields: tuple
    group_size: int = None

    @property
    def scaled(self):
        return self.qmax is not None

    @property
    def nan_code(self):
        """An 8-bit float's NaN code without its sign bit, as ml_dtypes casts a NaN (what the
        KV cache's encoders give a NaN, with its sign); None for the other formats."""
        if self.decode != "float" or self.bits != 8:
            return None
        return int(np.float32(np.nan).astype(self.element).view(np.uint8)) & 0x7F


# name -> Format. "fp32" is no format: callers keep the weight as it is.
FORMATS = {
    "bf16": Format(16, "bits", dtypes.bfloat16, None, (8, 7, IEEE)),
    "fp16": Format(16, "bits", dtypes.float16, None, (5, 10, IEEE)),
    "fp8_e4m3": Format(8, "float", np.dtype(ml_dtypes.float8_e4m3fn), 448.0, (4, 3, NAN_ONLY)),
    "fp8_e5m2": Format(8, "float", np.dtype(ml_dtypes.float8_e5m2), 57344.0, (5, 2, IEEE)),
    "int8": Format(8, "int", np.dtype(np.int8), 127.0, (0, 0, FINITE)),
    "int4": Format(4, "int", None, 7.0, (0, 0, FINITE), group_size=32),
    "fp4_e2m1": Format(
        4, "float", np.dtype(ml_dtypes.float4_e2m1fn), 6.0, (2, 1, FINITE), group_size=32
    ),
}


def get_format(fmt):
    """The Format of a name, or a ValueError naming them (fp32: not quantized)."""
    if fmt not in FORMATS:
        raise ValueError(
            f"unknown weight format {fmt!r}: use fp32 (not quantized) or one of "
            f"{', '.join(FORMATS)}"
        )
    return FORMATS[fmt]


def check_group_size(fmt, K, group_size=None):
    """The group size fmt uses for rows of K elements (group_size, or the format's default,
    or K for one scale per output channel); a ValueError unless it divides K (and is even for
    a 4-bit format, whose group is whole bytes). None for an unscaled format."""
    f = get_format(fmt)
    if not f.scaled:
        if group_size is not None:
            raise ValueError(f"{fmt} has no scales: it takes no group size")
        return None
    g = group_size if group_size is not None else f.group_size or K
    if g <= 0 or K % g or (f.bits == 4 and g % 2):
        even = " and even" if f.bits == 4 else ""
        raise ValueError(
            f"group size {g} for {fmt}: it must be positive{even} and divide the rows' {K} elements"
        )
    return g


_CODE_DTYPES = {4: np.uint8, 8: np.uint8, 16: np.uint16}  # bits -> the codes' dtype


def stored_layout(fmt, N, K, group_size):
    """What fmt stores for a weight of N rows of K (group_size: check_group_size's) ->
    ((the codes' shape, their dtype), the fp32 scales' shape or None): the layout above."""
    bits = get_format(fmt).bits
    codes = ((N, K // 2 if bits == 4 else K), np.dtype(_CODE_DTYPES[bits]))
    return codes, (N, K // group_size) if group_size else None


def bytes_per_parameter(fmt, group_size=None, row=None):
    """Stored bytes per weight element of a format, its share of the fp32 scales included (one
    per group: group_size, the format's default, or one per output channel of `row` elements);
    an unquantized dtype's itemsize (fmt "fp32", "bf16" as a dtype, ...) for any other name."""
    if fmt not in FORMATS or not FORMATS[fmt].scaled:
        return FORMATS[fmt].bits / 8 if fmt in FORMATS else dtypes.as_dtype(fmt).itemsize
    f = FORMATS[fmt]
    g = group_size or f.group_size or row
    return f.bits / 8 + (4 / g if g else 0)
