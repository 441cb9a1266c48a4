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
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import time
import traceback
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from chakra_core._version import __version__
from chakra_core.engine.driver import BREAKDOWN
from chakra_core.errors import ChakraSimError, ManifestError
from chakra_core.report.writers import prepare_output_dir, write_run_files
from chakra_core.sweep.paths import KeyPathError, Metric
from chakra_core.sweep.spec import Point, Sweep

if TYPE_CHECKING:
    from chakra_core.plugins import PluginHost

EXECUTORS = ("local", "ray")
POINT_RECORD = "point.json"
RAY_INSTALL = "pip install 'chakra-sim[ray]'"

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


class SweepError(ChakraSimError):
    """The sweep cannot run at all (an executor missing or unreachable)."""


# The worker --------------------------------------------------------------------------------------
_HOST: PluginHost | None = None


def _plugin_host() -> PluginHost:
    """One plugin host per worker process: discovering plugins once, not once per point."""
    global _HOST
    if _HOST is None:
        from chakra_core.plugins import make_plugin_host

        _HOST = make_plugin_host()
    return _HOST


def run_point(task: dict[str, Any]) -> dict[str, Any]:
    """Validate and simulate one point; return its files or its error (never raises).

    `task`: index, id, data (the manifest mapping), base_dir, source (names the
    point in messages), out_dir (the point's folder, echoed in results.json).
    """
    from chakra_core.run import load, simulate

    started = time.perf_counter()
    outcome = {"index": task["index"], "id": task["id"], "status": "failed", "error": None,
               "detail": None, "files": {}}
    try:
        host = _plugin_host()
        config = load(task["data"], host, base_dir=task["base_dir"], name=task["source"], out_dir=task["out_dir"])
        result = simulate(config, host)
        # results.json always: it is what the sweep reads back on resume.
        files = result.files(sorted(set(config.formats) | {"json"}))
        outcome.update(status="ok", files=files)
    except ManifestError as exc:
        # The row already names the point: keep the key path and the reason.
        prefix = f"{task['source']}: "
        outcome.update(error="; ".join(f"{loc.removeprefix(prefix)}: {why}" for loc, why in exc.problems),
                       detail=str(exc))
    except ChakraSimError as exc:
        outcome.update(error=_first_line(str(exc)) or type(exc).__name__, detail=str(exc))
    except Exception as exc:   # a plugin's bug must not stop the other points
        outcome.update(error=f"{type(exc).__name__}: {_first_line(str(exc))}", detail=traceback.format_exc())
    outcome["wall_s"] = time.perf_counter() - started
    return outcome


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _lost(task: dict[str, Any], why: str) -> dict[str, Any]:
    """The outcome of a point whose worker never answered."""
    return {"index": task["index"], "id": task["id"], "status": "failed", "error": why, "detail": why,
            "files": {}, "wall_s": 0.0}


# Executors ---------------------------------------------------------------------------------------
def _ignore_sigint() -> None:
    # Ctrl-C goes to the whole process group; the sweep's own process stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_local(tasks: list[dict[str, Any]], workers: int, on_outcome: Callable[[dict[str, Any]], None],
              function: Callable[[dict[str, Any]], dict[str, Any]] = run_point) -> None:
    """Run `function` (`run_point`) on each task in a pool of `workers` fresh processes;
    call `on_outcome` as each ends.

    At most `workers` points are submitted at a time, so when a worker dies (killed, out of
    memory, a crash in native code) the points it may have been running are known: they are
    recorded as failed and the rest go on in a new pool.
    """
    pending = deque(tasks)
    # spawn: a forked worker would inherit the progress bar's thread and any lock it holds.
    context = multiprocessing.get_context("spawn")
    while pending:
        pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_ignore_sigint)
        in_flight: dict[Future[dict[str, Any]], dict[str, Any]] = {}
        try:
            while pending or in_flight:
                while pending and len(in_flight) < workers:
                    task = pending.popleft()
                    in_flight[pool.submit(function, task)] = task
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                broken = False
                for future in sorted(done, key=lambda f: in_flight[f]["index"]):
                    task = in_flight.pop(future)
                    try:
                        on_outcome(future.result())
                    except BrokenProcessPool:
                        broken = True
                        on_outcome(_lost(task, "a worker process died while this point (or one running "
                                               "beside it) ran: killed, out of memory, or a crash in "
                                               "native code; run the sweep again to retry it"))
                if broken:
                    for future, task in sorted(in_flight.items(), key=lambda item: item[1]["index"]):
                        on_outcome(_lost(task, "a worker process died while this point (or one running "
                                               "beside it) ran; run the sweep again to retry it"))
                    in_flight.clear()
                    break   # a new pool for the points left
        except BaseException:
            _terminate(pool)
            raise
        pool.shutdown(wait=True)


def _terminate(pool: ProcessPoolExecutor) -> None:
    """Stop a pool now, running points included (shutdown() would wait for them)."""
    # ProcessPoolExecutor has no public way to stop running work; its process table is stable
    # CPython API in practice (3.8-3.13).
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)


def run_ray(tasks: list[dict[str, Any]], workers: int | None, address: str | None,
            on_outcome: Callable[[dict[str, Any]], None]) -> None:
    """Run `tasks` as Ray tasks (one CPU each); call `on_outcome` as each ends.

    Uses the Ray instance this process is connected to if there is one; else connects to
    `address` (or $RAY_ADDRESS), or starts a local instance with `workers` CPUs, which it
    shuts down at the end. `workers` also caps the points in flight (default: all, and Ray
    runs as many as the cluster has CPUs).
    """
    try:
        import ray
    except ImportError:
        raise SweepError(f"--executor ray needs Ray, which is not installed: {RAY_INSTALL}") from None
    started_here = False
    if not ray.is_initialized():
        quiet: dict[str, Any] = {"logging_level": logging.WARNING}
        where = address or os.environ.get("RAY_ADDRESS")
        try:
            if where:
                ray.init(address=where, **quiet)
            else:
                ray.init(address="local", num_cpus=workers or os.cpu_count() or 1, include_dashboard=False,
                         **quiet)
        except Exception as exc:   # Ray raises ConnectionError, RuntimeError, ValueError ...
            target = f"the Ray cluster at {where}" if where else "a local Ray instance"
            raise SweepError(f"cannot start or reach {target}: {_first_line(str(exc))}") from None
        started_here = True
    remote = ray.remote(num_cpus=1)(run_point)
    pending = deque(tasks)
    limit = workers or len(tasks)
    in_flight: dict[ray.ObjectRef[dict[str, Any]], dict[str, Any]] = {}
    try:
        while pending or in_flight:
            while pending and len(in_flight) < limit:
                task = pending.popleft()
                in_flight[remote.remote(task)] = task
            done, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in done:
                task = in_flight.pop(ref)
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayError as exc:   # the worker or its node died
                    outcome = _lost(task, f"Ray: {_first_line(str(exc))}")
                on_outcome(outcome)
    except BaseException:
        for ref in in_flight:
            ray.cancel(ref, force=True)
        raise
    finally:
        if started_here:
            ray.shutdown()


# The sweep ---------------------------------------------------------------------------------------
@dataclass
class PointReport:
    """What the progress display hears after each point."""

    point: Point
    status: str
    skipped: bool
    error: str | None
    wall_s: float | None


@dataclass
class SweepResult:
    columns: list[str]
    rows: list[dict[str, Any]]
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


def run_sweep(sweep: Sweep, executor: str = "local", workers: int | None = None, address: str | None = None,
              force: bool = False, on_point: Callable[[PointReport], None] | None = None) -> SweepResult:
    """Run every point not already finished (all with `force`); write the table and the plot.

    Raises SweepError (or OutputFolderError) when the sweep cannot run; a point's failure is
    a row with status `failed`, never an exception.
    """
    if executor not in EXECUTORS:
        raise SweepError(f"unknown executor {executor!r} (choose {', '.join(EXECUTORS)})")
    if address and executor != "ray":
        raise SweepError("--address names a Ray cluster: use it with --executor ray")
    prepare_output_dir(sweep.output_dir)
    result = SweepResult(columns=table_columns(sweep), rows=[])
    rows: dict[int, dict[str, Any]] = {}
    metric_misses: list[tuple[int, str]] = []
    by_index = {point.index: point for point in sweep.points}

    def report(point: Point, row: dict[str, Any], skipped: bool) -> None:
        rows[point.index] = row
        result.failed += row["status"] != "ok"
        if on_point is not None:
            on_point(PointReport(point, row["status"], skipped, row["error"], row[WALL_COLUMN]))

    tasks = []
    for point in sweep.points:
        row = None if force else _finished_row(sweep, point, metric_misses)
        if row is not None:
            result.skipped += 1
            report(point, row, skipped=True)
        else:
            tasks.append({"index": point.index, "id": point.id, "data": point.data,
                          "base_dir": str(sweep.base_dir), "source": f"point {point.index}",
                          "out_dir": str(sweep.point_dir(point))})

    def finished(outcome: dict[str, Any]) -> None:
        point = by_index[outcome["index"]]
        result.ran += 1
        report(point, _record(sweep, point, outcome, result.warnings, metric_misses), skipped=False)

    if tasks and executor == "local":
        run_local(tasks, max(1, min(workers or os.cpu_count() or 1, len(tasks))), finished)
    elif tasks:
        run_ray(tasks, workers, address, finished)

    result.rows = [rows[index] for index in sorted(rows)]
    if metric_misses:
        shown = ", ".join(str(index) for index, _ in sorted(metric_misses)[:10])
        more = " ..." if len(metric_misses) > 10 else ""
        result.warnings.append(f"metric {sweep.metric.text}: {sorted(metric_misses)[0][1]} "
                               f"(point(s) {shown}{more}; those rows leave it empty)")
    from chakra_core.sweep.table import write_outputs

    result.files = write_outputs(sweep, result.columns, result.rows, COLUMN_KINDS, result.warnings)
    return result


def _record(sweep: Sweep, point: Point, outcome: dict[str, Any], warnings: list[str],
            metric_misses: list[tuple[int, str]]) -> dict[str, Any]:
    """Write a finished point's folder; return its row."""
    folder = sweep.point_dir(point)
    status, error = outcome["status"], outcome["error"]
    record = {"written_by": "chakra-sim sweep", "chakra_sim_version": __version__, "id": point.id,
              "overrides": point.overrides, "fingerprint": point.fingerprint, "status": status,
              "error": error, "detail": outcome["detail"], "wall_s": round(outcome["wall_s"], 6)}
    files = dict(outcome["files"])
    files[POINT_RECORD] = json.dumps(record, indent=1) + "\n"
    try:
        _, write_warnings = write_run_files(folder, files)
        warnings.extend(write_warnings)
    except OSError as exc:
        status, error = "failed", f"cannot write {folder}: {exc.strerror or exc}"
    results = json.loads(files["results.json"]) if status == "ok" else None
    return _row(sweep, point, status, error, results, record["wall_s"], metric_misses)


def _finished_row(sweep: Sweep, point: Point, metric_misses: list[tuple[int, str]]) -> dict[str, Any] | None:
    """The row of a point finished by an earlier run of the sweep, or None to run it."""
    folder = sweep.point_dir(point)
    try:
        record = json.loads((folder / POINT_RECORD).read_text(encoding="utf-8"))
        if record.get("status") != "ok" or record.get("fingerprint") != point.fingerprint:
            return None
        results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, AttributeError):
        return None   # absent, unreadable or not ours: run the point again
    return _row(sweep, point, "ok", None, results, record.get("wall_s"), metric_misses)


def _row(sweep: Sweep, point: Point, status: str, error: str | None, results: dict[str, Any] | None,
         wall_s: float | None, metric_misses: list[tuple[int, str]]) -> dict[str, Any]:
    row: dict[str, Any] = {"point": point.index, "id": point.id}
    row.update({key: point.overrides.get(key) for key in sweep.keys})
    row.update(status=status, error=error)
    values: dict[str, Any] = {}
    if results is not None:
        try:
            values[sweep.metric.text] = sweep.metric.value(results)
        except KeyPathError as exc:
            metric_misses.append((point.index, str(exc)))
        for column, metric in _STATS.items():
            try:
                values[column] = metric.value(results)
            except KeyPathError:
                values[column] = None   # a results document from before a key existed
    for column in table_columns(sweep)[len(row):-1]:
        row[column] = values.get(column)
    row[WALL_COLUMN] = wall_s
    return row
