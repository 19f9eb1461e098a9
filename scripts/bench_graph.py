"""Graph second, measured: the decode step and the training step run eagerly beside the same
step captured and replayed (tinygrad_like.compile, accounting/captured.py), on this machine.
For each: ms per step and its host time (the step's seconds minus its kernels'), eager and
replayed. Decode: gpt2-mini in fp32, GPT-2 124M in every weight format (random weights: the
speed does not depend on the values), B = 1 after a 64-token prompt. Training: gpt2-mini at the
default run's batch (B = 8, T = 128), eager beside replayed as recorded and replayed with its adds
fused (graph/fuse.py), with the bytes its launches move each way. With --cores, the part runs
again pinned to each listed set of cores (taskset, one process each): the decode part's two-core
speedup per format, the training part's three ways per core set.
A benchmark, not a test: its figures are the machine's (docs/performance.md names it).

    python scripts/bench_graph.py
    python scripts/bench_graph.py --cores 0 0,1 --part decode
    python scripts/bench_graph.py --cores 0 0,1 --part training --rounds 5
    python scripts/bench_graph.py --device cuda --part decode --formats bf16   # gpu_check.sh
    python scripts/bench_graph.py --device cuda --part training --rounds 2     # gpu_check.sh
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

from accounting import captured
from accounting.measure import random_batch
from accounting.tables import table
from nn import build
from nn.config import PRESETS
from nn.quant import quantize_model
from optim import AdamW, LossScaler
from optim import step as optim_step
from tinygrad_like import backend, peaks
from tinygrad_like.backend.cpu.compiled import use_pool
from tinygrad_like.kernels.gemm.cpu_bf16 import use_training_pool
from training.args import ArgumentParser, user_errors

FORMATS = ("fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int8", "int4", "fp4_e2m1")


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__)
    p.add_argument("--part", choices=("decode", "training", "all"), default="all")
    p.add_argument("--formats", default=",".join(FORMATS), help="GPT-2 124M's (default all)")
    p.add_argument("--repeats", type=int, default=9, help="decode steps timed, each way (9)")
    p.add_argument("--rounds", type=int, default=3, help="training steps timed, each way (3)")
    p.add_argument(
        "--dtype", choices=("fp32", "bf16", "fp16"), default="fp32", help="training's (fp32)"
    )
    p.add_argument("--cores", nargs="+", help="core lists to pin the CPU decode part to (0 0,1)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where it runs (cpu)")
    p.add_argument(
        "--pool",
        action="store_true",
        help="decode: OpenMP's thread pool for the compiled kernels, as generate.py uses "
        "(tinygrad_like/backend/cpu/compiled.py use_pool)",
    )
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a pinned worker
    args = p.parse_args(argv)
    p.formats(args.formats, FORMATS)
    if args.repeats < 1 or args.rounds < 1:
        p.error("--repeats and --rounds must be >= 1")
    return args


def decode_rows(formats, repeats, device):
    """[(model, format, Captured)]: gpt2-mini fp32, then GPT-2 124M in each format."""
    rows = []
    for name, fmts in (("gpt2-mini", ["fp32"]), ("gpt2", formats)):
        config = PRESETS[name]
        x, _ = random_batch(config.vocab_size, 1, 64)
        for fmt in fmts:
            model = build(config, device=device)
            quantize_model(model, fmt)
            rows.append((name, fmt, captured.decode(model, x, repeats)))
    return rows


def training_rows(repeats, device, dtype):
    """(unfused, fused): Captured of gpt2-mini's training step at B = 8, T = 128 in dtype,
    replayed as recorded and with its adds fused, the best of `repeats` steps each way (on one
    model: the steps train it; each Captured's eager figures are its own run's)."""
    config = PRESETS["gpt2-mini"]
    model = build(config, device=device, dtype=dtype)
    optimizer = AdamW(model.named_parameters())
    scaler = LossScaler() if dtype == "fp16" else None
    x, y = random_batch(config.vocab_size, 8, 128)
    optim_step.train_on(model, optimizer, [(x, y)], scaler)  # its kernels' first calls (compiles)
    return tuple(
        captured.training(model, optimizer, (x, y), scaler, repeats, fuse=fuse)
        for fuse in (False, True)
    )


def ms(seconds):
    return f"{seconds * 1e3:,.2f}"


def decode_table(rows, device):
    out = []
    for name, fmt, c in rows:
        out.append(
            (
                name,
                fmt,
                f"{c.eager_launches} -> {c.launches}",
                ms(c.eager_seconds),
                captured.host_ms(c.eager_host),
                ms(c.replay_seconds),
                captured.host_ms(c.replay_host),
                f"{c.eager_seconds / c.replay_seconds:.2f}x",
            )
        )
    columns = ("model", "weights", "launches (fused)", "eager ms", "host ms", "replayed ms")
    columns += ("host ms", "speedup")
    if any(c.graphs is not None for *_, c in rows):  # replayed as graphs, or compiled ops
        python = [ms(c.python_seconds) if c.python_seconds else "-" for *_, c in rows]
        out = [(*row, *_graph_cells(c), p) for row, (*_, c), p in zip(out, rows, python)]
        columns += (*_graph_columns(device), "from Python ms")
    return table(columns, out, "llrrrrrr" + "r" * (len(columns) - 8))


def _graph_columns(device):
    """The names of _graph_cells: a CUDA graph's, or compiled ops' (STEP_OPS, the CPU's:
    graph/cpu_step.py, a parallel hand-off per run of ops, their buffers in the plan's arena)."""
    if backend.get(device).STEP_OPS:
        return "hand-offs", "arena MB"
    return "graphs a step", "graph MB"


def _graph_cells(c):
    """The graphs a replayed step launches and the memory they keep (their pools; the CPU's
    compiled ops: their arena and scratch)."""
    if c.graphs is None:
        return "-", "-"
    return c.graphs, f"{c.graph_bytes / 1e6:,.1f}"


def training_table(unfused, fused, device):
    """Eager (the best of both runs'), replayed as recorded, replayed fused: launches, bytes the
    launches move, ms, host time and speed against eager."""
    eager = min(unfused.eager_seconds, fused.eager_seconds)
    host = min(unfused.eager_host, fused.eager_host)
    ways = [("eager", unfused.eager_launches, unfused.eager_bytes, eager, host)]
    ways += [
        (way, c.launches, c.replay_bytes, c.replay_seconds, c.replay_host)
        for way, c in (("replayed", unfused), ("replayed, fused", fused))
    ]
    rows = [
        (
            way,
            launches,
            f"{nbytes / 1e6:,.1f}",
            ms(seconds),
            captured.host_ms(host),
            "-" if host < 0 else f"{host / seconds:.1%}",
            f"{eager / seconds:.2f}x",
        )
        for way, launches, nbytes, seconds, host in ways
    ]
    columns = ("step", "launches", "MB moved", "ms", "host ms", "host share", "speed")
    if fused.graphs is not None:  # a device that keeps graphs (CUDA): beside the plan's arena
        cells = [("-", "-"), _graph_cells(unfused), _graph_cells(fused)]
        rows = [(*row, *cell) for row, cell in zip(rows, cells)]
        columns += _graph_columns(device)
    return table(columns, rows, "lrrrrrr" + "r" * (len(columns) - 7))


def pinned(cores, args, part):
    """The part run in a process pinned to cores -> {format: Captured fields} for decode, or
    {"unfused": ..., "fused": ...} for training."""
    command = ["taskset", "-c", cores, sys.executable, __file__, "--part", part, "--json"]
    command += ["--formats", args.formats, "--repeats", str(args.repeats)]
    command += ["--rounds", str(args.rounds), "--dtype", args.dtype] + ["--pool"] * args.pool
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def cores_table(results, names):
    """Per format, replayed ms on each core set and the speedup of the last over the first,
    eager, replayed, and (where the replay runs compiled ops: graph/cpu_step.py) replayed
    launch by launch from Python."""
    rows = []
    first, last = results[0], results[-1]
    for key in first:
        cells = [ms(r[key]["replay_seconds"]) for r in results]
        ways = ["eager_seconds", "replay_seconds", "python_seconds"]
        speedups = [
            f"{first[key][w] / last[key][w]:.2f}x" if first[key][w] and last[key][w] else "-"
            for w in ways
        ]
        rows.append((key, *cells, *speedups))
    columns = ("model weights", *(f"replayed ms, cores {c}" for c in names))
    columns += ("eager speedup", "replayed speedup", "from Python speedup")
    return table(columns, rows, "l" + "r" * (len(names) + 3))


def main(argv=None):
    args = parse_args(argv)
    formats = args.formats.split(",")
    if args.part == "decode" and args.pool:  # as generate.py runs quantized weights
        use_pool("omp")
    if args.part == "training":  # as examples/train_gpt2.py trains in this dtype
        use_training_pool(args.dtype)
    if args.json:  # a pinned worker's answer: one line of JSON
        if args.part == "training":
            unfused, fused = training_rows(args.rounds, "cpu", args.dtype)
            print(json.dumps({"unfused": vars(unfused), "fused": vars(fused)}))
        else:
            rows = decode_rows(formats, args.repeats, "cpu")
            print(json.dumps({f"{n} {f}": vars(c) for n, f, c in rows}))
        return
    gpu = backend.get(args.device).GPU
    machine = peaks.get(args.device).machine if gpu else peaks.cpu_name()
    print(f"== bench_graph on {args.device}: {machine}, {len(os.sched_getaffinity(0))} cores ==")
    if args.part in ("decode", "all"):
        print("\n-- decode, B = 1 after 64 tokens: the best of", args.repeats, "steps each way")
        print(decode_table(decode_rows(formats, args.repeats, args.device), args.device))
    title = f"training, gpt2-mini {args.dtype}, B = 8, T = 128: the best of {args.rounds} steps"
    title += " each way"
    if args.part in ("training", "all") and not args.cores:
        print(f"\n-- {title}")
        print(training_table(*training_rows(args.rounds, args.device, args.dtype), args.device))
    if args.cores and args.part in ("decode", "all"):
        print("\n-- decode pinned (taskset -c), one process per core set")
        print(cores_table([pinned(c, args, "decode") for c in args.cores], args.cores))
    for cores in (args.cores or []) if args.part in ("training", "all") else []:
        print(f"\n-- {title}, pinned to cores {cores} (taskset -c)")
        found = pinned(cores, args, "training")
        print(training_table(*(captured.Captured(**found[k]) for k in ("unfused", "fused")), "cpu"))


if __name__ == "__main__":
    with user_errors():
        np.seterr(all="ignore")
        main()
