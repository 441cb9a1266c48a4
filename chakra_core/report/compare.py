"""What changed between two runs (`chakra-sim analyze --results A --results B`).

A what-if reads as "B against A": for the finish time (the slowest rank), for each of the six
exclusive time categories of `BREAKDOWN` (mean per rank; they add up to the mean finish time)
and for every rank, the comparison holds A's and B's values, B - A in ns and in percent of A.
Only the stable keys of results.json are read (chakra_core.report.results), so runs of any
layers compare; both must have the same number of ranks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from chakra_core.engine.driver import BREAKDOWN
from chakra_core.errors import ChakraSimError, InputFileError
from chakra_core.input_files import read_input_text
from chakra_core.report.summary import TIME_COLUMNS, format_time, time_unit

MAX_RANK_ROWS = 16
"""Up to this many ranks the per-rank table has one row each; above, the ranks of least,
median and most change."""

CATEGORY_LABELS = dict(TIME_COLUMNS)


class ResultsFileError(ChakraSimError):
    """A file given as results.json is not one, or two results cannot be compared."""


def load_results(path: Path) -> dict[str, Any]:
    """A results.json document, checked for the keys a comparison reads."""
    def invalid(reason: str) -> ResultsFileError:
        return ResultsFileError(f"{path}: not a chakra-sim results.json ({reason})")

    try:
        data = json.loads(read_input_text(path, "results file"))
    except InputFileError as exc:
        raise ResultsFileError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise invalid(f"not JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise invalid("nested too deeply to read") from None
    if not isinstance(data, dict) or not isinstance(data.get("ranks"), list) or not data["ranks"]:
        raise invalid("no list of ranks")
    for index, row in enumerate(data["ranks"]):
        missing = [key for key in ("rank", "finish_ns", *BREAKDOWN)
                   if not isinstance(row, dict) or not isinstance(row.get(key), int)]
        if missing:
            version = data.get("schema_version")
            hint = f"; it has schema_version {version}, rerun it with this chakra-sim" if version != 2 else ""
            raise invalid(f"ranks[{index}] has no integer {', '.join(missing)}{hint}")
    ranks = sorted(row["rank"] for row in data["ranks"])
    if ranks != list(range(len(ranks))):
        raise invalid("its ranks are not 0..N-1, each once")
    return data


def _delta(a: float, b: float) -> dict[str, Any]:
    return {"a": a, "b": b, "delta": b - a, "percent": (b - a) / a * 100 if a else None}


def compare_results(a: dict[str, Any], b: dict[str, Any], name_a: str = "A", name_b: str = "B") -> dict[str, Any]:
    """The comparison of two loaded results documents (JSON-able; see the module docstring)."""
    count = len(a["ranks"])
    if len(b["ranks"]) != count:
        raise ResultsFileError(f"{name_a} has {count} rank(s) and {name_b} {len(b['ranks'])}: "
                               "compare runs of the same job (same number of ranks)")
    rows_a = sorted(a["ranks"], key=lambda row: row["rank"])
    rows_b = sorted(b["ranks"], key=lambda row: row["rank"])
    keys = ("finish_ns", *BREAKDOWN)
    ranks = [{"rank": ra["rank"], **{key: _delta(ra[key], rb[key]) for key in keys}}
             for ra, rb in zip(rows_a, rows_b)]
    finish_a = max(row["finish_ns"] for row in rows_a)
    finish_b = max(row["finish_ns"] for row in rows_b)
    return {
        "a": name_a,
        "b": name_b,
        "num_ranks": count,
        "finish_ns": _delta(finish_a, finish_b),
        "speedup": finish_a / finish_b if finish_b else None,
        "mean_per_rank": {key: _delta(sum(row[key] for row in rows_a) / count,
                                      sum(row[key] for row in rows_b) / count) for key in keys},
        "ranks": ranks,
    }


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}%"


def _signed(ns: float, unit: tuple[str, int]) -> str:
    if not round(ns):
        return "0"
    text = format_time(round(abs(ns)), unit)
    return f"-{text}" if ns < 0 else f"+{text}"


def print_comparison(diff: dict[str, Any], console: Console) -> None:
    """The comparison in the terminal: which runs, the totals, then per rank."""
    console.print(f"A: {escape(diff['a'])}\nB: {escape(diff['b'])}", soft_wrap=True, highlight=False)
    totals, per_rank = compare_tables(diff)
    console.print(totals)
    speedup = diff["speedup"]
    console.print("speedup (A finish / B finish): " + ("-" if speedup is None else f"{speedup:.3f}x")
                  + "; the categories are means per rank and add up to the mean finish",
                  soft_wrap=True, highlight=False)
    console.print(per_rank)


def compare_tables(diff: dict[str, Any]) -> tuple[Table, Table]:
    """The comparison as terminal tables: the totals, and per rank."""
    finish = diff["finish_ns"]
    unit = time_unit(max(finish["a"], finish["b"]))
    totals = Table(title=f"B against A ({diff['num_ranks']} rank(s))", title_justify="left")
    for header in ("", f"A ({unit[0]})", f"B ({unit[0]})", f"B - A ({unit[0]})", "B - A (%)"):
        totals.add_column(header, justify="left" if not header else "right")
    totals.add_row("finish (slowest rank)", format_time(finish["a"], unit), format_time(finish["b"], unit),
                   _signed(finish["delta"], unit), _percent(finish["percent"]))
    totals.add_section()
    for key in BREAKDOWN:
        entry = diff["mean_per_rank"][key]
        if not entry["a"] and not entry["b"]:
            continue
        totals.add_row(CATEGORY_LABELS[key], format_time(round(entry["a"]), unit), format_time(round(entry["b"]), unit),
                       _signed(entry["delta"], unit), _percent(entry["percent"]))

    ranks = diff["ranks"]
    many = len(ranks) > MAX_RANK_ROWS
    per_rank = Table(title="finish time per rank" + (": least, median and most change" if many else ""),
                     title_justify="left")
    for header in ("rank", f"A ({unit[0]})", f"B ({unit[0]})", f"B - A ({unit[0]})", "B - A (%)",
                   "largest change"):
        per_rank.add_column(header, justify="left" if header == "largest change" else "right")
    shown = ranks
    if many:
        ordered = sorted(ranks, key=lambda row: (row["finish_ns"]["delta"], row["rank"]))
        shown = [ordered[0], ordered[(len(ordered) - 1) // 2], ordered[-1]]
    for row in shown:
        entry = row["finish_ns"]
        largest = max(BREAKDOWN, key=lambda key: abs(row[key]["delta"]))
        change = row[largest]["delta"]
        per_rank.add_row(str(row["rank"]), format_time(entry["a"], unit), format_time(entry["b"], unit),
                         _signed(entry["delta"], unit), _percent(entry["percent"]),
                         f"{CATEGORY_LABELS[largest]} {_signed(change, unit)}" if change else "none")
    return totals, per_rank
