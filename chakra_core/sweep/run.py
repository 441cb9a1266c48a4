"""Running a sweep: each point in a worker process, its files written by this one.

A worker (`run_point`) validates the point's manifest, simulates it and
returns the files `chakra-sim run` would write (results.json, plus
results.csv and timeline.json as the manifest asks), or the error. Only the
process running the sweep writes, so a Ray cluster needs no shared folder for
the results (the traces must still be readable at the same paths on every
node). Each point's folder gets its files and `point.json` (its overrides,
fingerprint, status, error, wall time) together, through the same writer as
`chakra-sim run`: a point whose folder holds an `ok` point.json with the
point's fingerprint is finished, and a later run of the sweep reads its row
back instead of simulating it again.

Rows are built from the results.json text, never from the in-memory results,
so a fresh row and a row read back are the same, and sorted by point order,
so the table does not depend on which worker finished first.

Before any point runs, every point's manifest is validated (`checks`) and the
output folder is locked (`lock`); while points run, SIGINT and SIGTERM
become an exception at a safe point (`stop`) that stops the workers (`pool`) and
their temporary files with them. docs/reliability.md lists the guarantees.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
import traceback
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from chakra_core._version import __version__
from chakra_core.cores import usable_cores
from chakra_core.json_types import JsonObject
from chakra_core.engine.driver import BREAKDOWN
from chakra_core.errors import ChakraSimError, ManifestError
from chakra_core.report.writers import prepare_output_dir, write_run_files
from chakra_core.sweep.checks import check_points, remove_stale_temp_files
from chakra_core.sweep.errors import SweepError
from chakra_core.sweep.errors import first_line as _first_line
from chakra_core.output_lock import OutputLock
from chakra_core.sweep.paths import KeyPathError, Metric
from chakra_core.sweep.pool import Refill, describe_exception, run_pool
from chakra_core.sweep.ray_executor import run_ray
from chakra_core.sweep.spec import Point, Sweep
from chakra_core.sweep.stop import StopSignals
from chakra_core.sweep.task import PointOutcome, PointTask, Status

__all__ = ["SweepError", "run_local", "run_point", "run_ray", "run_sweep"]   # SweepError, run_ray: see their modules

if TYPE_CHECKING:
    from chakra_core.plugins import PluginHost

EXECUTORS = ("local", "ray")
POINT_RECORD = "point.json"

# The columns after the swept keys; the metric comes first unless it is one of them.
STATUS_COLUMNS = ("status", "error")
STAT_COLUMNS = ("finish_ns",
                *(f"{agg}({key})" for key in (*BREAKDOWN, "exposed_comm_ns") for agg in ("mean", "max")),
                "sum(bytes_sent)")
WALL_COLUMN = "wall_s"
"""The only column that differs between runs of the same sweep."""
_STATS = {column: Metric.parse(column) for column in STAT_COLUMNS}
COLUMN_KINDS = {"point": "int", "id": "str", "status": "str", "error": "str", WALL_COLUMN: "float",
                **{column: "float" if column.startswith("mean(") else "int" for column in STAT_COLUMNS}}
"""Types of the columns every sweep has (the swept keys' and the metric's follow their values)."""



# The worker --------------------------------------------------------------------------------------
_HOST: PluginHost | None = None


def _plugin_host() -> PluginHost:
    """One plugin host per worker process: discovering plugins once, not once per point."""
    global _HOST
    if _HOST is None:
        from chakra_core.plugins import make_plugin_host

        _HOST = make_plugin_host()
    return _HOST


def run_point(task: PointTask) -> PointOutcome:
    """Validate and simulate one point; return its files or its error (never raises)."""
    from chakra_core.run import load, simulate

    started = time.perf_counter()
    try:
        host = _plugin_host()
        config = load(task.data, host, base_dir=task.base_dir, name=task.source, out_dir=task.out_dir)
        result = simulate(config, host)
        # results.json always: it is what the sweep reads back on resume.
        files = result.files(sorted(set(config.formats) | {"json"}))
        if task.drop_job_traces and config.spec.training is not None:
            # a job writes its traces to <its output folder>/traces (jobs/expand.py), and regenerates them
            # when it runs again: gigabytes for a large model's layout
            shutil.rmtree(Path(task.out_dir) / "traces", ignore_errors=True)
        return PointOutcome(task.index, task.id, Status.OK, files=files, wall_s=time.perf_counter() - started)
    except ManifestError as exc:
        # The row already names the point: keep the key path and the reason.
        prefix = f"{task.source}: "
        error = "; ".join(f"{loc.removeprefix(prefix)}: {why}" for loc, why in exc.problems)
        detail = str(exc)
    except ChakraSimError as exc:
        error, detail = _first_line(str(exc)) or type(exc).__name__, str(exc)
    except BaseException as exc:   # a plugin's bug, even sys.exit() or a stray KeyboardInterrupt, fails its point alone
        error, detail = describe_exception(exc), traceback.format_exc()
    return PointOutcome.failed(task, error, detail, time.perf_counter() - started)


# Executors ---------------------------------------------------------------------------------------
def run_local(tasks: list[PointTask], workers: int, on_outcome: Callable[[PointOutcome], None],
              function: Callable[[PointTask], PointOutcome] = run_point, timeout: float | None = None,
              refill: Refill | None = None) -> None:
    """Run `function` (`run_point`) on each task in a pool of `workers` fresh processes;
    call `on_outcome` as each ends, `refill` for more (chakra_core.sweep.pool: timeouts, dead
    workers, signals)."""
    run_pool(tasks, workers, on_outcome, function, timeout, warm=_plugin_host if function is run_point else None,
             refill=refill)


# The sweep ---------------------------------------------------------------------------------------
@dataclass
class PointReport:
    """What the progress display hears after each point."""

    point: Point
    status: Status
    skipped: bool
    error: str | None
    wall_s: float | None


@dataclass(frozen=True)
class Execution:
    """How a sweep's points run: `executor` "local" (processes) or "ray", `workers`, the Ray
    cluster's `address`, `force` (rerun finished points), a point's `timeout` in seconds (default
    the sweep file's), `on_point`, told after each point, and `job_traces` ("drop": a job point's
    generated traces are removed once simulated, as plan does by default; "keep")."""

    executor: str = "local"
    workers: int | None = None
    address: str | None = None
    force: bool = False
    timeout: float | None = None
    on_point: Callable[[PointReport], None] | None = None
    job_traces: str = "drop"


@dataclass
class SweepResult:
    columns: list[str]
    rows: list[JsonObject]
    """One per point, in point order."""
    ran: int = 0
    skipped: int = 0
    failed: int = 0
    warnings: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    """The table and plot files written."""


def table_columns(sweep: Sweep) -> list[str]:
    metric = [] if sweep.metric.text in STAT_COLUMNS else [sweep.metric.text]
    return ["point", "id", *sweep.keys, *STATUS_COLUMNS, *metric, *STAT_COLUMNS, WALL_COLUMN]


class Wait(Enum):
    """None of a growing sweep's next points can be chosen until a running point ends."""
    WAIT = "wait"


WAIT = Wait.WAIT
Grow = Callable[[], Sweep | Wait | None]
"""A sweep's next points: the sweep with more points after its own (same order and output folder),
WAIT, or None (no more)."""


def run_sweep(sweep: Sweep, executor: str = "local", workers: int | None = None, address: str | None = None,
              force: bool = False, on_point: Callable[[PointReport], None] | None = None,
              timeout: float | None = None, grow: Grow | None = None) -> SweepResult:
    """Run every point not already finished (all with `force`); write the table and the plot.

    Every point's manifest is validated first: ManifestError lists the bad points, and
    nothing runs. Raises SweepError (or OutputFolderError, OutputLockedError) when the sweep
    cannot run; a point's failure (its exception, its worker's death, its `timeout` in
    seconds, default the sweep file's) is a row with status `failed`, never an exception.
    SIGINT and SIGTERM raise `Interrupted` once the workers are stopped and their temporary
    files removed; finished points are kept.

    `grow` (plan's rounds) adds points while the sweep runs, whenever none waits for a worker:
    the same workers run them, under the same lock; each is validated when it comes (a bad one
    stops the sweep with ManifestError) and read back if an earlier run finished it (`force`:
    run again, as every point). The result is the last sweep's: its keys, every point's row.
    """
    if executor not in EXECUTORS:
        raise SweepError(f"unknown executor {executor!r} (choose {', '.join(EXECUTORS)})")
    if address and executor != "ray":
        raise SweepError("--address names a Ray cluster: use it with --executor ray")
    timeout = timeout if timeout is not None else sweep.timeout
    if timeout is not None and not 0 < timeout < math.inf:
        raise SweepError(f"the timeout must be a positive number of seconds, not {timeout}")
    with StopSignals():
        check_points(sweep, _plugin_host())
        prepare_output_dir(sweep.output_dir)
        with OutputLock(sweep.output_dir):
            remove_stale_temp_files(sweep)
            return _run_locked(sweep, executor, workers, address, force, on_point, timeout, grow)


@dataclass
class _Ended:
    """How a point ended: its row but the swept keys' columns (a growing sweep's keys may grow)."""
    point: Point
    status: Status
    error: str | None
    values: dict[str, int | float | None]   # the metric's and the statistics' columns
    wall_s: float | None
    metric_miss: str | None = None           # why its results have no metric


def _run_locked(sweep: Sweep, executor: str, workers: int | None, address: str | None, force: bool,
                on_point: Callable[[PointReport], None] | None, timeout: float | None,
                grow: Grow | None) -> SweepResult:
    result = SweepResult(columns=[], rows=[])
    ended: dict[int, _Ended] = {}
    by_index: dict[int, Point] = {}

    def report(end: _Ended, skipped: bool) -> None:
        ended[end.point.index] = end
        result.failed += end.status is not Status.OK
        if on_point is not None:
            on_point(PointReport(end.point, end.status, skipped, end.error, end.wall_s))

    def tasks_of(points: list[Point], rerun: bool) -> list[PointTask]:
        """The points to run; those an earlier run finished are read back and reported."""
        tasks = []
        for point in points:
            by_index[point.index] = point
            done = None if rerun else _finished(sweep, point)
            if done is not None:
                result.skipped += 1
                report(done, skipped=True)
            else:
                tasks.append(PointTask(point.index, point.id, point.data, str(sweep.base_dir), f"point {point.index}",
                                       str(sweep.point_dir(point)), sweep.drop_job_traces))
        return tasks

    def finished(outcome: PointOutcome) -> None:
        result.ran += 1
        report(_record(sweep, by_index[outcome.index], outcome, result.warnings), skipped=False)

    def refill() -> list[PointTask] | None:
        nonlocal sweep
        while grow is not None:
            grown = grow()
            if grown is None or grown is WAIT:
                return None if grown is None else []
            assert isinstance(grown, Sweep) and grown.output_dir == sweep.output_dir
            new = [point for point in grown.points if point.index not in by_index]
            check_points(dataclasses.replace(grown, points=new), _plugin_host())
            sweep = grown
            tasks = tasks_of(new, force)
            if tasks:
                return tasks
        return None

    tasks = tasks_of(sweep.points, force)
    if executor == "local":
        most = workers or usable_cores()
        run_local(tasks, max(1, most if grow is not None else min(most, len(tasks))), finished, timeout=timeout,
                  refill=refill if grow is not None else None)
    else:   # one batch after another: a grown sweep's points wait for none running
        while True:
            if tasks:
                run_ray(tasks, workers, address, finished, run_point, timeout=timeout)
            if not (tasks := refill() or []):
                break

    metric_misses = sorted((index, end.metric_miss) for index, end in ended.items() if end.metric_miss is not None)
    result.columns = table_columns(sweep)
    result.rows = [_row(sweep, ended[index]) for index in sorted(ended)]
    if metric_misses:
        shown = ", ".join(str(index) for index, _ in sorted(metric_misses)[:10])
        more = " ..." if len(metric_misses) > 10 else ""
        result.warnings.append(f"metric {sweep.metric.text}: {sorted(metric_misses)[0][1]} "
                               f"(point(s) {shown}{more}; those rows leave it empty)")
    from chakra_core.sweep.table import write_outputs

    result.files = write_outputs(sweep, result.columns, result.rows, COLUMN_KINDS, result.warnings)
    return result


def _record(sweep: Sweep, point: Point, outcome: PointOutcome, warnings: list[str]) -> _Ended:
    """Write a finished point's folder; return how it ended."""
    folder = sweep.point_dir(point)
    status, error = outcome.status, outcome.error
    wall_s = round(outcome.wall_s, 6)
    record = {"written_by": "chakra-sim sweep", "chakra_sim_version": __version__, "id": point.id,
              "overrides": point.overrides, "fingerprint": point.fingerprint, "status": status.value,
              "error": error, "detail": outcome.detail, "wall_s": wall_s}
    files = dict(outcome.files)
    files[POINT_RECORD] = json.dumps(record, indent=1) + "\n"
    try:
        _, write_warnings = write_run_files(folder, files)
        warnings.extend(write_warnings)
    except OSError as exc:
        status, error = Status.FAILED, f"cannot write {folder}: {exc.strerror or exc}"
    results = json.loads(files["results.json"]) if status is Status.OK else None
    return _ended(sweep, point, status, error, results, wall_s)


def _finished(sweep: Sweep, point: Point) -> _Ended | None:
    """How a point finished by an earlier run of the sweep ended, or None to run it."""
    folder = sweep.point_dir(point)
    try:
        record = json.loads((folder / POINT_RECORD).read_text(encoding="utf-8"))
        if record.get("status") != Status.OK.value or record.get("fingerprint") != point.fingerprint:
            return None
        results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, AttributeError):
        return None   # absent, unreadable or not ours: run the point again
    wall_s = record.get("wall_s")
    return _ended(sweep, point, Status.OK, None, results, float(wall_s) if isinstance(wall_s, (int, float)) else None)


def _ended(sweep: Sweep, point: Point, status: Status, error: str | None, results: JsonObject | None,
           wall_s: float | None) -> _Ended:
    """The point's metric and statistics, read from its results (not kept: a sweep may have many)."""
    values: dict[str, int | float | None] = {}
    miss = None
    if results is not None:
        try:
            values[sweep.metric.text] = sweep.metric.value(results)
        except KeyPathError as exc:
            miss = str(exc)
        for column, metric in _STATS.items():
            try:
                values[column] = metric.value(results)
            except KeyPathError:
                values[column] = None   # a results document from before a key existed
    return _Ended(point, status, error, values, wall_s, miss)


def _row(sweep: Sweep, end: _Ended) -> JsonObject:
    point = end.point
    row: JsonObject = {"point": point.index, "id": point.id}
    row.update({key: point.overrides.get(key) for key in sweep.keys})
    row.update(status=end.status.value, error=end.error)
    for column in table_columns(sweep)[len(row):-1]:
        row[column] = end.values.get(column)
    row[WALL_COLUMN] = end.wall_s
    return row
