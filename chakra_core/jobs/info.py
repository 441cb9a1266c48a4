"""What a generated job tells the rest of a run: the job itself and what its generation worked
out (placement, model FLOPs, the GPU's peak), for the results' training section and the terminal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from chakra_core.jobs.spec import JobSpec
from chakra_core.jobs.step import PlacedGroup


@dataclass(frozen=True)
class JobInfo:
    job: JobSpec
    gpus: int
    gpus_per_node: int
    dp: int
    microbatches: int
    """Per data-parallel replica and step."""
    tokens_per_step: int
    model_flops: Mapping[str, float]
    """A step's model FLOPs by formula (chakra_core.jobs.flops.FORMULAS)."""
    placement: tuple[PlacedGroup, ...]
    """Where each role's communicator groups land (Placement.where())."""
    peak_tflops: float
    """The GPU's dense peak at the job's precision."""
    profile: str
    """The profile's name as it loaded."""
    gpu_model: str
    architecture: str
    profile_name: str
    """The profile as the job names it (a shipped name or a file's path)."""
    domain_note: str | None = None
    """How the job fills NVLink domains it shares out (jobs.domains.domain_note)."""

    @property
    def model(self) -> str:
        return self.job.shape.name or "inline"
