"""The congestion-aware network layer (`plugin: congestion`)."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from chakra_core import (AstraEquivalent, ChakraSimError, Dimension, LayerContext, ManifestError, NetworkModel,
                         PluginConfig, SimulationError, ValidationInputs)
from chakra_sim_network_congestion.links import FairLinks, FifoLinks, SharedLinkHint
from chakra_sim_network_congestion.fabric import FabricRouter, fat_tree_shape, k_ary_shape, rail_shape
from chakra_sim_network_congestion.routing import DimensionOrderRouter, ShortestPathRouter
from chakra_sim_network_congestion.topology import (Topology, clos_fat_tree, dragonfly, fat_tree, from_dims, from_file,
                                                    rail_optimized)


class FatTree(BaseModel):
    """A fat-tree: the k-ary one (`k`), or one of any size built from switches of a radix
    (`hosts`, `radix`); 2 or 3 tiers. See fabric.py for the shapes."""
    model_config = ConfigDict(extra="forbid")
    kind: Literal["fat_tree"]
    k: PositiveInt | None = Field(
        None, description="k-ary fat-tree: switch radix (even); 3 tiers: k^3/4 NPUs, 2 tiers: k^2/2")
    hosts: PositiveInt | None = Field(None, description="NPUs, any number (with radix, instead of k)")
    radix: PositiveInt | None = Field(None, description="ports per switch (with hosts)")
    tiers: Literal[2, 3] = Field(3, description="2: leaf-spine; 3: leaf (edge), aggregation and core switches in pods")
    bandwidth_gbps: PositiveFloat = Field(..., description="GB/s (10^9 B/s) per link")
    latency_ns: NonNegativeFloat = Field(..., description="ns per link")
    oversubscription: PositiveFloat = Field(
        1.0, description="leaf down:up ratio; k form: uplink bandwidth = bandwidth / this; hosts form: a leaf "
                         "has floor(radix * o / (o + 1)) host ports, the rest up")
    spine_oversubscription: PositiveFloat | None = Field(
        None, description="hosts form, 3 tiers: the aggregation switches' down:up port ratio (default 1)")
    spine_radix: PositiveInt | None = Field(None, description="hosts form, 2 tiers: ports per spine (default radix)")
    ecmp: Literal["hash", "dmodk"] | None = Field(
        None, description="how messages pick among equal-cost up-links: hash of (src, dst, n-th message), or "
                          "D-mod-k (dst + n); default dmodk for k with 3 tiers (as before), hash otherwise")

    @model_validator(mode="after")
    def _shape(self) -> "FatTree":
        if self.k is not None:
            if self.hosts is not None or self.radix is not None:
                raise ValueError("give k (a k-ary fat-tree) or hosts and radix (any size), not both")
            if self.spine_oversubscription is not None or self.spine_radix is not None:
                raise ValueError("spine_oversubscription and spine_radix go with hosts and radix; the k form "
                                 "oversubscribes by bandwidth (oversubscription)")
            k_ary_shape(self.k, self.tiers)
        elif self.hosts is None or self.radix is None:
            raise ValueError("give k (a k-ary fat-tree) or both hosts and radix (a fat-tree of any size)")
        else:
            fat_tree_shape(self.hosts, self.radix, self.tiers, self.oversubscription, self.spine_oversubscription,
                           self.spine_radix)
        return self


class RailOptimized(BaseModel):
    """A rail-optimized GPU cluster (NVIDIA DGX SuperPOD's compute fabric; see
    topology.rail_optimized): NVLink inside each node, NIC i of every node on rail i, spines."""
    model_config = ConfigDict(extra="forbid")
    kind: Literal["rail_optimized"]
    nodes: PositiveInt
    gpus_per_node: PositiveInt = Field(..., description="GPUs (NPUs) per node, one NIC each; NIC i goes to rail i")
    radix: PositiveInt = Field(..., description="ports per rail switch")
    oversubscription: PositiveFloat = Field(
        1.0, description="rail switch down:up ports: floor(radix * o / (o + 1)) nodes per rail switch, the rest up")
    spine_radix: PositiveInt | None = Field(
        None, description="ports per spine (default radix): bounds the rail switches of a spine plane")
    spine_planes: PositiveInt = Field(
        1, description="spine planes, each serving gpus_per_node / spine_planes consecutive rails")
    bandwidth_gbps: PositiveFloat = Field(..., description="GB/s (10^9 B/s) of a GPU's NIC link to its rail switch")
    latency_ns: NonNegativeFloat = Field(..., description="ns per NIC link")
    spine_bandwidth_gbps: PositiveFloat | None = Field(
        None, description="GB/s of rail switch-spine links (default bandwidth_gbps)")
    spine_latency_ns: NonNegativeFloat | None = Field(
        None, description="ns per rail switch-spine link (default latency_ns)")
    nvlink_bandwidth_gbps: PositiveFloat | None = Field(
        None, description="GB/s of each GPU's link to its node's NVSwitch, each way (needed for 2+ GPUs per node)")
    nvlink_latency_ns: NonNegativeFloat | None = Field(None, description="ns per NVLink hop")
    pxn: bool = Field(False, description="all cross-rail traffic between nodes first crosses NVLink to the GPU on "
                                         "the destination's rail (NCCL's PXN); else only across spine planes")
    ecmp: Literal["hash", "dmodk"] = Field(
        "hash", description="how messages pick a spine: hash of (src, dst, n-th message), or D-mod-k "
                            "(destination node + n)")

    @model_validator(mode="after")
    def _shape(self) -> "RailOptimized":
        if self.gpus_per_node > 1 and (self.nvlink_bandwidth_gbps is None or self.nvlink_latency_ns is None):
            raise ValueError("nvlink_bandwidth_gbps and nvlink_latency_ns are needed with 2 or more GPUs per node")
        rail_shape(self.nodes, self.gpus_per_node, self.radix, self.oversubscription, self.spine_radix,
                   self.spine_planes, self.pxn)
        return self


class Torus(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["torus"]
    dims: list[PositiveInt] = Field(..., min_length=1, max_length=3, description="NPUs per dimension")
    bandwidth_gbps: PositiveFloat = Field(..., description="GB/s (10^9 B/s) per link")
    latency_ns: NonNegativeFloat = Field(..., description="ns per link")


class Dragonfly(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["dragonfly"]
    groups: PositiveInt
    routers_per_group: PositiveInt
    hosts_per_router: PositiveInt
    global_links_per_router: PositiveInt
    bandwidth_gbps: PositiveFloat = Field(..., description="GB/s (10^9 B/s) of host and local links")
    latency_ns: NonNegativeFloat
    global_bandwidth_gbps: PositiveFloat | None = None
    global_latency_ns: NonNegativeFloat | None = None


class DegradedLink(BaseModel):
    model_config = ConfigDict(extra="forbid")
    link: str = Field(..., description="a link's name as in the per-link statistics ('a->b'; 'a<->b': both ways)")
    bandwidth_factor: float = Field(..., gt=0, le=1, description="the fraction of its bandwidth the link keeps")


class CongestionConfig(PluginConfig):
    """Give the network as ASTRA-sim's lists, a `generator`, or a `topology_file`."""

    mode: Literal["fifo", "fair"] = Field(
        "fifo", description="fifo: per-link FIFO queues, store and forward (ASTRA-sim congestion-aware); "
                            "fair: flow-level max-min fair sharing")
    topology: list[Literal["Ring", "FullyConnected", "Switch"]] | None = Field(
        None, description="ASTRA-sim network YAML: building block per dimension")
    npus_count: list[PositiveInt] | None = Field(None, description="NPUs per dimension")
    bandwidth: list[PositiveFloat] | None = Field(
        None, description="GB/s per dimension, GB = 2^30 bytes (ASTRA-sim convention)")
    latency: list[NonNegativeFloat] | None = Field(None, description="ns per link, per dimension")
    generator: FatTree | RailOptimized | Torus | Dragonfly | None = Field(
        None, discriminator="kind",
        description="fat_tree, rail_optimized, torus or dragonfly (bandwidth in GB/s, 10^9 B/s)")
    topology_file: str | None = Field(
        None, description="edge list (src dst bandwidth_gbps latency_ns [uni|bi] per line) or .graphml; "
                          "NPUs are the nodes named 0..N-1, other nodes are switches")
    failed_links: list[str] = Field(
        [], description="links no message takes, named as in the per-link statistics ('a->b'; 'a<->b': both "
                        "ways); routes avoid them (not on ASTRA-sim dimensions or torus, which route by "
                        "dimension order)")
    degraded_links: list[DegradedLink] = Field(
        [], description="links with less bandwidth: [{link: 'a->b', bandwidth_factor: 0.5}]")
    top_links: PositiveInt = Field(10, description="hottest links shown in the terminal summary")
    trace_messages: int = Field(
        0, ge=0, description="record the first N messages (endpoints, size, route, send and arrival "
                             "times) in results.json, for debugging routes (turns closed_form off)")
    closed_form: bool = Field(
        True, description="fifo mode with dimension-order routes: time the collectives whose links "
                          "carry no other traffic in closed form instead of message by message "
                          "(same results, much faster); false forces message by message")

    @model_validator(mode="after")
    def _one_source(self) -> "CongestionConfig":
        lists = [self.topology, self.npus_count, self.bandwidth, self.latency]
        given = sum(1 for x in (self.topology, self.generator, self.topology_file) if x is not None)
        if given != 1:
            raise ValueError("give exactly one of: topology/npus_count/bandwidth/latency lists, "
                             "generator, topology_file")
        if self.topology is not None:
            if any(x is None for x in lists):
                raise ValueError("topology, npus_count, bandwidth and latency go together")
            lengths = {len(x) for x in lists if x is not None}   # (none is None: checked above)
            if len(lengths) != 1:
                raise ValueError("topology, npus_count, bandwidth and latency need one entry per dimension")
        return self


class CongestionNetwork(NetworkModel):
    name = "congestion"
    fidelity = ("congestion-aware, link level: explicit devices, switches and links; FIFO link queues "
                "(ASTRA-sim) or max-min fair flows; per-link statistics")
    Config = CongestionConfig
    contention_free = False
    astra_sim = AstraEquivalent("congestion-aware")

    config: CongestionConfig

    def __init__(self, config: CongestionConfig, context: LayerContext) -> None:
        super().__init__(config, context)
        topo = self._build(config, context.base_dir)
        self.topo = topo
        self.npus_count = topo.npus
        failed, degraded, problems = self._resolve_faults(topo, config)
        if problems:
            raise ManifestError([("network" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc), why)
                                 for loc, why in problems])
        self.failed, self.degraded = failed, degraded
        for link, factor in degraded:
            topo.link_bw[link] *= factor
        self.router: DimensionOrderRouter | ShortestPathRouter | FabricRouter
        if topo.dims:
            self.dims = tuple(Dimension(k, n, bw, lat) for k, n, bw, lat in topo.dims)
            self.router = DimensionOrderRouter(topo)
        else:
            self.dims = (Dimension("Custom", topo.npus, 0.0, 0.0),)
            if topo.fabric is not None:
                self.router = FabricRouter(topo, failed)
            else:
                self.router = ShortestPathRouter(topo, failed)
        if config.mode == "fifo":
            # Links a previous attempt of this run found shared (see links.SharedLinks).
            shared: set[int] = set()
            for hint in context.inputs.hints(SharedLinkHint):
                shared |= hint.links
            self.links = FifoLinks(topo.link_bw, topo.link_latency, context.scheduler, shared,
                                   on_shared=self._shared)
        else:
            # typed as FifoLinks: FairLinks has the same send/bw/lat/stats, and the closed-form
            # methods (FifoLinks only) run only when closed_form, i.e. in fifo mode
            self.links = FairLinks(topo.link_bw, topo.link_latency,  # type: ignore[assignment]  # see above
                                   context.scheduler)
        self.closed_form = (config.mode == "fifo" and config.closed_form and not config.trace_messages
                            and isinstance(self.router, DimensionOrderRouter)
                            and context.inputs.closed_form)
        self.flows = 0
        self.flow_bytes = 0
        self.closed_form_messages = 0
        self.traced: list[dict[str, Any]] = []
        self._saved: tuple[int, int, int] | None = None

    @staticmethod
    def _build(config: CongestionConfig, base_dir: Path) -> Topology:
        if config.topology is not None:
            # the config's validator: the four lists come together
            assert config.npus_count is not None and config.bandwidth is not None and config.latency is not None
            return from_dims(config.topology, config.npus_count, config.bandwidth, config.latency)
        if config.topology_file is not None:
            path = Path(config.topology_file)
            return from_file(path if path.is_absolute() else base_dir / path)
        gen = config.generator
        assert gen is not None   # the config's validator: exactly one source
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

    # Failed and degraded links ---------------------------------------------------------------------
    @classmethod
    def config_problems(cls, config: CongestionConfig,
                        inputs: ValidationInputs) -> list[tuple[tuple[str | int, ...], str]]:
        """Link names in failed_links and degraded_links that the topology does not have (it is
        built for the check only when those lists are given)."""
        if not config.failed_links and not config.degraded_links:
            return []
        try:
            topo = cls._build(config, inputs.base_dir)
        except ChakraSimError:
            return []       # the run reports the topology's own problem
        return cls._resolve_faults(topo, config)[2]

    @staticmethod
    def _resolve_faults(topo: Topology, config: CongestionConfig) -> tuple[
            frozenset[int], list[tuple[int, float]], list[tuple[tuple[str | int, ...], str]]]:
        """(failed link ids, (link, bandwidth factor) pairs, problems as (key path, reason))."""
        if not config.failed_links and not config.degraded_links:
            return frozenset(), [], []
        problems: list[tuple[tuple[str | int, ...], str]] = []
        if config.failed_links and topo.dims:
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
        for position, name in enumerate(config.failed_links):
            failed.update(links(("failed_links", position), name))
        factors: dict[int, float] = {}
        for position, entry in enumerate(config.degraded_links):
            for link in links(("degraded_links", position, "link"), entry.link):
                if link in factors:
                    problems.append((("degraded_links", position, "link"), f"link {names[link]} is degraded twice"))
                factors[link] = entry.bandwidth_factor
        return frozenset(failed), sorted(factors.items()), problems

    def route(self, src: int, dst: int, seq: int = 0) -> list[str]:
        """The links the seq-th message (from 0) from src to dst takes (for debugging routes)."""
        return [self.topo.link_name(link) for link in self.router.route(src, dst, seq)]

    def send(self, src: int, dst: int, size: int, on_arrival: Callable[[Any], None], arg: Any = None) -> None:
        if not (0 <= src < self.npus_count and 0 <= dst < self.npus_count):
            raise SimulationError(f"network: NPU {src} or {dst} is outside 0..{self.npus_count - 1}")
        route = self.router.route_next(src, dst)
        self.flows += 1
        self.flow_bytes += size
        if len(self.traced) < self.config.trace_messages:
            record = {"src": src, "dst": dst, "bytes": size, "sent_ns": self.context.scheduler.now,
                      "arrived_ns": None, "route": [self.topo.link_name(link) for link in route]}
            self.traced.append(record)
            on_arrival, arg = self._traced_arrival, (record, on_arrival, arg)
        self.links.send(route, size, on_arrival, arg)

    def message_delay(self, src: int, dst: int, size: int) -> int:
        """Delay of a message on idle links: each hop's latency plus its serialisation."""
        links = self.links
        return sum(int(links.lat[link] + size / links.bw[link]) for link in self.router.route(src, dst))

    # Closed form (see links.FifoLinks) -------------------------------------------------------------
    def claim(self, pairs: Iterable[tuple[int, int]]) -> list[int] | None:
        route = self.router.route
        return self.links.claim((src, route(src, dst)) for src, dst in pairs)

    def release(self, token: list[int]) -> None:
        self.links.release(token)

    def transfer(self, src: int, dst: int, size: int, send_time: int) -> int:
        self.flows += 1
        self.flow_bytes += size
        self.closed_form_messages += 1
        return self.links.transfer(self.router.route(src, dst), size, send_time)

    def transfer_uniform(self, pairs: Sequence[tuple[int, int]], step_bytes: Sequence[int],
                         send_times: Sequence[int]) -> bool:
        route = self.router.route
        if not self.links.transfer_uniform([route(src, dst) for src, dst in pairs], step_bytes, send_times):
            return False
        count = len(pairs) * len(step_bytes)
        self.flows += count
        self.flow_bytes += len(pairs) * sum(step_bytes)
        self.closed_form_messages += count
        return True

    def checkpoint(self) -> None:
        self._saved = (self.flows, self.flow_bytes, self.closed_form_messages)
        self.links.checkpoint()

    def rollback(self) -> None:
        if self._saved is not None:
            self.flows, self.flow_bytes, self.closed_form_messages = self._saved
        self._saved = None
        self.links.rollback()

    def commit(self) -> None:
        self._saved = None
        self.links.commit()

    def _shared(self, links: frozenset[int]) -> None:
        """Closed-form traffic was timed on links that carry other traffic too: start over, timing
        them message by message."""
        shown = ", ".join(self.topo.link_name(link) for link in sorted(links)[:4])
        self.context.request_restart(f"network 'congestion': links {shown} carry closed-form collective "
                                     "traffic and other traffic; they are timed message by message",
                                     SharedLinkHint(links))

    def _traced_arrival(self, arg: tuple[dict[str, Any], Callable[[Any], None], Any]) -> None:
        record, on_arrival, inner = arg
        record["arrived_ns"] = self.context.scheduler.now
        on_arrival(inner)

    # Statistics ---------------------------------------------------------------------------------
    def link_rows(self) -> list[dict[str, Any]]:
        stats, topo = self.links.stats, self.topo
        makespan = max(self.context.scheduler.now, 1)
        rows = []
        for link in range(len(topo.link_src)):
            rows.append({
                "index": link, "link": topo.link_name(link), "bytes": stats.bytes[link], "messages": stats.messages[link],
                "busy_ns": int(stats.busy[link]), "utilization": round(stats.busy[link] / makespan, 6),
                "peak_concurrent": stats.peak[link],
            })
        return rows

    def summary(self) -> dict[str, Any]:
        rows = self.link_rows()
        rows.sort(key=lambda r: (-r["bytes"], r["index"]))
        summary = {"mode": self.config.mode, "topology": self.topo.source, "devices": self.topo.devices,
                   "links": len(rows), "messages": self.flows, "message_bytes": self.flow_bytes,
                   "closed_form_messages": self.closed_form_messages,
                   "link_bytes": sum(r["bytes"] for r in rows), "hottest_links": rows}
        if self.failed:
            summary["failed_links"] = [self.topo.link_name(link) for link in sorted(self.failed)]
        if self.degraded:
            summary["degraded_links"] = [{"link": self.topo.link_name(link), "bandwidth_factor": factor}
                                         for link, factor in self.degraded]
        if self.traced:
            summary["traced_messages"] = self.traced
        return summary

    def terminal_tables(self) -> list[tuple[str, list[str], list[list[str]]]]:
        rows = sorted(self.link_rows(), key=lambda r: (-r["busy_ns"], -r["bytes"], r["index"]))
        top = rows[: self.config.top_links]
        body = [[r["link"], f"{r['bytes']:,}", f"{r['busy_ns']:,}", f"{100 * r['utilization']:.1f}%",
                 str(r["peak_concurrent"])] for r in top if r["messages"]]
        return [(f"hottest links (top {len(body)} of {len(rows)})",
                 ["link", "bytes", "busy (ns)", "utilization", "peak concurrent"], body)]
