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

Azure's AI-benchmarking-guide publishes Markdown tables of in-place busbw only;
`parse_busbw_table` converts them back to times with the same definitions.

Problems raise `chakra_core.errors.ManifestError` with `path:line` locations.
"""

from __future__ import annotations

import gzip
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from chakra_core import ManifestError
from chakra_sim_system_nccl.launch import LaunchInfo

__all__ = [
    "Row", "NcclTestsLog", "LaunchInfo", "parse", "load", "parse_busbw_table",
    "busbw_factor", "size_from_label", "normalize_collective", "COLLECTIVES",
]

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
_PER_RANK_COUNT = frozenset({"all_gather", "reduce_scatter", "alltoall"})

WORD_SIZES: dict[str, int] = {
    "int8": 1, "uint8": 1, "char": 1, "f8e4m3": 1, "f8e5m2": 1,
    "half": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "uint32": 4, "int": 4, "float": 4, "float32": 4,
    "int64": 8, "uint64": 8, "double": 8, "float64": 8,
}

_PRINT_HALF_UNIT = 0.005           # algbw and busbw print as %6.2f
_SLACK = 1e-6                      # float32 -> printf rounding
_MAX_PROBLEMS = 20                 # a garbage file should not print thousands of lines


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

_ALIASES = {
    "allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
    "alltoall": "alltoall", "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "sendrecv",
    "gather": "gather", "scatter": "scatter", "hypercube": "hypercube",
}


def normalize_collective(name: str) -> str:
    """`all_reduce_perf`, `AllReduce`, `all-reduce` -> `all_reduce`; ValueError if unknown."""
    key = re.sub(r"[_\-\s]", "", name.strip().lower())
    key = re.sub(r"perf(mpi)?$", "", key)
    if key not in _ALIASES:
        raise ValueError(f"unknown collective {name!r}; known: {', '.join(COLLECTIVES)}")
    return _ALIASES[key]


def busbw_factor(collective: str, ranks: int) -> float:
    """busbw / algbw for `collective` on `ranks` ranks (nccl-tests doc/PERFORMANCE.md)."""
    factor = COLLECTIVES[normalize_collective(collective)]
    if factor is None:
        raise ValueError(f"nccl-tests defines no busbw factor for {collective!r} that this module knows")
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, not {ranks}")
    return factor(ranks)


_PROGRAM = re.compile(r"(?<![A-Za-z0-9_])([a-z0-9_]+)_perf(?:_mpi)?(?![A-Za-z0-9_])")


def _collectives_named_in(text: str) -> set[str]:
    found = set()
    for match in _PROGRAM.finditer(text):
        try:
            found.add(normalize_collective(match.group(1)))
        except ValueError:
            pass
    return found


def _collective_from_file_name(path: str) -> str | None:
    name = Path(path).name.lower()
    squashed = re.sub(r"[_\-]", "", name)
    found = {_ALIASES[key] for key in ("allreduce", "allgather", "reducescatter", "alltoall",
                                       "broadcast", "sendrecv") if key in squashed}
    if not found and "reduce" in re.split(r"[^a-z0-9]+", name):
        found.add("reduce")
    return found.pop() if len(found) == 1 else None


# --------------------------------------------------------------------------- raw logs

_LAUNCHER_PREFIX = re.compile(r"^\s*(?:\d+:\s?|\[\d+,\d+\]<std(?:out|err)>:)")
_TEST_START = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_THREADS_GPUS = re.compile(r"^#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)")
_DEVICE = re.compile(r"^#\s*Rank\s+(\d+)\b.*?\bdevice\s+\d+\s+\[[^\]]*\]\s+(.+?)\s*$")
_PROCESS = re.compile(r"\bPid\s+(\d+)\s+on\s+(\S+)\s+device\b")
_GRAPH = re.compile(r"\bgraph:\s*(\d+)")
_BLOCKING = re.compile(r"^#\s*Blocking Enabled\b", re.IGNORECASE)
_USING_DEVICES = re.compile(r"^#\s*Using devices\b", re.IGNORECASE)
_COMMAND = re.compile(r"^#\s*command:(.*)$", re.IGNORECASE)
_INT = re.compile(r"^-?\d+$")
_DEFAULT_KEYS = ("size", "count", "type", "redop", "root")


def _strip_prefix(line: str) -> str:
    for _ in range(2):   # a launcher may wrap another one's output
        match = _LAUNCHER_PREFIX.match(line)
        if not match:
            break
        line = line[match.end():]
    return line


def _decimals(token: str) -> int:
    return len(token.split(".", 1)[1]) if "." in token else 0


@dataclass
class _Half:
    time_us: float
    algbw: float
    busbw: float
    time_half_unit: float   # half of the last printed digit of the time
    in_place: bool


@dataclass
class _RawRow:
    line: int
    size: int
    count: int
    dtype: str
    redop: str
    root: int
    halves: list[_Half]


class _Problems:
    def __init__(self, path: str) -> None:
        self.path = path
        self.items: list[tuple[str, str]] = []

    def add(self, line: int, reason: str) -> None:
        self.items.append((f"{self.path}:{line}", reason))

    def raise_if_any(self) -> None:
        if self.items:
            shown = self.items[:_MAX_PROBLEMS]
            if len(self.items) > _MAX_PROBLEMS:
                shown.append((self.path, f"... and {len(self.items) - _MAX_PROBLEMS} more problems"))
            raise ManifestError(shown)


def _parse_row(tokens: list[str], keys: tuple[str, ...], placements: tuple[bool, ...],
               line: int, problems: _Problems) -> _RawRow | None:
    results = tokens[len(keys):]
    if len(tokens) < len(keys) or len(results) not in (4, 8) or len(results) // 4 > len(placements):
        expected = " or ".join(str(len(keys) + 4 * k) for k in (1, 2)[:len(placements)])
        problems.add(line, f"result row has {len(tokens)} columns, expected {expected} "
                           f"({' '.join(keys)} then time algbw busbw #wrong per placement): "
                           "truncated or not nccl-tests output?")
        return None
    fields = dict(zip(keys, tokens))
    try:
        size, count = int(fields["size"]), int(fields["count"])
        root = int(fields.get("root", "-1"))
    except (KeyError, ValueError):
        problems.add(line, f"size, count and root must be integers: {' '.join(tokens[:len(keys)])}")
        return None
    if size < 0 or count < 0:
        problems.add(line, "negative size or count")
        return None
    row = _RawRow(line, size, count, fields.get("type", "?"), fields.get("redop", "none"), root, [])
    for index, in_place in enumerate(placements[:len(results) // 4]):
        time_text, algbw_text, busbw_text, wrong_text = results[4 * index:4 * index + 4]
        placement = "in-place" if in_place else "out-of-place"
        if "N/A" in (time_text, algbw_text, busbw_text):
            continue
        try:
            time_us, algbw, busbw = float(time_text), float(algbw_text), float(busbw_text)
        except ValueError:
            problems.add(line, f"{placement} time/algbw/busbw are not numbers: "
                               f"{time_text} {algbw_text} {busbw_text}")
            return None
        if time_us < 0 or algbw < 0 or busbw < 0 or math.isnan(time_us):
            problems.add(line, f"{placement} time/algbw/busbw must be >= 0: {time_text} {algbw_text} {busbw_text}")
            return None
        if wrong_text != "N/A":
            try:
                wrong = float(wrong_text)   # old nccl-tests printed a max error (e.g. 0e+00)
            except ValueError:
                problems.add(line, f"{placement} #wrong is not a number: {wrong_text}")
                return None
            if _INT.match(wrong_text) and wrong > 0:
                problems.add(line, f"{placement} #wrong = {wrong_text}: the collective returned "
                                   "wrong data, so this run's timings are not trustworthy")
                return None
        row.halves.append(_Half(time_us, algbw, busbw, 0.5 * 10 ** -_decimals(time_text), in_place))
    if not row.halves:
        problems.add(line, "neither placement has a time (all N/A)")
        return None
    return row


def _check_algbw(row: _RawRow, half: _Half, problems: _Problems) -> None:
    """algbw = size / time within print rounding (skipped where time prints as 0)."""
    if half.time_us <= 0 or not math.isfinite(half.algbw):
        return
    low_time, high_time = half.time_us - half.time_half_unit, half.time_us + half.time_half_unit
    low = row.size / (high_time * 1e3)
    high = row.size / (low_time * 1e3) if low_time > 0 else math.inf
    tolerance = _PRINT_HALF_UNIT + _SLACK
    if not low - tolerance <= half.algbw <= high + tolerance:
        placement = "in-place" if half.in_place else "out-of-place"
        problems.add(row.line, f"{placement} algbw {half.algbw:.2f} GB/s does not match size/time = "
                               f"{row.size} B / {half.time_us} µs = {row.size / (half.time_us * 1e3):.2f} GB/s")


def _check_busbw(row: _RawRow, half: _Half, factor: float, ranks: int, source: str,
                 problems: _Problems) -> None:
    if not (math.isfinite(half.algbw) and math.isfinite(half.busbw)):
        return
    expected = half.algbw * factor
    if abs(half.busbw - expected) > _PRINT_HALF_UNIT * (1 + factor) + _SLACK:
        placement = "in-place" if half.in_place else "out-of-place"
        problems.add(row.line, f"{placement} busbw {half.busbw:.2f} GB/s != algbw {half.algbw:.2f} x "
                               f"{factor:.4f} = {expected:.2f} for {ranks} ranks (from {source}); "
                               "wrong rank count or collective?")


def _ranks_interval_from_ratios(collective: str, rows: list[_RawRow]) -> tuple[float, float, int]:
    """The range of rank counts every row's busbw/algbw allows (and the line where it emptied)."""
    # factor(n) = c - c/n (c = 2 for all_reduce, 1 for the others) -> n = c / (c - ratio)
    scale = 2.0 if collective == "all_reduce" else 1.0

    def ranks_for(ratio: float) -> float:
        return math.inf if ratio >= scale else scale / (scale - ratio)

    low, high, line = 1.0, math.inf, 0
    for row in rows:
        for half in row.halves:
            if not (half.algbw > _PRINT_HALF_UNIT + _SLACK and math.isfinite(half.busbw)):
                continue
            ratio_low = max(half.busbw - _PRINT_HALF_UNIT - _SLACK, 0.0) / (half.algbw + _PRINT_HALF_UNIT + _SLACK)
            ratio_high = (half.busbw + _PRINT_HALF_UNIT + _SLACK) / (half.algbw - _PRINT_HALF_UNIT - _SLACK)
            low, high = max(low, ranks_for(ratio_low)), min(high, ranks_for(ratio_high))
            if low > high and not line:
                line = row.line
    return low, high, line


@dataclass
class _Scan:
    """What one pass over the lines of a log found."""

    rows: list[_RawRow] = field(default_factory=list)
    header_collective: tuple[str, int] | None = None        # (collective, line)
    command_collectives: set[str] = field(default_factory=set)
    devices: dict[int, str] = field(default_factory=dict)   # rank -> device name
    gpus_per_process: int | None = None
    line_count: int = 0
    threads_gpus: tuple[int, int, int, int] | None = None     # (nThread, nGpus, graph, line) of `# nThread`
    blocking_line: int = 0                                   # `# Blocking Enabled` (-z)
    devices_listed: bool = False                             # `# Using devices` or a device line seen
    processes: dict[int, tuple[str, int]] = field(default_factory=dict)   # rank -> (host, Pid)
    columns_line: int | None = None
    cpu_time: bool = False                                   # `cputime` column title (-C)


def _collective_in_header(program: str) -> str:
    try:
        return normalize_collective(program)
    except ValueError:   # a test this module has no busbw rule for (alltoallv, ...): keep its name
        return re.sub(r"_perf(_mpi)?$", "", program)


def _scan(text: str, problems: _Problems) -> _Scan:
    scan = _Scan()
    keys: tuple[str, ...] = _DEFAULT_KEYS
    placements: tuple[bool, ...] = (False, True)
    lines = text.splitlines()
    scan.line_count = len(lines)
    for number, raw_line in enumerate(lines, start=1):
        line = _strip_prefix(raw_line).strip()
        if not line:
            continue
        if line.startswith("#"):
            if match := _TEST_START.match(line):
                name = _collective_in_header(match.group(1))
                if scan.header_collective:
                    first, first_line = scan.header_collective
                    problems.add(number, f"a second nccl-tests run ({name}) starts here; the first "
                                         f"({first}) started at line {first_line}: one run per file, please")
                    break
                scan.header_collective = (name, number)
            elif match := _THREADS_GPUS.match(line):
                threads, gpus = int(match.group(1)), int(match.group(2))
                graph = _GRAPH.search(line)
                header = (threads, gpus, int(graph.group(1)) if graph else 0, number)
                if scan.threads_gpus is None:
                    scan.threads_gpus = header
                    scan.gpus_per_process = threads * gpus
                elif scan.threads_gpus[:3] != header[:3]:
                    problems.add(number, f"a second '# nThread' header line (nThread {threads} nGpus {gpus}"
                                         f" graph {header[2]}) that differs from line {scan.threads_gpus[3]} "
                                         f"(nThread {scan.threads_gpus[0]} nGpus {scan.threads_gpus[1]} graph "
                                         f"{scan.threads_gpus[2]}): several runs in one file? one run per file, please")
            elif _BLOCKING.match(line):
                scan.blocking_line = scan.blocking_line or number
            elif _USING_DEVICES.match(line):
                scan.devices_listed = True
            elif match := _DEVICE.match(line):
                scan.devices[int(match.group(1))] = match.group(2)
                scan.devices_listed = True
                if process := _PROCESS.search(line):
                    scan.processes[int(match.group(1))] = (process.group(2), int(process.group(1)))
            elif match := _COMMAND.match(line):
                scan.command_collectives |= _collectives_named_in(match.group(1))
            else:
                words = line.lstrip("#").split()
                if words[:2] == ["size", "count"]:          # the column-name header
                    if scan.rows:
                        problems.add(number, "a second column header after result rows: several "
                                             "runs in one file? one run per file, please")
                        break
                    time_at = next((i for i, word in enumerate(words) if "time" in word), len(words))
                    keys = tuple(words[:time_at])
                    scan.columns_line = scan.columns_line or number
                    scan.cpu_time = time_at < len(words) and words[time_at] == "cputime"
                elif words and all(word in ("out-of-place", "in-place") for word in words):
                    placements = tuple(word == "in-place" for word in words)
            continue
        tokens = line.split()
        if not _INT.match(tokens[0]) or (len(tokens) > 1 and not _INT.match(tokens[1])):
            if "_perf" in line:   # an echoed invocation, e.g. `mpirun ... ./all_reduce_perf -b 8`
                scan.command_collectives |= _collectives_named_in(line)
            continue
        row = _parse_row(tokens, keys, placements, number, problems)
        if row is not None and not (row.size == 0 and row.count == 0):
            scan.rows.append(row)
    return scan


def _choose_collective(scan: _Scan, explicit: str | None, path: str) -> str:
    first_line = scan.rows[0].line
    if scan.header_collective:
        name, line = scan.header_collective
        if explicit and explicit != name:
            raise ManifestError([(f"{path}:{line}", f"the log's header says {name}, but collective="
                                  f"{explicit!r} was given")])
        return name
    if explicit:
        return explicit
    if len(scan.command_collectives) == 1:
        return next(iter(scan.command_collectives))
    from_name = _collective_from_file_name(path)
    if from_name is None:
        named = sorted(scan.command_collectives)
        hint = f" (the command lines name {', '.join(named)})" if named else ""
        raise ManifestError([(f"{path}:{first_line}", "cannot tell which collective this log measures: no "
                              "'# Collective test starting:' line, no single *_perf program in a command "
                              f"line{hint}, nothing in the file name; pass collective=")])
    return from_name


def _ranks_from_counts(collective: str, rows: list[_RawRow], problems: _Problems) -> int | None:
    """size = count x word size x ranks for collectives that print the per-rank count."""
    if collective not in _PER_RANK_COUNT:
        return None
    found: int | None = None
    for row in rows:
        word = WORD_SIZES.get(row.dtype)
        if not word or not row.count:
            continue
        ratio = row.size / (row.count * word)
        if ratio != int(ratio) or (found is not None and ratio != found):
            problems.add(row.line, f"size {row.size} B is not count {row.count} x {word} B x the same "
                                   f"rank count as earlier rows ({found})")
            return None
        found = int(ratio)
    return found


def _choose_ranks(scan: _Scan, collective: str, explicit: int | None, problems: _Problems
                  ) -> tuple[int | None, str, tuple[float, float] | None]:
    """(ranks, where they came from, the range busbw/algbw allows or None)."""
    rows, first_line = scan.rows, scan.rows[0].line
    from_counts = _ranks_from_counts(collective, rows, problems)
    ratio_range = None
    if COLLECTIVES.get(collective) is not None and collective not in ("broadcast", "reduce", "sendrecv"):
        low, high, emptied_at = _ranks_interval_from_ratios(collective, rows)
        if emptied_at:
            problems.add(emptied_at, "busbw/algbw here contradicts earlier rows: no single rank count fits")
        ratio_range = (low, high)
    devices = scan.devices
    if devices and sorted(devices) != list(range(len(devices))):
        problems.add(first_line, f"the header's device list names ranks {sorted(devices)}, not 0..n-1")

    if explicit is not None:
        if explicit < 1:
            raise ValueError(f"ranks must be >= 1, not {explicit}")
        if devices and len(devices) != explicit:
            problems.add(first_line, f"ranks={explicit} given, but the header lists {len(devices)} devices")
        ranks, source = explicit, "argument"
    elif devices:
        ranks, source = len(devices), "device list"
    elif from_counts is not None:
        ranks, source = from_counts, "size/count"
    elif ratio_range and math.floor(ratio_range[1] + 1e-9) == math.ceil(ratio_range[0] - 1e-9):
        ranks, source = math.ceil(ratio_range[0] - 1e-9), "busbw/algbw"
    else:
        return None, "", ratio_range

    if from_counts is not None and from_counts != ranks:
        problems.add(first_line, f"size/count imply {from_counts} ranks, the {source} says {ranks}")
    if scan.gpus_per_process and ranks % scan.gpus_per_process:
        problems.add(first_line, f"{ranks} ranks (from {source}) is not a multiple of the "
                                 f"{scan.gpus_per_process} GPUs per process the header states")
    return ranks, source, ratio_range


def _launch(scan: _Scan, problems: _Problems) -> LaunchInfo | None:
    """What the header says about how the run was launched; contradictions go to `problems`."""
    if scan.threads_gpus is None:
        return None
    threads, gpus, graph, line = scan.threads_gpus
    processes: int | None = None
    hosts: tuple[str, ...] | None = None
    if scan.processes:
        hosts = tuple(dict.fromkeys(host for host, _ in scan.processes.values()))
        processes = len(set(scan.processes.values()))
        listed = len(scan.devices)
        if len(scan.processes) != listed:
            problems.add(line, f"{listed - len(scan.processes)} of the {listed} device lines name no "
                               "'Pid ... on HOST': the device list is garbled")
        elif listed % (threads * gpus) == 0 and listed != threads * gpus * processes:
            # (not a multiple of nThread x nGpus: _choose_ranks says so)
            problems.add(line, f"the device lines list {listed} ranks in {processes} process"
                               f"{'es' if processes != 1 else ''} (distinct Pid and host), but nThread "
                               f"{threads} x nGpus {gpus} x {processes} = {threads * gpus * processes}: "
                               "the header contradicts itself")
    blocking = True if scan.blocking_line else (False if scan.devices_listed else None)
    return LaunchInfo(threads, gpus, processes, hosts, graph, blocking, scan.cpu_time, line)


def _check_rows_against_ranks(rows: list[_RawRow], collective: str, ranks: int, source: str,
                              ratio_range: tuple[float, float] | None, problems: _Problems) -> None:
    factor_of = COLLECTIVES.get(collective)
    if factor_of is not None:
        busbw_problems = _Problems(problems.path)
        factor = factor_of(ranks)
        for row in rows:
            for half in row.halves:
                _check_busbw(row, half, factor, ranks, source, busbw_problems)
        if len(busbw_problems.items) > 3:   # systematic: one line, not one per row
            fits = ""
            if ratio_range and ratio_range[0] <= ratio_range[1]:
                low = math.ceil(ratio_range[0] - 1e-9)
                high = math.floor(ratio_range[1] + 1e-9) if math.isfinite(ratio_range[1]) else "any"
                fits = f"; the ratios fit {low if low == high else f'{low}..{high}'} ranks"
            problems.items.append((busbw_problems.items[0][0],
                                   f"busbw != algbw x {factor:.4f} in {len(busbw_problems.items)} rows, as "
                                   f"{ranks} ranks (from {source}) would require{fits}"))
        else:
            problems.items.extend(busbw_problems.items)
    per_rank = ranks if collective in _PER_RANK_COUNT else 1
    for row in rows:
        word = WORD_SIZES.get(row.dtype)
        if word and row.size != row.count * word * per_rank:
            problems.add(row.line, f"size {row.size} B != count {row.count} x {word} B"
                                   + (f" x {per_rank} ranks" if per_rank > 1 else ""))


def parse(text: str, path: str = "<text>", *, collective: str | None = None,
          ranks: int | None = None) -> NcclTestsLog:
    """Parse the output of one nccl-tests run (see the module docstring for the rules)."""
    path = str(path)
    problems = _Problems(path)
    explicit_collective = normalize_collective(collective) if collective else None
    scan = _scan(text, problems)
    problems.raise_if_any()
    if not scan.rows:
        raise ManifestError([(f"{path}:{scan.line_count}", "no nccl-tests result rows found (lines like "
                              "'   1048576   262144   float   sum   -1   27.37   38.31   67.04   0 ...')")])
    chosen_collective = _choose_collective(scan, explicit_collective, path)

    # Each (size, dtype, op, root, placement) is timed once per run; algbw must be size/time.
    seen: dict[tuple, int] = {}
    for row in scan.rows:
        for half in row.halves:
            key = (row.size, row.dtype, row.redop, row.root, half.in_place)
            if key in seen:
                problems.add(row.line, f"size {row.size} ({row.dtype} {row.redop}) already printed at "
                                       f"line {seen[key]}: several runs in one file?")
            seen.setdefault(key, row.line)
            _check_algbw(row, half, problems)
    problems.raise_if_any()

    launch = _launch(scan, problems)
    chosen_ranks, source, ratio_range = _choose_ranks(scan, chosen_collective, ranks, problems)
    problems.raise_if_any()
    if chosen_ranks is not None:
        _check_rows_against_ranks(scan.rows, chosen_collective, chosen_ranks, source, ratio_range, problems)
    problems.raise_if_any()

    flat = tuple(Row(row.size, row.count, row.dtype, row.redop, row.root,
                     half.time_us, half.algbw, half.busbw, half.in_place)
                 for row in scan.rows for half in row.halves)
    line_numbers = tuple(row.line for row in scan.rows for _ in row.halves)
    gpu = ", ".join(sorted(set(scan.devices.values()))) if scan.devices else None
    return NcclTestsLog(path, chosen_collective, chosen_ranks, gpu, flat,
                        ranks_source=source, line_numbers=line_numbers, launch=launch,
                        columns_line=scan.columns_line)


def load(path: str | Path, *, collective: str | None = None, ranks: int | None = None) -> NcclTestsLog:
    """Read and parse an nccl-tests log (`.gz` too). A Markdown busbw table (first data line
    starting with `|`) goes to `parse_busbw_table`, which needs `ranks`."""
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8", errors="replace") as stream:
                text = stream.read()
        else:
            text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise ManifestError([(str(path), "file not found")]) from None
    except (OSError, EOFError) as exc:
        raise ManifestError([(str(path), f"cannot read: {getattr(exc, 'strerror', None) or exc}")]) from None
    first_data = next((_strip_prefix(line).strip() for line in text.splitlines()
                       if _strip_prefix(line).strip() and not _strip_prefix(line).strip().startswith("#")), "")
    if first_data.startswith("|"):
        name = normalize_collective(collective) if collective else _collective_from_file_name(str(path))
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
    return nearest


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
    problems = _Problems(str(path))
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
        per_rank = ranks if name in _PER_RANK_COUNT else 1
        count = size // (word * per_rank) if word else 0
        reduction = "sum" if name in ("all_reduce", "reduce_scatter", "reduce") else "none"
        rows.append(Row(size, count, dtype, reduction, -1, size / (algbw * 1e3), algbw, busbw, True))
        line_numbers.append(number)
    problems.raise_if_any()
    if not rows:
        raise ManifestError([(f"{path}:{len(lines)}", "no table rows '| <size label> | <busbw> |' found")])
    return NcclTestsLog(str(path), name, ranks, None, tuple(rows), ranks_source="argument",
                        times_from_busbw=True, line_numbers=tuple(line_numbers))

