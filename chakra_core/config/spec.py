"""A run's configuration once read and validated: what the engine runs and where results go."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal

from pydantic import BaseModel

from chakra_core.contract.folding import Folding
from chakra_core.contract.time_folding import TimeFolding
from chakra_core.output_lock import OutputLock
from chakra_core.plugins import Implementation
from chakra_core.json_types import JsonObject

if TYPE_CHECKING:   # the type only: jobs builds on config
    from chakra_core.jobs.info import JobInfo


@dataclass
class Resources:
    """Operations a rank may have in flight at once, per hardware resource (None: unlimited)."""

    cpu: int | None = 1
    gpu: int | None = 1
    comm: int | None = 1
    memory: int | None | Literal["comm"] = "comm"   # "comm": memory operations share the comm slot

    def capacities(self) -> list[int | None]:
        """Per slot (cpu, gpu, comm, memory, unlimited), as the workload driver numbers them."""
        memory = None if self.memory == "comm" else self.memory
        return [self.cpu, self.gpu, self.comm, memory, None]


@dataclass
class LayerChoice:
    """The implementation a manifest section selects, with its validated settings."""

    impl: Implementation
    config: BaseModel


@dataclass
class RunSpec:
    """Everything the engine needs for a run, resolved (paths absolute, configs validated)."""

    trace_files: list[Path]
    layers: dict[str, LayerChoice]
    feeder: Literal["streaming", "memory"] = "streaming"
    cache_nodes: int = 4096
    missing_parents: Literal["ignore-control", "error"] = "ignore-control"
    dependencies: Literal["all", "data"] = "all"
    fold: Literal["auto", "off"] = "auto"
    """"auto": simulate one rank per class of equivalent ranks where that is exact; "off": all."""
    resources: Resources = field(default_factory=Resources)
    comm_groups: dict[str, list[int]] = field(default_factory=dict)
    base_dir: Path = Path(".")
    manifest: JsonObject = field(default_factory=dict)
    """The resolved manifest, echoed in results.json."""
    warnings: list[str] = field(default_factory=list)
    folding: Folding | None = None
    """Classes of equivalent ranks known by construction (a generated job): the engine folds by
    them instead of comparing traces, and only representatives' trace files need exist."""
    time_folding: TimeFolding | None = None
    """A generated job's traces with fewer micro-batches, and where they repeat: the engine folds
    the run in time (chakra_core.contract.time_folding)."""
    unfolded_traces: Callable[[], list[Path]] | None = None
    """A generated job folded by construction: writes every rank's traces of the whole step, for a
    run that finds it cannot fold after all (a network that treats class mates apart)."""
    time_fold_note: str = ""
    """Why a generated job's traces keep every micro-batch ("" when they do not need to say)."""
    step_parts: bool = False
    """Split each rank's time by its nodes' `step_part` attribute too (RankRecord.parts)."""
    training: JobInfo | None = None
    """A generated job's description, for the training section of the results (jobs.report)."""


@dataclass
class RunConfig:
    """A validated manifest (or ASTRA-sim command line): the run, and where its results go."""

    spec: RunSpec
    output_dir: Path
    formats: list[str]
    source: str
    """Names the input in messages: the manifest's path, "command line", a sweep point."""
    timeline: bool = False
    """Also write timeline.json (the run records every node's interval)."""
    notes: list[str] = field(default_factory=list)
    """Said on stderr before the run and kept out of the results (which must not depend on
    whether a job's traces were reused)."""
    output_lock: OutputLock | None = None
    """Held from the moment a job wrote its traces into the output folder (jobs load so) until
    the run is done with it: a second run into the folder fails instead of replacing them."""
    traces_written: Path | None = None
    """The folder a job's traces were just written to (None: no traces, or reused ones)."""
