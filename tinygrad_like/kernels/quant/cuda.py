"""Quantized weights on CUDA (quant.cu): qmatmul, one warp per output row decoding W's codes in
registers as it streams them, its epilogue's add (M, N) read in the store; qembedding, one
block per gathered row. The stored layout is formats.py's: W (N, K) as codes (N, K / elements
per code) and scales (N, K / group_size) fp32, None for bf16 / fp16. int8 activations:
quantize_rows, a warp per block of x; qmatmul_int8x, a warp per output row of __dp4a sums.
"""

import cupy
import numpy as np

from ... import dtypes
from ...backend.cuda.runtime import BLOCK, CTYPES, NULL, blocks_for, capturing, compiled
from ..elementwise import cuda as elementwise
from ..elementwise.spec import then_epilogue
from ..embedding.spec import check_ids
from .spec import int8x_out, x_blocks

# fmt -> (quant.cu's QuantFormat, the codes' dtype, elements per code, scaled), in the order of
# QuantFormat (formats.FORMATS' formats)
FORMATS = {
    "int8": (0, np.uint8, 1, True),
    "int4": (1, np.uint8, 2, True),
    "fp8_e4m3": (2, np.uint8, 1, True),
    "fp8_e5m2": (3, np.uint8, 1, True),
    "fp4_e2m1": (4, np.uint8, 2, True),
    "bf16": (5, np.uint16, 1, False),
    "fp16": (6, np.uint16, 1, False),
}
ROWS_PER_BLOCK = BLOCK // 32  # qmatmul: one warp per output row


def _weight(codes, scales, fmt, group_size):
    """The quantized W (N, K) checked against fmt's layout -> (codes, scales or NULL, K, group
    size passed to the kernel), both arrays contiguous. A mismatch raises ValueError (shapes,
    fmt, group_size) or TypeError (dtypes)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown quantized format {fmt!r}: use one of {', '.join(FORMATS)}")
    _, code_dtype, per_code, scaled = FORMATS[fmt]
    if codes.dtype != code_dtype or codes.ndim != 2:
        raise TypeError(
            f"{fmt} codes must be a 2-D {np.dtype(code_dtype)} array, got {codes.ndim}-D "
            f"{codes.dtype}"
        )
    N, K = codes.shape[0], codes.shape[1] * per_code
    if not scaled:
        if scales is not None:
            raise ValueError(f"{fmt} weights have no scales: pass scales=None")
        return cupy.ascontiguousarray(codes), NULL, K, np.int32(1)  # group_size: unread
    if (
        not isinstance(group_size, (int, np.integer))
        or group_size < 1
        or K % group_size
        or group_size % per_code
    ):
        even = " even" if per_code == 2 else ""
        raise ValueError(f"group_size {group_size!r} must be a positive{even} divisor of K = {K}")
    if scales is None or scales.shape != (N, K // group_size):
        got = None if scales is None else scales.shape
        raise ValueError(f"{fmt} scales must have shape {(N, K // group_size)}, got {got}")
    scales = cupy.ascontiguousarray(scales, dtype=dtypes.float32)
    return cupy.ascontiguousarray(codes), scales, K, np.int32(group_size)


def qmatmul(
    x, codes, scales, fmt, group_size, bias=None, add=None, then=None, aux=False, dtype=None
):
    """x and bias read as fp32, one warp per row of W, fp32 accumulation, rounded once; add
    (M, N, y's dtype) added in the kernel's store with the bits of elementwise's add(add, y);
    then= after it (elementwise's then_epilogue: a second kernel). A dtype other than x's: x
    widened to fp32 first (exactly), y rounded to dtype after."""
    if x.dtype not in CTYPES:
        raise TypeError(f"qmatmul takes a floating-point x, got {x.dtype}")
    if dtype is not None and np.dtype(dtype) != x.dtype:
        wide = x.astype(dtypes.float32)
        y = qmatmul(wide, codes, scales, fmt, group_size, bias).astype(dtype, copy=False)
        y = y if add is None else elementwise.add(add, y, out=y)
        return then_epilogue(elementwise, y, then, aux)
    codes, scales, K, group = _weight(codes, scales, fmt, group_size)
    if x.ndim != 2 or x.shape[1] != K:
        raise ValueError(f"x {x.shape} must be (M, {K}) for W ({codes.shape[0]}, {K})")
    M, N = x.shape[0], codes.shape[0]
    if bias is not None:
        if bias.shape != (N,):
            raise ValueError(f"bias {bias.shape} must be ({N},)")
        bias = cupy.ascontiguousarray(bias, dtype=x.dtype)
    if add is not None:
        if add.shape != (M, N) or add.dtype != x.dtype:
            raise ValueError(f"add {add.shape} {add.dtype} must be ({M}, {N}) {x.dtype}")
        add = cupy.ascontiguousarray(add)
    x = cupy.ascontiguousarray(x)
    y = cupy.empty((M, N), dtype=x.dtype)
    if y.size:
        compiled("quant.cu", "qmatmul", x.dtype, codes.dtype, FORMATS[fmt][0])(
            (blocks_for(N, ROWS_PER_BLOCK),),
            (BLOCK,),
            (
                x,
                codes,
                scales,
                NULL if bias is None else bias,
                NULL if add is None else add,
                y,
                np.int32(M),
                np.int32(N),
                np.int32(K),
                group,
            ),
        )
    return then_epilogue(elementwise, y, then, aux)


def qembedding(codes, scales, idx, fmt, group_size):
    """Ids out of range raise check_ids's ValueError before the launch (no bounds check there),
    but inside a graph's capture (runtime.capturing), as embedding_fwd's."""
    codes, scales, K, group = _weight(codes, scales, fmt, group_size)
    idx = cupy.ascontiguousarray(idx, dtype=cupy.int64)
    if not capturing():
        check_ids(idx, codes.shape[0])
    out = cupy.empty(idx.shape + (K,), dtype=dtypes.float32)
    if out.size:
        compiled("quant.cu", "qembedding", codes.dtype, FORMATS[fmt][0])(
            (idx.size,), (BLOCK,), (codes, scales, idx, out, np.int32(K), group)
        )
    return out


def quantize_rows(x):
    """One warp per block of 32 elements of x (M, K); int8 codes written as their bytes."""
    if x.dtype not in CTYPES:
        raise TypeError(f"quantize_rows takes a floating-point x, got {x.dtype}")
    blocks = x_blocks(x)
    x = cupy.ascontiguousarray(x)
    codes = cupy.empty(x.shape, dtype=np.int8)
    scales = cupy.empty((x.shape[0], blocks), dtype=dtypes.float32)
    if codes.size:
        count = x.shape[0] * blocks
        compiled("quant.cu", "quantize_rows", x.dtype)(
            (blocks_for(count, ROWS_PER_BLOCK),),
            (BLOCK,),
            (x, codes.view(np.uint8), scales, np.int64(count)),
        )
    return codes, scales


def _words(a):
    """a contiguous with its first byte on an 8-byte boundary (the kernel reads words of it):
    a copy when a view starts elsewhere."""
    a = cupy.ascontiguousarray(a)
    return a if a.data.ptr % 8 == 0 else a.copy()


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
    """One warp per row of W, bias read as fp32; add (M, N, dtype) added in the kernel's store
    with the bits of elementwise's add(add, y); then= after it (as qmatmul)."""
    int8x_out(xcodes, xscales, codes, scales, fmt, group_size, dtype, bias, add)
    dtype = np.dtype(dtype)
    if dtype not in CTYPES:
        raise TypeError(f"qmatmul_int8x returns a floating-point y, not {dtype}")
    (M, K), N = xcodes.shape, codes.shape[0]
    y = cupy.empty((M, N), dtype=dtype)
    if y.size:
        compiled("quant.cu", "qmatmul_int8x", dtype, FORMATS[fmt][0])(
            (blocks_for(N, ROWS_PER_BLOCK),),
            (BLOCK,),
            (
                _words(xcodes).view(np.uint8),
                cupy.ascontiguousarray(xscales, dtype=dtypes.float32),
                _words(codes),
                cupy.ascontiguousarray(scales, dtype=dtypes.float32),
                NULL if bias is None else cupy.ascontiguousarray(bias, dtype=dtypes.float32),
                NULL if add is None else cupy.ascontiguousarray(add),
                y,
                np.int32(M),
                np.int32(N),
                np.int32(K),
                np.int32(group_size),
            ),
        )
    return then_epilogue(elementwise, y, then, aux)
