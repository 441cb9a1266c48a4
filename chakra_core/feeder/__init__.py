"""GraphFeeder: hands out a rank's issuable nodes as dependencies resolve."""

from __future__ import annotations

import os

from chakra_core.feeder.base import CPU_FLAG, DEPENDENCY_MODES, MISSING_PARENT_POLICIES, GraphFeeder
from chakra_core.feeder.memory import InMemoryFeeder
from chakra_core.feeder.streaming import DEFAULT_CACHE_NODES, StreamingFeeder

FEEDER_KINDS = ("memory", "streaming")


def open_feeder(path: str | os.PathLike[str], kind: str = "memory",
                cache_nodes: int = DEFAULT_CACHE_NODES,
                missing_parents: str = "ignore-control", dependencies: str = "all") -> GraphFeeder:
    """Open one rank's trace with the named feeder implementation."""
    if kind == "memory":
        return InMemoryFeeder.from_file(path, missing_parents=missing_parents,
                                        dependencies=dependencies)
    if kind == "streaming":
        return StreamingFeeder(path, cache_nodes=cache_nodes, missing_parents=missing_parents,
                               dependencies=dependencies)
    raise ValueError(f"unknown feeder {kind!r}; choose one of {', '.join(FEEDER_KINDS)}")


__all__ = ["CPU_FLAG", "DEPENDENCY_MODES", "MISSING_PARENT_POLICIES", "DEFAULT_CACHE_NODES", "FEEDER_KINDS", "GraphFeeder", "InMemoryFeeder",
           "StreamingFeeder", "open_feeder"]
