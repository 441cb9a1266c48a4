"""How communicators share a node's fabrics: each GPU's share of the NICs, and the operations
in flight on NVLink and on the NICs.

NIC share. DGX-class nodes are rail-optimised: each GPU drives the NIC(s) of its own rail
(profile `network.nics_per_node` NICs for the node's GPUs). A communicator with g of its
GPUs on a node therefore reaches the network through g / gpus-per-node of that node's NICs,
and its node with the fewest GPUs bounds its inter-node bandwidth (every node of a ring or tree
forwards the whole message; see `GroupShape`).

Contention. An operation (a collective, or a point-to-point message) runs on one fabric: NVLink
when all its GPUs share a node, the NICs otherwise (the slower fabric bounds it: a GPU's
NVLink moves 450 GB/s where its NIC moves 50 on the shipped H100 NDR profile). When it starts, its bandwidth term is
divided by 1 + the largest number of other operations in flight on that fabric at any of its
GPUs: a static fair share, fixed at its start and not revised when others start or finish.
Only operations that started strictly earlier and end strictly later count, so the answer
does not depend on the order in which events at the same instant run (it is the same folded
and unfolded).

Folded runs simulate one representative per class of equivalent ranks: an operation is
recorded at its members that are representatives, and looked up at each member's
representative. Equivalent ranks have the same operations in flight by symmetry, so the
counts are those of the unfolded run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

NVLINK, NIC = 0, 1
FABRICS = ("nvlink", "nic")


@dataclass(frozen=True)
class GroupShape:
    """Where a communicator's GPUs sit."""

    nodes: int
    """Nodes it spans."""
    local: int
    """Its GPUs on its node with the fewest of them (that node's NIC share bounds it)."""
    nic_share: float
    """The fraction of a node's NICs the group reaches on that node: local / gpus-per-node."""

    @property
    def fabric(self) -> int:
        return NIC if self.nodes > 1 else NVLINK


def group_shape(members: Sequence[int], gpus_per_node: int) -> GroupShape:
    """Nodes are filled in rank order, `gpus_per_node` to a node."""
    per_node: dict[int, int] = {}
    for rank in members:
        node = rank // gpus_per_node
        per_node[node] = per_node.get(node, 0) + 1
    local = min(per_node.values())
    return GroupShape(len(per_node), local, min(1.0, local / gpus_per_node))


class FabricLoad:
    """Operations in flight per fabric and GPU, as (start, end) in ns (see the module docstring)."""

    def __init__(self, num_ranks: int):
        self._ops: tuple[list[list[tuple[int, int]]], ...] = tuple(
            [[] for _ in range(num_ranks)] for _ in FABRICS)

    def others(self, fabric: int, ranks: Sequence[int], now: int) -> int:
        """The most operations in flight at `now` on `fabric` at any of `ranks`, counting those
        that started before `now` and end after it."""
        table = self._ops[fabric]
        most = 0
        for rank in ranks:
            ops = table[rank]
            if not ops:
                continue
            if any(end <= now for _, end in ops):   # finished: forget them
                ops[:] = [op for op in ops if op[1] > now]
            count = sum(1 for start, _ in ops if start < now)
            if count > most:
                most = count
        return most

    def in_flight(self, now: int) -> tuple[tuple[tuple[tuple[int, int], ...], ...], ...]:
        """Every fabric's and GPU's operations not over at `now`, as (start, end) relative to it."""
        return tuple(tuple(tuple(sorted((start - now, end - now) for start, end in ops if end > now)) for ops in table)
                     for table in self._ops)

    def add(self, fabric: int, ranks: Sequence[int], start: int, end: int) -> None:
        """An operation on `fabric` at `ranks` (with repeats: a folded message can stand for one
        sent and one received by the same representative) from `start` to `end`."""
        if end <= start:
            return
        table = self._ops[fabric]
        op = (start, end)
        for rank in ranks:
            table[rank].append(op)
