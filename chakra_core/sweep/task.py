"""What a sweep's executors pass between processes: a point to run, and how it ended.

Both are frozen dataclasses of plain values, so they pickle to a spawned worker or a Ray task
and back. The pool and the Ray executor need only `index` and `id`; a test's own worker
function may take a subclass with fields of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping


class Status(str, Enum):
    """A point's status, written as its value ("ok", "failed") in tables and point.json."""

    OK = "ok"
    FAILED = "failed"


@dataclass(frozen=True)
class PointTask:
    """One point for a worker."""

    index: int
    id: str
    data: Mapping[str, Any] = field(default_factory=dict)
    """The point's manifest as the sweep file built it (raw YAML values, validated by the worker)."""
    base_dir: str = "."
    """Relative paths of the manifest resolve against it."""
    source: str = ""
    """Names the point in messages ("point 3")."""
    out_dir: str = ""
    """The point's folder, echoed in its results.json."""
    drop_job_traces: bool = False
    """A job's traces, generated into the point's folder, are removed once it is simulated."""


@dataclass(frozen=True)
class PointOutcome:
    """How a point ended: its files (name -> contents, as `chakra-sim run` writes them) or its error."""

    index: int
    id: str
    status: Status
    error: str | None = None
    """One line for the table."""
    detail: str | None = None
    """The whole message or traceback, for point.json."""
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    wall_s: float = 0.0

    @classmethod
    def failed(cls, task: PointTask, error: str, detail: str | None = None, wall_s: float = 0.0) -> PointOutcome:
        """The outcome of a point that did not finish."""
        return cls(task.index, task.id, Status.FAILED, error, detail or error, {}, wall_s)

    @classmethod
    def timed_out(cls, task: PointTask, timeout: float, wall_s: float) -> PointOutcome:
        return cls.failed(task, f"timed out after {timeout:g} s",
                          f"the point ran longer than the sweep's timeout ({timeout:g} s) and was stopped "
                          "(its worker process killed)", wall_s)
