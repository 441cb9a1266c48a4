"""The terminal summary: a per-rank table (rich) and the run's warnings."""

from __future__ import annotations

from statistics import median_low
from typing import Iterable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from chakra_core.engine.driver import BREAKDOWN
from chakra_core.jobs.step import TrainingStep
from chakra_core.report.document import RankResult, Results

MAX_ROWS = 64
"""Up to this many ranks, one row each; above, min / median / max and the slowest rank."""

_LABELS = {"gpu_compute_ns": "GPU compute", "cpu_compute_ns": "CPU compute", "memory_ns": "memory",
           "exposed_network_ns": "exposed network", "waiting_ns": "waiting for peers", "idle_ns": "idle"}
TIME_COLUMNS = tuple((key, _LABELS[key]) for key in BREAKDOWN)
"""The exclusive per-rank time categories: on each rank they sum to its finish time."""

TIME_UNITS = (("s", 1_000_000_000), ("ms", 1_000_000), ("µs", 1_000), ("ns", 1))
"""(name, ns per unit), largest first."""


def time_unit(ns: int) -> tuple[str, int]:
    """The unit to show a time of this magnitude in: (name, ns per unit)."""
    for name, scale in TIME_UNITS:
        if ns >= 10 * scale:
            return name, scale
    return "ns", 1


def format_time(ns: int, unit: tuple[str, int] | None = None) -> str:
    name, scale = unit or time_unit(ns)
    if scale == 1:
        return f"{ns:,} ns" if unit is None else f"{ns:,}"
    text = f"{ns / scale:,.3f}"
    return f"{text} {name}" if unit is None else text


def format_bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.2f} {unit}"
        value /= 1024
    return str(value)


def compact_ranks(ranks: Iterable[int]) -> str:
    """Rank numbers in few characters: [0, 1, 2, 5] -> '0-2, 5'; [0, 8, 16, 24] -> '0-24 step 8'."""
    ordered = sorted(set(ranks))
    if len(ordered) >= 3:
        stride = ordered[1] - ordered[0]
        if stride > 1 and all(b - a == stride for a, b in zip(ordered, ordered[1:])):
            return f"{ordered[0]}-{ordered[-1]} step {stride}"
    spans: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        spans.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ", ".join(spans) if spans else "none"


def rank_table(results: Results, title: str = "chakra-sim results") -> Table:
    """Per rank: finish time and where it went (columns that are zero on every rank are left out)."""
    ranks = results.ranks
    unit = time_unit(max((r.finish_ns for r in ranks), default=0))
    columns = [(key, label) for key, label in TIME_COLUMNS if any(r.breakdown[key] for r in ranks)]
    table = Table(title=title, title_justify="left", caption="time columns sum to finish",
                  caption_justify="left")
    table.add_column("rank", justify="right")
    for header in [f"finish ({unit[0]})"] + [label for _, label in columns]:
        table.add_column(header, justify="right")
    table.add_column("sent", justify="right")
    table.add_column("received", justify="right")
    keys = [key for key, _ in columns]

    def cells(finish: int, times: list[int], sent: float, received: float) -> list[str]:
        return ([format_time(ns, unit) for ns in [finish, *times]] + [format_bytes(sent), format_bytes(received)])

    def row_cells(rank: RankResult) -> list[str]:
        return cells(rank.finish_ns, [rank.breakdown[key] for key in keys], rank.bytes_sent, rank.bytes_received)

    if len(ranks) <= MAX_ROWS:
        for rank in ranks:
            table.add_row(str(rank.rank), *row_cells(rank))
        return table
    for label, pick in (("min", min), ("median", median_low), ("max", max)):
        table.add_row(label, *cells(pick(r.finish_ns for r in ranks), [pick(r.breakdown[key] for r in ranks) for key in keys],
                                    pick(r.bytes_sent for r in ranks), pick(r.bytes_received for r in ranks)))
    slowest = max(ranks, key=lambda r: (r.finish_ns, -r.rank))
    table.add_section()
    table.add_row(f"slowest: {slowest.rank}", *row_cells(slowest))
    return table


def training_table(training: TrainingStep) -> Table:
    """A job's step: where its time went (the slowest rank's exclusive split) and its rates."""
    step = training.step_time_s
    band = training.error_band
    within = f" ±{band.geomean_error:.0%}" if band else ""
    table = Table(title=f"training step: {training.model} on {training.gpus:,} GPUs — {step:.4g} s{within}, "
                        f"{training.tflops_per_gpu:.0f} TFLOP/s per GPU, MFU {training.mfu:.1%}, "
                        f"{training.tokens_per_s_per_gpu:,.0f} tokens/s per GPU", title_justify="left")
    caption = ["TFLOP/s and MFU: " + training.flops_formula.split(":")[0]]
    if band:
        lean = "fast" if band.mean_signed_error < 0 else "slow"
        caption.insert(0, f"error band ±{band.geomean_error:.0%}: the model's geomean error on {band.runs} "
                          f"published {band.scope} runs (on average {abs(band.mean_signed_error):.0%} too "
                          f"{lean}, worst {band.worst_error:.0%}; docs/training-accuracy.md)")
    else:
        caption.insert(0, "no error band: no published run has been compared (docs/training-accuracy.md)")
    table.caption, table.caption_justify = "\n".join(caption), "left"
    table.add_column(f"part of the step (rank {training.breakdown_rank})")
    table.add_column("s", justify="right")
    table.add_column("share", justify="right")
    for part, seconds in training.breakdown_s.items():
        if seconds:
            table.add_row(part.replace("_", " "), f"{seconds:.4f}", f"{seconds / step:.1%}" if step else "-")
    return table


def print_summary(results: Results, console: Console, wall_s: float | None = None) -> None:
    console.print(rank_table(results))
    for layer, info in results.layers.items():
        for block in info.highlights:
            if not block.rows:
                continue
            table = Table(title=f"{layer}: {block.title}", title_justify="left")
            for index, column in enumerate(block.columns):
                table.add_column(column, justify="left" if index == 0 else "right")
            for row in block.rows:
                table.add_row(*row)
            console.print(table)
    if results.training is not None:
        console.print(training_table(results.training))
    finish = results.finish_ns
    layers = ", ".join(f"{layer}={info.plugin}" for layer, info in results.layers.items())
    shown = f"{finish:,} ns" if finish < 10_000 else f"{format_time(finish)} ({finish:,} ns)"
    line = f"finish: {shown} on {results.num_ranks} rank(s); {layers}"
    if wall_s is not None:
        line += f"; simulated in {wall_s:.2f} s"
    console.print(line, soft_wrap=True, highlight=False)
    folding = results.folding
    if folding.folded:
        console.print(f"folded {results.num_ranks:,} ranks into {len(folding.representatives or {}):,} class(es) "
                      "of equivalent ranks: simulated one per class", soft_wrap=True, highlight=False)
    else:
        console.print(f"simulated every rank ({folding.reason})", soft_wrap=True, highlight=False)
    warnings = results.warnings
    if warnings:
        console.print(f"[yellow]{len(warnings)} warning(s):[/yellow]")
        for warning in warnings[:20]:
            console.print(f"  [yellow]-[/yellow] {escape(warning)}", soft_wrap=True, highlight=False)
        if len(warnings) > 20:
            console.print(f"  ... and {len(warnings) - 20} more (see results.json)")
