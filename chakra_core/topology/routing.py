"""Routes: dimension-order on multi-dimensional specs and tori, shortest paths with ECMP on graphs.

Dimension-order routing moves a message along dimension 0 to the
destination's coordinate, then dimension 1, ...; within a dimension, a ring
goes the shorter way (clockwise on ties), a switch goes through the slice's
switch, a fully connected group goes direct. This is ASTRA-sim's route for
one dimension, extended to several.

Generated fat-trees and rail-optimized clusters route arithmetically
(fabric.FabricRouter, no tables); the k-ary fat-tree gets there exactly the
routes described next.

On arbitrary graphs (files, dragonfly) messages take a shortest
path in hops, one of all the equal-cost shortest paths (ECMP): of the P
shortest paths from src to dst, the seq-th message of that pair (0, 1, ...)
takes path number (dst + seq) mod P. This is D-mod-k routing, what
InfiniBand subnet managers install on fat-trees (Zahavi, Johnson, Kerbyson
and Lang, "Optimized InfiniBand fat-tree routing for shift all-to-all
communication patterns", Concurrency and Computation: Practice and
Experience 22(2), 2010). On a full fat-tree it loads every link of a tier
equally under a uniform all-to-all and leaves every shift permutation
(dst = src + s) free of contention; successive messages of one pair, such as
a collective's chunks, go round all P paths. Measured on a k=16 fat-tree
(docs/networks.md): a hash of (src, dst, seq) balances neither exactly and
(src + dst + seq) mod P puts two messages on a link under most shifts;
S-mod-k, (src + seq) mod P, does as well as D-mod-k, which is kept as
InfiniBand's choice.

Path numbers map one to one onto paths. Paths are counted on the
shortest-path DAG towards dst, and a number is decoded hop by hop: at a
device whose next hops (in device order) start c_1, c_2, ... paths, numbers
are dealt round-robin, one to each next hop that still has paths left, and
the round number is the path number passed on. With equal counts this is
next hop = number mod m, number // m passed on: the destination's lowest
digits pick the uplink at the edge switch and the next digits the core, so
each downlink of the destination's pod carries a single destination's
traffic. Cut the other way (the first c_1 numbers to the first next hop,
...), all traffic entering a pod for one edge switch would come down
through the same aggregation switch.
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import Any, Collection

from chakra_core.errors import SimulationError
from chakra_core.topology.graph import Topology


class DimensionOrderRouter:
    def __init__(self, topo: Topology):
        self.topo = topo
        self.strides = []
        stride = 1
        for _, size, _, _ in topo.dims:
            self.strides.append(stride)
            stride *= size
        self._cache: dict[tuple[int, int], tuple[int, ...]] = {}

    def route(self, src: int, dst: int, flow: int = 0) -> tuple[int, ...]:
        key = (src, dst)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        topo, links = self.topo, []
        current = src
        for dim, (kind, size, _, _) in enumerate(topo.dims):
            stride = self.strides[dim]
            a, b = (current // stride) % size, (dst // stride) % size
            if a == b:
                continue
            target = current + (b - a) * stride
            if kind == "Ring":
                clockwise = (b - a) % size
                step = -1 if size - clockwise < clockwise else 1
                node = current
                for _ in range(min(clockwise, size - clockwise)):
                    coordinate = (node // stride) % size
                    nxt = node + (((coordinate + step) % size) - coordinate) * stride
                    links.append(topo.out[node][nxt])
                    node = nxt
            elif kind == "FullyConnected":
                links.append(topo.out[current][target])
            else:  # Switch
                base = current - a * stride
                switch = topo.switch_of[(dim, base)]
                links.append(topo.out[current][switch])
                links.append(topo.out[switch][target])
            current = target
        route = tuple(links)
        self._cache[key] = route
        return route

    def route_next(self, src: int, dst: int) -> tuple[int, ...]:
        """The route of the next message from src to dst: there is one route per pair."""
        return self.route(src, dst)


ROUTE_CACHE_LIMIT = 1 << 16
"""Routes kept for reuse; beyond this (e.g. all-to-all on 1,000+ NPUs) they are recomputed."""
_ARRIVED = (1, ())
"""The destination's own entry: one (empty) path onwards."""


def _deal(options: tuple[int, ...], counts: tuple[int, ...]) -> tuple[int, tuple[Any, ...]]:
    """A branching device's entry: (paths, blocks) for next hops `options` starting `counts` paths each.

    Path numbers are dealt round-robin over the next hops with paths left. A
    block covers the rounds in which the same next hops take part: (numbers
    in the block, those next hops, the round it starts at).
    """
    blocks, rounds = [], 0
    for level in sorted(set(counts)):
        active = tuple(o for o, c in zip(options, counts) if c > rounds)
        blocks.append(((level - rounds) * len(active), active, rounds))
        rounds = level
    return sum(counts), tuple(blocks)


class ShortestPathRouter:
    """Hop-count shortest paths, D-mod-k over all equal-cost paths; built per destination, lazily.

    Per destination it keeps one entry per device: the next hop (an int) where
    there is one, a shared (paths, blocks) entry where paths branch, None
    where dst cannot be reached. Entries with the same next hops and counts
    are one object, so a destination costs about a pointer per device (11 kB
    on a k=16 fat-tree's 1,344 devices).
    """

    def __init__(self, topo: Topology, failed: Collection[int] = ()):
        self.topo = topo
        self._routes: dict[tuple[int, int, int], tuple[int, ...]] = {}
        self._failed = frozenset(failed)
        """Links no route takes (`failed_links`): shortest paths are those of the remaining graph."""
        # incoming adjacency for reverse BFS from destinations
        self._in: list[list[int]] = [[] for _ in range(topo.devices)]
        for link, (src, dst) in enumerate(zip(topo.link_src, topo.link_dst)):
            if link not in self._failed:
                self._in[dst].append(src)
        self._hops: dict[int, list[Any]] = {}
        self._branches: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        # messages sent so far per (src, dst): a dict per source while it has few peers, then an
        # array over all NPUs (4 B each, wrapping after 2^32 messages) once a dict would be larger
        self._sent: list[dict[int, int] | array[int] | None] = [None] * topo.npus
        self._dense_after = max(topo.npus // 16, 1)

    def _build(self, dst: int) -> list[Any]:
        """Distances (reverse BFS), then path counts and next hops in order of increasing distance."""
        topo, out = self.topo, self.topo.out
        dist = [-1] * topo.devices
        dist[dst] = 0
        order = [dst]
        queue = deque(order)
        while queue:
            node = queue.popleft()
            for prev in self._in[node]:
                if dist[prev] < 0:
                    dist[prev] = dist[node] + 1
                    queue.append(prev)
                    order.append(prev)
        paths = [0] * topo.devices
        paths[dst] = 1
        hops: list[Any] = [None] * topo.devices
        hops[dst] = _ARRIVED
        branches = self._branches
        for node in order[1:]:
            want = dist[node] - 1
            if self._failed:
                failed, links = self._failed, out[node]
                options = tuple(sorted(n for n in links if dist[n] == want and links[n] not in failed))
            else:
                options = tuple(sorted(n for n in out[node] if dist[n] == want))
            if len(options) == 1:
                hops[node] = options[0]
                paths[node] = paths[options[0]]
                continue
            key = (options, tuple(paths[n] for n in options))
            entry = branches.get(key)
            if entry is None:
                entry = branches[key] = _deal(*key)
            hops[node] = entry
            paths[node] = entry[0]
        self._hops[dst] = hops
        return hops

    def route_next(self, src: int, dst: int) -> tuple[int, ...]:
        """The route of the next message from src to dst (counts it)."""
        sent = self._sent[src]
        if sent is None:
            sent = self._sent[src] = {}
        if sent.__class__ is dict:
            seq = sent.get(dst, 0)
            sent[dst] = seq + 1
            if len(sent) > self._dense_after:
                dense = self._sent[src] = array("I", [0]) * self.topo.npus
                for peer, count in sent.items():
                    dense[peer] = count
        else:
            seq = sent[dst]
            sent[dst] = (seq + 1) & 0xFFFFFFFF
        return self.route(src, dst, seq)

    def route(self, src: int, dst: int, seq: int = 0) -> tuple[int, ...]:
        """The links of the seq-th message (from 0) from src to dst: path (dst + seq) mod P."""
        if src == dst:
            return ()
        hops = self._hops.get(dst)
        if hops is None:
            hops = self._build(dst)
        entry = hops[src]
        if entry is None:
            failed = ""
            if self._failed:
                names = [self.topo.link_name(link) for link in sorted(self._failed)]
                failed = f" without its failed links ({', '.join(names[:8])}{' ...' if len(names) > 8 else ''})"
            raise SimulationError(
                f"network ({self.topo.source}): no path from NPU {src} to NPU {dst}; the topology "
                f"graph{failed} is disconnected between them")
        while entry.__class__ is int:     # a single next hop leads to as many paths as the node has
            entry = hops[entry]
        key = (src, dst, (dst + seq) % entry[0])
        cached = self._routes.get(key)
        if cached is None:
            cached = self._walk(hops, src, dst, key[2])
            if len(self._routes) < ROUTE_CACHE_LIMIT:
                self._routes[key] = cached
        return cached

    def _walk(self, hops: list[Any], src: int, dst: int, number: int) -> tuple[int, ...]:
        out, links, node = self.topo.out, [], src
        while node != dst:
            entry = hops[node]
            if entry.__class__ is int:
                nxt = entry
            else:
                for size, options, rounds in entry[1]:
                    if number < size:
                        break
                    number -= size
                width = len(options)
                nxt = options[number % width]
                number = rounds + number // width
            links.append(out[node][nxt])
            node = nxt
        return tuple(links)
