"""The roofline of a training step's census: the least time this machine could take for each
kernel, and how close the kernels come to it.

The peaks are the machine's, measured once and cached (tinygrad_like/peaks.py: matmul FLOP/s per
dtype, streaming copy and read bandwidth, exp rate, launch floor).

Bounds. A launch's roofline time is the largest of
  compute  FLOPs / the matmul peak of the run's dtype
  memory   bytes / the higher of the copy and read bandwidths (a kernel's bytes mix reads and
           writes; the two streams are the two ends of that mix, and a roof is the best seen)
  exp      exps (kernels/record.py: one per element of GELU, per score of softmax and flash
           attention, per logit of cross-entropy) / the exp rate
  launch   the launch floor
and the bound is whichever gives it (ACCOUNTING.md's definition: FLOPs / peak, bytes /
bandwidth, a launch floor, and on a CPU the exp throughput). Every kernel's FLOPs meet the
matmul peak: for the GEMMs and flash attention (whose FLOPs are its block GEMMs) that is their
roof; an elementwise or row kernel does a handful of FLOPs per element and never meets it, so
its roof is bytes or exps, and how far its NumPy passes fall short of that is what its fraction
shows. The fraction of the bound = roofline time / measured time, 1 at the roof.
census() does this per launch and sums by kernel, so a kernel of many shapes (the decode
step's GEMMs, tiny and large) gets the sum of each launch's roof; the row's bound is the one
that holds most of that sum.
"""

BOUNDS = ("compute", "memory", "exp", "launch")


# ---------------------------------------------------------------- bounds


def roofline_times(flops, nbytes, exps, peaks, dtype="fp32"):
    """-> {bound: the seconds that peak alone allows} for one launch."""
    return {
        "compute": flops / peaks.flops(dtype),
        "memory": nbytes / peaks.bandwidth,
        "exp": exps / peaks.exp_rate if peaks.exp_rate else 0.0,
        "launch": peaks.launch_s,
    }


def bound(flops, nbytes, exps, peaks, dtype="fp32"):
    """-> (the bound, the roofline time): the largest of roofline_times."""
    times = roofline_times(flops, nbytes, exps, peaks, dtype)
    name = max(times, key=times.get)
    return name, times[name]


def census(prof, peaks, dtype="fp32"):
    """prof.census()'s rows (a Profiler's), each with its bound, roofline_s (the sum over its
    launches), fraction (roofline / measured; None when untimed) and lost_s (measured -
    roofline), sorted by lost_s, most first: the top row is the next thing to fix."""
    rows = {r["kernel"]: dict(r, roofline_s=0.0) for r in prof.census()}
    by_bound = {name: dict.fromkeys(BOUNDS, 0.0) for name in rows}
    for launch in prof.launches:
        which, seconds = bound(launch.flops, launch.bytes, launch.exps, peaks, dtype)
        rows[launch.name]["roofline_s"] += seconds
        by_bound[launch.name][which] += seconds
    for name, r in rows.items():
        r["bound"] = max(by_bound[name], key=by_bound[name].get)
        r["fraction"] = r["roofline_s"] / r["seconds"] if r["seconds"] > 0 else None
        r["lost_s"] = r["seconds"] - r["roofline_s"]
    return sorted(rows.values(), key=lambda r: r["lost_s"], reverse=True)
