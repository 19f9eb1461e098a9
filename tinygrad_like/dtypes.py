"""The three number formats the project trains in, and the rules for mixing them.

fp32 is the reference. fp16 (5 exponent bits, max 65,504) needs loss scaling; bf16 has fp32's
8 exponent bits and only 8 bits of mantissa, so it needs no scaling but does need an fp32
master copy of the weights (ml_dtypes provides the bfloat16 type NumPy and CuPy both accept).
"""

import ml_dtypes
import numpy as np

float32 = np.dtype(np.float32)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float64 = np.dtype(np.float64)  # only for gradient checks
int64 = np.dtype(np.int64)

BY_NAME = {"fp32": float32, "fp16": float16, "bf16": bfloat16, "fp64": float64}
FLOATS = (float32, float16, bfloat16, float64)
TRAINING = ("fp32", "fp16", "bf16")  # the formats a run trains in (fp64 is for gradient checks)


def as_dtype(dtype) -> np.dtype:
    """'fp16' / 'bf16' / np.float16 / ... -> np.dtype, with a clear error for anything else."""
    if isinstance(dtype, str) and dtype in BY_NAME:
        return BY_NAME[dtype]
    try:
        return np.dtype(dtype)
    except TypeError:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(BY_NAME)}") from None


def name(dtype) -> str:
    """np.float16 -> 'fp16' (the short names used in tables and checkpoints)."""
    dtype = np.dtype(dtype)
    for short, dt in BY_NAME.items():
        if dt == dtype:
            return short
    return str(dtype)


def is_float(dtype) -> bool:
    return np.dtype(dtype) in FLOATS


def compute_dtype(dtype) -> np.dtype:
    """The dtype reductions accumulate in: fp32 for the 2-byte formats, else the dtype itself."""
    dtype = np.dtype(dtype)
    return float32 if dtype in (float16, bfloat16) else dtype
