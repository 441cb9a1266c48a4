"""The terminal summary: a per-rank table (rich) and the run's warnings."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

MAX_ROWS = 32


def _us(ns: int) -> str:
    return f"{ns / 1000:,.3f}"


def _bytes(value: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.2f} {unit}"
        value /= 1024
    return str(value)


def rank_table(results: dict[str, Any], title: str = "chakra-sim results") -> Table:
    table = Table(title=title, title_justify="left")
    for header in ("rank", "finish (ns)", "finish (µs)", "compute (µs)", "exposed comm (µs)",
                   "bytes sent"):
        table.add_column(header, justify="right")
    ranks = results["ranks"]
    shown = ranks if len(ranks) <= MAX_ROWS else ranks[: MAX_ROWS // 2] + ranks[-MAX_ROWS // 2:]
    for index, row in enumerate(shown):
        if len(ranks) > MAX_ROWS and index == MAX_ROWS // 2:
            table.add_row("…", f"({len(ranks) - MAX_ROWS} more)", "", "", "", "")
        table.add_row(str(row["rank"]), f"{row['finish_ns']:,}", _us(row["finish_ns"]),
                      _us(row["compute_ns"]), _us(row["exposed_comm_ns"]), _bytes(row.get("bytes_sent", 0)))
    return table


def print_summary(results: dict[str, Any], console: Console, wall_s: float | None = None) -> None:
    console.print(rank_table(results))
    for layer, info in results["layers"].items():
        for block in info.get("highlights", []):
            if not block["rows"]:
                continue
            table = Table(title=f"{layer}: {block['title']}", title_justify="left")
            for index, column in enumerate(block["columns"]):
                table.add_column(column, justify="left" if index == 0 else "right")
            for row in block["rows"]:
                table.add_row(*row)
            console.print(table)
    finish = results["finish_ns"]
    layers = ", ".join(f"{layer}={info['plugin']}" for layer, info in results["layers"].items())
    line = f"finish: {finish:,} ns ({finish / 1000:,.3f} µs) on {results['num_ranks']} rank(s); {layers}"
    if wall_s is not None:
        line += f"; simulated in {wall_s:.2f} s"
    console.print(line, soft_wrap=True, highlight=False)
    warnings = results.get("warnings", [])
    if warnings:
        console.print(f"[yellow]{len(warnings)} warning(s):[/yellow]")
        for warning in warnings[:20]:
            console.print(f"  [yellow]-[/yellow] {escape(warning)}", soft_wrap=True, highlight=False)
        if len(warnings) > 20:
            console.print(f"  ... and {len(warnings) - 20} more (see results.json)")
