"""Print the accounting report: ACCOUNTING.md's figures predicted beside measured.

    python scripts/accounting.py --model gpt2                 # GPT-2 124M, B=1, T=64, fp32
    python scripts/accounting.py --model gpt2-mini --batch-size 8 --seq-len 128 --dtype bf16

The measurement runs one untimed and one profiled training step on a fresh model, then one
decode step with a KV cache; see training/report.py for what each section measures.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nn import GPT2Config  # noqa: E402
from nn.gpt2 import PRESETS  # noqa: E402
from tinygrad_like import backend  # noqa: E402
from tinygrad_like.data import DataLoader  # noqa: E402
from training import report  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Predicted versus measured FLOPs, bytes, memory "
                                "and launches of a GPT-2 training step.")
    p.add_argument("--model", default="gpt2", choices=sorted(PRESETS), help="preset (default gpt2)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--dtype", default="fp32", choices=("fp32", "fp16", "bf16"))
    p.add_argument("--device", help="cpu or cuda (default: cuda when a GPU is usable)")
    p.add_argument("--data", metavar="BIN", help="draw the batch from this token file "
                   "(e.g. data/shakespeare/val.bin) instead of random ids")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    args = p.parse_args(argv)
    if args.batch_size <= 0 or args.seq_len <= 0 or args.warmup < 0:
        p.error("--batch-size and --seq-len must be positive, --warmup >= 0")
    if args.seq_len > PRESETS[args.model].n_positions:
        p.error(f"--seq-len {args.seq_len} is longer than the context of "
                f"{PRESETS[args.model].n_positions} of {args.model}")
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        device = backend.check_device(args.device or backend.default_device())
        batch = None
        if args.data:
            batch = DataLoader(args.data, args.batch_size, args.seq_len, seed=0).next_batch()
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        sys.exit(f"error: {e}")
    t0 = time.perf_counter()
    m = report.measure(GPT2Config.from_preset(args.model), args.dtype, device, args.batch_size,
                       args.seq_len, batch=batch, warmup=args.warmup)
    print(f"model {args.model}: measured in {time.perf_counter() - t0:.1f} s")
    print(report.format_report(m))


if __name__ == "__main__":
    main()
