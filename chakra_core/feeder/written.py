"""Indexes of trace files that worker processes wrote and indexed, waiting for the run that reads them.

A training job's traces written in worker processes (chakra_core.jobs.rank_writer) are indexed
there too, each rank's file by the worker that wrote it, in parallel (the pass over a file that
`TraceIndex` makes costs about half as much as generating it: docs/performance.md). What each index found comes back
with the worker's answer and waits here until the run's `TraceLibrary` opens the file: it is taken
only for the very file indexed (device, inode, size and modification time unchanged since) and
the same index options, else the file is indexed again as any other. Only the latest job's wait
(`forget_all` before a job's traces are written), so what was never opened does not pile up."""

from __future__ import annotations

import os

from chakra_core.feeder.streaming import IndexArrays

_waiting: dict[tuple[int, int, int, int], IndexArrays] = {}


def _identity(path: str | os.PathLike[str]) -> tuple[int, int, int, int]:
    status = os.stat(path)
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


def remember(path: str | os.PathLike[str], found: IndexArrays) -> None:
    """What indexing the file at `path` (as it is now) found, with `found.options`."""
    _waiting[_identity(path)] = found


def take(path: str | os.PathLike[str], options: tuple[str, str]) -> IndexArrays | None:
    """What indexing this very file with these options (missing_parents, dependencies) found, if a
    worker did (once)."""
    try:
        key = _identity(path)
    except OSError:
        return None
    found = _waiting.get(key)
    if found is None or found.options != options:
        return None
    del _waiting[key]
    return found


def forget_all() -> None:
    _waiting.clear()
