"""The sweep file: a base manifest, the overrides of each point, the metric and the plot.

    base: allreduce_8npu.yaml            # a manifest file (relative to this file) or a mapping
    grid:                                # cartesian product, the first key varying slowest
      network.bandwidth[0]: [25, 50, 100]
      system.preferred-dataset-splits: [1, 4]
    points:                              # an explicit list; each point is run with every
      - {network.plugin: analytical}     # combination of the grid (points varying slowest)
      - {network.plugin: congestion}
    metric: finish_ns                    # a path into results.json, or max(rank key) ...
    plot: {x: "network.bandwidth[0]", series: system.preferred-dataset-splits, x_unit: GB/s}  # quoted: [ ] in {}
    output: {dir: results/bandwidth}     # relative to this file
    timeout: 600                         # seconds a point may run (default: no limit)
    job_traces: keep                     # a job point's generated traces: keep, or drop once simulated

Everything that can be checked without simulating is checked here, and every
problem is reported at once as a ManifestError (file, key, reason): the
syntax of key paths and of the metric, that each override lands somewhere in
the base manifest (missing mapping keys are created; a list index past the
end is an error), and that each point is distinct. Whether each point's
manifest is valid is checked next, before any point runs (`checks.check_points`).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from chakra_core._version import __version__
from chakra_core.config.files import read_config_file
from chakra_core.config.manifest import Manifest
from chakra_core.errors import ManifestError
from chakra_core.json_types import JsonObject, JsonValue
from chakra_core.sweep.paths import KeyPath, KeyPathError, Metric, describe, parse_key_path, set_key_path

_Problem = Callable[[str, str], None]  # problem(where, why): records one problem of the sweep file

TOP_LEVEL_KEYS = ("base", "grid", "points", "metric", "plot", "output", "timeout", "job_traces")
POINTS_DIR = "points"
JOB_SECTIONS = ("job", "cluster")
"""A job manifest's own sections (docs/training.md), which a sweep may set too."""


def canonical_json(value: Any) -> str:
    """The one JSON text of a value: hashed for point ids and fingerprints."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _digest(value: Any, length: int = 64) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:length]


# The sweep -------------------------------------------------------------------------------------
@dataclass
class Point:
    """One run of the sweep: the base manifest with `overrides` applied."""

    index: int
    """Position in the sweep's order (points slowest, then the grid's keys in order)."""
    overrides: JsonObject
    """key path -> value, in the order they are applied."""
    data: JsonObject
    """The point's manifest mapping."""
    id: str = ""
    """Hash of the overrides: names the point's folder, stable when other points come and go."""
    fingerprint: str = ""
    """Hash of everything the point's results depend on that the sweep can see cheaply:
    the point's manifest, the folder its relative paths resolve against, chakra-sim's version."""


@dataclass
class PlotSpec:
    x: str
    series: list[str]
    x_unit: str | None = None
    logx: bool = False
    logy: bool = False


@dataclass
class Sweep:
    """A loaded sweep file: its points, ready to run."""

    source: str
    """The sweep file's name as given (used in messages)."""
    base_source: str
    """Where the base manifest comes from: its file, or '<sweep file>: base'."""
    base_dir: Path
    """The folder relative paths of every point resolve against (the base manifest's)."""
    keys: list[str]
    """The swept key paths: the grid's in order, then the points' in order of appearance."""
    points: list[Point]
    metric: Metric
    plot: PlotSpec
    output_dir: Path
    name: str = field(default="sweep")
    timeout: float | None = None
    """Seconds a point may run before it is stopped and failed; None: no limit."""
    drop_job_traces: bool = False
    """A job point's generated traces are removed once it is simulated (its results stay)."""

    def point_dir(self, point: Point) -> Path:
        return self.output_dir / POINTS_DIR / point.id


def load_sweep(path: str | Path, out_dir: str | Path | None = None) -> Sweep:
    """Read and check a sweep file; raise ManifestError listing every problem."""
    path = Path(path)
    data = read_config_file(path)
    return build_sweep(data, path.resolve().parent, str(path), out_dir, name=path.stem)


def build_sweep(data: JsonObject, sweep_dir: Path, source: str, out_dir: str | Path | None = None,
                name: str = "sweep") -> Sweep:
    """Check a sweep mapping (as read from `source`, whose folder is `sweep_dir`) and expand it."""
    problems: list[tuple[str, str]] = []

    def problem(where: str, why: str) -> None:
        problems.append((f"{source}: {where}", why))

    for key in data:
        if key not in TOP_LEVEL_KEYS:
            problem(str(key), f"unknown key (a sweep file has {', '.join(TOP_LEVEL_KEYS)})")

    base, base_dir, base_source = _load_base(data.get("base"), sweep_dir, source, problem)
    grid = _read_grid(data.get("grid"), problem)
    points = _read_points(data.get("points"), problem)
    if not data.get("grid") and "points" not in data:
        problem("(top level)", "nothing to sweep: give grid and/or points")
    for key in grid:
        for i, point in enumerate(points):
            if key in point:
                problem(f"points[{i}]: {key}", "also in grid: give each key in one place")

    keys = list(grid) + list(dict.fromkeys(k for point in points for k in point if k not in grid))
    metric = _read_metric(data.get("metric", "finish_ns"), problem)
    plot = _read_plot(data.get("plot"), keys, problem)
    output_dir = _read_output(data.get("output"), sweep_dir, out_dir, name, problem)
    timeout = _read_timeout(data.get("timeout"), problem)
    job_traces = data.get("job_traces", "keep")
    if job_traces not in ("keep", "drop"):
        problem("job_traces", f"expected keep or drop (a job point's generated traces once simulated), found "
                              f"{describe(job_traces)}")
    # The overrides can be tried on the base only if there is one; keys found bad above are
    # left out of `grid` and `points`, so what follows reports only new problems.
    expanded = _expand(base, grid, points, base_dir, problem) if base is not None else []
    if problems:
        raise ManifestError(problems)
    return Sweep(source=source, base_source=base_source, base_dir=base_dir, keys=keys, points=expanded,
                 metric=metric, plot=plot, output_dir=output_dir, name=name, timeout=timeout,
                 drop_job_traces=job_traces == "drop")


def _load_base(value: Any, sweep_dir: Path, source: str,
               problem: _Problem) -> tuple[JsonObject | None, Path, str]:
    """The base manifest mapping (None when unusable), the folder its relative paths resolve
    against, its name."""
    if isinstance(value, dict):
        return value, sweep_dir, f"{source}: base"
    if not isinstance(value, str) or not value:
        problem("base", "required: a manifest file (relative to the sweep file) or a manifest mapping"
                if value is None else f"expected a file name or a mapping, found {describe(value)}")
        return None, sweep_dir, f"{source}: base"
    file = Path(value).expanduser()
    file = file if file.is_absolute() else sweep_dir / file
    try:
        return read_config_file(file), file.resolve().parent, value
    except ManifestError as exc:
        for loc, why in exc.problems:
            problem("base", f"{loc}: {why}")
        return None, sweep_dir, value


def _check_key(key: Any, where: str, problem: _Problem) -> KeyPath | None:
    try:
        path = parse_key_path(key)
    except KeyPathError as exc:
        problem(where, str(exc))
        return None
    if path[0] not in Manifest.model_fields and path[0] not in JOB_SECTIONS:
        problem(f"{where}: {key}", f"unknown manifest section '{path[0]}' (a manifest has "
                                   f"{', '.join(Manifest.model_fields)}; a job manifest also {' and '.join(JOB_SECTIONS)})")
        return None
    if path[:2] == ("output", "dir") or path == ("output",):
        problem(f"{where}: {key}", "the sweep chooses each point's output folder; "
                                   "set the sweep's own output.dir instead")
        return None
    return path


def _check_value(value: Any, where: str, problem: _Problem) -> bool:
    try:
        canonical_json(value)
    except (TypeError, ValueError) as exc:
        problem(where, f"value {value!r} cannot be written as JSON ({exc})")
        return False
    return True


def _read_grid(value: Any, problem: _Problem) -> dict[str, list[JsonValue]]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problem("grid", f"expected a mapping of key paths to lists of values, found {describe(value)}")
        return {}
    grid = {}
    for key, values in value.items():
        if _check_key(key, "grid", problem) is None:
            continue
        if not isinstance(values, list):
            problem(f"grid: {key}", f"expected a list of values, found {describe(values)} "
                                    f"(for a single value write [{json.dumps(values, default=str)}])")
            continue
        if not values:
            problem(f"grid: {key}", "empty list: the grid would have no points")
            continue
        if not all(_check_value(v, f"grid: {key}[{i}]", problem) for i, v in enumerate(values)):
            continue
        duplicates = [v for i, v in enumerate(values) if canonical_json(v) in map(canonical_json, values[:i])]
        if duplicates:
            problem(f"grid: {key}", f"value {duplicates[0]!r} is listed twice")
            continue
        grid[key] = values
    return grid


def _read_points(value: Any, problem: _Problem) -> list[JsonObject]:
    if value is None:
        return []
    if not isinstance(value, list) or not value:
        problem("points", f"expected a non-empty list of mappings of key paths to values, "
                          f"found {describe(value) if value != [] else 'an empty list'}")
        return []
    points = []
    for i, point in enumerate(value):
        if not isinstance(point, dict) or not point:
            problem(f"points[{i}]", f"expected a non-empty mapping of key paths to values, "
                                    f"found {describe(point)}")
            continue
        ok = [key for key in point if _check_key(key, f"points[{i}]", problem) is not None
              and _check_value(point[key], f"points[{i}]: {key}", problem)]
        points.append({key: point[key] for key in ok})
    return points


def _read_metric(value: Any, problem: _Problem) -> Metric:
    try:
        return Metric.parse(value)
    except KeyPathError as exc:
        problem("metric", str(exc))
        return Metric("finish_ns", ("finish_ns",))


def _read_plot(value: Any, keys: list[str], problem: _Problem) -> PlotSpec:
    default_x = keys[0] if keys else ""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        problem("plot", f"expected a mapping (x, series, x_unit, logx, logy), found {describe(value)}")
        return PlotSpec(default_x, keys[1:])
    for key in value:
        if key not in ("x", "series", "x_unit", "logx", "logy"):
            problem(f"plot.{key}", "unknown key (plot has x, series, x_unit, logx, logy)")
    x = value.get("x", default_x)
    if keys and x not in keys:
        problem("plot.x", f"{x!r} is not a swept key (swept: {', '.join(keys)})")
        x = default_x
    series = value.get("series", [k for k in keys if k != x])
    series = [series] if isinstance(series, str) else series
    if not isinstance(series, list) or not all(isinstance(s, str) for s in series):
        problem("plot.series", "expected a swept key or a list of swept keys")
        series = []
    for s in series:
        if s == x:
            problem("plot.series", f"{s!r} is already the x axis")
        elif keys and s not in keys:
            problem("plot.series", f"{s!r} is not a swept key (swept: {', '.join(keys)})")
    for flag in ("logx", "logy"):
        if not isinstance(value.get(flag, False), bool):
            problem(f"plot.{flag}", "expected true or false")
    x_unit = value.get("x_unit")
    if x_unit is not None and not isinstance(x_unit, str):
        problem("plot.x_unit", "expected a string such as GB/s")
    # Keys neither on the x axis nor in the series still tell points apart: they split lines
    # too, after the chosen ones (else a line would zigzag between their values).
    series = list(dict.fromkeys(series)) + [k for k in keys if k != x and k not in series]
    return PlotSpec(x, series, x_unit, bool(value.get("logx", False)), bool(value.get("logy", False)))


def _read_timeout(value: Any, problem: _Problem) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        problem("timeout", f"expected a positive number of seconds (or null for no limit), found {describe(value)}")
        return None
    return float(value)


def _read_output(value: Any, sweep_dir: Path, out_dir: str | Path | None, name: str, problem: _Problem) -> Path:
    value = {} if value is None else value
    if not isinstance(value, dict):
        problem("output", f"expected a mapping (dir), found {describe(value)}")
        value = {}
    for key in value:
        if key != "dir":
            problem(f"output.{key}", "unknown key (output has dir)")
    folder = value.get("dir", f"results/{name}")
    if not isinstance(folder, str) or not folder:
        problem("output.dir", "expected a folder name")
        folder = f"results/{name}"
    if out_dir is not None:
        return Path(out_dir).absolute()
    path = Path(folder).expanduser()
    return path if path.is_absolute() else (sweep_dir / path)


def _expand(base: JsonObject, grid: dict[str, list[JsonValue]], points: list[JsonObject], base_dir: Path,
            problem: _Problem) -> list[Point]:
    """Every point in order: each listed point (or one empty point) times the grid's product.

    A point's own keys are applied first, then the grid's, each in the order written, so a
    point may set a whole section and the grid one key inside it.
    """
    grid_paths = {key: parse_key_path(key) for key in grid}
    combos = list(itertools.product(*grid.values())) if grid else [()]
    expanded: list[Point] = []
    seen: dict[str, int] = {}
    reported: set[tuple[str, str]] = set()   # a bad key fails every point alike: say it once
    position = itertools.count()
    for p, listed in enumerate(points or [{}]):
        for combo in combos:
            overrides = {**listed, **dict(zip(grid, combo))}
            index = next(position)
            data = copy.deepcopy(base)
            failed = False
            for key, value in overrides.items():
                try:
                    set_key_path(data, grid_paths.get(key) or parse_key_path(key), value)
                except KeyPathError as exc:
                    where = f"grid: {key}" if key in grid else f"points[{p}]: {key}"
                    if (where, str(exc)) not in reported:
                        reported.add((where, str(exc)))
                        problem(where, f"{exc} (first at point {index}: {_short(overrides)})")
                    failed = True   # go on: the point's other keys may have problems too
            if failed:
                continue
            point_id = _digest(overrides, 12)
            if point_id in seen:
                problem("points", f"point {index} ({_short(overrides)}) repeats point {seen[point_id]}")
                continue
            seen[point_id] = index
            hashed = copy.deepcopy(data)
            output = hashed.get("output")
            if isinstance(output, dict):
                output.pop("dir", None)   # the sweep sets each point's folder
            fingerprint = _digest({"manifest": hashed, "base_dir": str(base_dir),
                                   "chakra_sim_version": __version__})
            expanded.append(Point(index, overrides, data, point_id, fingerprint))
    return expanded


def _short(overrides: JsonObject) -> str:
    return ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in overrides.items())
