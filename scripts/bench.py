"""Benchmark a training step and generation, ours against PyTorch, on the CPU or a GPU.

For one preset, dtype, batch and sequence length it measures
  1. the training step (forward, backward, gradient clipping, AdamW step, zero_grad): median
     time of the timed steps (warm-up steps excluded) and tokens/s;
  2. MFU: model FLOP/s (6N + 12LCT per token) over accounting/mfu.py's peak, the trainer's: on a
     CPU the fp32 matmul peak measured here (tinygrad_like/peaks.py), on a GPU the datasheet's;
  3. greedy generation with the KV cache: a prompt of --prompt-len tokens, then --new-tokens
     decode steps; prompt tokens/s and decode tokens/s reported separately.
When PyTorch is importable the same model (our weights, copied) runs the same batch and the
same step in this run (scripts/torch_gpt2.py): fp32 eager on the CPU; bf16 autocast, flash
attention and fused AdamW on a GPU; with --torch-compile also under torch.compile. The
contestants take turns round by round, so that a load from elsewhere hits all alike, and ours
and PyTorch eager must give the same initial loss before anything is timed. With --compile our
step also runs captured and replayed (tinygrad_like.compile, as train_gpt2.py --compile) on a
twin of our model, as one more contestant: graph against eager, and against torch.compile;
and our generation also runs as generate.py runs it, the decode step captured and replayed
(with --no-train on generate.py's pool, OpenMP's, as well: a run that trains keeps the
trainer's, fixed at its first parallel kernel). When transformers is importable, Hugging
Face's GPT2LMHeadModel.generate (greedy, use_cache) runs on the same weights for the decode
comparison (scripts/hf_generate.py). Without torch and transformers (not dependencies of the
project) only ours runs.

    python scripts/bench.py                              # gpt2-mini, B=8, T=128, fp32, CPU
    python scripts/bench.py --model gpt2 --batch-size 4 --seq-len 256
    python scripts/bench.py --device cuda --dtype bf16 --model gpt2 --batch-size 16 \\
        --seq-len 1024 --no-generate                     # GPT-2 124M on a GPU
    python scripts/bench.py --census --json bench.json   # plus where the time goes
    python scripts/bench.py --compile --torch-compile    # graph against graph: both compiled
    python scripts/bench.py --model gpt2 --no-train --compile  # decode as generate.py runs it
    python scripts/bench.py --census --plot roofline.png # and the roofline picture of it
    python scripts/bench.py --decode-formats --checkpoint out --plot formats.png --no-train
    python scripts/bench.py --decode-sweep --no-train --no-generate
    python scripts/bench.py --peer llama.cpp --peer-python PY  # scripts/bench_llamacpp.py's run

--decode-formats runs scripts/decode_formats.py (every weight format: bytes, speed, val loss,
greedy agreement with fp32) on --checkpoint, or, without one, on this run's fresh --model
weights (their losses and agreement then mean little); its --batch-size, --seq-len (the val
loss's), --prompt-len and --new-tokens are this run's, and --plot draws its picture (ms/token
against MB/token) instead of the census's. --decode-sweep runs scripts/decode_sweep.py (batched
greedy decode of --model, B = 1 ... 64, along the roofline) with this run's --dtype, --device,
--prompt-len (its prompt) and --new-tokens.

The census gives every kernel its roofline (accounting/roofline.py): the machine's peaks
(tinygrad_like/peaks.py, the same cache), its bound (compute, memory, exp or launch), the time
that bound allows, the fraction of it reached, and rows sorted by the time lost to the bound.
The JSON file is written also when the run is interrupted (Ctrl-C, `timeout -s INT`).

NumPy's OpenBLAS picks its kernels for the CPU it detects when it loads; OPENBLAS_CORETYPE (and
OPENBLAS_L2_SIZE) in the environment override that choice. The header names the kernel set in
use; to measure what a current NumPy does on this CPU, unset both for that command alone
(`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python scripts/bench.py`).
"""

import dataclasses
import importlib.util
import os
import sys
import tempfile
import time

import bench_llamacpp
import decode_formats
import decode_sweep
import hf_generate
import machine
import numpy as np
from bench_ours import (
    build_ours,
    captured_step,
    census_decode_step,
    census_train_step,
    format_phases,
    ours_generate,
    ours_loss,
    ours_train_step,
    round_summary,
    summarize_generation,
    summarize_steps,
    time_generations,
    time_steps,
)
from bench_report import format_report, write_json
from torch_gpt2 import PEER_DTYPES, TorchPeer

from accounting import mfu, roofline, roofline_plot
from accounting.measure import random_batch
from nn import GPT2Config
from tinygrad_like import backend, peaks
from tinygrad_like.kernels.gemm.cpu_bf16 import HAS_DOT
from tinygrad_like.profiler import format_census
from training.args import (
    ArgumentParser,
    add_model_args,
    add_option_args,
    check_model_args,
    options_from_args,
    user_errors,
)
from training.corpus import DEFAULT_DATA_DIR

# |initial loss, ours - PyTorch's| allowed: both compute the same function, rounded alike
LOSS_TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2}


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p, model="gpt2-mini", batch_size=8, seq_len=128)
    add_option_args(p)
    p.add_argument("--steps", type=int, default=5, help="timed steps per round (default 5)")
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="rounds of timed steps, ours then the peers in each (default 2)",
    )
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW's learning rate (default 1e-4)")
    p.add_argument(
        "--weight-decay",
        type=float,
        default=0.1,
        help="AdamW's decoupled weight decay (default 0.1)",
    )
    p.add_argument("--grad-clip", type=float, default=1.0, help="as training (0 = off)")
    p.add_argument(
        "--prompt-len",
        type=int,
        default=64,
        help="prompt tokens of the generation benchmark (default 64)",
    )
    p.add_argument(
        "--new-tokens", type=int, default=64, help="tokens generated after the prompt (default 64)"
    )
    p.add_argument("--gen-batch", type=int, default=1, help="sequences generated at once")
    p.add_argument(
        "--gen-repeats",
        type=int,
        default=3,
        help="timed generations after one warm-up (median reported)",
    )
    p.add_argument(
        "--threads",
        type=int,
        help="BLAS and torch threads (default: leave the libraries' defaults)",
    )
    p.add_argument("--seed", type=int, default=0, help="weights and batch (default 0)")
    p.add_argument(
        "--census",
        action="store_true",
        help="print the op census of one training step and one decode step, with "
        "each kernel's roofline",
    )
    p.add_argument(
        "--plot",
        metavar="PNG",
        help="draw the census's kernels on the roofline into this PNG (implies --census); "
        "with --decode-formats, its picture",
    )
    p.add_argument(
        "--decode-formats",
        action="store_true",
        help="also run scripts/decode_formats.py: every weight format's bytes, speed and loss",
    )
    p.add_argument(
        "--checkpoint",
        help="the checkpoint --decode-formats quantizes (default: this run's fresh weights)",
    )
    p.add_argument(
        "--formats",
        default=",".join(decode_formats.FORMATS),
        help="--decode-formats' formats, comma-separated (default all)",
    )
    p.add_argument(
        "--data-dir", default=DEFAULT_DATA_DIR, help="--decode-formats' val.bin (default: made)"
    )
    p.add_argument(
        "--decode-sweep",
        action="store_true",
        help="also run scripts/decode_sweep.py: batched decode along the roofline, B = 1 ... 64",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="also time our training step captured and replayed (train_gpt2.py --compile), "
        "on a twin of our model from the same seed, beside the eager one (the warm-up steps "
        "record it; the census stays eager), and our decode as generate.py runs it (replayed; "
        "with --no-train on generate.py's OpenMP pool too)",
    )
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    p.add_argument(
        "--torch-compile",
        action="store_true",
        help="also time PyTorch under torch.compile (compiling takes a minute)",
    )
    p.add_argument("--no-hf", action="store_true", help="skip the Hugging Face comparison")
    p.add_argument("--no-train", action="store_true", help="generation only")
    p.add_argument("--no-generate", action="store_true", help="training only")
    p.add_argument("--json", metavar="PATH", help="write every number to this JSON file")
    args = p.parse_args(argv)
    with user_errors():
        check_model_args(args)
        if not backend.get(args.device).HOLDS_VALUES:
            raise ValueError(
                f"--device {args.device} counts a step without running it, so there is nothing "
                f"to time: count it with python scripts/report.py --device {args.device}"
            )
        options_from_args(args)
        for name in ("steps", "rounds", "prompt_len", "new_tokens", "gen_batch", "gen_repeats"):
            if getattr(args, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")
        if args.warmup < 0:
            raise ValueError("--warmup must be >= 0")
        if args.threads is not None and args.threads <= 0:
            raise ValueError("--threads must be positive")
        if args.plot is not None:
            if not args.plot.lower().endswith(".png"):
                raise ValueError(f"--plot {args.plot}: the picture is a PNG, name a .png file")
            if not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
                raise ValueError(f"--plot {args.plot}: no such directory")
            if args.decode_formats and args.census:
                raise ValueError(
                    "--plot draws one picture: with --decode-formats it is the formats', so "
                    "run --census with --plot separately"
                )
            args.census = not args.decode_formats
        if args.checkpoint is not None and not args.decode_formats:
            raise ValueError("--checkpoint is what --decode-formats measures: add --decode-formats")
        if not args.no_generate:
            GPT2Config.from_preset(args.model).check_context(
                args.prompt_len + args.new_tokens, "--prompt-len + --new-tokens ="
            )
    return args


def quiet_peer_threads(args, log):
    """PyTorch's OpenMP threads asleep as soon as they are idle (OMP_WAIT_POLICY=PASSIVE), as
    ours' BLAS threads are (runtime.BLAS_QUIET), where ours' step runs on Numba's workqueue (an
    fp32 or fp16 step on the CPU): libgomp's threads otherwise spin after each of PyTorch's ops
    and take the cores from the next contestant's step (docs/performance.md: the figures).
    libgomp reads the variable once, as it loads with torch; a policy or spin count the user
    set wins. Not where ours runs on OpenMP's pool (a bf16 step with the dot product, a decode
    with --no-train --compile): the two share libgomp and its spin then."""
    ours_on_openmp = (HAS_DOT and args.dtype == "bf16") or (args.no_train and args.compile)
    if args.no_torch or backend.get(args.device).GPU or ours_on_openmp:
        return
    if importlib.util.find_spec("torch") is None:  # no peer: nothing to quiet
        return
    if not any(v in os.environ for v in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")):
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        log("PyTorch's OpenMP threads sleep when idle (OMP_WAIT_POLICY=PASSIVE), as ours' do")


def import_torch(device, dtype, log):
    """torch when it is importable and can be a peer here (its CUDA for a GPU run, a dtype it
    runs in), else None, saying why when it is installed."""
    try:
        import torch
    except ImportError:
        log("PyTorch not installed: peers skipped (pip install torch transformers to compare)")
        return None
    if dtype not in PEER_DTYPES:
        log(f"no PyTorch peer in {dtype} (only {', '.join(PEER_DTYPES)})")
        return None
    if backend.get(device).GPU and not torch.cuda.is_available():
        log(f"torch {torch.__version__} sees no GPU: no PyTorch peer")
        return None
    return torch


# ---------------------------------------------------------------- the run


def run(args, results, log=print):
    """Every measurement the arguments ask for, into results (a JSON-friendly dict), each part
    as soon as it is measured: a run stopped early keeps what it had."""
    quiet_peer_threads(args, log)  # before torch loads libgomp
    # the peak first: measured (on a machine with no cache yet) before --threads limits BLAS
    peak, peak_name = mfu.device_peak(args.device, args.dtype)
    torch = None if args.no_torch else import_torch(args.device, args.dtype, log)
    transformers = None if (args.no_hf or torch is None) else hf_generate.import_transformers()
    if torch is not None and transformers is None and not args.no_hf:
        log("transformers not installed: Hugging Face generate skipped (pip install transformers)")
    machine.set_threads(args.threads, torch)
    config = GPT2Config.from_preset(args.model)

    def build():
        return build_ours(
            config,
            args.device,
            args.dtype,
            args.seed,
            args.lr,
            args.weight_decay,
            args.grad_clip,
            (args.batch_size, args.seq_len),
            decode_only=args.no_train and args.compile,
            **options_from_args(args),
        )

    model, opt, scaler = build()  # before the environment: it picks the pool and the GEMM
    # library the environment names
    env = machine.environment_info(torch, args.device)
    results.update(
        args=vars(args),
        config=config.to_dict(),
        environment=env,
        peak_flops=peak,
        peak_name=peak_name,
    )
    log(machine.format_environment(env, peak_name))
    if torch is not None and not backend.get(args.device).GPU:
        time.sleep(0.5)  # OpenBLAS's threads spin a while after a call: let them sleep first
        results["torch_peak_flops"] = machine.torch_matmul_rate(torch)
        log(
            f"  fp32 matmul peak (torch, same test): {results['torch_peak_flops'] / 1e9:.0f} "
            "GFLOP/s (for reference; MFU always divides by NumPy's)"
        )

    n_params = model.num_parameters()
    B, T = args.batch_size, args.seq_len
    fpt = config.flops_per_token(T)
    results.update(n_params=n_params, flops_per_token=fpt, tokens_per_step=B * T)
    log(
        f"model {args.model}: {n_params:,} parameters, L={config.n_layer} C={config.n_embd} "
        f"H={config.n_head} V={config.vocab_size}; batch {B} x {T} = {B * T} tokens/step; "
        f"6N + 12LCT = {fpt / 1e6:.1f} MFLOP/token; {args.dtype} on {args.device}"
    )
    x, y = random_batch(config.vocab_size, B, T, args.seed)
    peers = build_peers(args, torch, config, model, x, y, results, log) if torch else {}

    if not args.no_generate:
        results["generate"] = bench_generation(args, config, model, torch, transformers, log)
    if not args.no_train:
        ours = {"ours": lambda: ours_train_step(model, opt, x, y, args.device, scaler)}
        if args.compile:  # a twin from the same seed takes the same steps, captured
            twin, twin_opt, twin_scaler = build()
            replay = captured_step(twin, twin_opt, twin_scaler, args.device)
            ours["ours_compiled"] = lambda: ours_train_step(
                twin, twin_opt, x, y, args.device, twin_scaler, replay
            )
            log("ours compiled: the same step captured on its first two calls, then replayed")
        results["train"] = bench_training(args, ours, peers, x, y, fpt, peak, log)
    if args.census:
        results["census"] = run_census(args, config, model, opt, scaler, peers, x, y, log)
    if args.decode_formats:
        results["decode_formats"] = run_decode_formats(args, model, log)
    if args.decode_sweep:
        results["decode_sweep"] = run_decode_sweep(args, log)
    if not backend.get(args.device).GPU:  # a peak that a busy machine lowered is raised
        what = f"np.matmul {peaks.CPU_GEMM}^3 at the bench's end"
        note = peaks.beaten("cpu", "fp32", max(peaks.cpu_matmul_rate().values()), what)[1]
        if note:
            log(note + ": the MFU above divides by the lower one, and overstates")
    results["load_average_end"] = machine.loadavg()
    return results


def build_peers(args, torch, config, model, x, y, results, log):
    """PyTorch eager (and compiled) with our weights -> {name: TorchPeer}, after checking that
    eager gives our initial loss."""
    kw = dict(
        device=args.device,
        dtype=args.dtype,
        lr=args.lr,
        weight_decay=args.weight_decay,
        grad_clip=args.grad_clip,
    )
    state = model.state_dict()
    peers = {"torch": TorchPeer(torch, config, state, **kw)}
    ours0, theirs0 = ours_loss(model, x, y), peers["torch"].loss(*peers["torch"].batch(x, y))
    diff, tol = abs(ours0 - theirs0), LOSS_TOLERANCE[args.dtype]
    results["initial_loss"] = {"ours": ours0, "torch": theirs0, "diff": diff, "tolerance": tol}
    log(
        f"initial loss: ours {ours0:.6f}, torch {theirs0:.6f}, |diff| {diff:.2e} "
        f"(tolerance {tol:g})"
    )
    if not diff <= tol:
        raise RuntimeError(
            "the PyTorch model does not give our initial loss: it is not the "
            "same model, so timing it would compare nothing"
        )
    if args.torch_compile:
        peers["torch_compiled"] = TorchPeer(torch, config, state, compile=True, **kw)
    return peers


def bench_training(args, ours, peers, x, y, fpt, peak, log):
    """ours: {"ours": step, and "ours_compiled" with --compile} -> each contestant's summary,
    the contestants taking turns round by round."""
    steps = dict(ours)
    for name, peer in peers.items():
        steps[name] = lambda peer=peer, batch=peer.batch(x, y): peer.train_step(*batch)
    log(
        f"training: {args.warmup} warm-up steps each, then {args.rounds} round(s) of "
        f"{args.steps} timed steps: {', '.join(steps)}"
        + (", each after one untimed step" if peers else "")
    )
    for step in steps.values():
        time_steps(step, args.warmup)
    times, last = {name: [] for name in steps}, {}
    for r in range(args.rounds):
        for name, step in steps.items():
            # after another framework's turn, one untimed step first: the memory it freed has
            # to be faulted in again (first touch costs ~2 ms per MB on a VM), which a training
            # loop that runs alone pays once, not once per round
            if peers:
                time_steps(step, 1)
            t, last[name] = time_steps(step, args.steps)
            times[name] += t
        log(
            f"  round {r + 1}: "
            + ", ".join(round_summary(name, times[name][-args.steps :]) for name in steps)
        )
    out = {}
    for name in steps:
        out[name] = summarize_steps(times[name], x.size, fpt, peak)
        out[name]["last_loss"] = last[name]  # the same updates from the same start: close
    return out


def bench_generation(args, config, model, torch, transformers, log):
    rng = np.random.default_rng(args.seed + 1)
    prompt = rng.integers(0, config.vocab_size, (args.gen_batch, args.prompt_len), dtype=np.int64)
    P, N, Bg = args.prompt_len, args.new_tokens, args.gen_batch
    log(
        f"generation: greedy, KV cache, batch {Bg}, prompt {P} tokens, {N} new tokens; "
        f"1 warm-up + {args.gen_repeats} timed runs each"
    )
    ours_generate(model, prompt, N)
    runs = time_generations(lambda: ours_generate(model, prompt, N), args.gen_repeats)
    out = {"ours": summarize_generation(runs, Bg, P, N)}
    if args.compile:  # as generate.py decodes: the step captured on its first calls, replayed
        ours_generate(model, prompt, N, compile=True)
        runs = time_generations(
            lambda: ours_generate(model, prompt, N, compile=True), args.gen_repeats
        )
        out["ours_compiled"] = summarize_generation(runs, Bg, P, N)
    if transformers is None:
        return out
    hf = hf_generate.hf_load(transformers, torch, model, args.device, args.dtype)
    out["hf_logits_max_abs_diff"] = hf_generate.prompt_logits_diff(torch, hf, model, prompt)
    hf_generate.hf_generate(torch, hf, prompt, N)
    hf_runs = time_generations(
        lambda: hf_generate.hf_generate(torch, hf, prompt, N), args.gen_repeats
    )
    out["hf"] = summarize_generation(hf_runs, Bg, P, N)
    out["hf"]["transformers"] = transformers.__version__
    out["hf"]["attn_implementation"] = getattr(hf.config, "_attn_implementation", None)
    same = (hf_runs[-1][2] == runs[-1][2]).all(axis=0)
    out["same_tokens"] = int(same.sum()) if same.all() else int(np.argmin(same))
    log(
        f"  Hugging Face model: max |logit diff| on the prompt "
        f"{out['hf_logits_max_abs_diff']:.2e}; greedy tokens identical for the first "
        f"{out['same_tokens']} of {N}"
    )
    return out


def run_census(args, config, model, opt, scaler, peers, x, y, log):
    step = lambda: ours_train_step(model, opt, x, y, args.device, scaler)  # noqa: E731
    machine_peaks = peaks.get(args.device)
    log(machine_peaks.describe())
    step()  # warm again: a peer's round ran last
    prof, wall = census_train_step(step)
    rows, phases = roofline.census(prof, machine_peaks, args.dtype), prof.by_phase()
    log(
        format_census(
            rows,
            f"ours: op census of one training step ({args.model}, "
            f"B={args.batch_size}, T={args.seq_len}, {args.dtype}), by time lost "
            "to the roofline",
        )
    )
    log(format_phases(phases, wall))
    prompt = np.random.default_rng(args.seed + 1).integers(
        0, config.vocab_size, (args.gen_batch, args.prompt_len), dtype=np.int64
    )
    dprof, dwall = census_decode_step(model, prompt)
    drows = roofline.census(dprof, machine_peaks, args.dtype)
    dkernel = sum(r["seconds"] for r in drows)
    log(
        format_census(
            drows,
            f"ours: op census of one decode step (batch {args.gen_batch}, "
            f"{args.prompt_len + 1} cached positions), by time lost to the roofline",
        )
    )
    log(
        f"  wall {dwall * 1e3:.2f} ms, in kernels {dkernel * 1e3:.2f} ms, outside kernels "
        f"{(dwall - dkernel) * 1e3:.2f} ms ({(dwall - dkernel) / dwall:.0%})"
    )
    out = {
        "peaks": dataclasses.asdict(machine_peaks),
        "train": {"rows": rows, "by_phase": phases, "wall_s": wall},
        "decode": {"rows": drows, "wall_s": dwall},
    }
    if args.plot:
        roofline_plot.plot(
            [("training step", rows), ("decode step", drows)],
            machine_peaks,
            args.plot,
            args.dtype,
            title=f"{args.model} {args.dtype} on {args.device}: "
            f"training step B={args.batch_size} T={args.seq_len}, decode step",
        )
        log(f"wrote {args.plot}")
    if "torch" in peers:
        peer = peers["torch"]
        batch = peer.batch(x, y)
        peer.train_step(*batch)
        out["torch_train_table"] = peer.census(*batch)
        log("torch: profiler of one training step\n" + out["torch_train_table"])
    return out


def run_decode_formats(args, model, log):
    """scripts/decode_formats.py with this run's sizes, on --checkpoint or on model's weights
    (saved to a temporary folder) -> its rows."""
    argv = ["--formats", args.formats, "--data-dir", args.data_dir]
    argv += ["--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len)]
    argv += ["--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens)]
    argv += ["--plot", args.plot] if args.plot else []
    if args.checkpoint is not None:
        return decode_formats.run(
            decode_formats.parse_args(["--checkpoint", args.checkpoint] + argv), log
        )
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        log(f"decode formats: {args.model}'s fresh weights (seed {args.seed}): losses mean little")
        return decode_formats.run(decode_formats.parse_args(["--checkpoint", folder] + argv), log)


def run_decode_sweep(args, log):
    """scripts/decode_sweep.py on --model with this run's dtype, device and sizes -> its
    results, one per batch."""
    argv = ["--model", args.model, "--dtype", args.dtype, "--device", args.device]
    argv += ["--seq-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens)]
    return decode_sweep.run(decode_sweep.parse_args(argv), log)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["--peer", "llama.cpp"]:  # decode beside llama.cpp: its own pinned workers
        return bench_llamacpp.main(argv[2:])
    args = parse_args(argv)
    results = {}
    try:
        run(args, results)
        print(format_report(results))
    finally:  # also when interrupted: what was measured by then
        if args.json:
            write_json(args.json, results)
            print(f"wrote {args.json}")
    return results


if __name__ == "__main__":
    main()
