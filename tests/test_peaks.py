"""tinygrad_like/peaks.py: the machine's peaks are measured once per machine and then read from
the cache, the measurement gives every peak and says how, and every MFU (the trainer's progress
bar and metrics.jsonl, a resumed run's, the accounting report's) divides by the one cached
matmul peak. No timing is asserted: the session's peaks are made up (tests/conftest.py), and the
one measurement runs on tiny sizes."""

import json

import numpy as np
import pytest

from accounting import mfu
from accounting.measure import measure
from nn import GPT2Config
from tinygrad_like import peaks
from training.loop import RunConfig, Trainer


def test_peaks_are_measured_once_per_machine_then_read_from_the_cache(
    machine_peaks, tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []
    monkeypatch.setattr(peaks, "measure", lambda device: calls.append(device) or machine_peaks)
    assert peaks.get("cpu") == machine_peaks and calls == ["cpu"]
    assert peaks.get("cpu") == machine_peaks and calls == ["cpu"]  # from the file
    path = peaks.cache_path("cpu")
    assert path.parent == tmp_path / "tinygrad_like"
    assert json.loads(path.read_text())["copy_bw"] == machine_peaks.copy_bw
    monkeypatch.setenv(peaks.REMEASURE, "1")
    peaks.get("cpu")
    assert calls == ["cpu", "cpu"]
    monkeypatch.setenv(peaks.REMEASURE, "0")
    path.write_text("{not json")  # cut short: measure again
    peaks.get("cpu")
    assert calls == ["cpu"] * 3
    for other in (
        lambda: monkeypatch.setattr(peaks, "cpu_name", lambda: "another CPU"),
        lambda: monkeypatch.setattr(peaks, "usable_cores", lambda: 99),
        lambda: monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1"),
    ):
        other()
        assert peaks.cache_path("cpu") != path  # another machine's file
        path = peaks.cache_path("cpu")


def test_measuring_the_cpu_gives_every_peak_and_says_how(monkeypatch):
    # tiny sizes: this checks the arithmetic runs and names each peak, not the machine
    assert np.isfinite(peaks.cpu_matmul_rate(n=16, tries=1))
    monkeypatch.setattr(peaks, "STREAM_BYTES", {"cpu": 1 << 20})
    monkeypatch.setattr(peaks, "EXP_REPS", 2)
    monkeypatch.setattr(peaks, "LAUNCHES", 20)
    monkeypatch.setattr(peaks, "cpu_matmul_rate", lambda: 1e11)
    measured = peaks.measure("cpu")
    assert measured.matmul == {"fp32": 1e11}
    for value in (measured.copy_bw, measured.read_bw, measured.exp_rate, measured.launch_s):
        assert np.isfinite(value) and value > 0
    assert measured.bandwidth == max(measured.copy_bw, measured.read_bw)
    text = measured.describe()
    for phrase in (
        "fp32 matmul",
        "streaming copy",
        "streaming read",
        "exp",
        "launch floor",
        "thread",
        peaks.cpu_name(),
    ):
        assert phrase in text


def test_a_gpu_is_given_its_datasheet_peak():
    assert peaks.datasheet("bf16", "NVIDIA H200")[0] == 989e12
    rate, phrase = peaks.datasheet("fp32", "NVIDIA A100-SXM4-80GB")
    assert rate == 19.5e12 and "A100 datasheet dense fp32" in phrase
    assert peaks.datasheet("bf16", "a GPU of tomorrow")[1].startswith("unknown GPU")


def _no_measuring(*args, **kwargs):
    raise AssertionError("the peaks were measured again though the cache holds them")


@pytest.mark.usefixtures("one_blas_thread")
def test_every_mfu_divides_by_the_one_cached_peak(
    machine_peaks, shakespeare, tmp_path, monkeypatch
):
    """The bug: the trainer measured the matmul peak afresh at each start, so a resumed run
    divided by another number (MFU 112.7% in metrics.jsonl). Now nothing measures while the
    cache holds the peaks, and the first run, the resumed run and the accounting report all
    divide by its matmul peak."""
    monkeypatch.setattr(peaks, "measure", _no_measuring)
    monkeypatch.setattr(peaks, "cpu_matmul_rate", _no_measuring)
    peak = machine_peaks.flops("fp32")
    assert mfu.device_peak("cpu", "fp32")[0] == peak
    cfg = dict(
        model="gpt2-tiny",
        data_dir=shakespeare,
        batch_size=2,
        seq_len=16,
        warmup=1,
        eval_every=0,
        out=str(tmp_path),
        quiet=True,
        report=False,
    )
    first = Trainer(RunConfig(**cfg, steps=1))
    first.run()
    resumed = Trainer(RunConfig(**cfg, steps=2, resume=str(tmp_path)))
    resumed.run()
    with open(tmp_path / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [1, 2]
    for row, trainer in zip(rows, (first, resumed)):  # the progress bar shows row["mfu"]
        assert row["mfu"] == pytest.approx(row["tokens_per_s"] * trainer.flops_per_token / peak)
    report = measure(GPT2Config.from_preset("gpt2-tiny"), batch_size=1, seq_len=8)
    assert report.peak == peak and f"{peak / 1e9:.0f} GFLOP/s" in report.peak_name
