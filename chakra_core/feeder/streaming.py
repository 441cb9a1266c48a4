"""Streaming GraphFeeder: an index in compact arrays, node bodies loaded on demand.

Opening a trace makes one sequential pass that records, per node, its byte
offset and length, its kind, and its parents; the dependency graph is then
stored as compressed arrays (about 50 bytes per node with its edges, versus
roughly 2 KB per parsed protobuf node). Node bodies are parsed only when the
simulator looks them up and live in an LRU cache of `cache_nodes` entries, so a
trace far larger than memory simulates in memory bounded by the index and the
cache. Gzip-compressed traces are decompressed once to a temporary file during
the indexing pass (random access into gzip is not possible).

The index and the node cache (`TraceIndex`) hold nothing that changes during
a run, so ranks whose trace files have the same bytes (data-parallel replicas
of one SPMD program, ASTRA-sim's microbenchmarks) share one: the file is
parsed once, and a node body parsed for one rank serves the others. Each
rank's `StreamingFeeder` keeps only what does change: how many parents each
node still waits for, which nodes finished, which are issuable.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from array import array
from collections import OrderedDict
from typing import BinaryIO, NamedTuple

from chakra_core.errors import TraceFormatError, TraceGraphError
from chakra_core.et.attrs import NodeView
from chakra_core.et.io import FrameReader, is_gzip, parse_metadata, parse_node
from chakra_core.input_files import GuardedGunzip, open_trace_file
from chakra_core.limits import NODE_PARENTS
from chakra_core.feeder.base import (GraphFeeder, IssuableHeap, cycle_error, find_cycle,
                                     missing_parent_problem, node_kind, parents_of,
                                     use_control_deps)
from chakra_core.schema import pb

DEFAULT_CACHE_NODES = 4096

READ_BLOCK = 32 << 10
"""Bytes of a trace read at once for the nodes' bodies (a rank's trace keeps one block)."""


class IndexArrays(NamedTuple):
    """What a TraceIndex found in a file, for a TraceIndex of the same file in another process
    (feeder/written.py): the options it was built with (missing_parents, dependencies), the
    metadata's bytes and the index's arrays (see TraceIndex._index)."""

    options: tuple[str, str]
    metadata: bytes
    ids: array[int]
    offsets: array[int]
    lengths: array[int]
    kinds: bytearray
    base: int
    dense: array[int] | None
    sparse: dict[int, int] | None
    remaining: array[int]
    child_start: array[int]
    children: array[int]
    roots: list[int]
    warnings: list[str]


class TraceIndex:
    """What a trace file says, indexed once and shared by every rank that reads the same bytes."""

    # id -> position (see _build_id_map): `_sparse` is set exactly when `_dense` is None.
    _base: int
    _dense: array[int] | None
    _sparse: dict[int, int] | None
    _block: tuple[int, bytes]
    """The bytes last read (_load), from that offset."""

    def __init__(self, path: str | os.PathLike[str], cache_nodes: int = DEFAULT_CACHE_NODES,
                 missing_parents: str = "ignore-control", dependencies: str = "all",
                 found: IndexArrays | None = None):
        """`found`: what indexing this very file with these options found (feeder/written.py),
        taken instead of reading it again."""
        if cache_nodes < 1:
            raise ValueError("cache_nodes must be at least 1")
        self.path = str(path)
        self.missing_parents = missing_parents
        self.dependencies = dependencies
        self._use_ctrl = use_control_deps(dependencies)
        self.warnings: list[str] = []
        self.cache_nodes = cache_nodes
        self._tmp_dir: str | None = None
        self._file: BinaryIO | None = None
        self._cache: OrderedDict[int, NodeView] = OrderedDict()
        self.users = 0
        try:
            if found is None:
                self._index()
            else:
                self._adopt(found)
        except BaseException:
            self.close()
            raise

    def _adopt(self, found: IndexArrays) -> None:
        self.metadata = pb.GlobalMetadata.FromString(found.metadata)
        self._ids, self._offsets, self._lengths, self._kinds = found.ids, found.offsets, found.lengths, found.kinds
        self._base, self._dense, self._sparse = found.base, found.dense, found.sparse
        self._remaining, self._child_start, self._children = found.remaining, found.child_start, found.children
        self.roots = found.roots
        self.warnings.extend(found.warnings)
        self._file = open(self.path, "rb")
        self._block = (0, b"")

    def found(self) -> IndexArrays:
        """What indexing the file found, to hand to another process (not for a gzip file, which
        is indexed from a temporary copy)."""
        if self._tmp_dir is not None:
            raise ValueError(f"{self.path}: a gzip trace's index is not handed over")
        return IndexArrays((self.missing_parents, self.dependencies), self.metadata.SerializeToString(), self._ids,
                           self._offsets, self._lengths, self._kinds, self._base, self._dense, self._sparse,
                           self._remaining, self._child_start, self._children, self.roots, list(self.warnings))

    # Indexing ---------------------------------------------------------------------------
    def _index(self) -> None:
        source = self.path
        if is_gzip(source):
            self._tmp_dir = tempfile.mkdtemp(prefix="chakra-sim-")
            plain = os.path.join(self._tmp_dir, "trace.et")
            import zlib
            try:
                with GuardedGunzip(source) as src, open(plain, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            except (OSError, EOFError, zlib.error) as exc:
                raise TraceFormatError(self.path, 0, f"corrupt gzip stream: {exc}") from exc
            source = plain

        ids = array("Q")
        offsets = array("Q")
        lengths = array("I")
        kinds = bytearray()
        edge_parent = array("Q")   # parent id of each edge
        edge_child = array("I")    # child position of each edge
        edge_is_ctrl = bytearray()  # 1 when the edge is a control-only dependency
        most_parents = NODE_PARENTS.value()
        with open_trace_file(source) as stream:
            reader = FrameReader(stream, self.path)
            frames = iter(reader)
            first = next(frames, None)
            if first is None:
                raise TraceFormatError(self.path, 0,
                                       "empty file: a Chakra trace starts with a GlobalMetadata message")
            self.metadata = parse_metadata(first[1], self.path, first[0])
            for offset, body in frames:
                node = parse_node(body, self.path, offset)
                position = len(ids)
                node_id = node.id
                ids.append(node_id)
                # the body follows its prefix, which may be non-minimal (et/io.py: protobuf's rule)
                offsets.append(reader.body_offset)
                lengths.append(len(body))
                kinds.append(node_kind(node, body))
                parents = parents_of(node, self._use_ctrl, self.path, most_parents)
                if node_id in parents:      # self-dependencies are ignored
                    parents = [parent for parent in parents if parent != node_id]
                edge_parent.extend(parents)
                edge_child.extend([position] * len(parents))
                if self._use_ctrl and node.ctrl_deps:
                    data = set(node.data_deps)   # a set: `in` on the repeated field is linear
                    edge_is_ctrl.extend([parent not in data for parent in parents])
                else:
                    edge_is_ctrl.extend(bytes(len(parents)))

        count = len(ids)
        self._ids, self._offsets, self._lengths, self._kinds = ids, offsets, lengths, kinds
        self._build_id_map(ids)
        edge_parent_pos, edge_child = self._resolve_parents(edge_parent, edge_child, edge_is_ctrl)

        # Compressed sparse rows: children of position p are
        # children[child_start[p]:child_start[p + 1]].
        remaining = array("I", bytes(4 * count))
        child_start = array("Q", bytes(8 * (count + 1)))
        for parent_pos, child_pos in zip(edge_parent_pos, edge_child):
            child_start[parent_pos + 1] += 1
            remaining[child_pos] += 1
        for p in range(count):
            child_start[p + 1] += child_start[p]
        fill = array("Q", child_start)
        children = array("I", bytes(4 * len(edge_child)))
        for parent_pos, child_pos in zip(edge_parent_pos, edge_child):
            children[fill[parent_pos]] = child_pos
            fill[parent_pos] += 1
        del fill, edge_parent, edge_parent_pos
        self._remaining, self._child_start, self._children = remaining, child_start, children
        self._check_acyclic()
        self.roots = sorted(ids[p] for p in range(count) if remaining[p] == 0)
        """Ids of the nodes with no parent, smallest first (a valid heap)."""
        self._file = open(source, "rb")
        self._block = (0, b"")

    def _build_id_map(self, ids: array[int]) -> None:
        """id -> position: a dense array when ids are (nearly) contiguous, else a dict.

        Duplicate ids are detected while filling it (no set of all ids is built).
        """
        count = len(ids)
        if count == 0:
            self._base, self._dense, self._sparse = 0, array("q"), None
            return
        low, high = min(ids), max(ids)
        if high - low + 1 <= 2 * count + 1024:
            dense = array("q", [-1]) * (high - low + 1)
            for position, node_id in enumerate(ids):
                index = node_id - low
                if dense[index] >= 0:
                    self._duplicate(node_id, dense[index], position)
                dense[index] = position
            self._base, self._dense, self._sparse = low, dense, None
        else:
            self._base, self._dense = 0, None
            sparse: dict[int, int] = {}
            for position, node_id in enumerate(ids):
                if node_id in sparse:
                    self._duplicate(node_id, sparse[node_id], position)
                sparse[node_id] = position
            self._sparse = sparse

    def _duplicate(self, node_id: int, first: int, second: int) -> None:
        raise TraceGraphError(f"{self.path}: duplicate node id {node_id} (byte offsets "
                              f"{self._offsets[first]} and {self._offsets[second]})")

    def _position(self, node_id: int) -> int:
        if self._dense is not None:
            index = node_id - self._base
            if 0 <= index < len(self._dense):
                position = self._dense[index]
                if position >= 0:
                    return position
            return -1
        return self._sparse.get(node_id, -1)  # type: ignore[union-attr]  # set when _dense is None

    def _resolve_parents(self, edge_parent: array[int], edge_child: array[int],
                         edge_is_ctrl: bytearray) -> tuple[array[int], array[int]]:
        """Map parent ids to positions; apply the missing-parent policy."""
        positions = array("I")
        kept_children = array("I")
        missing_data: list[tuple[int, int]] = []
        missing_ctrl: list[tuple[int, int]] = []
        for parent, child, is_ctrl in zip(edge_parent, edge_child, edge_is_ctrl):
            position = self._position(parent)
            if position < 0:
                (missing_ctrl if is_ctrl else missing_data).append((self._ids[child], parent))
                continue
            positions.append(position)
            kept_children.append(child)
        error, warning = missing_parent_problem(
            self.path, self.missing_parents, missing_data, missing_ctrl,
            lambda n: self._load_for_report(n).name)
        if error:
            raise error
        if warning:
            self.warnings.append(warning)
        return positions, kept_children

    def _load_for_report(self, node_id: int) -> NodeView:
        return self._load(self._position(node_id))

    def _check_acyclic(self) -> None:
        remaining = array("I", self._remaining)
        stack = [p for p in range(len(remaining)) if remaining[p] == 0]
        seen = 0
        child_start, children = self._child_start, self._children
        while stack:
            p = stack.pop()
            seen += 1
            for i in range(child_start[p], child_start[p + 1]):
                c = children[i]
                remaining[c] -= 1
                if remaining[c] == 0:
                    stack.append(c)
        if seen == len(remaining):
            return
        leftover = {self._ids[p] for p in range(len(remaining)) if remaining[p] > 0}

        def parents(node_id: int) -> list[int]:
            return [p for p in parents_of(self._load(self._position(node_id)).pb, self._use_ctrl)
                    if p != node_id and self._position(p) >= 0]  # self-dependencies are ignored

        raise cycle_error(self.path, find_cycle(leftover, parents), len(leftover), self._use_ctrl)

    # Bodies -------------------------------------------------------------------------------
    def _load(self, position: int) -> NodeView:
        start = self._offsets[position]
        if self._file is not None:
            # pread, not mmap: pages of a huge trace do not pile up in the process's memory. A
            # block of the nodes that follow comes with it (nodes are issued nearly in file
            # order): one read per block rather than per node, about 8 µs each
            length = self._lengths[position]
            block_start, block = self._block
            if not block_start <= start <= start + length <= block_start + len(block):
                block_start, block = start, os.pread(self._file.fileno(), max(length, READ_BLOCK), start)
                self._block = block_start, block
            data = block[start - block_start:start - block_start + length]
            if len(data) != length:
                raise TraceFormatError(self.path, start, f"node of {length} bytes runs past the end of the file "
                                                         "(the file shrank after it was indexed)")
        else:  # during indexing (cycle report) the file is not open yet
            with open(self._source_path(), "rb") as handle:
                handle.seek(start)
                data = handle.read(self._lengths[position])
        return NodeView(parse_node(data, self.path, start), data)

    def _source_path(self) -> str:
        return os.path.join(self._tmp_dir, "trace.et") if self._tmp_dir else self.path

    def view(self, position: int) -> NodeView:
        """The parsed body of the node at `position`, through the shared cache.

        The cache holds the `cache_nodes` bodies parsed most recently and forgets the oldest
        first: nodes are used around the time they become issuable, so recency of parsing is
        as good a guide as recency of use, and a hit costs one dict lookup."""
        cache = self._cache
        view = cache.get(position)
        if view is not None:
            return view
        view = self._load(position)
        cache[position] = view
        if len(cache) > self.cache_nodes:
            cache.popitem(last=False)
        return view

    def finished(self, position: int) -> None:
        """A rank finished the node at `position`: forget its parsed body, unless other ranks
        share this index and may still want it (the LRU bound then applies)."""
        if self.users == 1:
            self._cache.pop(position, None)

    @property
    def count(self) -> int:
        return len(self._ids)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tmp_dir is not None:
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
            self._tmp_dir = None
        self._cache.clear()

    def __del__(self) -> None:  # pragma: no cover - safety net for temp files
        try:
            self.close()
        except Exception:
            pass


class StreamingFeeder(GraphFeeder):
    """One rank's GraphFeeder over a `TraceIndex` (see module docstring).

    `StreamingFeeder(path, ...)` indexes the file itself; `StreamingFeeder(index=shared)` reads
    an index another rank opened (`TraceLibrary` does this for files with the same bytes).
    """

    __slots__ = ("_trace", "path", "metadata", "warnings", "_use_ctrl", "_remaining", "_finished",
                 "_issuable", "_ready", "pending", "_added", "_added_kind", "_added_remaining",
                 "_added_children", "_finished_added", "_closed")

    def __init__(self, path: str | os.PathLike[str] | None = None, cache_nodes: int = DEFAULT_CACHE_NODES,
                 missing_parents: str = "ignore-control", dependencies: str = "all",
                 index: TraceIndex | None = None):
        if index is None:
            if path is None:
                raise ValueError("give a trace path or an index")
            index = TraceIndex(path, cache_nodes, missing_parents, dependencies)
        index.users += 1
        self._trace = index
        self.path = index.path if path is None else str(path)
        self.metadata = index.metadata
        self.warnings = list(index.warnings)
        self._use_ctrl = index._use_ctrl
        self._remaining = array("I", index._remaining)
        self._finished = bytearray(index.count)
        self._issuable = IssuableHeap()
        # Positions that became issuable and were not handed out yet; moved into `_issuable`
        # only when the GraphFeeder methods ask (the engine takes them with pop_ready()).
        self._ready: list[int] = [index._position(node_id) for node_id in index.roots]
        self.pending = bool(self._ready)
        """False only when pop_ready() has nothing to return (an attribute: the engine reads it
        after every node)."""
        self._added: dict[int, NodeView] = {}      # add_node() overlay: id -> body
        self._added_kind: dict[int, int] = {}
        self._added_remaining: dict[int, int] = {}
        self._added_children: dict[int, list[int]] = {}
        self._finished_added: set[int] = set()
        self._closed = False

    def _position(self, node_id: int) -> int:
        return self._trace._position(node_id)

    def _flush(self) -> None:
        ids = self._trace._ids
        for position in self._ready:
            self._issuable.push(ids[position])
        self._ready = []

    def has_nodes_to_issue(self) -> bool:
        if self._ready:
            self._flush()
        return bool(self._issuable)

    def next_issuable_node(self) -> int | None:
        if self._ready:
            self._flush()
        node_id = self._issuable.pop()
        self.pending = bool(self._issuable)
        return node_id

    def push_back_issuable_node(self, node_id: int) -> None:
        self._issuable.push(node_id)
        self.pending = True

    def pop_ready(self) -> list[tuple[int, int]]:
        issuable = self._issuable
        self.pending = False
        if not self._ready and not issuable:
            return _NONE
        trace = self._trace
        kinds, ids = trace._kinds, trace._ids
        out = [(kinds[p], ids[p]) for p in self._ready]
        self._ready = []
        while issuable:      # pushed back, or added with add_node()
            node_id: int = issuable.pop()  # type: ignore[assignment]  # not None: the heap is not empty
            out.append((self.node_kind(node_id), node_id))
        return out

    def finish(self, node_id: int) -> list[tuple[int, int]]:
        trace = self._trace
        dense = trace._dense        # TraceIndex._position inlined here and in lookup_node: once per node
        if dense is not None:
            index = node_id - trace._base
            position = dense[index] if 0 <= index < len(dense) else -1
        else:
            position = trace._sparse.get(node_id, -1)  # type: ignore[union-attr]  # set when _dense is None
        if position < 0 or self._added_children:
            self.free_children(node_id)
            self.remove_node(node_id)
            return _NONE
        self._finished[position] = 1
        remaining, child_start = self._remaining, trace._child_start
        freed = _NONE
        for child in trace._children[child_start[position]:child_start[position + 1]]:
            left = remaining[child] - 1
            remaining[child] = left
            if left == 0:
                if freed is _NONE:
                    freed = []
                freed.append((trace._kinds[child], trace._ids[child]))
        trace.finished(position)
        return freed

    @property
    def num_nodes(self) -> int:
        return self._trace.count + len(self._added_kind)

    def add_node(self, node: pb.Node) -> None:
        node_id = node.id
        # _added_kind, not _added: remove_node() drops a body but the id stays known
        if self._position(node_id) >= 0 or node_id in self._added_kind:
            raise TraceGraphError(f"{self.path}: duplicate node id {node_id} ({node.name!r})")
        waiting = []
        for parent in parents_of(node, self._use_ctrl):
            if parent == node_id:
                continue
            position = self._position(parent)
            if position >= 0:
                if not self._finished[position]:
                    waiting.append(parent)
            elif parent in self._added_kind:
                if parent not in self._finished_added:
                    waiting.append(parent)
            else:
                raise TraceGraphError(
                    f"{self.path}: node {node_id} ({node.name!r}) depends on node {parent}, "
                    "which does not exist")
        self._added[node_id] = NodeView(node)
        self._added_kind[node_id] = node_kind(node)
        self._added_remaining[node_id] = len(waiting)
        for parent in waiting:
            self._added_children.setdefault(parent, []).append(node_id)
        if not waiting:
            self._issuable.push(node_id)
            self.pending = True

    def remove_node(self, node_id: int) -> None:
        position = self._position(node_id)
        if position >= 0:
            self._trace.finished(position)
        else:
            self._added.pop(node_id, None)

    def lookup_node(self, node_id: int) -> NodeView:
        trace = self._trace
        dense = trace._dense
        if dense is not None:
            index = node_id - trace._base
            position = dense[index] if 0 <= index < len(dense) else -1
        else:
            position = trace._sparse.get(node_id, -1)  # type: ignore[union-attr]  # set when _dense is None
        if position < 0:
            return self._added[node_id]
        view = trace._cache.get(position)
        return view if view is not None else trace.view(position)

    def node_kind(self, node_id: int) -> int:
        position = self._position(node_id)
        if position < 0:
            return self._added_kind[node_id]
        return self._trace._kinds[position]

    def free_children(self, node_id: int) -> list[int]:
        ready = []
        trace = self._trace
        position = trace._position(node_id)
        if position >= 0:
            self._finished[position] = 1
            remaining, children, ids = self._remaining, trace._children, trace._ids
            for i in range(trace._child_start[position], trace._child_start[position + 1]):
                child = children[i]
                left = remaining[child] - 1
                remaining[child] = left
                if left == 0:
                    self._ready.append(child)
                    ready.append(ids[child])
        else:
            self._finished_added.add(node_id)
        for child_id in self._added_children.pop(node_id, ()):
            self._added_remaining[child_id] -= 1
            if self._added_remaining[child_id] == 0:
                self._issuable.push(child_id)
                ready.append(child_id)
        if ready:
            self.pending = True
        return ready

    def pending_nodes(self) -> list[int]:
        ids = self._trace._ids
        pending = [ids[p] for p in range(len(ids)) if not self._finished[p]]
        pending.extend(n for n in self._added_kind if n not in self._finished_added)
        return pending

    @property
    def cached_nodes(self) -> int:
        return len(self._trace._cache)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._trace.users -= 1
        if self._trace.users <= 0:
            self._trace.close()


_NONE: list[tuple[int, int]] = []
"""An empty result shared by every call that has nothing to return (never appended to)."""
