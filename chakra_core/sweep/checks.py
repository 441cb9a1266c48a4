"""What a sweep checks before its points run: every point's manifest, validated as its worker
would build it (`check_points`), and the temporary files a killed earlier run left behind
(`remove_stale_temp_files`)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from chakra_core.errors import ChakraSimError, ManifestError
from chakra_core.sweep.errors import first_line as _first_line
from chakra_core.sweep.pool import describe_exception
from chakra_core.sweep.spec import POINTS_DIR, Point, Sweep

if TYPE_CHECKING:
    from chakra_core.plugins import PluginHost


SHOWN_BAD_POINTS = 10
"""Point numbers listed per problem; the rest are counted."""


def check_points(sweep: Sweep, host: PluginHost) -> None:
    """Build and validate every point's manifest as its worker would (plugins named, settings of
    the right types and ranges, trace files present); raise ManifestError naming the bad points,
    each problem once with the points it hits.

    A training job (`job:`) generates its traces when it runs, so only its `job` section is
    checked here; the rest of it, like what a plugin refuses only when it builds its layer, fails
    its point when it runs.
    """
    hits: dict[tuple[str, str], list[Point]] = {}
    for point in sweep.points:
        for where, why in _point_problems(sweep, point, host):
            hits.setdefault((where, why), []).append(point)
    if not hits:
        return
    problems = []
    for (where, why), points in hits.items():
        if len(points) == 1:
            overrides = ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in points[0].overrides.items())
            who = f"point {points[0].index} ({overrides})"
        else:
            listed = ", ".join(str(p.index) for p in points[:SHOWN_BAD_POINTS])
            who = f"points {listed}{' ...' if len(points) > SHOWN_BAD_POINTS else ''} ({len(points)} points)"
        problems.append((f"{sweep.source}: {who}" + (f": {where}" if where else ""), why))
    raise ManifestError(problems)


def _point_problems(sweep: Sweep, point: Point, host: PluginHost) -> list[tuple[str, str]]:
    """(key path, reason) of each problem of the point's manifest; none when it validates."""
    from chakra_core.config.build import build_config
    from chakra_core.jobs.expand import is_job, read_job

    source = f"point {point.index}"
    try:
        if is_job(point.data):
            job = point.data.get("job")
            if isinstance(job, dict) and "cluster" not in job and "cluster" in point.data:
                job = {**job, "cluster": point.data["cluster"]}
            read_job(job, source, sweep.base_dir)
        else:
            build_config(point.data, host, base_dir=sweep.base_dir, source=source, out_dir=sweep.point_dir(point))
    except ManifestError as exc:
        return [(loc.removeprefix(source).removeprefix(": "), why) for loc, why in exc.problems]
    except ChakraSimError as exc:
        return [("", _first_line(str(exc)) or type(exc).__name__)]
    except Exception as exc:   # a plugin's settings model that crashes would crash the point too
        return [("", describe_exception(exc))]
    return []


def remove_stale_temp_files(sweep: Sweep) -> None:
    """Remove the temporary files a killed (kill -9) earlier run left in the output folder.

    Called with the folder locked, so no other run is writing them; they are named as
    chakra_core._atomic and prepare_output_dir name theirs.
    """
    folders: list[str | Path] = [sweep.output_dir]
    with contextlib.suppress(OSError):
        folders += [entry.path for entry in os.scandir(sweep.output_dir / POINTS_DIR) if entry.is_dir()]
    for folder in folders:
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith(".") and (name.endswith(".tmp") or name.startswith(".chakra-sim-probe-")) \
                        and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
