"""How far to trust a predicted step: the error the model made on published runs like this one.

`benchmarks/training_accuracy.py` compares predicted with published steps
(docs/training-accuracy.md) and writes every run's outcome to `presets/accuracy-runs.json`. A job's
band is taken from the closest class of those runs of the same kind (a mixture of experts or a
dense model: the model errs differently on them, docs/training-accuracy.md): the same GPU,
precision class (8-bit or 16-bit) and scale (up to 64 GPUs, up to 1,024, more); when that class
holds fewer than MIN_RUNS runs, the scale is dropped, then the precision, then the GPU model for its
architecture, then the GPU, then the kind (every run). The band says which class it used, so a GPU
or a kind of model no published run covers is never given a tight band.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from chakra_core.json_types import JsonObject

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec

RUNS_FILE = Path(__file__).with_name("presets") / "accuracy-runs.json"
MIN_RUNS = 3
"""Fewest runs a class needs to stand for a job's error."""
SCALES = ((64, "up to 64 GPUs"), (1024, "65 to 1,024 GPUs"), (None, "more than 1,024 GPUs"))


@dataclass(frozen=True)
class PublishedRun:
    """One published run's outcome: predicted / measured step."""

    id: str
    gpu_model: str
    architecture: str
    precision: str
    gpus: int
    ratio: float
    moe: bool = False
    """A mixture of experts."""


@dataclass(frozen=True)
class ErrorBand:
    """The error of the model on a class of published runs."""

    scope: str
    runs: int
    geomean_error: float
    """exp(mean |ln(predicted / measured)|) - 1."""
    mean_signed_error: float
    """exp(mean ln(predicted / measured)) - 1: negative when the model ran too fast."""
    worst_error: float
    """exp(max |ln(predicted / measured)|) - 1: the farthest run, counted as the geomean counts it."""
    not_covered: tuple[str, ...] = ()
    """The job's settings no published run uses (`uncompared`): the band does not measure them."""

    def to_json(self) -> JsonObject:
        return {"scope": self.scope, "runs": self.runs, "geomean_error": self.geomean_error,
                "mean_signed_error": self.mean_signed_error, "worst_error": self.worst_error,
                "source": "docs/training-accuracy.md (benchmarks/training_accuracy.py)",
                **({"not_covered": list(self.not_covered)} if self.not_covered else {})}


def uncompared(job: JobSpec) -> tuple[str, ...]:
    """Settings of `job` that no run of docs/training-accuracy.md uses, so the band, taken from runs
    without them, does not measure what they change (tests/test_bands.py checks that the published
    runs still use none of them)."""
    p, t = job.parallel, job.training
    found = [f"parallel.schedule {p.schedule}" if p.schedule != "1f1b" else "",
             "cp_comm_type a2a+p2p" if p.cp > 1 and p.cp_comm_type == "a2a+p2p" else "",
             "hybrid sharding (num_distributed_optimizer_instances)" if t.num_distributed_optimizer_instances > 1
             else "", "optimizer offload (optimizer_offload_fraction)" if t.optimizer_offload_fraction else ""]
    return tuple(what for what in found if what)


def precision_class(precision: str) -> str:
    return {"fp8": "8-bit", "nvfp4": "4-bit"}.get(precision, "16-bit")


def scale_class(gpus: int) -> str:
    return next(label for limit, label in SCALES if limit is None or gpus <= limit)


@lru_cache(maxsize=4)
def published_runs(path: Path | None = None) -> tuple[PublishedRun, ...]:
    """The published runs' outcomes (`RUNS_FILE` unless `path`); none before the benchmark wrote them."""
    path = RUNS_FILE if path is None else path
    if not path.is_file():
        return ()
    data = json.loads(path.read_text())
    return tuple(PublishedRun(**row) for row in data["runs"])


def band_of(runs: tuple[PublishedRun, ...] | list[PublishedRun]) -> tuple[float, float, float]:
    logs = [math.log(run.ratio) for run in runs]
    geomean = math.exp(sum(abs(x) for x in logs) / len(logs)) - 1
    signed = math.exp(sum(logs) / len(logs)) - 1
    # the worst as the geomean counts a run (|ln r|): as |r - 1| a too-fast run counts less, and a
    # class of one run 10% too fast read "geomean 11.1%, worst 10.0%"
    return geomean, signed, math.exp(max(abs(x) for x in logs)) - 1


def error_band(gpu_model: str, architecture: str, precision: str, gpus: int,
               runs: tuple[PublishedRun, ...] | None = None, moe: bool = False,
               not_covered: tuple[str, ...] = ()) -> ErrorBand | None:
    """The band of the closest class with at least MIN_RUNS runs (see the module docstring), naming
    `not_covered` settings; None when no published run was compared yet."""
    runs = published_runs() if runs is None else runs
    if not runs:
        return None
    bits, scale = precision_class(precision), scale_class(gpus)
    kind = "mixtures of experts" if moe else "dense models"
    alike = [run for run in runs if run.moe == moe]
    classes: list[tuple[str, Callable[[PublishedRun], bool]]] = [
        (f"{kind}, {gpu_model}, {bits}, {scale}", lambda r: r.gpu_model == gpu_model
         and precision_class(r.precision) == bits and scale_class(r.gpus) == scale),
        (f"{kind}, {gpu_model}, {bits}", lambda r: r.gpu_model == gpu_model and precision_class(r.precision) == bits),
        (f"{kind}, {gpu_model}", lambda r: r.gpu_model == gpu_model),
        (f"{kind}, {architecture} (none of the {gpu_model})", lambda r: r.architecture == architecture),
        (f"{kind}, every GPU (none of a {architecture} GPU)", lambda r: True),
    ]
    for scope, keep in classes:
        chosen = [run for run in alike if keep(run)]
        if len(chosen) >= MIN_RUNS:
            return ErrorBand(scope, len(chosen), *band_of(chosen), not_covered=not_covered)
    return ErrorBand(f"(too few {kind}: every run)", len(runs), *band_of(runs), not_covered=not_covered)
