"""What converting one rank gives: its metadata and nodes (`Conversion`, written by `write`) and the
figures the command reports (`Summary`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from chakra_core.et.io import write_trace
from chakra_core.schema import pb
from chakra_core.et.build import rank_path


@dataclass
class Summary:
    host: str
    kineto: str | None
    rank: int
    schema: str
    nodes: dict[str, int]
    ctrl_edges: int
    data_edges: int
    collectives: dict[str, int]
    units: int
    linked: int = 0
    linked_by_rf_id: int = 0
    gpu_events: int = 0
    gpu_linked: int = 0
    cpu_micros: int = 0
    gpu_micros: int = 0
    comm_micros: int = 0
    num_ops: int = 0
    cycles_broken: int = 0
    waits_removed: int = 0
    """Blocking runtime calls whose wait for the GPU was taken out of their operator's duration."""
    wait_removed_micros: int = 0
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def edges(self) -> int:
        return self.ctrl_edges + self.data_edges

    @property
    def unlinked(self) -> int:
        return self.units - self.linked if self.kineto else 0


@dataclass
class Conversion:
    rank: int
    metadata: pb.GlobalMetadata
    nodes: list[pb.Node]
    summary: Summary

    def write(self, prefix: str | os.PathLike[str]) -> Path:
        """Write PREFIX.<rank>.et (atomically; identical input gives identical bytes)."""
        path = rank_path(prefix, self.rank)
        write_trace(path, self.metadata, self.nodes)
        return path
