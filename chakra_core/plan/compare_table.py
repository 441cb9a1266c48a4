"""`plan`'s comparison and costs in the terminal (the numbers: chakra_core.plan.compare)."""

from __future__ import annotations

from typing import Callable

from rich.markup import escape
from rich.table import Table

from chakra_core.cli.output import out_console
from chakra_core.json_types import JsonObject
from chakra_core.plan.compare import best_simulated, describe_versus, per_million_tokens
from chakra_core.plan.search import Plan


def print_costs(found: Plan, usd_per_gpu_hour: float | None) -> None:
    """Per million tokens, the best layout's GPU-hours, energy at the GPUs' maximum power and cost."""
    best = best_simulated(found)
    if best is None:
        return
    costs = per_million_tokens(best[1], found.power_w, usd_per_gpu_hour)
    parts = [f"{costs['gpu_hours_per_million_tokens']:.4g} GPU-hours"]
    if isinstance(costs["kwh_per_million_tokens"], float):
        parts.append(f"{costs['kwh_per_million_tokens']:.4g} kWh with every GPU at its maximum power "
                     f"({costs['gpu_power_w']:,.0f} W: an upper bound, the GPUs alone)")
    if isinstance(costs["usd_per_million_tokens"], float):
        parts.append(f"${costs['usd_per_million_tokens']:,.4g} at ${usd_per_gpu_hour:,.2f} per GPU-hour")
    out_console().print(f"per million tokens, the best layout: {', '.join(parts)}", highlight=False,
                        markup=False, soft_wrap=True)


def _per_million_tokens(rows: list[JsonObject], shown: Callable[[object], str]) -> Table:
    """The best layouts' GPU-hours, energy at the GPUs' maximum power and cost per million tokens,
    each against the first value's (columns only for what some value has)."""
    table = Table(title="per million tokens, the best layout (energy: every GPU at its maximum power, the GPUs "
                        "alone: an upper bound)", title_justify="left")
    parts = [(name, key, ratio) for name, key, ratio in
             (("GPU-hours", "gpu_hours_per_million_tokens", "gpu_hours_vs_first"),
              ("GPU W", "gpu_power_w", None), ("kWh", "kwh_per_million_tokens", "energy_vs_first"),
              ("USD per GPU-hour", "usd_per_gpu_hour", None), ("USD", "usd_per_million_tokens", "cost_vs_first"))
             if any(isinstance(row.get(key), float) for row in rows)]
    table.add_column("value", no_wrap=True)
    for name, _, ratio in parts:
        table.add_column(name, justify="right")
        if ratio is not None:
            table.add_column("vs first", justify="right")
    for row in rows:
        cells = [shown(row["value"])]
        for _, key, ratio in parts:
            cells.append(_number(row.get(key)))
            if ratio is not None:
                value = row.get(ratio)
                cells.append(f"{value:.2f}x" if isinstance(value, float) else "-")
        table.add_row(*cells)
    return table


def _number(value: object) -> str:
    return f"{value:,.4g}" if isinstance(value, float) else "-"


def print_comparison(rows: list[JsonObject]) -> None:
    """The comparison's rows (compare.comparison_rows): the best layouts, their cost per token, a sentence each."""
    keys = {str(row["value"]).partition("=")[0] for row in rows}
    key = keys.pop() if len(keys) == 1 else None     # one --vary: its key in the title, its values in the rows

    def shown(value: object) -> str:
        return escape(str(value).partition("=")[2] if key is not None else str(value))

    table = Table(title=f"the best layout per value{'' if key is None else f' of {escape(key)}'}",
                  title_justify="left")
    columns = ("value", "GPUs", "best layout", "across domains", "step s", "vs first", "tokens/s/GPU",
               "TFLOP/s/GPU", "memory GiB", "error band")
    for column in columns:   # the value and layout whole: the numbers' headers fold first
        table.add_column(column, justify="left" if column in ("value", "best layout", "across domains", "error band")
                         else "right",
                         no_wrap=column in ("value", "best layout"))
    for row in rows:
        if row.get("step_s") is None:
            table.add_row(shown(row["value"]), "", "none simulated", *[""] * (len(columns) - 3))
            continue
        geomean, signed = row["error_band_geomean"], row["error_band_signed"]
        band = "none" if not isinstance(geomean, float) or not isinstance(signed, float) else \
            f"±{100 * geomean:.0f}%, {100 * signed:+.0f}% signed"
        table.add_row(shown(row["value"]), str(row["gpus"]), escape(str(row["best_layout"])),
                      escape(str(row["across_domains"]) or "none"),
                      f"{row['step_s']:.3f}", f"{row['step_vs_first']:.2f}x", f"{row['tokens_per_s_per_gpu']:,.0f}",
                      f"{row['tflops_per_gpu']:.0f}",
                      f"{row['memory_gib']:.1f}", band)
    console = out_console()
    console.print(table)
    console.print(_per_million_tokens(rows, shown))
    first = next((row for row in rows if row.get("step_s") is not None), None)
    for row in rows:
        sentence = None if first is None else describe_versus(row, first)
        if sentence is not None:
            console.print(sentence, highlight=False, markup=False, soft_wrap=True)
