"""scripts/bench.py's report: ours (and ours compiled) beside each peer that ran, a ratio
column for each pair where a ratio means something, and the JSON file of every number."""

import json

import machine
import numpy as np

from accounting import mfu
from accounting.tables import table

PEER_NAMES = {"torch": "torch eager", "torch_compiled": "torch.compile", "hf": "HF generate"}
OURS_NAMES = {"ours": "ours", "ours_compiled": "ours compiled"}  # --compile adds the second

TRAIN_ROWS = [
    ("step ms (median)", "median_ms", ".1f", False),
    ("step ms (min)", "min_ms", ".1f", False),
    ("tokens/s (median)", "tokens_per_s", ",.0f", True),
    ("tokens/s (best step)", "tokens_per_s_best", ",.0f", True),
    ("MFU (median)", "mfu", mfu.percent, True),
    ("spread (max-min)/med", "spread", ".0%", False),
    ("others' CPU share", "foreign_cpu", ".0%", False),
    ("loss after the steps", "last_loss", ".5f", False),
]
GENERATE_ROWS = [
    ("prompt ms", "prompt_ms", ".1f", False),
    ("prompt tokens/s", "prompt_tokens_per_s", ",.0f", True),
    ("decode ms/token", "decode_ms_per_token", ".2f", False),
    ("decode tokens/s", "decode_tokens_per_s", ",.1f", True),
    ("others' CPU share", "foreign_cpu", ".0%", False),
]


def comparison(part, rows):
    """Ours (and ours compiled) beside each peer that ran (part: {"ours": summary, peer:
    summary}), with a column for each of ours over each peer (and compiled over eager) for the
    rows where a ratio means something (throughputs)."""
    labels = {**OURS_NAMES, **PEER_NAMES}
    ours = [name for name in OURS_NAMES if name in part]
    names = ours + [name for name in part if name in PEER_NAMES]
    pairs = [(o, p) for o in ours for p in names if p not in OURS_NAMES]
    pairs += [("ours_compiled", "ours")] if len(ours) == 2 else []
    headers = [""] + [labels[n] for n in names]
    headers += [f"{labels[o]}/{'eager' if p == 'ours' else labels[p]}" for o, p in pairs]
    body = []
    for label, key, spec, ratio in rows:
        cells = [label] + [
            spec(part[name][key]) if callable(spec) else format(part[name][key], spec)
            for name in names
        ]
        body.append(
            cells + [f"{part[o][key] / part[p][key]:.2f}x" if ratio else "" for o, p in pairs]
        )
    return table(headers, body)


def noise_note(part, unit):
    """Which samples the medians use: the quiet ones, or all when too few were quiet."""
    notes = []
    for name, r in part.items():
        if isinstance(r, dict) and f"quiet_{unit}" in r:
            notes.append(
                f"{name} {r[f'quiet_{unit}']} of {r[unit]} quiet"
                if r[f"quiet_{unit}"]
                else f"{name}: too few quiet {unit} of {r[unit]}, median of all (noisy)"
            )
    return (
        f"  medians over the {unit} where other processes took under {machine.QUIET:.0%} "
        "of the CPUs: " + "; ".join(notes)
    )


def format_report(results):
    args, lines = results["args"], []
    train = results.get("train")
    if train:
        lines += [
            f"\ntraining step, {args['dtype']} on {args['device']} ({args['model']}, "
            f"B={args['batch_size']}, T={args['seq_len']}; median of "
            f"{train['ours']['steps']} steps)",
            comparison(train, TRAIN_ROWS),
            noise_note(train, "steps"),
            f"  MFU = tokens/s x {results['flops_per_token'] / 1e6:.1f} MFLOP/token "
            f"(6N + 12LCT) / the {results['peak_name']}",
        ]
    gen = results.get("generate")
    if gen:
        lines += [
            f"\ngeneration, greedy with KV cache (batch {args['gen_batch']}, prompt "
            f"{args['prompt_len']}, {args['new_tokens']} new tokens; median of "
            f"{gen['ours']['runs']} runs)",
            comparison(gen, GENERATE_ROWS),
            noise_note(gen, "runs"),
        ]
    load0, load1 = results["environment"]["load_average"], results.get("load_average_end")
    if load0 and load1:
        lines.append(
            f"\nload average: {load0[0]:.2f} at start, {load1[0]:.2f} at end "
            f"(above ~0.1 means something else was running)"
        )
    return "\n".join(lines)


def write_json(path, results):
    with open(path, "w") as f:
        json.dump(results, f, indent=1, default=_json_default)


def _json_default(o):
    if isinstance(o, (np.integer, np.floating)):
        return o.item()
    return o.tolist() if isinstance(o, np.ndarray) else str(o)
