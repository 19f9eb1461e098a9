"""The machine a benchmark runs on: CPU, NumPy's BLAS, the GPU, torch's matmul rate beside
NumPy's, and how much of the CPUs other processes took while a step ran (the noise on a shared
VM). The peaks MFU and the roofline divide by are tinygrad_like/peaks.py's."""

import os
import platform
import time

import numba
import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from tinygrad_like import backend, gemm_library, peaks

BLAS_ENV = peaks.BLAS_ENV + ("OMP_WAIT_POLICY",)  # the peaks' variables, and OpenMP's spinning
QUIET = peaks.QUIET  # a step is "quiet" while other processes use under 10% of the CPUs

_thread_limit = []  # keeps a threadpoolctl limit alive for the whole run


def set_threads(n, torch=None):
    """Limit BLAS (through threadpoolctl) and torch to n threads; None leaves the defaults."""
    if n is None:
        return
    _thread_limit.append(threadpool_limits(limits=n))
    if torch is not None:
        torch.set_num_threads(n)


# ---------------------------------------------------------------- what the machine is


def environment_info(torch=None, device="cpu"):
    """CPU, NumPy and its BLAS (kernel set, threads), the BLAS variables, torch's threads and,
    on a GPU, its name and the CuPy and torch CUDA versions."""
    info = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpu": peaks.cpu_name(),
        "logical_cpus": os.cpu_count(),
        "affinity_cpus": peaks.usable_cores(),
        "env": {k: os.environ[k] for k in BLAS_ENV if k in os.environ},
        "blas": _blas_info(),
        "numba_pool": numba.config.THREADING_LAYER,  # compiled.py use_pool's (first kernel's)
        "gemm_library": gemm_library.in_use().describe(),
        "load_average": loadavg(),
    }
    if torch is not None:
        info["torch"] = {
            "version": torch.__version__,
            "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
            "mkldnn": bool(torch.backends.mkldnn.is_available()),
            "blas": _torch_blas(torch),
        }
    if backend.get(device).GPU:
        import cupy

        info["gpu"] = {
            "name": backend.get("cuda").device_name(),
            "cupy": cupy.__version__,
            "torch_cuda": torch.version.cuda if torch is not None else None,
        }
    return info


def loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def _blas_info():
    """threadpoolctl's view of the loaded BLAS (kernel set, threads)."""
    keep = (
        "internal_api",
        "prefix",
        "version",
        "architecture",
        "num_threads",
        "threading_layer",
        "filepath",
    )
    return {
        "source": "threadpoolctl",
        "libraries": [{k: v for k, v in lib.items() if k in keep} for lib in threadpool_info()],
    }


def _torch_blas(torch):
    cfg = torch.__config__.show()
    for name in ("Math Kernel Library", "OpenBLAS"):
        if name in cfg:
            return "MKL" if name.startswith("Math") else name
    return "unknown"


def _blas_words(lib):
    """'0.3.31, kernel set Haswell, 2 threads (libopenblas.so)': what is known of one BLAS."""
    words = [
        lib.get("version"),
        lib.get("architecture") and f"kernel set {lib['architecture']}",
        lib.get("num_threads") and f"{lib['num_threads']} threads",
    ]
    text = ", ".join(w for w in words if w)
    return text + (f" ({os.path.basename(lib['filepath'])})" if lib.get("filepath") else "")


def format_environment(info, peak_name):
    lines = [
        f"machine: {info['cpu']}, {info['logical_cpus']} logical CPUs "
        f"({info['affinity_cpus']} usable), Python {info['python']}, NumPy {info['numpy']}"
    ]
    for lib in info["blas"]["libraries"]:
        lines.append(f"  {lib.get('internal_api')}: " + _blas_words(lib))
    lines.append(f"  compiled kernels' pool: {info['numba_pool']} (compiled.py use_pool)")
    lines.append(f"  ours' {info['gemm_library']}")
    env = info["env"]
    lines.append(
        "  BLAS variables: "
        + (", ".join(f"{k}={v}" for k, v in env.items()) if env else "none set")
    )
    if "OPENBLAS_CORETYPE" in env:
        lines.append(
            "  note: OPENBLAS_CORETYPE names the kernels OpenBLAS loads in place of those it "
            "would pick for this CPU; ours' GEMMs run on the set the GEMM library's measurement "
            "chose (its AVX-512 kernels where the CPU has them: gemm_library.py)"
        )
    if "torch" in info:
        t = info["torch"]
        lines.append(
            f"  torch {t['version']} ({t['blas']}, mkldnn {t['mkldnn']}): "
            f"{t['threads']} threads, {t['interop_threads']} inter-op"
        )
    if "gpu" in info:
        g = info["gpu"]
        lines.append(f"  GPU: {g['name']}, CuPy {g['cupy']}, torch CUDA {g['torch_cuda']}")
    lines.append(f"  MFU divides by the {peak_name}")
    if info["load_average"]:
        lines.append(
            "  load average at start: " + " ".join(f"{x:.2f}" for x in info["load_average"])
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- torch's matmul


def torch_matmul_rate(torch, n=peaks.CPU_GEMM, tries=peaks.CPU_GEMM_TRIES):
    """peaks.cpu_matmul_rate's test through torch's BLAS (for reference beside NumPy's)."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g) for _ in range(2))
    out = torch.empty(n, n)
    return 2 * n**3 / peaks.best_seconds(lambda: torch.mm(a, b, out=out), tries)


# ---------------------------------------------------------------- noise


def timed(fn):
    """-> (fn(), wall seconds, share of the CPUs other processes took meanwhile). fn must
    finish its device work before it returns."""
    s0, t0 = peaks.cpu_times(), time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    return out, wall, peaks.others_share(s0, peaks.cpu_times(), wall)


def quiet(samples, key=lambda s: s):
    """The samples taken while other processes used under QUIET of the CPUs, when at least
    3 (or a third) of them were; otherwise all of them (and the report says so)."""
    calm = [s for s in samples if not key(s)[1] > QUIET]  # NaN (no /proc) counts as calm
    return (calm, True) if len(calm) >= max(3, len(samples) // 3) else (samples, False)
