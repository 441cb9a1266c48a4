"""In-memory GraphFeeder: the whole trace is parsed up front.

The right choice for traces of up to a few million nodes: fastest lookups, and
the graph can be edited (add_node/remove_node) before or during a run.
"""

from __future__ import annotations

import os
from collections import defaultdict

from chakra_core.errors import TraceGraphError
from chakra_core.et.attrs import NodeView
from chakra_core.et.io import read_trace
from chakra_core.limits import NODE_PARENTS
from chakra_core.feeder.base import (GraphFeeder, IssuableHeap, cycle_error, find_cycle,
                                     missing_parent_problem, node_kind, parents_of, split_missing,
                                     use_control_deps)
from chakra_core.schema import pb


class InMemoryFeeder(GraphFeeder):
    """GraphFeeder over nodes held in memory."""

    def __init__(self, nodes: list[pb.Node], metadata: pb.GlobalMetadata | None = None,
                 path: str = "<memory>", missing_parents: str = "ignore-control",
                 dependencies: str = "all"):
        self.path = path
        self.missing_parents = missing_parents
        self._use_ctrl = use_control_deps(dependencies)
        self.warnings: list[str] = []
        self.metadata = metadata if metadata is not None else pb.GlobalMetadata()
        self._nodes: dict[int, NodeView] = {}
        self._kind: dict[int, int] = {}
        self._remaining: dict[int, int] = {}
        self._children: dict[int, list[int]] = defaultdict(list)
        self._finished: set[int] = set()
        self._issuable = IssuableHeap()
        self._build(nodes)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], missing_parents: str = "ignore-control",
                  dependencies: str = "all") -> "InMemoryFeeder":
        trace = read_trace(path)
        return cls(trace.nodes, trace.metadata, str(path), missing_parents, dependencies)

    # Construction -------------------------------------------------------------------
    def _build(self, nodes: list[pb.Node]) -> None:
        parents: dict[int, list[int]] = {}
        most_parents = NODE_PARENTS.value()
        for node in nodes:
            node_id = node.id
            if node_id in parents:
                raise TraceGraphError(
                    f"{self.path}: duplicate node id {node_id} "
                    f"({self._nodes[node_id].name!r} and {node.name!r})")
            parents[node_id] = [p for p in parents_of(node, self._use_ctrl, self.path, most_parents) if p != node_id]
            self._nodes[node_id] = NodeView(node)
            self._kind[node_id] = node_kind(node)
        missing_data: list[tuple[int, int]] = []
        missing_ctrl: list[tuple[int, int]] = []
        for node_id, plist in parents.items():
            if any(p not in parents for p in plist):
                data, ctrl = split_missing(self._nodes[node_id].pb, parents.__contains__, self._use_ctrl)
                missing_data += [(node_id, p) for p in data]
                missing_ctrl += [(node_id, p) for p in ctrl]
                parents[node_id] = [p for p in plist if p in parents]
        error, warning = missing_parent_problem(self.path, self.missing_parents, missing_data,
                                                missing_ctrl, lambda n: self._nodes[n].name)
        if error:
            raise error
        if warning:
            self.warnings.append(warning)
        for node_id, plist in parents.items():
            self._remaining[node_id] = len(plist)
            for parent in plist:
                self._children[parent].append(node_id)
        self._check_acyclic(parents)
        for node_id, count in self._remaining.items():
            if count == 0:
                self._issuable.push(node_id)

    def _check_acyclic(self, parents: dict[int, list[int]]) -> None:
        remaining = dict(self._remaining)
        stack = [n for n, c in remaining.items() if c == 0]
        seen = 0
        while stack:
            node_id = stack.pop()
            seen += 1
            for child in self._children.get(node_id, ()):
                remaining[child] -= 1
                if remaining[child] == 0:
                    stack.append(child)
        if seen != len(remaining):
            leftover = [n for n, c in remaining.items() if c > 0]
            raise cycle_error(self.path, find_cycle(leftover, parents.__getitem__), len(leftover),
                              self._use_ctrl)

    # GraphFeeder -----------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self._kind)

    def add_node(self, node: pb.Node) -> None:
        node_id = node.id
        if node_id in self._kind:
            raise TraceGraphError(f"{self.path}: duplicate node id {node_id} ({node.name!r})")
        plist = [p for p in parents_of(node, self._use_ctrl) if p != node_id]
        unknown = [p for p in plist if p not in self._kind]
        if unknown:
            raise TraceGraphError(
                f"{self.path}: node {node_id} ({node.name!r}) depends on node {unknown[0]}, "
                "which does not exist")
        self._nodes[node_id] = NodeView(node)
        self._kind[node_id] = node_kind(node)
        waiting = [p for p in plist if p not in self._finished]
        self._remaining[node_id] = len(waiting)
        for parent in waiting:
            self._children[parent].append(node_id)
        if not waiting:
            self._issuable.push(node_id)

    def remove_node(self, node_id: int) -> None:
        self._nodes.pop(node_id, None)

    def lookup_node(self, node_id: int) -> NodeView:
        return self._nodes[node_id]

    def node_kind(self, node_id: int) -> int:
        return self._kind[node_id]

    def free_children(self, node_id: int) -> list[int]:
        self._finished.add(node_id)
        ready = []
        remaining = self._remaining
        for child in self._children.pop(node_id, ()):
            left = remaining[child] - 1
            remaining[child] = left
            if left == 0:
                self._issuable.push(child)
                ready.append(child)
        return ready

    def pending_nodes(self) -> list[int]:
        return [n for n in self._kind if n not in self._finished]
