"""tinygrad_like/peaks.py: the machine's peaks are measured once per machine and then read from
the cache, the measurement gives every peak and says how, and every MFU (the trainer's progress
bar and metrics.jsonl, a resumed run's, the accounting report's) divides by the one cached
matmul peak. No timing is asserted: the session's peaks are made up (tests/conftest.py), and the
one measurement runs on tiny sizes."""

import dataclasses
import json

import numpy as np
import pytest

from accounting import mfu, report
from accounting.measure import measure
from nn import GPT2Config
from tinygrad_like import peaks
from training.loop import RunConfig, Trainer


def _new_process(monkeypatch):
    """Forget the peaks this process read, as the next process would start."""
    monkeypatch.setattr(peaks, "_READ", {})


def test_peaks_are_measured_once_per_machine_then_read_from_the_cache(
    machine_peaks, tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []
    monkeypatch.setattr(peaks, "measure", lambda device: calls.append(device) or machine_peaks)
    assert peaks.get("cpu") == machine_peaks and calls == ["cpu"]
    assert peaks.get("cpu") == machine_peaks and calls == ["cpu"]  # this process's
    _new_process(monkeypatch)
    assert peaks.get("cpu") == machine_peaks and calls == ["cpu"]  # from the file
    path = peaks.cache_path("cpu")
    assert path.parent == tmp_path / "tinygrad_like"
    assert json.loads(path.read_text())["copy_bw"] == machine_peaks.copy_bw
    # measured again once per process: every figure of one report divides by one peak
    monkeypatch.setenv(peaks.REMEASURE, "1")
    _new_process(monkeypatch)
    peaks.get("cpu")
    peaks.get("cpu")
    assert calls == ["cpu", "cpu"]
    monkeypatch.setenv(peaks.REMEASURE, "0")
    _new_process(monkeypatch)
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


@pytest.mark.parametrize(
    "tamper",
    [
        lambda d: d.update(matmul={"fp32": -1.0}),  # a rate must be positive
        lambda d: d.update(copy_bw=float("nan")),
        lambda d: d.update(matmul={"bf16": 1e12}),  # no fp32 peak
        lambda d: d.update(read_bw="fast"),
        lambda d: d.update(others=3.0),  # a share of the CPUs is at most 1
        lambda d: d.update(measurements=0),
        lambda d: d.update(how=["made up"]),
        lambda d: d.update(machine="x" * (1 << 20)),  # over a small file's size
    ],
)
def test_a_cache_file_out_of_range_is_measured_again(machine_peaks, tmp_path, monkeypatch, tamper):
    """The peaks' cache is a file anyone could have written: read as untrusted input, a field
    of the wrong type or out of range, or a file too big, is a cache to measure again."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []
    monkeypatch.setattr(peaks, "measure", lambda device: calls.append(device) or machine_peaks)
    path = peaks.cache_path("cpu")
    path.parent.mkdir(parents=True)
    fields = dataclasses.asdict(machine_peaks)
    tamper(fields)
    path.write_text(json.dumps(fields))
    _new_process(monkeypatch)
    assert peaks.get("cpu") == machine_peaks and calls == ["cpu"]


def test_a_peak_measured_while_others_use_the_cpu_is_marked_and_measured_again(
    machine_peaks, tmp_path, monkeypatch
):
    """The bug: a new user's first measurement ran beside a busy process (36 GFLOP/s against
    90-136 later) and every report after it printed MFU of 106% to 284%. Now a measurement
    during which others took over QUIET of the CPUs is marked, the next process measures
    again, and each peak is the best of the measurements, until one is quiet."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    busy = dataclasses.replace(
        machine_peaks,
        matmul={"fp32": 36e9},
        launch_s=2e-6,
        others=0.45,
        how=dict(machine_peaks.how),
    )
    busy.how["matmul_fp32"] = "busy"
    later = [
        dataclasses.replace(busy, matmul={"fp32": 90e9}, copy_bw=5e9, others=0.3),
        dataclasses.replace(busy, matmul={"fp32": 80e9}, others=0.02),  # quiet
    ]
    measured = [busy] + later
    monkeypatch.setattr(peaks, "measure", lambda device: measured.pop(0))
    first = peaks.get("cpu")
    assert first.busy and "BUSY: other processes took 45% of the CPUs" in first.describe()
    assert "BUSY" in mfu.device_peak("cpu", "fp32", first)[1]
    assert peaks.get("cpu") is first  # not again in this process: one peak per report
    _new_process(monkeypatch)
    second = peaks.get("cpu")
    assert second.busy and second.measurements == 2 and "best of 2" in second.describe()
    assert second.matmul == {"fp32": 90e9} and second.how["matmul_fp32"] == "busy"
    assert second.copy_bw == machine_peaks.copy_bw and second.launch_s == 2e-6  # the best
    _new_process(monkeypatch)
    third = peaks.get("cpu")
    assert not third.busy and third.measurements == 3 and third.matmul == {"fp32": 90e9}
    assert "BUSY" not in third.describe() and "took 2% of the CPUs" in third.describe()
    _new_process(monkeypatch)
    assert peaks.get("cpu") == third and not measured  # quiet: read from the file
    # a machine busy every time is measured BUSY_MEASUREMENTS times, then left marked
    monkeypatch.setattr(peaks, "measure", lambda device: busy)
    monkeypatch.setenv(peaks.REMEASURE, "1")
    _new_process(monkeypatch)
    assert peaks.get("cpu") == busy  # asked for: measured afresh, the file replaced
    monkeypatch.setenv(peaks.REMEASURE, "0")
    for count in range(2, peaks.BUSY_MEASUREMENTS + 1):
        _new_process(monkeypatch)
        assert peaks.get("cpu").measurements == count
    monkeypatch.setattr(peaks, "measure", _no_measuring)
    _new_process(monkeypatch)
    assert peaks.get("cpu").busy


def test_the_load_beside_a_measurement_is_the_others_share_of_the_cores(monkeypatch):
    monkeypatch.setattr(peaks, "usable_cores", lambda: 2)
    # the machine busy 3 s of 2 cores x 2 s, this process 1.8 s of them: others 1.2 s, 30%
    assert peaks.others_share((10.0, 5.0), (13.0, 6.8), 2.0) == pytest.approx(0.3)
    assert peaks.others_share((10.0, 5.0), (11.0, 6.8), 2.0) == 0  # never below 0
    busy, ours = peaks.cpu_times()
    assert ours > 0 and (busy > 0 or np.isnan(busy))


def test_a_runs_own_gemms_raise_a_lower_peak_and_say_so(machine_peaks, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(peaks, "measure", lambda device: machine_peaks)
    peak = machine_peaks.flops("fp32")
    assert peaks.beaten("cpu", "fp32", peak / 2, "matmul") == (machine_peaks, None)  # below
    raised, note = peaks.beaten("cpu", "fp32", 2 * peak, "matmul_nt (3 launches)")
    assert raised.flops("fp32") == raised.flops("bf16") == 2 * peak  # bf16's is fp32's here
    assert f"matmul_nt (3 launches) reached {2 * peak / 1e9:,.1f} GFLOP/s, above the cached" in note
    assert "raised to a run's own GEMM" in raised.describe()
    _new_process(monkeypatch)
    assert peaks.get("cpu") == raised  # in the cache for the runs after


def test_a_bf16_gemm_raises_bf16s_peak_never_fp32s(machine_peaks, tmp_path, monkeypatch):
    """The bug: a bf16 run's GEMMs (AVX-512 BF16's dot products, twice fp32's rate) raised the
    CPU's one fp32 peak, and every fp32 MFU and roof after it read 1.6x low."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(peaks, "measure", lambda device: machine_peaks)
    peak = machine_peaks.flops("fp32")
    raised, note = peaks.beaten("cpu", "bf16", 2 * peak, "matmul_nt (3 launches)")
    assert raised.flops("bf16") == 2 * peak and raised.flops("fp32") == peak
    assert raised.flops("fp16") == peak and "above the cached bf16 matmul peak" in note
    assert peaks.beaten("cpu", "bf16", 1.5 * peak, "matmul")[1] is None  # below bf16's own


def test_one_report_reads_one_peak_and_its_gemms_raise_a_lower_one(
    machine_peaks, tmp_path, monkeypatch
):
    """The bugs: TG_REMEASURE_PEAKS=1 measured again inside one report, which printed two
    peaks; and a low peak gave every report an MFU over 100%. The report reads the peaks once,
    and its profiled step's GEMMs raise a peak they beat, saying so."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(peaks.REMEASURE, "1")
    low = dataclasses.replace(machine_peaks, matmul={"fp32": 1e6})  # any GEMM beats 1 MFLOP/s
    calls = []
    monkeypatch.setattr(peaks, "measure", lambda device: calls.append(device) or low)
    m = measure(GPT2Config.from_preset("gpt2-tiny"), batch_size=1, seq_len=8, warmup=0)
    text = report.format_report(m)
    assert calls == ["cpu"]
    assert m.peak == m.machine.flops("fp32") > 1e6 and m.machine.describe() in text
    assert "above the cached fp32 matmul peak of 0.0 (measured" in m.peak_note
    assert "\n  " + m.peak_note in text and "over 100%" not in text
    assert peaks.get("cpu") is m.machine  # and for the rest of the process


def test_mfu_above_100_percent_is_never_printed_as_a_figure():
    assert mfu.percent(0.2481, 2) == "24.81%" and mfu.percent(1.0) == "100.0%"
    shown = mfu.percent(1.35)
    assert "135" not in shown and shown.startswith("over 100%") and "too low" in shown


def test_measuring_the_cpu_gives_every_peak_and_says_how(monkeypatch):
    # tiny sizes: this checks the arithmetic runs and names each peak, not the machine
    rates = peaks.cpu_matmul_rate(n=16, tries=1)  # one per OpenBLAS kernel set the GEMMs may run on
    assert rates and all(np.isfinite(r) and r > 0 for r in rates.values())
    monkeypatch.setattr(peaks, "STREAM_BYTES", {"cpu": 1 << 20})
    monkeypatch.setattr(peaks, "EXP_REPS", 2)
    monkeypatch.setattr(peaks, "LAUNCHES", 20)
    monkeypatch.setattr(peaks, "cpu_matmul_rate", lambda: {"Haswell": 5e10, "SkylakeX": 1e11})
    measured = peaks.measure("cpu")
    assert measured.matmul == {"fp32": 1e11}  # the best kernel set's
    for value in (measured.copy_bw, measured.read_bw, measured.exp_rate, measured.launch_s):
        assert np.isfinite(value) and value > 0
    assert measured.bandwidth == max(measured.copy_bw, measured.read_bw)
    text = measured.describe()
    for phrase in (
        "fp32 matmul",
        "streaming copy",
        "streaming read",
        "exp",
        "np.exp",  # the exp peak is the faster of NumPy's exp and ours, both named
        "our exp kernel",
        "launch floor",
        "OpenBLAS Haswell 50 GFLOP/s; OpenBLAS SkylakeX 100 GFLOP/s",  # each set named
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
