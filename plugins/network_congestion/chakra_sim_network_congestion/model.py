"""The congestion-aware network layer (`plugin: congestion`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from chakra_core import AstraEquivalent, Dimension, LayerContext, NetworkModel, PluginConfig, SimulationError
from chakra_sim_network_congestion.links import FairLinks, FifoLinks, SharedLinkHint
from chakra_sim_network_congestion.routing import DimensionOrderRouter, ShortestPathRouter
from chakra_sim_network_congestion.topology import Topology, dragonfly, fat_tree, from_dims, from_file


class FatTree(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["fat_tree"]
    k: PositiveInt = Field(..., description="switch radix (even); k^3/4 NPUs")
    bandwidth_gbps: PositiveFloat = Field(..., description="GB/s (10^9 B/s) per link")
    latency_ns: NonNegativeFloat = Field(..., description="ns per link")
    oversubscription: PositiveFloat = Field(1.0, description="uplink bandwidth = bandwidth / this")


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
    generator: FatTree | Torus | Dragonfly | None = Field(
        None, discriminator="kind", description="fat_tree, torus or dragonfly (bandwidth in GB/s, 10^9 B/s)")
    topology_file: str | None = Field(
        None, description="edge list (src dst bandwidth_gbps latency_ns [uni|bi] per line) or .graphml; "
                          "NPUs are the nodes named 0..N-1, other nodes are switches")
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
        self.router: DimensionOrderRouter | ShortestPathRouter
        if topo.dims:
            self.dims = tuple(Dimension(k, n, bw, lat) for k, n, bw, lat in topo.dims)
            self.router = DimensionOrderRouter(topo)
        else:
            self.dims = (Dimension("Custom", topo.npus, 0.0, 0.0),)
            self.router = ShortestPathRouter(topo)
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
                return fat_tree(gen.k, gen.bandwidth_gbps, gen.latency_ns, gen.oversubscription)
            if gen.kind == "torus":
                return from_dims(["Ring"] * len(gen.dims), gen.dims,
                                 [gen.bandwidth_gbps * 1e9 / (1 << 30)] * len(gen.dims),
                                 [gen.latency_ns] * len(gen.dims))
            return dragonfly(gen.groups, gen.routers_per_group, gen.hosts_per_router,
                             gen.global_links_per_router, gen.bandwidth_gbps, gen.latency_ns,
                             gen.global_bandwidth_gbps, gen.global_latency_ns)
        except ValueError as exc:
            raise SimulationError(f"network.generator: {exc}") from None

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
