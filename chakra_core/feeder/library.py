"""Opening a run's trace files, once per distinct content.

SPMD jobs give many ranks byte-identical trace files (every data-parallel
replica of the scale benchmark, ASTRA-sim's microbenchmarks). `TraceLibrary`
indexes each distinct file once and gives every rank a feeder over that shared
index (see `TraceIndex`): parsing cost and index memory follow the number of
distinct files, not the number of ranks. Files are compared by size first and
hashed (BLAKE2b) only when sizes collide, so a run whose files all differ pays
nothing.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from chakra_core.feeder.base import GraphFeeder
from chakra_core.feeder.streaming import DEFAULT_CACHE_NODES, StreamingFeeder, TraceIndex


def file_digest(path: str | os.PathLike) -> bytes:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "blake2b").digest()


class TraceLibrary:
    """Streaming feeders for a run's trace files, sharing an index between identical files."""

    def __init__(self, cache_nodes: int = DEFAULT_CACHE_NODES, missing_parents: str = "ignore-control",
                 dependencies: str = "all"):
        self.cache_nodes, self.missing_parents, self.dependencies = cache_nodes, missing_parents, dependencies
        self._by_size: dict[int, list[tuple[Path, TraceIndex]]] = {}
        self._digests: dict[Path, bytes] = {}
        self.distinct = 0
        """Number of distinct files indexed so far."""

    def _digest(self, path: Path) -> bytes:
        digest = self._digests.get(path)
        if digest is None:
            digest = self._digests[path] = file_digest(path)
        return digest

    def open(self, path: str | os.PathLike) -> GraphFeeder:
        path = Path(path)
        size = path.stat().st_size
        known = self._by_size.setdefault(size, [])
        for other, index in known:
            if other == path or self._digest(other) == self._digest(path):
                return StreamingFeeder(path, index=index)
        index = TraceIndex(path, self.cache_nodes, self.missing_parents, self.dependencies)
        known.append((path, index))
        self.distinct += 1
        return StreamingFeeder(path, index=index)
