"""Print the accounting report: ACCOUNTING.md's figures predicted beside measured.

    python scripts/report.py --model gpt2                 # GPT-2 124M, B=1, T=64, fp32
    python scripts/report.py --model gpt2-mini --batch-size 8 --seq-len 128 --dtype bf16
    python scripts/report.py --model gpt2-xl --device meta --dtype bf16 --seq-len 1024 \
        --zero 2 --world-size 8      # counted, not run: rank 0 of 8, in seconds

The measurement runs one untimed and one profiled training step on a fresh model, then one
decode step with a KV cache; see accounting/report.py for what each section measures.
--counts-only prints the part that is the same on every machine and device (docs/ quotes it;
tests/test_docs.py regenerates it on the meta device). Nothing in proportion to B x T is
allocated before the fit check, nor at all on the meta device (its batch is shapes only).
"""

import time

from accounting import fits, measure, predictions, report
from tinygrad_like import backend
from training.args import (
    ArgumentParser,
    add_step_args,
    batch_from_args,
    check_model_args,
    config_from_args,
    options_from_args,
    user_errors,
)


def parse_args(argv=None):
    p = ArgumentParser(
        description="Predicted versus measured FLOPs, bytes, memory and "
        "launches of a GPT-2 training step."
    )
    add_step_args(p, model="gpt2")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    p.add_argument("--zero", type=int, default=0, help="AdamW's ZeRO stage: 0, 1 or 2 (default 0)")
    p.add_argument(
        "--world-size",
        type=int,
        default=1,
        help="ranks R: with --device meta, count rank 0 of R (default 1)",
    )
    p.add_argument(
        "--counts-only",
        action="store_true",
        help="print only what is the same on every machine and device (counts, bytes, "
        "predictions): no times, MFU, peaks nor census (what docs/ quotes)",
    )
    p.add_argument(
        "--budget-gb",
        type=float,
        help="memory for the largest-batch table (default: the GPU's memory, or 8 GB on a CPU)",
    )
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    with user_errors():
        check_model_args(args)
        measure.check_measurable(args.device, args.dtype, args.world_size)
        if args.zero not in (0, 1, 2):
            raise ValueError(f"--zero must be 0, 1 or 2, got {args.zero}")
        options = options_from_args(args)
        if args.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
        if args.budget_gb is not None and not 0 < args.budget_gb < float("inf"):
            raise ValueError(f"--budget-gb must be a positive number, got {args.budget_gb}")
        config = config_from_args(args)
        measure.check_world(config, args.world_size)
        shape = (config, args.batch_size, args.seq_len, args.dtype)
        fits.check(  # before the batch, and minutes of building a model that cannot be held
            predictions.predicted_peak_bytes(
                *shape, **options, zero=args.zero, world=args.world_size
            ),
            args.device,
            f"{args.model}'s training step at --batch-size {args.batch_size} x --seq-len "
            f"{args.seq_len} in {args.dtype}",
            "use a smaller --model, --batch-size or --seq-len",
        )
        # on meta (no --data, which it refuses) measure's batch: shapes, nothing allocated
        meta = not backend.get(args.device).HOLDS_VALUES and not args.data
        batch = None if meta else batch_from_args(args, config.vocab_size)
    t0 = time.perf_counter()
    m = measure.measure(
        config,
        args.dtype,
        args.device,
        args.batch_size,
        args.seq_len,
        batch=batch,
        warmup=args.warmup,
        zero=args.zero,
        world_size=args.world_size,
        **options,
    )
    if not args.counts_only:  # a time
        print(f"model {args.model}: measured in {time.perf_counter() - t0:.1f} s")
    budget = args.budget_gb and args.budget_gb * 1e9
    print(report.format_report(m, budget, counts_only=args.counts_only))


if __name__ == "__main__":
    main()
