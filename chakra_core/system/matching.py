"""What every system layer that matches collectives per communicator group and messages per
(src, dst, tag) shares: the built-in `native` layer and the `nccl` plugin.

`MatchingSystem` holds the groups, the collective matcher (chakra_core.comm.matcher), the open
collectives per rank (for deadlock reports), the traffic counters and the point-to-point
matching, and answers the `SystemLayer` methods that only need those. A subclass sets them up
with `_setup_matching` and implements `issue_collective`.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

from chakra_core.comm.collectives import CollectiveCall, read_collective
from chakra_core.comm.groups import GroupRegistry
from chakra_core.comm.matcher import CollectiveMatcher, OpenCollective
from chakra_core.comm.p2p import P2PNetwork, PointToPoint
from chakra_core.contract.inputs import LayerContext
from chakra_core.contract.layers import SystemLayer
from chakra_core.et.attrs import NodeView
from chakra_core.json_types import JsonObject

C = TypeVar("C", bound=OpenCollective)
_CALL = object()
"""NodeView.memo key of a collective node's CollectiveCall."""


class MatchingSystem(SystemLayer, Generic[C]):
    """Groups, matching and reporting shared by system layers (see the module docstring)."""

    uneven_all_to_all_refusal: str | None = None
    """Why the layer refuses all-to-alls with pieces of their own (comm_send_splits), for
    `chakra-sim validate`; None: it runs them."""

    def _setup_matching(self, context: LayerContext, network: P2PNetwork,
                        make: Callable[[str, int, int, int, tuple[int, ...], int, int], C],
                        **p2p_options: Any) -> None:
        """`network`: what PointToPoint sends messages through (`npus_count`, `send`); `make`
        opens a collective (see CollectiveMatcher)."""
        n = context.num_ranks
        self.groups = GroupRegistry(n, context.inputs.comm_groups)
        self.matcher: CollectiveMatcher[C] = CollectiveMatcher(self.groups, make, context.warn)
        self.open: list[dict[int, C]] = [{} for _ in range(n)]
        """rank -> {node id: its open collective}, for deadlock reports."""
        self.bytes_sent = [0] * n
        self.bytes_received = [0] * n
        self.collectives_done = [0] * n
        self.p2p = PointToPoint(network, context.scheduler, context.warn, self.bytes_sent,
                                self.bytes_received, waiting=context.comm_waiting, **p2p_options)

    @classmethod
    def collective_call(cls, rank: int, node: NodeView, warn: Callable[[str], None]) -> CollectiveCall:
        """How a collective node is read (what `chakra-sim validate` matches)."""
        return read_collective(rank, node, warn)

    def _join(self, rank: int, node: NodeView) -> C:
        """`rank` issues collective `node`: the collective it matches (its reading kept in the
        node's memo, which ranks with identical traces share)."""
        memo = node.memo
        call = memo.get(_CALL)
        if call is None:
            call = memo[_CALL] = read_collective(rank, node, self.context.warn)
        return self.matcher.join(rank, node, call)

    def issue_send(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        self.p2p.send(rank, node, done)

    def issue_recv(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        self.p2p.recv(rank, node, done)

    def define_groups(self, rank: int, node: NodeView) -> None:
        self.groups.define_from_metadata(rank, node)

    def finish(self) -> None:
        self.p2p.warn_unmatched()

    def rank_summary(self, rank: int) -> JsonObject:
        return {"collectives": self.collectives_done[rank]}

    def statistics_snapshot(self) -> object:
        return list(self.bytes_sent), list(self.bytes_received), list(self.collectives_done)

    def advance_statistics(self, periods: int, before: object, after: object) -> None:
        assert isinstance(before, tuple) and isinstance(after, tuple)
        for counts, first, second in zip((self.bytes_sent, self.bytes_received, self.collectives_done), before, after):
            for rank, (a, b) in enumerate(zip(first, second)):
                if a != b:
                    counts[rank] += periods * (b - a)

    def traffic(self, rank: int) -> tuple[int, int]:
        return self.bytes_sent[rank], self.bytes_received[rank]
