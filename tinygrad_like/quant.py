"""Quantized weights for inference: the quantizer, the stored weight (QuantizedWeight) and the
NumPy reference dequantizer the kernels are tested against, in the layout of formats.py.
The kernels (qmatmul, qembedding: kernels/quant) decode codes as they read them: there is never
a dequantized copy of W in memory. dequantize() below is for tests only.
"""

import numpy as np

from . import backend, dtypes
from .formats import check_group_size, get_format, stored_layout
from .kernels.quant.spec import check_int8_activations
from .memory import TRACKER
from .padded_rows import PaddedRows


class QuantizedWeight(PaddedRows):
    """A weight stored quantized: fmt (a FORMATS name), codes and scales (formats.py's layout, on
    one device), group_size (None for bf16 / fp16), shape (the shape of the weight it stands
    for), out_axis (0: that weight is (out, in), as PyTorch's, Llama's and the tied token
    embedding; 1: it is (in, out), GPT-2's Conv1D, so W is its transpose) and rows (the rows of
    the weight that are parameters when the rest are padding, Parameter.rows; None: all).
    It computes into fp32 activations (dtype), holds no gradient, and its codes and scales are
    the memory tracker's "weights". activations (ACTIVATIONS): how its GEMM meets x, a run-time
    choice (never stored with the codes): "fp32", x as it is against the decoded weights
    (qmatmul); "int8", int8 and int4 weights only, x quantized per block of 32 and dotted in
    integers (quantize_rows, then qmatmul_int8x: kernels/quant/spec.py); "bf16", bf16 weights
    only, x rounded to bf16 (llama.cpp's bf16 activations: a prompt's GEMMs are bf16 dot
    products on a CPU with AVX-512 BF16); check_activations says which weights can."""

    requires_grad = False
    grad = None
    dtype = dtypes.float32  # the activations its kernels give (a KV cache's default)

    def __init__(self, fmt, codes, scales, group_size, shape, out_axis=0, rows=None):
        self.fmt, self.codes, self.scales, self.group_size = fmt, codes, scales, group_size
        self.shape, self.out_axis, self.rows = tuple(shape), out_axis, rows
        self.activations = "fp32"
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


ACTIVATIONS = ("fp32", "int8", "bf16")  # how a quantized GEMM meets x (QuantizedWeight's)


def _check_weights_meet(activations, fmt, group_size):
    """A ValueError where weights of format fmt (group size group_size, None: not known yet)
    have no path for activations: int8 needs int8 or int4 weights in whole blocks of 32
    (check_int8_activations), bf16 needs bf16 weights."""
    if activations == "int8":
        check_int8_activations(fmt, group_size)
    if activations == "bf16" and fmt != "bf16":
        raise ValueError(f"bf16 activations need bf16 weights, not {fmt}: use fp32 activations")


def check_activations(qw, activations):
    """A ValueError unless the QuantizedWeight qw can compute with activations (ACTIVATIONS):
    int8 needs an int8 or int4 weight whose group size is a multiple of 32; bf16 a bf16 one."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations {activations!r}: use one of {', '.join(ACTIVATIONS)}")
    _check_weights_meet(activations, qw.fmt, qw.group_size)


def split_format(name):
    """A benchmark's weight format name, FMT or FMT+int8 (FMT's weights meeting int8
    activations; bf16+bf16 likewise) -> (FMT, its activations); a ValueError for an unknown
    FMT or activations its weights cannot meet."""
    weights, plus, activations = name.partition("+")
    activations = activations if plus else "fp32"
    if weights != "fp32":
        get_format(weights)
    if activations not in ACTIVATIONS:
        raise ValueError(f"{name}: activations {activations!r}: use one of {ACTIVATIONS}")
    _check_weights_meet(activations, weights, None)
    return weights, activations


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
