"""Plots of a run's results and of a trace analysis, as PNG bytes.

    breakdown_png(results)       breakdown.png        chakra-sim run --plots
    message_sizes_png(report)    message_sizes.png    chakra-sim analyze --out DIR
    imbalance_png(report)        imbalance.png        chakra-sim analyze --out DIR
    compute_vs_comm_png(report)  compute_vs_comm.png  chakra-sim analyze --out DIR
    compare_png(diff)            compare.png          chakra-sim analyze --results A --results B --out DIR

Every function returns the bytes of a PNG, the same bytes for the same input (no
Software/date metadata), and draws with matplotlib's Agg canvas, which is imported only
when a plot is drawn, so `chakra-sim run` without `--plots` never loads matplotlib.
Legends sit outside the axes, so they never hide data; rank axes stay readable from 1 to
thousands of ranks (a tick per rank up to 32, fewer beyond).
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from chakra_core.engine.driver import BREAKDOWN
from chakra_core.report.summary import TIME_COLUMNS, TIME_UNITS, compact_ranks
from chakra_core.comm.groups import WORLD

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

BREAKDOWN_PNG = "breakdown.png"
MESSAGE_SIZES_PNG = "message_sizes.png"
IMBALANCE_PNG = "imbalance.png"
COMPUTE_VS_COMM_PNG = "compute_vs_comm.png"
COMPARE_PNG = "compare.png"

CATEGORY_COLOURS = {"gpu_compute_ns": "tab:blue", "cpu_compute_ns": "tab:orange", "memory_ns": "tab:purple",
                    "exposed_network_ns": "tab:red", "waiting_ns": "tab:olive", "idle_ns": "lightgrey"}
TICK_EVERY_RANK = 32
"""Up to this many ranks, every rank has its tick on a rank axis."""
BARS_UPTO = 64
"""Up to this many ranks, a rank's bar has gaps on both sides; beyond, the bars touch."""
MAX_LEGEND_GROUPS = 16
"""Up to this many communicator groups, the imbalance plot gives each its colour and legend entry."""

_TIME_UNITS = tuple((scale, name) for name, scale in TIME_UNITS)
_BYTE_UNITS = ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B"))


def readable_unit(values: list[float], unit: str | None) -> tuple[float, str | None]:
    """(divisor, unit) that puts the largest value between 1 and 1000 (1024) of the unit;
    `unit` "ns" and "bytes" are scaled, any other is returned as is."""
    scales = {"ns": _TIME_UNITS, "bytes": _BYTE_UNITS}.get(unit or "")
    if scales is None:
        return 1.0, unit
    largest = max((abs(v) for v in values), default=0)
    for divisor, name in scales:
        if largest >= divisor:
            return float(divisor), name
    return 1.0, scales[-1][1]


def size_text(size: int) -> str:
    """A message-size bucket as people write it: 0 B, 512 B, 4 KiB, 1 MiB, 2 GiB."""
    for scale, name in _BYTE_UNITS:
        if size >= scale:
            return f"{size / scale:g} {name}"
    return f"{size} B"


def group_label(name: str) -> str:
    """A communicator group as the tables and plots name it."""
    return "all ranks" if name == WORLD else f"group {name}"


def _category_label(key: str) -> str:
    return dict(TIME_COLUMNS)[key]


# Figures -------------------------------------------------------------------------------------------
def _figure(width: float, height: float) -> "Figure":
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _png(figure: "Figure") -> bytes:
    buffer = io.BytesIO()
    # No Software/date metadata: the same input gives the same bytes.
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def _empty(title: str, message: str) -> bytes:
    """A figure saying there is nothing to draw (the file is still written, so the set of files
    does not depend on the data)."""
    figure = _figure(6, 2.5)
    axes = figure.add_subplot()
    axes.set_axis_off()
    axes.set_title(title)
    axes.text(0.5, 0.5, message, ha="center", va="center", transform=axes.transAxes)
    return _png(figure)


def _rank_axis(axes: "Axes", ranks: list[int], which: str = "x") -> None:
    """Rank numbers on an axis: every rank up to TICK_EVERY_RANK, else a few integer ticks."""
    from matplotlib.ticker import MaxNLocator

    axis = axes.xaxis if which == "x" else axes.yaxis
    if len(ranks) <= TICK_EVERY_RANK:
        axis.set_ticks(ranks, [str(rank) for rank in ranks])
    else:
        axis.set_major_locator(MaxNLocator(nbins=16, integer=True))


def _rank_bars(axes: "Axes", ranks: list[int], heights: list[float], bottom: list[float] | None = None,
               **style: Any) -> None:
    """One bar per rank. Beyond BARS_UPTO ranks the bars touch and are drawn as one stepped area
    (what bars of width 1 would draw, but one shape instead of thousands: 1,024 ranks in a
    fraction of the time)."""
    if len(ranks) <= BARS_UPTO:
        axes.bar(ranks, heights, 0.8, bottom=bottom, linewidth=0, **style)
        return
    import numpy as np

    edges = np.append(np.asarray(ranks, dtype=float) - 0.5, ranks[-1] + 0.5)
    base = np.zeros(len(ranks)) if bottom is None else np.asarray(bottom, dtype=float)
    axes.stairs(base + np.asarray(heights, dtype=float), edges, baseline=base, fill=True, linewidth=0, **style)


def _figure_width(count: int) -> float:
    """Wide enough for a bar per rank with its tick label (up to TICK_EVERY_RANK), then fixed."""
    return min(12.0, 5.5 + 0.22 * count) if count <= TICK_EVERY_RANK else 12.0


# run --plots ---------------------------------------------------------------------------------------
def breakdown_png(results: dict[str, Any]) -> bytes:
    """Each rank's finish time as a stacked bar of the six exclusive BREAKDOWN categories."""
    rows = sorted(results["ranks"], key=lambda row: row["rank"])
    drawn = [key for key in BREAKDOWN if any(row.get(key, 0) for row in rows)]
    title = f"time breakdown per rank ({len(rows):,} rank{'s' if len(rows) != 1 else ''})"
    if not drawn:
        return _empty(title, "every rank finished at 0 ns")
    divisor, unit = readable_unit([row["finish_ns"] for row in rows], "ns")
    ranks = [row["rank"] for row in rows]
    figure = _figure(_figure_width(len(rows)) + 2, 5)
    axes = figure.add_subplot()
    bottom = [0.0] * len(rows)
    for key in drawn:
        heights = [row.get(key, 0) / divisor for row in rows]
        _rank_bars(axes, ranks, heights, bottom, color=CATEGORY_COLOURS[key], label=_category_label(key))
        bottom = [b + h for b, h in zip(bottom, heights)]
    _rank_axis(axes, ranks)
    axes.set_xlim(ranks[0] - 0.6, ranks[-1] + 0.6)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("rank")
    axes.set_ylabel(f"time ({unit})")
    finish = max(row["finish_ns"] for row in rows) / divisor
    axes.set_title(f"{title}; finish {finish:,.4g} {unit}")
    axes.grid(True, axis="y", alpha=0.3)
    axes.set_axisbelow(True)
    # Legend top to bottom in the order the bars stack bottom to top, beside the axes.
    handles, labels = axes.get_legend_handles_labels()
    figure.legend(handles[::-1], labels[::-1], loc="outside right upper", fontsize="small",
                  title="each bar sums to\nthe rank's finish", title_fontsize="small")
    return _png(figure)


# analyze -----------------------------------------------------------------------------------------
def message_sizes_png(report: dict[str, Any]) -> bytes:
    """Messages (collectives, sends, receives) per rank and power-of-two size bucket, as a heat map."""
    import numpy as np
    from matplotlib.colors import LogNorm

    rows = report["ranks"]
    title = "messages per rank by comm_size"
    present = sorted({entry["from_bytes"] for row in rows for entry in row["message_sizes"]})
    if not present:
        return _empty(title, "no communication nodes in these traces")
    # Every power of two between the smallest and the largest bucket, so gaps show as gaps.
    powers = [bucket for bucket in present if bucket > 0]
    columns = [0] if present[0] == 0 else []
    if powers:
        bucket = powers[0]
        while bucket <= powers[-1]:
            columns.append(bucket)
            bucket *= 2
    column_of = {bucket: i for i, bucket in enumerate(columns)}
    counts = np.zeros((len(rows), len(columns)))
    for i, row in enumerate(rows):
        for entry in row["message_sizes"]:
            counts[i, column_of[entry["from_bytes"]]] = entry["count"]
    shown = np.ma.masked_equal(counts, 0)     # no messages: background colour, not the colour of 1
    positive = counts[counts > 0]
    wide_range = positive.max() / positive.min() > 50
    height = min(9.0, 2.2 + 0.28 * len(rows)) if len(rows) <= TICK_EVERY_RANK else 7.0
    figure = _figure(min(14.0, 5.0 + 0.55 * len(columns)), max(3.4, height))
    axes = figure.add_subplot()
    image = axes.imshow(shown, aspect="auto", interpolation="nearest", cmap="viridis",
                        norm=LogNorm(positive.min(), positive.max()) if wide_range else None,
                        vmin=None if wide_range else 0, vmax=None if wide_range else positive.max())
    axes.set_facecolor("white")
    colorbar = figure.colorbar(image, ax=axes)
    colorbar.set_label("messages" + (" (log scale)" if wide_range else "") + "; white: none")
    if wide_range:   # 1, 10, 100 rather than 10^0, 10^1, 10^2
        from matplotlib.ticker import FuncFormatter, NullFormatter

        colorbar.ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
        colorbar.ax.yaxis.set_minor_formatter(NullFormatter())
    labels = ["0 B" if bucket == 0 else size_text(bucket) for bucket in columns]
    axes.set_xticks(range(len(columns)), labels, rotation=45 if len(columns) > 6 else 0,
                    ha="right" if len(columns) > 6 else "center")
    _rank_axis(axes, [row["rank"] for row in rows], "y")     # row i is rank i: ranks are 0..N-1
    if len(rows) * len(columns) <= 200:     # small enough to print each count in its cell
        threshold = (np.log(positive.min()) + np.log(positive.max())) / 2 if wide_range else positive.max() / 2
        for (i, j), value in np.ndenumerate(counts):
            if value:
                level = np.log(value) if wide_range else value
                axes.text(j, i, f"{int(value):,}", ha="center", va="center", fontsize="small",
                          color="black" if level > threshold else "white")
    axes.set_xlabel("comm_size bucket (from this size up to twice it)")
    axes.set_ylabel("rank")
    total = int(counts.sum())
    axes.set_title(f"{title} ({total:,} messages on {len(rows):,} rank{'s' if len(rows) != 1 else ''})")
    return _png(figure)


def imbalance_png(report: dict[str, Any]) -> bytes:
    """max/min comm_size over a group's ranks for each of its collectives, with the threshold."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    result = report["imbalance"]
    threshold = result["threshold"]
    groups = [group for group in result["groups"] if group["collectives"]]
    title = "collective size imbalance across ranks"
    if not groups:
        return _empty(title, "no collectives in these traces")
    entries = [entry for group in groups for entry in group["collectives"]]
    finite = [entry["ratio"] for entry in entries if entry["ratio"] is not None]
    infinite = [entry["index"] for entry in entries if entry["ratio"] is None]
    top = max([threshold, *finite])
    log_scale = top > 20
    ceiling = top * (2 if log_scale else 1.15)    # where "min is 0" points are drawn
    figure = _figure(11, 5)
    axes = figure.add_subplot()
    labelled = len(groups) <= MAX_LEGEND_GROUPS
    for i, group in enumerate(groups):
        points = [(entry["index"], entry["ratio"]) for entry in group["collectives"] if entry["ratio"] is not None]
        many = len(group["collectives"]) > 60
        axes.plot([x for x, _ in points], [y for _, y in points], marker="." if many else "o",
                  markersize=3 if many else 5, linewidth=0.8, color=f"C{i % 10}" if labelled else "tab:blue",
                  alpha=1 if labelled else 0.5,
                  label=f"{group_label(group['group'])} ({group['members']} ranks)" if labelled else None)
    flagged = [(entry["index"], entry["ratio"]) for entry in result["flagged"] if entry["ratio"] is not None]
    if flagged:
        axes.scatter([x for x, _ in flagged], [y for _, y in flagged], s=70, facecolors="none",
                     edgecolors="red", linewidths=1.5, zorder=3, label=f"flagged ({len(result['flagged']):,})")
    if infinite:
        axes.scatter(infinite, [ceiling] * len(infinite), marker="^", s=60,
                     color="red", zorder=3, label="min comm_size 0 (ratio infinite)")
    axes.axhline(threshold, color="red", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
    if log_scale:
        axes.set_yscale("log")
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,g}"))
    axes.set_ylim(0.97 if not log_scale else 0.9, ceiling * (1.5 if log_scale else 1.08))
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlim(0.5, max(entry["index"] for entry in entries) + 0.5)
    axes.set_xlabel("collective # within its group (each rank's collectives in node-id order)")
    axes.set_ylabel("max / min comm_size over the group's ranks")
    lines = [f"{title}: {len(result['flagged']):,} of {len(entries):,} flagged"
             + ("" if labelled else f" ({len(groups):,} groups)")]
    short = result["short_ranks"]
    if short:
        first = short[0]
        lines.append(f"{len(short):,} rank(s) issue fewer collectives than their group (a run would hang),")
        lines.append(f"e.g. rank {first['rank']}: {first['issued']:,} of {first['expected']:,} in "
                     f"{group_label(first['group'])}")
    axes.set_title("\n".join(lines), fontsize="medium")
    axes.grid(True, alpha=0.3)
    figure.legend(loc="outside right upper", fontsize="small")
    return _png(figure)


def compute_vs_comm_png(report: dict[str, Any]) -> bytes:
    """Each rank's compute time against its communication volume; ranks at one point share a label."""
    rows = report["ranks"]
    title = "compute time vs communication volume per rank"
    x_div, x_unit = readable_unit([row["compute_ns"] for row in rows], "ns")
    y_div, y_unit = readable_unit([row["comm_bytes"] for row in rows], "bytes")
    points: dict[tuple[int, int], list[int]] = {}
    for row in rows:
        points.setdefault((row["compute_ns"], row["comm_bytes"]), []).append(row["rank"])
    figure = _figure(8.5, 5.5)
    axes = figure.add_subplot()
    xs = [row["compute_ns"] / x_div for row in rows]
    ys = [row["comm_bytes"] / y_div for row in rows]
    if len(points) <= 12:    # few distinct points: name the ranks at each
        axes.scatter(xs, ys, s=45, color="tab:blue", edgecolors="black", linewidths=0.4, zorder=3)
        # Labels alternate above and below along x, so neighbours' labels do not run together.
        for index, ((compute, volume), members) in enumerate(sorted(points.items())):
            text = f"rank {members[0]}" if len(members) == 1 else f"ranks {compact_ranks(members)}"
            axes.annotate(text, (compute / x_div, volume / y_div), xytext=(4, 7 if index % 2 == 0 else -13),
                          textcoords="offset points", fontsize="small")
    else:                    # many: the colour tells the rank
        ranks = [row["rank"] for row in rows]
        colours = axes.scatter(xs, ys, c=ranks, cmap="viridis", s=30, edgecolors="black", linewidths=0.3,
                               zorder=3)
        figure.colorbar(colours, ax=axes).set_label("rank")
    # Room on the left and below, so points at 0 are not cut by the axes' frame.
    right = max(xs) * 1.25 or 1.0
    top = max(ys) * 1.15 or 1.0
    axes.set_xlim(-0.03 * right, right)
    axes.set_ylim(-0.03 * top, top)
    timing = report["compute_time"]
    how = ("traced durations" if timing["mode"] == "duration"
           else f"roofline {timing['peak_tflops']:g} TFLOP/s, {timing['mem_bw_gbps']:g} GB/s")
    axes.set_xlabel(f"compute time, summed over the rank's compute nodes ({x_unit}; {how})")
    axes.set_ylabel(f"communication volume, summed comm_size ({y_unit})")
    axes.set_title(f"{title} ({len(rows):,} rank{'s' if len(rows) != 1 else ''})")
    axes.grid(True, alpha=0.3)
    return _png(figure)


def compare_png(diff: dict[str, Any]) -> bytes:
    """Left: finish and mean time per category, A and B side by side. Right: B - A finish per rank."""
    import numpy as np

    keys = ["finish_ns"] + [key for key in BREAKDOWN
                            if diff["mean_per_rank"][key]["a"] or diff["mean_per_rank"][key]["b"]]
    values = [diff["finish_ns"]] + [diff["mean_per_rank"][key] for key in keys[1:]]
    divisor, unit = readable_unit([v for entry in values for v in (entry["a"], entry["b"])], "ns")
    figure = _figure(13, 5.5)
    left, right = figure.subplots(1, 2, width_ratios=[1.3, 1])
    positions = np.arange(len(keys))
    width = 0.38
    bars_a = left.bar(positions - width / 2, [entry["a"] / divisor for entry in values], width, label=f"A: {diff['a']}",
                      color="tab:grey")
    bars_b = left.bar(positions + width / 2, [entry["b"] / divisor for entry in values], width, label=f"B: {diff['b']}",
                      color="tab:blue")
    for position, entry, bar_a, bar_b in zip(positions, values, bars_a, bars_b):
        percent = entry["percent"]
        text = "new" if percent is None else f"{percent:+.1f}%"
        left.annotate(text, (position, max(bar_a.get_height(), bar_b.get_height())), xytext=(0, 3),
                      textcoords="offset points", ha="center", fontsize="small")
    labels = ["finish\n(slowest rank)"] + [_category_label(key).replace(" ", "\n", 1) for key in keys[1:]]
    left.set_xticks(positions, labels, fontsize="small")
    left.set_ylabel(f"time ({unit}); categories: mean per rank")
    left.set_ylim(0, max(max(entry["a"], entry["b"]) for entry in values) / divisor * 1.15 or 1)
    left.set_title("A and B by time category (B - A in %)")
    left.grid(True, axis="y", alpha=0.3)
    left.set_axisbelow(True)

    rows = diff["ranks"]
    ranks = [row["rank"] for row in rows]
    deltas = [row["finish_ns"]["delta"] for row in rows]
    d_div, d_unit = readable_unit(deltas, "ns")
    _rank_bars(right, ranks, [max(d, 0) / d_div for d in deltas], color="tab:red")
    _rank_bars(right, ranks, [min(d, 0) / d_div for d in deltas], color="tab:green")
    right.axhline(0, color="black", linewidth=0.8)
    _rank_axis(right, ranks)
    right.set_xlim(ranks[0] - 0.6, ranks[-1] + 0.6)
    right.set_xlabel("rank")
    right.set_ylabel(f"B - A finish ({d_unit})")
    right.set_title("finish time change per rank (red: B slower, green: B faster)")
    right.grid(True, axis="y", alpha=0.3)
    right.set_axisbelow(True)

    finish = diff["finish_ns"]
    f_div, f_unit = readable_unit([finish["a"], finish["b"]], "ns")
    change = "" if finish["percent"] is None else f" ({finish['percent']:+.2f}%)"
    figure.suptitle(f"B against A on {diff['num_ranks']:,} rank(s): finish {finish['a'] / f_div:,.3f} -> "
                    f"{finish['b'] / f_div:,.3f} {f_unit}{change}")
    figure.legend(handles=[bars_a, bars_b], loc="outside lower center", ncols=2, fontsize="small")
    return _png(figure)
