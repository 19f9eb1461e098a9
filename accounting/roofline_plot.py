"""The classic roofline picture of censuses (accounting/roofline.census rows) into a PNG: each
kernel a bubble at (FLOPs per byte, achieved FLOP/s) under the machine's roofs, for
scripts/bench.py --plot."""

import math

import numpy as np

COLORS = ("tab:blue", "tab:orange")  # one per census drawn
LABEL_SHARE = 0.01  # kernels of 1% of their step's kernel time or more are named
SIZE_SHARES = (0.01, 0.1, 0.5)  # the bubble sizes the size legend shows
# where a label may go: a direction from its bubble (right and left first, then the diagonals,
# then above and below) and a gap in points beyond the bubble's edge, the nearest gap first
DIRECTIONS = ((1, 0), (-1, 0), (1, 1), (1, -1), (-1, 1), (-1, -1), (0, 1), (0, -1))
GAPS = (3, 10, 20, 32, 48, 70)
LEADER_GAP = 10  # a label this far from its bubble or farther gets a line back to it


def bubble_size(share):
    """A scatter marker's area (points^2) for a kernel's share of its step's kernel time."""
    return 20 + 2000 * share


def plot(series, peaks, path, dtype="fp32", title="roofline"):
    """draw()'s picture into a PNG at path; -> path."""
    fig = draw(series, peaks, dtype, title)
    fig.savefig(path)
    _pyplot().close(fig)
    return path


def _pyplot():
    """matplotlib.pyplot on the Agg backend: files only, no display needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw(series, peaks, dtype="fp32", title="roofline"):
    """-> a matplotlib Figure of the kernels of each census (series: [(label, census() rows)])
    under the roofs: memory bandwidth x intensity up to the matmul peak of dtype, and for each
    exp-bound kernel a short dotted bar at its own ceiling (its FLOPs per exp x the exp rate).
    A bubble's area is its share of its step's kernel time. Kernels with no FLOPs (copies,
    gathers) or no time have no place on log axes and are left out (the legend counts them).
    Kernels of LABEL_SHARE of their step or more are named, largest first, each where its label
    meets no bubble, no earlier label and no legend (a leader line when it sits away from its
    bubble); a label with no free place is left off (the census table names every kernel)."""
    from matplotlib.lines import Line2D

    plt = _pyplot()

    peak, bw = peaks.flops(dtype), peaks.bandwidth
    drawn = [
        [r for r in rows if r["flops"] > 0 and r["bytes"] > 0 and r["seconds"] > 0]
        for _, rows in series
    ]
    intensities = [r["flops"] / r["bytes"] for rows in drawn for r in rows] or [peak / bw]
    x = np.logspace(
        math.log10(min(intensities) / 3), math.log10(max(max(intensities), peak / bw) * 10), 200
    )
    fig, ax = plt.subplots(figsize=(10, 6.5), dpi=120)
    ax.plot(
        x,
        np.minimum(peak, bw * x),
        "k-",
        lw=1.5,
        label=f"roofs: memory {bw / 1e9:.1f} GB/s x intensity, {dtype} matmul "
        f"{peak / 1e9:,.0f} GFLOP/s",
    )
    labels, bubbles, bars = [], [], []
    for (label, rows), kept, color in zip(series, drawn, COLORS):
        xs = [r["flops"] / r["bytes"] for r in kept]
        ys = [r["flops"] / r["seconds"] for r in kept]
        ax.scatter(
            xs,
            ys,
            s=[bubble_size(r["share"]) for r in kept],
            color=color,
            alpha=0.6,
            label=f"{label} ({len(rows) - len(kept)} kernels without FLOPs not drawn)",
        )
        for r, xi, yi in zip(kept, xs, ys):
            bubbles.append(((xi, yi), bubble_size(r["share"])))
            if r["share"] >= LABEL_SHARE:
                name = f"{r['kernel']} ({r['bound']})"
                labels.append((r["share"], name, bubbles[-1], color))
            if r["bound"] == "exp" and r["exps"]:
                bars.append((xi / 2, xi * 2, r["flops"] / r["exps"] * peaks.exp_rate))
                ax.hlines(bars[-1][2], *bars[-1][:2], colors=color, linestyles="dotted")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (FLOPs per byte)",
        ylabel="achieved FLOP/s",
    )
    ax.set_title(f"{title}\n{peaks.machine}", fontsize=9)
    ax.grid(True, which="both", alpha=0.2)
    handles, names = ax.get_legend_handles_labels()
    if bars:
        handles.append(Line2D([], [], color="gray", linestyle="dotted"))
        names.append(
            f"exp roof of an exp-bound kernel: its FLOPs per exp x {peaks.exp_rate / 1e9:.2f} "
            "G exps/s (in its step's color)"
        )
    roofs = ax.legend(handles, names, fontsize=8, loc="upper left")
    for handle in roofs.legend_handles[1 : 1 + len(series)]:
        handle.set_sizes([40])  # the censuses' bubbles at one size: the color is what names them
    ax.add_artist(roofs)
    sizes = [
        ax.scatter([], [], s=bubble_size(s), color="gray", alpha=0.4, label=f"{s:.0%}")
        for s in SIZE_SHARES
    ]
    ax.legend(
        handles=sizes,
        title="bubble area: share of its step's kernel time",
        title_fontsize=8,
        fontsize=8,
        loc="lower right",
        ncol=len(sizes),
        labelspacing=1.5,
        borderpad=1,
    )
    fig.tight_layout()
    roof = lambda x: min(peak, bw * x)  # noqa: E731  (FLOP/s at intensity x, data units)
    _place_labels(fig, ax, sorted(labels, reverse=True), bubbles, bars, roof)
    return fig


def _place_labels(fig, ax, labels, bubbles, bars, roof):
    """Annotate each label (share, text, its bubble, color) at the first gap and direction
    (GAPS x DIRECTIONS) where its box stays in the axes and meets no bubble (bubbles: [((x, y)
    in data, marker area)]), no dotted bar (bars: [(x from, x to, y)] in data), not the roof
    (roof: data x -> data y, rising), no earlier label and no legend; else leave it off."""
    from matplotlib.legend import Legend
    from matplotlib.transforms import Bbox

    fig.canvas.draw()  # final limits, legends laid out: display coordinates hold from here
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    taken = [legend.get_window_extent(renderer) for legend in ax.findobj(Legend)]
    taken += [Bbox(ax.transData.transform([(x0, y), (x1, y)])) for x0, x1, y in bars]
    px = fig.dpi / 72  # pixels per point
    # (centre x, centre y, radius) in pixels; a marker of area s points^2 is sqrt(s) across
    circles = [(*ax.transData.transform(xy), math.sqrt(s) / 2 * px) for xy, s in bubbles]
    to_data = ax.transData.inverted()

    def roof_at(x):  # the roof's display y at display x
        at = to_data.transform((x, 0))[0]
        return ax.transData.transform((at, roof(at)))[1]

    def crosses_roof(box):  # the roof rises: it crosses the box between its two ends' heights
        return roof_at(box.x0) <= box.y1 and roof_at(box.x1) >= box.y0

    for _, text, (xy, area), color in labels:
        probe = ax.text(0, 0, text, fontsize=7)
        size = probe.get_window_extent(renderer).size  # (w, h) pixels
        probe.remove()
        for gap, ux, uy in ((g, ux, uy) for g in GAPS for ux, uy in DIRECTIONS):
            spot = _spot(ax.transData.transform(xy), math.sqrt(area) / 2 + gap, ux, uy, size, px)
            if _free(spot["box"], inside, taken, circles) and not crosses_roof(spot["box"]):
                taken.append(spot["box"])
                line = dict(arrowstyle="-", color=color, lw=0.5, relpos=spot["relpos"])
                ax.annotate(
                    text,
                    xy,
                    xytext=spot["xytext"],
                    textcoords="offset points",
                    ha=spot["ha"],
                    va=spot["va"],
                    fontsize=7,
                    color=color,
                    arrowprops=line if gap >= LEADER_GAP else None,
                )
                break


def _spot(centre, distance, ux, uy, size, px):
    """A label of size (w, h) pixels placed distance points from centre (pixels) in direction
    (ux, uy): its offset in points, alignment, box in pixels (padded by a point) and where on
    the box a leader line leaves it (relpos: the side facing the bubble)."""
    from matplotlib.transforms import Bbox

    norm = math.hypot(ux, uy)
    dx, dy = ux / norm * distance, uy / norm * distance
    ha = "left" if ux > 0 else "right" if ux < 0 else "center"
    va = "center" if uy == 0 else "bottom" if uy > 0 else "top"
    (w, h), (x, y) = size, centre
    x0 = x + dx * px - {"left": 0, "right": w, "center": w / 2}[ha]
    y0 = y + dy * px - {"bottom": 0, "top": h, "center": h / 2}[va]
    box = Bbox.from_bounds(x0, y0, w, h).padded(px)
    relpos = (
        {"left": 0, "right": 1, "center": 0.5}[ha],
        {"bottom": 0, "top": 1, "center": 0.5}[va],
    )
    return {"xytext": (dx, dy), "ha": ha, "va": va, "box": box, "relpos": relpos}


def _free(box, inside, boxes, circles):
    """Whether box lies in inside and meets none of boxes nor circles ((x, y, r))."""
    if box.x0 < inside.x0 or box.x1 > inside.x1 or box.y0 < inside.y0 or box.y1 > inside.y1:
        return False
    if any(box.overlaps(b) for b in boxes):
        return False
    for cx, cy, r in circles:  # the box's nearest point to the centre, inside the circle?
        nx, ny = min(max(cx, box.x0), box.x1), min(max(cy, box.y0), box.y1)
        if math.hypot(nx - cx, ny - cy) < r:
            return False
    return True
