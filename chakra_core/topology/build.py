"""A network as a layer's settings describe it, built: its topology (ASTRA-sim's lists, a
generator or a file), its failed and degraded links, and the router that fits it. Any network
layer may use it (the congestion and ns-3 plugins do), so backends never import each other."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from chakra_core.errors import ChakraSimError, ManifestError, SimulationError
from chakra_core.topology.fabric import FabricRouter
from chakra_core.topology.files import from_file
from chakra_core.topology.graph import Topology, clos_fat_tree, dragonfly, fat_tree, from_dims, rail_optimized
from chakra_core.topology.routing import DimensionOrderRouter, ShortestPathRouter
from chakra_core.topology.shapes import DegradedLink, Generator

Router = DimensionOrderRouter | ShortestPathRouter | FabricRouter
Problems = list[tuple[tuple[str | int, ...], str]]


@dataclass(frozen=True)
class NetworkSource:
    """Where a network comes from: ASTRA-sim's four lists, a generator or a topology file (one of
    them, as the layer's settings validated), and its faults."""

    topology: Sequence[str] | None = None
    npus_count: Sequence[int] | None = None
    bandwidth: Sequence[float] | None = None
    latency: Sequence[float] | None = None
    generator: Generator | None = None
    topology_file: str | None = None
    failed_links: Sequence[str] = ()
    degraded_links: Sequence[DegradedLink] = field(default_factory=tuple)


@dataclass
class BuiltNetwork:
    topo: Topology
    """Degraded links carry their reduced bandwidth."""
    router: Router
    failed: frozenset[int]
    degraded: list[tuple[int, float]]
    """(link, bandwidth factor) pairs."""


def build_network(source: NetworkSource, base_dir: Path) -> BuiltNetwork:
    """The topology, its faults applied, and its router: dimension order on ASTRA-sim's lists and
    tori, the fabric's arithmetic routes on fat-trees and rail-optimized clusters, shortest paths
    otherwise. A failed or degraded link the topology lacks is a ManifestError under `network`."""
    topo = build_topology(source, base_dir)
    failed, degraded, problems = resolve_faults(topo, source)
    if problems:
        raise ManifestError([("network" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc), why)
                             for loc, why in problems])
    for link, factor in degraded:
        topo.link_bw[link] *= factor
    router: Router
    if topo.dims:
        router = DimensionOrderRouter(topo)
    elif topo.fabric is not None:
        router = FabricRouter(topo, failed)
    else:
        router = ShortestPathRouter(topo, failed)
    return BuiltNetwork(topo, router, failed, degraded)


def build_topology(source: NetworkSource, base_dir: Path) -> Topology:
    if source.topology is not None:
        # validated with the settings: the four lists come together
        assert source.npus_count is not None and source.bandwidth is not None and source.latency is not None
        return from_dims(source.topology, source.npus_count, source.bandwidth, source.latency)
    if source.topology_file is not None:
        path = Path(source.topology_file)
        return from_file(path if path.is_absolute() else base_dir / path)
    gen = source.generator
    assert gen is not None   # validated with the settings: exactly one source
    try:
        if gen.kind == "fat_tree":
            if gen.k is not None:
                return fat_tree(gen.k, gen.bandwidth_gbps, gen.latency_ns, gen.oversubscription, gen.tiers,
                                gen.ecmp)
            assert gen.hosts is not None and gen.radix is not None   # the generator's validator
            return clos_fat_tree(gen.hosts, gen.radix, gen.bandwidth_gbps, gen.latency_ns, gen.tiers,
                                 gen.oversubscription, gen.spine_oversubscription, gen.spine_radix,
                                 gen.ecmp or "hash")
        if gen.kind == "rail_optimized":
            return rail_optimized(gen.nodes, gen.gpus_per_node, gen.radix, gen.bandwidth_gbps, gen.latency_ns,
                                  gen.nvlink_bandwidth_gbps or 0.0, gen.nvlink_latency_ns or 0.0,
                                  gen.oversubscription, gen.spine_radix, gen.spine_planes,
                                  gen.spine_bandwidth_gbps, gen.spine_latency_ns, gen.pxn, gen.ecmp)
        if gen.kind == "torus":
            return from_dims(["Ring"] * len(gen.dims), gen.dims,
                             [gen.bandwidth_gbps * 1e9 / (1 << 30)] * len(gen.dims),
                             [gen.latency_ns] * len(gen.dims))
        return dragonfly(gen.groups, gen.routers_per_group, gen.hosts_per_router,
                         gen.global_links_per_router, gen.bandwidth_gbps, gen.latency_ns,
                         gen.global_bandwidth_gbps, gen.global_latency_ns)
    except ValueError as exc:
        raise SimulationError(f"network.generator: {exc}") from None


def source_problems(source: NetworkSource, base_dir: Path) -> Problems:
    """For a layer's `config_problems`: link names in failed_links and degraded_links that the
    topology does not have (it is built for the check only when those lists are given)."""
    if not source.failed_links and not source.degraded_links:
        return []
    try:
        topo = build_topology(source, base_dir)
    except ChakraSimError:
        return []       # the run reports the topology's own problem
    return resolve_faults(topo, source)[2]


def resolve_faults(topo: Topology, source: NetworkSource) -> tuple[frozenset[int], list[tuple[int, float]], Problems]:
    """(failed link ids, (link, bandwidth factor) pairs, problems as (key path, reason))."""
    if not source.failed_links and not source.degraded_links:
        return frozenset(), [], []
    problems: list[tuple[tuple[str | int, ...], str]] = []
    if source.failed_links and topo.dims:
        problems.append((("failed_links",), "routes on ASTRA-sim dimensions and tori go by dimension order "
                         "and cannot avoid a failed link; use a fat_tree, rail_optimized or dragonfly "
                         "generator or a topology_file"))
        return frozenset(), [], problems
    names = [topo.link_name(link) for link in range(len(topo.link_src))]
    index = {name: link for link, name in enumerate(names)}

    def links(loc: tuple[str | int, ...], name: str) -> list[int]:
        text = re.sub(r"\s*(<->|->)\s*", r"\1", name.strip())
        if "<->" in text:
            a, b = text.split("<->", 1)
            found = [index.get(f"{a}->{b}"), index.get(f"{b}->{a}")]
        else:
            found = [index.get(text)]
        if None in found:
            near = difflib.get_close_matches(text.replace("<->", "->"), names, n=3, cutoff=0.6)
            shown = near or names[:2] + names[-1:]
            problems.append((loc, f"unknown link {name!r}; links are named 'src->dst' as in the "
                             f"per-link statistics ('a<->b': both ways), e.g. {', '.join(shown)}"))
            return []
        return [link for link in found if link is not None]

    failed: set[int] = set()
    for position, name in enumerate(source.failed_links):
        failed.update(links(("failed_links", position), name))
    factors: dict[int, float] = {}
    for position, entry in enumerate(source.degraded_links):
        for link in links(("degraded_links", position, "link"), entry.link):
            if link in factors:
                problems.append((("degraded_links", position, "link"), f"link {names[link]} is degraded twice"))
            factors[link] = entry.bandwidth_factor
    return frozenset(failed), sorted(factors.items()), problems
