"""Lab 5: the MLP half of a GPT-2 block, one kernel per operation, against the roofline.

    python scripts/mlp_block.py                      # CPU, fp32, M = 1, 64, 512
    python scripts/mlp_block.py --device cuda --dtype bf16

GPT-2 small's MLP sublayer, x [M, 768] -> x + proj(gelu(fc(layernorm(x)))), W stored [in, out]
(Y = XW, no transpose), each operation one launch of the project's kernels
(tinygrad_like.kernels.launch, which counts its FLOPs, bytes and exps):
  layernorm    layernorm_fwd   [M, 768]
  matmul fc    matmul          [M, 768] x [768, 3072]
  bias fc      add             [M, 3072] + [3072]
  gelu         gelu_fwd        [M, 3072]
  matmul proj  matmul          [M, 3072] x [3072, 768]
  bias proj    add             [M, 768] + [768]
  residual     add             [M, 768] + [M, 768]
These seven are the block; their sum is its total and each one's share is of it. Three more
rows show the fusion, outside the total:
  matmul fc+b    matmul(h, W1, b1): the bias in the GEMM's epilogue (on a GPU added in registers
                 before the store, gemm.cu; the CPU adds it in place to the fresh product)
  bias+gelu      bias_gelu(fc, b1): GELU(fc + b1) in one pass, the lab's fused kernel
  bias+residual  bias_residual(x, proj, b2): x + (proj + b2) in one pass, the exercise's
                 bias_gelu_residual (out = x + v + b)
The fused kernels are one formula each (kernels/elementwise/spec.py, generated: expr.py) and
keep the unfused order, so their fp32 results are the unfused ones bit for bit. Prediction (c)
compares bias+gelu with bias fc + gelu; (g), the exercise, bias+residual with bias proj +
residual: by the chapter's arithmetic 12 bytes per element against 20 (each unfused kernel
reads its inputs and writes its output), so 0.6 of the time where bytes set it.

Every output is checked against a float64 NumPy reference computed from the same inputs (the
error is max |out - ref| / max |ref|). Each kernel is then timed R times on the backend's clock
(the census's: perf_counter on a CPU, CUDA events on a GPU) and the fastest call is kept: load
from other processes only ever slows a call. Its roofline (accounting/roofline.py, over the
machine's peaks: tinygrad_like/peaks.py, measured once per machine and cached) gives the bound,
the roofline time and the fraction of it reached. Last, the lab's six predictions and the
exercise's beside what was measured, and which held.
"""

import math

import numpy as np

from accounting import roofline
from accounting.tables import table, wrap
from tinygrad_like import backend, dtypes
from tinygrad_like import peaks as machine_peaks
from tinygrad_like.kernels import launch
from tinygrad_like.profiler import Profiler
from training.args import ArgumentParser, user_errors

C, HIDDEN = 768, 3072  # GPT-2 small's width and MLP width
SIZES = (1, 64, 512)
BLOCK = ("layernorm", "matmul fc", "bias fc", "gelu", "matmul proj", "bias proj", "residual")
FUSED = ("matmul fc+b", "bias+gelu", "bias+residual")
ELEMENTWISE = ("bias fc", "gelu", "bias proj", "residual")
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 3e-2}  # scaled max error allowed
NEAR = 0.7  # "near the bandwidth ceiling": at least 70% of it
FEW_US = 10e-6  # "a few µs"


def parse_args(argv=None):
    p = ArgumentParser(
        description="The MLP half of a GPT-2 block, kernel by kernel, against "
        "the roofline (the course's lab 5)."
    )
    p.add_argument("--device", default="cpu", help=f"{' or '.join(backend.DEVICES)} (default cpu)")
    p.add_argument("--dtype", default="fp32", help=f"{', '.join(dtypes.TRAINING)} (default fp32)")
    p.add_argument(
        "--sizes",
        default=",".join(map(str, SIZES)),
        help="the token counts M, comma-separated (default 1,64,512)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=20,
        help="timed calls per kernel, the fastest kept (default 20)",
    )
    args = p.parse_args(argv)
    with user_errors():
        args.device = backend.resolve(args.device)
        if args.dtype not in dtypes.TRAINING:
            raise ValueError(
                f"unknown --dtype {args.dtype!r}: use one of {', '.join(dtypes.TRAINING)}"
            )
        try:
            args.sizes = [int(m) for m in args.sizes.split(",")]
        except ValueError:
            raise ValueError(f"--sizes {args.sizes!r}: give whole numbers, e.g. 1,64,512") from None
        if not args.sizes or min(args.sizes) <= 0:
            raise ValueError("--sizes must all be positive")
        if args.repeats <= 0:
            raise ValueError("--repeats must be positive")
    return args


# ---------------------------------------------------------------- the block


def weights(c=C, hidden=HIDDEN, dtype="fp32", device="cpu", seed=0):
    """GPT-2-like parameters as float64 NumPy (the reference's) and on the device in dtype:
    {name: (float64 array, device array)}, the float64 ones holding the rounded values."""
    rng = np.random.default_rng(seed)
    host = {
        "ln_w": 1 + 0.1 * rng.standard_normal(c),
        "ln_b": 0.1 * rng.standard_normal(c),
        "w1": 0.02 * rng.standard_normal((c, hidden)),
        "b1": 0.1 * rng.standard_normal(hidden),
        "w2": 0.02 * rng.standard_normal((hidden, c)),
        "b2": 0.1 * rng.standard_normal(c),
    }
    return {k: _both(v, dtype, device) for k, v in host.items()}


def _both(a, dtype, device):
    """-> (a rounded to dtype, as float64; a in dtype on the device)."""
    rounded = a.astype(dtypes.BY_NAME[dtype])
    return rounded.astype(np.float64), backend.get(device).asarray(rounded)


def plan(x, p):
    """The kernels of the block and of the fused rows, in order: [(row, run, args,
    reference)]: run launches the row's kernel on the device arrays, reference computes the
    same in float64. An argument named by a string is that earlier row's output; the others
    are (float64, device) pairs (x, p's)."""
    ln_w, ln_b, w1, b1, w2, b2 = (p[k] for k in ("ln_w", "ln_b", "w1", "b1", "w2", "b2"))
    return [
        ("layernorm", lambda *a: launch("layernorm_fwd", *a)[0], (x, ln_w, ln_b), _layernorm),
        ("matmul fc", lambda *a: launch("matmul", *a), ("layernorm", w1), np.matmul),
        ("bias fc", lambda *a: launch("add", *a), ("matmul fc", b1), np.add),
        ("gelu", lambda *a: launch("gelu_fwd", *a), ("bias fc",), _gelu),
        ("matmul proj", lambda *a: launch("matmul", *a), ("gelu", w2), np.matmul),
        ("bias proj", lambda *a: launch("add", *a), ("matmul proj", b2), np.add),
        ("residual", lambda *a: launch("add", *a), (x, "bias proj"), np.add),
        (
            "matmul fc+b",
            lambda h, w, b: launch("matmul", h, w, bias=b),
            ("layernorm", w1, b1),
            lambda h, w, b: h @ w + b,
        ),
        ("bias+gelu", lambda *a: launch("bias_gelu", *a), ("matmul fc", b1), _bias_gelu),
        (
            "bias+residual",
            lambda *a: launch("bias_residual", *a),
            (x, "matmul proj", b2),
            lambda x, v, b: x + v + b,
        ),
    ]


def _layernorm(x, w, b, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _bias_gelu(v, b):
    return _gelu(v + b)


def measure_block(m, p, peaks, dtype="fp32", device="cpu", repeats=20, seed=1):
    """Run, check and time the block at M = m tokens (p: weights()) -> one dict per row:
    row, kernel, shape, flops, bytes, exps, seconds (fastest of `repeats`), error (scaled max
    error against float64), GB/s, GFLOP/s, bound, roofline_s, fraction, share (of the
    block's seven kernels; None for the fused rows)."""
    be = backend.get(device)
    c = p["ln_w"][0].shape[0]
    x = _both(np.random.default_rng(seed).standard_normal((m, c)), dtype, device)
    outputs, rows = {}, []
    for row, run, args, ref in plan(x, p):
        args = [outputs[a] if isinstance(a, str) else a for a in args]
        run(*[a[1] for a in args])  # warm-up (and CUDA compiles)
        with Profiler(timing=True) as prof:
            for _ in range(repeats):
                out = run(*[a[1] for a in args])
        expected = ref(*[a[0] for a in args])
        got = be.to_numpy(out).astype(np.float64)
        outputs[row] = (got, out)  # later rows start from what the kernel gave, in float64
        first = prof.launches[0]
        seconds = min(la.seconds for la in prof.launches)
        rows.append(
            row_of(
                row,
                first.name,
                tuple(out.shape),
                first.flops,
                first.bytes,
                first.exps,
                seconds,
                peaks,
                dtype,
                np.abs(got - expected).max() / max(np.abs(expected).max(), 1e-30),
            )
        )
    total = sum(r["seconds"] for r in rows if r["row"] in BLOCK)
    for r in rows:
        r["share"] = r["seconds"] / total if r["row"] in BLOCK else None
    return rows


def row_of(row, kernel, shape, flops, nbytes, exps, seconds, peaks, dtype, error):
    """One table row: the counts, the rates, and the roofline (bound, time, fraction)."""
    bound, roof = roofline.bound(flops, nbytes, exps, peaks, dtype)
    return {
        "row": row,
        "kernel": kernel,
        "shape": shape,
        "flops": flops,
        "bytes": nbytes,
        "exps": exps,
        "seconds": seconds,
        "error": error,
        "GB/s": nbytes / seconds / 1e9,
        "GFLOP/s": flops / seconds / 1e9,
        "bound": bound,
        "roofline_s": roof,
        "fraction": roof / seconds,
    }


def format_rows(m, rows, dtype):
    body = [
        (
            r["row"],
            r["kernel"],
            "x".join(map(str, r["shape"])),
            f"{r['bytes'] / 1e6:.3f}",
            f"{r['flops'] / 1e6:,.2f}",
            f"{r['seconds'] * 1e6:,.1f}",
            f"{r['GB/s']:.1f}",
            f"{r['GFLOP/s']:.1f}",
            "-" if r["share"] is None else f"{r['share']:.1%}",
            r["bound"],
            f"{r['roofline_s'] * 1e6:,.2f}",
            f"{r['fraction']:.0%}",
            f"{r['error']:.1e}",
            "PASS" if r["error"] <= TOLERANCE[dtype] else "FAIL",
        )
        for r in rows
    ]
    total = sum(r["seconds"] for r in rows if r["share"] is not None)
    return "\n".join(
        [
            f"M = {m} tokens: block total {total * 1e6:,.1f} us (the fused rows not included)",
            table(
                (
                    "row",
                    "kernel",
                    "output",
                    "MB",
                    "MFLOP",
                    "us",
                    "GB/s",
                    "GFLOP/s",
                    "share",
                    "bound",
                    "roof us",
                    "of roof",
                    "error",
                    "check",
                ),
                body,
                "llr" + "r" * 11,
            ),
        ]
    )


# ---------------------------------------------------------------- the lab's predictions


def predictions(results, peaks, dtype="fp32", device="cpu"):
    """results: {M: measure_block rows} -> [(the lab's prediction, what was measured, whether
    it held)]; (a), (b), (c), (f) and (g) need M = 512 and (d), (e) M = 1: without them, left
    out."""
    by = {m: {r["row"]: r for r in rows} for m, rows in results.items()}
    big, one = by.get(512), by.get(1)
    gpu = backend.get(device).GPU
    out = []

    if big:
        share = big["matmul fc"]["share"] + big["matmul proj"]["share"]
        out.append(
            (
                "(a) M = 512: the two matmuls hold above 95% of the time",
                f"{share:.1%}",
                share > 0.95,
            )
        )
        near = {
            row: big[row]["GB/s"] * 1e9 / peaks.bandwidth
            for row in ("gelu", "bias fc", "bias proj", "residual")
        }
        out.append(
            (
                f"(b) M = 512: GELU, bias and residual near the bandwidth ceiling "
                f"({peaks.bandwidth / 1e9:.0f} GB/s; near = {NEAR:.0%} of it)",
                ", ".join(
                    f"{row} {big[row]['GB/s']:.1f} GB/s ({f:.0%}, {big[row]['bound']}-bound)"
                    for row, f in near.items()
                ),
                min(near.values()) >= NEAR,
            )
        )
        fused, apart = big["bias+gelu"], big["bias fc"]["seconds"] + big["gelu"]["seconds"]
        ratio = fused["seconds"] / apart
        moved = fused["bytes"] / (big["bias fc"]["bytes"] + big["gelu"]["bytes"])
        epilogue = big["matmul fc+b"]["seconds"] - big["matmul fc"]["seconds"]
        out.append(
            (
                "(c) M = 512: fused bias+GELU about half the time of bias then GELU",
                f"{ratio:.2f}x ({fused['seconds'] * 1e6:,.0f} vs {apart * 1e6:,.0f} us; "
                f"bytes {moved:.2f}x; the bias in the fc epilogue cost "
                f"{epilogue * 1e6:,.0f} us there)",
                0.35 <= ratio <= 0.65,
            )
        )
        frac = {
            row: big[row]["GFLOP/s"] * 1e9 / peaks.flops(dtype)
            for row in ("matmul fc", "matmul proj")
        }
        out.append(
            (
                f"(f) M = 512: the matmul at a few percent of the {dtype} peak "
                f"({peaks.flops(dtype) / 1e9:,.0f} GFLOP/s)",
                ", ".join(
                    f"{row} {big[row]['GFLOP/s']:,.0f} GFLOP/s ({f:.0%})" for row, f in frac.items()
                ),
                max(frac.values()) < 0.10,
            )
        )
        fused, apart = (
            big["bias+residual"],
            big["bias proj"]["seconds"] + big["residual"]["seconds"],
        )
        ratio = fused["seconds"] / apart
        moved = fused["bytes"] / (big["bias proj"]["bytes"] + big["residual"]["bytes"])
        out.append(
            (
                "(g) M = 512, the exercise: bias_residual (x + v + b in one pass) about 0.6 of "
                "bias then residual, its bytes' share (12 bytes per element of 20)",
                f"{ratio:.2f}x ({fused['seconds'] * 1e6:,.0f} vs {apart * 1e6:,.0f} us; "
                f"bytes {moved:.2f}x)",
                0.45 <= ratio <= 0.75,
            )
        )
    if one:
        # a fixed cost, not bytes, sets the time: under a few us and 3x its bytes/exps roof
        times = {row: one[row]["seconds"] for row in ELEMENTWISE}
        data_roof = {
            row: max(
                roofline.roofline_times(
                    one[row]["flops"], one[row]["bytes"], one[row]["exps"], peaks, dtype
                )[b]
                for b in ("memory", "exp")
            )
            for row in ELEMENTWISE
        }
        fixed = all(t < FEW_US and t >= 3 * data_roof[row] for row, t in times.items())
        cost = (
            f"the launch floor is {peaks.launch_s * 1e6:.1f} us"
            if gpu
            else "a CPU has no launch: the fixed cost is each call's Python and NumPy dispatch "
            f"(the cheapest call here takes {peaks.launch_s * 1e6:.2f} us)"
        )
        out.append(
            (
                "(d) M = 1: elementwise ops take a few us each whatever their size: "
                "launch-bound" + ("" if gpu else " (on a GPU)"),
                ", ".join(
                    f"{row} {t * 1e6:.1f} us ({t / data_roof[row]:.0f}x its bytes/exps roof)"
                    for row, t in times.items()
                )
                + f"; {cost}",
                fixed,
            )
        )
        ratio = one["matmul proj"]["seconds"] / one["matmul fc"]["seconds"]
        out.append(
            (
                "(e) M = 1: matmul proj several times slower than fc (3 blocks vs 12, "
                "one thread per output on a GPU)",
                f"proj / fc = {ratio:.2f}x ({one['matmul proj']['seconds'] * 1e6:,.1f} vs "
                f"{one['matmul fc']['seconds'] * 1e6:,.1f} us; same bytes)",
                ratio >= 2,
            )
        )
    return sorted(out, key=lambda p: p[0])


def format_predictions(preds):
    lines = ["the lab's predictions beside the measurement"]
    for prediction, measured, held in preds:
        lines += [
            f"  {prediction}: {'HELD' if held else 'DID NOT HOLD'}",
            wrap(f"measured: {measured}", indent="      "),
        ]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    peaks = machine_peaks.get(args.device)
    print(peaks.describe())
    print(
        f"\nMLP half-block, C = {C}, hidden = {HIDDEN}, {args.dtype} on {args.device}; each "
        f"kernel the fastest of {args.repeats} calls; error = max |out - ref| / max |ref| "
        f"against float64 (PASS at <= {TOLERANCE[args.dtype]:g})\n"
    )
    p = weights(dtype=args.dtype, device=args.device)
    results = {}
    for m in args.sizes:
        results[m] = measure_block(m, p, peaks, args.dtype, args.device, args.repeats)
        print(format_rows(m, results[m], args.dtype) + "\n")
    print(format_predictions(predictions(results, peaks, args.dtype, args.device)))
    failed = [
        r["row"] for rows in results.values() for r in rows if r["error"] > TOLERANCE[args.dtype]
    ]
    if failed:
        raise SystemExit(f"error: outputs differ from the float64 reference: {failed}")
    return results


if __name__ == "__main__":
    main()
