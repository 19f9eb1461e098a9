"""Time the quantized GEMV (qmatmul at M = 1, a decode step's) at GPT-2 124M's weight shapes for
every weight format, on the default device: K x N = 768 x 2304 (c_attn), 768 x 768
(attn.c_proj), 768 x 3072 (c_fc), 3072 x 768 (mlp.c_proj) and 768 x 50304 (the tied LM head).
Each row is the best of --repeats tries of a few back-to-back launches (a burst of load
elsewhere only slows a try) and GB/s counts the weight's stored bytes (codes and scales) per
launch; the fp32 row is the plain matmul of the same product, for comparison. A format
FMT+int8 (int8, int4) is FMT's weights with int8 activations (generate.py --activations int8):
x quantized (quantize_rows), then the integer GEMV (qmatmul_int8x), both launches timed.
--rows M times a prompt's GEMM instead (x of M rows: a tile decoded then BLAS, or with int8
activations the integer tiles of kernels/quant/cpu_int8x_tiles.py), in G multiply-adds/s.

    python scripts/bench_quant.py [--formats int8,int4,int8+int8,...] [--repeats 3]
    taskset -c 0 python scripts/bench_quant.py   # one core
    python scripts/bench_quant.py --formats int8,int8+int8,int4,int4+int8 --rows 512
"""

import time

import numpy as np

from accounting.tables import table
from tinygrad_like import backend, formats, kernels, quant
from training.args import ArgumentParser, user_errors

SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768), (768, 50304)]  # (K, N)


def best_seconds(fn, be, repeats, elements):
    """The best of `repeats` tries, each of enough launches to take a few ms, per launch."""
    fn()  # warm-up: compiles on a cold cache
    launches = max(3, int(2e7 // elements))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(launches):
            fn()
        be.synchronize()
        best = min(best, (time.perf_counter() - t0) / launches)
    return best


def row(fmt, be, repeats, rng, M=1):
    cells = [fmt]
    for K, N in SHAPES:
        x = be.asarray(rng.normal(size=(M, K)).astype(np.float32))
        W = rng.normal(0, 0.02, (N, K)).astype(np.float32)
        if fmt == "fp32":
            Wt, nbytes = be.asarray(np.ascontiguousarray(W.T)), W.nbytes
            seconds = best_seconds(lambda: kernels.on(be).matmul(x, Wt), be, repeats, M * N * K)
        else:
            weights, activations = quant.split_format(fmt)
            qw = quant.quantize(be.asarray(W), weights)
            nbytes, k = qw.nbytes, kernels.on(be)
            w = qw.codes, qw.scales, weights, qw.group_size

            def launches(activations=activations):
                if activations == "int8":  # x quantized at the GEMV's input, then integer dots
                    return k.qmatmul_int8x(*k.quantize_rows(x), *w, np.float32)
                return k.qmatmul(x, *w)

            seconds = best_seconds(launches, be, repeats, M * N * K)
        rate = (
            f"{nbytes / seconds / 1e9:,.2f} GB/s"
            if M == 1
            else f"{M * N * K / seconds / 1e9:,.1f} GMAC/s"
        )
        cells.append(f"{seconds * 1e3:,.3f} ms {rate}")
    return cells


def main(argv=None):
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    every = ",".join([*formats.FORMATS, "int8+int8", "int4+int8"])
    p.add_argument("--formats", default=every, help="comma-separated (default all)")
    p.add_argument("--repeats", type=int, default=3, help="tries per shape (default 3)")
    p.add_argument("--rows", type=int, default=1, help="rows of x (default 1: the GEMV)")
    args = p.parse_args(argv)
    with user_errors():
        chosen = args.formats.split(",")
        for fmt in chosen:
            quant.split_format(fmt)
        if args.repeats <= 0 or args.rows <= 0:
            raise ValueError("--repeats and --rows must be positive")
        device = backend.resolve()  # TG_DEVICE's, or the GPU when one is usable
    rng = np.random.default_rng(0)
    be, M = backend.get(device), args.rows
    rows = [row(fmt, be, args.repeats, rng, M) for fmt in chosen + ["fp32"]]
    head = ["weights"] + [f"{K} x {N}" for K, N in SHAPES]
    what = "GEMV (M = 1)" if M == 1 else f"GEMM (M = {M}: a prompt's)"
    print(f"-- qmatmul {what} on {device}, best of {args.repeats}")
    print(table(head, rows, "l" + "r" * len(SHAPES)))


if __name__ == "__main__":
    main()
