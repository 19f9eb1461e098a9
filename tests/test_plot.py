"""The run's picture: scripts/plot_metrics.py and the PNG train_gpt2.py writes at the end."""

import json
import os
import subprocess
import sys

import pytest

from training.loop import RunConfig, Trainer
from training.plot import panels_for, plot_metrics, read_metrics, run_title

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_metrics(run_dir, fp16, partial_last_line=False):
    rows = [
        {"step": s, "loss": 10 - s / 10, "lr": 1e-3, "tokens_per_s": 1000.0} for s in range(1, 11)
    ]
    rows[4]["val_loss"] = rows[9]["val_loss"] = 9.5
    if fp16:
        for r in rows:
            r["loss_scale"] = 65536.0
    with open(run_dir / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
        if partial_last_line:
            f.write('{"step": 11, "lo')  # a run killed in the middle of a write


@pytest.mark.parametrize("fp16", [False, True])
def test_panels_follow_the_metrics_present(tmp_path, fp16):
    write_metrics(tmp_path, fp16, partial_last_line=True)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 11))  # the partial line left out
    titles = [title for title, _, _ in panels_for(rows)]
    assert titles == ["loss", "learning rate", "tokens/s"] + (["fp16 loss scale"] if fp16 else [])
    path = plot_metrics(tmp_path)
    assert path == os.path.join(tmp_path, "loss.png")
    with open(path, "rb") as f:
        assert f.read(8) == PNG_MAGIC


def test_script_writes_png_and_refuses_a_folder_without_metrics(tmp_path):
    write_metrics(tmp_path, fp16=False)
    script = os.path.join(ROOT, "scripts", "plot_metrics.py")
    png = tmp_path / "run.png"
    done = subprocess.run(
        [sys.executable, script, str(tmp_path), "--png", str(png)], capture_output=True, text=True
    )
    assert done.returncode == 0 and png.read_bytes()[:8] == PNG_MAGIC
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = subprocess.run([sys.executable, script, str(empty)], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"error: no metrics.jsonl in {empty}: is it a training run's --out?"
    ]


def test_training_run_writes_the_picture(shakespeare, tmp_path, capsys):
    cfg = RunConfig(
        model="gpt2-tiny",
        data_dir=shakespeare,
        batch_size=2,
        seq_len=16,
        steps=2,
        eval_every=0,
        out=str(tmp_path),
        save=False,
        report=False,
    )
    Trainer(cfg).run()
    assert (tmp_path / "loss.png").read_bytes()[:8] == PNG_MAGIC
    assert not (tmp_path / "checkpoint").exists()  # --no-save
    assert f"metrics: {tmp_path / 'loss.png'}" in capsys.readouterr().out
    assert run_title(tmp_path) == f"{tmp_path}/"  # no checkpoint to name the model


def test_the_title_names_the_model_and_dtype_the_checkpoint_saved(shakespeare, tmp_path):
    cfg = RunConfig(
        model="gpt2-tiny",
        data_dir=shakespeare,
        batch_size=2,
        seq_len=16,
        steps=1,
        eval_every=0,
        dtype="bf16",
        out=str(tmp_path / "run"),
        quiet=True,
    )
    Trainer(cfg).run()
    assert run_title(cfg.out) == f"gpt2-tiny, bf16 — {cfg.out}/"
