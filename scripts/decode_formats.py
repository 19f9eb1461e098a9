"""Weight formats side by side, where bytes decide: a checkpoint (a training run's --out folder,
or a Hugging Face GPT-2 or Llama directory) loaded in fp32, then quantized on load to each
format in turn (nn/quant.py), and for each format:
- bytes: the weights' stored bytes per parameter, and the bytes a decode step moves (counted at
  each kernel launch) beside its floor (every streamed weight once, and the KV cache so far);
- speed: greedy decode of a fixed prompt, ms per token (the median decode step), the floor at the
  measured read bandwidth (tinygrad_like/peaks.py) and the fraction of that bound reached. The
  formats are timed in --rounds interleaved rounds (each round decodes every format in turn,
  uncounted), so that a slow spell of a shared machine slows every format alike: ms per token
  is the median step over the rounds, and the speed against fp32 the median of the rounds'
  ratios;
- quality: the mean validation loss over fixed batches of the corpus, its change against fp32's,
  and how many of the greedy tokens agree with fp32's (all positions, and before the first
  disagreement: after one, the two continue from different texts).
A format FMT+int8 is FMT's weights with int8 activations (generate.py --activations int8: the
integer dot path, int8 and int4 only), measured beside FMT's fp32 activations.
--plot PNG draws ms per token against MB per token, one point per format, the bound as a line.
A benchmark, not a test: its figures are the machine's (docs/decode.md names it).

    python scripts/decode_formats.py --checkpoint out
    python scripts/decode_formats.py --checkpoint out --formats fp32,int8,int4 --group-size 64
    python scripts/decode_formats.py --checkpoint ~/models/gpt2 --plot docs/decode_formats.png
    python scripts/decode_formats.py --checkpoint out --formats fp32,int8,int8+int8,int4,int4+int8
"""

import statistics
import time

import numpy as np

from accounting.decode import StepMeter, stream_bytes, weight_bytes_per_parameter
from accounting.tables import table
from nn import LlamaConfig, from_pretrained
from nn.config import PRESETS
from nn.hf import read_quantization
from nn.options import ExecutionOptions
from nn.quant import quantize_model
from tinygrad_like import no_grad, peaks
from tinygrad_like.quant import split_format
from training.args import ArgumentParser, user_errors
from training.checkpoint import find_checkpoint
from training.cli import ensure_data
from training.corpus import DEFAULT_DATA_DIR
from training.data import DataLoader

FORMATS = ("fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int8", "int4", "fp4_e2m1")


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__)
    p.add_argument("--checkpoint", required=True, help="folder with config.json + weights")
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated (default all)")
    p.add_argument("--group-size", type=int, help="int4 / fp4 group size (default the format's)")
    p.add_argument(
        "--data-dir", default=DEFAULT_DATA_DIR, help="holds val.bin (default: Shakespeare, made)"
    )
    p.add_argument("--eval-iters", type=int, default=8, help="validation batches (default 8)")
    p.add_argument("--batch-size", type=int, default=8, help="validation batch B (default 8)")
    p.add_argument("--seq-len", type=int, default=128, help="validation T (default 128)")
    p.add_argument("--prompt-len", type=int, default=16, help="prompt tokens (default 16)")
    p.add_argument("--new-tokens", type=int, default=64, help="decode steps (default 64)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (default 3)")
    p.add_argument("--plot", metavar="PNG", help="draw ms/token against bytes/token here")
    return p.parse_args(argv)


def measure(path, fmt, group_size, val_path, prompt, args):
    """One format's model (the checkpoint at path quantized to fmt; fp32: as loaded) and
    {fmt, bytes_per_param, loss, tokens, moved, floor}: its greedy tokens after prompt (1, P)
    and the bytes a decode step moves, counted at each launch; timed() times it."""
    model = from_pretrained(path, dtype="fp32", device="cpu", options=PLAIN_HEAD)
    weights, activations = split_format(fmt)
    if weights != "fp32":
        quantize_model(model, weights, group_size, activations=activations)
    model.eval()
    loader = DataLoader(val_path, args.batch_size, args.seq_len, seed=0)
    with no_grad():
        losses = [model(*loader.next_batch())[1].item() for _ in range(args.eval_iters)]
    meter = StepMeter(model.generate_stream(prompt, args.new_tokens, temperature=0))
    tokens = [int(t[0]) for t in meter]
    steps = range(1, len(meter.steps))  # step s feeds token s: the cache holds P + s positions
    per_param = weight_bytes_per_parameter(weights, group_size, model.config)[1]
    floor = [stream_bytes(model.config, per_param, 4, 1, args.prompt_len + s) for s in steps]
    return model, {
        "fmt": fmt,
        "bytes_per_param": per_param,
        "loss": float(np.mean(losses)),
        "tokens": tokens,
        "moved": statistics.mean(meter.step_bytes(s) for s in steps),
        "floor": statistics.mean(floor),  # the fp32 KV cache's 4 bytes included
    }


def decode_steps(model, prompt, new_tokens):
    """Seconds of each decode step of a greedy decode (the prompt's step left out), timed as a
    plain decode runs: nothing counted."""
    stream, seconds = model.generate_stream(prompt, new_tokens, temperature=0), []
    next(stream, None)  # the prompt's step
    while True:
        t0 = time.perf_counter()
        if next(stream, None) is None:
            return seconds
        seconds.append(time.perf_counter() - t0)


def timed(models, rows, prompt, args):
    """Set each row's ms (the median decode step over args.rounds rounds, every format decoded
    in turn in each) and speed (fp32's median step over its own in the same round, the median
    over the rounds; 1 when fp32 is not among them)."""
    rounds = {r["fmt"]: [] for r in rows}
    for _ in range(args.rounds):
        for model, r in zip(models, rows):
            rounds[r["fmt"]].append(decode_steps(model, prompt, args.new_tokens))
    for r in rows:
        r["ms"] = statistics.median(s for steps in rounds[r["fmt"]] for s in steps) * 1e3
        base = rounds.get("fp32", rounds[r["fmt"]])
        ratios = [
            statistics.median(b) / statistics.median(s) for b, s in zip(base, rounds[r["fmt"]])
        ]
        r["speed"] = statistics.median(ratios)


PLAIN_HEAD = ExecutionOptions(lm_head="plain")  # the loss through the head's own GEMM


def agreement(tokens, reference):
    """(positions equal, positions before the first disagreement) of two greedy sequences."""
    same = [a == b for a, b in zip(tokens, reference)]
    return sum(same), same.index(False) if False in same else len(same)


def format_table(rows, bandwidth):
    base = next((r for r in rows if r["fmt"] == "fp32"), rows[0])
    out = []
    for r in rows:
        bound_ms = r["floor"] / bandwidth * 1e3
        equal, prefix = agreement(r["tokens"], base["tokens"])
        out.append(
            (
                r["fmt"],
                f"{r['bytes_per_param']:.3f}",
                f"{r['floor'] / 1e6:,.1f}",
                f"{r['moved'] / 1e6:,.1f}",
                f"{r['ms']:,.2f}",
                f"{bound_ms:,.2f}",
                f"{bound_ms / r['ms']:.2f}",
                f"{r['speed']:.2f}x",
                f"{r['loss']:.4f}",
                f"{100 * (r['loss'] / base['loss'] - 1):+.2f}%",
                f"{equal}/{len(base['tokens'])} ({prefix})",
            )
        )
    head = (
        "weights",
        "bytes/param",
        "floor MB/token",
        "moved MB/token",
        "ms/token",
        "bound ms",
        "frac of bound",
        "speed vs fp32",
        "val loss",
        "loss vs fp32",
        "greedy = fp32 (prefix)",
    )
    return table(head, out, "lrrrrrrrrrl")


def plot(rows, bandwidth, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    mb = [r["floor"] / 1e6 for r in rows]
    ax.plot([0, max(mb) * 1.05], [0, max(mb) * 1.05e6 / bandwidth * 1e3], "k--", lw=1)
    ax.annotate(
        f"bound: bytes / {bandwidth / 1e9:.1f} GB/s",
        (max(mb) * 0.55, max(mb) * 0.62e6 / bandwidth * 1e3),
        fontsize=8,
    )
    for r, x in zip(rows, mb):
        ax.plot(x, r["ms"], "o")
        ax.annotate(r["fmt"], (x, r["ms"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("MB per token (weights streamed + KV cache)")
    ax.set_ylabel("ms per token (measured)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run(args, log=print):
    """Measure every format of args (parse_args's) on its checkpoint, log the table (and draw
    args.plot) -> the rows, measure()'s, one per format."""
    formats = args.formats.split(",")
    if args.new_tokens < 2 or args.rounds < 1:
        raise ValueError(
            f"--new-tokens {args.new_tokens} and --rounds {args.rounds}: time at least one "
            "decode step (--new-tokens 2, the first token comes from the prompt) in a round"
        )
    for fmt in formats:
        split_format(fmt)
    path = find_checkpoint(args.checkpoint)
    stored = read_quantization(path)
    if stored is not None:  # fp32's row and every other format start from the fp32 weights
        raise ValueError(f"{path} holds {stored['format']} weights: give the fp32 checkpoint")
    ensure_data(args)  # the Shakespeare default is made when missing, as the trainer does
    val_path = f"{args.data_dir}/val.bin"
    peak = peaks.get("cpu")
    loader = DataLoader(val_path, args.batch_size, args.seq_len, seed=0)
    prompt = np.asarray(loader.tokens[: args.prompt_len], dtype=np.int64)[None]  # (1, P)
    measured = [measure(path, fmt, args.group_size, val_path, prompt, args) for fmt in formats]
    models, rows = [m for m, _ in measured], [r for _, r in measured]
    timed(models, rows, prompt, args)
    log(
        f"-- weight formats: {path}, greedy decode of {args.new_tokens} tokens after "
        f"{args.prompt_len} ({args.rounds} interleaved rounds), val loss over "
        f"{args.eval_iters} x {args.batch_size} x "
        f"{args.seq_len} tokens; {peak.machine}, read bandwidth {peak.read_bw / 1e9:.1f} GB/s "
        f"(measured {peak.when})"
    )
    log(format_table(rows, peak.read_bw))
    if args.plot:
        title = f"decode per format, {model_name(models[0].config)}: {', '.join(formats)}"
        plot(rows, peak.read_bw, args.plot, title)
        log(f"plot: {args.plot}")
    return rows


def model_name(config):
    """A title's name of the model: its preset (gpt2-mini, gpt2, ...) or its family and shape,
    with its size; never the checkpoint's folder, a path of one machine."""
    size = f"{config.num_parameters() / 1e6:,.1f}M parameters"
    preset = next((name for name, known in PRESETS.items() if known == config), None)
    if preset:
        return f"{preset} ({size})"
    family = "Llama" if isinstance(config, LlamaConfig) else "GPT-2"
    return f"{family} L={config.n_layer}, C={config.n_embd} ({size})"


def main(argv=None):
    args = parse_args(argv)
    with user_errors():
        run(args)


if __name__ == "__main__":
    main()
