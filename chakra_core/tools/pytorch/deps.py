"""The dependency edges of the converted nodes: duplicates, self edges and cycles removed.

Edges are kept per node as two sets (control and data parents); a parent that is both is kept
as a data dependency only. Cycles are broken deterministically: a depth-first search in
execution direction (parent to child), starting from node ids in ascending order and taking
children in ascending order, drops every edge that closes a cycle (an edge to a node still on
the search path). Removing a DFS's back edges leaves an acyclic graph.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BrokenCycle:
    cycle: tuple[int, ...]
    """Node ids along the cycle, starting at the node whose dependency was dropped."""
    dropped: tuple[int, int]
    """(node, parent): the dependency removed."""


class Dependencies:
    def __init__(self) -> None:
        self.ctrl: list[set[int]] = []
        self.data: list[set[int]] = []

    def add_node(self) -> int:
        self.ctrl.append(set())
        self.data.append(set())
        return len(self.ctrl) - 1

    def control(self, node: int, parent: int | None) -> None:
        if parent is not None and parent != node:
            self.ctrl[node].add(parent)

    def datum(self, node: int, parent: int | None) -> None:
        if parent is not None and parent != node:
            self.data[node].add(parent)

    def parents(self, node: int) -> set[int]:
        return self.ctrl[node] | self.data[node]

    def final(self, node: int) -> tuple[list[int], list[int]]:
        """(control, data) parents of a node, sorted, a parent listed once."""
        data = sorted(self.data[node])
        return sorted(self.ctrl[node] - self.data[node]), data

    def edge_counts(self) -> tuple[int, int]:
        ctrl = sum(len(c - d) for c, d in zip(self.ctrl, self.data))
        return ctrl, sum(len(d) for d in self.data)

    def break_cycles(self) -> list[BrokenCycle]:
        count = len(self.ctrl)
        children: list[list[int]] = [[] for _ in range(count)]
        for node in range(count):
            for parent in self.parents(node):
                children[parent].append(node)
        for kids in children:
            kids.sort()
        state = bytearray(count)          # 0 unseen, 1 on the search path, 2 done
        depth: dict[int, int] = {}
        broken: list[BrokenCycle] = []
        for root in range(count):
            if state[root]:
                continue
            state[root] = 1
            path, cursor = [root], [0]
            depth[root] = 0
            while path:
                node = path[-1]
                kids = children[node]
                if cursor[-1] < len(kids):
                    kid = kids[cursor[-1]]
                    cursor[-1] += 1
                    if state[kid] == 0:
                        state[kid] = 1
                        depth[kid] = len(path)
                        path.append(kid)
                        cursor.append(0)
                    elif state[kid] == 1:   # kid depends, through the path, on itself
                        self.ctrl[kid].discard(node)
                        self.data[kid].discard(node)
                        broken.append(BrokenCycle(tuple(path[depth[kid]:]), (kid, node)))
                else:
                    state[node] = 2
                    path.pop()
                    cursor.pop()
        return broken
