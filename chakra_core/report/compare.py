"""What changed between two runs (`chakra-sim analyze --results A --results B`).

A what-if reads as "B against A": for the finish time (the slowest rank), for each of the six
exclusive time categories of `BREAKDOWN` (mean per rank; they add up to the mean finish time)
and for every rank, the comparison holds A's and B's values, B - A in ns and in percent of A.
Only the stable keys of results.json are read (chakra_core.report.results), so runs of any
layers compare; both must have the same number of ranks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from chakra_core.engine.driver import BREAKDOWN
from chakra_core.errors import ChakraSimError, InputFileError
from chakra_core.input_files import read_input_text
from chakra_core.json_types import JsonObject
from chakra_core.report.document import RankResult
from chakra_core.report.summary import TIME_COLUMNS, format_time, time_unit

MAX_RANK_ROWS = 16
"""Up to this many ranks the per-rank table has one row each; above, the ranks of least,
median and most change."""

CATEGORY_LABELS = dict(TIME_COLUMNS)


class ResultsFileError(ChakraSimError):
    """A file given as results.json is not one, or two results cannot be compared."""


def load_results(path: Path) -> tuple[RankResult, ...]:
    """The ranks of a results.json document in rank order, checked for the keys a comparison reads."""
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
    ranks = sorted((RankResult.from_json(row) for row in data["ranks"]), key=lambda rank: rank.rank)
    if [rank.rank for rank in ranks] != list(range(len(ranks))):
        raise invalid("its ranks are not 0..N-1, each once")
    return tuple(ranks)


@dataclass(frozen=True)
class Delta:
    """A value of run A and of run B, and how B differs."""

    a: float
    b: float

    @property
    def delta(self) -> float:
        return self.b - self.a

    @property
    def percent(self) -> float | None:
        """B - A in percent of A (None when A is 0)."""
        return (self.b - self.a) / self.a * 100 if self.a else None

    def to_json(self) -> JsonObject:
        return {"a": self.a, "b": self.b, "delta": self.delta, "percent": self.percent}


@dataclass(frozen=True)
class Comparison:
    """B against A: the finish, the mean of each time category over ranks, and every rank."""

    a: str
    b: str
    finish_ns: Delta
    mean_per_rank: Mapping[str, Delta]
    """By BREAKDOWN category (and finish_ns): means over ranks; they add up to the mean finish."""
    ranks: tuple[tuple[int, Mapping[str, Delta]], ...]
    """(rank, finish_ns and each category), in rank order."""

    @property
    def num_ranks(self) -> int:
        return len(self.ranks)

    @property
    def speedup(self) -> float | None:
        """A's finish over B's (None when B finished at 0)."""
        return self.finish_ns.a / self.finish_ns.b if self.finish_ns.b else None

    def to_json(self) -> JsonObject:
        return {"a": self.a, "b": self.b, "num_ranks": self.num_ranks, "finish_ns": self.finish_ns.to_json(),
                "speedup": self.speedup,
                "mean_per_rank": {key: entry.to_json() for key, entry in self.mean_per_rank.items()},
                "ranks": [{"rank": rank, **{key: entry.to_json() for key, entry in deltas.items()}}
                          for rank, deltas in self.ranks]}


def compare_results(a: Sequence[RankResult], b: Sequence[RankResult], name_a: str = "A",
                    name_b: str = "B") -> Comparison:
    """The comparison of two runs' ranks (see the module docstring)."""
    count = len(a)
    if len(b) != count:
        raise ResultsFileError(f"{name_a} has {count} rank(s) and {name_b} {len(b)}: "
                               "compare runs of the same job (same number of ranks)")
    rows_a = sorted(a, key=lambda row: row.rank)
    rows_b = sorted(b, key=lambda row: row.rank)

    def times(rank: RankResult) -> dict[str, int]:
        return {"finish_ns": rank.finish_ns, **rank.breakdown}

    keys = ("finish_ns", *BREAKDOWN)
    times_a, times_b = [times(rank) for rank in rows_a], [times(rank) for rank in rows_b]
    ranks = tuple((ra.rank, {key: Delta(ta[key], tb[key]) for key in keys})
                  for ra, ta, tb in zip(rows_a, times_a, times_b))
    return Comparison(name_a, name_b, Delta(max(row.finish_ns for row in rows_a), max(row.finish_ns for row in rows_b)),
                      {key: Delta(sum(t[key] for t in times_a) / count, sum(t[key] for t in times_b) / count)
                       for key in keys}, ranks)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}%"


def _signed(ns: float, unit: tuple[str, int]) -> str:
    if not round(ns):
        return "0"
    text = format_time(round(abs(ns)), unit)
    return f"-{text}" if ns < 0 else f"+{text}"


def print_comparison(diff: Comparison, console: Console) -> None:
    """The comparison in the terminal: which runs, the totals, then per rank."""
    console.print(f"A: {escape(diff.a)}\nB: {escape(diff.b)}", soft_wrap=True, highlight=False)
    totals, per_rank = compare_tables(diff)
    console.print(totals)
    speedup = diff.speedup
    console.print("speedup (A finish / B finish): " + ("-" if speedup is None else f"{speedup:.3f}x")
                  + "; the categories are means per rank and add up to the mean finish",
                  soft_wrap=True, highlight=False)
    console.print(per_rank)


def compare_tables(diff: Comparison) -> tuple[Table, Table]:
    """The comparison as terminal tables: the totals, and per rank."""
    finish = diff.finish_ns
    unit = time_unit(round(max(finish.a, finish.b)))
    totals = Table(title=f"B against A ({diff.num_ranks} rank(s))", title_justify="left")
    for header in ("", f"A ({unit[0]})", f"B ({unit[0]})", f"B - A ({unit[0]})", "B - A (%)"):
        totals.add_column(header, justify="left" if not header else "right")
    totals.add_row("finish (slowest rank)", format_time(round(finish.a), unit), format_time(round(finish.b), unit),
                   _signed(finish.delta, unit), _percent(finish.percent))
    totals.add_section()
    for key in BREAKDOWN:
        entry = diff.mean_per_rank[key]
        if not entry.a and not entry.b:
            continue
        totals.add_row(CATEGORY_LABELS[key], format_time(round(entry.a), unit), format_time(round(entry.b), unit),
                       _signed(entry.delta, unit), _percent(entry.percent))

    ranks = diff.ranks
    many = len(ranks) > MAX_RANK_ROWS
    per_rank = Table(title="finish time per rank" + (": least, median and most change" if many else ""),
                     title_justify="left")
    for header in ("rank", f"A ({unit[0]})", f"B ({unit[0]})", f"B - A ({unit[0]})", "B - A (%)",
                   "largest change"):
        per_rank.add_column(header, justify="left" if header == "largest change" else "right")
    shown = list(ranks)
    if many:
        ordered = sorted(ranks, key=lambda row: (row[1]["finish_ns"].delta, row[0]))
        shown = [ordered[0], ordered[(len(ordered) - 1) // 2], ordered[-1]]
    for rank, deltas in shown:
        entry = deltas["finish_ns"]
        largest = max(BREAKDOWN, key=lambda key: abs(deltas[key].delta))
        change = deltas[largest].delta
        per_rank.add_row(str(rank), format_time(round(entry.a), unit), format_time(round(entry.b), unit),
                         _signed(entry.delta, unit), _percent(entry.percent),
                         f"{CATEGORY_LABELS[largest]} {_signed(change, unit)}" if change else "none")
    return totals, per_rank
