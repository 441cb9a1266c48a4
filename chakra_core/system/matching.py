"""What every system layer that matches collectives per communicator group and messages per
(src, dst, tag) shares: the built-in `native` layer and the `nccl` plugin.

A collective node's k-th issue in a group matches the k-th of every other member (type and
size must agree); `MatchingSystem` holds the groups, the per-group issue counters, the open
collectives per rank (for deadlock reports), the traffic counters and the point-to-point
matching, and answers the `SystemLayer` methods that only need those. A subclass sets them up
with `_setup_matching` and implements `issue_collective`.
"""

from __future__ import annotations

from typing import Any, Callable

from chakra_core.errors import SimulationError
from chakra_core.et.attrs import NodeView
from chakra_core.layers import LayerContext, SystemLayer
from chakra_core.schema import pb
from chakra_core.system.algorithms import ROOTED, SYMMETRIC, collective_name
from chakra_core.system.groups import GroupRegistry
from chakra_core.system.p2p import PointToPoint

COLLECTIVE_TYPES = SYMMETRIC | ROOTED | {pb.REDUCE_SCATTER_BLOCK, pb.BARRIER}
"""Collective types a system layer runs (a barrier as a 0-byte all-reduce)."""
_ROOT_ATTRS = ("root_rank", "root", "comm_root")


class MatchingSystem(SystemLayer):
    """Groups, matching and reporting shared by system layers (see the module docstring)."""

    def _setup_matching(self, context: LayerContext, network: Any, **p2p_options: Any) -> None:
        """`network`: what PointToPoint sends messages through (`npus_count`, `send`)."""
        n = context.num_ranks
        self.groups = GroupRegistry(n, context.extras.get("comm_groups"))
        self.issued: list[dict[str, int]] = [{} for _ in range(n)]
        self.open: list[dict[int, Any]] = [{} for _ in range(n)]
        """rank -> {node id: its open collective}, for deadlock reports."""
        self.bytes_sent = [0] * n
        self.bytes_received = [0] * n
        self.collectives_done = [0] * n
        self.p2p = PointToPoint(network, context.scheduler, context.warn, self.bytes_sent,
                                self.bytes_received, waiting=context.comm_waiting, **p2p_options)

    def _sequence(self, rank: int, group: str) -> int:
        """How many collectives `rank` issued in `group` before this one (the match key)."""
        seq = self.issued[rank].get(group, 0)
        self.issued[rank][group] = seq + 1
        return seq

    def issue_send(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        self.p2p.send(rank, node, done)

    def issue_recv(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        self.p2p.recv(rank, node, done)

    def define_groups(self, rank: int, node: NodeView) -> None:
        self.groups.define_from_metadata(rank, node)

    def finish(self) -> None:
        self.p2p.warn_unmatched()

    def rank_summary(self, rank: int) -> dict:
        return {"collectives": self.collectives_done[rank]}

    def traffic(self, rank: int) -> tuple[int, int]:
        return self.bytes_sent[rank], self.bytes_received[rank]


def collective_attrs(rank: int, node: NodeView, warn: Callable[[str], None]) -> tuple[int, int, str]:
    """(comm_type, comm_size, group) of a collective node, checked ("" is all ranks)."""
    comm_type = node.int("comm_type")
    size = node.int("comm_size", 0)
    if comm_type not in COLLECTIVE_TYPES:
        raise SimulationError(f"rank {rank}, node {node.id} ({node.name!r}): unknown collective "
                              f"type {comm_type}")
    if size < 0:
        raise SimulationError(f"rank {rank}, node {node.id}: negative comm_size {size}")
    if comm_type == pb.BARRIER and size:
        # A barrier synchronises and moves no data: it runs as a 0-byte all-reduce.
        warn(f"BARRIER nodes carry comm_size (e.g. rank {rank}, node {node.id}: {size} B); "
             "a barrier moves no data, so the size is ignored")
        size = 0
    group = node.str("pg_name", "")
    return comm_type, size, "" if group == "0" else group


def collective_root(node: NodeView, members: tuple[int, ...], rank: int, comm_type: int) -> int:
    """The root of a rooted collective (its root attribute, else the group's first rank); the
    first rank for the others."""
    if comm_type not in ROOTED:
        return members[0]
    for attr in _ROOT_ATTRS:
        if node.has(attr):
            root = node.int(attr)
            if root not in members:
                raise SimulationError(f"rank {rank}, node {node.id}: root {root} ({attr}) is not "
                                      f"a member of the collective's group {list(members)}")
            return root
    return members[0]


def collective_wait(node_id: int, what: str, missing: list[int]) -> str:
    """A deadlock report's line for an open collective: the ranks that never issued it, if any."""
    if not missing:
        return f"collective node {node_id}: {what} is in progress"
    shown = ", ".join(map(str, missing[:16])) + (" ..." if len(missing) > 16 else "")
    return f"collective node {node_id}: {what} waits for rank(s) {shown}, which never issued it"


def mismatch(rank: int, node: NodeView, comm_type: int, size: int, group: str, seq: int,
             first: tuple[int, int, int, int]) -> SimulationError:
    """The error for the seq-th collective of `group` on `rank` that differs from the first
    member's (rank, node id, comm_type, size)."""
    first_rank, first_node, first_type, first_size = first
    where = f"group {group!r}" if group else "all ranks"
    return SimulationError(
        f"collectives do not match: rank {rank}'s node {node.id} ({node.name!r}) is "
        f"{collective_name(comm_type)} of {size} B, but rank {first_rank}'s matching collective "
        f"(node {first_node}, #{seq + 1} in {where}) is {collective_name(first_type)} of {first_size} B")
