"""Quantized weight formats for inference: the table of formats, the quantizer, the stored
weight (QuantizedWeight) and the NumPy reference dequantizer the kernels are tested against.

A weight W (N, K), N output channels of K inputs, is stored one row per output channel (the row
a decode GEMV streams), in the layout backend/contract.py's "quant" section fixes:
- codes: (N, K) uint8 for the 8-bit formats, (N, K/2) uint8 for the 4-bit ones (element 2j in
  the low nibble, 2j + 1 in the high one), (N, K) uint16 bit patterns for bf16 / fp16;
- scales: (N, K / group_size) fp32, one per group of group_size elements of a row (group_size
  = K: one per output channel), None for bf16 / fp16.
An element is code value x its group's scale. The scale maps the group's largest magnitude to
the format's largest value (qmax), so the whole group uses the format's range; an all-zero
group gets scale 1. The kernels (qmatmul, qembedding) decode codes as they read them: there is
never a dequantized copy of W in memory. dequantize() below is for tests only.
"""

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from . import backend, dtypes
from .memory import TRACKER
from .padded_rows import PaddedRows

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


class QuantizedWeight(PaddedRows):
    """A weight stored quantized: fmt (a FORMATS name), codes and scales (the layout above, on
    one device), group_size (None for bf16 / fp16), shape (the shape of the weight it stands
    for), out_axis (0: that weight is (out, in), as PyTorch's, Llama's and the tied token
    embedding; 1: it is (in, out), GPT-2's Conv1D, so W is its transpose) and rows (the rows of
    the weight that are parameters when the rest are padding, Parameter.rows; None: all).
    It computes into fp32 activations (dtype), holds no gradient, and its codes and scales are
    the memory tracker's "weights"."""

    requires_grad = False
    grad = None
    dtype = dtypes.float32  # the activations its kernels give (a KV cache's default)

    def __init__(self, fmt, codes, scales, group_size, shape, out_axis=0, rows=None):
        self.fmt, self.codes, self.scales, self.group_size = fmt, codes, scales, group_size
        self.shape, self.out_axis, self.rows = tuple(shape), out_axis, rows
        self._register()

    def _register(self):
        for a in (self.codes, self.scales):
            if a is not None:
                TRACKER.register(a, "weights")

    def __repr__(self):
        group = f", group_size={self.group_size}" if self.group_size else ""
        return (
            f"QuantizedWeight({self.fmt}, shape={self.shape}, out_axis={self.out_axis}{group}, "
            f"device={self.device})"
        )

    @property
    def device(self):
        return backend.of(self.codes).name

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def nbytes(self):
        """Bytes stored: codes and scales."""
        return int(self.codes.nbytes) + (int(self.scales.nbytes) if self.scales is not None else 0)

    def numel(self):
        return int(np.prod(self.shape))

    def to(self, device):
        """Move the codes and scales to device, in place (as Module.to moves a model: a weight
        two modules share moves once) -> self."""
        if device != self.device:
            be, here = backend.get(device), backend.of(self.codes)
            self.codes = be.asarray(here.to_numpy(self.codes))
            self.scales = None if self.scales is None else be.asarray(here.to_numpy(self.scales))
            self._register()
        return self


_CODE_DTYPES = {4: np.uint8, 8: np.uint8, 16: np.uint16}  # bits -> the codes' dtype


def stored_layout(fmt, N, K, group_size):
    """What fmt stores for a weight of N rows of K (group_size: check_group_size's) ->
    ((the codes' shape, their dtype), the fp32 scales' shape or None): the layout above."""
    bits = get_format(fmt).bits
    codes = ((N, K // 2 if bits == 4 else K), np.dtype(_CODE_DTYPES[bits]))
    return codes, (N, K // group_size) if group_size else None


def _groups(W, g, qmax):
    """W (N, K) as (N, K / g, g) and each group's scale (N, K / g) fp32: its largest magnitude
    over qmax, 1 for an all-zero group."""
    N, K = W.shape
    grouped = W.reshape(N, K // g, g)
    top = np.abs(grouped).max(axis=2)
    scales = np.where(top > 0, top / np.float32(qmax), np.float32(1))
    return grouped, scales.astype(np.float32)


def _nibbles(values):
    """(N, K) uint8 values < 16 -> (N, K / 2) bytes: element 2j low, 2j + 1 high."""
    return (values[:, 0::2] | (values[:, 1::2] << 4)).astype(np.uint8)


def quantize(weight, fmt, group_size=None, out_axis=0, rows=None):
    """A weight (an fp32 array of any device, as the model stores it: (out, in) for out_axis 0,
    (in, out) for 1) -> QuantizedWeight on that device. Quantized on the host in NumPy: each
    group's scale = its max |w| / qmax (fp32); int8 and int4 codes round w / scale to the
    nearest integer (ties to even) within +-qmax; the float formats round it as ml_dtypes
    casts, within +-qmax (never past the format's largest value)."""
    be = backend.of(weight)
    if len(weight.shape) != 2 or out_axis not in (0, 1):
        raise ValueError(f"quantize: a 2-D weight and out_axis 0 or 1, got {weight.shape}")
    f, (N, K) = get_format(fmt), weight.shape[:: 1 if out_axis == 0 else -1]
    g = check_group_size(fmt, K, group_size)
    if not backend.holds_values(weight):  # the meta device: the stored shapes, no values
        (codes_shape, codes_dtype), scales_shape = stored_layout(fmt, N, K, g)
        codes = be.empty(codes_shape, codes_dtype)
        scales = be.empty(scales_shape, np.float32) if f.scaled else None
        return QuantizedWeight(fmt, codes, scales, g, weight.shape, out_axis, rows)
    host = np.asarray(be.to_numpy(weight), dtype=np.float32)
    W = np.ascontiguousarray(host if out_axis == 0 else host.T)  # (N, K)
    scales = None
    if not f.scaled:
        codes = W.astype(f.element).view(np.uint16)
    else:
        grouped, scales = _groups(W, g, f.qmax)
        scaled = np.clip(grouped / scales[:, :, None], -f.qmax, f.qmax).reshape(W.shape)
        if f.decode == "int":
            q = np.rint(scaled).astype(np.int8)
            codes = q.view(np.uint8) if f.bits == 8 else _nibbles((q + 8).view(np.uint8))
        else:
            bits = scaled.astype(f.element).view(np.uint8)
            codes = bits if f.bits == 8 else _nibbles(bits & 0xF)
    return QuantizedWeight(
        fmt,
        be.asarray(np.ascontiguousarray(codes)),
        None if scales is None else be.asarray(scales),
        g,
        host.shape,
        out_axis,
        rows,
    )


def dequantize(qw):
    """The NumPy reference: the fp32 weight (qw.shape, on the host) that qw's codes and scales
    stand for, decoded with ml_dtypes. For tests and host copies (Module.state_dict): the
    kernels never make this array."""
    f = get_format(qw.fmt)
    codes = np.asarray(backend.of(qw.codes).to_numpy(qw.codes))
    if f.bits == 4:  # unpack: element 2j from the low nibble, 2j + 1 from the high
        codes = np.stack([codes & 0xF, codes >> 4], axis=2).reshape(codes.shape[0], -1)
    if f.decode == "bits":
        W = codes.view(f.element).astype(np.float32)
    else:
        if f.decode == "int":
            values = codes.view(np.int8) if f.bits == 8 else codes.astype(np.int8) - 8
        else:
            values = codes.astype(np.uint8).view(f.element)
        scales = np.asarray(backend.of(qw.scales).to_numpy(qw.scales))
        W = values.astype(np.float32) * np.repeat(scales, qw.group_size, axis=1)
    return W if qw.out_axis == 0 else np.ascontiguousarray(W.T)


def bytes_per_parameter(fmt, group_size=None, row=None):
    """Stored bytes per weight element of a format, its share of the fp32 scales included (one
    per group: group_size, the format's default, or one per output channel of `row` elements);
    an unquantized dtype's itemsize (fmt "fp32", "bf16" as a dtype, ...) for any other name."""
    if fmt not in FORMATS or not FORMATS[fmt].scaled:
        return FORMATS[fmt].bits / 8 if fmt in FORMATS else dtypes.as_dtype(fmt).itemsize
    f = FORMATS[fmt]
    g = group_size or f.group_size or row
    return f.bits / 8 + (4 / g if g else 0)
