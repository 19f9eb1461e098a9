"""kernels.launch, the one place every kernel launch passes: the counts it gives the profiler
and the tape (FLOPs and bytes by phase, the census, the Chrome trace), its timing, and nothing
kept when no profiler listens.
"""

from tinygrad_like import Tensor, kernels, profiler
from tinygrad_like import functional as F

from .check import F32, rand


def test_profiler_linear_forward_backward():
    M, K, N = 6, 5, 4
    x = Tensor(rand((2, 3, K), F32, seed=1), requires_grad=True)
    w = Tensor(rand((K, N), F32, seed=2), requires_grad=True)
    b = Tensor(rand(N, F32, seed=3), requires_grad=True)
    g = rand((2, 3, N), F32, seed=4)
    with profiler.Profiler() as p:
        y = F.linear(x, w, b)
        y.backward(g)
    assert p.launches and {la.phase for la in p.launches} == {"forward", "backward"}
    assert all(la.device == "cpu" for la in p.launches)
    fwd = [la for la in p.launches if la.phase == "forward"]
    assert any(la.name == "matmul" for la in fwd)
    bwd_names = [la.name for la in p.launches if la.phase == "backward"]
    assert "matmul_nt" in bwd_names and "matmul_tn" in bwd_names and "sum" in bwd_names
    phases = p.by_phase()
    assert phases["forward"]["flops"] == 2 * M * K * N + M * N
    assert phases["backward"]["flops"] == 2 * (2 * M * K * N) + M * N
    assert phases["optimizer"]["launches"] == 0 and phases["other"]["launches"] == 0
    assert sum(r["launches"] for r in phases.values()) == len(p.launches)
    census = p.census()
    assert sum(r["calls"] for r in census) == len(p.launches)
    assert sum(r["flops"] for r in census) == sum(la.flops for la in p.launches)
    assert len({r["kernel"] for r in census}) == len(census)
    assert all(la.bytes > 0 for la in p.launches if la.name.startswith("matmul"))
    trace = p.chrome_trace_events()
    assert len(trace) == len(profiler.PHASES) + len(p.launches)
    assert "matmul" in profiler.format_census(census)
    # the launch counts agree with the tape record's
    rec = y._record
    assert rec.fwd_flops == phases["forward"]["flops"]
    assert rec.bwd_flops == phases["backward"]["flops"]


def test_profiler_phases_timing_and_inactivity():
    g = rand(64, F32)
    kernels.launch("grad_norm_sq", g)  # no profiler: nothing is kept anywhere
    with profiler.Profiler(timing=True) as p:
        with profiler.phase("optimizer"):
            kernels.launch("grad_norm_sq", g)
        kernels.launch("neg", g)
    assert [(la.name, la.phase) for la in p.launches] == [
        ("grad_norm_sq", "optimizer"),
        ("neg", "forward"),
    ]
    assert p.launches[0].flops == 2 * 64 and p.launches[1].flops == 64
    assert all(la.seconds >= 0 for la in p.launches)
    assert p.by_phase()["optimizer"]["flops"] == 128
    kernels.launch("neg", g)
    assert len(p.launches) == 2  # the profiler stopped recording on exit
    assert abs(sum(r["share"] for r in p.census()) - 1.0) < 1e-9
