"""Quantized weights' kernels (kernels/quant): qmatmul, x @ W^T with W decoded from its codes
and scales inside the kernel, against float64 x @ dequantize(W)^T; qembedding, the gather of
decoded rows, bit for bit dequantize(W)[idx], every code of every format included (subnormals,
infinities, NaNs: ml_dtypes' values). qmatmul's add epilogue (y + add) has the bits of the
unfused add. The quantizer itself (tinygrad_like/quant.py) and the quantized models:
tests/test_quant.py.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinygrad_like import dtypes, formats, kernels, quant

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
# y + add over an int8, fp8, int4 and bf16 weight, M = 1 (a decode step: int4's and bf16's
# decode-step dot) and 17 (a prompt: W decoded once a row), with and without the bias
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


@pytest.mark.parametrize("fmt", FORMATS)
def test_cpu_the_decode_step_dot_decodes_every_code_as_ml_dtypes_does(fmt):
    # row n of W holds code n in element 0 and zeros (int4: nibble 8) elsewhere, x = e_0 and
    # the scales 1: y[0, n] is code n's value times 1 plus zeros, exactly (but a zero's sign)
    f = formats.FORMATS[fmt]
    every = np.arange(2**f.bits, dtype=np.uint16 if f.bits == 16 else np.uint8)
    K = 32
    zero = 0x88 if fmt == "int4" else 0
    codes = np.full((every.size, K // 2 if f.bits == 4 else K), zero, every.dtype)
    codes[:, 0] = (every | 0x80) if fmt == "int4" else every
    scales = np.ones((every.size, 1), np.float32) if f.scaled else None
    x = np.eye(1, K, dtype=np.float32)
    got = cpu.qmatmul(x, codes, scales, fmt, K if f.scaled else None)[0]
    want = every.astype(np.float32) - 8 if fmt == "int4" else every.view(f.element).astype(F32)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert np.array_equal(got[finite], want[finite] + np.float32(0))


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
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, NUMBA_CPU_NAME="generic", NUMBA_CACHE_DIR=str(tmp_path))
    env.update(PYTHONPATH=path, TG_QUIET="1")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, check=True
    )
    generic = np.frombuffer(out.stdout, np.float32)
    assert np.array_equal(generic.view(np.uint32), here.view(np.uint32))


@pytest.mark.parametrize("fmt", sorted(FOUR_BIT))
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("M", [1, 3, 4])
def test_cpu_4bit_decode_dot_is_dequantize_then_matmul(fmt, group_size, M):
    # the decode-step dot of the 4-bit formats (M < 4, groups of 32, 64 or 128: x split into
    # its even and odd elements, each group a constant-trip loop) and, at M = 4, decode_row
    codes, scales, g = quantized(fmt, 21, 256, group_size)
    x = rand((M, 256), F32, seed=3)
    got = cpu.qmatmul(x, codes, scales, fmt, g)
    np.testing.assert_allclose(got, qmatmul_ref(x, codes, scales, fmt, g), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("M", [1, 3, 17])
def test_cpu_qmatmul_is_dequantize_then_matmul(fmt, M):
    """fp32 x within fp32 rounding of float64 (N ragged against the row blocks, K against the
    lanes, groups of 8); bf16 x widened in the kernel, the result rounded once."""
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


# M = 1 and 3: the decode-step dot where the format and group have one (each code decoded as
# read), else decode_row; 17: decode_row (W decoded once a row)
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
