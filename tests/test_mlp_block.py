"""scripts/mlp_block.py on a tiny block (C = 8, hidden = 32): every row's bytes and FLOPs as
the lab counts them, its roofline (bound, time, fraction) from made-up peaks, the check against
float64, the verdicts of the lab's predictions from given times, and its bad-input errors.
No timing is asserted."""

import importlib.util
import os

import pytest

from accounting import roofline
from tinygrad_like.peaks import Peaks

_SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "mlp_block.py"
)
PEAKS = Peaks(
    device="cpu",
    machine="test machine",
    matmul={"fp32": 1e11},
    copy_bw=1e10,
    read_bw=5e9,
    exp_rate=1e9,
    launch_s=5e-8,
    how={},
)
M, C, H = 3, 8, 32


@pytest.fixture(scope="module")
def mlp():
    spec = importlib.util.spec_from_file_location("mlp_block", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rows(mlp):
    p = mlp.weights(c=C, hidden=H)
    return {r["row"]: r for r in mlp.measure_block(M, p, PEAKS, repeats=2)}


def test_every_row_counts_the_lab_bytes_and_flops(mlp, rows):
    assert list(rows) == list(mlp.BLOCK + mlp.FUSED)
    f = 4  # fp32 bytes
    expected = {  # (bytes: everything read + everything written, FLOPs, exps)
        "layernorm": (f * (2 * M * C + 2 * C + 2 * M), 8 * M * C, 0),  # + mean, rstd per row
        "matmul fc": (f * (M * C + C * H + M * H), 2 * M * C * H, 0),
        "bias fc": (f * (2 * M * H + H), M * H, 0),
        "gelu": (f * 2 * M * H, 9 * M * H, M * H),
        "matmul proj": (f * (M * H + H * C + M * C), 2 * M * H * C, 0),
        "bias proj": (f * (2 * M * C + C), M * C, 0),
        "residual": (f * 3 * M * C, M * C, 0),
        "matmul fc+b": (f * (M * C + C * H + H + M * H), 2 * M * C * H + M * H, 0),
        "bias+gelu": (f * (2 * M * H + H), 10 * M * H, M * H),  # the add, then GELU's 9
        "bias+residual": (f * (3 * M * C + C), 2 * M * C, 0),
    }
    for name, (nbytes, flops, exps) in expected.items():
        r = rows[name]
        assert (r["bytes"], r["flops"], r["exps"]) == (nbytes, flops, exps), name
    assert rows["gelu"]["shape"] == (M, H) and rows["residual"]["shape"] == (M, C)


def test_every_row_gets_its_roofline_and_rates(mlp, rows):
    for r in rows.values():
        bound, roof = roofline.bound(r["flops"], r["bytes"], r["exps"], PEAKS)
        assert (r["bound"], r["roofline_s"]) == (bound, pytest.approx(roof))
        assert r["fraction"] == pytest.approx(roof / r["seconds"])
        assert r["GB/s"] == pytest.approx(r["bytes"] / r["seconds"] / 1e9)
        assert r["GFLOP/s"] == pytest.approx(r["flops"] / r["seconds"] / 1e9)
        assert r["error"] <= mlp.TOLERANCE["fp32"]
    # at these sizes: gelu's M*H exps (96 ns) beat its bytes (77 ns); a bias add's 896 bytes
    # (90 ns at 10 GB/s) beat the 50 ns floor; the residual's 288 bytes (29 ns) do not
    assert rows["gelu"]["bound"] == "exp" and rows["bias fc"]["bound"] == "memory"
    assert rows["residual"]["bound"] == "launch"
    block = [rows[name]["share"] for name in mlp.BLOCK]
    assert sum(block) == pytest.approx(1.0)
    assert all(rows[name]["share"] is None for name in mlp.FUSED)
    assert "M = 3 tokens" in mlp.format_rows(M, list(rows.values()), "fp32")


FAST = Peaks(**{**vars(PEAKS), "copy_bw": 1e11, "read_bw": 5e10, "exp_rate": 1e10})


def _results(mlp, seconds):
    """{M: rows} of the real block shapes' counts with the given seconds per row (on FAST: 100
    GB/s, 10 G exps/s, 100 GFLOP/s)."""
    c, h = mlp.C, mlp.HIDDEN
    out = {}
    for m, times in seconds.items():
        counts = {
            "layernorm": (8 * m * c + 8 * c + 8 * m, 8 * m * c, 0),
            "matmul fc": (4 * (m * c + c * h + m * h), 2 * m * c * h, 0),
            "bias fc": (4 * (2 * m * h + h), m * h, 0),
            "gelu": (8 * m * h, 9 * m * h, m * h),
            "matmul proj": (4 * (m * h + h * c + m * c), 2 * m * c * h, 0),
            "bias proj": (4 * (2 * m * c + c), m * c, 0),
            "residual": (12 * m * c, m * c, 0),
            "matmul fc+b": (4 * (m * c + c * h + h + m * h), 2 * m * c * h + m * h, 0),
            "bias+gelu": (4 * (2 * m * h + h), 10 * m * h, m * h),
            "bias+residual": (4 * (3 * m * c + c), 2 * m * c, 0),
        }
        rows = [
            mlp.row_of(name, "k", (m,), flops, nbytes, exps, times[name], FAST, "fp32", 0.0)
            for name, (nbytes, flops, exps) in counts.items()
        ]
        total = sum(r["seconds"] for r in rows if r["row"] in mlp.BLOCK)
        for r in rows:
            r["share"] = r["seconds"] / total if r["row"] in mlp.BLOCK else None
        out[m] = rows
    return out


def test_the_predictions_verdicts_follow_the_numbers(mlp):
    # M = 512 as the lab predicts it: matmuls 2 x 0.6 s of ~1.2 s (a naive kernel, 4 GFLOP/s,
    # 4% of 100), elementwise at 90 of 100 GB/s, fused bias+GELU half of bias then GELU
    big = {
        "layernorm": 1e-3,
        "matmul fc": 0.6,
        "matmul proj": 0.6,
        "matmul fc+b": 0.6,
        "bias fc": 12.6e6 / 9e10,
        "gelu": 12.6e6 / 9e10,
        "bias proj": 3.1e6 / 9e10,
        "residual": 4.7e6 / 9e10,
    }
    big["bias+gelu"] = (big["bias fc"] + big["gelu"]) / 2
    big["bias+residual"] = 0.6 * (big["bias proj"] + big["residual"])
    # M = 1: every elementwise op 3 µs (8x or more its bytes' time), proj 4x fc
    one = {name: 3e-6 for name in big} | {
        "matmul fc": 1e-3,
        "matmul fc+b": 1e-3,
        "matmul proj": 4e-3,
    }
    preds = mlp.predictions(_results(mlp, {512: big, 1: one}), FAST)
    assert [p[0][:3] for p in preds] == ["(a)", "(b)", "(c)", "(d)", "(e)", "(f)", "(g)"]
    assert all(held for _, _, held in preds), preds
    assert "(4%)" in preds[5][1] and "4.00x" in preds[4][1] and "0.50x" in preds[2][1]
    # the other way: BLAS-fast matmuls under 95%, slow elementwise, no gain from fusing,
    # proj as fast as fc, elementwise at M = 1 at their bytes' time (not a fixed cost)
    big |= {"matmul fc": 0.03, "matmul proj": 0.03, "gelu": 0.01, "bias+gelu": 0.02}
    big["bias+residual"] = big["bias proj"] + big["residual"]
    one |= {"matmul proj": 1e-3, "bias fc": 0.4e-6, "gelu": 25e-6}
    preds = mlp.predictions(_results(mlp, {512: big, 1: one}), FAST)
    assert not any(held for _, _, held in preds), preds
    text = mlp.format_predictions(preds)
    assert text.count("DID NOT HOLD") == 7 and "measured:" in text


def test_predictions_need_their_sizes(mlp):
    times = {name: 1e-3 for name in mlp.BLOCK + mlp.FUSED}
    only_64 = mlp.predictions(_results(mlp, {64: times}), FAST)
    assert only_64 == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sizes", "1,x"], "whole numbers"),
        (["--sizes", "0"], "positive"),
        (["--repeats", "0"], "positive"),
        (["--dtype", "fp8"], "unknown --dtype"),
        (["--device", "tpu"], "unknown device"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(mlp, argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        mlp.parse_args(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and message in err and "\n" not in err
