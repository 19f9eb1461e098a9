"""Print the tape of one forward pass: every record with its op, module scope, shapes, dtype,
forward and backward FLOPs and the bytes it saved for backward, then totals per op kind and per
layer. The backward runs too, so its FLOPs are counted from the kernels it really launches.

    python scripts/inspect_tape.py                                  # gpt2-mini, B=1, T=64
    python scripts/inspect_tape.py --model gpt2 --seq-len 128 --json tape.json
    python scripts/inspect_tape.py --checkpoint out --data data/shakespeare/val.bin --dtype bf16

The totals are checked against the profiler, which sees every launch: the records' forward
FLOPs are the forward phase's, and the records' backward FLOPs plus the launches no record
owns (gradients summed across uses, added into each .grad) are the backward phase's.
"""

import json

from accounting.measure import forward_backward, group, layer_of
from accounting.tables import table
from nn import build, from_pretrained
from tinygrad_like import dtypes
from tinygrad_like.profiler import Profiler
from training.args import (
    ArgumentParser,
    add_step_args,
    batch_from_args,
    check_model_args,
    config_from_args,
    options_from_args,
    user_errors,
)
from training.checkpoint import find_checkpoint


def parse_args(argv=None):
    p = ArgumentParser(
        description="List the autograd tape of one GPT-2 or Llama forward pass with "
        "FLOPs and saved bytes per record, op kind and layer."
    )
    add_step_args(p, model="gpt2-mini")
    p.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="instead of --model: a training run's folder or a Hugging Face GPT-2 or Llama "
        "directory",
    )
    p.add_argument("--json", metavar="PATH", help="also write the listing and totals as JSON")
    return p.parse_args(argv)


def build_model(args, device):
    options = options_from_args(args)
    if args.checkpoint:
        return from_pretrained(
            find_checkpoint(args.checkpoint), dtype=args.dtype, device=device, **options
        )
    config = config_from_args(args)  # the preset's family: GPT-2 or Llama
    return build(config, device=device, **options).to(dtype=args.dtype)


def inspect(model, x, y):
    """Run forward and backward under a profiler. -> the JSON-ready result: the records, totals
    per op and per layer, the launches outside records, and the profiler's sums per phase."""
    with Profiler() as prof:
        records, _, unowned = forward_backward(model, x, y)
    return {
        "batch_size": int(x.shape[0]),
        "seq_len": int(x.shape[1]),
        "records": records,
        "per_op": group(records, lambda r: r["op"]),
        "per_layer": group(records, lambda r: layer_of(r["scope"])),
        "outside_records": {phase: vars(u) for phase, u in unowned.items()},
        "profiler": prof.by_phase(),
    }


def _shapes(pairs):
    return ", ".join("x".join(map(str, shape)) or "scalar" for shape, _ in pairs)


def format_listing(result):
    rows = [
        (
            r["seq"] - result["records"][0]["seq"],
            r["op"],
            r["scope"] or "(model)",
            _shapes(r["inputs"]),
            _shapes(r["outputs"]),
            dtypes.name(dtypes.as_dtype(r["outputs"][0][1])),
            f"{r['fwd_flops']:,}",
            f"{r['bwd_flops']:,}",
            f"{r['saved_bytes']:,}",
        )
        for r in result["records"]
    ]
    return table(
        ("#", "op", "scope", "inputs", "outputs", "dtype", "fwd FLOPs", "bwd FLOPs", "saved bytes"),
        rows,
        "rllllrrrr",
    )


def format_totals(groups, label):
    rows = [
        (
            name,
            g["records"],
            f"{g['fwd_flops']:,}",
            f"{g['bwd_flops']:,}",
            g["fwd_launches"],
            g["bwd_launches"],
            f"{g['saved_bytes']:,}",
        )
        for name, g in groups.items()
    ]
    return table(
        (label, "records", "fwd FLOPs", "bwd FLOPs", "fwd launches", "bwd launches", "saved bytes"),
        rows,
    )


def format_check(result):
    """The tape's totals beside the profiler's, phase by phase."""
    lines = []
    for phase, field in (("forward", "fwd_flops"), ("backward", "bwd_flops")):
        on_tape = sum(r[field] for r in result["records"])
        outside = result["outside_records"][phase]
        counted = result["profiler"][phase]["flops"]
        total = on_tape + outside["flops"]
        lines.append(
            f"  {phase:<9} records {on_tape:>16,} + outside records "
            f"{outside['flops']:>12,} ({outside['launches']} launches) = {total:>16,}; "
            f"profiler {counted:>16,}  {'equal' if total == counted else 'DIFFERENT'}"
        )
    return "\n".join(lines)


def load(args):
    """-> (model, x, y); bad input (a missing checkpoint or data file, a sequence longer than
    the context) raises ValueError or FileNotFoundError with the reason."""
    check_model_args(args, model_from_checkpoint=bool(args.checkpoint))
    model = build_model(args, args.device)
    model.config.check_context(args.seq_len, "--seq-len")
    return (model, *batch_from_args(args, model.config.vocab_size))


def main(argv=None):
    args = parse_args(argv)
    with user_errors():
        model, x, y = load(args)
    result = inspect(model, x, y)
    result.update(model=args.checkpoint or args.model, dtype=args.dtype)
    tokens = args.batch_size * args.seq_len
    print(
        f"tape of {result['model']}: B={args.batch_size}, T={args.seq_len}, {args.dtype}, "
        f"{len(result['records'])} records (FLOPs counted from the kernels each record "
        "launched, forward and backward; saved bytes charged to the first record that "
        "saved a buffer)"
    )
    print(format_listing(result))
    print("\ntotals per op kind")
    print(format_totals(result["per_op"], "op"))
    print("\ntotals per layer")
    print(format_totals(result["per_layer"], "layer"))
    saved = sum(r["saved_bytes"] for r in result["records"])
    print(f"\nsaved for backward: {saved:,} bytes, {saved / tokens:,.0f} per token")
    print("tape against the profiler (FLOPs):")
    print(format_check(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
