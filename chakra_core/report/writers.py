"""The output folder of a run: results.json, results.csv, timeline.json, breakdown.png.

A run checks its folder before simulating (`prepare_output_dir`), then writes
all its files together (`write_run_files`): each goes to a temporary file and
all are renamed at the end, so an interrupted or failed run leaves the previous
results whole. The folder keeps a record of what the last run wrote
(`.chakra-sim-outputs.json`); a rerun removes the files the previous run wrote
and this one did not (a timeline.json from an earlier run with `timeline: true`,
a breakdown.png from one with `--plots`), and never touches files chakra-sim
did not write.
"""

from __future__ import annotations

import csv
import io
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Sequence

from chakra_core._atomic import AtomicFiles, atomic_write_text
from chakra_core.engine.driver import BREAKDOWN
from chakra_core.errors import ChakraSimError
from chakra_core.report.document import RankResult, Results

CSV_COLUMNS = ("rank", "finish_ns", *BREAKDOWN, "compute_ns", "exposed_comm_ns", "comm_ns",
               "bytes_sent", "bytes_received")
RECORD_NAME = ".chakra-sim-outputs.json"
"""The file in an output folder listing what the last run wrote there."""


class OutputFolderError(ChakraSimError):
    """The output folder cannot be created or written to."""


class InterruptedAfterWriting(KeyboardInterrupt):
    """Ctrl-C came while the files were being put in place: they all were, then the run stopped."""


def results_json(results: Results) -> str:
    # strict JSON: build_results refused NaN and infinity, naming where they came from
    return json.dumps(results.to_json(), indent=2, sort_keys=False, allow_nan=False) + "\n"


def _numbers(rank: RankResult) -> dict[str, int | float]:
    """A rank's layer statistics that are numbers, as `<plugin>.<key>`."""
    return {f"{plugin}.{key}": number for plugin, stats in rank.layer_stats.items() for key, number in stats.items()
            if isinstance(number, (int, float)) and not isinstance(number, bool)}


def _core_columns(rank: RankResult) -> list[int]:
    """The rank's values of CSV_COLUMNS, in their order."""
    return [rank.rank, rank.finish_ns, *(rank.breakdown[key] for key in BREAKDOWN), rank.compute_ns,
            rank.exposed_comm_ns, rank.comm_ns, rank.bytes_sent, rank.bytes_received]


def results_csv(results: Results) -> str:
    """One row per rank: the core columns, plugin statistics, then bytes per collective type."""
    types = sorted({t for rank in results.ranks for t in rank.comm_bytes_by_type})
    numbers = [_numbers(rank) for rank in results.ranks]
    extra = sorted({k for flat in numbers for k in flat})
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(list(CSV_COLUMNS) + extra + [f"bytes_{t}" for t in types])
    for rank, flat in zip(results.ranks, numbers):
        writer.writerow(_core_columns(rank) + [flat.get(k, "") for k in extra]
                        + [rank.comm_bytes_by_type.get(t, 0) for t in types])
    return buffer.getvalue()


def result_files(results: Results, formats: list[str], intervals: Sequence[Sequence[Any]] | None = None,
                 plots: bool = False) -> dict[str, str | bytes]:
    """The results files of the requested formats: file name -> contents; with `intervals`
    (what a Simulation built with record_intervals recorded), timeline.json too; with `plots`,
    breakdown.png, and step.png for a training job (chakra_core.report.plots)."""
    files: dict[str, str | bytes] = {}
    if "json" in formats:
        files["results.json"] = results_json(results)
    if "csv" in formats:
        files["results.csv"] = results_csv(results)
    if intervals is not None:
        from chakra_core.report.timeline import build_timeline, timeline_json

        files["timeline.json"] = timeline_json(build_timeline(intervals, results))
    if plots:
        from chakra_core.report.plots import BREAKDOWN_PNG, STEP_PNG, breakdown_png, step_png

        files[BREAKDOWN_PNG] = breakdown_png(results)
        if results.training is not None:
            files[STEP_PNG] = step_png(results.training)
    return files


# The folder -------------------------------------------------------------------------------------
def prepare_output_dir(path: Path) -> None:
    """Create the output folder if missing and check that a file can be created in it.

    Called before simulating, so a long run does not end in "cannot write".
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputFolderError(f"output folder {path}: a file of that name exists; "
                                "give another folder") from None
    except OSError as exc:
        raise OutputFolderError(f"cannot create the output folder {path}: "
                                f"{exc.strerror or exc}") from None
    try:
        fd, probe = tempfile.mkstemp(prefix=".chakra-sim-probe-", dir=path)
    except OSError as exc:
        raise OutputFolderError(f"cannot write to the output folder {path}: "
                                f"{exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(probe)


def output_dir_problem(path: Path) -> str | None:
    """Why a run could not write to `path`, judged without creating anything (for validate)."""
    existing = path
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        return f"cannot create the output folder {path}: {existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        verb = "write to the output folder" if existing == path else "create the output folder"
        return f"cannot {verb} {path}: no permission to write in {existing}"
    return None


def write_run_files(out_dir: Path, files: dict[str, str | bytes]) -> tuple[list[Path], list[str]]:
    """Write `files` (name -> text, or bytes for a binary file) into `out_dir` together; then remove the files the previous
    run wrote there and this one did not. Return (paths written, warnings).

    Ctrl-C before the files are in place leaves the folder as it was (KeyboardInterrupt);
    once they are, the folder is finished first (InterruptedAfterWriting).
    """
    record = out_dir / RECORD_NAME
    previous, previous_mtime, warnings = _read_record(record)
    names = sorted(files)
    with AtomicFiles() as staged:
        for name in names:
            contents = files[name]
            if isinstance(contents, bytes):
                staged.write_bytes(out_dir / name, contents)
            else:
                staged.write_text(out_dir / name, contents)
        # Until the stale files are gone, the record lists them too: a crash in between
        # leaves them for the next run to remove.
        staged.write_text(record, _record_text(sorted(set(names) | set(previous))))
        staged.commit()
    interrupted = staged.interrupted
    kept = []
    for name in sorted(set(previous) - set(names)):
        outcome = _remove_stale(out_dir / name, previous_mtime)
        if outcome is not None:
            keep, warning = outcome
            warnings.append(warning)
            if keep:
                kept.append(name)
    try:
        atomic_write_text(record, _record_text(sorted(names + kept)))
    except OSError as exc:
        warnings.append(f"{record}: cannot update the record of written files: {exc.strerror or exc}")
    if interrupted:
        raise InterruptedAfterWriting
    return [out_dir / name for name in names], warnings


def _record_text(names: list[str]) -> str:
    return json.dumps({"written_by": "chakra-sim", "files": names}, indent=1) + "\n"


def _read_record(record: Path) -> tuple[list[str], int | None, list[str]]:
    """(file names the last run wrote, the record's mtime in ns, warnings)."""
    try:
        text = record.read_text(encoding="utf-8")
        mtime = record.stat().st_mtime_ns
    except FileNotFoundError:
        return [], None, []
    except OSError as exc:
        return [], None, [f"{record}: cannot read ({exc.strerror or exc}); files of the previous "
                          "run are left in place"]
    try:
        names = json.loads(text)["files"]
        if not isinstance(names, list):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        return [], None, [f"{record}: not a chakra-sim record of written files; files of the "
                          "previous run are left in place"]
    # Only plain file names in this folder: a damaged record must not reach elsewhere.
    return [n for n in names if isinstance(n, str) and n not in ("", ".", "..", RECORD_NAME)
            and "/" not in n and "\\" not in n], mtime, []


def _remove_stale(path: Path, written_before_ns: int | None) -> tuple[bool, str] | None:
    """Delete a file the previous run wrote; None when done (or already gone), else
    (keep it in the record?, warning)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return True, f"left {path} from the previous run: {exc.strerror or exc}"
    if not stat.S_ISREG(info.st_mode):
        return False, f"left {path}: the previous run wrote a file there, now it is not a file"
    if written_before_ns is not None and info.st_mtime_ns > written_before_ns:
        # Changed after the previous run finished: no longer chakra-sim's output.
        return False, f"left {path} from the previous run: it was modified since"
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return True, f"cannot remove {path} from the previous run: {exc.strerror or exc}"
    return None
