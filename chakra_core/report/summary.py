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

MAX_ROWS = 16
"""Up to this many rows: a rank each, or a row per set of ranks with identical figures; above,
min / median / max and the slowest rank (`show_all`, `run --ranks`: a row per rank always)."""

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


def rank_table(results: Results, title: str = "chakra-sim results", show_all: bool = False) -> Table:
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

    if show_all or len(ranks) <= MAX_ROWS:
        for rank in ranks:
            table.add_row(str(rank.rank), *row_cells(rank))
        return table
    alike: dict[tuple[int, ...], list[RankResult]] = {}   # ranks whose figures are all the same
    for rank in ranks:
        alike.setdefault((rank.finish_ns, *(rank.breakdown[key] for key in keys), rank.bytes_sent,
                          rank.bytes_received), []).append(rank)
    if len(alike) <= MAX_ROWS:
        table.caption = "time columns sum to finish; ranks with identical figures share a row (--ranks: one each)"
        for members in sorted(alike.values(), key=lambda group: group[0].rank):
            label = compact_ranks(r.rank for r in members)
            table.add_row(label if len(members) == 1 else f"{label} ({len(members):,})", *row_cells(members[0]))
        return table
    table.caption = "time columns sum to finish on each rank, not across the min / median / max rows (--ranks: every rank)"
    for label, pick in (("min", min), ("median", median_low), ("max", max)):
        table.add_row(label, *cells(pick(r.finish_ns for r in ranks), [pick(r.breakdown[key] for r in ranks) for key in keys],
                                    pick(r.bytes_sent for r in ranks), pick(r.bytes_received for r in ranks)))
    slowest = max(ranks, key=lambda r: (r.finish_ns, -r.rank))
    table.add_section()
    table.add_row(f"slowest: {slowest.rank}", *row_cells(slowest))
    return table


def training_headline(training: TrainingStep) -> str:
    """The step in one line: time (and error band), rates."""
    band = training.error_band
    within = f" ±{band.geomean_error:.0%}" if band else ""
    return (f"training step: {training.model} on {training.gpus:,} GPUs — {training.step_time_s:.4g} s{within}, "
            f"{training.tflops_per_gpu:.0f} TFLOP/s per GPU, MFU {training.mfu:.1%}, "
            f"{training.tokens_per_s_per_gpu:,.0f} tokens/s per GPU")


def training_notes(training: TrainingStep) -> list[str]:
    """What the error band and the rates mean."""
    band = training.error_band
    notes = ["TFLOP/s and MFU: " + training.flops_formula.split(":")[0]]
    if band:
        lean = "fast" if band.mean_signed_error < 0 else "slow"
        uncovered = "" if not band.not_covered else \
            f"; no published run uses {', '.join(band.not_covered)}: the band does not measure what it changes"
        notes.insert(0, f"error band ±{band.geomean_error:.0%}: the model's geomean error on {band.runs} "
                        f"published {band.scope} runs (on average {abs(band.mean_signed_error):.0%} too "
                        f"{lean}, worst {band.worst_error:.0%}; docs/training-accuracy.md){uncovered}")
    else:
        notes.insert(0, "no error band: no published run has been compared (docs/training-accuracy.md)")
    cost = training.routing
    if cost is not None:
        gemms = "" if cost.expert_gemm_s is None or cost.expert_gemm_balanced_s is None else \
            f"; its expert GEMMs take {cost.expert_gemm_s:.4g} s of the step, {cost.expert_gemm_balanced_s:.4g} s balanced"
        dropped = f", {cost.dropped:.1%} of the routed tokens dropped" if cost.dropped else ""
        notes.append(f"routing {cost.routing}: EP rank {cost.hottest_ep_rank}'s experts compute {cost.imbalance:.2f}x "
                     f"the balanced tokens{dropped}, and every EP rank waits for it{gemms}")
    return notes


def training_table(training: TrainingStep) -> Table:
    """A job's step: where its time went (the slowest rank's exclusive split)."""
    step = training.step_time_s
    table = Table(title=f"the step (rank {training.breakdown_rank}, the slowest)", title_justify="left",
                  caption="the parts sum to the step", caption_justify="left")
    table.add_column("part of the step")
    table.add_column("s", justify="right")
    table.add_column("share", justify="right")
    for part, seconds in training.breakdown_s.items():
        if seconds:
            table.add_row(part.replace("_", " "), f"{seconds:.4f}", f"{seconds / step:.1%}" if step else "-")
    return table


def print_summary(results: Results, console: Console, wall_s: float | None = None, all_ranks: bool = False) -> None:
    console.print(rank_table(results, show_all=all_ranks))
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
        console.print(training_headline(results.training), soft_wrap=True, highlight=False)
        for line in training_notes(results.training):
            console.print(f"  {line}", soft_wrap=True, highlight=False)
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
    time = folding.time
    if time is not None and time.folded:
        console.print(f"folded in time: simulated {time.microbatches_simulated} of {time.microbatches} "
                      f"micro-batches, the other {time.periods} period(s) of {time.microbatches_per_period} "
                      f"added exactly (the step repeats every {time.cycle_periods} period(s), "
                      f"{time.cycle_ns:,} ns)", soft_wrap=True, highlight=False)
    elif time is not None:
        console.print(f"simulated every micro-batch ({time.reason})", soft_wrap=True, highlight=False)
    warnings = results.warnings
    if warnings:
        console.print(f"[yellow]{len(warnings)} warning(s):[/yellow]")
        for warning in warnings[:20]:
            console.print(f"  [yellow]-[/yellow] {escape(warning)}", soft_wrap=True, highlight=False)
        if len(warnings) > 20:
            console.print(f"  ... and {len(warnings) - 20} more (see results.json)")
