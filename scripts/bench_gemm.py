"""The fp32 GEMMs of a training step at the step's own shapes, through each BLAS at hand, against
the machine's measured matmul peak (tinygrad_like.peaks' test: np.matmul on 1024^3).

The shapes: for each linear layer of each --models preset (B*T tokens, C = n_embd; qkv C x 3C,
attention proj C x C, fc C x 4C, MLP proj 4C x C) its three GEMMs as functions.Linear calls them:
forward X W (matmul), dX = dY W^T (matmul_nt) and dW = X^T dY (matmul_tn); and the fused LM
head's three per block of losses.HEAD_BLOCK_ROWS rows: logits = x wte^T (matmul_nt), dX = dlogits
wte (matmul) and dW = dlogits^T x (matmul_tn), plus dW summed over the step's blocks.
The libraries, each on all the usable cores:
  ours       cpu.matmul / matmul_nt / matmul_tn (kernels/gemm/cpu.py: NumPy's OpenBLAS, a long K
             cut in two halves on two cores), on the kernel set OpenBLAS loaded, and as
  ours SkylakeX  on its AVX-512 kernels where it loaded others on a CPU that has AVX-512
             (cpu_blas.openblas_core, what the trainer's openblas-skylakex runs);
  np.matmul  NumPy's OpenBLAS called directly, the operands as the step lays them out;
  MKL        cblas_sgemm of the `mkl` wheel's libmkl_rt through ctypes (--mkl PATH, or the
             wheel installed beside NumPy), set up as the kernels run it (cpu_blas.load_mkl:
             reproducible mode, threads asleep when idle);
  BLIS       blis.py.gemm of the `blis` wheel (one thread: the wheel is built without
             threads).
The head's dW over the blocks: ours (matmul_tn, then an add into the sum, as losses.py does) against
one GEMM per block that accumulates into the sum (beta = 1) through OpenBLAS's cblas_sgemm,
MKL's and BLIS's.
With --dtype bf16 the operands are bf16 and the libraries two: ours (kernels/gemm/cpu_bf16.py's
AVX-512 BF16 dot products where the CPU has them) and "widened", what cpu.py ran before them:
both operands widened to fp32 (backend/cpu/halves.py), then NumPy's OpenBLAS. The percentages
stay of the fp32 peak (a bf16 dot product does twice an FMA's multiply-adds: over 100% is
possible).
Every call is timed in interleaved rounds (each round times every library once per shape, so a
burst of load elsewhere hits them all alike), each sample right after one of the peak's; a
figure is the best round, its percentage of the peak's best sample, and the spread is the
median round's time over the best's, per library.

    python scripts/bench_gemm.py [--models gpt2-mini,gpt2] [--rounds 5] [--mkl PATH]
    (it ends with the library the trainer would choose for each model's step in that dtype)
    python scripts/bench_gemm.py --dtype bf16
    taskset -c 0 python scripts/bench_gemm.py    # one core
"""

import ctypes
import math
import os
import statistics
import sys
import time
from functools import partial

import machine
import numpy as np

from accounting.tables import table
from nn.config import PRESETS
from tinygrad_like import dtypes, gemm_library, kernels, peaks
from tinygrad_like.backend.cpu import halves, runtime
from tinygrad_like.kernels.gemm import cpu_blas
from training.args import ArgumentParser, user_errors

cpu = kernels.on("cpu")  # our GEMMs, uncounted
STEP = {"gpt2-mini": (8, 128), "gpt2": (4, 256)}  # (B, T) of each preset's benchmarked step
SAMPLE_S = 0.01  # a timed sample repeats a call until it lasts about this long


# ---------------------------------------------------------------- the step's GEMMs


def dims(kind, a, b):
    """(M, K, N) of a GEMM of this kind on a and b as the step lays them out: nn a (M, K) b
    (K, N); nt a (M, K) b (N, K); tn a (K, M) b (K, N)."""
    M, K = a[::-1] if kind == "tn" else a
    N = b[0] if kind == "nt" else b[1]
    return M, K, N


def step_gemms(name):
    """[(label, kind, a's shape, b's shape, calls per step)] of one preset's training step
    (gemm_library.step_gemms, the rows gemm_library.py chooses a BLAS by)."""
    rows = gemm_library.step_gemms(PRESETS[name], *STEP[name])
    return [(f"{name} {label}", *rest) for label, *rest in rows]


# ---------------------------------------------------------------- the libraries


def by_kind(sgemm):
    """gemm(kind, a, b, out, beta) = op(a) op(b) + beta out over the kernels' sgemm(a, b, out,
    beta) (kernels/gemm/cpu_blas.py), the operands as the step lays them out, transposed
    where the kind says."""
    return lambda kind, a, b, out, beta=0.0: sgemm(
        a.T if kind == "tn" else a, b.T if kind == "nt" else b, out, beta
    )


def cblas_sgemm(function, index):
    """A library's ctypes cblas_sgemm (its ints `index`: c_int, or c_int64 for an ILP64 BLAS) as
    by_kind's gemm."""
    return by_kind(cpu_blas.cblas_sgemm(function, index))


def openblas_sgemm():
    """NumPy's OpenBLAS's own cblas_sgemm, the kernels' (cpu_blas.OPENBLAS_SGEMM), or None."""
    sgemm = cpu_blas.OPENBLAS_SGEMM
    return by_kind(sgemm) if sgemm is not None else None


def blis_sgemm():
    try:
        from blis.py import gemm
    except ImportError:
        return None
    return lambda kind, a, b, out, beta=0.0: gemm(
        a, b, out=out, trans1=kind == "tn", trans2=kind == "nt", beta=beta
    )


def ours(kind, a, b, out):
    kernel = {"nn": cpu.matmul, "nt": cpu.matmul_nt, "tn": cpu.matmul_tn}[kind]
    return kernel(a, b)


def numpy_matmul(kind, a, b, out):
    a, b = (a.T if kind == "tn" else a), (b.T if kind == "nt" else b)
    return np.matmul(a, b, out=out)


def widened(kind, a, b, out):
    """A bf16 GEMM as cpu.py ran it before its bf16 dot products: both operands widened to fp32,
    then NumPy's OpenBLAS."""
    return numpy_matmul(kind, halves.f32(a), halves.f32(b), out)


def on_core(core, gemm):
    """gemm run on OpenBLAS's kernel set `core`, the set in use before it restored after."""

    def run(*args):
        with cpu_blas.openblas_core(core):
            return gemm(*args)

    return run


def libraries(mkl, dtype="fp32"):
    """name -> gemm(kind, a, b, out) of each library found (for bf16 operands: ours, widened)."""
    if dtype == "bf16":
        return {"ours": ours, "widened": widened}
    found = {"ours": ours, "np.matmul": numpy_matmul}
    for core in cpu_blas.openblas_cores()[1:]:  # OpenBLAS's others than the set it loaded
        found[f"ours {core}"] = on_core(core, ours)
    if mkl is not None:
        found["MKL"] = cblas_sgemm(mkl.cblas_sgemm, ctypes.c_int)
    if (blis := blis_sgemm()) is not None:
        found["BLIS"] = blis
    return found


def accumulators(mkl):
    """name -> sum_dw(blocks (a, b) pairs, dw) adding every block's dlogits^T x into dw."""

    def matmul_then_add(pairs, dw):
        for a, b in pairs:
            cpu.add(dw, cpu.matmul_tn(a, b), out=dw)

    def beta_one(gemm):
        def run(pairs, dw):
            for a, b in pairs:
                gemm("tn", a, b, dw, beta=1.0)

        return run

    found = {"ours: matmul_tn + add": matmul_then_add}
    gemms = {"OpenBLAS beta=1": openblas_sgemm(), "BLIS beta=1": blis_sgemm()}
    if mkl is not None:
        gemms["MKL beta=1"] = cblas_sgemm(mkl.cblas_sgemm, ctypes.c_int)
    found.update({name: beta_one(gemm) for name, gemm in gemms.items() if gemm is not None})
    return found


# ---------------------------------------------------------------- timing


def sample(fn, repeat):
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def interleaved(cases, peak, rounds):
    """cases: {key: thunk}, peak: the peak's thunk -> {key: [(seconds per call, the peak's
    seconds per call just before it), one pair per round]}. Every round times every case once,
    one after the other, each right after a sample of the peak (so the peak's best is taken
    over as many samples as all the cases together). Each thunk is warmed up first, and
    repeated within a sample until it lasts about SAMPLE_S."""
    repeats = {}
    for key, fn in {**cases, "peak": peak}.items():
        fn()
        repeats[key] = max(1, math.ceil(SAMPLE_S / sample(fn, 1)))
    times = {key: [] for key in cases}
    for _ in range(rounds):
        for key, fn in cases.items():
            beside = sample(peak, repeats["peak"])
            times[key].append((sample(fn, repeats[key]), beside))
    return times


def rate(flop, samples, peak):
    """'GFLOP/s (% of the peak)' of the best round."""
    best = flop / min(t for t, _ in samples)
    return f"{best / 1e9:.0f} ({best / peak:.0%})"


def spread(samples):
    seconds = [t for t, _ in samples]
    return statistics.median(seconds) / min(seconds) - 1


def blas_thread_switch_us(calls=20000):
    """Microseconds per enter and exit of runtime.one_blas_thread (entered once per GEMM that
    splits its work itself), the best of 5 runs of `calls`."""

    def run():
        for _ in range(calls):
            with runtime.one_blas_thread():
                pass

    return 1e6 * min(sample(run, 1) for _ in range(5)) / calls


def main(argv=None):
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="gpt2-mini,gpt2", help=f"of {', '.join(STEP)}")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--mkl", help="path of libmkl_rt.so (default: the mkl wheel's, if installed)")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"), help="the operands'")
    args = p.parse_args(argv)
    with user_errors():
        models = args.models.split(",")
        unknown = [m for m in models if m not in STEP]
        if unknown or args.rounds < 1:
            raise ValueError(
                f"--models {args.models!r} --rounds {args.rounds}: models are of "
                f"{', '.join(STEP)} and rounds at least 1"
            )
        if args.mkl is not None and not os.path.isfile(args.mkl):
            raise ValueError(f"--mkl {args.mkl}: no such file (give the path of libmkl_rt.so.*)")
    run(models, args.rounds, cpu_blas.load_mkl(args.mkl), args.dtype)


def run(models, rounds, mkl, dtype="fp32"):
    print(machine.format_environment(machine.environment_info(), "fp32 matmul peak"))
    if mkl is not None:
        version = ctypes.create_string_buffer(256)
        mkl.mkl_get_version_string(version, len(version))
        print(f"  MKL: {version.value.decode().strip()}, {mkl.MKL_Get_Max_Threads()} threads")
    print(f"  one_blas_thread: {blas_thread_switch_us():.2f} us per enter and exit")
    cached = peaks.get("cpu").flops("fp32")
    rng = np.random.default_rng(0)
    n = peaks.CPU_GEMM
    square = [rng.standard_normal((n, n), dtype=np.float32) for _ in range(3)]
    peak_flop = 2 * n**3
    rates = peaks.cpu_matmul_rate(tries=3)  # the peak's GEMM on OpenBLAS's fastest set here
    peak = on_core(max(rates, key=rates.get), partial(np.matmul, *square[:2], out=square[2]))

    cases = {}
    libs, sums = libraries(mkl, dtype), accumulators(mkl) if dtype == "fp32" else {}
    gemms = [g for model in models for g in step_gemms(model)]
    for label, kind, a, b, calls in gemms:
        A, B = (
            rng.standard_normal(s, dtype=np.float32).astype(dtypes.BY_NAME[dtype]) for s in (a, b)
        )
        M, _, N = dims(kind, a, b)
        out = np.empty((M, N), np.float32)
        for name, gemm in libs.items():
            cases[(label, name)] = lambda g=gemm, k=kind, A=A, B=B, out=out: g(k, A, B, out)
        if label.endswith("head dW") and sums:  # the sum over the step's blocks (the same block)
            dw = np.zeros((M, N), np.float32)
            for name, accumulate in sums.items():
                cases[(label + " sum", name)] = lambda f=accumulate, p=[(A, B)] * calls, dw=dw: f(
                    p, dw
                )
    times = interleaved(cases, peak, rounds)
    seen = [peak_flop / p for samples in times.values() for _, p in samples]
    peak = max(seen)
    print(
        f"  matmul peak (np.matmul {n}^3 on OpenBLAS's fastest set, sampled before every "
        f"GEMM): best {peak / 1e9:.1f}, median {statistics.median(seen) / 1e9:.1f} GFLOP/s; "
        f"cached (peaks.get): {cached / 1e9:.1f}"
    )
    print(
        f"\nGFLOP/s (% of the best peak): the best of {rounds} interleaved rounds (a burst of "
        "load elsewhere only ever lowers a figure)"
    )
    print(table(*gemm_table(gemms, libs, times, peak)))
    if sums:
        print("\nThe head's dW summed over the step's blocks, GFLOP/s (% of the best peak)")
        print(table(*sum_table(gemms, sums, times, peak)))
    spreads = {name: [spread(t) for (_, n), t in times.items() if n == name] for name in libs}
    print(
        "\nspread (the median round's time over the best's, median over the GEMMs): "
        + ", ".join(f"{name} {statistics.median(s):.0%}" for name, s in spreads.items())
    )
    print("\nThe choice the trainer makes (gemm_library.choose, measured again):")
    for model in models:  # what the trainer would pick here, measured afresh (and cached)
        choice = gemm_library.choose(PRESETS[model], *STEP[model], dtype, remeasure=True)
        print(f"  {model} B, T = {STEP[model]}: {choice.describe()}")


def gemm_table(gemms, libs, times, peak):
    """(headers, rows): each GEMM's rate per library, then each model's step as a whole: its
    GEMMs' FLOPs over the sum of their best times (each GEMM counted as often as the step calls
    it)."""
    headers = ["GEMM", "kind", "M x K x N", "calls"] + [f"{name} GFLOP/s" for name in libs]
    rows, steps = [], {}
    for label, kind, a, b, calls in gemms:
        M, K, N = dims(kind, a, b)
        flop = 2 * M * K * N
        rows.append(
            [label, kind, f"{M} x {K} x {N}", calls]
            + [rate(flop, times[(label, name)], peak) for name in libs]
        )
        steps.setdefault(label.split()[0], []).append((label, calls, flop))
    for model, parts in steps.items():
        flop = sum(calls * f for _, calls, f in parts)
        cells = []
        for name in libs:
            best = sum(calls * min(t for t, _ in times[(label, name)]) for label, calls, _ in parts)
            cells.append(rate(flop, [(best, None)], peak))
        rows.append([f"{model}: the step's GEMMs", "", "", ""] + cells)
    return headers, rows


def sum_table(gemms, sums, times, peak):
    rows = []
    for label, kind, a, b, calls in gemms:
        if label.endswith("head dW"):
            flop = 2 * math.prod(dims(kind, a, b)) * calls
            rows.append(
                [f"{label}, {calls} blocks"]
                + [rate(flop, times[(label + " sum", name)], peak) for name in sums]
            )
    return ["sum"] + list(sums), rows


if __name__ == "__main__":
    sys.exit(main())
