"""The CPU device's thread splits (runtime.in_parallel, the GEMMs' splits) change no result:
a GEMM split across the cores matches one BLAS call, elementwise and row kernels split into
blocks match the same kernel run as one block bit for bit, a compiled kernel's parallel and
serial twins agree bit for bit, and the BLAS thread count is restored."""

import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tinygrad_like import dtypes, quant
from tinygrad_like.backend.cpu import compiled, runtime
from tinygrad_like.kernels.gemm import cpu as gemm

from .check import cpu

F32 = np.float32


@pytest.mark.parametrize("M, K, N", [(256, 128, 3000), (3000, 64, 96), (8, 16, 8), (64, 8192, 16)])
def test_split_gemms_match_numpy(rng, M, K, N):
    a, b = rng.standard_normal((M, K), dtype=F32), rng.standard_normal((K, N), dtype=F32)
    bias = rng.standard_normal(N, dtype=F32)
    want = a @ b
    np.testing.assert_allclose(cpu.matmul(a, b), want, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(cpu.matmul(a, b, bias=bias), want + bias, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(
        cpu.matmul_nt(a, np.ascontiguousarray(b.T)), want, rtol=1e-5, atol=1e-4
    )
    np.testing.assert_allclose(
        cpu.matmul_tn(np.ascontiguousarray(a.T), b), want, rtol=1e-5, atol=1e-4
    )
    np.testing.assert_array_equal(cpu.matmul(a, b), cpu.matmul(a, b))  # deterministic


def test_split_gemm_with_batch_dims_and_half_inputs(rng):
    a = rng.standard_normal((2, 3, 256, 64), dtype=F32)
    b = rng.standard_normal((2, 3, 64, 512), dtype=F32)
    np.testing.assert_allclose(cpu.matmul(a, b), a @ b, rtol=1e-5, atol=1e-4)
    ah, bh = a.astype(dtypes.bfloat16), b.astype(dtypes.bfloat16)
    want = (ah.astype(F32) @ bh.astype(F32)).astype(dtypes.bfloat16)
    got = cpu.matmul(ah, bh)
    assert got.dtype == dtypes.bfloat16
    np.testing.assert_array_equal(got.astype(F32), want.astype(F32))


def test_gemms_restore_the_blas_thread_count(rng):
    if runtime.OPENBLAS is None:
        pytest.skip("no OpenBLAS found to ask")
    before = runtime.OPENBLAS.get_num_threads()
    try:
        runtime.OPENBLAS.set_num_threads(2)
        cpu.matmul(
            rng.standard_normal((512, 256), dtype=F32), rng.standard_normal((256, 512), dtype=F32)
        )
        cpu.matmul(
            rng.standard_normal((64, 8192), dtype=F32), rng.standard_normal((8192, 16), dtype=F32)
        )  # a long K: two halves at one BLAS thread each
        assert runtime.OPENBLAS.get_num_threads() == 2
    finally:
        runtime.OPENBLAS.set_num_threads(before)
        runtime.OPENBLAS.clear_controlling_thread()


def test_one_blas_thread_from_another_python_thread():
    """threadpoolctl lets one Python thread at a time set OpenBLAS's process-wide count: a
    block left on one thread lets another thread's block set it (and restore it)."""
    if runtime.OPENBLAS is None or runtime.OPENBLAS.get_num_threads() == 1:
        pytest.skip("no threaded OpenBLAS to limit")
    before = runtime.OPENBLAS.get_num_threads()
    with runtime.one_blas_thread():
        pass
    inside = []

    def body():
        with runtime.one_blas_thread():
            inside.append(runtime.OPENBLAS.get_num_threads())

    worker = threading.Thread(target=body)
    worker.start()
    worker.join()
    assert inside == [1]
    assert runtime.OPENBLAS.get_num_threads() == before


def test_long_k_gemm_is_the_sum_of_its_two_halves(rng):
    """K >= 2 max(M, N) (the LM head's dX, the layers' dW): two fixed halves summed, the same
    bits whatever the core count (one core sums the same two halves)."""
    a = rng.standard_normal((64, 8192), dtype=F32)
    b = rng.standard_normal((16, 8192), dtype=F32)  # matmul_nt's layout, as wte
    h = 4096
    with runtime.one_blas_thread():  # as each half runs: OpenBLAS's threaded kernel may round apart
        want = a[:, :h] @ b[:, :h].T + a[:, h:] @ b[:, h:].T
    np.testing.assert_array_equal(cpu.matmul_nt(a, b), want)
    np.testing.assert_array_equal(cpu.matmul(a, np.ascontiguousarray(b.T)), want)


def test_blas_workers_sleep_after_a_gemm(rng):
    """OpenBLAS's idle workers go to sleep right after a threaded GEMM instead of spinning for
    ~0.1 s on the cores the row kernels run on next."""
    if not runtime.BLAS_QUIET or "OPENBLAS_THREAD_TIMEOUT" in os.environ or runtime.THREADS < 2:
        pytest.skip("OpenBLAS's thread timeout is not ours to set here")
    a = rng.standard_normal((1024, 1024), dtype=F32)
    cpu.matmul(a, a)
    t0 = time.process_time()
    time.sleep(0.1)
    assert time.process_time() - t0 < 0.03  # spinning workers would take ~0.1 s of CPU


def _kernels(rng):
    """Calls of the split kernels on inputs large enough to split, as (name, thunk)."""
    x = rng.standard_normal((2 * runtime.CHUNK + 5,), dtype=F32)
    y = rng.standard_normal(x.shape, dtype=F32)
    logits = rng.standard_normal((24, 50304), dtype=F32)
    targets = rng.integers(-1, 50257, 24)
    lse = cpu.cross_entropy_fwd(logits, targets, 50257)[1]
    return [
        ("add", lambda: cpu.add(x, y)),
        ("mul scalar", lambda: cpu.mul(x, 0.5)),
        ("div one-element", lambda: cpu.div(x, np.array([3.0], F32))),
        ("gelu_bwd", lambda: cpu.gelu_bwd(x, y)),
        ("cross_entropy_fwd", lambda: cpu.cross_entropy_fwd(logits, targets, 50257)),
        (
            "cross_entropy_bwd",
            lambda: cpu.cross_entropy_bwd(logits, lse, targets, np.array([0.25], F32), 50257),
        ),
        (
            "cross_entropy_fwd_bwd",
            lambda: cpu.cross_entropy_fwd_bwd(logits, targets, np.array([0.25], F32), 50257),
        ),
    ]


def _outputs(result):
    return result if isinstance(result, tuple) else (result,)


def test_blocks_match_one_block_bit_for_bit(monkeypatch):
    split = [(name, _outputs(fn())) for name, fn in _kernels(np.random.default_rng(1))]
    for module in (runtime, gemm):  # every kernel as one block
        monkeypatch.setattr(module, "THREADS", 1)
    for (name, got), (_, fn) in zip(split, _kernels(np.random.default_rng(1))):
        for g, w in zip(got, _outputs(fn())):
            np.testing.assert_array_equal(g, w, err_msg=name)


def test_in_place_split_add_writes_out(rng):
    x = rng.standard_normal((3, runtime.CHUNK), dtype=F32)
    y = rng.standard_normal(x.shape, dtype=F32)
    want = x + y
    out = cpu.add(x, y, out=x)
    assert out is x
    np.testing.assert_array_equal(x, want)


def _compiled_rows(rng):
    """Calls of the compiled row, elementwise and GEMV kernels on ragged shapes (rows not a
    multiple of a block's 32, rows not a multiple of the 16 sum lanes), as (name, thunk)."""
    scores = rng.standard_normal((3, 3, 5, 37), dtype=F32)  # 45 rows of 37 keys, Tq = 5
    x, dy = (rng.standard_normal((45, 37), dtype=F32) for _ in range(2))
    y = cpu.softmax_fwd(x)
    gate, up = (rng.standard_normal((7, 143), dtype=F32) for _ in range(2))
    angles = rng.standard_normal((5, 4), dtype=F32)
    heads = rng.standard_normal((2, 3, 5, 8), dtype=F32)  # (B, H, T, D)
    row, w = rng.standard_normal((2, 200), dtype=F32), rng.standard_normal((200, 131), dtype=F32)
    q = quant.quantize(rng.standard_normal((37, 96), dtype=F32), "int4", 32)
    return [
        ("matmul (a decode step's GEMV)", lambda: cpu.matmul(row, w)),
        ("matmul_nt (a decode step's GEMV)", lambda: cpu.matmul_nt(row, w.T.copy())),
        (
            "qmatmul (a decode step's GEMV)",
            lambda: cpu.qmatmul(row[:, :96], q.codes, q.scales, "int4", 32),
        ),
        ("softmax_causal_fwd", lambda: cpu.softmax_causal_fwd(scores, 0.3)),
        ("softmax_causal_bwd", lambda: cpu.softmax_causal_bwd(scores, scores[::-1], 0.3)),
        ("softmax_fwd", lambda: cpu.softmax_fwd(x)),
        ("softmax_bwd", lambda: cpu.softmax_bwd(y, dy)),
        ("log_softmax_fwd", lambda: cpu.log_softmax_fwd(x)),
        ("log_softmax_bwd", lambda: cpu.log_softmax_bwd(np.log(y), dy)),
        ("swiglu_fwd", lambda: cpu.swiglu_fwd(gate, up)),
        ("swiglu_bwd", lambda: cpu.swiglu_bwd(gate, up, up[::-1])),
        ("unary_bwd rsqrt", lambda: cpu.unary_bwd(np.abs(gate), up, "rsqrt")),
        ("rotary_fwd", lambda: cpu.rotary_fwd(heads, np.cos(angles), np.sin(angles))),
        ("rotary_bwd", lambda: cpu.rotary_bwd(heads, np.cos(angles), np.sin(angles))),
    ]


def test_compiled_serial_and_parallel_twins_match_bit_for_bit(monkeypatch):
    """A compiled kernel's parallel twin (prange over the cores) and its serial twin (below
    compiled.SERIAL_BELOW elements) give the same bits: each row's sums run over fixed lanes,
    whichever core takes the row."""
    # every call parallel, then every call serial: the threshold, and the pool's hand-off that
    # scales a kernel's own threshold (the GEMVs')
    monkeypatch.setattr(compiled, "SERIAL_BELOW", 0)
    monkeypatch.setattr(compiled, "_handoff", [0.0])
    parallel = [(name, _outputs(fn())) for name, fn in _compiled_rows(np.random.default_rng(2))]
    monkeypatch.setattr(compiled, "SERIAL_BELOW", 1 << 62)
    monkeypatch.setattr(compiled, "_handoff", [float(1 << 62)])
    for (name, got), (_, fn) in zip(parallel, _compiled_rows(np.random.default_rng(2))):
        for g, w in zip(got, _outputs(fn())):
            np.testing.assert_array_equal(g, w, err_msg=name)


def test_an_edit_of_a_kernels_constants_gives_a_fresh_disk_cache(tmp_path):
    """A kernel bakes in the constants it imports (a family's spec.py), which Numba's check of
    the kernel's own file would miss: the cache directory's name hashes them too."""
    package = Path(compiled.__file__).parents[2]
    copy = tmp_path / "tinygrad_like"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert compiled._cache_dir(copy) == compiled._cache_dir(package)
    for edited in ("kernels/quant/spec.py", "formats.py", "backend/cpu/runtime.py"):
        before = compiled._cache_dir(copy)
        with open(copy / edited, "a") as f:
            f.write("\n# an edit\n")
        assert compiled._cache_dir(copy) != before, edited
    before = compiled._cache_dir(copy)
    (copy / "graph" / "replay.py").write_text("# not a kernel's source\n")
    assert compiled._cache_dir(copy) == before


def test_a_kernel_closes_over_plain_constants_only():
    """Numba keys a closure's disk-cache entry by its cells' pickled bytes: a kernel closing
    over a compiled function would compile again in every process, so @kernel refuses it (the
    int4 / int8 choice of a per-format kernel is a bool, its helpers globals)."""
    helper = compiled.device(lambda v: v + 1)
    scale, shape = 2.0, (3, np.int32(4))

    def over_constants(x):
        for i in range(x.shape[0]):
            x[i] *= scale + shape[1]

    compiled.kernel(over_constants)  # accepted

    def over_a_compiled_function(x):
        for i in range(x.shape[0]):
            x[i] = helper(x[i])

    with pytest.raises(TypeError, match="closes over helper"):
        compiled.kernel(over_a_compiled_function)


def test_flash_attention_split_over_heads_matches_one_block(rng, monkeypatch):
    """_by_heads gives each core a range of kv heads, each block pair's online softmax compiled
    for the calling core: the same bits as every head on one core."""
    B, H, T, D = 2, 4, 192, 16  # work enough for a block per core
    q, k, v, dout = (rng.standard_normal((B, H, T, D), dtype=F32) for _ in range(4))
    out, lse = cpu.flash_attention_fwd(q, k, v, 0.25)
    grads = cpu.flash_attention_bwd(q, k, v, out, lse, dout, 0.25)
    monkeypatch.setattr(runtime, "THREADS", 1)
    one_core = (
        *cpu.flash_attention_fwd(q, k, v, 0.25),
        *cpu.flash_attention_bwd(q, k, v, out, lse, dout, 0.25),
    )
    for got, want in zip((out, lse, *grads), one_core, strict=True):
        np.testing.assert_array_equal(got, want)


def _in_a_fresh_process(script, arg):
    """script's stdout, run with arg by a new Python whose pool no kernel has fixed yet, without
    this one's NUMBA_THREADING_LAYER or GOMP_SPINCOUNT."""
    import subprocess
    import sys

    unset = ("NUMBA_THREADING_LAYER", "GOMP_SPINCOUNT")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    run = subprocess.run(
        [sys.executable, "-c", script, arg], capture_output=True, text=True, env=env
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


POOL_SCRIPT = """
import sys
import numpy as np
from tinygrad_like.backend.cpu import compiled
layer = compiled.use_pool(sys.argv[1])
from tinygrad_like import kernels
from tinygrad_like.quant import quantize
cpu, rng = kernels.on("cpu"), np.random.default_rng(0)
x = rng.standard_normal((4096, 256), dtype=np.float32)
w = rng.standard_normal((3072, 768), dtype=np.float32)
qw = quantize(w, "int8")
y = cpu.layernorm_fwd(x, np.ones(256, np.float32), np.zeros(256, np.float32))[0]
x1 = rng.standard_normal((1, 768), dtype=np.float32)
q = cpu.qmatmul(x1, qw.codes, qw.scales, "int8", qw.group_size)
a = rng.standard_normal((2, 4, 256, 32), dtype=np.float32)
o = cpu.flash_attention_fwd(a, a, a, 0.2)[0]  # its kv heads in one in_parallel block a core
import threading
from tinygrad_like.backend.cpu.runtime import in_parallel
threads = set()
in_parallel(2, lambda lo, hi: threads.add(threading.get_ident()), blocks=2)
try:
    in_parallel(2, lambda lo, hi: 1 / lo, blocks=2)  # block 0 divides by zero
except ZeroDivisionError:
    threads.add("raised")
import numba
bits = (y.tobytes() + q.tobytes() + o.tobytes()).hex()
sys.stdout.write(f"{layer} {numba.threading_layer()} {bits} {len(threads)}")
"""


@pytest.mark.skipif(runtime.THREADS < 2, reason="one core: no kernel is handed to a pool")
def test_the_pool_changes_the_speed_never_the_bits():
    """compiled.use_pool picks the threads a parallel kernel is handed to, once per process:
    OpenMP's (a decode's cheap hand-off, where libgomp loads) or Numba's workqueue (the
    default); the kernels give the same bits on either. runtime.in_parallel's blocks run on two
    threads under either (OpenMP's own under OpenMP), and a block's error reaches the caller."""
    found = {}
    for pool in ("workqueue", "omp"):
        asked, used, bits, threads = _in_a_fresh_process(POOL_SCRIPT, pool).split()
        assert asked == used  # the pool asked for runs the kernels (or omp fell back, said so)
        assert threads == "3"  # two threads' idents and "raised"
        found[used] = bits
    assert len(set(found.values())) == 1


TRAINING_POOL_SCRIPT = """
import os, sys
from tinygrad_like.kernels.gemm.cpu_bf16 import use_training_pool
sys.stdout.write(use_training_pool(sys.argv[1]) + " " + str("GOMP_SPINCOUNT" in os.environ))
"""


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_a_training_step_takes_the_pool_of_whoever_runs_its_gemms(dtype):
    """OpenMP's pool where the step's GEMMs are cpu_bf16.py's compiled loops (bf16 on a CPU with
    the dot product), the workqueue where they are OpenBLAS's; libgomp's spin count is left to
    its default for training, and no GOMP_SPINCOUNT is left behind for a later library."""
    from tinygrad_like.kernels.gemm.cpu_bf16 import HAS_DOT

    pool, spin_left = _in_a_fresh_process(TRAINING_POOL_SCRIPT, dtype).split()
    compiled_gemms = HAS_DOT and dtype == "bf16"
    assert pool in (("omp", "workqueue") if compiled_gemms else ("workqueue",))  # no libgomp: wq
    assert spin_left == "False"


def test_a_kernel_compiles_on_a_thread_of_its_own():
    """A kernel's compile runs on a new thread (compiled._jit): Numba keeps a frame of some
    compiles alive after them, and a frame its callers', whose arrays then outlived the call (a
    step's measured peak changed with what the process had compiled before it: test_predictions
    run in its file's order). The compile's result and its error come back to the caller."""
    import threading

    from tinygrad_like.backend.cpu.compiled import _on_a_thread_of_its_own

    assert _on_a_thread_of_its_own(threading.get_ident) != threading.get_ident()
    with pytest.raises(ZeroDivisionError):
        _on_a_thread_of_its_own(lambda: 1 / 0)
