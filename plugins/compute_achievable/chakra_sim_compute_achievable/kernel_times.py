"""Measured kernel times that replace the model (`kernel_times: file.csv`).

Two layouts, told apart by the header:

- `name,time_us`: `name` is an fnmatch pattern matched against the node's name; the first
  matching row wins (so put specific patterns before `*`);
- `kernel,m,n,k,batch,dtype,time_us`: a GEMM shape (`kernel` gemm or bmm, `dtype` a profile
  data type) matched exactly against a GEMM node's attributes and data type.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from chakra_core import InputFileError, canonical_dtype, read_input_text

NAME_COLUMNS = ("name", "time_us")
SHAPE_COLUMNS = ("kernel", "m", "n", "k", "batch", "dtype", "time_us")

ShapeKey = tuple[str, int, int, int, int, str]


class KernelTimesError(ValueError):
    """A problem with the file, its message naming the file and line."""


@dataclass
class KernelTimes:
    patterns: list[tuple[str, float]] = field(default_factory=list)   # (pattern, µs), file order
    shapes: dict[ShapeKey, float] = field(default_factory=dict)       # GEMM shape -> µs

    def by_name(self, name: str) -> float | None:
        for pattern, micros in self.patterns:
            if fnmatchcase(name, pattern):
                return micros
        return None

    def by_shape(self, key: ShapeKey) -> float | None:
        return self.shapes.get(key)


def _time(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise KernelTimesError(f"{where}: time_us {text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise KernelTimesError(f"{where}: time_us must be a finite number >= 0, not {text!r}")
    return value


def _count(text: str, column: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise KernelTimesError(f"{where}: {column} {text!r} is not an integer") from None
    if value <= 0:
        raise KernelTimesError(f"{where}: {column} must be > 0, not {value}")
    return value


def load_kernel_times(path: Path) -> KernelTimes:
    """Read and check the whole file; KernelTimesError names the first bad line."""
    try:
        text = read_input_text(path, "kernel_times file")
    except InputFileError as exc:
        raise KernelTimesError(str(exc)) from None
    rows = csv.reader(text.splitlines())
    header = next(rows, None)
    if header is None:
        raise KernelTimesError(f"{path}: empty file; the first line names the columns "
                               f"({','.join(NAME_COLUMNS)} or {','.join(SHAPE_COLUMNS)})")
    columns = tuple(cell.strip().lower() for cell in header)
    if columns not in (NAME_COLUMNS, SHAPE_COLUMNS):
        raise KernelTimesError(f"{path}:1: columns {','.join(columns)!r}; expected "
                               f"{','.join(NAME_COLUMNS)} or {','.join(SHAPE_COLUMNS)}")
    table = KernelTimes()
    for line, row in enumerate(rows, start=2):
        cells = [cell.strip() for cell in row]
        if not any(cells):
            continue                                     # blank lines are allowed
        where = f"{path}:{line}"
        if len(cells) != len(columns):
            raise KernelTimesError(f"{where}: {len(cells)} fields, the header has {len(columns)}")
        if columns == NAME_COLUMNS:
            if not cells[0]:
                raise KernelTimesError(f"{where}: empty name pattern")
            table.patterns.append((cells[0], _time(cells[1], where)))
            continue
        kernel = cells[0].lower()
        if kernel not in ("gemm", "bmm"):
            raise KernelTimesError(f"{where}: kernel {cells[0]!r} is not gemm or bmm")
        dtype = canonical_dtype(cells[5])
        if dtype is None:
            raise KernelTimesError(f"{where}: dtype {cells[5]!r} is not a data type (bf16, fp8, ...)")
        m, n, k, batch = (_count(cells[i], SHAPE_COLUMNS[i], where) for i in range(1, 5))
        key = (kernel, m, n, k, batch, dtype)
        if key in table.shapes:
            raise KernelTimesError(f"{where}: shape {key} given twice")
        table.shapes[key] = _time(cells[6], where)
    return table
