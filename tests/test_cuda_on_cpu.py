"""The CPU execution of the CUDA kernels (tests/cuda_on_cpu) checked on itself: that a missing
barrier shows (the mutation check: one __syncthreads or cp.async wait removed from a copy of a
kernel makes the comparison with the CPU reference fail in at least one thread order, while the
kernel as written passes in all three), that the three orders are what they say, that warp
shuffles and votes follow CUDA's rules, that shared memory is poisoned and fenced, that a
deadlock, a misaligned cp.async and a fault are reported as errors, and that the 2-byte float
conversions round as NumPy does. Skipped without a C++ compiler.
"""

import os
import re
import subprocess
import sys

import cuda_on_cpu
import fake_cupy
import ml_dtypes
import numpy as np
import pytest

from tinygrad_like import kernels

if not cuda_on_cpu.available():
    pytest.skip("no C++ compiler", allow_module_level=True)

ORDERS = ("forward", "reverse", "shuffle")
F32 = np.float32
cpu = kernels.on("cpu")


def rand(shape, dtype=F32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------- the mutation check


def trimmed(source, keep):
    """source with its instance list cut to `keep` (a quicker build)."""
    listing = "\n".join(f"    (void*)&{k}," for k in keep)
    return re.sub(
        r"#ifdef TG_CHECK_INSTANTIATE.*?#endif",
        f"#ifdef TG_CHECK_INSTANTIATE\nvoid* tg_kept[] = {{\n{listing}\n}};\n#endif",
        source,
        flags=re.S,
    )


# What runs a mutation's kernels (cuda: kernels.on(the CUDA device), its kernels and host
# functions) -> [(the CUDA result, the CPU's)]


def run_grad_norm_sq(cuda):
    g = rand(3001)
    return [(cuda.grad_norm_sq(cuda.asarray(g)), cpu.grad_norm_sq(g))]


def run_cross_entropy(cuda):
    logits, targets = rand((5, 1000)), np.array([0, 999, -1, 17, 500])
    got = cuda.cross_entropy_fwd(cuda.asarray(logits), cuda.asarray(targets))
    return list(zip(got, cpu.cross_entropy_fwd(logits, targets)))


def run_flash_fwd(cuda):
    q, k, v = (rand((1, 2, 70, 16), seed=s) for s in (1, 2, 3))
    got = cuda.flash_attention_fwd(*[cuda.asarray(a) for a in (q, k, v)], 0.25)
    return list(zip(got, cpu.flash_attention_fwd(q, k, v, 0.25)))


def run_flash_dq(cuda):
    q, k, v, dout = (rand((1, 2, 70, 16), seed=s) for s in (1, 2, 3, 4))
    out, lse = cpu.flash_attention_fwd(q, k, v, 0.25)
    args = (q, k, v, out, lse, dout, 0.25)
    got = cuda.flash_attention_bwd(*[cuda.asarray(a) for a in args])
    return [(got[0], cpu.flash_attention_bwd(*args)[0])]


def run_gemm_fp16(cuda):
    a, b = rand((70, 96), np.float16, 1), rand((96, 72), np.float16, 2)  # 3 k-tiles, cp.async
    return [(cuda.matmul(cuda.asarray(a), cuda.asarray(b)), cpu.matmul(a, b))]


# name: (file, a text that occurs once in it, the statement removed from that text (its first
# occurrence there), the instances to build, what runs them)
MUTATIONS = {
    "block_sum": (
        "adamw.cu",
        "    if (lane == 0) partial[warp] = v;\n    __syncthreads();\n",
        "__syncthreads();",
        ["sum_partials<float,true>", "sum_partials<float,false>"],
        run_grad_norm_sq,
    ),
    "block_row_max_sum": (
        "softmax.cu",
        "        warp_s[warp] = s;\n    }\n    __syncthreads();\n",
        "__syncthreads();",
        ["cross_entropy_fwd<float>"],
        run_cross_entropy,
    ),
    "flash_fwd_kv_loaded": (
        "attention.cu",
        "        load_rows(kv, k, j0, nk, D, A(1));\n        __syncthreads();\n",
        "__syncthreads();",
        ["flash_attention_fwd<float>"],
        run_flash_fwd,
    ),
    "flash_dq_dscores": (
        "attention.cu",
        # (not the barrier after probs_tile: dscores_tile reads only the p its thread wrote)
        "        dscores_tile(ds, p, dos, vs, Di_rows, nq, nk, D);\n        __syncthreads();\n"
        "        for (int e = threadIdx.x; e < nq * D; e += blockDim.x) {\n"
        "            const int r = e / D, d = e % D;\n            A acc = dqs",
        "__syncthreads();",
        [
            "flash_attention_bwd_rowdot<float>",
            "flash_attention_bwd_dq<float>",
            "flash_attention_bwd_dkdv<float>",
        ],
        run_flash_dq,
    ),
    "gemm_tc_stage_reuse": (
        "gemm.cu",
        "mma16816(acc[i][j], a[i], &b[j / 2][(j % 2) * 2], T());\n"
        "        }\n        __syncthreads();\n",
        "__syncthreads();",
        ["gemm_tc<__half,false,false,true>"],
        run_gemm_fp16,
    ),
    "gemm_tc_cp_async_wait": (
        "gemm.cu",
        "        cp_async_commit();\n        cp_async_wait<1>();\n        __syncthreads();\n"
        "        const T* as",
        "cp_async_wait<1>();",
        ["gemm_tc<__half,false,false,true>"],
        run_gemm_fp16,
    ),
}


def mutate(source, context, statement):
    """source with `statement` removed from `context` (which must occur once)."""
    assert source.count(context) == 1, f"the mutation's text is not in the source once: {context!r}"
    assert statement in context
    return source.replace(context, context.replace(statement, "", 1))


@pytest.fixture(scope="module")
def cuda():
    with fake_cupy.installed(execute=True) as module:
        yield module


@pytest.fixture(scope="module")
def sources(cuda):
    """{mutation: (the trimmed source as written, the mutated one)}, all built up front."""
    out = {}
    for name, (filename, context, statement, keep, _) in MUTATIONS.items():
        written = trimmed(cuda.kernel_source(filename), keep)
        out[name] = (written, mutate(written, context, statement))
    cuda_on_cpu.build([(s, tuple(cuda.instances(s))) for pair in out.values() for s in pair])
    return out


def agrees(cuda, monkeypatch, filename, source, run, order):
    """Whether the kernels of `filename`, built from `source`, match the CPU reference when their
    threads run in `order` (a KernelError, e.g. a deadlock, counts as not matching)."""
    real = cuda.runtime.kernel_source
    monkeypatch.setattr(
        cuda.runtime, "kernel_source", lambda f: source if f == filename else real(f)
    )
    monkeypatch.setenv("TG_CUDA_CPU_ORDER", order)
    cuda.runtime.compiled_module.cache_clear()
    cuda.runtime.compiled.cache_clear()
    try:
        pairs = run(kernels.on(cuda))
        return all(
            np.allclose(np.asarray(g, np.float64), np.asarray(r, np.float64), rtol=2e-3, atol=1e-4)
            for g, r in pairs
        )
    except cuda_on_cpu.KernelError:
        return False
    finally:
        cuda.runtime.compiled_module.cache_clear()
        cuda.runtime.compiled.cache_clear()


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_missing_barrier_fails_in_some_order(cuda, sources, monkeypatch, mutation):
    filename, *_, run = MUTATIONS[mutation]
    written, mutated = sources[mutation]
    as_written = {o: agrees(cuda, monkeypatch, filename, written, run, o) for o in ORDERS}
    assert all(as_written.values()), as_written
    without = {o: agrees(cuda, monkeypatch, filename, mutated, run, o) for o in ORDERS}
    print(f"{mutation} without its barrier, matches the reference: {without}")
    assert not all(without.values()), f"removing the barrier changed nothing: {without}"


# ---------------------------------------------------------------- the runner's own rules


def raw(cuda, source, name, grid, block, args, shared_mem=0):
    """Run kernel `name` of a CUDA source of our own through the stand-in (checked, then run)."""
    del cuda  # the fixture: fake_cupy installed with execution
    fn = fake_cupy.RawModule(code=source, name_expressions=[name]).get_function(name)
    fn.max_dynamic_shared_size_bytes = shared_mem
    fn(grid, block, args, shared_mem=shared_mem)


def dev(x):
    return fake_cupy.asarray(x)


ORDER_SOURCE = """
__global__ void order(int* seen, int* counter) {
    seen[atomicAdd(counter, 1)] = threadIdx.x;
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_threads_run_in_the_order_asked(cuda, monkeypatch, order):
    monkeypatch.setenv("TG_CUDA_CPU_ORDER", order)
    seen, counter = dev(np.full(256, -1, np.int32)), dev(np.zeros(1, np.int32))
    raw(cuda, ORDER_SOURCE, "order", (1,), (256,), (seen, counter))
    seen = np.asarray(seen)
    assert sorted(seen) == list(range(256))
    want = {"forward": list(range(256)), "reverse": list(range(255, -1, -1))}
    if order in want:
        assert list(seen) == want[order]
    else:
        assert list(seen) not in want.values()


def test_the_default_order_cycles_over_the_blocks(cuda, monkeypatch):
    monkeypatch.delenv("TG_CUDA_CPU_ORDER", raising=False)
    source = """
__global__ void first(int* seen) {  // the first thread of each block to run
    if (seen[blockIdx.x] < 0) seen[blockIdx.x] = threadIdx.x;
}
"""
    seen = dev(np.full(6, -1, np.int32))
    raw(cuda, source, "first", (6,), (64,), (seen,))
    firsts = list(np.asarray(seen))
    assert 0 in firsts and 63 in firsts and len(set(firsts)) >= 3, firsts


SHUFFLE_SOURCE = """
__global__ void shuffles(const int* x, int* out) {
    const int v = x[threadIdx.x], n = blockDim.x;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 5);
    out[n + threadIdx.x] = __shfl_down_sync(0xffffffffu, v, 3);
    out[2 * n + threadIdx.x] = __shfl_up_sync(0xffffffffu, v, 2, 8);
    out[3 * n + threadIdx.x] = __shfl_sync(0xffffffffu, v, 9, 16);
    out[4 * n + threadIdx.x] = __ballot_sync(0xffffffffu, v % 3 == 0);
    out[5 * n + threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 16, 16);
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_warp_shuffles_and_votes(cuda, monkeypatch, order):
    monkeypatch.setenv("TG_CUDA_CPU_ORDER", order)
    x = np.random.default_rng(1).integers(0, 1000, 64).astype(np.int32)
    out = dev(np.zeros(6 * 64, np.int32))
    raw(cuda, SHUFFLE_SOURCE, "shuffles", (1,), (64,), (dev(x), out))
    got = np.asarray(out).reshape(6, 64)
    t = np.arange(64)
    lane, base = t % 32, t - t % 32
    np.testing.assert_array_equal(got[0], x[base + (lane ^ 5)])
    np.testing.assert_array_equal(got[1], x[np.where(lane + 3 < 32, t + 3, t)])
    np.testing.assert_array_equal(got[2], x[np.where(lane % 8 >= 2, t - 2, t)])
    np.testing.assert_array_equal(got[3], x[t - t % 16 + 9])
    bits = (x % 3 == 0).reshape(2, 32) @ (1 << np.arange(32, dtype=np.int64))
    np.testing.assert_array_equal(got[4].astype(np.uint32), np.repeat(bits, 32).astype(np.uint32))
    # xor 16 within groups of 16: lanes 0-15 would read a later group (their own value instead),
    # lanes 16-31 an earlier one, which CUDA allows
    np.testing.assert_array_equal(got[5], x[np.where(lane < 16, t, t - 16)])


def test_a_divergent_barrier_is_a_deadlock(cuda):
    source = """
__global__ void diverge(float* x) {
    float v = x[threadIdx.x];
    if (threadIdx.x % 32 == 0) __syncthreads();
    else v = __shfl_xor_sync(0xffffffffu, v, 1);
    x[threadIdx.x] = v;
}
"""
    with pytest.raises(cuda_on_cpu.KernelError, match="deadlock: 2 threads at __syncthreads"):
        raw(cuda, source, "diverge", (1,), (64,), (dev(np.zeros(64, F32)),))


def test_a_shuffle_with_an_exited_lane_is_refused(cuda):
    source = """
__global__ void early(float* x) {
    if (threadIdx.x == 3) return;
    x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, x[threadIdx.x], 1);
}
"""
    with pytest.raises(cuda_on_cpu.KernelError, match="waits for lane 3, which has exited"):
        raw(cuda, source, "early", (1,), (32,), (dev(np.zeros(32, F32)),))


def test_shared_memory_starts_as_nan(cuda):
    source = """
__global__ void uninitialized(float* out, double* out64) {
    __shared__ float a[64];
    __shared__ double b[64];
    extern __shared__ __align__(16) unsigned char smem[];
    out[threadIdx.x] = a[threadIdx.x];
    out64[threadIdx.x] = b[threadIdx.x];
    out[64 + threadIdx.x] = reinterpret_cast<float*>(smem)[threadIdx.x];
    a[threadIdx.x] = 1.0f;  // the next block starts from NaN again
}
"""
    out, out64 = dev(np.zeros(128, F32)), dev(np.zeros(64))
    raw(cuda, source, "uninitialized", (2,), (64,), (out, out64), shared_mem=256)
    assert np.isnan(np.asarray(out)).all() and np.isnan(np.asarray(out64)).all()


@pytest.mark.parametrize(
    "body,shared_mem,message",
    [
        ("__shared__ float a[32]; a[threadIdx.x] = 1.0f;", 0, "past a static __shared__"),
        (
            "extern __shared__ float s[]; s[threadIdx.x] = 1.0f;",
            4 * 63,
            "1 bytes past the dynamic shared memory",
        ),
        (
            "extern __shared__ float s[]; x[threadIdx.x] = s[threadIdx.x + 64];",
            256,
            "past the end of the dynamic shared memory",
        ),
    ],
    ids=["static", "dynamic-slack", "dynamic-guard-page"],
)
def test_an_access_past_shared_memory_is_caught(cuda, body, shared_mem, message):
    source = f"__global__ void past(float* x) {{\n    {body}\n}}"
    with pytest.raises(cuda_on_cpu.KernelError, match=message):
        raw(cuda, source, "past", (1,), (64,), (dev(np.zeros(64, F32)),), shared_mem=shared_mem)


def test_a_misaligned_cp_async_is_refused(cuda):
    """kernels/gemm/cuda.py launches the cp.async instance only for 16-byte aligned operands;
    launched directly with an operand one element in, the copy is refused as the GPU would
    fault."""
    kernel = cuda.runtime.compiled("gemm.cu", "gemm_tc", np.float16, False, False, True)
    buf = dev(rand(64 * 64 + 1, np.float16))
    a, c = buf[1:].reshape(64, 64), dev(np.zeros((64, 64), np.float16))
    null = np.uint64(0)  # no bias, scale or add
    args = (a, a, null, null, null, c, *map(np.int32, (64, 64, 64)), *map(np.int64, (0, 0, 4096)))
    with pytest.raises(cuda_on_cpu.KernelError, match="must be 16-byte aligned"):
        kernel((1, 1, 1), (256,), args)


def test_half_and_bfloat16_conversions_round_as_numpy(cuda):
    """elementwise.cu's casts through cuda_cpu.h's conversions, bit for bit against NumPy and
    ml_dtypes, on the edges: ties, subnormals, the overflow threshold, signed zeros, inf, NaN."""
    f16 = np.finfo(np.float16)
    specials = [0.0, -0.0, np.inf, -np.inf, 65504.0, 65519.99, 65520.0, 1e-8, 2.0**-25]
    specials += [2.0**-25 * 1.0001, 2.0**-24 * 1.5, float(f16.tiny), float(f16.tiny) * 0.999]
    specials += [1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 3.4e38]
    bits = np.random.default_rng(0).integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([np.array(specials, F32), -np.array(specials, F32), bits.view(F32)])
    x = np.concatenate([x, np.array([np.nan], F32)])
    gpu = kernels.on(cuda)
    for dtype in (np.float16, ml_dtypes.bfloat16):
        got = np.asarray(gpu.cast(dev(x), dtype))
        with np.errstate(over="ignore", invalid="ignore"):
            want = x.astype(dtype)
        nan = np.isnan(want.astype(F32))
        np.testing.assert_array_equal(np.isnan(got.astype(F32)), nan)
        np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
        back = np.asarray(gpu.cast(dev(want), F32))
        np.testing.assert_array_equal(back[~nan], want.astype(F32)[~nan])


ASAN_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np
import fake_cupy
with fake_cupy.installed(execute=True):
    source = "__global__ void next(const float* x, float* y) {{ y[0] = x[threadIdx.x + 1]; }}"
    fn = fake_cupy.RawModule(code=source, name_expressions=["next"]).get_function("next")
    x = fake_cupy.asarray(np.zeros(1000, np.float32))
    fn((1,), (1000,), (x, fake_cupy.asarray(np.zeros(1, np.float32))))
"""


def test_address_sanitizer_catches_a_read_past_a_buffer():
    """TG_CUDA_CPU_ASAN=1 (with the sanitizer's runtime preloaded): one element read past the end
    of a global buffer is reported. A subprocess: the report ends it."""
    try:
        env = cuda_on_cpu.asan_environment()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the compiler has no AddressSanitizer")
    if not env["LD_PRELOAD"].startswith("/"):
        pytest.skip("the compiler has no AddressSanitizer runtime")
    tests = str(cuda_on_cpu.HERE.parent)
    script = ASAN_SCRIPT.format(tests=tests)
    run = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode != 0
    assert "heap-buffer-overflow" in run.stderr and "READ of size 4" in run.stderr, run.stderr[
        -3000:
    ]


def test_flash_attention_asks_the_device_for_its_shared_memory_limit(cuda, monkeypatch):
    """kernels/attention/cuda.py reads the device's opt-in limit: on an A100's 166912 bytes the
    backward at D = 128 in fp32 (198912 bytes for dq) is refused, naming the limit; on 232448
    (H200) it runs (tests/kernels/test_attention.py checks its values)."""
    gpu, q = kernels.on(cuda), dev(rand((1, 1, 8, 128)))
    out, lse = gpu.flash_attention_fwd(q, q, q, 0.1)  # 116480 bytes: fits either
    monkeypatch.setitem(fake_cupy.DEVICE_ATTRIBUTES, 97, 166912)
    gpu.flash_attention_fwd(q, q, q, 0.1)
    with pytest.raises(ValueError, match="198912 bytes .* more than the 166912 this GPU"):
        gpu.flash_attention_bwd(q, q, q, out, lse, q, 0.1)
    monkeypatch.setitem(fake_cupy.DEVICE_ATTRIBUTES, 97, 232448)
    gpu.flash_attention_bwd(q, q, q, out, lse, q, 0.1)


def test_the_stand_in_refuses_shared_memory_not_opted_into(cuda):
    source = "__global__ void big(float* x) {\n    extern __shared__ float s[];\n    x[0] = 0;\n}"
    fn = fake_cupy.RawModule(code=source, name_expressions=["big"]).get_function("big")
    x = dev(np.zeros(1, F32))
    fn((1,), (32,), (x,), shared_mem=48 * 1024)  # up to 48 KB without opting in
    with pytest.raises(fake_cupy.LaunchError, match="must opt in"):
        fn((1,), (32,), (x,), shared_mem=48 * 1024 + 4)
    fn.max_dynamic_shared_size_bytes = 100_000
    fn((1,), (32,), (x,), shared_mem=100_000)
    fn.max_dynamic_shared_size_bytes = 300_000
    with pytest.raises(fake_cupy.LaunchError, match="the device allows at most 232448"):
        fn((1,), (32,), (x,), shared_mem=100_000)
