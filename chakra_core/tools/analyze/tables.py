"""The analysis report as terminal tables (rich): per-rank summary, nodes by type, communication
volume, message sizes, communicator groups, flagged collectives and ranks missing collectives."""

from __future__ import annotations

from statistics import median_low
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from chakra_core.report.plots import group_label, size_text
from chakra_core.report.summary import compact_ranks, format_bytes, format_time, time_unit
from chakra_core.tools.analyze.report import Imbalance, JobAnalysis, RankAnalysis

MAX_RANK_ROWS = 16
"""Up to this many ranks the summary has one row per rank; above, min / median / max."""
MAX_FLAGGED_ROWS = 30
"""Rows of flagged collectives, ranks missing collectives and groups the terminal shows;
analysis.json / --json hold them all."""


def _ratio_text(ratio: float | None) -> str:
    return "inf" if ratio is None else f"{ratio:.3f}"


_SUMMARY_KEYS = ("nodes", "gpu", "cpu", "collectives", "send_recv", "compute_ns", "critical_path_ns",
                 "parallelism", "comm_bytes")
SummaryValues = dict[str, int | float | None]
"""A summary row's values by _SUMMARY_KEYS."""


def _summary_values(row: RankAnalysis) -> SummaryValues:
    counts = row.node_counts
    return {"nodes": row.nodes, "gpu": counts.get("COMP_NODE:GPU", 0), "cpu": counts.get("COMP_NODE:CPU", 0),
            "collectives": counts.get("COMM_COLL_NODE", 0),
            "send_recv": counts.get("COMM_SEND_NODE", 0) + counts.get("COMM_RECV_NODE", 0),
            "compute_ns": row.compute_ns, "critical_path_ns": row.critical_path_ns, "parallelism": row.parallelism,
            "comm_bytes": row.comm_bytes}


def _summary_rows(ranks: tuple[RankAnalysis, ...]) -> list[tuple[str, SummaryValues]]:
    """(label, values) rows: one per rank up to MAX_RANK_ROWS ranks, else min / median / max."""
    values = [_summary_values(row) for row in ranks]
    if len(ranks) <= MAX_RANK_ROWS:
        return [(str(row.rank), value) for row, value in zip(ranks, values)]
    rows = []
    for label, pick in (("min", min), ("median", median_low), ("max", max)):
        picked: SummaryValues = {}
        for key in _SUMMARY_KEYS:
            present = [value[key] for value in values if value[key] is not None]
            picked[key] = pick(present) if present else None   # type: ignore[type-var]  # numbers, None left out
        rows.append((label, picked))
    return rows


def summary_table(report: JobAnalysis) -> Table:
    ranks = report.ranks
    unit = time_unit(max((row.compute_ns for row in ranks), default=0))
    many = len(ranks) > MAX_RANK_ROWS
    table = Table(title=f"{report.prefix}: {report.num_ranks} rank(s), "
                        f"{report.distinct_traces} distinct trace file(s)",
                  title_justify="left", caption_justify="left",
                  caption="min / median / max over ranks of each column" if many else None)
    table.add_column("ranks" if many else "rank", justify="right")
    for header in ("nodes", "GPU comp", "CPU comp", "collectives", "send/recv", f"compute ({unit[0]})",
                   f"critical path ({unit[0]})", "parallelism", "comm volume"):
        table.add_column(header, justify="right")
    for label, values in _summary_rows(ranks):
        parallelism = values["parallelism"]
        table.add_row(label, *(f"{values[key]:,}" for key in _SUMMARY_KEYS[:5]),
                      format_time(int(values["compute_ns"] or 0), unit),
                      format_time(int(values["critical_path_ns"] or 0), unit),
                      "-" if parallelism is None else f"{parallelism:.2f}", format_bytes(values["comm_bytes"] or 0))
    return table


def node_table(report: JobAnalysis) -> Table:
    table = Table(title="nodes by type", title_justify="left")
    for header in ("type", "all ranks", "min per rank", "max per rank"):
        table.add_column(header, justify="left" if header == "type" else "right")
    for kind, total in report.totals.node_counts.items():
        per_rank = [row.node_counts.get(kind, 0) for row in report.ranks]
        table.add_row(kind, f"{total:,}", f"{min(per_rank):,}", f"{max(per_rank):,}")
    return table


def comm_table(report: JobAnalysis) -> Table:
    table = Table(title="communication volume (comm_size)", title_justify="left",
                  caption="bytes as each node's comm_size says (see docs/collectives.md)", caption_justify="left")
    for header in ("type", "nodes", "bytes (all ranks)", "min per rank", "max per rank", "mean size"):
        table.add_column(header, justify="left" if header == "type" else "right")
    for kind, entry in report.totals.comm_by_type.items():
        per_rank = [row.comm_by_type[kind].bytes if kind in row.comm_by_type else 0 for row in report.ranks]
        table.add_row(kind, f"{entry.count:,}", format_bytes(entry.bytes), format_bytes(min(per_rank)),
                      format_bytes(max(per_rank)), format_bytes(round(entry.bytes / entry.count)))
    return table


def size_table(report: JobAnalysis) -> Table:
    table = Table(title="messages by size (all ranks)", title_justify="left")
    for header in ("size", "messages"):
        table.add_column(header, justify="right")
    for entry in report.totals.message_sizes:
        bucket = entry.from_bytes
        size = "0 B" if bucket == 0 else f"{size_text(bucket)} - <{size_text(2 * bucket)}"
        table.add_row(size, f"{entry.count:,}")
    return table


def group_table(report: JobAnalysis) -> Table:
    groups = report.groups
    table = Table(title="communicator groups", title_justify="left", caption_justify="left",
                  caption=(f"first {MAX_FLAGGED_ROWS} of {len(groups):,}; all in --json / analysis.json"
                           if len(groups) > MAX_FLAGGED_ROWS else None))
    for header in ("group", "ranks", "members", "defined by", "collectives per rank", "bytes"):
        table.add_column(header, justify="right" if header in ("ranks", "bytes") else "left")
    for group in groups[:MAX_FLAGGED_ROWS]:
        low, high = group.collectives_min, group.collectives_max
        table.add_row(escape(group.label), str(len(group.members)), compact_ranks(group.members),
                      escape(group.source), f"{low:,}" if low == high else f"{low:,} - {high:,}",
                      format_bytes(group.bytes))
    return table


def print_report(report: JobAnalysis, console: Console) -> None:
    for table in (summary_table(report), node_table(report)):
        console.print(table)
    timing = report.compute_time
    if timing.mode == "roofline":
        timed = sum(row.roofline_nodes for row in report.ranks)
        compute_nodes = sum(n for kind, n in report.totals.node_counts.items() if kind.startswith("COMP_NODE"))
        console.print(f"compute time: roofline at {timing.peak_tflops:g} TFLOP/s and {timing.mem_bw_gbps:g} "
                      f"GB/s for {timed:,} of {compute_nodes:,} compute node(s); the others (CPU ops, no num_ops) "
                      "at their traced duration", soft_wrap=True, highlight=False)
    if report.totals.comm_by_type:
        console.print(comm_table(report))
        console.print(size_table(report))
    if report.groups:
        console.print(group_table(report))
    _print_imbalance(report.imbalance, console)
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", soft_wrap=True, highlight=False)


def _print_imbalance(result: Imbalance, console: Console) -> None:
    flagged, threshold = result.flagged, result.threshold
    if not result.groups:
        console.print("imbalance: no collectives", highlight=False)
    elif not flagged:
        console.print(f"imbalance: no collective has a max/min comm_size ratio above {threshold:g} across "
                      "its group's ranks", soft_wrap=True, highlight=False)
    else:
        table = Table(title=f"flagged collectives: max/min comm_size over the group's ranks above {threshold:g}, "
                            "or ranks disagreeing on the type",
                      title_justify="left", caption_justify="left",
                      caption=(f"first {MAX_FLAGGED_ROWS} of {len(flagged):,}; all in --json / analysis.json"
                               if len(flagged) > MAX_FLAGGED_ROWS else None))
        for header in ("group", "#", "type", "ranks", "min", "mean", "max", "max/min", "smallest", "largest"):
            table.add_column(header, justify="left" if header in ("group", "type", "smallest", "largest") else "right")
        for entry in flagged[:MAX_FLAGGED_ROWS]:
            table.add_row(escape(group_label(entry.group)), str(entry.index), entry.comm_type,
                          str(entry.ranks), format_bytes(entry.min_bytes),
                          format_bytes(round(entry.mean_bytes)), format_bytes(entry.max_bytes),
                          _ratio_text(entry.ratio),
                          f"rank {entry.min_rank} node {entry.min_node}",
                          f"rank {entry.max_rank} node {entry.max_node}")
        console.print(table)
    short = result.short_ranks
    if short:
        table = Table(title="ranks missing collectives (would hang)", title_justify="left", caption_justify="left",
                      caption=f"first {MAX_FLAGGED_ROWS} of {len(short):,}" if len(short) > MAX_FLAGGED_ROWS else None)
        for header in ("group", "rank", "issues", "others issue"):
            table.add_column(header, justify="left" if header == "group" else "right")
        for missing in short[:MAX_FLAGGED_ROWS]:
            table.add_row(escape(group_label(missing.group)), str(missing.rank), f"{missing.issued:,}",
                          f"{missing.expected:,}")
        console.print(table)
