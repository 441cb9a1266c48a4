"""What NCCL's algorithms move between nodes, as flows on the network layer.

With a `network:` section the `nccl` layer sends the inter-node traffic of every collective and
message through the network layer, so that communicators running at once (data- and pipeline-
parallel traffic, other jobs' stages) share its links as the network's model says, and its
per-link statistics show them. Traffic inside a node stays on NVLink, timed by the layer.

Each operation is one set of flows that start together, one per NIC path it uses; a flow
carries every byte its path moves over the whole operation (a ring step uses the same paths as
every other step, so the sum is what the links carry):

- **ring** (NCCL `src/graph/rings.cc`: one ring through the nodes in rank order, entering and
  leaving each node through its GPUs' NICs): the edge from node k to node k+1 carries what each
  rank of a ring sends (all-reduce `2(n-1)/n x S`, all-gather and reduce-scatter `(n-1)/n` of
  the gathered or scattered buffer), split evenly over the `g` GPUs the group has on its node
  with the fewest: the l-th GPU of node k sends to the l-th of node k+1 (same rail);
- **broadcast / reduce**: a chain of the nodes from (to) the root's, `S` on every edge;
- **tree, NVLS-tree** (NCCL `src/graph/trees.cc` ncclGetDtree: a binary tree over the nodes and
  its mirror, or its shift for an odd count): each tree carries half the buffer up (reduce)
  and down (broadcast) each of its edges;
- **all-to-all** (grouped send/receive): `S/n` from every member to every member on another node;
- **gather / scatter**: `S` between the root and every member on another node;
- **send / receive**: the message, when its ends are on different nodes.

Folded runs (only representatives issue nodes): an operation stands for one per group its
representative's class mates use in its place; the flows of all of them are sent, so the
network carries the whole job's traffic (`SystemLayer.mirrors_folded_traffic`). They must all
finish at the same instant, which folding assumes; `finished` reports the groups' times for
the layer to check.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from chakra_core import NetworkModel, Scheduler, pb

Splits = tuple[tuple[int, ...], tuple[int, ...]]
"""An uneven all-to-all member's bytes to and from each member (comm_send_splits / comm_recv_splits)."""

Flow = tuple[int, int, int]
"""(source rank, destination rank, bytes)."""


def by_node(members: Sequence[int], gpus_per_node: int, first: int | None = None) -> list[list[int]]:
    """The members per node, nodes in rank order (rotated to start at `first`'s node)."""
    nodes: dict[int, list[int]] = {}
    for rank in members:
        nodes.setdefault(rank // gpus_per_node, []).append(rank)
    ordered = [nodes[node] for node in sorted(nodes)]
    start = next((i for i, ranks in enumerate(ordered) if first in ranks), 0)   # no such rank: node order
    ordered = ordered[start:] + ordered[:start]
    return ordered


def _split(nbytes: int, parts: int) -> list[int]:
    """`nbytes` over `parts` NICs, the remainder to the first ones (bytes are conserved)."""
    base, extra = divmod(nbytes, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _edges(nodes: list[list[int]], edges: list[tuple[int, int]], nbytes: int) -> list[Flow]:
    """`nbytes` over each node edge, split over the NICs of the GPUs both ends have (the l-th GPU
    of one node to the l-th of the other: on a rail-optimised network, the same rail)."""
    flows = []
    for a, b in edges:
        width = min(len(nodes[a]), len(nodes[b]))
        for slot, share in enumerate(_split(nbytes, width)):
            if share:
                flows.append((nodes[a][slot], nodes[b][slot], share))
    return flows


def btree_parent(nranks: int, rank: int) -> int:
    """The parent of `rank` in NCCL's binary tree of `nranks` (-1 for the root, rank 0)."""
    if rank == 0:
        return -1
    bit = 1
    while bit < nranks and not bit & rank:
        bit <<= 1
    up = (rank ^ bit) | (bit << 1)
    return up if up < nranks else rank ^ bit


def dtree_parents(nranks: int) -> tuple[list[int], list[int]]:
    """Each node's parent in NCCL's two trees: the binary tree, and its mirror (even count) or
    its shift by one (odd count)."""
    first = [btree_parent(nranks, rank) for rank in range(nranks)]
    if nranks % 2:
        shifted = [btree_parent(nranks, (rank - 1) % nranks) for rank in range(nranks)]
        second = [-1 if up == -1 else (up + 1) % nranks for up in shifted]
    else:
        mirrored = [btree_parent(nranks, nranks - 1 - rank) for rank in range(nranks)]
        second = [-1 if up == -1 else nranks - 1 - up for up in mirrored]
    return first, second


def collective_flows(comm_type: int, algorithm: str, members: Sequence[int], root: int, nbytes: int,
                     per_rank: int, gpus_per_node: int, splits: Mapping[int, Splits] | None = None) -> list[Flow]:
    """The inter-node flows of one collective (see the module docstring). `nbytes` is the
    buffer NCCL counts (an all-gather's output), `per_rank` what each rank of a ring sends;
    `splits`, an uneven all-to-all's pieces per member (each sender's own)."""
    nodes = by_node(members, gpus_per_node)
    count = len(nodes)
    if count < 2 or nbytes <= 0:
        return []
    if comm_type == pb.ALL_TO_ALL and splits is not None:
        return [(src, dst, splits[src][0][j]) for src in members for j, dst in enumerate(members)
                if splits[src][0][j] and src // gpus_per_node != dst // gpus_per_node]
    if comm_type == pb.ALL_TO_ALL:
        share = nbytes // len(members)
        return [(src, dst, share) for src in members for dst in members
                if share and src // gpus_per_node != dst // gpus_per_node]
    if comm_type in (pb.GATHER, pb.SCATTER):
        remote = [rank for rank in members if rank // gpus_per_node != root // gpus_per_node]
        if comm_type == pb.GATHER:
            return [(rank, root, nbytes) for rank in remote]
        return [(root, rank, nbytes) for rank in remote]
    if comm_type in (pb.BROADCAST, pb.REDUCE):
        chain = by_node(members, gpus_per_node, first=root)
        edges = [(k, k + 1) for k in range(count - 1)]
        if comm_type == pb.REDUCE:   # towards the root: the chain run backwards
            edges = [(k + 1, k) for k in range(count - 1)]
        return _edges(chain, edges, nbytes)
    if algorithm in ("tree", "nvls_tree"):
        flows = []
        for parents, half in zip(dtree_parents(count), _split(nbytes, 2)):
            links = [(k, up) for k, up in enumerate(parents) if up >= 0]
            flows += _edges(nodes, links, half)                          # reduce, up the tree
            flows += _edges(nodes, [(up, k) for k, up in links], half)   # broadcast, down
        return flows
    return _edges(nodes, [(k, (k + 1) % count) for k in range(count)], per_rank)


class NetworkTraffic:
    """Sends sets of flows and reports when each set's last byte got through.

    NCCL's latency already counts each hop across the network, so a flow counts as through when
    it arrives less its path's latency on an idle network (`message_delay(src, dst, 0)`, where
    the network offers it): the network adds only what its bandwidth and sharing cost."""

    def __init__(self, network: NetworkModel, scheduler: Scheduler):
        self.network = network
        self.scheduler = scheduler
        self._wire: dict[tuple[int, int], int] = {}
        delay = getattr(network, "message_delay", None)
        self._delay: Callable[[int, int, int], int] | None = delay if callable(delay) else None

    def run(self, groups: Sequence[Sequence[Flow]], done: Callable[[list[int]], None]) -> None:
        """Send every group's flows now; `done(finishes)` once all are through, with the instant
        each group's last flow got through (now, for a group without flows)."""
        now = self.scheduler.now
        state: list[Any] = [sum(map(len, groups)), [now] * len(groups), done]
        if not state[0]:
            self.scheduler.schedule(0, self._finish, state)
            return
        send, wire = self.network.send, self._wire_ns
        for index, flows in enumerate(groups):
            for src, dst, size in flows:
                send(src, dst, size, self._arrived, (state, index, wire(src, dst)))

    def _wire_ns(self, src: int, dst: int) -> int:
        if self._delay is None:
            return 0
        key = (src, dst)
        known = self._wire.get(key)
        if known is None:
            known = self._wire[key] = self._delay(src, dst, 0)
        return known

    def _arrived(self, arg: tuple[list[Any], int, int]) -> None:
        state, index, wire = arg
        finishes = state[1]
        through = self.scheduler.now - wire
        if through > finishes[index]:
            finishes[index] = through
        state[0] -= 1
        if not state[0]:
            self._finish(state)

    @staticmethod
    def _finish(state: list[Any]) -> None:
        state[2](state[1])
