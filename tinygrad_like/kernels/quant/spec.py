"""Quantized weights for inference (tinygrad_like/formats.py: the formats and their layout;
tinygrad_like/quant.py: the quantizer and the NumPy reference). A quantized weight W (N, K) is
stored with one row per output channel (the row a GEMV streams): codes (N, K) uint8 for the 8-bit
formats, (N, K/2) uint8 for the 4-bit ones, (N, K) uint16 bit patterns for bf16 / fp16; scales
(N, K / group_size) fp32, None for bf16 / fp16. fmt is one of formats.FORMATS' names. The kernels
decode each code in registers as they read it: there is never a dequantized copy of W (a
prompt's qmatmul on the CPU decodes 8 MB of W's rows at a time for BLAS, cpu.py).

cpu.py: one output channel per program, its codes decoded into an L1 row (or, for a decode step's
few rows of x, each code as it is read) and dotted with x's rows (from 16 rows, a prompt: a tile
of decoded rows multiplied by BLAS, the same values to fp32's rounding, not the same bits);
cuda.py + quant.cu: one warp per output row. Both decode with the same bit operations
(quant.cu's device functions of the same names), exactly. qmatmul's epilogue adds add (its
output's shape and dtype) to the rounded output, with the bits of elementwise's add launched
after it: on CUDA in the kernel's store.

int8 activations (quantize_rows, then qmatmul_int8x): llama.cpp's Q8_0 activations times its
Q8_0 / Q4_0 weights, for the int8 and int4 formats. x is quantized per block of X_BLOCK
elements along K to int8 codes and one fp32 scale a block; each block's dot with a row of W is
an exact int32 sum of code products, scaled once in fp32. cpu.py's integer dot runs on vector
integer instructions (VNNI's vpdpbusd where the CPU has it), quant.cu's on __dp4a; both give
the same bits (the order of the fp32 sums is part of the definition, below).
"""

import numpy as np

from ...formats import FORMATS
from ..elementwise.spec import then_counts, then_outputs
from ..record import Out, kernel


def _quantized_row_bytes(codes, scales):
    """Bytes of one stored row: its codes and its scales."""
    return codes[0].nbytes + (scales[0].nbytes if scales is not None else 0)


def _epilogued(y, add, then, aux, name):
    """y's Out, or then='s outputs on y (elementwise.spec.then_outputs); the epilogue's summand
    add must be y's shape and dtype (it acts as elementwise's add on the y this kernel would
    return), and takes no then= beside it."""
    if add is not None and (tuple(add.shape) != y.shape or add.dtype != y.dtype):
        raise ValueError(f"{name}: add {tuple(add.shape)} {add.dtype}, need {y.shape} {y.dtype}")
    if add is not None and then is not None:
        raise ValueError(f"{name}: then= takes no add=")
    return then_outputs(y, then, aux)


# add= is an epilogue that folds the add of y (a residual's: h + x W^T) into the GEMM: one
# launch instead of qmatmul, then elementwise's add, which reads y back and writes a third
# (M, N) array; then= folds an elementwise expression kernel of y (the MLP's GELU or SwiGLU) as
# the GEMMs' then= does (kernels/gemm/spec.py); None launches the plain qmatmul.


def _qmatmul_shape(
    x, codes, scales, fmt, group_size, bias=None, add=None, then=None, aux=0, dtype=None
):
    y = Out((x.shape[0], codes.shape[0]), x.dtype if dtype is None else np.dtype(dtype))
    return _epilogued(y, add, then, aux, "qmatmul")


@kernel(
    shape=_qmatmul_shape,
    flops=lambda r, x, codes, scales, fmt, group_size, bias=None, add=None, *_, then=None, **kw: (
        (2 * x.shape[-1] + (bias is not None) + (add is not None)) * r.size
        + then_counts(r, then)[0]
    ),
    exps=lambda r, *args, then=None, **kwargs: then_counts(r, then)[1],
    epilogue=("add", "then"),
)
def qmatmul(
    x, codes, scales, fmt, group_size, bias=None, add=None, then=None, aux=False, dtype=None
):
    """x (M, K) @ W^T (+ bias (N,)) -> (M, N) in dtype (None: x's; a bf16 x, the activations
    rounded at the GEMM's input, gives fp32 with dtype=fp32), W (N, K) decoded from codes and
    scales inside the kernel (w = code value x its group's scale), fp32 accumulation; then
    [+ add (M, N), y's dtype] with the bits of elementwise's add(add, y) on that rounded y, or
    [then[0](*then[1], y)'s outputs (and y: aux)]. FLOPs: 2 K per element of y, one more each
    for the bias and the add, and then='s."""


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


# ---------------------------------------------------------------- int8 activations

X_BLOCK = 32  # activations per scale along K (quant.cu's X_BLOCK)
# A block whose largest magnitude is below this gets scale 1 and zero codes (an all-zero block
# among them). Smaller scales, and their products, would near fp32's subnormals, which CUDA
# (CuPy compiles with -ftz) flushes to zero and the CPU keeps: with it both devices quantize
# every x alike, and x scale * weight scale stays normal for weight scales of 2^-55 and up.
TINY_BLOCK = np.float32(2.0**-64)
INTEGER_FORMATS = ("int8", "int4")  # the weight formats with an integer dot


def check_int8_activations(fmt, group_size):
    """A ValueError unless weights of fmt with group_size (formats.check_group_size's; None:
    the format's default, whole blocks for both) can meet int8 activations: an integer format
    whose groups are whole blocks."""
    if fmt not in INTEGER_FORMATS:
        raise ValueError(
            f"int8 activations need int8 or int4 weights (an integer dot product); {fmt} has "
            "no integer path: use fp32 activations"
        )
    if group_size is not None and group_size % X_BLOCK:
        raise ValueError(
            f"int8 activations are quantized in blocks of {X_BLOCK} along K: the weights' group "
            f"size must be a multiple of {X_BLOCK}, got {group_size}"
        )


def x_blocks(x):
    """x (M, K)'s blocks along K, K / X_BLOCK; a ValueError unless they are whole."""
    if len(x.shape) != 2 or x.shape[1] % X_BLOCK:
        raise ValueError(
            f"quantize_rows: x {tuple(x.shape)} must be (M, K) with K a multiple of {X_BLOCK}"
        )
    return x.shape[1] // X_BLOCK


@kernel(
    shape=lambda x: (
        Out(tuple(x.shape), np.dtype(np.int8)),
        Out((x.shape[0], x_blocks(x)), np.dtype(np.float32)),
    ),
    flops=lambda r, x: 3 * x.size,
)
def quantize_rows(x):
    """x (M, K) float (read as fp32: fp64 rounded to it) -> codes (M, K) int8, scales (M, K /
    X_BLOCK) fp32, per block of X_BLOCK elements along K: a = max |x| over the block (NaN if
    any is NaN); scale = a / 127 rounded to fp32, or 1 where a < TINY_BLOCK (an all-zero block
    among them); code = x / scale rounded to fp32, then to the nearest integer, ties to even
    (within +-127 by construction), 0 where that quotient is NaN. A NaN or infinite x makes
    its block's scale NaN or infinite, so every y it reaches is too. FLOPs: 3 an element (the
    max, the division, the rounding)."""


def int8x_out(xcodes, xscales, codes, scales, fmt, group_size, dtype, bias, add=None):
    """y's Out (M, N) in dtype, the operands checked against each other (and add against y)."""
    check_int8_activations(fmt, group_size)
    M, K = xcodes.shape
    N = codes.shape[0]
    stored = (N, K // 2 if fmt == "int4" else K)
    if (
        tuple(xscales.shape) != (M, K // X_BLOCK)
        or tuple(codes.shape) != stored
        or K % group_size
        or tuple(scales.shape) != (N, K // group_size)
    ):
        raise ValueError(
            f"qmatmul_int8x: x codes {tuple(xcodes.shape)}, scales {tuple(xscales.shape)} "
            f"against {fmt} codes {tuple(codes.shape)}, scales {tuple(scales.shape)} of group "
            f"size {group_size}: need {stored} codes and ({M}, {K // X_BLOCK}), "
            f"({N}, K / group) scales"
        )
    if bias is not None and tuple(bias.shape) != (N,):
        raise ValueError(f"qmatmul_int8x: bias {tuple(bias.shape)} must be ({N},)")
    return _epilogued(Out((M, N), np.dtype(dtype)), add, None, False, "qmatmul_int8x")


def _int8x_shape(
    xcodes, xscales, codes, scales, fmt, group_size, dtype, bias=None, add=None, then=None, aux=0
):
    """qmatmul_int8x's outputs: y's Out (int8x_out), or then='s on it (_epilogued)."""
    y = int8x_out(xcodes, xscales, codes, scales, fmt, group_size, dtype, bias)
    return _epilogued(y, add, then, aux, "qmatmul_int8x")


@kernel(
    shape=_int8x_shape,
    flops=lambda r, xcodes, xscales, *w, bias=None, add=None, then=None, aux=0: (
        (2 * xcodes.shape[1] + 3 * xscales.shape[1] + (bias is not None) + (add is not None))
        * r.size
        + then_counts(r, then)[0]
    ),
    exps=lambda r, *args, then=None, **kwargs: then_counts(r, then)[1],
    epilogue=("add", "then"),
)
def qmatmul_int8x(
    xcodes,
    xscales,
    codes,
    scales,
    fmt,
    group_size,
    dtype,
    bias=None,
    add=None,
    then=None,
    aux=False,
):
    """quantize_rows' x (codes (M, K) int8, scales (M, K / X_BLOCK)) @ W^T (+ bias (N,)) ->
    (M, N) in dtype, W (N, K) an int8 or int4 weight of group_size a multiple of X_BLOCK:
    y[m, n] = sum over blocks b of t_b = (xscales[m, b] * w_scale[n, b]) * isum_b, isum_b the
    exact int32 sum of x codes times weight code values (int8 -128..127, int4 nibble - 8) over
    the block, converted to fp32 (exactly). The fp32 order, the same on every device: each
    product rounded on its own (no FMA); block b added into lane b % 8 of eight fp32 sums,
    blocks in increasing order; the lanes then added as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) +
    (l3 + l7)); + bias (read as fp32); rounded to dtype once; then [+ add (M, N), dtype] with
    the bits of elementwise's add(add, y). FLOPs: 2 K an element of y (integer multiply-adds),
    3 a block, one more each for the bias and the add."""
