"""CPU decode beside llama.cpp, the engine a user reaches for to run a model fast on a CPU: the
same GPT-2 weights in each weight format, greedy decode after a 64-token prompt (ms a token)
and the prompt itself (prefill, tokens/s, for prompts of 64 and 512 tokens), on one core and
on two, both engines taking turns in one run. A benchmark: its figures are the machine's
(docs/decode.md names the machine and the command).

The weights are a checkpoint's (--checkpoint) or, without one, GPT-2 124M's random weights (the
speed does not depend on their values), written once in fp32 and exported to GGUF by
scripts/export_gguf.py for llama.cpp. The format pairs: ours fp32 / f32, fp16 / f16, bf16 /
bf16, int8 / q8_0, int4 / q4_0 (ours quantized on load by nn/quant.py, llama.cpp's by gguf's
own quantizer from the same fp32 weights: int8 keeps one scale per output channel, q8_0 one per
32 elements; int4 and q4_0 one per 32). Ours int8 and int4 also run with their activations
quantized to int8 (generate.py --activations int8: the integer dot path llama.cpp's q8_0 and
q4_0 use), and bf16 with its activations rounded to bf16 (--activations bf16, as llama.cpp's
bf16).

Each (engine, format, cores) is a worker process pinned to its cores (taskset), holding
its model loaded; the workers take turns for --rounds rounds and the best round counts (ms a
token, the median of its decode steps). Ours decodes as examples/generate.py does by default:
the decode step captured and replayed, OpenMP's thread pool for its compiled GEMVs (every
format). llama.cpp runs through llama-cpp-python (n_threads = the cores), from --peer-python's
environment (llama.cpp is not a dependency of this project: without it only ours runs, and the
table says so).

    python scripts/bench_llamacpp.py --peer-python /path/to/venv-with-llama-cpp/bin/python
    python scripts/bench_llamacpp.py --formats int8,int4 --cores 0 --rounds 1
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

# ours -> llama.cpp's GGUF type of the same weights
PAIRS = {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "int8": "q8_0", "int4": "q4_0"}
# ours with an activation path of their own (generate.py --activations): int8 activations for
# the integer formats (llama.cpp's q8_0 and q4_0 dot products), bf16 for bf16 (its bf16's)
OWN_ACTIVATIONS = {"int8": "int8", "int4": "int8", "bf16": "bf16"}
PROMPT, LONG_PROMPT = 64, 512  # the decode's prompt, and the longer prefill timed


def parse_args(argv=None):
    from training.args import ArgumentParser

    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", help="a GPT-2 or Llama checkpoint folder (default: --model's)")
    p.add_argument(
        "--model",
        choices=("gpt2", "llama"),
        default="gpt2",
        help="without --checkpoint: random GPT-2 124M or a Llama of its size (default gpt2)",
    )
    p.add_argument("--formats", default=",".join(PAIRS), help=f"ours (default {','.join(PAIRS)})")
    p.add_argument("--cores", nargs="+", default=["0", "0,1"], help="core lists (0 0,1)")
    p.add_argument("--tokens", type=int, default=32, help="decode steps timed a round (32)")
    p.add_argument("--rounds", type=int, default=3, help="turns each worker takes (3)")
    p.add_argument(
        "--peer-python",
        default=sys.executable,
        help="the Python whose environment has llama_cpp (llama-cpp-python) (default: this one)",
    )
    args = p.parse_args(argv)
    p.formats(args.formats, PAIRS)
    if args.tokens < 1 or args.rounds < 1:
        p.error("--tokens and --rounds must be >= 1")
    if args.checkpoint and not os.path.isdir(args.checkpoint):
        p.error(f"--checkpoint {args.checkpoint}: no such folder")
    return args


# ---------------------------------------------------------------- the workers


def prompt_ids(vocab, n):
    """The prompt's n token ids, the same for both engines (a fixed seed)."""
    return np.random.default_rng(0).integers(0, vocab, n).tolist()


def serve(argv):
    """A worker (argv: engine, its model file, its format): the model loaded and warmed up, a
    line "ready" out; then its loop: a line {"prompt": n, "tokens": k} in -> a line
    {"prefill_s": seconds of the n-token prompt, "token_s": [seconds of each of k greedy decode
    steps]} out. Its imports are the engine's alone: llama.cpp's Python need not hold ours."""
    name, model, fmt = argv
    engine = ours(model, fmt) if name == "ours" else llama_cpp(model, len(os.sched_getaffinity(0)))
    print("ready", flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        prefill_s, token_s = engine(ask["prompt"], ask["tokens"])
        print(json.dumps({"prefill_s": prefill_s, "token_s": token_s}), flush=True)


def ours(checkpoint, fmt):
    """ours(n, k) -> (prefill seconds, [decode step seconds]): generate_stream's steps, the
    decode step captured and replayed (compile=True), the prompt's GEMMs on the BLAS measured
    fastest for it, as examples/generate.py does by default."""
    from nn import from_pretrained
    from nn.quant import quantize_model
    from tinygrad_like.backend.cpu.compiled import use_pool
    from tinygrad_like.gemm_library import choose as choose_gemm_library
    from tinygrad_like.quant import split_format

    weights, activations = split_format(fmt)
    use_pool("omp")  # generate.py's choice: OpenMP's pool for the compiled GEMVs
    model = from_pretrained(checkpoint)
    quantize_model(model, weights, activations=activations)

    def run(n, k):
        choose_gemm_library(model.config, 1, n, prompt=True)  # as generate.py: cached after once
        stream = model.generate_stream(
            np.array([prompt_ids(model.config.vocab_size, n)]), k + 1, temperature=0, compile=True
        )
        stamps = [time.perf_counter()]
        for _ in stream:
            stamps.append(time.perf_counter())
        times = np.diff(stamps).tolist()
        return times[0], times[1:]

    run(PROMPT, 3)  # the kernels' first calls (compiles, the capture)
    return run


def llama_cpp(path, cores):
    """llama_cpp(n, k) -> (prefill seconds, [decode step seconds]): Llama.eval of the prompt,
    then of each greedy token (the argmax of its logits, as ours samples at temperature 0)."""
    from llama_cpp import Llama

    llm = Llama(
        model_path=path,
        n_ctx=1024,
        n_batch=LONG_PROMPT,
        n_threads=cores,
        n_threads_batch=cores,
        verbose=False,
    )

    def run(n, k):
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt_ids(llm.n_vocab(), n))
        stamps = [time.perf_counter()]
        for _ in range(k):
            llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
            stamps.append(time.perf_counter())
        return stamps[0] - start, np.diff(stamps).tolist()

    run(PROMPT, 3)
    return run


# ---------------------------------------------------------------- the run


def variants(fmt):
    """Ours runs of a weight format: fp32 activations, and "fmt+int8" (int8 activations) or
    "bf16+bf16" where the format has that path (OWN_ACTIVATIONS)."""
    return [fmt] + ([f"{fmt}+{OWN_ACTIVATIONS[fmt]}"] if fmt in OWN_ACTIVATIONS else [])


def has_llama_cpp(python):
    found = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True)
    return found.returncode == 0


def prepare(args, folder, peer):
    """(fp32 checkpoint, {gguf type: file}) in folder: the checkpoint saved (random GPT-2 124M
    unless --checkpoint) and, for the peer, exported once per GGUF type."""
    checkpoint = args.checkpoint
    if checkpoint is not None:
        from nn.hf import read_config

        context = read_config(checkpoint).n_positions
        if context < LONG_PROMPT + args.tokens + 4:
            raise ValueError(
                f"--checkpoint {checkpoint}: a context of {context} positions; the prefill timed "
                f"is {LONG_PROMPT} tokens, the decode {args.tokens}: use a GPT-2 of 1,024"
            )
    else:
        from nn import build
        from nn.config import PRESETS, LlamaConfig

        # the Llama: GPT-2 124M's layers, width, heads, vocabulary and context, with 4 K/V heads
        # (grouped-query) and a SwiGLU MLP of 2,048: 120M parameters, 19M of them the untied head
        llama = LlamaConfig(12, 768, 12, 4, 2048, 50257, 1024)
        checkpoint = os.path.join(folder, args.model)
        build(PRESETS["gpt2"] if args.model == "gpt2" else llama, seed=0).save_pretrained(
            checkpoint
        )
    ggufs = {}
    if peer and importlib.util.find_spec("gguf") is None:  # export_gguf.py runs with ours
        raise ValueError(
            f"llama.cpp reads GGUF files, which scripts/export_gguf.py writes with the gguf "
            f"package, not installed beside ours: {sys.executable} -m pip install 'gguf>=0.10'"
        )
    for fmt in args.formats.split(",") if peer else ():
        ggufs[PAIRS[fmt]] = os.path.join(folder, f"model-{PAIRS[fmt]}.gguf")
        export = [sys.executable, os.path.join(os.path.dirname(__file__), "export_gguf.py")]
        export += ["--checkpoint", checkpoint, "--type", PAIRS[fmt], "--out", ggufs[PAIRS[fmt]]]
        if subprocess.run(export, stdout=subprocess.DEVNULL).returncode:
            raise ValueError(f"scripts/export_gguf.py --type {PAIRS[fmt]} failed (above)")
    return checkpoint, ggufs


def start(python, engine, model, fmt, cores):
    """A worker process pinned to cores, once its model is loaded and warmed up (one at a time:
    the first one compiles ours kernels)."""
    command = ["taskset", "-c", cores, python, os.path.abspath(__file__), WORKER, engine]
    env = dict(os.environ, PYTHONPATH=_ROOT)
    worker = subprocess.Popen(
        command + [model, fmt], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    if worker.stdout.readline().strip() != "ready":
        raise RuntimeError(f"the {engine} {fmt} worker did not start; its error is above")
    return worker


def ask(worker, prompt, tokens):
    worker.stdin.write(json.dumps({"prompt": prompt, "tokens": tokens}) + "\n")
    worker.stdin.flush()
    line = worker.stdout.readline()
    if not line:
        raise RuntimeError(f"a worker ({' '.join(worker.args[3:])}) stopped; its error is above")
    return json.loads(line)


def measure(workers, args):
    """{key: (best ms a token, best prefill tokens/s at PROMPT, at LONG_PROMPT)} over the
    rounds, the workers taking turns in each."""
    best = {key: [np.inf, 0.0, 0.0] for key in workers}
    for r in range(args.rounds):
        for key, worker in workers.items():
            got = ask(worker, PROMPT, args.tokens)
            long = ask(worker, LONG_PROMPT, 1)
            b = best[key]
            b[0] = min(b[0], 1e3 * float(np.median(got["token_s"])))
            b[1] = max(b[1], PROMPT / got["prefill_s"])
            b[2] = max(b[2], LONG_PROMPT / long["prefill_s"])
        print(f"  round {r + 1} of {args.rounds} done", file=sys.stderr, flush=True)
    return best


def report(best, args, peer):
    """The side-by-side table (ours / llama.cpp and ours' speed relative to it, "-" where the
    peer did not run) and the two-core speedups."""
    from accounting.tables import table

    def pair(o, t, ms=False):  # "ours / theirs", ours' speed relative to theirs
        fmt = "{:.2f}" if ms else "{:,.0f}"
        if t is None:
            return fmt.format(o), "-"
        return f"{fmt.format(o)} / {fmt.format(t)}", f"{(t / o if ms else o / t):.2f}x"

    ours_formats = [v for f in args.formats.split(",") for v in variants(f)]
    rows = []
    for fmt, cores in ((f, c) for f in ours_formats for c in args.cores):
        theirs = PAIRS[fmt.partition("+")[0]]
        o, t = best["ours", fmt, cores], best.get(("llama.cpp", theirs, cores), [None] * 3)
        weights, _, activations = fmt.partition("+")
        name = f"{weights} ({activations} activations)" if activations else fmt
        cells = pair(o[0], t[0], ms=True) + pair(o[1], t[1]) + pair(o[2], t[2])
        rows.append((f"{name} / {theirs}", cores) + cells)
    if not peer:
        print("llama.cpp: not run (llama_cpp is not importable from --peer-python)")
    headers = ("ours / llama.cpp", "cores", "decode ms a token", "ours' speed")
    headers += (f"prefill {PROMPT} tok/s", "ours'", f"prefill {LONG_PROMPT} tok/s", "ours'")
    print(table(headers, rows))
    if len(args.cores) > 1:
        one, two = args.cores[0], args.cores[-1]
        speedups = []
        for fmt in ours_formats:
            theirs = ("llama.cpp", PAIRS[fmt.partition("+")[0]])
            line = f"{fmt} {best['ours', fmt, one][0] / best['ours', fmt, two][0]:.2f}x"
            if peer:
                line += f" ({best[(*theirs, one)][0] / best[(*theirs, two)][0]:.2f}x)"
            speedups.append(line)
        print(f"decode on cores {two} against {one}, ours (llama.cpp): " + ", ".join(speedups))


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


WORKER = "--worker"  # argv[1] of a worker process


def main(argv=None):
    args = parse_args(argv)
    from tinygrad_like import peaks
    from training.args import user_errors

    peer = has_llama_cpp(args.peer_python)
    print(f"== decode, ours beside llama.cpp: {peaks.cpu_name()}, {args.rounds} rounds ==")
    with tempfile.TemporaryDirectory() as folder, user_errors():
        checkpoint, ggufs = prepare(args, folder, peer)
        workers = {}
        try:
            for fmt, cores in ((f, c) for f in args.formats.split(",") for c in args.cores):
                for v in variants(fmt):
                    workers["ours", v, cores] = start(sys.executable, "ours", checkpoint, v, cores)
                if peer:
                    t = PAIRS[fmt]
                    workers["llama.cpp", t, cores] = start(
                        args.peer_python, "llama.cpp", ggufs[t], t, cores
                    )
            best = measure(workers, args)
        finally:
            for w in workers.values():
                w.stdin.close()
                w.wait()
    report(best, args, peer)


if __name__ == "__main__":
    if sys.argv[1:2] == [WORKER]:
        serve(sys.argv[2:])
    else:
        sys.path.insert(0, _ROOT)
        main()
