"""accounting/roofline.py: the bound each launch gets, the census's roofline columns (sums,
fractions, order), the exps kernels.launch counts, and the picture (accounting/roofline_plot.py).
No timing is asserted: the peaks here are made up (tests/test_peaks.py tests measuring them)."""

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.legend import Legend

from accounting import roofline, roofline_plot
from tinygrad_like.kernels import launch
from tinygrad_like.peaks import Peaks
from tinygrad_like.profiler import Launch, Profiler, format_census

# 100 GFLOP/s, 10 GB/s copy (5 read), 1 G exps/s, 1 µs launches: round numbers to check by hand
PEAKS = Peaks(
    device="cpu",
    machine="test machine",
    matmul={"fp32": 1e11},
    copy_bw=1e10,
    read_bw=5e9,
    exp_rate=1e9,
    launch_s=1e-6,
    how={
        "matmul_fp32": "made up",
        "copy": "made up",
        "read": "made up",
        "exp": "made up",
        "launch": "made up",
    },
)


class Clock:
    """A timer that says it took `s` seconds."""

    def __init__(self, s):
        self.s = s

    def seconds(self):
        return self.s


def test_bound_is_the_largest_of_the_four_times():
    # compute: 1 GFLOP at 100 GFLOP/s = 10 ms, over 1 MB at 10 GB/s = 0.1 ms
    assert roofline.bound(1e9, 1e6, 0, PEAKS) == ("compute", pytest.approx(1e-2))
    # memory: 100 MB at the higher of copy and read (10 GB/s) = 10 ms, over 1 MFLOP
    assert roofline.bound(1e6, 1e8, 0, PEAKS) == ("memory", pytest.approx(1e-2))
    # exp: 1e8 exps at 1 G/s = 100 ms, over the same 100 MB
    assert roofline.bound(1e6, 1e8, 1e8, PEAKS) == ("exp", pytest.approx(0.1))
    # launch: 12 bytes take 1.2 ns, the floor 1 µs
    assert roofline.bound(1, 12, 0, PEAKS) == ("launch", pytest.approx(1e-6))
    times = roofline.roofline_times(2e9, 3e8, 4e8, PEAKS)
    assert times == pytest.approx({"compute": 0.02, "memory": 0.03, "exp": 0.4, "launch": 1e-6})


def test_a_peak_per_dtype_and_no_exp_bound_without_an_exp_rate():
    gpu = Peaks(**{**vars(PEAKS), "matmul": {"fp32": 1e11, "bf16": 1e12}, "exp_rate": 0.0})
    assert gpu.flops("bf16") == 1e12 and gpu.flops("fp16") == 1e11  # fp32's when none
    assert roofline.bound(1e12, 1e6, 1e12, gpu, "bf16") == ("compute", pytest.approx(1.0))
    assert roofline.roofline_times(0, 0, 1e12, gpu)["exp"] == 0.0


def _profiler(launches):
    prof = Profiler()
    prof.launches = [
        Launch(name, "forward", flops, nbytes, "cpu", Clock(s), exps=exps)
        for name, flops, nbytes, exps, s in launches
    ]
    return prof


def test_census_sums_the_roof_of_each_launch_and_sorts_by_time_lost():
    prof = _profiler(
        [
            ("matmul", 1e9, 1e6, 0, 0.02),  # compute roof 10 ms
            ("matmul", 1e6, 1e7, 0, 0.002),  # memory roof 1 ms
            ("gelu_fwd", 8e6, 8e6, 1e6, 0.004),  # exp 1 ms over memory 0.8 ms
            ("add", 1e2, 1.2e3, 0, 0.0),  # untimed: launch roof 1 µs over 0.12 µs
        ]
    )
    rows = {r["kernel"]: r for r in roofline.census(prof, PEAKS)}
    mm, gelu, add = rows["matmul"], rows["gelu_fwd"], rows["add"]
    assert mm["calls"] == 2 and mm["roofline_s"] == pytest.approx(0.011)
    assert mm["bound"] == "compute"  # the bound holding most of the roof
    assert mm["fraction"] == pytest.approx(0.011 / 0.022)
    assert mm["lost_s"] == pytest.approx(0.011)
    assert gelu["bound"] == "exp" and gelu["exps"] == 1e6
    assert gelu["fraction"] == pytest.approx(0.25) and gelu["lost_s"] == pytest.approx(0.003)
    assert add["bound"] == "launch" and add["fraction"] is None
    order = [r["kernel"] for r in roofline.census(prof, PEAKS)]
    assert order == ["matmul", "gelu_fwd", "add"]  # most time lost first
    assert sum(r["share"] for r in rows.values()) == pytest.approx(1.0)


def test_format_census_adds_the_roofline_columns_only_when_the_rows_have_them():
    prof = _profiler([("matmul", 1e9, 1e6, 0, 0.02), ("add", 1e2, 1.2e3, 0, 0.0)])
    plain = format_census(prof.census())
    roofed = format_census(roofline.census(prof, PEAKS), "t").splitlines()
    assert "bound" not in plain and "of roof" not in plain
    assert roofed[1].split()[-7:] == ["bound", "roof", "ms", "of", "roof", "lost", "ms"]
    matmul = roofed[2].split()
    assert matmul[0] == "matmul" and matmul[-4:] == ["compute", "10.000", "50%", "10.00"]
    assert roofed[3].split()[-3:] == ["0.001", "-", "-0.00"]  # untimed: no fraction


def test_launch_counts_the_exps_of_each_kernel(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    logits = rng.standard_normal((4, 10)).astype(np.float32)
    targets = np.array([0, 3, 6, -1])
    q = rng.standard_normal((1, 2, 8, 4)).astype(np.float32)
    scores = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    with Profiler() as prof:
        launch("gelu_fwd", x)
        launch("gelu_bwd", x, x)
        _, lse = launch("cross_entropy_fwd", logits, targets, n_classes=7)
        launch("cross_entropy_bwd", logits, lse, targets, np.ones(1, np.float32), n_classes=7)
        launch("softmax_causal_fwd", scores, 0.5)
        launch("flash_attention_fwd", q, q, q, 0.5)
        launch("add", x, x)
    exps = [la.exps for la in prof.launches]
    flash = prof.launches[5]
    assert exps[:5] == [15, 15, 28, 28, 32]  # elements, elements, V = 7 of each row
    assert exps[5] == flash.flops // (4 * 4 + 5)  # one per computed score
    assert exps[6] == 0
    assert sum(r["exps"] for r in prof.census()) == sum(exps)


def test_plot_draws_a_png(tmp_path):
    prof = _profiler(
        [
            ("matmul", 1e9, 1e6, 0, 0.02),
            ("gelu_fwd", 8e6, 8e6, 1e6, 0.004),
            ("copy", 0, 1e6, 0, 0.001),
        ]
    )
    rows = roofline.census(prof, PEAKS)
    path = roofline_plot.plot([("step", rows)], PEAKS, str(tmp_path / "r.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_labels_do_not_overlap_and_the_legends_name_the_marks():
    # three GEMMs at one point (the step's matmul, matmul_nt, matmul_tn) and an exp-bound kernel
    prof = _profiler(
        [(name, 1e9, 1e6, 0, 0.02) for name in ("matmul", "matmul_nt", "matmul_tn")]
        + [("gelu_fwd", 8e6, 8e6, 1e7, 0.02)]  # exp-bound: a dotted bar
    )
    fig = roofline_plot.draw([("step", roofline.census(prof, PEAKS))], PEAKS)
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    named = sorted(t.get_text() for t in ax.texts)
    assert named == [
        "gelu_fwd (exp)",
        "matmul (compute)",
        "matmul_nt (compute)",
        "matmul_tn (compute)",
    ]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    legends = " ".join(t.get_text() for leg in ax.findobj(Legend) for t in leg.get_texts())
    assert "exp roof of an exp-bound kernel" in legends  # the dotted bars
    for words in ("roofs: memory", "1%", "10%", "50%"):
        assert words in legends
    titles = [leg.get_title().get_text() for leg in ax.findobj(Legend)]
    assert "bubble area: share of its step's kernel time" in titles
    plt.close(fig)
