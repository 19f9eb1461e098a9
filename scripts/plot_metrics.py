"""Draw a training run's metrics.jsonl (train and validation loss, learning rate, tokens/s and
the fp16 loss scale when present) into a PNG.

    python scripts/plot_metrics.py out                 # -> out/loss.png
    python scripts/plot_metrics.py out --png run.png
"""

from training.args import ArgumentParser, user_errors
from training.plot import plot_metrics


def main(argv=None):
    p = ArgumentParser(description="Plot a training run's metrics.jsonl into a PNG.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (train_gpt2.py's --out)")
    p.add_argument("--png", help="where to write the picture (default RUN_DIR/loss.png)")
    args = p.parse_args(argv)
    with user_errors():
        print(f"wrote {plot_metrics(args.run_dir, args.png)}")


if __name__ == "__main__":
    main()
