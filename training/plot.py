"""The picture of a run: train and validation loss, learning rate, tokens/s and (fp16) the loss
scale over the steps, drawn from the run's metrics.jsonl into a PNG titled with the model and
dtype its checkpoint saved."""

import json
import os

from .checkpoint import find_checkpoint, read_trainer_state

PANELS = [  # (title, [(metrics.jsonl key, label)], log scale)
    ("loss", [("loss", "train"), ("val_loss", "validation")], False),
    ("learning rate", [("lr", "lr")], False),
    ("tokens/s", [("tokens_per_s", "tokens/s")], False),
    ("fp16 loss scale", [("loss_scale", "scale")], True),
]


ROW_BYTES = 1 << 12  # a row of ours is about 250 bytes: a longer line is not one


def read_metrics(path):
    """The rows of a metrics.jsonl: objects with an integer step and numbers, booleans or null
    for values. Anything else (a partial last line of a run killed mid-write, a line that is not
    a row of ours) is left out; no line is read past ROW_BYTES."""
    rows = []
    with open(path, "rb") as f:
        for line in iter(lambda: f.readline(ROW_BYTES), b""):
            try:
                row = json.loads(line)
            except ValueError:  # not JSON, not UTF-8, or a line cut at ROW_BYTES
                continue
            if _is_row(row):
                rows.append(row)
    return rows


def _is_row(row):
    return (
        isinstance(row, dict)
        and type(row.get("step")) is int
        and all(v is None or type(v) in (int, float, bool) for v in row.values())
    )


def panels_for(rows):
    """The PANELS a run's rows have data for (the loss scale only in fp16)."""
    return [p for p in PANELS if any(r.get(key) is not None for r in rows for key, _ in p[1])]


def run_title(run_dir):
    """'gpt2-mini, fp32 — out/': the model and dtype of the run saved in run_dir (its
    checkpoint's run config), or the folder alone when it holds no checkpoint (--no-save).
    A name's bytes that are not UTF-8 (a str holds them as lone surrogates, which no font
    draws) are shown escaped."""
    folder = _printable(os.path.normpath(run_dir) + "/")
    try:
        run = read_trainer_state(find_checkpoint(run_dir))["run_config"]
    except (ValueError, OSError):  # no checkpoint, or one that cannot be read
        return folder
    model = run.get("init_from") or run.get("model")
    return f"{_printable(model)}, {_printable(run.get('dtype'))} — {folder}" if model else folder


def _printable(text):
    """str(text) with its lone surrogates (a path's non-UTF-8 bytes) as \\udcff escapes."""
    return str(text).encode("utf-8", "backslashreplace").decode("utf-8")


def plot_metrics(run_dir, out=None):
    """Draw <run_dir>/metrics.jsonl into out (default <run_dir>/loss.png). -> the PNG's path.
    A panel is drawn only for the metrics the run has (panels_for)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(metrics):
        raise FileNotFoundError(f"no metrics.jsonl in {run_dir}: is it a training run's --out?")
    rows = read_metrics(metrics)
    panels = panels_for(rows)
    if not panels:
        raise ValueError(f"{metrics} has no rows to plot")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, (title, series, log) in zip(axes[0], panels):
        for key, label in series:
            points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if points:
                steps, values = zip(*points)
                ax.plot(
                    steps,
                    values,
                    label=label,
                    marker="o" if key == "val_loss" else None,
                    markersize=3,
                )
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_yscale("log" if log else "linear")
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend()
    fig.suptitle(run_title(run_dir), fontsize=9)
    fig.tight_layout()
    out = out or os.path.join(run_dir, "loss.png")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
