"""What the CUDA device needs that is not a kernel: the host functions (backend/host.py), loading
the .cu files of the kernel families (kernels/<family>/<family>.cu, and the sources a family
generates, kernels/<family>/cuda_source.py; common.cuh pasted in; NVRTC through cupy.RawModule,
the CUDA headers found), launch helpers, and the watcher of CuPy's memory pool.

Names, signatures, dtype rules and results are the CPU backend's (the reference). What a caller
can notice: launches are asynchronous (synchronize() or to_numpy() waits).

NVRTC needs a CUDA toolkit's headers (cuda_fp16.h, cuda_bf16.h), which CuPy finds in this
order: the nvidia-cuda-runtime wheel, conda, $CUDA_PATH or $CUDA_HOME (newer cuda-pathfinder
releases also the system's toolkit). When neither variable is set, importing this module sets
CUDA_PATH to the toolkit of the nvcc on PATH (_cuda_path_from_nvcc).
"""

import math
import os
import re
import shutil
import subprocess
from functools import lru_cache
from importlib import import_module
from pathlib import Path

import cupy
import numpy as np
from cupy.cuda.memory_hook import MemoryHook

from ... import dtypes

# kernels/<family>/<family>.cu, and the header every one of them includes, beside this module
KERNELS_DIR = Path(__file__).parents[2] / "kernels"
COMMON = Path(__file__).with_name("common.cuh")
CTYPES = {
    dtypes.float32: "float",
    dtypes.float16: "__half",
    dtypes.bfloat16: "__nv_bfloat16",
    dtypes.float64: "double",
}
# quant.cu's stored codes: bytes, and the bit patterns of bf16 / fp16 weights
CODE_CTYPES = {np.dtype(np.uint8): "unsigned char", np.dtype(np.uint16): "unsigned short"}
HALF = (dtypes.float16, dtypes.bfloat16)
TRAINING = tuple(dtypes.BY_NAME[n] for n in dtypes.TRAINING)  # dtypes with custom GEMMs/casts
NULL = np.uint64(0)  # a null pointer argument
BLOCK = 256  # threads per block of the flat and one-warp-per-row kernels


def supported_dtypes():
    """fp16 and bf16 run natively: tensor-core GEMMs, fp32-accumulating kernels."""
    return dtypes.TRAINING


# ---------------------------------------------------------------- what this device is
# (asked of the backend module, backend.get(name) or backend.of(array), never by its name)
HOLDS_VALUES = True  # its arrays have values to read back; its kernels run, and are timed
GPU = True  # a GPU run's training defaults; one GPU per rank, ranks talk over NCCL
HOST_MEMORY = False  # a GPU's memory of its own, one GPU per rank
GRAPHS = True  # a captured step replays as one CUDA graph where it can (capture_graph)
STEP_OPS = False  # its graphs hold the launches (GRAPHS)


def require_values(what):
    """Nothing: this device holds values (meta's raises NoValues)."""


def available_bytes():
    """The GPU's free memory."""
    return cupy.cuda.Device().mem_info[0]


def total_bytes():
    """The GPU's memory."""
    return cupy.cuda.Device().mem_info[1]


# ---------------------------------------------------------------- arrays and timing


def asarray(data, dtype=None):
    return cupy.asarray(data, dtype=dtype)


def to_numpy(a) -> np.ndarray:
    return cupy.asnumpy(a)


def empty(shape, dtype):
    return cupy.empty(shape, dtype=dtype)


def synchronize():
    cupy.cuda.Device().synchronize()


def device_name():
    """The current GPU's name, e.g. 'NVIDIA H200' (accounting/mfu.py picks its peak by it)."""
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else name


class _Timer:
    """CUDA events around a launch; .seconds() waits for the end event only when asked."""

    def __init__(self):
        self.start, self.end = cupy.cuda.Event(), cupy.cuda.Event()
        self.start.record()

    def stop(self):
        self.end.record()
        return self

    def seconds(self):
        self.end.synchronize()
        return cupy.cuda.get_elapsed_time(self.start, self.end) / 1e3


def start_timer():
    return _Timer()


_capturing = []  # the streams capture_graph is capturing on now


def capturing():
    """Whether a graph is being captured: the checks that read a device value on the host (a
    token id's range) are skipped then, as CUDA refuses the read; a replayed graph's inputs are
    the caller's to keep valid, as those of a CUDA graph in PyTorch."""
    return bool(_capturing)


def capture_graph(run):
    """run() captured on a stream of its own (CuPy's begin_capture, relaxed mode: a pool may
    grow inside it) into one CUDA graph; everything run() allocates comes from a memory pool of
    the graph's own, which no later allocation shares (a buffer freed inside run() is reused
    inside it, in the stream's order: what the graph's own order makes safe). A host read of a
    device value inside run() fails the capture (CUDA refuses it). -> (launcher, run()'s result):
    launcher() launches the graph on the current stream."""
    pool, stream = cupy.cuda.MemoryPool(), cupy.cuda.Stream(non_blocking=True)
    with cupy.cuda.using_allocator(pool.malloc), stream:
        stream.begin_capture()
        _capturing.append(stream)
        try:
            result = run()
        finally:
            _capturing.pop()
            graph = stream.end_capture()

    def launcher():
        graph.launch(cupy.cuda.get_current_stream())

    launcher.nbytes = pool.total_bytes  # and so the pool lives as long as the launcher
    return launcher, result


class PoolWatcher(MemoryHook):
    """Cross-checks memory.TRACKER against CuPy's real memory pool. Inside `with PoolWatcher() as
    w:` every pool allocation and free is seen; w.report() gives the pool's bytes in use now and
    at their peak (blocks rounded up to 512 bytes, as the pool hands them out) and the bytes the
    pool holds from the driver, to set beside TRACKER.total() and TRACKER.peak_total."""

    name = "PoolWatcher"

    def __init__(self):
        super().__init__()
        self.pool = cupy.get_default_memory_pool()
        self.used = self.peak = self.pool.used_bytes()
        self.live = {}  # pointer -> bytes, for blocks allocated while watching

    def malloc_postprocess(self, **kw):
        self.live[kw["mem_ptr"]] = kw["mem_size"]
        self.used += kw["mem_size"]
        self.peak = max(self.peak, self.used)

    def free_postprocess(self, **kw):
        self.used -= self.live.pop(kw["mem_ptr"], 0)

    def report(self):
        return {
            "used_bytes": self.used,
            "peak_used_bytes": self.peak,
            "pool_total_bytes": self.pool.total_bytes(),
        }


# ---------------------------------------------------------------- loading the .cu files


@lru_cache(maxsize=None)
def generated_sources():
    """filename -> text of the CUDA sources the families generate: each kernels/<family>/
    cuda_source.py's SOURCES (elementwise's expressions.cu, from the kernels' expressions),
    found by name as the .cu files are and imported on first use (they import no CuPy)."""
    root = __name__.split(".")[0]
    found = {}
    for path in sorted(KERNELS_DIR.glob("*/cuda_source.py")):
        found.update(import_module(f"{root}.kernels.{path.parent.name}.cuda_source").SOURCES)
    return found


def kernel_files():
    """The name of every family's .cu file and generated source (kernel_source's argument),
    sorted."""
    return sorted([p.name for p in KERNELS_DIR.glob("*/*.cu")] + list(generated_sources()))


def kernel_source(filename):
    """A family's .cu file (gemm.cu: kernels/gemm/gemm.cu) or generated source with common.cuh
    pasted over its #include line: one self-contained source, so CuPy's compile cache keys on
    everything the kernels depend on."""
    text = generated_sources().get(filename)
    if text is None:
        text = (KERNELS_DIR / Path(filename).stem / filename).read_text()
    return text.replace('#include "common.cuh"', COMMON.read_text())


def instances(source):
    """The template instances a .cu file lists (&name<args>) under #ifdef TG_CHECK_INSTANTIATE,
    spelled as compiled() names them (no whitespace but inside a type: `unsigned char`): the one
    list both NVRTC (name_expressions) and nvcc compile."""
    listing = source.split("#ifdef TG_CHECK_INSTANTIATE", 1)[1]
    return [
        re.sub(r"\s*([<>,])\s*", r"\1", " ".join(m.split()))
        for m in re.findall(r"&(\w+\s*<[^>]*>)", listing)
    ]


def _cuda_path_from_nvcc():
    """Point CUDA_PATH at the toolkit of the nvcc on PATH when neither CUDA_PATH nor CUDA_HOME
    is set and that toolkit has both headers. -> the folder set, or None.

    CuPy 14 ships no CUDA headers and NVRTC has none built in: CuPy passes -I<the folder of
    cuda_runtime.h> as cuda.pathfinder finds it (see above), and where it finds none every
    compile, CuPy's own kernels' too, fails with 'Failed to find CUDA headers'. CuPy asks once
    per process, so this runs at import, before anything is compiled. nvcc --dryrun prints the
    toolkit root it runs from (TOP), also through a wrapper script."""
    nvcc = shutil.which("nvcc")
    if os.environ.get("CUDA_PATH") or os.environ.get("CUDA_HOME") or nvcc is None:
        return None
    try:
        dryrun = subprocess.run(
            [nvcc, "--dryrun", "-E", "-x", "cu", os.devnull],
            capture_output=True,
            text=True,
            timeout=30,
        ).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    top = re.search(r"^#\$ TOP=(.+)$", dryrun, re.M)
    root = os.path.normpath(top.group(1).strip()) if top else None
    if root is None or not all(
        os.path.isfile(os.path.join(root, "include", h)) for h in ("cuda_fp16.h", "cuda_bf16.h")
    ):
        return None
    os.environ["CUDA_PATH"] = root
    return root


_cuda_path_from_nvcc()


@lru_cache(maxsize=None)
def compiled_module(filename):
    source = kernel_source(filename)
    return cupy.RawModule(code=source, options=("-std=c++17",), name_expressions=instances(source))


def _param(p):
    if isinstance(p, bool):
        return "true" if p else "false"
    if isinstance(p, int):
        return str(p)
    return CODE_CTYPES[np.dtype(p)] if np.dtype(p) in CODE_CTYPES else CTYPES[np.dtype(p)]


@lru_cache(maxsize=None)
def compiled(filename, kernel, *params):
    """The compiled instance kernel<params> (params: dtypes, code dtypes, bools, ints) of a .cu
    file."""
    return compiled_module(filename).get_function(
        f"{kernel}<{','.join(_param(p) for p in params)}>"
    )


def acc_type(dtype):
    """The NumPy scalar type of a kernel's acc_t<T> argument (fp32, or fp64 for fp64)."""
    return dtypes.compute_dtype(dtype).type


def blocks_for(n, per_block=BLOCK):
    return (n + per_block - 1) // per_block


def launch_flat(filename, kernel, params, n, *args):
    """Launch a one-thread-per-element kernel over n elements."""
    if n:
        compiled(filename, kernel, *params)((blocks_for(n),), (BLOCK,), args)


def launch_per_row(filename, kernel, dtype, rows, *args):
    """Launch a one-warp-per-row kernel: 8 rows per 256-thread block."""
    if rows:
        compiled(filename, kernel, dtype)((blocks_for(rows, BLOCK // 32),), (BLOCK,), args)


def f32(x):
    """2-byte float arrays as fp32 (anything else unchanged), as the CPU backend's f32."""
    return x.astype(dtypes.float32) if isinstance(x, cupy.ndarray) and x.dtype in HALF else x


# ---------------------------------------------------------------- row kernels


def as_rows(x):
    """x contiguous, with the (rows, C) the row kernels view it as (either may be 0)."""
    x = cupy.ascontiguousarray(x)
    return x, math.prod(x.shape[:-1]), x.shape[-1]


def check_same_dtype(*arrays):
    if len({a.dtype for a in arrays}) != 1:
        got = ", ".join(str(a.dtype) for a in arrays)
        raise TypeError(f"the CUDA kernel needs one dtype, got {got}")
