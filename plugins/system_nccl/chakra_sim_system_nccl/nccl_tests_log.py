"""The typed result of reading one nccl-tests log (`Row`, `NcclTestsLog`), the collectives nccl-tests
names and their bus-bandwidth factors, and the problems a reader reports (chakra_sim_system_nccl.nccl_tests
reads the logs)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from chakra_core import ManifestError
from chakra_sim_system_nccl.launch import LaunchInfo

# Collectives by nccl-tests program name without `_perf`; the value maps a rank count to
# the busbw/algbw factor (None: nccl-tests defines none we rely on).
COLLECTIVES: dict[str, Callable[[int], float] | None] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
    "gather": None,
    "scatter": None,
    "hypercube": None,
}
# Printed size = count x word size x ranks for these (count is per rank); = count x word size otherwise.
PER_RANK_COUNT = frozenset({"all_gather", "reduce_scatter", "alltoall"})

WORD_SIZES: dict[str, int] = {
    "int8": 1, "uint8": 1, "char": 1, "f8e4m3": 1, "f8e5m2": 1,
    "half": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "uint32": 4, "int": 4, "float": 4, "float32": 4,
    "int64": 8, "uint64": 8, "double": 8, "float64": 8,
}

PRINT_HALF_UNIT = 0.005           # algbw and busbw print as %6.2f
SLACK = 1e-6                      # float32 -> printf rounding
MAX_PROBLEMS = 20                 # a garbage file should not print thousands of lines


@dataclass(frozen=True)
class Row:
    """One timed call: a message size in one placement (out-of-place or in-place)."""

    size: int          # bytes, as printed (total buffer for gather/scatter-type collectives)
    count: int         # elements, as printed (per rank for all_gather, reduce_scatter, alltoall)
    dtype: str
    redop: str         # "none" for collectives without a reduction
    root: int          # -1 unless rooted (broadcast, reduce)
    time_us: float
    algbw: float       # GB/s, 10^9 B/s
    busbw: float       # GB/s
    in_place: bool


@dataclass(frozen=True)
class NcclTestsLog:
    """The result rows of one nccl-tests run, with what the log says about the setup."""

    path: str
    collective: str                # "all_reduce", "all_gather", "reduce_scatter", "alltoall", ...
    ranks: int | None
    gpu: str | None                # device name from the header ("a, b" if ranks differ)
    rows: tuple[Row, ...]
    ranks_source: str = ""         # "argument", "device list", "size/count", "busbw/algbw", ""
    times_from_busbw: bool = False  # True for parse_busbw_table: times derived, not measured
    line_numbers: tuple[int, ...] = field(default=(), repr=False, compare=False)
    launch: LaunchInfo | None = None   # from the `# nThread` header line (None: not printed)
    columns_line: int | None = field(default=None, compare=False)   # the `# size count ...` column titles
    nccl_version: tuple[int, int, int] | None = None   # `nccl-library=` or NCCL's `NCCL version` line

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(row.dtype for row in self.rows))

    def times(self, in_place: bool, dtype: str | None = None) -> dict[int, float]:
        """Size (bytes) -> time (us) for one placement, in file order."""
        return self._column("time_us", in_place, dtype)

    def algbws(self, in_place: bool, dtype: str | None = None) -> dict[int, float]:
        """Size (bytes) -> algbw (GB/s) for one placement."""
        return self._column("algbw", in_place, dtype)

    def busbws(self, in_place: bool, dtype: str | None = None) -> dict[int, float]:
        """Size (bytes) -> busbw (GB/s) for one placement."""
        return self._column("busbw", in_place, dtype)

    def _column(self, name: str, in_place: bool, dtype: str | None) -> dict[int, float]:
        chosen = [row for row in self.rows
                  if row.in_place == in_place and (dtype is None or row.dtype == dtype)]
        result: dict[int, float] = {}
        for row in chosen:
            if row.size in result:   # -d all / -o all runs time each size several times
                raise ValueError(f"{self.path}: size {row.size} appears more than once "
                                 f"(data types {', '.join(self.dtypes)}, or several reduction ops); "
                                 "select rows by dtype, or read `rows`")
            result[row.size] = getattr(row, name)
        return result


# --------------------------------------------------------------------------- names

ALIASES = {
    "allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
    "alltoall": "alltoall", "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "sendrecv",
    "gather": "gather", "scatter": "scatter", "hypercube": "hypercube",
}


def normalize_collective(name: str) -> str:
    """`all_reduce_perf`, `AllReduce`, `all-reduce` -> `all_reduce`; ValueError if unknown."""
    key = re.sub(r"[_\-\s]", "", name.strip().lower())
    key = re.sub(r"perf(mpi)?$", "", key)
    if key not in ALIASES:
        raise ValueError(f"unknown collective {name!r}; known: {', '.join(COLLECTIVES)}")
    return ALIASES[key]


def busbw_factor(collective: str, ranks: int) -> float:
    """busbw / algbw for `collective` on `ranks` ranks (nccl-tests doc/PERFORMANCE.md)."""
    factor = COLLECTIVES[normalize_collective(collective)]
    if factor is None:
        raise ValueError(f"nccl-tests defines no busbw factor for {collective!r} that this module knows")
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, not {ranks}")
    return factor(ranks)


_PROGRAM = re.compile(r"(?<![A-Za-z0-9_])([a-z0-9_]+)_perf(?:_mpi)?(?![A-Za-z0-9_])")


def collectives_named_in(text: str) -> set[str]:
    found = set()
    for match in _PROGRAM.finditer(text):
        try:
            found.add(normalize_collective(match.group(1)))
        except ValueError:
            pass
    return found


def collective_from_file_name(path: str) -> str | None:
    name = Path(path).name.lower()
    squashed = re.sub(r"[_\-]", "", name)
    found = {ALIASES[key] for key in ("allreduce", "allgather", "reducescatter", "alltoall",
                                      "broadcast", "sendrecv") if key in squashed}
    if not found and "reduce" in re.split(r"[^a-z0-9]+", name):
        found.add("reduce")
    return found.pop() if len(found) == 1 else None


class Problems:
    """Problems found in a log, each at `path:line`; raised together as one ManifestError."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.items: list[tuple[str, str]] = []

    def add(self, line: int, reason: str) -> None:
        self.items.append((f"{self.path}:{line}", reason))

    def raise_if_any(self) -> None:
        if self.items:
            shown = self.items[:MAX_PROBLEMS]
            if len(self.items) > MAX_PROBLEMS:
                shown.append((self.path, f"... and {len(self.items) - MAX_PROBLEMS} more problems"))
            raise ManifestError(shown)
