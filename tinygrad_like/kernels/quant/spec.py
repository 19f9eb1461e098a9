"""Quantized weights for inference (tinygrad_like/formats.py: the formats and their layout;
tinygrad_like/quant.py: the quantizer and the NumPy reference). A quantized weight W (N, K) is
stored with one row per output channel (the row a GEMV streams): codes (N, K) uint8 for the 8-bit
formats, (N, K/2) uint8 for the 4-bit ones, (N, K) uint16 bit patterns for bf16 / fp16; scales
(N, K / group_size) fp32, None for bf16 / fp16. fmt is one of formats.FORMATS' names. The kernels
decode each code in registers as they read it: there is never a dequantized copy of W.

cpu.py: one output channel per program, its codes decoded into an L1 row (or, for a decode step's
few rows of x, each code as it is read) and dotted with x's rows; cuda.py + quant.cu: one warp per
output row. Both decode with the same bit operations (quant.cu's device functions of the same
names), exactly. qmatmul's epilogue adds add (its output's shape and dtype) to the rounded
output, with the bits of elementwise's add launched after it: on CUDA in the kernel's store.
"""

import numpy as np

from ...formats import FORMATS
from ..record import Out, kernel


def _quantized_row_bytes(codes, scales):
    """Bytes of one stored row: its codes and its scales."""
    return codes[0].nbytes + (scales[0].nbytes if scales is not None else 0)


def _qmatmul_out(x, codes, add):
    """y's Out (M, N) in x's dtype; the epilogue's summand add must be y's shape and dtype (it
    acts as elementwise's add on the y this kernel would return)."""
    y = Out((x.shape[0], codes.shape[0]), x.dtype)
    if add is not None and (tuple(add.shape) != y.shape or add.dtype != y.dtype):
        raise ValueError(f"qmatmul: add {tuple(add.shape)} {add.dtype}, need {y.shape} {y.dtype}")
    return y


# add= is an epilogue that folds the add of y (a residual's: h + x W^T) into the GEMM: one
# launch instead of qmatmul, then elementwise's add, which reads y back and writes a third
# (M, N) array; None launches the plain qmatmul.


@kernel(
    shape=lambda x, codes, scales, fmt, group_size, bias=None, add=None: _qmatmul_out(
        x, codes, add
    ),
    flops=lambda r, x, codes, scales, fmt, group_size, bias=None, add=None: (
        (2 * x.shape[-1] + (bias is not None) + (add is not None)) * r.size
    ),
    epilogue=("add",),
)
def qmatmul(x, codes, scales, fmt, group_size, bias=None, add=None):
    """x (M, K) @ W^T (+ bias (N,)) -> (M, N) in x's dtype, W (N, K) decoded from codes and
    scales inside the kernel (w = code value x its group's scale), fp32 accumulation; then
    [+ add (M, N), x's dtype] with the bits of elementwise's add(add, y) on that rounded y. FLOPs:
    2 K per element of y, one more each for the bias and the add."""


@kernel(
    # K from the codes: two elements a byte for the 4-bit formats
    shape=lambda codes, scales, idx, fmt, group_size: Out(
        tuple(idx.shape) + (codes.shape[1] * (2 if FORMATS[fmt].bits == 4 else 1),), np.float32
    ),
    skips=(0, 1),
    reads=lambda outs, codes, scales, idx, fmt, group_size: (
        idx.nbytes + idx.size * _quantized_row_bytes(codes, scales)
    ),
)
def qembedding(codes, scales, idx, fmt, group_size):
    """Rows idx (...) int in [0, N) of a quantized table W (N, K) -> (..., K) fp32, decoded:
    a gather that reads only the rows it decodes."""
