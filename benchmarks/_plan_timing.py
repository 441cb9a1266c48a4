"""One `chakra-sim plan` as the plan benchmarks run it: the job with `achievable` compute, the
`nccl` system layer and (memory checked) the `hbm` layer following the traces' tensors, planned in an
empty temporary folder, timed."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from chakra_core.plan.search import Plan, PlanOptions, plan
from chakra_core.sweep.run import Execution


def plan_manifest(job: dict[str, Any], check_memory: bool = True) -> dict[str, Any]:
    return {"job": job, "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"},
            **({"memory": {"plugin": "hbm"}} if check_memory else {})}


def timed_plan(manifest: dict[str, Any], options: PlanOptions, workers: int, name: str = "plan") -> tuple[Plan, float]:
    """The plan and its wall seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        found = plan(manifest, Path(tmp), Path(tmp) / name, options, Execution(workers=workers))
        return found, time.perf_counter() - started
