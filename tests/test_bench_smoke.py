"""scripts/bench.py on gpt2-tiny for a step or two, without PyTorch: every number it returns
is positive and finite, the report and the JSON file are written (also when interrupted).
scripts/bench_kernels.py's arguments and table cells, and the GPU session scripts' syntax,
without a GPU. (One test checks the PyTorch twin gives our loss; it runs only where torch is
installed.)"""

import importlib.util
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from accounting.measure import random_batch

_SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


def _load(name):
    if _SCRIPTS not in sys.path:  # bench.py imports its siblings (machine, torch_gpt2, ...)
        sys.path.insert(0, _SCRIPTS)
    spec = importlib.util.spec_from_file_location(name, os.path.join(_SCRIPTS, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _refused(capsys, parse_args, argv, message):
    """parse_args(argv) exits 2, its stderr an `error: ...` saying message."""
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and message in err


@pytest.fixture(scope="module")
def bench():
    return _load("bench")


TINY = [
    "--model",
    "gpt2-tiny",
    "--batch-size",
    "2",
    "--seq-len",
    "16",
    "--steps",
    "2",
    "--rounds",
    "1",
    "--warmup",
    "1",
    "--prompt-len",
    "4",
    "--new-tokens",
    "3",
    "--gen-repeats",
    "1",
    "--no-torch",
    "--no-hf",
    "--device",
    "cpu",
]


def positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_run_returns_positive_finite_numbers(bench):
    results = bench.run(bench.parse_args(TINY + ["--census"]), {}, log=lambda *a: None)
    assert positive(results["peak_flops"])
    # MFU and the roofline divide by the one cached matmul peak (the trainer's too)
    assert results["peak_flops"] == results["census"]["peaks"]["matmul"]["fp32"]
    assert results["tokens_per_step"] == 32 and positive(results["flops_per_token"])
    train = results["train"]["ours"]
    assert train["steps"] == 2
    for key in ("median_ms", "min_ms", "max_ms", "tokens_per_s", "mfu", "last_loss"):
        assert positive(train[key]), key
    assert train["mfu"] < 1.5  # a fraction of the peak, not a count
    assert "torch" not in results["train"]
    gen = results["generate"]["ours"]
    for key in ("prompt_ms", "prompt_tokens_per_s", "decode_ms_per_token", "decode_tokens_per_s"):
        assert positive(gen[key]), key
    assert "hf" not in results["generate"]
    census = results["census"]
    names = {r["kernel"] for r in census["train"]["rows"]}
    assert {"matmul", "adamw_step"} <= names
    assert any(name.startswith("cross_entropy") for name in names)
    assert all(r["seconds"] >= 0 and r["calls"] > 0 for r in census["train"]["rows"])
    assert positive(census["train"]["wall_s"]) and positive(census["decode"]["wall_s"])
    assert {r["kernel"] for r in census["decode"]["rows"]} >= {"matmul", "kv_attention"}
    report = bench.format_report(results)
    assert "tokens/s" in report and "decode tokens/s" in report


def test_main_writes_json(bench, tmp_path, capsys):
    path = tmp_path / "bench.json"
    bench.main(TINY + ["--no-generate", "--dtype", "bf16", "--json", str(path)])
    out = capsys.readouterr().out
    assert "training step, bf16 on cpu" in out and "matmul peak" in out
    data = json.loads(path.read_text())
    assert positive(data["train"]["ours"]["tokens_per_s"])
    assert "generate" not in data


def test_compile_times_the_replayed_step_beside_the_eager_one(bench, monkeypatch):
    """--compile: a twin of our model from the same seed takes the same steps captured (on
    the warm-up steps) and replayed (the timed ones), its loss after them the eager model's,
    bit for bit (fp32); the report puts it beside ours, with compiled over eager."""
    import bench_ours

    made = []
    compile_step = bench_ours.graph.compile
    monkeypatch.setattr(
        bench_ours.graph, "compile", lambda fn: made.append(compile_step(fn)) or made[-1]
    )
    args = bench.parse_args(TINY + ["--no-generate", "--warmup", "2", "--compile"])
    results = bench.run(args, {}, log=lambda *a: None)
    (step,) = made  # replayed: recorded, nothing failed
    assert step.program is not None and step.last.failed is None
    eager, compiled = results["train"]["ours"], results["train"]["ours_compiled"]
    assert compiled["steps"] == 2 and positive(compiled["tokens_per_s"])
    assert compiled["last_loss"] == eager["last_loss"]
    assert "ours compiled/eager" in bench.format_report(results)


def test_json_is_written_when_interrupted(bench, tmp_path, monkeypatch):
    def stop(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "bench_training", stop)
    path = tmp_path / "bench.json"
    with pytest.raises(KeyboardInterrupt):
        bench.main(TINY + ["--json", str(path)])
    data = json.loads(path.read_text())
    assert positive(data["generate"]["ours"]["decode_tokens_per_s"]) and "train" not in data


def test_environment_names_the_blas(bench):
    info = bench.machine.environment_info()
    assert info["logical_cpus"] >= 1 and info["blas"]["source"] and "gpu" not in info
    text = bench.machine.format_environment(info, "test peak, 1 GFLOP/s")
    assert "test peak, 1 GFLOP/s" in text and "BLAS variables" in text
    # what numpy.show_config alone knows of the BLAS: no thread count, no file
    info["blas"]["libraries"] = [
        {"internal_api": "openblas", "version": "0.3", "num_threads": None}
    ]
    line = bench.machine.format_environment(info, "p").splitlines()[1]
    assert line == "  openblas: 0.3"


def test_the_peers_idle_openmp_threads_sleep_where_ours_do(bench, monkeypatch):
    """With a PyTorch peer beside ours' workqueue step, libgomp's threads are asked to sleep
    when idle (set before torch loads); not without a peer, not where ours runs on OpenMP's
    pool too (a bf16 step with the dot product, a decode-only --compile run), not over a
    policy or spin count the user set."""
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: name == "torch")
    peer = [a for a in TINY if a != "--no-torch"]  # a run with a PyTorch peer
    args = bench.parse_args(peer)
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):  # unset now, as they were after
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    said = []
    bench.quiet_peer_threads(bench.parse_args(TINY), said.append)  # --no-torch
    assert "OMP_WAIT_POLICY" not in os.environ and not said
    bench.quiet_peer_threads(bench.parse_args(peer + ["--no-train", "--compile"]), said.append)
    assert "OMP_WAIT_POLICY" not in os.environ
    monkeypatch.setenv("GOMP_SPINCOUNT", "10")  # the user's
    bench.quiet_peer_threads(args, said.append)
    assert "OMP_WAIT_POLICY" not in os.environ
    monkeypatch.delenv("GOMP_SPINCOUNT")
    bench.quiet_peer_threads(args, said.append)
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and "PASSIVE" in said[0]


def test_without_torch_the_peers_are_said_skipped(bench, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    said = []
    assert bench.import_torch("cpu", "fp32", said.append) is None
    assert said == [
        "PyTorch not installed: peers skipped (pip install torch transformers to compare)"
    ]


def test_generation_and_step_helpers(bench):
    config = bench.GPT2Config.from_preset("gpt2-tiny")
    model, opt, scaler = bench.build_ours(config)
    assert scaler is None
    x, y = random_batch(config.vocab_size, 2, 8)
    first = bench.ours_train_step(model, opt, x, y)
    assert positive(first) and abs(first - math.log(config.vocab_size)) < 0.5
    prompt_s, decode_s, ids = bench.ours_generate(model, x[:1, :4], 3)
    assert positive(prompt_s) and positive(decode_s) and ids.shape == (1, 3)
    assert ids.dtype == np.int64 and (ids >= 0).all() and (ids < config.vocab_size).all()
    replayed = bench.ours_generate(model, x[:1, :4], 3, compile=True)[2]  # --compile's decode
    np.testing.assert_array_equal(replayed, ids)


def test_decode_formats_and_decode_sweep_flags(bench, tmp_path, shakespeare):
    """--decode-formats (on the run's fresh weights, its --plot the formats' picture, no census)
    and --decode-sweep run scripts/decode_formats.py's and decode_sweep.py's work and keep
    their results."""
    png = tmp_path / "formats.png"
    flags = ["--no-train", "--no-generate", "--decode-formats", "--formats", "fp32,int8"]
    flags += ["--data-dir", shakespeare, "--plot", str(png), "--decode-sweep"]
    said = []
    results = bench.run(bench.parse_args(TINY + flags), {}, log=said.append)
    formats = results["decode_formats"]
    assert [r["fmt"] for r in formats] == ["fp32", "int8"] and "census" not in results
    assert formats[0]["bytes_per_param"] == 4 and formats[1]["bytes_per_param"] == 1 + 4 / 32
    assert all(positive(r["ms"]) and positive(r["loss"]) and len(r["tokens"]) == 3 for r in formats)
    assert png.stat().st_size > 0 and f"plot: {png}" in said
    sweep = results["decode_sweep"]
    assert [r["batch"] for r in sweep] == [1, 2, 4, 8, 16, 32, 64]
    assert all(positive(r["tokens_per_s"]) and r["gemms"] for r in sweep)
    assert any("-- weight formats:" in line for line in said)
    assert "train" not in results and "generate" not in results


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "gpt2-tiny", "--seq-len", "65"],  # context 64
        ["--model", "nope"],
        ["--steps", "0"],
        ["--dtype", "int8"],
        ["--checkpoint", "out"],  # without --decode-formats
        ["--decode-formats", "--census", "--plot", "x.png"],
    ],
)
def test_bad_arguments_exit_2_with_one_line(bench, capsys, argv):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv + ["--device", "cpu"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1


def test_torch_twin_gives_our_loss(bench):
    torch = pytest.importorskip("torch")
    config = bench.GPT2Config.from_preset("gpt2-tiny")
    model, _, _ = bench.build_ours(config)
    peer = bench.TorchPeer(torch, config, model.state_dict())
    x, y = random_batch(config.vocab_size, 2, 16)
    ours, theirs = bench.ours_loss(model, x, y), peer.loss(*peer.batch(x, y))
    assert abs(ours - theirs) < bench.LOSS_TOLERANCE["fp32"]


# ---------------------------------------------------------------- bench_kernels.py, scripts


def test_bench_kernels_bad_dtype_and_cells(capsys):
    kernels = _load("bench_kernels")
    with pytest.raises(SystemExit) as e:
        kernels.parse_args(["--dtypes", "bf16,int8"])
    assert e.value.code == 2 and capsys.readouterr().err.startswith("error: unknown dtype")
    gemm = {
        "kernel": "matmul: x",
        "dtype": "bf16",
        "shape": "2x3 @ 3x4",
        "ms": 2.0,
        "tflops": 100.0,
        "cublas_ms": 1.0,
        "cublas_tflops": 200.0,
        "of_cublas": 0.5,
    }
    copy = {
        "kernel": "add",
        "dtype": "bf16",
        "shape": "8",
        "ms": 1.0,
        "gb_per_s": 2000.0,
        "of_dram": 0.5,
    }
    assert kernels.cells(gemm)[-1] == "0.50 x cuBLAS (200.0 TFLOP/s)"
    assert kernels.cells(copy)[-3:] == ["2000 GB/s", "", "50.0% of copy"]
    assert len(kernels.cells(gemm)) == len(kernels.cells(copy)) == len(kernels.HEADERS)


def test_bench_graph_bad_input_and_tables(capsys):
    """scripts/bench_graph.py's refusals and tables (its runs build GPT-2 124M: not here)."""
    from accounting.captured import Captured

    graph = _load("bench_graph")
    for argv, message in ((["--formats", "fp33"], "unknown format"), (["--repeats", "0"], ">= 1")):
        _refused(capsys, graph.parse_args, argv, message)
    counts = (53, 53, 1, 128, 96, 4_000_000, 4_000_000, 0)  # launches, arena, bytes, none fused
    c = Captured(*counts, 2e-3, 1.5e-3, 1e-3, 0.9e-3)  # eager 2 ms, replayed 1 ms
    assert "2.00x" in graph.decode_table([("gpt2-mini", "fp32", c)], "cpu")
    fused = Captured(53, 50, 1, 128, 96, 4_000_000, 3_000_000, 1_000_000, 2e-3, 1.5e-3, 8e-4, 7e-4)
    shares = graph.training_table(c, fused, "cpu")
    assert "25.0%" in shares and "10.0%" in shares  # host 0.5 of 2 ms, 0.1 of 1 ms
    assert "2.50x" in shares and "3.0" in shares  # fused: 0.8 ms, 3.0 MB moved
    noisy = Captured(*counts, 2e-3, 1.5e-3, 1e-3, 1.1e-3)  # kernels 0.1 ms over the step
    assert "~0" in graph.training_table(noisy, noisy, "cpu") and "-0.10" not in graph.decode_table(
        [("gpt2-mini", "fp32", noisy)], "cpu"
    )
    # replayed as the CPU's compiled ops (graph/cpu_step.py): one hand-off, 1.5 ms from Python
    ops = Captured(*counts, 2e-3, 1.5e-3, 1e-3, 0.9e-3, graphs=1, graph_bytes=2e5)
    ops.python_seconds = 1.5e-3
    compiled = graph.decode_table([("gpt2-mini", "fp32", ops), ("gpt2", "int8", c)], "cpu")
    assert "hand-offs" in compiled and "arena MB" in compiled and "1.50" in compiled
    one, two = ({"gpt2 fp32": vars(Captured(*counts, e, 0, r, 0))} for e, r in ((4, 2), (2, 1)))
    one["gpt2 fp32"]["python_seconds"], two["gpt2 fp32"]["python_seconds"] = 3.0, 2.0
    speedups = graph.cores_table([one, two], ["0", "0,1"])
    assert "2.00x" in speedups and "1.50x" in speedups  # eager and replayed; from Python


def test_bench_elementwise_times_every_expression_kernel(capsys):
    """scripts/bench_elementwise.py on a few elements: a row per expression-declared kernel and
    dtype, and per cast (fp32 to bf16 and fp16, bf16 to fp32), --only's choice, and its
    refusals."""
    from tinygrad_like.kernels.elementwise.spec import UNARY_OPS

    bench = _load("bench_elementwise")
    bench.main(["--rows", "2", "--cols", "8", "--repeats", "1", "--dtypes", "fp32,bf16"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("elementwise kernels at (2, 8) on ")
    assert len(lines) == 2 + 2 * (4 + 2 * len(UNARY_OPS)) + 3  # the title, the header, the rows
    bench.main(["--rows", "2", "--cols", "8", "--repeats", "1", "--only", "cast"])
    assert [line.split()[:4] for line in capsys.readouterr().out.splitlines()[2:]] == [
        ["cast", "to", "bf16", "fp32"],
        ["cast", "to", "fp16", "fp32"],
        ["cast", "to", "fp32", "bf16"],
    ]
    for argv in (["--dtypes", "fp8"], ["--rows", "0"]):
        with pytest.raises(SystemExit) as e:
            bench.main(argv)
        assert e.value.code == 2 and capsys.readouterr().err.startswith("error: ")


def test_gpu_session_scripts_parse_and_reject_bad_input():
    for name in ("gpu_check.sh", "gpu_wheels.sh"):
        subprocess.run(["bash", "-n", os.path.join(_SCRIPTS, name)], check=True)
    done = subprocess.run(
        ["bash", os.path.join(_SCRIPTS, "gpu_wheels.sh"), "dir", "three"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stderr.startswith("error: ")


def test_decode_formats_table_and_plot(tmp_path, capsys, shakespeare, monkeypatch):
    """scripts/decode_formats.py on a tiny GPT-2 checkpoint: a row per format, fp32 agreeing with
    itself, int8 bytes a quarter of fp32's (plus its scales), and the plot written."""
    from nn import build
    from nn.config import from_preset

    build(from_preset("gpt2-tiny"), device="cpu").save_pretrained(tmp_path / "ckpt")
    png = tmp_path / "formats.png"
    script, titles = _load("decode_formats"), []
    plot = script.plot
    monkeypatch.setattr(script, "plot", lambda *a: titles.append(a[-1]) or plot(*a))
    script.main(
        ["--checkpoint", str(tmp_path / "ckpt"), "--formats", "fp32,int8,int4,int4+int8"]
        + ["--data-dir", shakespeare, "--eval-iters", "1", "--batch-size", "2", "--seq-len", "16"]
        + ["--prompt-len", "4", "--new-tokens", "3", "--plot", str(png)]
    )
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert rows["fp32"][-2:] == ["3/3", "(3)"] and rows["fp32"][1] == "4.000"
    assert float(rows["int8"][1]) == pytest.approx(1 + 4 / 32)  # a scale per 32-wide row
    assert float(rows["int4"][1]) == pytest.approx(0.5 + 4 / 32)
    assert rows["int4+int8"][1] == rows["int4"][1]  # int8 activations: the same weights
    assert png.stat().st_size > 0
    # the plot's title names the model and the formats, not a folder of this machine
    assert titles == ["decode per format, gpt2-tiny (1.6M parameters): fp32, int8, int4, int4+int8"]
    with pytest.raises(SystemExit) as e:  # int8 activations need integer weights
        script.main(["--checkpoint", str(tmp_path / "ckpt"), "--formats", "fp32,bf16+int8"])
    assert e.value.code == 2 and "int8 or int4 weights" in capsys.readouterr().err


def test_bench_quant_int8_activations_and_bench_llamacpp_table(bench, capsys, monkeypatch):
    """scripts/bench_quant.py times FMT+int8 (quantize_rows, then qmatmul_int8x); scripts/
    bench_llamacpp.py's refusals and its table with and without the peer (its runs load GPT-2
    124M in a dozen processes: not here)."""
    quant = _load("bench_quant")
    monkeypatch.setattr(quant, "SHAPES", [(64, 32)])
    quant.main(["--formats", "int4+int8", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "int4+int8" in out and "GB/s" in out
    quant.main(["--formats", "int8+int8", "--repeats", "1", "--rows", "5"])  # a prompt's tiles
    out = capsys.readouterr().out
    assert "GEMM (M = 5: a prompt's)" in out and "GMAC/s" in out
    _refused(capsys, quant.main, ["--rows", "0"], "--rows must be positive")
    peer = _load("bench_llamacpp")
    for argv, message in ((["--formats", "fp8"], "unknown format"), (["--rounds", "0"], ">= 1")):
        _refused(capsys, peer.parse_args, argv, message)
    with pytest.raises(SystemExit) as e:  # bench.py --peer llama.cpp is bench_llamacpp.py's run
        bench.main(["--peer", "llama.cpp", "--formats", "fp8"])
    assert e.value.code == 2 and "unknown format" in capsys.readouterr().err
    args = peer.parse_args(["--formats", "int8", "--cores", "0", "0,1"])
    cores = ("0", "0,1")
    best = {("ours", f, c): [10.0, 400.0, 500.0] for f in ("int8", "int8+int8") for c in cores}
    best |= {("llama.cpp", "q8_0", c): [8.0, 500.0, 400.0] for c in cores}
    peer.report(best, args, peer=True)
    out = capsys.readouterr().out
    assert "int8 (int8 activations) / q8_0" in out  # 10 ms against 8, prefill 400 against 500
    assert "0.80x" in out and "1.25x" in out
    assert "ours (llama.cpp): int8 1.00x (1.00x)" in out
    peer.report(best, args, peer=False)
    assert "not run" in capsys.readouterr().out


def test_check_halves_finds_only_the_stated_difference(capsys):
    """scripts/check_halves.py over a sample of the fp32 space: no difference but fp16's
    signaling NaNs, and its refusal."""
    assert _load("check_halves").main(["--stride", "65537"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["fp32 -> bf16", "fp32 -> fp16"]
    assert all(line.endswith(" 0 other differences") for line in lines)
    with pytest.raises(SystemExit) as e:
        _load("check_halves").main(["--stride", "0"])
    assert e.value.code == 2 and capsys.readouterr().err.startswith("error: ")
