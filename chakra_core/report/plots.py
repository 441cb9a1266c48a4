"""Plots of a run's results and of a trace analysis, as PNG bytes.

    breakdown_png(results)       breakdown.png        chakra-sim run --plots
    step_png(training)           step.png             chakra-sim run --plots, a training job
    compare_png(diff)            compare.png          chakra-sim analyze --results A --results B --out DIR

and, in chakra_core.report.analysis_plots, the plots of `chakra-sim analyze --out DIR`
(message_sizes.png, imbalance.png, compute_vs_comm.png).

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
from chakra_core.jobs.step import TrainingStep
from chakra_core.report.document import Results
from chakra_core.report.summary import TIME_COLUMNS, TIME_UNITS
from chakra_core.comm.groups import WORLD

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from chakra_core.report.compare import Comparison

BREAKDOWN_PNG = "breakdown.png"
STEP_PNG = "step.png"
COMPARE_PNG = "compare.png"

CATEGORY_COLOURS = {"gpu_compute_ns": "tab:blue", "cpu_compute_ns": "tab:orange", "memory_ns": "tab:purple",
                    "exposed_network_ns": "tab:red", "waiting_ns": "tab:olive", "idle_ns": "lightgrey"}
TICK_EVERY_RANK = 32
"""Up to this many ranks, every rank has its tick on a rank axis."""
BARS_UPTO = 64
"""Up to this many ranks, a rank's bar has gaps on both sides; beyond, the bars touch."""

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
def figure_of(width: float, height: float) -> "Figure":
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def png_bytes(figure: "Figure") -> bytes:
    buffer = io.BytesIO()
    # No Software/date metadata: the same input gives the same bytes.
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def empty_figure(title: str, message: str) -> "Figure":
    """A figure saying there is nothing to draw (the file is still written, so the set of files
    does not depend on the data)."""
    figure = figure_of(6, 2.5)
    axes = figure.add_subplot()
    axes.set_axis_off()
    axes.set_title(title)
    axes.text(0.5, 0.5, message, ha="center", va="center", transform=axes.transAxes)
    return figure


def _empty(title: str, message: str) -> bytes:
    return png_bytes(empty_figure(title, message))


def rank_axis(axes: "Axes", ranks: list[int], which: str = "x") -> None:
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
def breakdown_png(results: Results) -> bytes:
    """Each rank's finish time as a stacked bar of the six exclusive BREAKDOWN categories."""
    rows = sorted(results.ranks, key=lambda row: row.rank)
    drawn = [key for key in BREAKDOWN if any(row.breakdown[key] for row in rows)]
    title = f"time breakdown per rank ({len(rows):,} rank{'s' if len(rows) != 1 else ''})"
    if not drawn:
        return _empty(title, "every rank finished at 0 ns")
    divisor, unit = readable_unit([row.finish_ns for row in rows], "ns")
    ranks = [row.rank for row in rows]
    figure = figure_of(_figure_width(len(rows)) + 2, 5)
    axes = figure.add_subplot()
    bottom = [0.0] * len(rows)
    for key in drawn:
        heights = [row.breakdown[key] / divisor for row in rows]
        _rank_bars(axes, ranks, heights, bottom, color=CATEGORY_COLOURS[key], label=_category_label(key))
        bottom = [b + h for b, h in zip(bottom, heights)]
    rank_axis(axes, ranks)
    axes.set_xlim(ranks[0] - 0.6, ranks[-1] + 0.6)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("rank")
    axes.set_ylabel(f"time ({unit})")
    finish = max(row.finish_ns for row in rows) / divisor
    axes.set_title(f"{title}; finish {finish:,.4g} {unit}")
    axes.grid(True, axis="y", alpha=0.3)
    axes.set_axisbelow(True)
    # Legend top to bottom in the order the bars stack bottom to top, beside the axes.
    handles, labels = axes.get_legend_handles_labels()
    figure.legend(handles[::-1], labels[::-1], loc="outside right upper", fontsize="small",
                  title="each bar sums to\nthe rank's finish", title_fontsize="small")
    return png_bytes(figure)


def step_png(training: TrainingStep) -> bytes:
    """A training step split as chakra_core.jobs.report splits it (compute by part, communication
    no kernel hid by role, the bubble), one stacked bar per pipeline stage's first rank."""
    stages = sorted(training.breakdown_by_stage_s.items(), key=lambda item: int(item[0]))
    parts = [part for part in training.breakdown_s if any(split.get(part, 0.0) for _, split in stages)]
    figure = figure_of(11, 1.6 + 0.45 * len(stages))
    axes = figure.add_subplot()
    labels = [f"stage {stage}" for stage, _ in stages]
    left = [0.0] * len(stages)
    palette = {part: f"C{index % 10}" for index, part in enumerate(training.breakdown_s)}
    palette["bubble"] = "lightgrey"   # waiting for a pipeline neighbour: no work, so no colour
    for part in parts:
        widths = [split.get(part, 0.0) for _, split in stages]
        axes.barh(labels, widths, left=left, color=palette.get(part, "grey"), hatch="//" if part == "bubble" else "",
                  edgecolor="white", linewidth=0.4, label=part.replace("_", " "))
        left = [a + b for a, b in zip(left, widths)]
    axes.invert_yaxis()
    axes.set_xlabel("seconds of the step (each bar sums to its stage's step)")
    axes.set_title(f"{training.model} on {training.gpus:,} GPUs: {training.step_time_s:.4g} s per step, "
                   "split per pipeline stage")
    axes.grid(True, axis="x", alpha=0.3)
    axes.set_axisbelow(True)
    figure.legend(loc="outside right upper", fontsize="small")
    return png_bytes(figure)


def compare_png(diff: Comparison) -> bytes:
    """Left: finish and mean time per category, A and B side by side. Right: B - A finish per rank."""
    import numpy as np

    keys = ["finish_ns"] + [key for key in BREAKDOWN
                            if diff.mean_per_rank[key].a or diff.mean_per_rank[key].b]
    values = [diff.finish_ns] + [diff.mean_per_rank[key] for key in keys[1:]]
    divisor, unit = readable_unit([v for entry in values for v in (entry.a, entry.b)], "ns")
    figure = figure_of(13, 5.5)
    left, right = figure.subplots(1, 2, width_ratios=[1.3, 1])
    positions = np.arange(len(keys))
    width = 0.38
    bars_a = left.bar(positions - width / 2, [entry.a / divisor for entry in values], width, label=f"A: {diff.a}",
                      color="tab:grey")
    bars_b = left.bar(positions + width / 2, [entry.b / divisor for entry in values], width, label=f"B: {diff.b}",
                      color="tab:blue")
    for position, entry, bar_a, bar_b in zip(positions, values, bars_a, bars_b):
        percent = entry.percent
        text = "new" if percent is None else f"{percent:+.1f}%"
        left.annotate(text, (position, max(bar_a.get_height(), bar_b.get_height())), xytext=(0, 3),
                      textcoords="offset points", ha="center", fontsize="small")
    labels = ["finish\n(slowest rank)"] + [_category_label(key).replace(" ", "\n", 1) for key in keys[1:]]
    left.set_xticks(positions, labels, fontsize="small")
    left.set_ylabel(f"time ({unit}); categories: mean per rank")
    left.set_ylim(0, max(max(entry.a, entry.b) for entry in values) / divisor * 1.15 or 1)
    left.set_title("A and B by time category (B - A in %)")
    left.grid(True, axis="y", alpha=0.3)
    left.set_axisbelow(True)

    ranks = [rank for rank, _ in diff.ranks]
    deltas = [per_rank["finish_ns"].delta for _, per_rank in diff.ranks]
    d_div, d_unit = readable_unit(deltas, "ns")
    _rank_bars(right, ranks, [max(d, 0) / d_div for d in deltas], color="tab:red")
    _rank_bars(right, ranks, [min(d, 0) / d_div for d in deltas], color="tab:green")
    right.axhline(0, color="black", linewidth=0.8)
    rank_axis(right, ranks)
    right.set_xlim(ranks[0] - 0.6, ranks[-1] + 0.6)
    right.set_xlabel("rank")
    right.set_ylabel(f"B - A finish ({d_unit})")
    right.set_title("finish time change per rank (red: B slower, green: B faster)")
    right.grid(True, axis="y", alpha=0.3)
    right.set_axisbelow(True)

    finish = diff.finish_ns
    f_div, f_unit = readable_unit([finish.a, finish.b], "ns")
    change = "" if finish.percent is None else f" ({finish.percent:+.2f}%)"
    figure.suptitle(f"B against A on {diff.num_ranks:,} rank(s): finish {finish.a / f_div:,.3f} -> "
                    f"{finish.b / f_div:,.3f} {f_unit}{change}")
    figure.legend(handles=[bars_a, bars_b], loc="outside lower center", ncols=2, fontsize="small")
    return png_bytes(figure)
