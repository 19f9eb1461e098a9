"""The machine's peaks: the rates no kernel beats here, measured once per machine and cached.

Every consumer reads the same cached numbers: MFU's divisor on a CPU (accounting/mfu.py: the
trainer's progress bar and metrics.jsonl, the accounting report, scripts/bench.py), the roofline
(accounting/roofline.py) and the labs. get(device) returns them from a JSON file under
~/.cache/tinygrad_like/ (or $XDG_CACHE_HOME/tinygrad_like/) named by a fingerprint of the
machine (CPU model, usable cores, NumPy and its BLAS, the BLAS variables, the GPU's name): a
changed machine gets a new file. A process reads them once: every figure of one report divides
by the same peaks, even under TG_REMEASURE_PEAKS=1 (or get(remeasure=True)), which measures
again, replacing the file, once per process.

Honest peaks. Every peak is the best of a few tries: a burst of load elsewhere only ever lowers
a measurement. A CPU measurement also records the share of the usable cores' time that other
processes took meanwhile (/proc/stat); above QUIET it is marked busy (describe() says so, and
the MFU's phrase), since a peak measured low makes every MFU and roofline fraction high. The
next process that reads a busy file measures again and keeps, peak by peak, the best of the
measurements (the latest is not kept as it is: it may be busy too, and a busy core only ever
lowers a rate and lengthens a call, so the best seen is the nearest to the machine's), up to
BUSY_MEASUREMENTS of them; a quiet measurement clears the mark. And a run whose own GEMMs beat
the matmul peak raises it (beaten(): the accounting report does this with its profiled step's
GEMMs, and says so), since no peak can be below what a kernel reached.
  matmul  GEMM FLOP/s per dtype. CPU: fp32, NumPy's BLAS on 1024^3 (cpu_matmul_rate; the best of
          OpenBLAS's kernel sets the GEMMs may run on here, kernels/gemm/cpu_blas.py), which is
          fp16's and bf16's peak too until a run's own GEMMs in that dtype beat it (beaten():
          bf16 by AVX-512 BF16's dot products, twice fp32's multiply-adds per instruction),
          then the dtype's own entry; a 2-byte GEMM never raises fp32's.
          GPU: cuBLAS (cupy.matmul) on 8192^3 in fp32 and fp16; bf16 is given fp16's rate
          (equal on NVIDIA's tensor cores since Ampere, DATASHEET_PEAKS; CuPy's cuBLAS path
          has no bf16).
  copy    a streaming copy of 256 MB (1 GB on a GPU) into another buffer, bytes = read + write:
          far over the caches, so it is DRAM's rate for a kernel that reads and writes.
  read    a streaming read of the same buffer: a max reduction, one compare per element, so
          the loads limit it (np.sum's pairwise adds reach only a third of it on a CPU).
  exp     exps per second on float32 blocks of 64K (256 KB, in the core's L2, so exp is timed
          and not memory), by np.exp and by our exp kernel (cpu.unary_fwd's, vector_math.py's
          exp in fused multiply-adds), each into its output: the faster is the machine's, as a
          GEMM peak is the best GEMM (on a CPU without AVX-512 NumPy's float32 exp can run well
          behind ours, and a roof from it alone put exp-bound kernels over 100% of it).
          NumPy's loops and our kernel at this size run on one thread, and the CPU backend runs
          its exp-heavy kernels on one block of rows per core (cpu._in_parallel): the rate is
          measured on one thread and on one per usable core, and the bound uses the higher
          (all are reported). A tanh counts as one exp (tanh = 1 - 2 / (exp(2x) + 1), as our
          kernels take it). Not measured on a GPU: its special function units evaluate exp far
          faster than memory can feed them, so exp never binds there.
  launch  the cheapest kernel call: the cheaper of the backend's add and copy on 1-element
          arrays, averaged over 2,000 back-to-back calls. On a GPU, the launch overhead (a
          few microseconds). A CPU has no launch: its floor is a Python call (copy's, well
          under a microsecond), so it binds almost nothing, and what a kernel's call costs
          beyond it (NumPy's dispatch, the thread pool's hand-off) is that kernel's own
          overhead, which shows as time lost to the roofline.
On a CPU copy and read are also measured on one thread and on one per core (one NumPy call
streams from one core, and a core alone may not saturate memory); each peak is the higher.

A GPU's MFU is quoted against its datasheet's dense rate (DATASHEET_PEAKS, datasheet()), the
convention MFU figures are compared in; the measured cuBLAS rate is the roofline's compute roof.
"""

import dataclasses
import datetime
import hashlib
import json
import math
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from . import backend, dtypes, kernels
from .files import atomic_write, read_small
from .kernels.elementwise import numba_source
from .kernels.elementwise.spec import unary_op
from .kernels.gemm import cpu_blas

METHOD = 6  # bumped whenever a measurement changes: older caches are not read (4: a bf16
# run's GEMMs had raised the CPU's fp32 peak; 5: exp's rate is also our own exp kernel's;
# 6: the matmul is the best of OpenBLAS's kernel sets the GEMMs may run on)
REMEASURE = "TG_REMEASURE_PEAKS"
# the environment that changes which BLAS kernels run, and on how many threads
BLAS_ENV = (
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
)
TRIES = 3  # each peak is the best of this many timed runs
QUIET = 0.10  # a measurement is busy when other processes took more of the usable cores' time
BUSY_MEASUREMENTS = 3  # measured again while busy, by each new process, up to this many times
CPU_GEMM, CPU_GEMM_TRIES = 1024, 15  # n of the CPU's n^3 GEMM test, and its timed calls
STREAM_BYTES = {"cpu": 256 << 20, "cuda": 1 << 30}  # per buffer of the copy and read tests
GPU_GEMM = 8192  # n of the GPU's n^3 GEMM test
EXP_BLOCK, EXP_REPS = 1 << 16, 100  # 64K float32 per thread (L2-resident), 100 passes each
LAUNCHES = 2000  # back-to-back tiny launches of the launch test
CACHE_BYTES = 64 << 10  # a cache file's largest size (it holds about 1 KB)

# dense tensor-core peaks from NVIDIA's datasheets (FLOP/s), by a substring of the device name
DATASHEET_PEAKS = {
    "H200": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
}


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
    others: float = None  # the share of the cores' time other processes took (None: not known)
    measurements: int = 1  # how many measurements the peaks are the best of

    @property
    def busy(self):
        """Measured while other processes took more than QUIET of the CPUs: maybe too low."""
        return self.others is not None and self.others > QUIET

    def condition(self):
        """How the peaks were measured, for a phrase: the load beside them, how many times."""
        if self.others is None:
            return ""
        times = f"best of {self.measurements} measurements; " if self.measurements > 1 else ""
        if self.busy:
            return (
                f"{times}BUSY: other processes took {self.others:.0%} of the CPUs while they "
                f"were measured, so they may be low (and MFU high); measured again by the next "
                f"process, up to {BUSY_MEASUREMENTS} times"
            )
        return f"{times}other processes took {self.others:.0%} of the CPUs meanwhile"

    @property
    def bandwidth(self):
        return max(self.copy_bw, self.read_bw)

    def flops(self, dtype="fp32"):
        """The GEMM peak for a dtype name; fp32's where none was measured for it (a CPU)."""
        return self.matmul.get(dtype, self.matmul["fp32"])

    def describe(self):
        """The peaks as a table: name, value, how it was measured."""
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
        condition = self.condition()
        head = (
            f"machine peaks: {self.machine} (measured {self.when}"
            + (f"; {condition}" if condition else "")
            + f"; cached, {REMEASURE}=1 measures again)"
        )
        rows.insert(0, ("peak", "value", "how"))
        wide = [max(len(row[i]) for row in rows) for i in (0, 1)]  # of the name and value columns
        return "\n".join(
            [head]
            + [f"  {name:<{wide[0]}}  {value:>{wide[1]}}  {how}" for name, value, how in rows]
        )


def datasheet(dtype_name, gpu_name):
    """-> (a GPU's datasheet dense FLOP/s for a dtype, a phrase naming it); an unknown GPU is
    assumed to be an H100 in bf16."""
    for key, rates in DATASHEET_PEAKS.items():
        if key in gpu_name:
            rate = rates[dtype_name]
            return rate, f"{key} datasheet dense {dtype_name}, {rate / 1e12:.0f} TFLOP/s"
    rate = DATASHEET_PEAKS["H100"]["bf16"]
    return rate, f"unknown GPU {gpu_name!r}: assumed H100 dense bf16, {rate / 1e12:.0f} TFLOP/s"


# ---------------------------------------------------------------- the machine, cached


def usable_cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


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
    if backend.get(device).GPU:
        out["gpu"] = backend.get(device).device_name()
    return out


def cache_path(device):
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tinygrad_like"
    key = hashlib.sha1(json.dumps(fingerprint(device), sort_keys=True).encode()).hexdigest()
    return root / f"peaks-{device}-{key[:12]}.json"


_READ = {}  # cache file -> the Peaks this process read or measured: one set per process


def get(device="cpu", remeasure=None):
    """This machine's Peaks for a device, the same for the whole process: from the cache, or
    measured (a few seconds) and cached; a busy cache measured again (see the module's
    docstring). remeasure None: measure when $TG_REMEASURE_PEAKS is set (and not 0), once per
    process; True: measure now, replacing the file's peaks."""
    path = cache_path(device)
    if remeasure is None:
        if path in _READ:
            return _READ[path]
        remeasure = os.environ.get(REMEASURE, "0") not in ("", "0")
    cached = None if remeasure else _read(path)
    if cached is None or (cached.busy and cached.measurements < BUSY_MEASUREMENTS):
        found = measure(device)
        _store(path, found if cached is None else best_of(cached, found))
    else:
        _READ[path] = cached
    return _READ[path]


def beaten(device, dtype_name, rate, what):
    """A run's own GEMM reached rate FLOP/s in dtype_name (what: which, in words). When that
    beats the dtype's matmul peak (Peaks.flops: fp32's where the dtype has none of its own),
    the dtype's peak becomes that rate, in the cache and for the rest of this process; other
    dtypes' peaks stay. -> (the Peaks now, a line saying what was raised, or None)."""
    peaks = get(device)
    key, old = dtype_name, peaks.flops(dtype_name)
    if rate <= old:
        return peaks, None
    how = f"raised to a run's own GEMM, {what} (measured: {old / 1e9:,.0f} GFLOP/s)"
    raised = dataclasses.replace(
        peaks, matmul={**peaks.matmul, key: rate}, how={**peaks.how, f"matmul_{key}": how}
    )
    _store(cache_path(device), raised)
    return raised, (
        f"note: this run's {what} reached {rate / 1e9:,.1f} GFLOP/s, above the cached {key} "
        f"matmul peak of {old / 1e9:,.1f} (measured {peaks.when}): the peak is raised to it"
    )


def best_of(a, b):
    """Two measurements of one machine's Peaks -> each peak the better of the two, with how it
    was measured: the higher rate, the lower launch floor."""
    fields = {"copy_bw": "copy", "read_bw": "read", "exp_rate": "exp"}
    how = dict(b.how)
    best = {}
    for field, name in fields.items():
        winner = a if getattr(a, field) > getattr(b, field) else b
        best[field], how[name] = getattr(winner, field), winner.how[name]
    launch = a if a.launch_s < b.launch_s else b
    matmul = {}
    for dtype, rate in b.matmul.items():
        winner = a if a.matmul.get(dtype, 0) > rate else b
        matmul[dtype], how[f"matmul_{dtype}"] = winner.matmul[dtype], winner.how[f"matmul_{dtype}"]
    shares = [x.others for x in (a, b) if x.others is not None]
    return dataclasses.replace(
        b,
        matmul=matmul,
        launch_s=launch.launch_s,
        how={**how, "launch": launch.how["launch"]},
        others=min(shares) if shares else None,
        measurements=a.measurements + b.measurements,
        **best,
    )


def _read(path):
    """The Peaks of a cache file, or None (missing, of another version, cut short, over a small
    file's size, or holding a field of the wrong type or out of range: measured again)."""
    try:
        peaks = Peaks(**json.loads(read_small(path, CACHE_BYTES)))
    except (OSError, ValueError, TypeError):
        return None
    return peaks if _sound(peaks) else None


def _sound(peaks):
    """Whether every field of cached peaks has its type and a rate's range: the cache is a file
    anyone could have written, read as untrusted input."""
    rates = [*peaks.matmul.values(), peaks.copy_bw, peaks.read_bw, peaks.launch_s]
    numbers = rates + [peaks.exp_rate] + ([] if peaks.others is None else [peaks.others])
    return (
        isinstance(peaks.matmul, dict)
        and "fp32" in peaks.matmul
        and all(isinstance(x, (int, float)) and math.isfinite(x) for x in numbers)
        and all(x > 0 for x in rates)
        and peaks.exp_rate >= 0
        and (peaks.others is None or 0 <= peaks.others <= 1)
        and isinstance(peaks.measurements, int)
        and peaks.measurements >= 1
        and all(isinstance(v, str) for v in (peaks.device, peaks.machine, peaks.when))
        and isinstance(peaks.how, dict)
        and all(isinstance(v, str) for v in peaks.how.values())
    )


def _store(path, peaks):
    """Write peaks to the cache file and keep them for this process."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # whole or not at all, should two runs (or the ranks of one) race
    atomic_write(path, json.dumps(dataclasses.asdict(peaks), indent=1).encode())
    _READ[path] = peaks


# ---------------------------------------------------------------- the load beside a measurement


def cpu_times():
    """(seconds the machine's CPUs were busy, seconds this process ran, all its threads).
    Their differences over a span tell this process's load from other processes'."""
    busy = float("nan")
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]  # user .. steal
        busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait
    except (OSError, ValueError, IndexError):
        pass
    t = os.times()
    return busy, t.user + t.system


def others_share(before, after, wall):
    """The share of the usable cores' time that other processes took during wall seconds
    between two cpu_times() (0: this process had the machine; NaN where /proc/stat is
    missing)."""
    other = (after[0] - before[0]) - (after[1] - before[1])
    return max(other, 0.0) / (wall * usable_cores()) if wall > 0 else 0.0


# ---------------------------------------------------------------- measured


def measure(device="cpu"):
    """The peaks measured now; on a CPU with the share of it other processes took meanwhile."""
    fp = fingerprint(device)
    machine = f"{fp['cpu']}, {fp['cores']} usable cores, NumPy {fp['numpy']} ({fp['blas']})"
    if backend.get(device).GPU:
        machine = f"{fp['gpu']} on {machine}"
        found, others = _measure_cuda(), None  # a GPU's contention is not a CPU share
    else:
        before, t0 = cpu_times(), time.perf_counter()
        found = _measure_cpu(fp["cores"])
        others = others_share(before, cpu_times(), time.perf_counter() - t0)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    known = others if others is not None and math.isfinite(others) else None
    return Peaks(device=device, machine=machine, when=when, others=known, **found)


def best_seconds(fn, tries=TRIES, be=None):
    """The fastest of `tries` calls of fn after one warm-up call, on backend be's clock (CUDA
    events on a GPU; perf_counter for the CPU backend, the default)."""
    be = be or backend.get("cpu")
    fn()
    best = math.inf
    for _ in range(tries):
        timer = be.start_timer()
        fn()
        timer.stop()
        best = min(best, timer.seconds())
    return best


def cpu_matmul_rate(n=CPU_GEMM, tries=CPU_GEMM_TRIES):
    """-> {OpenBLAS's kernel set: the fp32 GEMM FLOP/s NumPy's BLAS reaches with it here on n x n
    operands}, for each set the GEMMs may run on (cpu_blas.openblas_cores(); one entry, None,
    for a BLAS that names none): the best is the CPU's practical peak, since no datasheet
    number describes a laptop's sustained AVX throughput."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    out = np.empty((n, n), np.float32)
    rates = {}
    for core in cpu_blas.openblas_cores():
        with cpu_blas.openblas_core(core):
            rates[core] = 2 * n**3 / best_seconds(lambda: np.matmul(a, b, out=out), tries)
    return rates


def _launch_floor(be, xp):
    """Seconds per call of the cheaper of the backend's add and copy on 1-element arrays."""
    one = xp.ones(1, dtype=np.float32)
    return (
        min(
            best_seconds(lambda: [kernel(one, one) for _ in range(LAUNCHES)], be=be)
            for kernel in (kernels.on(be).add, kernels.on(be).copy)
        )
        / LAUNCHES
    )


def _measure_cpu(cores):
    be = backend.get("cpu")
    gemm = cpu_matmul_rate()
    # (bytes,) float32 streams, and (cores, EXP_BLOCK) blocks: one per thread of the exp test
    src = np.ones(STREAM_BYTES["cpu"] // 4, dtype=np.float32)
    dst = np.empty_like(src)
    blocks = np.random.default_rng(0).standard_normal((cores, EXP_BLOCK), dtype=np.float32)
    outs = np.empty_like(blocks)

    ours = numba_source.compiled(unary_op("exp")[0].name, False)  # cpu.unary_fwd's exp kernel
    exp_by = {  # one block's exps into its output, NumPy's and ours
        "np.exp": lambda i: np.exp(blocks[i], out=outs[i]),
        "our exp kernel": lambda i: ours(blocks[i], outs[i]),
    }

    def repeated(one_block):  # EXP_REPS passes over thread i's block
        def passes(i):
            for _ in range(EXP_REPS):
                one_block(i)

        return passes

    copy, read, exp = {}, {}, {way: {} for way in exp_by}
    with ThreadPoolExecutor(cores) as pool:
        for n in sorted({1, cores}):  # one thread, then one per core
            srcs, dsts = np.array_split(src, n), np.array_split(dst, n)
            copy[n] = 2 * src.nbytes / best_seconds(lambda: list(pool.map(np.copyto, dsts, srcs)))
            read[n] = src.nbytes / best_seconds(lambda: list(pool.map(np.max, srcs)))
            for way, one_block in exp_by.items():
                seconds = best_seconds(lambda: list(pool.map(repeated(one_block), range(n))))
                exp[way][n] = n * EXP_REPS * EXP_BLOCK / seconds

    def per_threads(rates, unit, scale):
        return ", ".join(
            f"{n} thread{'s' if n > 1 else ''} {r / scale:.2f} {unit}" for n, r in rates.items()
        )

    stream = f"{STREAM_BYTES['cpu'] >> 20} MB float32"
    return {
        "matmul": {"fp32": max(gemm.values())},
        "copy_bw": max(copy.values()),
        "read_bw": max(read.values()),
        "exp_rate": max(max(rates.values()) for rates in exp.values()),
        "launch_s": _launch_floor(be, np),
        "how": {
            "matmul_fp32": f"np.matmul {CPU_GEMM}^3 fp32, best of {CPU_GEMM_TRIES}"
            + "".join(f"; OpenBLAS {k} {v / 1e9:,.0f} GFLOP/s" for k, v in gemm.items() if k)
            + " (fp16's and bf16's too, until a run's own GEMMs in them beat it)",
            "copy": f"np.copyto {stream}, read + write: "
            + per_threads(copy, "GB/s", 1e9)
            + "; the higher is the peak",
            "read": f"np.max over {stream}: "
            + per_threads(read, "GB/s", 1e9)
            + "; the higher is the peak",
            "exp": f"{EXP_BLOCK >> 10}K float32 per thread in L2: "
            + "; ".join(f"{way} " + per_threads(rates, "G/s", 1e9) for way, rates in exp.items())
            + "; the highest is the peak",
            "launch": f"cpu.add or cpu.copy (the cheaper) on 1-element arrays, mean "
            f"of {LAUNCHES} calls (Python + NumPy dispatch)",
        },
    }


def _gpu_gemm_rate(be, cupy, dtype):
    a = cupy.ones((GPU_GEMM, GPU_GEMM), dtype=dtype)  # the values do not change the speed
    out = cupy.empty_like(a)
    return 2 * GPU_GEMM**3 / best_seconds(lambda: cupy.matmul(a, a, out=out), be=be)


def _measure_cuda():
    import cupy

    be = backend.get("cuda")
    matmul = {name: _gpu_gemm_rate(be, cupy, dtypes.BY_NAME[name]) for name in ("fp32", "fp16")}
    matmul["bf16"] = matmul["fp16"]
    src = cupy.ones(STREAM_BYTES["cuda"] // 4, dtype=np.float32)
    dst = cupy.empty_like(src)
    copy = 2 * src.nbytes / best_seconds(lambda: cupy.copyto(dst, src), be=be)
    read = src.nbytes / best_seconds(lambda: src.max(), be=be)
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
