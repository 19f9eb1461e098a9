"""The roofline: the least time this machine could take for each kernel, and how close the kernels
come to it.

Peaks, measured once per machine and cached as JSON under ~/.cache/tinygrad_like/ (or
$XDG_CACHE_HOME/tinygrad_like/), in a file named by a fingerprint of the machine (CPU model,
usable cores, NumPy and its BLAS, the BLAS thread variables, the GPU's name): a changed machine
gets a new file. TG_REMEASURE_PEAKS=1 (or peaks(remeasure=True)) measures again, e.g. when the
first measurement ran beside a busy process. Every peak is the best of a few tries: a burst of
load elsewhere only ever lowers a measurement.
  matmul  GEMM FLOP/s per dtype. CPU: fp32, NumPy's BLAS on 1024^3 (training/mfu.py's test);
          the CPU backend computes fp16 and bf16 GEMMs in fp32, so fp32's peak is theirs too.
          GPU: cuBLAS (cupy.matmul) on 8192^3 in fp32 and fp16; bf16 is given fp16's rate
          (equal on NVIDIA's tensor cores since Ampere, mfu.DATASHEET_PEAKS; CuPy's cuBLAS
          path has no bf16).
  copy    a streaming copy of 256 MB (1 GB on a GPU) into another buffer, bytes = read + write:
          far over the caches, so it is DRAM's rate for a kernel that reads and writes.
  read    a streaming read of the same buffer: a max reduction, one compare per element, so
          the loads limit it (np.sum's pairwise adds reach only a third of it on a CPU).
  exp     exps per second: np.exp on float32 blocks of 64K (256 KB, in the core's L2, so exp
          is timed and not memory). NumPy's loops run on one thread, and the CPU backend runs
          its exp-heavy kernels on one block of rows per core (cpu._in_parallel): the rate is
          measured on one thread and on one per usable core, and the bound uses the higher
          (both are reported). A tanh counts as one exp (tanh = 1 - 2 / (exp(2x) + 1); NumPy's
          float32 tanh is no slower than its exp). Not measured on a GPU: its special function
          units evaluate exp far faster than memory can feed them, so exp never binds there.
  launch  the cheapest kernel call: the cheaper of the backend's add and copy on 1-element
          arrays, averaged over 2,000 back-to-back calls. On a GPU, the launch overhead (a
          few microseconds). A CPU has no launch: its floor is a Python call (copy's, well
          under a microsecond), so it binds almost nothing, and what a kernel's call costs
          beyond it (NumPy's dispatch, the thread pool's hand-off) is that kernel's own
          overhead, which shows as time lost to the roofline.
On a CPU copy and read are also measured on one thread and on one per core (one NumPy call
streams from one core, and a core alone may not saturate memory); each peak is the higher.

Bounds. A launch's roofline time is the largest of
  compute  FLOPs / the matmul peak of the run's dtype
  memory   bytes / the higher of the copy and read bandwidths (a kernel's bytes mix reads and
           writes; the two streams are the two ends of that mix, and a roof is the best seen)
  exp      exps (kernels.EXPS: one per element of GELU, per score of softmax and flash
           attention, per logit of cross-entropy) / the exp rate
  launch   the launch floor
and the bound is whichever gives it (ACCOUNTING.md's definition: FLOPs / peak, bytes /
bandwidth, a launch floor, and on a CPU the exp throughput). Every kernel's FLOPs meet the
matmul peak: for the GEMMs and flash attention (whose FLOPs are its block GEMMs) that is their
roof; an elementwise or row kernel does a handful of FLOPs per element and never meets it, so
its roof is bytes or exps, and how far its NumPy passes fall short of that is what its fraction
shows. The fraction of the bound = roofline time / measured time, 1 at the roof.
census() does this per launch and sums by kernel, so a kernel of many shapes (the decode
step's GEMMs, tiny and large) gets the sum of each launch's roof; the row's bound is the one
that holds most of that sum.
"""

import dataclasses
import datetime
import hashlib
import json
import math
import os
import platform
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from tinygrad_like import backend, dtypes

from . import mfu
from .tables import table

BOUNDS = ("compute", "memory", "exp", "launch")
METHOD = 2  # bumped whenever a measurement changes: older caches are not read
REMEASURE = "TG_REMEASURE_PEAKS"
BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
TRIES = 3  # each peak is the best of this many timed runs
STREAM_BYTES = {"cpu": 256 << 20, "cuda": 1 << 30}  # per buffer of the copy and read tests
GPU_GEMM = 8192  # n of the GPU's n^3 GEMM test
EXP_BLOCK, EXP_REPS = 1 << 16, 100  # 64K float32 per thread (L2-resident), 100 passes each
LAUNCHES = 2000  # back-to-back tiny launches of the launch test


@dataclasses.dataclass
class Peaks:
    device: str
    machine: str  # the machine in words (CPU, cores, NumPy and BLAS, GPU)
    matmul: dict  # dtype name -> GEMM FLOP/s
    copy_bw: float  # bytes/s of a streaming copy (read + write)
    read_bw: float  # bytes/s of a streaming read
    exp_rate: float  # exps/s the bound uses (0: exp is not a bound on this device)
    launch_s: float  # seconds of the cheapest kernel call
    how: dict  # peak -> how it was measured, in words
    when: str = ""  # when it was measured (UTC)

    @property
    def bandwidth(self):
        return max(self.copy_bw, self.read_bw)

    def flops(self, dtype="fp32"):
        """The GEMM peak for a dtype name; fp32's where none was measured for it (a CPU)."""
        return self.matmul.get(dtype, self.matmul["fp32"])

    def describe(self):
        rows = [
            (f"{name} matmul", f"{rate / 1e9:,.0f} GFLOP/s", self.how[f"matmul_{name}"])
            for name, rate in self.matmul.items()
        ]
        rows += [
            ("streaming copy", f"{self.copy_bw / 1e9:.1f} GB/s", self.how["copy"]),
            ("streaming read", f"{self.read_bw / 1e9:.1f} GB/s", self.how["read"]),
            ("exp", f"{self.exp_rate / 1e9:.2f} G/s" if self.exp_rate else "-", self.how["exp"]),
            ("launch floor", f"{self.launch_s * 1e6:.2f} us", self.how["launch"]),
        ]
        return "\n".join(
            [
                f"machine peaks: {self.machine} (measured {self.when}; cached, "
                f"{REMEASURE}=1 measures again)",
                table(("peak", "value", "how"), rows, "lrl"),
            ]
        )


# ---------------------------------------------------------------- bounds


def roofline_times(flops, nbytes, exps, peaks, dtype="fp32"):
    """-> {bound: the seconds that peak alone allows} for one launch."""
    return {
        "compute": flops / peaks.flops(dtype),
        "memory": nbytes / peaks.bandwidth,
        "exp": exps / peaks.exp_rate if peaks.exp_rate else 0.0,
        "launch": peaks.launch_s,
    }


def bound(flops, nbytes, exps, peaks, dtype="fp32"):
    """-> (the bound, the roofline time): the largest of roofline_times."""
    times = roofline_times(flops, nbytes, exps, peaks, dtype)
    name = max(times, key=times.get)
    return name, times[name]


def census(prof, peaks, dtype="fp32"):
    """prof.census()'s rows (a Profiler's), each with its bound, roofline_s (the sum over its
    launches), fraction (roofline / measured; None when untimed) and lost_s (measured -
    roofline), sorted by lost_s, most first: the top row is the next thing to fix."""
    rows = {r["kernel"]: dict(r, roofline_s=0.0) for r in prof.census()}
    by_bound = {name: dict.fromkeys(BOUNDS, 0.0) for name in rows}
    for launch in prof.launches:
        which, seconds = bound(launch.flops, launch.bytes, launch.exps, peaks, dtype)
        rows[launch.name]["roofline_s"] += seconds
        by_bound[launch.name][which] += seconds
    for name, r in rows.items():
        r["bound"] = max(by_bound[name], key=by_bound[name].get)
        r["fraction"] = r["roofline_s"] / r["seconds"] if r["seconds"] > 0 else None
        r["lost_s"] = r["seconds"] - r["roofline_s"]
    return sorted(rows.values(), key=lambda r: r["lost_s"], reverse=True)


# ---------------------------------------------------------------- the picture


def plot(series, peaks, path, dtype="fp32", title="roofline"):
    """The classic roofline picture into a PNG: each kernel of each census (series: [(label,
    census() rows)]) a point at (FLOPs per byte, achieved FLOP/s), its area its share of the
    step, under the measured roofs: memory bandwidth x intensity up to the matmul peak. An
    exp-bound kernel's ceiling depends on its FLOPs per exp, so it gets its own short dotted
    bar. Kernels with no FLOPs (copies, gathers) or no time have no place on log axes and are
    left out (the legend counts them); names label the kernels of 1% of their step or more."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peak, bw = peaks.flops(dtype), peaks.bandwidth
    drawn = [
        [r for r in rows if r["flops"] > 0 and r["bytes"] > 0 and r["seconds"] > 0]
        for _, rows in series
    ]
    intensities = [r["flops"] / r["bytes"] for rows in drawn for r in rows] or [peak / bw]
    x = np.logspace(
        math.log10(min(intensities) / 3), math.log10(max(max(intensities), peak / bw) * 10), 200
    )
    fig, ax = plt.subplots(figsize=(9, 6))
    ax.plot(
        x,
        np.minimum(peak, bw * x),
        "k-",
        lw=1.5,
        label=f"roofs: {bw / 1e9:.1f} GB/s, {dtype} matmul {peak / 1e9:,.0f} GFLOP/s",
    )
    for (label, rows), kept, color in zip(series, drawn, ("tab:blue", "tab:orange")):
        xs = [r["flops"] / r["bytes"] for r in kept]
        ys = [r["flops"] / r["seconds"] for r in kept]
        ax.scatter(
            xs,
            ys,
            s=[20 + 2000 * r["share"] for r in kept],
            color=color,
            alpha=0.6,
            label=f"{label} ({len(rows) - len(kept)} kernels without FLOPs not drawn)",
        )
        for r, xi, yi in zip(kept, xs, ys):
            if r["share"] >= 0.01:
                ax.annotate(
                    f"{r['kernel']} ({r['bound']})",
                    (xi, yi),
                    fontsize=7,
                    textcoords="offset points",
                    xytext=(5, -3),
                )
            if r["bound"] == "exp" and r["exps"]:
                ax.hlines(
                    r["flops"] / r["exps"] * peaks.exp_rate,
                    xi / 2,
                    xi * 2,
                    colors=color,
                    linestyles="dotted",
                )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (FLOPs per byte)",
        ylabel="achieved FLOP/s",
    )
    ax.set_title(f"{title}\n{peaks.machine}", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", markerscale=0.4)
    ax.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- peaks: cached


def usable_cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def fingerprint(device):
    """What decides the peaks: a change in any of these is another machine (and METHOD,
    another measurement)."""
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    out = {
        "cpu": cpu_name(),
        "cores": usable_cores(),
        "numpy": np.__version__,
        "blas": f"{blas.get('name')} {blas.get('version')}",
        "env": {k: os.environ[k] for k in BLAS_ENV if k in os.environ},
        "device": device,
        "method": METHOD,
    }
    if device == "cuda":
        out["gpu"] = backend.get("cuda").device_name()
    return out


def cpu_name():
    """The model name with its family and model numbers (a VM's name is often only "Intel(R)
    Xeon(R) Processor") and AVX-512 when the CPU has it."""
    try:
        with open("/proc/cpuinfo") as f:
            info = dict(
                line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line
            )
    except OSError:
        return platform.processor() or platform.machine()
    info = {k.strip(): v.strip() for k, v in info.items()}
    avx512 = ", AVX-512" if "avx512f" in info.get("flags", "").split() else ""
    return (
        f"{info.get('model name', platform.machine())} (family {info.get('cpu family')} "
        f"model {info.get('model')}{avx512})"
    )


def cache_path(device):
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tinygrad_like"
    key = hashlib.sha1(json.dumps(fingerprint(device), sort_keys=True).encode()).hexdigest()
    return root / f"peaks-{device}-{key[:12]}.json"


def peaks(device="cpu", remeasure=None):
    """This machine's Peaks for a device: from the cache, or measured (a few seconds) and
    cached. remeasure None: measure when $TG_REMEASURE_PEAKS is set (and not 0)."""
    if remeasure is None:
        remeasure = os.environ.get(REMEASURE, "0") not in ("", "0")
    path = cache_path(device)
    if not remeasure and path.is_file():
        try:
            return Peaks(**json.loads(path.read_text()))
        except (ValueError, TypeError):  # a cache of another version, or cut short
            pass
    measured = measure(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(measured), indent=1))
    tmp.replace(path)  # whole or not at all, should two runs race
    return measured


# ---------------------------------------------------------------- peaks: measured


def measure(device="cpu"):
    fp = fingerprint(device)
    machine = f"{fp['cpu']}, {fp['cores']} usable cores, NumPy {fp['numpy']} ({fp['blas']})"
    if device == "cuda":
        machine = f"{fp['gpu']} on {machine}"
    found = _measure_cuda() if device == "cuda" else _measure_cpu(fp["cores"])
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return Peaks(device=device, machine=machine, when=when, **found)


def _best(be, fn, tries=TRIES):
    """The fastest of `tries` calls of fn on backend be's clock (perf_counter on a CPU, CUDA
    events on a GPU), after one warm-up call."""
    fn()
    best = math.inf
    for _ in range(tries):
        timer = be.start_timer()
        fn()
        timer.stop()
        best = min(best, timer.seconds())
    return best


def _launch_floor(be, xp):
    """Seconds per call of the cheaper of the backend's add and copy on 1-element arrays."""
    one = xp.ones(1, dtype=np.float32)
    return (
        min(
            _best(be, lambda: [kernel(one, one) for _ in range(LAUNCHES)])
            for kernel in (be.add, be.copy)
        )
        / LAUNCHES
    )


def _measure_cpu(cores):
    be = backend.get("cpu")
    matmul = max(mfu.measure_cpu_matmul_peak() for _ in range(TRIES))
    src = np.ones(STREAM_BYTES["cpu"] // 4, dtype=np.float32)
    dst = np.empty_like(src)
    blocks = np.random.default_rng(0).standard_normal((cores, EXP_BLOCK), dtype=np.float32)
    outs = np.empty_like(blocks)

    def exps(i):
        for _ in range(EXP_REPS):
            np.exp(blocks[i], out=outs[i])

    copy, read, exp = {}, {}, {}
    with ThreadPoolExecutor(cores) as pool:
        for n in sorted({1, cores}):  # one thread, then one per core
            srcs, dsts = np.array_split(src, n), np.array_split(dst, n)
            copy[n] = 2 * src.nbytes / _best(be, lambda: list(pool.map(np.copyto, dsts, srcs)))
            read[n] = src.nbytes / _best(be, lambda: list(pool.map(np.max, srcs)))
            exp[n] = n * EXP_REPS * EXP_BLOCK / _best(be, lambda: list(pool.map(exps, range(n))))

    def per_threads(rates, unit, scale):
        return (
            ", ".join(
                f"{n} thread{'s' if n > 1 else ''} {r / scale:.2f} {unit}" for n, r in rates.items()
            )
            + "; the higher is the peak"
        )

    stream = f"{STREAM_BYTES['cpu'] >> 20} MB float32"
    return {
        "matmul": {"fp32": matmul},
        "copy_bw": max(copy.values()),
        "read_bw": max(read.values()),
        "exp_rate": max(exp.values()),
        "launch_s": _launch_floor(be, np),
        "how": {
            "matmul_fp32": f"np.matmul 1024^3 fp32, best of {TRIES} x 5 (fp16/bf16 "
            "GEMMs run in fp32 on the CPU backend)",
            "copy": f"np.copyto {stream}, read + write: " + per_threads(copy, "GB/s", 1e9),
            "read": f"np.max over {stream}: " + per_threads(read, "GB/s", 1e9),
            "exp": f"np.exp, {EXP_BLOCK >> 10}K float32 per thread in L2: "
            + per_threads(exp, "G/s", 1e9),
            "launch": f"cpu.add or cpu.copy (the cheaper) on 1-element arrays, mean "
            f"of {LAUNCHES} calls (Python + NumPy dispatch)",
        },
    }


def _gpu_gemm_rate(be, cupy, dtype):
    a = cupy.ones((GPU_GEMM, GPU_GEMM), dtype=dtype)  # the values do not change the speed
    out = cupy.empty_like(a)
    return 2 * GPU_GEMM**3 / _best(be, lambda: cupy.matmul(a, a, out=out))


def _measure_cuda():
    import cupy

    be = backend.get("cuda")
    matmul = {name: _gpu_gemm_rate(be, cupy, dtypes.BY_NAME[name]) for name in ("fp32", "fp16")}
    matmul["bf16"] = matmul["fp16"]
    src = cupy.ones(STREAM_BYTES["cuda"] // 4, dtype=np.float32)
    dst = cupy.empty_like(src)
    copy = 2 * src.nbytes / _best(be, lambda: cupy.copyto(dst, src))
    read = src.nbytes / _best(be, lambda: src.max())
    stream = f"{STREAM_BYTES['cuda'] >> 20} MB float32, CUDA events, best of {TRIES}"
    gemm = f"cupy.matmul (cuBLAS) {GPU_GEMM}^3, CUDA events, best of {TRIES}"
    return {
        "matmul": matmul,
        "copy_bw": copy,
        "read_bw": read,
        "exp_rate": 0.0,
        "launch_s": _launch_floor(be, cupy),
        "how": {
            "matmul_fp32": gemm,
            "matmul_fp16": gemm,
            "matmul_bf16": "fp16's rate (same tensor-core rate; CuPy has no bf16 GEMM)",
            "copy": f"cupy.copyto {stream}, read + write",
            "read": f"cupy max over {stream}",
            "exp": "not a bound on a GPU (special function units outrun memory)",
            "launch": f"cuda.add or cuda.copy (the cheaper) on 1-element arrays, "
            f"mean of {LAUNCHES} back-to-back launches (CUDA events)",
        },
    }
