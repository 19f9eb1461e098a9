"""Batched decode along the roofline: greedy decode of B = 1, 2, 4, ... 64 random prompts on a
fresh model, printing tokens/s, each weight GEMM's arithmetic intensity, bound and fraction of
its roof, and the B at which decode turns compute-bound, predicted from the ridge point
(tinygrad_like/peaks.py) beside measured (accounting/decode.py says how). A benchmark, not a test.

    python scripts/decode_sweep.py                        # gpt2-mini, fp32, B = 1 ... 64
    python scripts/decode_sweep.py --model llama-mini --dtype bf16 --batches 1,4,16,64
"""

from accounting.decode import format_sweep, sweep_batch
from nn import build
from tinygrad_like import peaks
from training.args import (
    ArgumentParser,
    add_model_args,
    check_model_args,
    config_from_args,
    user_errors,
)


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__)
    add_model_args(p, model="gpt2-mini", seq_len=16)  # --seq-len: the prompt's tokens
    p.add_argument("--new-tokens", type=int, default=16, help="decode steps (default 16)")
    p.add_argument("--batches", default="1,2,4,8,16,32,64", help="the B to run, comma-separated")
    p.add_argument(
        "--kv-dtype", help="the KV cache: fp32, fp16, bf16, fp8_e4m3 or fp8_e5m2 (default --dtype)"
    )
    return p.parse_args(argv)


def run(args, log=print):
    """Decode at each B of args (parse_args's) and log the table -> sweep_batch's results."""
    check_model_args(args)
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        raise ValueError(f"--batches {args.batches!r}: give integers, e.g. 1,2,4") from None
    if min(batches) <= 0 or args.new_tokens <= 0:
        raise ValueError("--batches and --new-tokens must be positive")
    config = config_from_args(args)
    config.check_context(args.seq_len + args.new_tokens, "--seq-len + --new-tokens =")
    model = build(config, device=args.device).to(dtype=args.dtype)
    peak = peaks.get(args.device)
    kv = args.kv_dtype or args.dtype
    results = [sweep_batch(model, b, args.seq_len, args.new_tokens, kv, peak) for b in batches]
    log(format_sweep(results, config, args.dtype, peak))
    return results


def main(argv=None):
    args = parse_args(argv)
    with user_errors():
        run(args)


if __name__ == "__main__":
    main()
