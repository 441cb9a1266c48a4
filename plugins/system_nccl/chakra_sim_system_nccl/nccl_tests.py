"""Read NVIDIA nccl-tests output (`all_reduce_perf`, `all_gather_perf`, ...) into typed rows.

nccl-tests prints one line per message size:

    size(B) count type redop root | time(us) algbw busbw #wrong | time algbw busbw #wrong
                                  |        out-of-place          |        in-place

`parse`/`load` turn such a log into an `NcclTestsLog` holding one `Row` per size and
placement (out-of-place, in-place). Units are nccl-tests' own (doc/PERFORMANCE.md):
time in microseconds, algbw = size / time and busbw = algbw x factor in GB/s with
GB = 10^9 bytes; the busbw factor is 2(n-1)/n for all_reduce, (n-1)/n for
all_gather, reduce_scatter and alltoall, 1 for broadcast, reduce and sendrecv.
`size` is what nccl-tests prints: the total buffer for all_gather, reduce_scatter
and alltoall, not the per-rank chunk.

What the parser decides, and why:

* Launcher prefixes (`0: ` from `srun -l`, `[1,0]<stdout>:` from `mpirun --tag-output`)
  are stripped. `#` lines are comments (the header, the `# Avg bus bandwidth` footer);
  other lines that do not start with two integers (NCCL INFO/WARN, `NCCL version`,
  ssh warnings, a `...` elision) are ignored, because launchers interleave them freely.
* A line starting with two integers is a result row and must be well formed; otherwise
  the file is refused with its line number, so a truncated or garbled log never yields
  silently shortened data.
* Rows of size 0 are skipped: they time an empty call (launch overhead only), carry no
  bandwidth, and all_gather prints several of them when size / ranks rounds to 0.
* A half whose time, algbw or busbw prints `N/A` is left out; a row printing only one
  half (4 result columns) is out-of-place unless the header names only `in-place`.
  `#wrong` may be `N/A` (validation off); a positive `#wrong` means the collective
  computed wrong data, and such a log is refused.
* A time printed as 0 is kept as printed (the algbw check is skipped for it).
* Every row is checked against the printed numbers: algbw = size / time and
  busbw = algbw x factor(ranks), both within print rounding. This catches transcription
  errors, a wrong rank count and a mislabelled collective.
* A file holding several runs (a second `# Collective test starting:` line, or a second
  column header after result rows) is refused, naming the line: split it, one run per file.

The collective comes, in order, from the log's `# Collective test starting: X_perf` line
(authoritative: an explicit `collective=` must agree with it), then the `collective=`
argument, then the program named in a `# command:` line or an echoed invocation
(`.../all_reduce_perf -b 8 ...`), then the file name (`allreduce`, `all_gather`, ...).

The rank count comes, in order, from the `ranks=` argument (which must agree with a
device list), the `#  Rank  N ... device ...` header lines (distinct ranks counted), the
size/count columns (all_gather, reduce_scatter and alltoall print the per-rank count, so
size = count x word size x ranks), and the busbw/algbw ratio when only one integer fits
every row within rounding. `# nThread T nGpus G` counts GPUs per process only, so it is
not a rank count; it is used as a check (ranks must be a multiple of T x G).
`NcclTestsLog.ranks_source` says which source was used.

How the run was launched comes from the header (`NcclTestsLog.launch`, a
chakra_sim_system_nccl.launch.LaunchInfo, None without a `# nThread` line): nThread and nGpus,
the processes and hosts the device lines name (distinct `Pid ... on HOST`), `graph: N` (-G, 0
where not printed), whether `# Blocking Enabled` (-z) was printed before the device list, and a
`cputime` column title (-C). A header that contradicts itself is refused: device lines listing
another number of ranks than nThread x nGpus x processes, or a second `# nThread` line that
differs from the first.

The NCCL release comes from the header's `nccl-library=` code (`# nccl-tests version 2.17.9
nccl-headers=22403 nccl-library=22403`: NCCL_VERSION_CODE, 2.24.3) or NCCL's own `NCCL version
2.24.3+cuda12.6` banner (`NcclTestsLog.nccl_version`, None where neither is printed).

Azure's AI-benchmarking-guide publishes Markdown tables of in-place busbw only;
`parse_busbw_table` converts them back to times with the same definitions.

Problems raise `chakra_core.errors.ManifestError` with `path:line` locations.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from chakra_core import InputFileError, ManifestError, read_input_text
from chakra_sim_system_nccl.launch import LaunchInfo
from chakra_sim_system_nccl.nccl_tests_log import (
    COLLECTIVES, PER_RANK_COUNT, WORD_SIZES, NcclTestsLog, Problems, Row, busbw_factor, collective_from_file_name,
    normalize_collective,
)
from chakra_sim_system_nccl.nccl_tests_scan import (
    check_algbw, check_rows_against_ranks, choose_collective, choose_ranks, launch_info, scan_lines, strip_prefix,
)

__all__ = [
    "Row", "NcclTestsLog", "LaunchInfo", "parse", "load", "parse_busbw_table",
    "busbw_factor", "size_from_label", "normalize_collective", "COLLECTIVES",
]


def parse(text: str, path: str = "<text>", *, collective: str | None = None,
          ranks: int | None = None) -> NcclTestsLog:
    """Parse the output of one nccl-tests run (see the module docstring for the rules)."""
    path = str(path)
    problems = Problems(path)
    explicit_collective = normalize_collective(collective) if collective else None
    scan = scan_lines(text, problems)
    problems.raise_if_any()
    if not scan.rows:
        raise ManifestError([(f"{path}:{scan.line_count}", "no nccl-tests result rows found (lines like "
                              "'   1048576   262144   float   sum   -1   27.37   38.31   67.04   0 ...')")])
    chosen_collective = choose_collective(scan, explicit_collective, path)

    # Each (size, dtype, op, root, placement) is timed once per run; algbw must be size/time.
    seen: dict[tuple[object, ...], int] = {}
    for row in scan.rows:
        for half in row.halves:
            key = (row.size, row.dtype, row.redop, row.root, half.in_place)
            if key in seen:
                problems.add(row.line, f"size {row.size} ({row.dtype} {row.redop}) already printed at "
                                       f"line {seen[key]}: several runs in one file?")
            seen.setdefault(key, row.line)
            check_algbw(row, half, problems)
    problems.raise_if_any()

    launch = launch_info(scan, problems)
    chosen_ranks, source, ratio_range = choose_ranks(scan, chosen_collective, ranks, problems)
    problems.raise_if_any()
    if chosen_ranks is not None:
        check_rows_against_ranks(scan.rows, chosen_collective, chosen_ranks, source, ratio_range, problems)
    problems.raise_if_any()

    flat = tuple(Row(row.size, row.count, row.dtype, row.redop, row.root,
                     half.time_us, half.algbw, half.busbw, half.in_place)
                 for row in scan.rows for half in row.halves)
    line_numbers = tuple(row.line for row in scan.rows for _ in row.halves)
    gpu = ", ".join(sorted(set(scan.devices.values()))) if scan.devices else None
    return NcclTestsLog(path, chosen_collective, chosen_ranks, gpu, flat,
                        ranks_source=source, line_numbers=line_numbers, launch=launch,
                        columns_line=scan.columns_line, nccl_version=scan.nccl_version)


def load(path: str | Path, *, collective: str | None = None, ranks: int | None = None) -> NcclTestsLog:
    """Read and parse an nccl-tests log (`.gz` too). A Markdown busbw table (first data line
    starting with `|`) goes to `parse_busbw_table`, which needs `ranks`."""
    path = Path(path)
    try:
        text = read_input_text(path, "nccl-tests log", errors="replace", gunzip=path.suffix == ".gz")
    except InputFileError as exc:
        raise ManifestError([(exc.path, exc.reason)]) from None
    first_data = next((strip_prefix(line).strip() for line in text.splitlines()
                       if strip_prefix(line).strip() and not strip_prefix(line).strip().startswith("#")), "")
    if first_data.startswith("|"):
        name = normalize_collective(collective) if collective else collective_from_file_name(str(path))
        if name is None or ranks is None:
            raise ManifestError([(str(path), "a Markdown busbw table, not raw nccl-tests output: "
                                  "give collective= and ranks= (or call parse_busbw_table)")])
        return parse_busbw_table(text, name, ranks, path=str(path))
    return parse(text, str(path), collective=collective, ranks=ranks)


# --------------------------------------------------------------------------- busbw tables

_LABEL = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?$", re.IGNORECASE)
_UNIT_POWER = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}


def size_from_label(label: str) -> int:
    """Bytes named by a size label of a sweep over powers of two.

    A bare integer is exact bytes. `1K`, `1M`, `8G` are binary (1024-based). Labels
    that are not a binary power of two are decimal roundings of one, as Azure's
    NCCLBandwidth.py prints them (`65K` = 65536, `132K` = 131072, `524K` = 524288,
    `33M` = 33554432, `536M` = 536870912): the nearest power of two within 3 %.
    """
    match = _LABEL.match(label.strip())
    if not match:
        raise ValueError(f"not a size label: {label!r}")
    number, unit = float(match.group(1)), match.group(2).upper()
    if not unit:
        if number != int(number):
            raise ValueError(f"not a whole number of bytes: {label!r}")
        return int(number)
    binary = number * 1024 ** _UNIT_POWER[unit]
    if binary == int(binary) and int(binary) & (int(binary) - 1) == 0:
        return int(binary)
    decimal = number * 1000 ** _UNIT_POWER[unit]
    nearest = 2 ** round(math.log2(decimal))
    if abs(nearest / decimal - 1) > 0.03:
        raise ValueError(f"size label {label!r} is not (a rounding of) a power of two")
    return int(nearest)


def parse_busbw_table(text: str, collective: str, ranks: int, *, path: str = "<table>",
                      dtype: str = "float") -> NcclTestsLog:
    """Convert a Markdown table `| size label | in-place busbw (GB/s) |` to an NcclTestsLog.

    time_us = size / (busbw / factor(collective, ranks)) / 1e3, algbw = busbw / factor
    (GB = 10^9 B). busbw prints with 2 decimals, so derived times of small sizes are
    coarse (0.04 GB/s is +-12 %). Rows are in-place (Azure keeps only that column), with
    the given dtype (Azure runs float), redop "sum" for reductions, root -1.
    """
    name = normalize_collective(collective)
    factor = busbw_factor(name, ranks)
    problems = Problems(str(path))
    word = WORD_SIZES.get(dtype)
    rows: list[Row] = []
    line_numbers: list[int] = []
    seen: dict[int, int] = {}
    table_started = False
    lines = text.splitlines()
    for number, raw_line in enumerate(lines, start=1):
        line = raw_line.strip()
        if not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if all(re.fullmatch(r":?-+:?", cell) for cell in cells if cell):   # the |---|---| rule
            continue
        if not table_started:           # the column titles
            table_started = True
            try:
                float(cells[1])
            except (IndexError, ValueError):
                continue
        if len(cells) != 2:
            problems.add(number, f"expected 2 cells (size label, busbw), found {len(cells)}: {line}")
            continue
        try:
            size = size_from_label(cells[0])
            busbw = float(cells[1])
        except ValueError as exc:
            problems.add(number, str(exc) if "label" in str(exc) else f"busbw is not a number: {cells[1]!r}")
            continue
        if busbw <= 0 or size <= 0:
            problems.add(number, f"size and busbw must be > 0 to derive a time: {cells[0]} {cells[1]}")
            continue
        if size in seen:
            problems.add(number, f"size {size} B ({cells[0]}) already at line {seen[size]}")
            continue
        seen[size] = number
        algbw = busbw / factor
        per_rank = ranks if name in PER_RANK_COUNT else 1
        count = size // (word * per_rank) if word else 0
        reduction = "sum" if name in ("all_reduce", "reduce_scatter", "reduce") else "none"
        rows.append(Row(size, count, dtype, reduction, -1, size / (algbw * 1e3), algbw, busbw, True))
        line_numbers.append(number)
    problems.raise_if_any()
    if not rows:
        raise ManifestError([(f"{path}:{len(lines)}", "no table rows '| <size label> | <busbw> |' found")])
    return NcclTestsLog(str(path), name, ranks, None, tuple(rows), ranks_source="argument",
                        times_from_busbw=True, line_numbers=tuple(line_numbers))
