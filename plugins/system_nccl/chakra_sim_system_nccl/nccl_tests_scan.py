"""One pass over the lines of a raw nccl-tests log: its result rows and header, each row checked
against the printed numbers, the collective, the rank count and the launch the log states
(the rules are in chakra_sim_system_nccl.nccl_tests' docstring)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from chakra_core import ManifestError
from chakra_sim_system_nccl.launch import LaunchInfo
from chakra_sim_system_nccl.nccl_tests_log import (
    COLLECTIVES, PER_RANK_COUNT, PRINT_HALF_UNIT, SLACK, WORD_SIZES, Problems, collective_from_file_name,
    collectives_named_in, normalize_collective,
)

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
_LIBRARY = re.compile(r"\bnccl-library=(\d+)")                  # `# nccl-tests version ... nccl-library=22403`
_NCCL_VERSION = re.compile(r"^NCCL version (\d+)\.(\d+)\.(\d+)")   # NCCL's own banner, `NCCL version 2.24.3+cuda12.6`
_INT = re.compile(r"^-?\d+$")
_DEFAULT_KEYS = ("size", "count", "type", "redop", "root")


def version_of_code(code: int) -> tuple[int, int, int]:
    """NCCL_VERSION_CODE (src/nccl.h.in): major x 10000 + minor x 100 + patch since 2.9, major x 1000 +
    minor x 100 + patch before."""
    if code >= 20900:
        return code // 10000, code // 100 % 100, code % 100
    return code // 1000, code // 100 % 10, code % 100


def strip_prefix(line: str) -> str:
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




def _parse_row(tokens: list[str], keys: tuple[str, ...], placements: tuple[bool, ...],
               line: int, problems: Problems) -> _RawRow | None:
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


def check_algbw(row: _RawRow, half: _Half, problems: Problems) -> None:
    """algbw = size / time within print rounding (skipped where time prints as 0)."""
    if half.time_us <= 0 or not math.isfinite(half.algbw):
        return
    low_time, high_time = half.time_us - half.time_half_unit, half.time_us + half.time_half_unit
    low = row.size / (high_time * 1e3)
    high = row.size / (low_time * 1e3) if low_time > 0 else math.inf
    tolerance = PRINT_HALF_UNIT + SLACK
    if not low - tolerance <= half.algbw <= high + tolerance:
        placement = "in-place" if half.in_place else "out-of-place"
        problems.add(row.line, f"{placement} algbw {half.algbw:.2f} GB/s does not match size/time = "
                               f"{row.size} B / {half.time_us} µs = {row.size / (half.time_us * 1e3):.2f} GB/s")


def _check_busbw(row: _RawRow, half: _Half, factor: float, ranks: int, source: str,
                 problems: Problems) -> None:
    if not (math.isfinite(half.algbw) and math.isfinite(half.busbw)):
        return
    expected = half.algbw * factor
    if abs(half.busbw - expected) > PRINT_HALF_UNIT * (1 + factor) + SLACK:
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
            if not (half.algbw > PRINT_HALF_UNIT + SLACK and math.isfinite(half.busbw)):
                continue
            ratio_low = max(half.busbw - PRINT_HALF_UNIT - SLACK, 0.0) / (half.algbw + PRINT_HALF_UNIT + SLACK)
            ratio_high = (half.busbw + PRINT_HALF_UNIT + SLACK) / (half.algbw - PRINT_HALF_UNIT - SLACK)
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
    nccl_version: tuple[int, int, int] | None = None         # the NCCL library the run used


def _collective_in_header(program: str) -> str:
    try:
        return normalize_collective(program)
    except ValueError:   # a test this module has no busbw rule for (alltoallv, ...): keep its name
        return re.sub(r"_perf(_mpi)?$", "", program)


def scan_lines(text: str, problems: Problems) -> _Scan:
    scan = _Scan()
    keys: tuple[str, ...] = _DEFAULT_KEYS
    placements: tuple[bool, ...] = (False, True)
    lines = text.splitlines()
    scan.line_count = len(lines)
    for number, raw_line in enumerate(lines, start=1):
        line = strip_prefix(raw_line).strip()
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
                scan.command_collectives |= collectives_named_in(match.group(1))
            elif match := _LIBRARY.search(line):
                scan.nccl_version = scan.nccl_version or version_of_code(int(match.group(1)))
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
        if match := _NCCL_VERSION.match(line):
            scan.nccl_version = scan.nccl_version or (int(match[1]), int(match[2]), int(match[3]))
            continue
        tokens = line.split()
        if not _INT.match(tokens[0]) or (len(tokens) > 1 and not _INT.match(tokens[1])):
            if "_perf" in line:   # an echoed invocation, e.g. `mpirun ... ./all_reduce_perf -b 8`
                scan.command_collectives |= collectives_named_in(line)
            continue
        row = _parse_row(tokens, keys, placements, number, problems)
        if row is not None and not (row.size == 0 and row.count == 0):
            scan.rows.append(row)
    return scan


def choose_collective(scan: _Scan, explicit: str | None, path: str) -> str:
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
    from_name = collective_from_file_name(path)
    if from_name is None:
        named = sorted(scan.command_collectives)
        hint = f" (the command lines name {', '.join(named)})" if named else ""
        raise ManifestError([(f"{path}:{first_line}", "cannot tell which collective this log measures: no "
                              "'# Collective test starting:' line, no single *_perf program in a command "
                              f"line{hint}, nothing in the file name; pass collective=")])
    return from_name


def _ranks_from_counts(collective: str, rows: list[_RawRow], problems: Problems) -> int | None:
    """size = count x word size x ranks for collectives that print the per-rank count."""
    if collective not in PER_RANK_COUNT:
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


def choose_ranks(scan: _Scan, collective: str, explicit: int | None, problems: Problems
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


def launch_info(scan: _Scan, problems: Problems) -> LaunchInfo | None:
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
            # (not a multiple of nThread x nGpus: choose_ranks says so)
            problems.add(line, f"the device lines list {listed} ranks in {processes} process"
                               f"{'es' if processes != 1 else ''} (distinct Pid and host), but nThread "
                               f"{threads} x nGpus {gpus} x {processes} = {threads * gpus * processes}: "
                               "the header contradicts itself")
    blocking = True if scan.blocking_line else (False if scan.devices_listed else None)
    return LaunchInfo(threads, gpus, processes, hosts, graph, blocking, scan.cpu_time, line)


def check_rows_against_ranks(rows: list[_RawRow], collective: str, ranks: int, source: str,
                              ratio_range: tuple[float, float] | None, problems: Problems) -> None:
    factor_of = COLLECTIVES.get(collective)
    if factor_of is not None:
        busbw_problems = Problems(problems.path)
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
    per_rank = ranks if collective in PER_RANK_COUNT else 1
    for row in rows:
        word = WORD_SIZES.get(row.dtype)
        if word and row.size != row.count * word * per_rank:
            problems.add(row.line, f"size {row.size} B != count {row.count} x {word} B"
                                   + (f" x {per_rank} ranks" if per_rank > 1 else ""))
