"""Opening a run's trace files, once per distinct content.

SPMD jobs give many ranks byte-identical trace files (every data-parallel
replica of the scale benchmark, ASTRA-sim's microbenchmarks). `TraceLibrary`
indexes each distinct file once and gives every rank a feeder over that shared
index (see `TraceIndex`): parsing cost and index memory follow the number of
distinct files, not the number of ranks. A file is compared only with files of
its size: byte for byte with the first one (SPMD replicas: one read each, no
hashing), and by BLAKE2b digest once a size has turned out to hold different
contents. A run whose files all differ in size pays nothing.

`IdenticalFiles` is that comparison on its own, keeping any value per distinct
content (`chakra-sim analyze` keeps one trace scan per content).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Callable, Generic, TypeVar

from chakra_core.feeder import written
from chakra_core.feeder.base import GraphFeeder
from chakra_core.input_files import open_trace_file
from chakra_core.feeder.streaming import DEFAULT_CACHE_NODES, IndexArrays, StreamingFeeder, TraceIndex

T = TypeVar("T")


def file_digest(path: str | os.PathLike[str]) -> bytes:
    with open_trace_file(path) as handle:
        if sys.version_info >= (3, 11):
            return hashlib.file_digest(handle, "blake2b").digest()
        digest = hashlib.blake2b()   # Python 3.10 has no hashlib.file_digest: the same digest by hand
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
        return digest.digest()


def same_bytes(a: str | os.PathLike[str], b: str | os.PathLike[str], block: int = 1 << 20) -> bool:
    """Whether two files of equal size hold the same bytes (read block by block: memory stays small)."""
    with open_trace_file(a) as first, open_trace_file(b) as second:
        while True:
            x, y = first.read(block), second.read(block)
            if x != y:
                return False
            if not x:
                return True


class IdenticalFiles(Generic[T]):
    """Values kept per distinct file content: `get_or_make(path, make)` returns the value made for
    an earlier file with the same bytes, else makes one. How contents are compared: see the
    module docstring (by size, then byte for byte with the first file of that size, then by
    digest once a size holds two contents)."""

    def __init__(self) -> None:
        # The first file of each size (and its bytes, when small); once a file of that size with
        # other bytes comes, every file of that size is known by (size, digest) instead.
        self._unhashed: dict[int, tuple[Path, T, bytes | None]] = {}
        self._hashed_sizes: set[int] = set()
        self._by_digest: dict[tuple[int, bytes], T] = {}

    def get_or_make(self, path: str | os.PathLike[str], make: Callable[[], T]) -> T:
        path = Path(path)
        with open_trace_file(path) as handle:   # a missing or special file: a TraceFormatError
            size = os.fstat(handle.fileno()).st_size
            # small files are compared from memory: one open each instead of three (a 1,024-rank
            # microbenchmark's files are a few hundred bytes; the bytes kept are 8.4 MB at most)
            data = handle.read(size + 1) if size <= _COMPARED_IN_MEMORY else None
        if data is not None and len(data) != size:    # changing while read: compare from the file
            data = None
        if size not in self._hashed_sizes:
            first = self._unhashed.get(size)
            if first is None:
                value = make()
                self._unhashed[size] = (path, value, data)
                return value
            other, value, other_data = first
            if other == path or (data == other_data if data is not None and other_data is not None
                                 else same_bytes(path, other)):
                return value
            # Two contents of this size: from now on its files are known by their digests.
            del self._unhashed[size]
            self._hashed_sizes.add(size)
            self._by_digest[size, _digest(other, other_data)] = value
        key = (size, _digest(path, data))
        found = self._by_digest.get(key)
        if found is None:
            found = self._by_digest[key] = make()
        return found


_COMPARED_IN_MEMORY = 4096


def _digest(path: Path, data: bytes | None) -> bytes:
    return file_digest(path) if data is None else hashlib.blake2b(data).digest()


class TraceLibrary:
    """Streaming feeders for a run's trace files, sharing an index between identical files."""

    def __init__(self, cache_nodes: int = DEFAULT_CACHE_NODES, missing_parents: str = "ignore-control",
                 dependencies: str = "all"):
        self.cache_nodes, self.missing_parents, self.dependencies = cache_nodes, missing_parents, dependencies
        self._indexes: IdenticalFiles[TraceIndex] = IdenticalFiles()
        self.distinct = 0
        """Number of distinct files indexed so far."""

    def _index(self, path: Path, found: IndexArrays | None) -> TraceIndex:
        index = TraceIndex(path, self.cache_nodes, self.missing_parents, self.dependencies, found)
        self.distinct += 1
        return index

    def open(self, path: str | os.PathLike[str]) -> GraphFeeder:
        path = Path(path)
        # a job's traces written in worker processes were indexed there (feeder/written.py); taken
        # even when a file of the same bytes is indexed already, so that none waits past its run
        found = written.take(path, (self.missing_parents, self.dependencies))
        return StreamingFeeder(path, index=self._indexes.get_or_make(path, lambda: self._index(path, found)))
