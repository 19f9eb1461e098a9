"""The CUDA kernels' launches, checked without a GPU.

Every case of every kernel family (CASES of tests/kernels/test_<family>.py) runs over the NumPy
stand-in for CuPy (tests/fake_cupy.py), its arrays placed three ways: contiguous, transposed
(non-contiguous) and offset (a non-zero start, so the pointer is not 16-byte aligned). The
stand-in checks each launch as CuPy would pack it: argument count and order, scalar types,
pointer dtypes, null pointers, contiguity, grid and block limits; here each launched instance is
also checked against the compile list (what the .cu file names under TG_CHECK_INSTANTIATE,
NVRTC's name_expressions). The stand-in computes nothing, so values are checked only where the
host computes them (K = 0 GEMMs, zero-row layernorm_bwd, AdamW's constants, the id checks). The
last tests inject mismatches and show that the stand-in refuses them.

One file rather than one per family: these tests run over the stand-in that computes nothing,
the family files over the one that runs every kernel (tests/cuda_on_cpu), and a module holds
one installation of the CUDA device at a time; the cases they launch are the families' own.
"""

import importlib
import re
import sys
from pathlib import Path

import fake_cupy
import numpy as np
import pytest

from tinygrad_like import dtypes, formats, kernels, quant
from tinygrad_like.kernels.adamw.spec import (
    DECAY,
    INV_SQRT_BC2,
    LR_BC1,
    N_CONSTANTS,
    constants,
    hyper_of,
)
from tinygrad_like.kernels.elementwise import cuda_source
from tinygrad_like.kernels.elementwise import spec as elementwise
from tinygrad_like.kernels.record import KERNELS

from . import test_adamw
from .check import BF16, F16, F32, F64, FLOATS, cpu, rand

ids = dtypes.name
KERNELS_DIR = Path(kernels.__file__).parent  # kernels/<family>/<family>.cu
# Run by CuPy itself on CUDA (copies, fills, concatenation, sums, index gradients, max, a KV
# cache's scatter).
NO_CUSTOM_KERNEL = {
    *("contiguous", "copy", "fill", "concat", "index_bwd", "sum", "kv_write", "inverse_count"),
    *("amax", "argmax", "amax_bwd", "max_bwd"),
}
# fp64 GEMMs and casts from fp64 go to cuBLAS / astype: no launch of ours.
CUPY_ONLY = {("matmul", F64), ("matmul_nt", F64), ("matmul_tn", F64), ("cast", F64)}
LAYOUTS = ("contiguous", "transposed", "offset")
# Kernels that write only C-contiguous arrays in place (AdamW's flat buffers, an out=): they
# refuse a transposed one with a ValueError rather than write it as if it were contiguous.
WRITES_CONTIGUOUS = {"adamw_step", "cross_entropy_fwd_bwd"}


def family_cases():
    """(kernel, the dtype of its first dtype parameter) -> the families' cases of it."""
    found = {}
    for family in sorted({k.family for k in KERNELS.values()}):
        for case in importlib.import_module(f"{__package__}.test_{family}").CASES:
            dtype = next((p for p in case.params if isinstance(p, np.dtype)), None)
            found.setdefault((case.kernel, dtype), []).append(case)
    return found


CASES = family_cases()


@pytest.fixture
def gpu(stand_in):
    """The CUDA device over the stand-in, as code running on it sees it (kernels.on)."""
    return kernels.on(stand_in)


def place(cuda, x, layout="contiguous"):
    """Host x on the device: contiguous; transposed (a view of the last two axes of a contiguous
    transpose; for 1-D, every other element); or offset (contiguous, starting one element into
    a larger buffer, so the pointer is not 16-byte aligned)."""
    if layout == "transposed" and x.ndim >= 2:
        return cuda.asarray(np.ascontiguousarray(x.swapaxes(-1, -2))).swapaxes(-1, -2)
    if layout == "transposed":
        return cuda.asarray(np.repeat(x, 2))[::2]
    if layout == "offset":
        buf = cuda.asarray(np.zeros(x.size + 1, x.dtype))
        buf[1:] = x.reshape(-1)
        return buf[1:].reshape(x.shape)
    return cuda.asarray(x)


# ---------------------------------------------------------------- every case, every layout


@pytest.mark.parametrize(
    "kernel, dtype",
    sorted((k, d) for k, d in CASES if k not in NO_CUSTOM_KERNEL),
    ids=lambda p: p if isinstance(p, str) else ids(p),
)
def test_launches_pack_their_arguments(stand_in, gpu, launches, kernel, dtype):
    for case in CASES[kernel, dtype]:
        for layout in LAYOUTS:
            args, kwargs = case.arguments(lambda x: place(stand_in, x, layout))
            written = [args[i] for i in KERNELS[kernel].writes] + [kwargs.get("out")]
            if kernel in WRITES_CONTIGUOUS and not all(
                a.flags.c_contiguous for a in written if a is not None
            ):
                with pytest.raises(ValueError, match="contiguous"):
                    getattr(gpu, kernel)(*args, **kwargs)
                continue
            getattr(gpu, kernel)(*args, **kwargs)
    assert launches or (kernel, dtype) in CUPY_ONLY, "no launch"
    for launch in launches:  # the compile list: NVRTC compiles only these
        assert launch.name in stand_in.instances(launch.source), launch.name


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=ids)
def test_gemms_run_every_layout_aligned_and_not(stand_in, gpu, launches, dtype):
    for kernel in ("matmul", "matmul_nt", "matmul_tn"):
        for case in CASES[kernel, dtype]:
            for layout in LAYOUTS:
                args, kwargs = case.arguments(lambda x: place(stand_in, x, layout))
                getattr(gpu, kernel)(*args, **kwargs)
    name = "gemm_f32<" if dtype == F32 else f"gemm_tc<{stand_in.runtime.CTYPES[dtype]},"
    want = {
        f"{name}{ta},{tb},{aligned}>"
        for ta, tb in [("false", "false"), ("false", "true"), ("true", "false")]
        for aligned in ("false", "true")
    }
    assert {launch.name for launch in launches} == want


def test_the_cupy_kernels_launch_nothing_of_ours(gpu, stand_in, launches):
    assert NO_CUSTOM_KERNEL <= set(KERNELS)
    a = place(stand_in, rand((5, 33, 17), F32), "transposed")
    gpu.contiguous(a)
    gpu.copy(stand_in.empty((5, 33, 17), F32), a)
    gpu.fill(stand_in.empty(7, F16), 0.0)
    gpu.concat([a, a[:, :3]], 1)
    gpu.index_bwd(place(stand_in, rand((4, 3), F32)), (4, 7), (slice(None), slice(1, 4)))
    gpu.sum(a, axis=(0, 1))
    y = gpu.amax(a, axis=(0, 2), keepdims=True)
    gpu.amax_bwd(a, y, y, (0, 2))
    idx = gpu.argmax(place(stand_in, rand((5, 33, 17), BF16)), 1)
    gpu.max_bwd(place(stand_in, rand((5, 1, 17), F16)), idx, (5, 33, 17), 1)
    assert launches == []


def test_unary_ops_launch_their_generated_kernels(gpu, stand_in, launches):
    """Each unary op runs its own two kernels of expressions.cu (spec.UNARY's expressions); an
    unknown op is refused by name."""
    x = stand_in.empty(3, F32)
    for op in elementwise.UNARY_OPS:
        gpu.unary_fwd(x, op)
        gpu.unary_bwd(x, x, op)
    assert [launch.name for launch in launches] == [
        f"unary_{d}_{op}<float>" for op in elementwise.UNARY_OPS for d in ("fwd", "bwd")
    ]
    with pytest.raises(ValueError, match="unknown unary op 'gelu'"):
        gpu.unary_fwd(x, "gelu")


def test_quant_formats_are_numbered_as_in_quant_cu(gpu):
    """quant.cu's QuantFormat enum and kernels/quant/cuda.py's FORMATS name the formats in one order
    (the index is the template argument), the formats of formats.FORMATS, each with its code
    dtype."""
    source = (KERNELS_DIR / "quant" / "quant.cu").read_text()
    enum = re.search(r"enum QuantFormat \{([^}]*)\}", source).group(1)
    numbered = {name.lower(): int(i) for name, i in re.findall(r"(\w+) = (\d+)", enum)}
    table = sys.modules[f"{kernels.__name__}.quant.cuda"].FORMATS
    assert numbered == {fmt: spec[0] for fmt, spec in table.items()}
    assert set(numbered) == set(formats.FORMATS)
    for fmt, (_, code_dtype, per_code, _) in table.items():
        assert np.dtype(code_dtype).itemsize * 8 == formats.FORMATS[fmt].bits * per_code


def test_quant_arguments_that_do_not_fit_are_refused(gpu, stand_in, launches):
    qw = quant.quantize(rand((6, 64), F32), "int4", 32)
    x, codes, scales = (
        stand_in.asarray(rand((2, 64), F32)),
        stand_in.asarray(qw.codes),
        stand_in.asarray(qw.scales),
    )
    bf16 = quant.quantize(rand((6, 64), F32), "bf16")
    cases = [
        (ValueError, "unknown quantized format 'int2'", (x, codes, scales, "int2", 32)),
        (
            TypeError,
            "int8 codes must be a 2-D uint8",
            (x, stand_in.asarray(bf16.codes), scales, "int8", 32),
        ),
        (
            ValueError,
            "group_size 24 must be a positive even divisor",
            (x, codes, scales, "int4", 24),
        ),
        (ValueError, "group_size 1 must be a positive even divisor", (x, codes, scales, "int4", 1)),
        (
            ValueError,
            r"scales must have shape \(6, 2\), got \(6, 4\)",
            (x, codes, stand_in.asarray(np.ones((6, 4), F32)), "int4", 32),
        ),
        (ValueError, r"scales must have shape \(6, 2\), got None", (x, codes, None, "int4", 32)),
        (
            ValueError,
            "bf16 weights have no scales",
            (x, stand_in.asarray(bf16.codes), scales, "bf16", None),
        ),
        (ValueError, r"x \(2, 32\) must be \(M, 64\)", (x[:, :32], codes, scales, "int4", 32)),
        (
            TypeError,
            "floating-point x",
            (stand_in.asarray(np.ones((2, 64), np.int32)), codes, scales, "int4", 32),
        ),
    ]
    for error, match, args in cases:
        with pytest.raises(error, match=match):
            gpu.qmatmul(*args)
    with pytest.raises(ValueError, match=r"bias \(5,\) must be \(6,\)"):
        gpu.qmatmul(x, codes, scales, "int4", 32, bias=stand_in.asarray(rand(5, F32)))
    with pytest.raises(ValueError, match="token id 6 out of range for vocab 6"):
        gpu.qembedding(codes, scales, stand_in.asarray(np.array([0, 6])), "int4", 32)
    assert launches == []


def test_row_kernels_without_rows_launch_nothing(gpu, stand_in, launches):
    for kernel in (gpu.softmax_fwd, gpu.log_softmax_fwd):
        assert kernel(stand_in.empty((0, 5), F32)).shape == (0, 5)
    for op in elementwise.UNARY_OPS:
        assert gpu.unary_fwd(stand_in.empty((3, 0), F16), op).shape == (3, 0)
    assert launches == []


# ---------------------------------------------------------------- what the host computes


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
def test_gemm_with_k_zero_is_bias_or_zero_without_a_launch(gpu, stand_in, launches, dtype):
    """C = bias (or 0), as cpu.py's np.matmul gives, filled on the host: no kernel launched."""
    bias = rand(5, dtype)
    cases = [
        ("matmul", np.zeros((3, 0), dtype), np.zeros((0, 5), dtype), {"bias": bias}),
        ("matmul", np.zeros((2, 3, 0), dtype), np.zeros((0, 5), dtype), {}),
        ("matmul_nt", np.zeros((2, 4, 0), dtype), np.zeros((6, 0), dtype), {}),
        ("matmul_tn", np.zeros((0, 3), dtype), np.zeros((0, 5), dtype), {}),
    ]
    for kernel, a, b, kw in cases:
        got = getattr(gpu, kernel)(
            stand_in.asarray(a),
            stand_in.asarray(b),
            **{k: stand_in.asarray(v) for k, v in kw.items()},
        )
        ref = getattr(cpu, kernel)(a, b, **kw)
        assert got.shape == ref.shape and got.dtype == ref.dtype
        np.testing.assert_array_equal(stand_in.to_numpy(got), ref)
    assert launches == []


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
@pytest.mark.parametrize("shape", [(0, 5), (2, 0, 7), (3, 0)], ids=str)
def test_layernorm_bwd_without_rows_or_columns(gpu, stand_in, launches, dtype, shape):
    stat = dtypes.compute_dtype(dtype)
    x, w = stand_in.asarray(np.zeros(shape, dtype)), stand_in.asarray(rand(shape[-1], dtype))
    mean = rstd = stand_in.asarray(np.zeros(shape[:-1], stat))
    dx, dweight, dbias = gpu.layernorm_bwd(x, x, w, mean, rstd)
    assert dx.shape == shape and dx.dtype == dtype
    for d in (dweight, dbias):
        assert d.shape == (shape[-1],) and d.dtype == dtype and not d.any()
    assert launches == []
    if shape[-1]:  # cpu.py needs C > 0 to reshape; its zero-row result is the same zeros
        for d, ref in zip(
            (dweight, dbias),
            cpu.layernorm_bwd(*(stand_in.to_numpy(a) for a in (x, x, w, mean, rstd)))[1:],
        ):
            assert ref.shape == d.shape and ref.dtype == d.dtype and not ref.any()
    gpu.layernorm_fwd(x, w, w)  # a 0-row forward launches nothing; 0 columns is a valid launch


@pytest.mark.parametrize("bad", [1000, 50_300, -1])
def test_embedding_ids_out_of_range_raise_cpu_py_s_error(gpu, stand_in, launches, bad):
    weight, idx = rand((1000, 8), F32), np.array([[3, bad], [0, 999]])
    for kernel, args in [
        ("embedding_fwd", (weight, idx)),
        ("embedding_bwd", (rand((2, 2, 8), F32), idx, 1000)),
    ]:
        with pytest.raises(ValueError) as on_cpu:
            getattr(cpu, kernel)(*args)
        with pytest.raises(ValueError) as on_cuda:
            getattr(gpu, kernel)(
                *[stand_in.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
            )
        assert (
            str(on_cuda.value) == str(on_cpu.value) == f"token id {bad} out of range for vocab 1000"
        )
    assert launches == []  # checked on the host, before the launch


def test_cross_entropy_fwd_bwd_refuses_an_out_it_cannot_write(gpu, stand_in, launches):
    """The kernel writes out as a C-contiguous (N, Vp) array of the logits' dtype."""
    logits, t = stand_in.asarray(rand((4, 16), F32)), stand_in.asarray(np.array([0, 3, -1, 9]))
    for out in (
        stand_in.empty((4, 16), F16),
        stand_in.empty((4, 32), F32)[:, ::2],
        stand_in.empty((16, 4), F32),
    ):
        with pytest.raises(ValueError, match="C-contiguous"):
            gpu.cross_entropy_fwd_bwd(logits, t, stand_in.asarray(np.ones(1, F32)), out=out)
    assert launches == []


def test_flash_attention_refuses_heads_that_do_not_group(gpu, stand_in, launches):
    """k and v need a number of heads that divides q's (grouped-query attention), and one
    shape; refused on the host, with the shapes named."""
    q = stand_in.asarray(rand((1, 4, 8, 16), F32))
    for k, v in [((1, 3, 8, 16),) * 2, ((1, 2, 8, 16), (1, 4, 8, 16)), ((2, 2, 8, 16),) * 2]:
        need = "need (B, H, Tq, D) and (B, Hkv, Tk, D) with H a multiple of Hkv and Tk >= Tq"
        with pytest.raises(ValueError, match=re.escape(f"k {k}, v {v}: {need}")):
            gpu.flash_attention_fwd(
                q, stand_in.asarray(rand(k, F32)), stand_in.asarray(rand(v, F32)), 0.25
            )
    assert launches == []


@pytest.mark.parametrize("P,G", [(F32, F16), (F32, F64), (F64, F64)], ids=ids)
def test_adamw_constants_are_rounded_once_to_the_master_dtype(gpu, stand_in, launches, P, G):
    """cpu.adamw_step rounds decay, lr/bc1 and 1/sqrt(bc2) from spec.constants' fp64 vector to
    the master's dtype (acc(...)); the kernel gets that same fp64 vector, on the device (a CUDA
    graph of the step reads each step's), and rounds each once to P as it reads it
    (adamw.cu)."""
    *bufs, c = test_adamw.buffers(stand_in.asarray, P, G, 1.0, None)
    gpu.adamw_step(*bufs, c)
    (launch,) = [la for la in launches if la.name.startswith("adamw_step")]
    h = hyper_of(np.asarray(c))
    got = launch.args[-1]
    assert got.dtype == np.float64 and got.shape == (N_CONSTANTS,)
    np.testing.assert_array_equal(np.asarray(got), constants(h))
    lr, beta1, beta2, step = h.lr, h.beta1, h.beta2, h.step
    want = (1 - lr * h.weight_decay, lr / (1 - beta1**step), 1 / np.sqrt(1 - beta2**step))
    assert tuple(np.asarray(got)[[DECAY, LR_BC1, INV_SQRT_BC2]]) == want  # fp64, unrounded
    assert launch.args[5].dtype == dtypes.compute_dtype(G)  # norm_sq as grad_norm_sq gave it


# ---------------------------------------------------------------- the stand-in refuses mismatches


def _tamper(stand_in, monkeypatch, change):
    """Make every launch pass change(args) instead of its arguments."""
    real = stand_in.runtime.compiled

    def tampered(*key):
        kernel = real(*key)
        return lambda grid, block, args: kernel(grid, block, change(args))

    for module in list(sys.modules.values()):  # every module that launches: the kernels' cuda.py
        if getattr(module, "compiled", None) is real:
            monkeypatch.setattr(module, "compiled", tampered)


def test_a_widened_int_is_refused(gpu, stand_in, monkeypatch):
    x, w = place(stand_in, rand((4, 64), F16)), place(stand_in, rand(64, F16))
    _tamper(
        stand_in,
        monkeypatch,
        lambda args: tuple(np.int64(a) if type(a) is np.int32 else a for a in args),
    )
    with pytest.raises(fake_cupy.LaunchError, match=r"rows\): np.int64 for a int"):
        gpu.layernorm_fwd(x, w, w)


def test_swapped_arguments_are_refused(gpu, stand_in, monkeypatch):
    """adamw_step's n (long long) and constants (double*) swapped. (Two arguments of one type
    swapped would pass: packing cannot tell them apart.)"""
    *bufs, c = test_adamw.buffers(stand_in.asarray, F32, BF16, 1.0, None)
    _tamper(
        stand_in,
        monkeypatch,
        lambda args: args[:6] + (args[7], args[6]) if len(args) == 8 else args,
    )
    with pytest.raises(fake_cupy.LaunchError, match="argument 6"):
        gpu.adamw_step(*bufs, c)


def test_bad_pointers_and_scalars_are_refused(stand_in):
    gelu = stand_in.runtime.compiled("expressions.cu", "gelu_fwd", F16)
    x16, y16 = stand_in.empty(300, F16), stand_in.empty(300, F16)
    n = np.int64(300)
    gelu((2,), (256,), (x16, y16, n))  # the right packing passes
    bad = {
        "a float32 array for a __half": (stand_in.empty(300, F32), y16, n),
        "non-contiguous": (stand_in.empty(600, F16)[::2], y16, n),
        "never tests it for null": (x16, stand_in.runtime.NULL, n),
        "ndarray for a __half": (np.empty(300, F16), y16, n),  # a host array
        "int for a long long": (x16, y16, 300),  # a Python int
        "float64 for a long long": (x16, y16, np.float64(300)),
        "takes a tuple of 3 arguments": (x16, y16),
    }
    for message, args in bad.items():
        with pytest.raises(fake_cupy.LaunchError, match=message):
            gelu((2,), (256,), args)
    binary = stand_in.runtime.compiled("elementwise.cu", "binary", F32, 2)  # null a: the scalar sa
    binary(
        (1,),
        (256,),
        (
            stand_in.runtime.NULL,
            stand_in.empty(5, F32),
            np.float32(2),
            np.float32(0),
            stand_in.empty(5, F32),
            np.int64(5),
        ),
    )
    with pytest.raises(fake_cupy.LaunchError, match="float64 for a float"):
        binary(
            (1,),
            (256,),
            (
                stand_in.runtime.NULL,
                stand_in.empty(5, F32),
                np.float64(2),
                np.float32(0),
                stand_in.empty(5, F32),
                np.int64(5),
            ),
        )


@pytest.mark.parametrize(
    "grid,block",
    [
        ((0,), (256,)),
        ((2**31,), (256,)),
        ((1, 65536), (256,)),
        ((1, 1, 65536), (32,)),
        ((1,), (1025,)),
        ((1,), (32, 32, 2)),
        ((1,), (256, 1, 65)),
        ([1], (256,)),
    ],
)
def test_launch_shapes_beyond_the_limits_are_refused(stand_in, grid, block):
    gelu = stand_in.runtime.compiled("expressions.cu", "gelu_fwd", F32)
    with pytest.raises(fake_cupy.LaunchError, match="grid|block"):
        gelu(grid, block, (stand_in.empty(1, F32), stand_in.empty(1, F32), np.int64(1)))


def test_instances_outside_the_compile_list_are_refused(stand_in):
    with pytest.raises(fake_cupy.LaunchError, match="not in name_expressions"):
        stand_in.runtime.compiled(
            "gemm.cu", "gemm_tc", F64, False, False, True
        )  # no fp64 tensor cores
    source = stand_in.kernel_source("expressions.cu")
    with pytest.raises(fake_cupy.LaunchError, match="does not fit"):
        fake_cupy.RawModule(code=source, name_expressions=["gelu_fwd<true>"])
    with pytest.raises(fake_cupy.LaunchError, match="names no kernel"):
        fake_cupy.RawModule(code=source, name_expressions=["gelu<float>"])


@pytest.mark.parametrize(
    "filename", sorted([p.name for p in KERNELS_DIR.glob("*/*.cu")] + list(cuda_source.SOURCES))
)
def test_every_kernel_of_a_file_is_in_its_compile_list(stand_in, filename):
    source = stand_in.kernel_source(filename)
    module = fake_cupy.RawModule(code=source, name_expressions=stand_in.instances(source))
    assert set(module.templates) == {name.split("<")[0] for name in module.kernels}
