"""Time the elementwise kernels spec.py declares by their expressions (GELU, SwiGLU and the
unary ops, forward and backward) on the CPU at the sizes a training step gives them, against the
machine's memory roof: for each, microseconds per launch, the bytes its record counts over that
time, and the fraction of the streaming-copy bandwidth (tinygrad_like.peaks) that makes.

Why: the generated kernels replace hand-written ones only where they are at least as fast, and
each should run near the memory roof (an elementwise kernel does a few FLOPs per byte). The
script uses only kernels.on(device) and kernels.count, so the same command run in a checkout from
before the expressions times the hand-written kernels on the same machine, one after the other:

    taskset -c 0 python scripts/bench_elementwise.py       # one core
    python scripts/bench_elementwise.py                    # every core
    python scripts/bench_elementwise.py --rows 1024 --cols 512 --dtypes fp32,bf16
    python scripts/bench_elementwise.py --rows 1024 --cols 50304 --dtypes fp32,bf16,fp16 --only cast

Sizes: the default (rows, cols) = (1024, 512) is gpt2-mini's MLP activation at the default
batch (B 8 x T 128 rows, 4C = 512 columns), 2 MB in fp32. Each kernel runs 5 times to warm up
(the first compiles it), then the median of --repeats launches is taken.
"""

import statistics
import time

import numpy as np

from accounting.tables import table
from tinygrad_like import backend, dtypes, kernels, peaks
from tinygrad_like.kernels.elementwise.spec import UNARY_OPS
from training.args import ArgumentParser, check_dtype, user_errors


def cases(rows, cols, dtype, rng):
    """(label, kernel name, args) for every expression-declared kernel at (rows, cols)."""

    def normal():
        return rng.standard_normal((rows, cols), dtype=np.float32).astype(dtype)

    x, y, dy = normal(), normal(), normal()
    positive = (np.abs(normal().astype(np.float32)) + 0.5).astype(dtype)
    found = [
        ("gelu_fwd", "gelu_fwd", (x,)),
        ("gelu_bwd", "gelu_bwd", (x, dy)),
        ("swiglu_fwd", "swiglu_fwd", (x, y)),
        ("swiglu_bwd", "swiglu_bwd", (x, y, dy)),
    ]
    for op in UNARY_OPS:
        arg = positive if op in ("log", "sqrt", "rsqrt") else x
        found.append((f"unary_fwd {op}", "unary_fwd", (arg, op)))
        found.append((f"unary_bwd {op}", "unary_bwd", (arg, dy, op)))
    if np.dtype(dtype) == np.float32:  # the conversions a 2-byte step makes around each kernel
        found += [
            (f"cast to {dtypes.name(t)}", "cast", (x, np.dtype(t)))
            for t in (dtypes.bfloat16, dtypes.float16)
        ]
    else:
        found.append(("cast to fp32", "cast", (x, np.dtype(np.float32))))
    return found


def seconds(kernel, args, repeats):
    """The median seconds of one call of kernel, after 5 calls to warm it up."""
    for _ in range(5):
        kernel(*args)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        kernel(*args)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None):
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1024, help="rows of each operand (1024)")
    p.add_argument("--cols", type=int, default=512, help="columns of each operand (512)")
    p.add_argument("--dtypes", default="fp32,bf16", help="comma-separated (fp32,bf16)")
    p.add_argument("--repeats", type=int, default=51, help="launches timed per kernel (51)")
    p.add_argument("--only", default="", help="the kernels whose label starts with this")
    args = p.parse_args(argv)
    with user_errors():
        names = args.dtypes.split(",")
        for name in names:
            check_dtype(name)
        if min(args.rows, args.cols, args.repeats) <= 0:
            raise ValueError("--rows, --cols and --repeats must be positive")
        roof = peaks.get("cpu")
    rng, cpu = np.random.default_rng(0), kernels.on(backend.get("cpu"))
    rows = []
    for name in names:
        for label, kernel, kargs in cases(args.rows, args.cols, dtypes.as_dtype(name), rng):
            if not label.startswith(args.only):
                continue
            run = getattr(cpu, kernel)
            s = seconds(run, kargs, args.repeats)
            nbytes = kernels.count(kernel, kargs, {}, run(*kargs))[2]
            rate = nbytes / s
            rows.append(
                (label, name, f"{s * 1e6:,.1f}", f"{rate / 1e9:,.1f}", f"{rate / roof.copy_bw:.0%}")
            )
    print(
        f"elementwise kernels at ({args.rows}, {args.cols}) on {peaks.cpu_name()}, "
        f"{peaks.usable_cores()} cores; roof: streaming copy {roof.copy_bw / 1e9:,.1f} GB/s"
    )
    print(table(("kernel", "dtype", "us", "GB/s", "of roof"), rows))


if __name__ == "__main__":
    main()
