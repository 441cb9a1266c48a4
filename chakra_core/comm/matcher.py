"""Collective matching: the k-th collective a rank issues in a group meets the k-th of every
other member there.

`CollectiveMatcher.join` is called as each rank issues a collective node. The first member to
issue the group's k-th collective opens it; every later member must agree on its type, size and
group, or the run stops with an error naming both nodes. Members of an uneven all-to-all
(comm_send_splits / comm_recv_splits) have sizes of their own; once all have joined, what each
sends each other must be what that one receives from it. A system layer keeps its own state in
a subclass of `OpenCollective` (the `make` factory) and closes the collective when it is done
with it. `chakra-sim validate` feeds the same matcher every rank's collectives in node-id order.
"""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

from chakra_core.comm.collectives import (RECV_SPLITS, SEND_SPLITS, CollectiveCall, Splits, collective_name,
                                         collective_root, describe)
from chakra_core.comm.groups import GroupRegistry
from chakra_core.errors import SimulationError
from chakra_core.et.attrs import NodeView


class OpenCollective:
    """One collective shared by the members of its group, from its first member's issue on."""

    __slots__ = ("group", "seq", "comm_type", "size", "members", "first_rank", "root", "nodes", "done", "splits")

    def __init__(self, group: str, seq: int, comm_type: int, size: int, members: tuple[int, ...],
                 first_rank: int, root: int):
        self.group, self.seq = group, seq
        self.comm_type, self.size, self.members = comm_type, size, members
        self.first_rank, self.root = first_rank, root
        self.nodes: dict[int, int] = {}                    # rank -> node id, as members join
        self.done: dict[int, Callable[[int], None]] = {}   # rank -> completion callback
        self.splits: dict[int, Splits] | None = None       # an uneven all-to-all's, rank -> its pieces

    def describe(self) -> str:
        return describe(self.comm_type, self.size, self.group, self.seq)

    def missing(self) -> list[int]:
        """Members that have not joined yet."""
        return [rank for rank in self.members if rank not in self.nodes]


C = TypeVar("C", bound=OpenCollective)


class CollectiveMatcher(Generic[C]):
    """Open collectives by (group, k), and each rank's count of collectives issued per group."""

    def __init__(self, groups: GroupRegistry, make: Callable[[str, int, int, int, tuple[int, ...], int, int], C],
                 warn: Callable[[str], None] | None = None):
        """`make(group, seq, comm_type, size, members, first_rank, root)` opens a collective;
        `warn` hears of all-to-all pieces recorded among another number of ranks."""
        self.groups = groups
        self.make = make
        self.warn = warn
        self._unmapped: set[str] = set()   # groups whose all-to-all pieces did not fit, warned once
        self.open: dict[tuple[str, int], C] = {}
        self.issued: list[dict[str, int]] = [{} for _ in range(groups.num_ranks)]
        """rank -> {group: collectives issued there}."""

    def join(self, rank: int, node: NodeView, call: CollectiveCall) -> C:
        """`rank` issues collective `node`: the collective it matches, opened if it is the first."""
        group = call.group
        members = self.groups.members(group, node, rank)
        if call.splits is not None and len(call.splits[0]) != len(members):
            call = self._even(call, members)
        counts = self.issued[rank]
        seq = counts.get(group, 0)
        counts[group] = seq + 1
        key = (group, seq)
        coll = self.open.get(key)
        if coll is None:
            root = collective_root(node, members, rank, call.comm_type)
            coll = self.open[key] = self.make(group, seq, call.comm_type, call.size, members, rank, root)
            if call.splits is not None:
                coll.splits = {}
        elif coll.comm_type != call.comm_type or (coll.splits is None) != (call.splits is None) \
                or (coll.size != call.size and coll.splits is None) \
                or (coll.members is not members and coll.members != members):
            raise mismatch(rank, node, call, coll)
        coll.nodes[rank] = node.id
        if coll.splits is not None and call.splits is not None:
            _join_splits(coll, rank, node, call.splits)
        return coll

    def _even(self, call: CollectiveCall, members: tuple[int, ...]) -> CollectiveCall:
        """An all-to-all whose pieces were recorded among another number of ranks (a trace of a
        larger job simulated on part of it): its comm_size split evenly, as without pieces."""
        if self.warn is not None and call.group not in self._unmapped:
            self._unmapped.add(call.group)
            where = f"group '{call.group}'" if call.group else "all ranks"
            self.warn(f"all-to-alls among {where} carry {len(call.splits[0]) if call.splits else 0} pieces "
                      f"({SEND_SPLITS}) but run among {len(members)} ranks here: their comm_size is split evenly")
        return call._replace(splits=None)

    def close(self, coll: C) -> None:
        """Forget a collective its system layer is done with."""
        del self.open[(coll.group, coll.seq)]


def _join_splits(coll: OpenCollective, rank: int, node: NodeView, splits: Splits) -> None:
    """Record a member's pieces of an uneven all-to-all; once every member has joined, the size
    every layer reads is the largest any member sends or receives, and each pair must agree."""
    assert coll.splits is not None
    n = len(coll.members)
    if len(splits[0]) != n or len(splits[1]) != n:
        raise SimulationError(f"rank {rank}, node {node.id} ({node.name!r}): an all-to-all among {n} ranks "
                              f"needs {n} send and {n} receive splits, not {len(splits[0])} and {len(splits[1])}")
    coll.splits[rank] = splits
    if len(coll.splits) < n:
        return
    index = {member: i for i, member in enumerate(coll.members)}
    for src in coll.members:
        for dst in coll.members:
            sent, received = coll.splits[src][0][index[dst]], coll.splits[dst][1][index[src]]
            if sent != received:
                raise SimulationError(
                    f"uneven all-to-all {coll.describe()}: rank {src} (node {coll.nodes[src]}) sends "
                    f"{sent:,} B to rank {dst}, but rank {dst} (node {coll.nodes[dst]}) receives {received:,} B "
                    f"from it ({SEND_SPLITS} / {RECV_SPLITS})")
    coll.size = max(max(sum(send), sum(recv)) for send, recv in coll.splits.values())


def mismatch(rank: int, node: NodeView, call: CollectiveCall, first: OpenCollective) -> SimulationError:
    """The error for a rank's collective that differs from the one its group's first member
    opened at the same position."""
    where = f"group {call.group!r}" if call.group else "all ranks"
    first_node = first.nodes[first.first_rank]
    uneven = ""
    if call.comm_type == first.comm_type and (call.splits is None) != (first.splits is None):
        uneven = (f" (one carries {SEND_SPLITS} / {RECV_SPLITS} and the other not: every member of an "
                  "uneven all-to-all needs its pieces)")
    return SimulationError(
        f"collectives do not match: rank {rank}'s node {node.id} ({node.name!r}) is "
        f"{collective_name(call.comm_type)} of {call.size} B, but rank {first.first_rank}'s matching "
        f"collective (node {first_node}, #{first.seq + 1} in {where}) is "
        f"{collective_name(first.comm_type)} of {first.size} B{uneven}")
