"""Quantized weights' kernels (kernels/quant): qmatmul, x @ W^T with W decoded from its codes
and scales inside the kernel, against float64 x @ dequantize(W)^T; qembedding, the gather of
decoded rows, bit for bit dequantize(W)[idx], every code of every format included (subnormals,
infinities, NaNs: ml_dtypes' values). qmatmul's add epilogue (y + add) has the bits of the
unfused add. int8 activations: quantize_rows and qmatmul_int8x bit for bit against NumPy
references that compute spec.py's definitions (the same integer sums, the same fp32 operations
in the same order), on every device (CUDA's twins then bit for bit the CPU's). The quantizer
itself (tinygrad_like/quant.py) and the quantized models: tests/test_quant.py.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinygrad_like import dtypes, formats, kernels, quant
from tinygrad_like.kernels.quant import cpu as quant_cpu
from tinygrad_like.kernels.quant.spec import TINY_BLOCK

from .check import BF16, F16, F32, F64, FLOATS, cases, cpu, f64, rand

FORMATS = list(formats.FORMATS)
FOUR_BIT = [f for f, spec in formats.FORMATS.items() if spec.bits == 4]


def weight(codes, scales, fmt, group_size):
    """The (N, K) weight that codes and scales store, dequantized (fp32)."""
    K = codes.shape[1] * (2 if formats.FORMATS[fmt].bits == 4 else 1)
    qw = quant.QuantizedWeight(fmt, np.asarray(codes), scales, group_size, (codes.shape[0], K))
    return quant.dequantize(qw)


def qmatmul_ref(x, codes, scales, fmt, group_size, bias=None, add=None):
    y = f64(x) @ f64(weight(codes, scales, fmt, group_size)).T
    y = y if bias is None else y + f64(bias)
    return y if add is None else y + f64(add)


def qembedding_ref(codes, scales, idx, fmt, group_size):
    return weight(codes, scales, fmt, group_size)[idx]


def quantized(fmt, N, K, group_size=None, seed=0):
    """(codes, scales, group size) of a random (N, K) weight quantized by quant.quantize."""
    qw = quant.quantize(rand((N, K), F32, seed=seed), fmt, group_size)
    return qw.codes, qw.scales, qw.group_size


def put_weight(put, codes, scales):
    return put(codes), None if scales is None else put(scales)


def matmul(put, dtype, fmt, N, K, group_size, M, bias, epilogue=None):
    """x (M, K) @ W^T for a random W (N, K) of fmt, with a bias (N,) if asked; epilogue "add":
    plus add (M, N) in x's dtype."""
    codes, scales, g = quantized(fmt, N, K, group_size)
    x = put(rand((M, K), dtype, seed=M))
    kw = {"bias": put(rand(N, dtype, seed=5))} if bias else {}
    if epilogue == "add":
        kw["add"] = put(rand((M, N), dtype, seed=7))
    return (x, *put_weight(put, codes, scales), fmt, g, kw)


def gather(put, fmt, id_dtype):
    """Rows of a random W (50, 64): repeated ids and the last row."""
    codes, scales, g = quantized(fmt, 50, 64, seed=2)
    idx = np.random.default_rng(3).integers(0, 10, (4, 5)).astype(id_dtype)
    idx[0, 0] = 49
    return (*put_weight(put, codes, scales), put(idx), fmt, g)


def every_code(put, fmt):
    """One row holding every code of fmt (all 2^16 bit patterns of bf16 / fp16), scale 1."""
    f = formats.FORMATS[fmt]
    if f.bits == 16:
        codes, scales, g = np.arange(1 << 16, dtype=np.uint16).reshape(1, -1), None, None
    else:
        codes = np.arange(256, dtype=np.uint8).reshape(1, 256)
        g, scales = codes.shape[1] * (8 // f.bits), np.ones((1, 1), F32)
    return (*put_weight(put, codes, scales), put(np.zeros(1, np.int64)), fmt, g)


def groups(fmt):
    """Several groups of a row and one scale per output channel (bf16 / fp16: no scales)."""
    return (32, None) if formats.FORMATS[fmt].scaled else (None,)


# ---------------------------------------------------------------- int8 activations: references


def quantize_rows_ref(x):
    """spec.py's quantize_rows in NumPy: x as fp32; per block of 32 its max |x| (NaN if any is
    NaN), the scale max / 127 (1 below TINY_BLOCK), codes rint(x / scale) (ties to even), 0
    where the quotient is NaN."""
    x = np.asarray(x).astype(F32)
    blocks = x.reshape(x.shape[0], -1, 32)
    top = np.abs(blocks).max(axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        scales = np.where(top < TINY_BLOCK, np.float32(1), top / np.float32(127)).astype(F32)
        q = np.rint(blocks / scales[..., None])
    return np.where(np.isnan(q), 0, q).astype(np.int8).reshape(x.shape), scales


def weight_values(codes, fmt):
    """(N, K) int32 code values of int8 or int4 codes: the byte's two's complement, or each
    nibble (element 2j low, 2j + 1 high) less 8."""
    codes = np.asarray(codes)
    if fmt == "int8":
        return codes.view(np.int8).astype(np.int32)
    return np.stack([codes & 15, codes >> 4], axis=2).reshape(codes.shape[0], -1) - np.int32(8)


def qmatmul_int8x_ref(xcodes, xscales, codes, scales, fmt, group_size, dtype, bias=None, add=None):
    """spec.py's qmatmul_int8x in NumPy: each block's exact int32 sum, t_b = (x scale * w scale)
    * sum in fp32, block b added into lane b % 8 in increasing b, the lanes added as ((l0 + l4)
    + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), + bias, rounded to dtype, + add as elementwise's."""
    x = np.asarray(xcodes).astype(np.int32)
    (M, K), w = x.shape, weight_values(codes, fmt)
    sums = (x.reshape(M, 1, K // 32, 32) * w.reshape(1, w.shape[0], K // 32, 32)).sum(3)
    w_scales = np.repeat(np.asarray(scales), group_size // 32, axis=1)  # (N, K / 32)
    t = (np.asarray(xscales)[:, None, :] * w_scales[None]) * sums.astype(F32)
    lanes = np.zeros(t.shape[:2] + (8,), F32)
    for b in range(t.shape[2]):
        lanes[..., b % 8] += t[..., b]
    a = [lanes[..., i] for i in range(8)]
    y = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
    y = (y if bias is None else y + np.asarray(bias).astype(F32)).astype(dtype)
    if add is None:
        return y
    wide = F64 if dtype == F64 else F32  # elementwise's add: 2-byte floats in fp32
    return (y.astype(wide) + np.asarray(add).astype(wide)).astype(dtype)


def activations(put, dtype, M, K):
    """x (M, K) of dtype: random, with (K >= 320) blocks to mind: all zero, below TINY_BLOCK,
    ties (scale 1: 127 leads, then halves: 2.5 -> 2, -3.5 -> -4, 0.5 -> 0), a NaN, an inf."""
    x = rand((M, K), F32, seed=M)
    if K >= 320:
        x[0, :32] = 0
        x[0, 32:64] *= 1e-22
        x[0, 64:96] = np.resize([127, 2.5, -3.5, 0.5, -0.5, 1.5], 32)
        if dtype != F16:  # fp16's largest finite is 65504: keep its other blocks finite
            x[-1, 256:288] *= 1e30
        x[-1, 96], x[-1, 130] = np.nan, np.inf
    return put(x.astype(dtype))


def int8x(put, dtype, fmt, group_size, K, M, bias, epilogue=None):
    """quantize_rows' codes of a random x (M, K) (one code -128, which it never makes) against a
    random (37, K) weight of fmt (a row of the most negative codes), bias and add in dtype."""
    xcodes, xscales = quantize_rows_ref(rand((M, K), F32, seed=M))
    xcodes[0, 0] = -128
    codes, scales, g = quantized(fmt, 37, K, group_size)
    codes[1] = 0x80 if fmt == "int8" else 0  # -128, or int4's -8
    kw = {"bias": put(rand(37, dtype, seed=5))} if bias else {}
    if epilogue == "add":
        kw["add"] = put(rand((M, 37), dtype, seed=7))
    return put(xcodes), put(xscales), put(codes), put(scales), fmt, g, np.dtype(dtype), kw


QUANTIZE = [(d, M, K) for d in FLOATS for M, K in [(1, 32), (3, 320)]]
# the weights: int8 per output channel (K = 96: three blocks, no whole chunk of 8; 320: a chunk
# and two; 1024: chunks whose 8 blocks share the channel's scale), groups of 32 (each block its
# own scale), 64 (two blocks a scale) and 256 (eight); M = 1, 2 and 5 (past 4 rows a pass)
INT8X_WEIGHTS = [
    ("int8", None, 96),
    ("int8", None, 320),
    ("int8", None, 1024),
    ("int8", 32, 320),
    ("int8", 64, 320),
    ("int4", 32, 320),
    ("int4", 64, 320),
    ("int4", 256, 1024),
]
# M = 1 and 2: a row of x at a time (cpu_int8x's _row_dot); 5 and 17: a prompt's tiles of 4 x 4
# (cpu_int8x_tiles.py: rows of x past a tile's, N = 37 past W's, blocks past a chunk of 8)
INT8X = [(F32, fmt, g, K, M, M != 2) for fmt, g, K in INT8X_WEIGHTS for M in (1, 2, 5)]
INT8X += [(F32, fmt, g, K, 17, True) for fmt, g, K in INT8X_WEIGHTS[1::3]]
INT8X += [
    (d, fmt, g, 320, 2, True, "add") for d in FLOATS for fmt, g in [("int8", None), ("int4", 32)]
]


# N ragged against a block's 8 rows, K several groups; M = 1 (decode), 3 and 17 (past the
# kernel's 8 rows of x a pass); and one row of one output channel
MATMUL = [
    (d, fmt, N, K, g, M, bias)
    for d in (F32, BF16)
    for fmt in FORMATS
    for g in groups(fmt)
    for N, K, Ms in [(37, 96, (1, 3, 17)), (1, 32, (1,))]
    for M in Ms
    for bias in (False, True)
]
# x in fp16 and fp64 (computed in fp32 both: the fp32 tolerance)
OTHER_X = [
    (d, fmt, 11, 64, None, 3, True) for d in (F16, F64) for fmt in ("int4", "fp8_e4m3", "bf16")
]
# y + add over an int8, fp8, int4 and bf16 weight, M = 1 (a decode step: the decode-step GEMV)
# and 17 (a prompt: W decoded a tile at a time for BLAS), with and without the bias
ADD_FORMATS = ("int8", "int4", "fp8_e4m3", "bf16")
ADD = [
    (d, fmt, 37, 96, groups(fmt)[0], M, bias, "add")
    for d in (F32, BF16)
    for fmt in ADD_FORMATS
    for M in (1, 17)
    for bias in (False, True)
]
# the add in fp16 and fp64 too (fp64: y, an fp32 value, plus add in fp64)
OTHER_ADD = [(d, fmt, 11, 64, None, 3, True, "add") for d in (F16, F64) for fmt in ("int4", "bf16")]
CASES = [
    *cases("qmatmul", matmul, MATMUL, ref=qmatmul_ref),
    *cases("qmatmul", matmul, [c for c in OTHER_X if c[0] == F16], ref=qmatmul_ref),
    *cases("qmatmul", matmul, [c for c in OTHER_X if c[0] == F64], ref=qmatmul_ref, tol=F32),
    *cases("qmatmul", matmul, ADD + [c for c in OTHER_ADD if c[0] == F16], ref=qmatmul_ref),
    *cases("qmatmul", matmul, [c for c in OTHER_ADD if c[0] == F64], ref=qmatmul_ref, tol=F32),
    *cases(
        "qembedding",
        gather,
        [(f, i) for f in FORMATS for i in (np.int64, np.int32)],
        ref=qembedding_ref,
        exact=True,
    ),
    *cases(
        "qembedding",
        every_code,
        [(f,) for f in FORMATS],
        ref=qembedding_ref,
        exact=True,
        name="every-code",
    ),
    *cases("quantize_rows", activations, QUANTIZE, ref=quantize_rows_ref, exact=True),
    *cases("qmatmul_int8x", int8x, INT8X, ref=qmatmul_int8x_ref, exact=True),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel(case, check):
    check(case)


# ---------------------------------------------------------------- what a case cannot say


def test_ids_out_of_range_are_refused_as_the_cpu_refuses_them(device):
    codes, scales, g = quantized("int8", 20, 32)
    for bad in (20, -1):
        idx = np.array([0, bad])
        with pytest.raises(ValueError) as on_cpu:
            cpu.qembedding(codes, scales, idx, "int8", g)
        with pytest.raises(ValueError) as on_device:
            device.qembedding(*map(device.asarray, (codes, scales, idx)), "int8", g)
        assert str(on_device.value) == str(on_cpu.value)


def group_for(fmt):
    """Groups of 8 for the 4-bit formats (several per row of the small K here); the format's
    own default otherwise."""
    return 8 if fmt in FOUR_BIT else None


def decodes_every_code_as_ml_dtypes_does(fmt):
    """Row n of W holds code n at one column, zeros (int4: nibble 8) elsewhere, x = that
    column's e_k, the scales 1: y[0, n] is code n's value times 1 plus zeros, exactly (but a
    zero's sign). The column in each of the decode-step GEMV's loops (8- and 16-bit, K = 88:
    its SUMS vectors, a single vector, the last K % 16 one at a time; 4-bit, K = 160 in groups
    of 32: SUMS groups at a time, then one), a high and a low nibble among them."""
    f = formats.FORMATS[fmt]
    every = np.arange(2**f.bits, dtype=np.uint16 if f.bits == 16 else np.uint8)
    want = every.astype(np.float32) - 8 if fmt == "int4" else every.view(f.element).astype(F32)
    K, columns = (160, (5, 70, 155)) if f.bits == 4 else (88, (5, 70, 85))
    g = 32 if f.bits == 4 else K if f.scaled else None
    scales = np.ones((every.size, K // g), np.float32) if f.scaled else None
    for k in columns:
        codes = np.full((every.size, K), 8 if fmt == "int4" else 0, every.dtype)
        codes[:, k] = every
        if f.bits == 4:  # element 2j in byte j's low nibble, 2j + 1 in its high one
            codes = (codes[:, 0::2] | codes[:, 1::2] << 4).astype(np.uint8)
        got = cpu.qmatmul(np.eye(1, K, k, dtype=np.float32), codes, scales, fmt, g)[0]
        assert np.array_equal(np.isnan(got), np.isnan(want))
        finite = ~np.isnan(want)
        assert np.array_equal(got[finite], want[finite] + np.float32(0))


@pytest.mark.parametrize("fmt", FORMATS)
def test_cpu_the_decode_step_gemv_decodes_every_code_as_ml_dtypes_does(fmt):
    decodes_every_code_as_ml_dtypes_does(fmt)


def test_cpu_the_decode_step_gemv_decodes_alike_without_avx512(tmp_path):
    # NUMBA_CPU_NAME=generic: no F16C (compiled.half_to_f32's integer form), no AVX-512
    # (cpu_gemv's 4-bit values by bit operations, not a permute from a table)
    code = (
        "from tinygrad_like import formats; "
        "from tests.kernels.test_quant import decodes_every_code_as_ml_dtypes_does as check; "
        "[check(fmt) for fmt in formats.FORMATS]"
    )
    on_a_generic_cpu(code, tmp_path)


def on_a_generic_cpu(code, cache):
    """The stdout bytes of Python code run in a process whose Numba compiles for a generic
    x86-64 (NUMBA_CPU_NAME=generic: no F16C, no AVX-512 VNNI), its kernels cached in cache."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, NUMBA_CPU_NAME="generic", NUMBA_CACHE_DIR=str(cache))
    env.update(PYTHONPATH=path, TG_QUIET="1")
    run = [sys.executable, "-c", code]
    return subprocess.run(run, env=env, cwd=root, capture_output=True, check=True).stdout


def test_cpu_fp16_decodes_alike_on_a_cpu_without_f16c(tmp_path):
    # compiled.f32_from_f16_bits' integer form (NUMBA_CPU_NAME=generic: no F16C) gives the
    # bits of the F16C form for every fp16, NaNs included
    every = np.arange(2**16, dtype=np.uint16)[None]
    here = cpu.qembedding(every, None, np.array([0]), "fp16", None)[0]
    code = (
        "import numpy as np, sys; from tinygrad_like import kernels; "
        "every = np.arange(2**16, dtype=np.uint16)[None]; "
        "got = kernels.on('cpu').qembedding(every, None, np.array([0]), 'fp16', None); "
        "sys.stdout.buffer.write(got.tobytes())"
    )
    generic = np.frombuffer(on_a_generic_cpu(code, tmp_path), np.float32)
    assert np.array_equal(generic.view(np.uint32), here.view(np.uint32))


@pytest.mark.parametrize("fmt", sorted(FOUR_BIT))
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("M", [1, 3, 4])
def test_cpu_4bit_decode_step_gemv_is_dequantize_then_matmul(fmt, group_size, M):
    # the decode-step GEMV of the 4-bit formats (M < 4, groups of 32, 64 or 128 elements, five
    # a row: SUMS groups at a time, then one; x split into its even and odd elements) and, at
    # M = 4, decode_row
    codes, scales, g = quantized(fmt, 21, 5 * group_size, group_size)
    x = rand((M, 5 * group_size), F32, seed=3)
    got = cpu.qmatmul(x, codes, scales, fmt, g)
    np.testing.assert_allclose(got, qmatmul_ref(x, codes, scales, fmt, g), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("M,tile_rows", [(1, None), (3, None), (15, None), (17, None), (17, 8)])
def test_cpu_qmatmul_is_dequantize_then_matmul(fmt, M, tile_rows, monkeypatch):
    """fp32 x within fp32 rounding of float64 (N ragged against the row blocks, K against the
    lanes, groups of 8); bf16 x widened in the kernel, the result rounded once. From 16 rows of
    x (a prompt) W is decoded a tile at a time for BLAS: tile_rows 8 makes 37 rows five tiles,
    the last ragged."""
    if tile_rows:
        monkeypatch.setattr(quant_cpu, "_TILE", tile_rows * 88)
    codes, scales, g = quantized(fmt, 37, 88, group_for(fmt))
    x, bias = rand((M, 88), F32, seed=1), rand(37, F32, seed=2)
    for b in (None, bias):
        got = cpu.qmatmul(x, codes, scales, fmt, g, bias=b)
        assert got.dtype == F32 and got.shape == (M, 37)
        np.testing.assert_allclose(
            got, qmatmul_ref(x, codes, scales, fmt, g, b), rtol=1e-5, atol=1e-5
        )
    xb = x.astype(BF16)
    got = cpu.qmatmul(xb, codes, scales, fmt, g)
    want = (xb.astype(F32) @ weight(codes, scales, fmt, g).T).astype(BF16)
    assert got.dtype == BF16
    np.testing.assert_allclose(got.astype(F32), want.astype(F32), rtol=1e-2)


@pytest.mark.parametrize("fmt", FORMATS)
def test_cpu_a_prompts_rows_decode_as_decode_row(fmt):
    """A prompt's tiles of W (cpu_gemv.decode_rows: vectors of 16 codes, 32 for 4-bit) against
    decode_row (qembedding, a code at a time): the same bits, every code, groups of 32 and one
    scale per row (scales of every size); a NaN is a NaN, quieted or not."""
    f = formats.FORMATS[fmt]
    K = 64
    every = np.arange(
        2**f.bits if f.bits != 4 else 256, dtype=np.uint16 if f.bits == 16 else np.uint8
    )
    codes = np.resize(
        every, (max(1, every.size // (K // 2 if f.bits == 4 else K)), K // 2 if f.bits == 4 else K)
    )
    ids = np.arange(codes.shape[0])
    for g in (32, K) if f.scaled else (None,):
        scales = None
        if f.scaled:
            scales = np.exp(np.random.default_rng(1).uniform(-20, 20, (codes.shape[0], K // g)))
            scales = scales.astype(np.float32)
        want = cpu.qembedding(codes, scales, ids, fmt, g)
        got = np.empty_like(want)
        args = quant_cpu._kernel_args(codes, scales, fmt, g)
        assert quant_cpu.decode_rows(got, *args[:3], f.bits, args[3:], ids)
        nan = np.isnan(want)  # unscaled, LLVM folds the IR's times 1: a signaling NaN stays one
        assert np.array_equal(np.isnan(got), nan)
        assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_cpu_a_prompts_qmatmul_over_vector_decoded_tiles(fmt):
    """From 16 rows of x, W's tiles decoded by decode_rows (groups whole vectors: 4-bit groups
    of 32, 96-element rows) then BLAS: within fp32 rounding of float64."""
    codes, scales, g = quantized(fmt, 37, 96, 32 if fmt in FOUR_BIT else None)
    x, bias = rand((17, 96), F32, seed=1), rand(37, F32, seed=2)
    got = cpu.qmatmul(x, codes, scales, fmt, g, bias=bias)
    want = qmatmul_ref(x, codes, scales, fmt, g, bias)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def unfused_and_fused(device, dtype, fmt, M, bias):
    """Per group size of fmt (groups), qmatmul's y on device then elementwise's add(add, y), and
    qmatmul with add=: each as bytes, of x's dtype both."""
    plain, fused = [], []
    for g in groups(fmt):
        *args, kw = matmul(device.asarray, dtype, fmt, 37, 96, g, M, bias, "add")
        add = kw.pop("add")
        y, y_add = device.qmatmul(*args, **kw), device.qmatmul(*args, add=add, **kw)
        assert y_add.dtype == dtype
        plain.append(device.to_numpy(device.add(add, y)).tobytes())
        fused.append(device.to_numpy(y_add).tobytes())
    return plain, fused


# M = 1 and 3: the decode-step GEMV where the format and group have one (each code decoded as
# read), else decode_row; 17: a prompt's tiles (decode_rows or decode_row, then BLAS)
ADD_BITS = [(fmt, M, bias) for fmt in ADD_FORMATS for M in (1, 3, 17) for bias in (False, True)]


@pytest.mark.parametrize("dtype", FLOATS, ids=dtypes.name)
@pytest.mark.parametrize("fmt, M, bias", ADD_BITS)
def test_cpu_qmatmul_add_is_the_unfused_add(fmt, M, bias, dtype):
    """y + add has the bits of qmatmul then elementwise's add(add, y): a 2-byte y rounded
    first, then widened and added in fp32, rounded once more."""
    plain, fused = unfused_and_fused(cpu, dtype, fmt, M, bias)
    assert fused == plain


@pytest.mark.parametrize("dtype", FLOATS, ids=dtypes.name)
@pytest.mark.parametrize("fmt, M, bias", ADD_BITS)
def test_cuda_qmatmul_add_is_the_unfused_add(cuda_device, fmt, M, bias, dtype):
    """The same on the device: the add in the kernel's store, the bits of the add after it."""
    plain, fused = unfused_and_fused(cuda_device, dtype, fmt, M, bias)
    assert fused == plain


@pytest.mark.parametrize("fmt, M", [("int8", 1), ("int4", 3), ("bf16", 1), ("fp8_e4m3", 17)])
def test_qmatmul_then_is_the_unfused_activation(device, fmt, M):
    """then= has the bits of qmatmul then the elementwise kernel on y (a decode step's GELU,
    a SwiGLU with y its up projection), aux=True returning y after its outputs; and the same for
    qmatmul_int8x with int8 activations."""
    int8x = fmt in ("int8", "int4")  # a group of 32: int8 activations' block
    codes, scales, g = quantized(fmt, 37, 96, 32 if int8x else group_for(fmt))
    x, gate = rand((M, 96), F32, seed=1), rand((M, 37), F32, seed=2)
    put, as_bytes = device.asarray, lambda *a: b"".join(device.to_numpy(v).tobytes() for v in a)
    args = (put(x), put(codes), None if scales is None else put(scales), fmt, g)
    y = device.qmatmul(*args)
    assert as_bytes(device.qmatmul(*args, then=("gelu_fwd", ()))) == as_bytes(device.gelu_fwd(y))
    h, kept = device.qmatmul(*args, then=("swiglu_fwd", (put(gate),)), aux=True)
    assert as_bytes(h, kept) == as_bytes(device.swiglu_fwd(put(gate), y), y)
    if int8x:
        operands = (*device.quantize_rows(put(x)), put(codes), put(scales), fmt, g, F32)
        y = device.qmatmul_int8x(*operands)
        got = device.qmatmul_int8x(*operands, then=("gelu_fwd", ()))
        assert as_bytes(got) == as_bytes(device.gelu_fwd(y))


@pytest.mark.parametrize("M", [1, 17, 40])  # a decode step's row, a prompt's (tiles, dots)
def test_qmatmul_of_bf16_activations_into_fp32(device, M):
    """bf16 activations (x rounded to bf16) against bf16 weights, y in fp32 (dtype=): the fp32
    sum of exact products, within K ulps of float64 (a prompt's on the CPU: gemm/cpu_bf16.py's
    dot products where the CPU has them); the meta device gives the same shape and dtype. And
    dtype=bf16 from fp32 x is that y rounded once."""
    codes, _, _ = quantized("bf16", 70, 96)
    x = rand((M, 96), F32, seed=4).astype(BF16)
    bias = rand(70, F32, seed=5)
    put = device.asarray
    y = device.to_numpy(
        device.qmatmul(put(x), put(codes), None, "bf16", None, put(bias), dtype=F32)
    )
    assert y.dtype == F32 and y.shape == (M, 70)
    w = f64(weight(codes, None, "bf16", None))
    bound = (96 + 2) * 2.0**-24 * (np.abs(f64(x)) @ np.abs(w).T + np.abs(f64(bias)))
    assert np.all(np.abs(y - (f64(x) @ w.T + f64(bias))) <= bound)
    meta = kernels.on("meta")
    shaped = meta.qmatmul(*map(meta.asarray, (x, codes)), None, "bf16", None, dtype=F32)
    assert shaped.shape == (M, 70) and shaped.dtype == F32
    x32 = rand((M, 96), F32, seed=6)
    wide = device.qmatmul(put(x32), put(codes), None, "bf16", None)
    narrow = device.qmatmul(put(x32), put(codes), None, "bf16", None, dtype=BF16)
    assert device.to_numpy(narrow).tobytes() == device.to_numpy(wide).astype(BF16).tobytes()


def test_qmatmul_add_must_be_the_outputs_shape_and_dtype(cuda_device):
    """The shape rule (the meta device's qmatmul) and CUDA's qmatmul, which reads add in its
    store, refuse an add that is not y's (M, N) in x's dtype, naming what they got."""
    codes, scales, g = quantized("int8", 6, 32)
    x, meta = rand((2, 32), F32), kernels.on("meta")
    for device, put in [(meta, meta.asarray), (cuda_device, cuda_device.asarray)]:
        for bad in (rand(6, F32), rand((2, 6), BF16)):
            with pytest.raises(ValueError, match=rf"add \({bad.shape[0]},"):
                device.qmatmul(*map(put, (x, codes, scales)), "int8", g, add=put(bad))


@pytest.mark.parametrize("fmt", ["int4", "fp8_e4m3", "bf16"])
def test_cpu_qembedding_is_dequantize_then_gather(fmt):
    codes, scales, g = quantized(fmt, 50, 48, group_for(fmt))
    idx = np.array([[3, 49, 0], [3, 7, 21]])
    got = cpu.qembedding(codes, scales, idx, fmt, g)
    assert got.shape == (2, 3, 48) and np.array_equal(got, weight(codes, scales, fmt, g)[idx])
    with pytest.raises(ValueError, match="token id 50 out of range"):
        cpu.qembedding(codes, scales, np.array([50]), fmt, g)


# ---------------------------------------------------------------- int8 activations


def test_cpu_quantize_rows_rounds_as_spec_says():
    """The rule itself, not a reference: a block led by 127 has scale 1 and its halves go to
    the even neighbour; an all-zero block and one below TINY_BLOCK have scale 1 and codes 0;
    a block with a NaN has a NaN scale, one with an inf an infinite one, their codes 0 where
    x / scale is NaN (inf / inf), 0 for finite / inf."""
    x = np.zeros((1, 160), F32)
    x[0, :6] = [127, 2.5, -3.5, 0.5, -0.5, -126.5]
    x[0, 64:96] = 1e-20
    x[0, 96], x[0, 97] = np.nan, 1
    x[0, 128], x[0, 129] = np.inf, 1
    codes, scales = cpu.quantize_rows(x)
    assert codes[0, :6].tolist() == [127, 2, -4, 0, 0, -126] and scales[0, 0] == 1
    assert scales[0, 1:3].tolist() == [1, 1] and not codes[0, 32:96].any()
    assert np.isnan(scales[0, 3]) and not codes[0, 96:128].any()
    assert scales[0, 4] == np.inf and not codes[0, 128:].any()


def test_cpu_int8x_without_vnni_gives_the_same_bits(tmp_path):
    """The integer dot where the CPU has no AVX-512 VNNI (NUMBA_CPU_NAME=generic: one block's
    llvm.vector.reduce.add at a time) against this CPU's (vpdpbusd on whole chunks, if it has
    it): the same integers, the same fp32 operations, the same bits, every weight kind."""
    code = (
        "import sys, numpy as np; from tinygrad_like import kernels; "
        "from tests.kernels.test_quant import INT8X_WEIGHTS, int8x; cpu = kernels.on('cpu'); "
        "ys = [cpu.qmatmul_int8x(*a[:-1], **a[-1]) for w in INT8X_WEIGHTS "
        "for a in [int8x(np.asarray, np.float32, *w, 5, True)]]; "
        "sys.stdout.buffer.write(b''.join(y.tobytes() for y in ys))"
    )
    here = [
        cpu.qmatmul_int8x(*a[:-1], **a[-1])
        for w in INT8X_WEIGHTS
        for a in [int8x(np.asarray, F32, *w, 5, True)]
    ]
    assert on_a_generic_cpu(code, tmp_path) == b"".join(y.tobytes() for y in here)


@pytest.mark.parametrize(
    "fmt, group_size, words",
    [
        ("fp8_e4m3", None, "fp8_e4m3 has no integer path"),
        ("bf16", None, "bf16 has no integer path"),
        ("int4", 16, "must be a multiple of 32, got 16"),
    ],
)
def test_int8x_refuses_weights_without_an_integer_path(device, fmt, group_size, words):
    """Each device (and the meta device's shape rule) refuses alike, naming the reason."""
    codes, scales, g = quantized(fmt, 6, 64, group_size)
    xcodes, xscales = quantize_rows_ref(rand((2, 64), F32))
    meta = kernels.on("meta")
    for d in (device, meta):
        args = [d.asarray(a) if a is not None else None for a in (xcodes, xscales, codes, scales)]
        with pytest.raises(ValueError, match=words):
            d.qmatmul_int8x(*args, fmt, g, np.dtype(F32))


def test_quantize_rows_needs_whole_blocks(device):
    for d in (device, kernels.on("meta")):
        with pytest.raises(ValueError, match="K a multiple of 32"):
            d.quantize_rows(d.asarray(rand((2, 48), F32)))
