"""Routes: dimension-order on multi-dimensional specs and tori, shortest paths with ECMP on graphs.

Dimension-order routing moves a message along dimension 0 to the
destination's coordinate, then dimension 1, ...; within a dimension, a ring
goes the shorter way (clockwise on ties), a switch goes through the slice's
switch, a fully connected group goes direct. This is ASTRA-sim's route for
one dimension, extended to several.

On arbitrary graphs (files, fat-tree, dragonfly) messages take a shortest
path in hops; where several next hops are equally short (ECMP) the choice is
a deterministic hash of (source, destination, flow id, hop), so a run is
reproducible while different flows spread over the parallel paths.
"""

from __future__ import annotations

from collections import deque

from chakra_core.errors import SimulationError
from chakra_sim_network_congestion.topology import Topology


def _mix(*values: int) -> int:
    """A small deterministic integer hash (Python's hash() of ints would do, but say it explicitly)."""
    h = 0x9E3779B1
    for value in values:
        h = ((h ^ (value & 0xFFFFFFFF)) * 0x01000193) & 0xFFFFFFFF
        h ^= h >> 15
    return h


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


ECMP_VARIANTS = 16
"""Distinct ECMP choices per (source, destination): flows cycle through them."""
ROUTE_CACHE_LIMIT = 1 << 16
"""Routes kept for reuse; beyond this (e.g. all-to-all on 1,000+ NPUs) they are recomputed."""


class ShortestPathRouter:
    """Hop-count shortest paths with deterministic ECMP; distances computed per destination, lazily."""

    def __init__(self, topo: Topology):
        self.topo = topo
        self._routes: dict[tuple[int, int, int], tuple[int, ...]] = {}
        # incoming adjacency for reverse BFS from destinations
        self._in: list[list[int]] = [[] for _ in range(topo.devices)]
        for src, dst in zip(topo.link_src, topo.link_dst):
            self._in[dst].append(src)
        self._dist: dict[int, list[int]] = {}
        # per destination, per device: the next hop (an int) or the equal-cost next hops (a tuple)
        self._next: dict[int, list] = {}

    def _distances(self, dst: int) -> list[int]:
        dist = self._dist.get(dst)
        if dist is None:
            dist = [-1] * self.topo.devices
            dist[dst] = 0
            queue = deque([dst])
            while queue:
                node = queue.popleft()
                for prev in self._in[node]:
                    if dist[prev] < 0:
                        dist[prev] = dist[node] + 1
                        queue.append(prev)
            self._dist[dst] = dist
        return dist

    def route(self, src: int, dst: int, flow: int = 0) -> tuple[int, ...]:
        key = (src, dst, flow % ECMP_VARIANTS)
        cached = self._routes.get(key)
        if cached is None:
            cached = self._walk(src, dst, key[2])
            if len(self._routes) < ROUTE_CACHE_LIMIT:
                self._routes[key] = cached
        return cached

    def _walk(self, src: int, dst: int, flow: int) -> tuple[int, ...]:
        if src == dst:
            return ()
        dist = self._distances(dst)
        if dist[src] < 0:
            raise SimulationError(
                f"network ({self.topo.source}): no path from NPU {src} to NPU {dst}; the topology "
                "graph is disconnected between them")
        out, links, node, hop = self.topo.out, [], src, 0
        nexts = self._next.get(dst)
        if nexts is None:
            nexts = self._next[dst] = [None] * self.topo.devices
        while node != dst:
            choice = nexts[node]
            if choice is None:
                want = dist[node] - 1
                options = sorted(n for n in out[node] if dist[n] == want)
                choice = nexts[node] = options[0] if len(options) == 1 else tuple(options)
            if choice.__class__ is int:
                nxt = choice
            else:
                nxt = choice[_mix(src, dst, flow, hop) % len(choice)]
            links.append(out[node][nxt])
            node, hop = nxt, hop + 1
        return tuple(links)
