"""Plots of a trace analysis, written by `chakra-sim analyze --out DIR`, as PNG bytes.

    message_sizes_png(report)    message_sizes.png
    imbalance_png(report)        imbalance.png
    compute_vs_comm_png(report)  compute_vs_comm.png

Each `*_png` draws its `*_figure` (the matplotlib Figure, for tests to read labels and ticks
from) with the conventions of chakra_core.report.plots: Agg canvas imported when drawn, the same
bytes for the same input, legends outside the axes, rank axes readable from 1 to thousands.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

from chakra_core.report.plots import (TICK_EVERY_RANK, empty_figure, figure_of, group_label, png_bytes,
                                      rank_axis, readable_unit, size_text)
from chakra_core.report.summary import compact_ranks

if TYPE_CHECKING:
    from matplotlib.colorbar import Colorbar
    from matplotlib.figure import Figure

    from chakra_core.tools.analyze.report import JobAnalysis

MESSAGE_SIZES_PNG = "message_sizes.png"
IMBALANCE_PNG = "imbalance.png"
COMPUTE_VS_COMM_PNG = "compute_vs_comm.png"

MAX_LEGEND_GROUPS = 20
"""Up to this many communicator groups, the imbalance plot gives each its own colour (tab10, or
tab20 beyond 10 groups), marker and legend entry; beyond, one colour for all."""
MAX_SIZE_TICKS = 12
"""At most this many labelled size buckets on the message-size axis; beyond, every k-th."""
MAX_COLOURBAR_TICKS = 6
"""At most this many labelled ticks on a colour bar."""
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_LINESTYLES = ("-", "--", "-.", ":")


def count_text(value: float) -> str:
    """A message count as a short tick label: 7, 950, 12k, 1.5M."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _count_colourbar(colorbar: "Colorbar", log_scale: bool) -> None:
    """Few ticks, as counts (1, 10, 100, 1k) rather than 10^0 or crowded minor labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    axis = colorbar.ax.yaxis
    axis.set_major_locator(LogLocator(numticks=MAX_COLOURBAR_TICKS) if log_scale
                           else MaxNLocator(nbins=MAX_COLOURBAR_TICKS - 1, integer=True))
    axis.set_major_formatter(FuncFormatter(lambda value, _: count_text(value)))
    axis.set_minor_formatter(NullFormatter())


def message_sizes_figure(report: JobAnalysis) -> "Figure":
    """Messages (collectives, sends, receives) per rank and power-of-two size bucket, as a heat map."""
    import numpy as np
    from matplotlib.colors import LogNorm

    rows = report.ranks
    title = "messages per rank by comm_size"
    present = sorted({entry.from_bytes for row in rows for entry in row.message_sizes})
    if not present:
        return empty_figure(title, "no communication nodes in these traces")
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
        for entry in row.message_sizes:
            counts[i, column_of[entry.from_bytes]] = entry.count
    shown = np.ma.masked_equal(counts, 0)     # no messages: background colour, not the colour of 1
    positive = counts[counts > 0]
    wide_range = positive.max() / positive.min() > 50
    height = min(9.0, 2.2 + 0.28 * len(rows)) if len(rows) <= TICK_EVERY_RANK else 7.0
    figure = figure_of(min(14.0, 5.0 + 0.55 * len(columns)), max(3.4, height))
    axes = figure.add_subplot()
    image = axes.imshow(shown, aspect="auto", interpolation="nearest", cmap="viridis",
                        norm=LogNorm(positive.min(), positive.max()) if wide_range else None,
                        vmin=None if wide_range else 0, vmax=None if wide_range else positive.max())
    axes.set_facecolor("white")
    colorbar = figure.colorbar(image, ax=axes)
    colorbar.set_label("messages per rank and bucket" + (" (log scale)" if wide_range else "") + "; white: none")
    _count_colourbar(colorbar, wide_range)
    # Every k-th bucket labelled, in B / KiB / MiB / GiB: 30 rotated labels would overlap.
    step = math.ceil(len(columns) / MAX_SIZE_TICKS)
    labelled = list(range(0, len(columns), step))
    labels = ["0 B" if columns[i] == 0 else size_text(columns[i]) for i in labelled]
    axes.set_xticks(labelled, labels, rotation=45 if len(labelled) > 6 else 0,
                    ha="right" if len(labelled) > 6 else "center")
    rank_axis(axes, [row.rank for row in rows], "y")     # row i is rank i: ranks are 0..N-1
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
    return figure


class _Style(NamedTuple):
    color: Any   # a matplotlib colour (an RGBA tuple from the colormap)
    marker: str
    linestyle: str
    offset: float


def _group_styles(count: int) -> list[_Style]:
    """A colour, marker, line style and x offset per group, so no two groups look alike and lines
    that coincide (groups equally balanced) stay visible side by side."""
    from matplotlib import colormaps

    palette = colormaps["tab10" if count <= 10 else "tab20"]
    width = min(0.5, 0.12 * (count - 1))     # the spread of one collective's points over the groups
    return [_Style(palette(i % palette.N), _MARKERS[i % len(_MARKERS)],
                   _LINESTYLES[(i // len(_MARKERS)) % len(_LINESTYLES)],
                   (i / (count - 1) - 0.5) * width if count > 1 else 0.0) for i in range(count)]


def imbalance_figure(report: JobAnalysis) -> "Figure":
    """max/min comm_size over a group's ranks for each of its collectives, with the threshold."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    result = report.imbalance
    threshold = result.threshold
    groups = [group for group in result.groups if group.collectives]
    title = "collective size imbalance across ranks"
    if not groups:
        return empty_figure(title, "no collectives in these traces")
    entries = [entry for group in groups for entry in group.collectives]
    finite = [entry.ratio for entry in entries if entry.ratio is not None]
    top = max([threshold, *finite])
    log_scale = top > 20
    ceiling = top * (2 if log_scale else 1.15)    # where "min is 0" points are drawn
    figure = figure_of(11, 5)
    axes = figure.add_subplot()
    labelled = len(groups) <= MAX_LEGEND_GROUPS
    styles = _group_styles(len(groups)) if labelled else []
    offset_of = {group.group: style.offset for group, style in zip(groups, styles)}
    infinite = [entry.index + offset_of.get(group.group, 0.0)
                for group in groups for entry in group.collectives if entry.ratio is None]
    for i, group in enumerate(groups):
        points = [(entry.index, entry.ratio) for entry in group.collectives if entry.ratio is not None]
        many = len(group.collectives) > 60
        size = 3 if many else 5
        xs = [x + offset_of.get(group.group, 0.0) for x, _ in points]
        if labelled:
            style = styles[i]
            axes.plot(xs, [y for _, y in points], marker=style.marker, markersize=size, linewidth=0.8,
                      linestyle=style.linestyle, color=style.color,
                      label=f"{group_label(group.group)} ({group.members} ranks)")
        else:
            axes.plot(xs, [y for _, y in points], marker=".", markersize=size, linewidth=0.8, color="tab:blue",
                      alpha=0.5)
    flagged = [(entry.index + offset_of.get(entry.group, 0.0), entry.ratio)
               for entry in result.flagged if entry.ratio is not None]
    if flagged:
        # Smaller rings when there are many: large ones would paint over the lines they mark.
        axes.scatter([x for x, _ in flagged], [y for _, y in flagged], s=70 if len(entries) <= 200 else 20,
                     facecolors="none",
                     edgecolors="red", linewidths=1.5, zorder=3, label=f"flagged ({len(result.flagged):,})")
    if infinite:
        axes.scatter(infinite, [ceiling] * len(infinite), marker="^", s=60,
                     color="red", zorder=3, label="min comm_size 0 (ratio infinite)")
    axes.axhline(threshold, color="red", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
    if log_scale:
        axes.set_yscale("log")
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,g}"))
    axes.set_ylim(0.97 if not log_scale else 0.9, ceiling * (1.5 if log_scale else 1.08))
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlim(0.4, max(entry.index for entry in entries) + 0.6)
    axes.set_xlabel("collective # within its group (each rank's collectives in node-id order; "
                    "groups side by side)" if len(styles) > 1 else
                    "collective # within its group (each rank's collectives in node-id order)")
    axes.set_ylabel("max / min comm_size over the group's ranks")
    lines = [f"{title}: {len(result.flagged):,} of {len(entries):,} flagged"
             + ("" if labelled else f" ({len(groups):,} groups)")]
    short = result.short_ranks
    if short:
        first = short[0]
        lines.append(f"{len(short):,} rank(s) issue fewer collectives than their group (a run would hang),")
        lines.append(f"e.g. rank {first.rank}: {first.issued:,} of {first.expected:,} in "
                     f"{group_label(first.group)}")
    axes.set_title("\n".join(lines), fontsize="medium")
    axes.grid(True, alpha=0.3)
    figure.legend(loc="outside right upper", fontsize="small")
    return figure


def compute_vs_comm_figure(report: JobAnalysis) -> "Figure":
    """Each rank's compute time against its communication volume; ranks at one point share a label."""
    rows = report.ranks
    title = "compute time vs communication volume per rank"
    x_div, x_unit = readable_unit([row.compute_ns for row in rows], "ns")
    y_div, y_unit = readable_unit([row.comm_bytes for row in rows], "bytes")
    points: dict[tuple[int, int], list[int]] = {}
    for row in rows:
        points.setdefault((row.compute_ns, row.comm_bytes), []).append(row.rank)
    figure = figure_of(8.5, 5.5)
    axes = figure.add_subplot()
    xs = [row.compute_ns / x_div for row in rows]
    ys = [row.comm_bytes / y_div for row in rows]
    if len(points) <= 12:    # few distinct points: name the ranks at each
        axes.scatter(xs, ys, s=45, color="tab:blue", edgecolors="black", linewidths=0.4, zorder=3)
        # Labels alternate above and below along x, so neighbours' labels do not run together.
        for index, ((compute, volume), members) in enumerate(sorted(points.items())):
            text = f"rank {members[0]}" if len(members) == 1 else f"ranks {compact_ranks(members)}"
            axes.annotate(text, (compute / x_div, volume / y_div), xytext=(4, 7 if index % 2 == 0 else -13),
                          textcoords="offset points", fontsize="small")
    else:                    # many: the colour tells the rank
        ranks = [row.rank for row in rows]
        colours = axes.scatter(xs, ys, c=ranks, cmap="viridis", s=30, edgecolors="black", linewidths=0.3,
                               zorder=3)
        figure.colorbar(colours, ax=axes).set_label("rank")
    # Room on the left and below, so points at 0 are not cut by the axes' frame.
    right = max(xs) * 1.25 or 1.0
    top = max(ys) * 1.15 or 1.0
    axes.set_xlim(-0.03 * right, right)
    axes.set_ylim(-0.03 * top, top)
    timing = report.compute_time
    how = ("traced durations" if timing.mode == "duration"
           else f"roofline {timing.peak_tflops:g} TFLOP/s, {timing.mem_bw_gbps:g} GB/s")
    axes.set_xlabel(f"compute time, summed over the rank's compute nodes ({x_unit}; {how})")
    axes.set_ylabel(f"communication volume, summed comm_size ({y_unit})")
    axes.set_title(f"{title} ({len(rows):,} rank{'s' if len(rows) != 1 else ''})")
    axes.grid(True, alpha=0.3)
    return figure


def message_sizes_png(report: JobAnalysis) -> bytes:
    return png_bytes(message_sizes_figure(report))


def imbalance_png(report: JobAnalysis) -> bytes:
    return png_bytes(imbalance_figure(report))


def compute_vs_comm_png(report: JobAnalysis) -> bytes:
    return png_bytes(compute_vs_comm_figure(report))
