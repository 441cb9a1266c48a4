"""The GraphFeeder interface (Chakra paper, section "ET feeder"), in Python names.

A feeder owns one rank's dependency graph and hands out nodes whose parents
have all finished. Data and control dependencies are both honoured (a parent
listed in both counts once). The simulator never walks the graph itself:

    while feeder.has_nodes_to_issue():
        node_id = feeder.next_issuable_node()     # smallest id first
        node = feeder.lookup_node(node_id)        # NodeView
        ... issue it; if it cannot run yet: feeder.push_back_issuable_node(node_id)
    ... when it finishes:
    feeder.free_children(node_id)                 # its children may become issuable
    feeder.remove_node(node_id)                   # drop it from memory

| Chakra C++ ETFeeder        | here                        |
|----------------------------|-----------------------------|
| addNode                    | add_node                    |
| removeNode                 | remove_node                 |
| hasNodesToIssue            | has_nodes_to_issue          |
| getNextIssuableNode        | next_issuable_node (an id)  |
| pushBackIssuableNode       | push_back_issuable_node     |
| lookupNode                 | lookup_node                 |
| freeChildrenNodes          | free_children               |

Implementations check the graph when they open a trace and raise
`TraceGraphError` for duplicate ids, a dependency on a node that does not
exist, and dependency cycles (naming the node ids on the cycle).
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from typing import Callable, Iterable

from chakra_core.errors import TraceGraphError
from chakra_core.et.attrs import NodeView
from chakra_core.limits import NODE_PARENTS
from chakra_core.schema import pb

CPU_FLAG = 0x80
"""Bit set in a node kind when the node is a CPU operation (`is_cpu_op`)."""


_CPU_OP_NAME = b"is_cpu_op"
_NOT_CPU_OP = pb.Node(attr=[pb.AttributeProto(name="is_cpu_op", bool_val=False)]).SerializeToString()
"""A Node's `is_cpu_op: false` attribute as the wire has it (its field tag and length included)."""


def node_kind(node: pb.Node, body: bytes | None = None) -> int:
    """NodeType value, with CPU_FLAG set when the node says `is_cpu_op`; cheap enough for indexing.

    Reads the flag as `NodeView.is_cpu_op` does: the last attribute of that name wins, and a
    string is true only for "true"/"1" (so the kind and the node body never disagree).
    `body`, the node's bytes, answers most nodes without walking their attributes (about 6 µs a
    node): with the name nowhere in it, or once and as a whole `is_cpu_op: false` attribute,
    the node is no CPU operation.
    """
    if body is not None:
        named = body.count(_CPU_OP_NAME)
        if named == 0 or (named == 1 and _NOT_CPU_OP in body):
            return node.type
    cpu = False
    for attr in node.attr:
        if attr.name == "is_cpu_op":
            which = attr.WhichOneof("value")
            if which == "string_val":
                cpu = attr.string_val.lower() in ("true", "1")
            else:
                cpu = which is not None and bool(getattr(attr, which))
    return node.type | CPU_FLAG if cpu else node.type


DEPENDENCY_MODES = ("all", "data")
"""Which dependencies a feeder honours: `all` (data and control, the default) or
`data` only, as MLCommons Chakra's C++ feeder and ASTRA-sim do. Old converter
output has control edges that form cycles between a CPU op and its GPU kernel;
such traces run with `data`."""


def use_control_deps(dependencies: str) -> bool:
    """Validate a dependency mode; True when control dependencies are honoured."""
    if dependencies not in DEPENDENCY_MODES:
        raise ValueError(f"dependencies must be one of {', '.join(DEPENDENCY_MODES)}, not {dependencies!r}")
    return dependencies == "all"


def parents_of(node: pb.Node, use_ctrl: bool = True, path: str = "<trace>", most: int | None = None) -> list[int]:
    """Distinct parents (data then control dependencies), in trace order; a TraceGraphError
    naming the node (in `path`) when it lists more than `limits.NODE_PARENTS` (`most`: its
    value, read by the caller once per trace)."""
    deps = list(node.data_deps)      # (each read of a repeated field makes a new wrapper)
    ctrl = node.ctrl_deps if use_ctrl else ()
    listed = len(deps) + len(ctrl)
    if listed > (NODE_PARENTS.value() if most is None else most):
        raise TraceGraphError(f"{path}: node {node.id} ({node.name!r}) lists {listed:,} parents; "
                              f"{NODE_PARENTS.hint()}")
    if ctrl:
        seen = set(deps)
        deps.extend(d for d in ctrl if d not in seen)
        if len(deps) != len(set(deps)):
            deps = list(dict.fromkeys(deps))
    elif len(deps) > 1 and len(deps) != len(set(deps)):
        deps = list(dict.fromkeys(deps))
    return deps


MISSING_PARENT_POLICIES = ("ignore-control", "error")
"""How to treat a dependency on a node id that is not in the trace.

`ignore-control` (default): a missing *control* parent is dropped with a
warning; converters remove nodes such as the profiler's process root while
keeping edges to them (Chakra's own feeder test trace has 1,277 such edges).
A missing *data* parent is always an error. `error`: both are errors.
"""


def split_missing(node: pb.Node, known: Callable[[int], bool], use_ctrl: bool = True) -> tuple[list[int], list[int]]:
    """(missing data parents, missing control parents) of a node; `known(id)` tells existence."""
    node_id = node.id
    data = [d for d in node.data_deps if d != node_id and not known(d)]
    if not use_ctrl:
        return data, []
    data_deps = set(node.data_deps)   # `in` on the repeated field is linear
    ctrl = [d for d in node.ctrl_deps if d != node_id and not known(d) and d not in data_deps]
    return data, ctrl


def missing_parent_problem(path: str, policy: str, missing_data: list[tuple[int, int]],
                           missing_ctrl: list[tuple[int, int]],
                           names: Callable[[int], str]) -> tuple[TraceGraphError | None, str | None]:
    """Turn missing-parent findings into (error to raise, warning to record) per policy.

    `missing_*` are (node id, parent id) pairs; `names(node_id)` gives a node's name.
    """
    if policy not in MISSING_PARENT_POLICIES:
        raise ValueError(f"missing_parents must be one of {', '.join(MISSING_PARENT_POLICIES)}")
    fatal = list(missing_data) + (list(missing_ctrl) if policy == "error" else [])
    if fatal:
        shown = ", ".join(f"node {n} ({names(n)!r}) depends on node {p}" for n, p in fatal[:5])
        more = f" and {len(fatal) - 5} more" if len(fatal) > 5 else ""
        hint = "" if missing_data else " (set workload.missing_parents: ignore-control to drop such control dependencies)"
        return TraceGraphError(
            f"{path}: dependency on a node that does not exist: {shown}{more}{hint}"), None
    if missing_ctrl:
        parents = {p for _, p in missing_ctrl}
        n, p = missing_ctrl[0]
        return None, (f"{path}: ignored {len(missing_ctrl)} control dependencies on {len(parents)} "
                      f"node id(s) not in the trace (e.g. node {n} -> {p})")
    return None, None


class GraphFeeder(ABC):
    """Hands out a rank's nodes as their dependencies resolve (see module docstring)."""

    path: str
    metadata: pb.GlobalMetadata
    warnings: list[str]

    @property
    @abstractmethod
    def num_nodes(self) -> int:
        """Number of nodes in the trace (including added ones)."""

    @abstractmethod
    def add_node(self, node: pb.Node) -> None:
        """Add a node; it becomes issuable once every parent it names has finished."""

    @abstractmethod
    def remove_node(self, node_id: int) -> None:
        """Forget a finished node's body (its id stays known for dependency checks)."""

    # Implementations keep their issuable nodes in `self._issuable` (an IssuableHeap).
    _issuable: "IssuableHeap"

    def has_nodes_to_issue(self) -> bool:
        """True while some node has all its parents finished and has not been handed out."""
        return bool(self._issuable)

    def next_issuable_node(self) -> int | None:
        """Pop the smallest issuable node id (None if there is none)."""
        return self._issuable.pop()

    def push_back_issuable_node(self, node_id: int) -> None:
        """Return a node handed out by next_issuable_node that could not be issued yet."""
        self._issuable.push(node_id)

    @abstractmethod
    def lookup_node(self, node_id: int) -> NodeView:
        """The node's body (raises KeyError for an unknown id)."""

    @abstractmethod
    def free_children(self, node_id: int) -> list[int]:
        """Mark a node finished; return the children that became issuable."""

    @abstractmethod
    def node_kind(self, node_id: int) -> int:
        """NodeType value of a node, | CPU_FLAG for CPU compute; no body load needed."""

    # The engine's fast path: one call per batch instead of three per node. Implementations may
    # override both; these defaults are built on the methods above.
    pending = True
    """False only when pop_ready() would return nothing (an implementation that tracks it sets it;
    True makes the engine ask)."""

    def pop_ready(self) -> list[tuple[int, int]]:
        """(kind, id) of every issuable node not handed out yet, which are then handed out
        (as repeated next_issuable_node() calls would, but in no particular order)."""
        out: list[tuple[int, int]] = []
        while self.has_nodes_to_issue():
            node_id: int = self.next_issuable_node()  # type: ignore[assignment]  # not None: has_nodes_to_issue()
            out.append((self.node_kind(node_id), node_id))
        return out

    def finish(self, node_id: int) -> list[tuple[int, int]]:
        """A node finished: `free_children` and `remove_node` in one call. Returns the (kind, id)
        of children it made issuable that it hands out at once (they are not handed out again);
        the default hands out none, leaving them for `pop_ready`."""
        self.free_children(node_id)
        self.remove_node(node_id)
        return []

    def pending_nodes(self) -> Iterable[int]:
        """Ids of nodes not yet finished (for deadlock reports); may be expensive."""
        return ()

    def close(self) -> None:
        """Release files and caches."""


class IssuableHeap:
    """Min-heap of issuable node ids with O(1) membership (push-backs are idempotent)."""

    __slots__ = ("_heap", "_members")

    def __init__(self) -> None:
        self._heap: list[int] = []
        self._members: set[int] = set()

    def push(self, node_id: int) -> None:
        if node_id not in self._members:
            self._members.add(node_id)
            heapq.heappush(self._heap, node_id)

    def pop(self) -> int | None:
        if not self._heap:
            return None
        node_id = heapq.heappop(self._heap)
        self._members.discard(node_id)
        return node_id

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __len__(self) -> int:
        return len(self._heap)


def topological_positions(parents: list[tuple[int, ...]]) -> tuple[list[int], list[int]]:
    """Kahn's algorithm over positions 0..n-1, where `parents[i]` holds the positions of i's
    parents; among ready nodes the smallest position (file order) comes first. Returns (the
    order, the positions never reached: on a cycle or behind one)."""
    waiting = [len(known) for known in parents]
    children: list[list[int]] = [[] for _ in parents]
    for child, known in enumerate(parents):
        for parent in known:
            children[parent].append(child)
    ready = [i for i, count in enumerate(waiting) if not count]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for child in children[i]:
            waiting[child] -= 1
            if not waiting[child]:
                heapq.heappush(ready, child)
    return order, [i for i, count in enumerate(waiting) if count]


def find_cycle(candidates: Iterable[int], parents: Callable[[int], Iterable[int]]) -> list[int]:
    """Return one dependency cycle among `candidates` (ids left over by Kahn's algorithm).

    `parents(node_id)` gives a node's parent ids. Every leftover node has a
    leftover parent, so walking parents from any of them must revisit a node.
    """
    remaining = set(candidates)
    start = next(iter(sorted(remaining)))
    order: dict[int, int] = {}
    path: list[int] = []
    node = start
    while node not in order:
        order[node] = len(path)
        path.append(node)
        node = next(p for p in parents(node) if p in remaining)
    cycle = path[order[node]:]
    cycle.reverse()  # parent -> child order reads as "a must finish before b"
    return cycle


def cycle_error(path: str, cycle: list[int], leftover: int, use_ctrl: bool = True) -> TraceGraphError:
    chain = " -> ".join(str(n) for n in cycle + cycle[:1])
    hint = (" (if the cycle goes through control dependencies, set workload.dependencies: data"
            " to honour data dependencies only, as Chakra's C++ feeder does)") if use_ctrl else ""
    return TraceGraphError(
        f"{path}: dependency cycle among node ids {chain} "
        f"({leftover} node(s) can never be issued; each arrow reads 'must finish before'){hint}")
