"""Collective matching: the k-th collective a rank issues in a group meets the k-th of every
other member there.

`CollectiveMatcher.join` is called as each rank issues a collective node. The first member to
issue the group's k-th collective opens it; every later member must agree on its type, size and
group, or the run stops with an error naming both nodes. A system layer keeps its own state in
a subclass of `OpenCollective` (the `make` factory) and closes the collective when it is done
with it. `chakra-sim validate` feeds the same matcher every rank's collectives in node-id order.
"""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

from chakra_core.comm.collectives import CollectiveCall, collective_name, collective_root, describe
from chakra_core.comm.groups import GroupRegistry
from chakra_core.errors import SimulationError
from chakra_core.et.attrs import NodeView


class OpenCollective:
    """One collective shared by the members of its group, from its first member's issue on."""

    __slots__ = ("group", "seq", "comm_type", "size", "members", "first_rank", "root", "nodes", "done")

    def __init__(self, group: str, seq: int, comm_type: int, size: int, members: tuple[int, ...],
                 first_rank: int, root: int):
        self.group, self.seq = group, seq
        self.comm_type, self.size, self.members = comm_type, size, members
        self.first_rank, self.root = first_rank, root
        self.nodes: dict[int, int] = {}                    # rank -> node id, as members join
        self.done: dict[int, Callable[[int], None]] = {}   # rank -> completion callback

    def describe(self) -> str:
        return describe(self.comm_type, self.size, self.group, self.seq)

    def missing(self) -> list[int]:
        """Members that have not joined yet."""
        return [rank for rank in self.members if rank not in self.nodes]


C = TypeVar("C", bound=OpenCollective)


class CollectiveMatcher(Generic[C]):
    """Open collectives by (group, k), and each rank's count of collectives issued per group."""

    def __init__(self, groups: GroupRegistry, make: Callable[[str, int, int, int, tuple[int, ...], int, int], C]):
        """`make(group, seq, comm_type, size, members, first_rank, root)` opens a collective."""
        self.groups = groups
        self.make = make
        self.open: dict[tuple[str, int], C] = {}
        self.issued: list[dict[str, int]] = [{} for _ in range(groups.num_ranks)]
        """rank -> {group: collectives issued there}."""

    def join(self, rank: int, node: NodeView, call: CollectiveCall) -> C:
        """`rank` issues collective `node`: the collective it matches, opened if it is the first."""
        group = call.group
        members = self.groups.members(group, node, rank)
        counts = self.issued[rank]
        seq = counts.get(group, 0)
        counts[group] = seq + 1
        key = (group, seq)
        coll = self.open.get(key)
        if coll is None:
            root = collective_root(node, members, rank, call.comm_type)
            coll = self.open[key] = self.make(group, seq, call.comm_type, call.size, members, rank, root)
        elif coll.comm_type != call.comm_type or coll.size != call.size or (coll.members is not members
                                                                             and coll.members != members):
            raise mismatch(rank, node, call, coll)
        coll.nodes[rank] = node.id
        return coll

    def close(self, coll: C) -> None:
        """Forget a collective its system layer is done with."""
        del self.open[(coll.group, coll.seq)]


def mismatch(rank: int, node: NodeView, call: CollectiveCall, first: OpenCollective) -> SimulationError:
    """The error for a rank's collective that differs from the one its group's first member
    opened at the same position."""
    where = f"group {call.group!r}" if call.group else "all ranks"
    first_node = first.nodes[first.first_rank]
    return SimulationError(
        f"collectives do not match: rank {rank}'s node {node.id} ({node.name!r}) is "
        f"{collective_name(call.comm_type)} of {call.size} B, but rank {first.first_rank}'s matching "
        f"collective (node {first_node}, #{first.seq + 1} in {where}) is "
        f"{collective_name(first.comm_type)} of {first.size} B")
