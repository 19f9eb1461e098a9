"""scripts/bench.py on gpt2-tiny for a step or two, without PyTorch: every number it returns
is positive and finite, the report and the JSON file are written. (One test at the end checks
the PyTorch twin gives our loss; it runs only where torch is installed.)"""
import importlib.util
import json
import math
import os

import numpy as np
import pytest

from training.measure import random_batch

_BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "scripts", "bench.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench", _BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY = ["--model", "gpt2-tiny", "--batch-size", "2", "--seq-len", "16", "--steps", "2",
        "--rounds", "1", "--warmup", "1", "--prompt-len", "4", "--new-tokens", "3",
        "--gen-repeats", "1", "--no-torch", "--no-hf"]


def positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_run_returns_positive_finite_numbers(bench):
    results = bench.run(bench.parse_args(TINY + ["--census"]), log=lambda *a: None)
    assert positive(results["peak_flops"])
    assert results["tokens_per_step"] == 32 and positive(results["flops_per_token"])
    train = results["train"]["ours"]
    assert train["steps"] == 2
    for key in ("median_ms", "min_ms", "max_ms", "tokens_per_s", "mfu", "last_loss"):
        assert positive(train[key]), key
    assert train["mfu"] < 1.5                          # a fraction of the peak, not a count
    assert "torch" not in results["train"]
    gen = results["generate"]["ours"]
    for key in ("prompt_ms", "prompt_tokens_per_s", "decode_ms_per_token",
                "decode_tokens_per_s"):
        assert positive(gen[key]), key
    assert "hf" not in results["generate"]
    census = results["census"]
    names = {r["kernel"] for r in census["train"]["rows"]}
    assert {"matmul", "adamw_step"} <= names
    assert any(name.startswith("cross_entropy") for name in names)
    assert all(r["seconds"] >= 0 and r["calls"] > 0 for r in census["train"]["rows"])
    assert positive(census["train"]["wall_s"]) and positive(census["decode"]["wall_s"])
    assert {r["kernel"] for r in census["decode"]["rows"]} >= {"matmul", "softmax_causal_fwd"}
    report = bench.format_report(results)
    assert "tokens/s" in report and "decode tokens/s" in report


def test_main_writes_json(bench, tmp_path, capsys):
    path = tmp_path / "bench.json"
    bench.main(TINY + ["--no-generate", "--json", str(path)])
    out = capsys.readouterr().out
    assert "training step, fp32" in out and "matmul peak" in out
    data = json.loads(path.read_text())
    assert positive(data["train"]["ours"]["tokens_per_s"])
    assert "generate" not in data


def test_environment_names_the_blas(bench):
    info = bench.environment_info()
    assert info["logical_cpus"] >= 1 and info["blas"]["source"]
    text = bench.format_environment(info, 1e9)
    assert "1 GFLOP/s" in text and "BLAS variables" in text


def test_generation_and_step_helpers(bench):
    config = bench.GPT2Config.from_preset("gpt2-tiny")
    model, opt = bench.build_ours(config)
    x, y = random_batch(config.vocab_size, 2, 8)
    assert x.shape == y.shape == (2, 8) and (x[:, 1:] == y[:, :-1]).all()
    first = bench.ours_train_step(model, opt, x, y)
    assert positive(first) and abs(first - math.log(config.vocab_size)) < 0.5
    prompt_s, decode_s, ids = bench.ours_generate(model, x[:1, :4], 3)
    assert positive(prompt_s) and positive(decode_s) and ids.shape == (1, 3)
    assert ids.dtype == np.int64 and (ids >= 0).all() and (ids < config.vocab_size).all()


def test_bad_arguments_exit(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--model", "gpt2-tiny", "--seq-len", "65"])     # context is 64
    with pytest.raises(SystemExit):
        bench.parse_args(["--model", "nope"])


def test_torch_twin_gives_our_loss(bench):
    torch = pytest.importorskip("torch")
    config = bench.GPT2Config.from_preset("gpt2-tiny")
    model, _ = bench.build_ours(config)
    tmodel, _ = bench.build_torch(torch, config, model.state_dict())
    x, y = random_batch(config.vocab_size, 2, 16)
    ours = bench.ours_loss(model, x, y)
    theirs = bench.torch_loss(torch, tmodel, torch.from_numpy(x), torch.from_numpy(y))
    assert abs(ours - theirs) < bench.LOSS_TOLERANCE
