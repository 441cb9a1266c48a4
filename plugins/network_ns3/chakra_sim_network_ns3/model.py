"""The packet-level network layer on ns-3 (`plugin: ns3`).

The network is the congestion plugin's, built by the same code (chakra_core.topology): the same
generators, topology files, failed and degraded links, link ids and names, and router's routes. The ns-3 side (fabric.cpp) builds one
point-to-point channel per pair of opposite links and installs, at every device, a static route
per destination host, taken from the route of the first message of every (src, dst) pair. Every
(src, dst) pair gets one TCP connection, opened at its first message, that carries the pair's
messages in order; a message has arrived when its sink has read all its bytes.

Co-simulation: chakra-sim's engine and ns-3 each keep their own clock. While messages are in
flight, an engine event (`_tick`) at ns-3's time runs ns-3 ahead by at most `quantum_ns`, and
fabric.cpp stops ns-3 at the first message completion, so every arrival is handed to the engine
at the exact ns ns-3 completed it, and sends made by those arrivals enter ns-3 at that same time.
A send the engine makes for another reason (a compute node ending) while ns-3 is ahead enters
ns-3 at ns-3's time, at most `quantum_ns` late; the summary counts such sends (`late_sends`,
`max_late_ns`).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from pydantic import Field, PositiveInt, model_validator

from chakra_core import Dimension, LayerContext, NetworkModel, PluginConfig, SimulationError, ValidationInputs
from chakra_core import JsonObject
from chakra_core.topology import (
    BuiltNetwork, DegradedLink, Dragonfly, FatTree, NetworkSource, RailOptimized, Torus, build_network, source_problems,
)
from chakra_sim_network_ns3.loader import load

IP_TCP_HEADERS = 40
"""IPv4 (20 B, RFC 791) and TCP (20 B, RFC 9293) headers without options: TCP timestamps are off,
so data segments carry no option."""
PPP_HEADER = 2
"""ns-3's point-to-point device adds a 2-byte PPP header (RFC 1661) to every packet."""
ACK_WIRE = IP_TCP_HEADERS + PPP_HEADER


class Ns3Config(PluginConfig):
    """The network as the congestion plugin describes it (`generator` or `topology_file`), and
    the packet-level transport's settings."""

    generator: FatTree | RailOptimized | Torus | Dragonfly | None = Field(
        None, discriminator="kind",
        description="as the congestion plugin's generator: fat_tree, rail_optimized, torus or dragonfly "
                    "(GB/s = 10^9 B/s); routes must depend on the destination only (fat_tree and "
                    "rail_optimized: ecmp: dmodk)")
    topology_file: str | None = Field(
        None, description="as the congestion plugin's: edge list or .graphml; every link needs the opposite "
                          "link with the same latency")
    failed_links: list[str] = Field([], description="links no route takes ('a->b'; 'a<->b': both ways)")
    degraded_links: list[DegradedLink] = Field(
        [], description="links with less bandwidth: [{link: 'a->b', bandwidth_factor: 0.5}]")
    mtu_bytes: int = Field(9000, ge=576, le=65535,
                           description="IP MTU of every link (jumbo frames); TCP segments carry mtu_bytes - 40")
    window_bytes: PositiveInt | None = Field(
        None, description="bytes a connection may have in flight (TCP receive window, initial congestion "
                          "window); default one bandwidth-delay product of the longest route plus 2 segments")
    queue_packets: PositiveInt | None = Field(
        None, description="packets each link's device queue holds; default: more than all connections' "
                          "windows together, so no queue ever drops (a lossless fabric)")
    quantum_ns: PositiveInt = Field(
        100, description="the most ns-3 runs ahead of the engine; a send not caused by an arrival may "
                          "enter the network up to this late")
    ack_priority: bool = Field(
        True, description="device queues send packets without payload (ACKs) before data, as RDMA NICs do; "
                          "false: one FIFO for all")
    max_hosts: PositiveInt = Field(
        1024, description="refuse networks with more NPUs than this (packet level is slow); raise it to "
                          "simulate larger ones")
    seed: PositiveInt = Field(1, description="ns-3's random seed (RngSeedManager::SetSeed)")
    top_links: PositiveInt = Field(10, description="hottest links shown in the terminal summary")

    @model_validator(mode="after")
    def _one_source(self) -> "Ns3Config":
        if (self.generator is None) == (self.topology_file is None):
            raise ValueError("give exactly one of: generator, topology_file")
        return self

    def source(self) -> NetworkSource:
        """The network these settings describe, for chakra_core.topology.build_network."""
        return NetworkSource(generator=self.generator, topology_file=self.topology_file,
                             failed_links=self.failed_links, degraded_links=self.degraded_links)


class Ns3Network(NetworkModel):
    name = "ns3"
    fidelity = ("packet level on ns-3: point-to-point links, store-and-forward switches with FIFO device queues, "
                "one window-limited loss-free TCP connection per NPU pair on the congestion plugin's "
                "destination-based routes; per-link bytes and peak queues")
    Config = Ns3Config
    contention_free = False

    config: Ns3Config

    def __init__(self, config: Ns3Config, context: LayerContext) -> None:
        super().__init__(config, context)
        flow: BuiltNetwork = build_network(config.source(), context.base_dir)   # topology, faults, router
        topo = flow.topo
        if topo.npus > config.max_hosts:
            raise SimulationError(
                f"network 'ns3': {topo.npus:,} NPUs is more than max_hosts ({config.max_hosts:,}); packet-level "
                f"simulation of that many hosts is slow (hours): use the congestion plugin, or raise "
                f"network.max_hosts")
        self.flow, self.topo = flow, topo
        self.npus_count = topo.npus
        self.dims = (Dimension("Custom", topo.npus, 0.0, 0.0),)
        self.segment = config.mtu_bytes - IP_TCP_HEADERS
        hops, rtt_bdp = self._routes()
        self.window = config.window_bytes or rtt_bdp + 2 * self.segment
        if self.window < self.segment:
            raise SimulationError(f"network.window_bytes ({self.window}) is less than one TCP segment "
                                  f"({self.segment} B = mtu_bytes - 40)")
        windows = math.ceil(self.window / self.segment) + 1
        self.queue_packets = config.queue_packets or min(topo.npus * topo.npus * windows, (1 << 32) - 1)
        g = load()
        cxx = g.chakra_ns3
        cxx.Reset()                       # a previous run in this process
        cxx.ConfigureTcp(self.segment, self.window, config.seed)
        self.fabric = fabric = cxx.Fabric(topo.devices, config.ack_priority)
        self._pairs = self._link_pairs()
        for ab, ba in self._pairs:
            a, b = topo.link_src[ab], topo.link_dst[ab]
            fabric.AddLinkPair(ab, ba, a, b, self._bps(ab), self._bps(ba), round(topo.link_latency[ab]),
                               config.mtu_bytes, self.queue_packets)
        fabric.InstallStack(topo.npus)
        vector = g.std.vector["unsigned int"]
        devices, dsts, links = hops
        fabric.AddRoutes(vector(devices), vector(dsts), vector(links))
        self._pending: dict[int, tuple[Callable[[Any], None], Any]] = {}
        self._next_id = 0
        self._ticking = False
        self.messages = 0
        self.message_bytes = 0
        self.late_sends = 0
        self.max_late_ns = 0
        self.ticks = 0
        self._rows: list[dict[str, Any]] | None = None
        self._final: dict[str, int] = {}

    # Building -----------------------------------------------------------------------------------
    def _bps(self, link: int) -> int:
        return round(self.topo.link_bw[link] * 8e9)       # bytes per ns -> bits per s

    def _link_pairs(self) -> list[tuple[int, int]]:
        """Each directed link with its opposite: one ns-3 channel per pair."""
        topo, pairs, seen = self.topo, [], set[int]()
        for link in range(len(topo.link_src)):
            if link in seen:
                continue
            a, b = topo.link_src[link], topo.link_dst[link]
            back = topo.out[b].get(a)
            if back is None:
                raise SimulationError(f"network 'ns3': link {topo.link_name(link)} has no opposite link "
                                      f"{topo.names[b]}->{topo.names[a]}; ns-3 point-to-point channels are "
                                      "two-way (give both directions)")
            if abs(topo.link_latency[link] - topo.link_latency[back]) > 1e-9:
                raise SimulationError(f"network 'ns3': links {topo.link_name(link)} and {topo.link_name(back)} "
                                      "have different latencies; a point-to-point channel has one delay")
            seen.update((link, back))
            pairs.append((link, back))
        return pairs

    def _routes(self) -> tuple[tuple[list[int], list[int], list[int]], int]:
        """Per device and destination host, the link out: the congestion router's route of every
        pair's first message, which must agree wherever two routes to one destination meet.
        Also the largest bandwidth-delay product (bottleneck bandwidth x round trip of a full
        segment out and an ACK back) over all routes."""
        topo, router, npus = self.topo, self.flow.router, self.topo.npus
        src_of, bw, lat = topo.link_src, topo.link_bw, topo.link_latency
        wire = self.config.mtu_bytes + PPP_HEADER
        table: dict[int, int] = {}
        timing: dict[tuple[int, int], tuple[float, float, float]] = {}   # latency, ns per byte, bottleneck
        for src in range(npus):
            for dst in range(npus):
                if src == dst:
                    continue
                try:
                    route = router.route(src, dst, 0)
                except SimulationError:
                    continue            # no path (failed links): a message between them raises it
                for link in route:
                    key = src_of[link] * npus + dst
                    known = table.setdefault(key, link)
                    if known != link:
                        raise SimulationError(self._not_per_destination(src, dst, link, known))
                timing[(src, dst)] = (sum(lat[link] for link in route), sum(1 / bw[link] for link in route),
                                      min(bw[link] for link in route))
        bdp = 0.0
        for (src, dst), (latency, per_byte, bottleneck) in timing.items():
            back = timing.get((dst, src))
            if back is not None:     # a full segment out, its ACK back
                rtt = latency + wire * per_byte + back[0] + ACK_WIRE * back[1]
                bdp = max(bdp, bottleneck * rtt)
        items = sorted(table.items())
        devices = [key // npus for key, _ in items]
        dsts = [key % npus for key, _ in items]
        links = [link for _, link in items]
        return (devices, dsts, links), math.ceil(bdp)

    def _not_per_destination(self, src: int, dst: int, link: int, known: int) -> str:
        topo = self.topo
        hint = ""
        gen = self.config.generator
        if gen is not None and gen.kind in ("fat_tree", "rail_optimized") and gen.ecmp != "dmodk":
            hint = "; set the generator's ecmp: dmodk (D-mod-k routes depend on the destination only)"
        return (f"network 'ns3': routes to NPU {dst} leave {topo.names[topo.link_src[link]]} by "
                f"{topo.link_name(known)} and, from NPU {src}, by {topo.link_name(link)}: ns-3 gets one static "
                f"route per destination at each switch, so the routes must depend on the destination "
                f"only{hint}")

    @classmethod
    def config_problems(cls, config: Ns3Config,
                        inputs: ValidationInputs) -> list[tuple[tuple[str | int, ...], str]]:
        return source_problems(config.source(), inputs.base_dir)

    # Co-simulation ------------------------------------------------------------------------------
    def send(self, src: int, dst: int, size: int, on_arrival: Callable[[Any], None], arg: Any = None) -> None:
        if not (0 <= src < self.npus_count and 0 <= dst < self.npus_count):
            raise SimulationError(f"network: NPU {src} or {dst} is outside 0..{self.npus_count - 1}")
        scheduler = self.context.scheduler
        self.messages += 1
        self.message_bytes += size
        if src == dst:
            scheduler.schedule(0, on_arrival, arg)
            return
        route = self.flow.router.route(src, dst, 0)       # raises for a pair failed links cut off
        if size <= 0:
            scheduler.schedule(int(sum(self.topo.link_latency[link] for link in route)), on_arrival, arg)
            return
        now = scheduler.now
        ahead = self.fabric.Now()
        if ahead > now:
            self.late_sends += 1
            self.max_late_ns = max(self.max_late_ns, ahead - now)
        ident = self._next_id
        self._next_id += 1
        self._pending[ident] = (on_arrival, arg)
        self.fabric.Send(src, dst, size, ident, max(now, ahead))
        if not self._ticking:
            self._ticking = True
            scheduler.schedule(0, self._tick)

    def _tick(self, _arg: object = None) -> None:
        """Run ns-3 up to `quantum_ns` ahead, stopping at the first completion; hand completed
        messages to the engine at their ns-3 times; come back at ns-3's time while any is in flight."""
        self._ticking = False
        if not self._pending:
            return
        scheduler, fabric = self.context.scheduler, self.fabric
        now = scheduler.now
        self.ticks += 1
        reached = int(fabric.RunUntil(now + self.config.quantum_ns))
        done = fabric.DoneCount()
        if done:
            for index in range(done):
                on_arrival, arg = self._pending.pop(int(fabric.DoneId(index)))
                scheduler.schedule_at(max(int(fabric.DoneTime(index)), now), on_arrival, arg)
            fabric.ClearDone()
        if self._pending:
            self._ticking = True
            scheduler.schedule_at(max(reached, now), self._tick)

    # Statistics ---------------------------------------------------------------------------------
    def finish(self) -> None:
        if self._pending:
            self.context.warn(f"network 'ns3': {len(self._pending)} messages were still in flight at the end")
        fabric, topo = self.fabric, self.topo
        makespan = max(self.context.scheduler.now, 1)
        rows = []
        for link in range(len(topo.link_src)):
            wire = int(fabric.Wire(link))
            busy = wire / topo.link_bw[link]
            rows.append({"index": link, "link": topo.link_name(link), "bytes": int(fabric.Payload(link)),
                         "wire_bytes": wire, "packets": int(fabric.Packets(link)), "busy_ns": int(busy),
                         "utilization": round(busy / makespan, 6),
                         "peak_queue_packets": int(fabric.PeakPackets(link)),
                         "peak_queue_bytes": int(fabric.PeakBytes(link))})
        self._rows = rows
        self._final = {"drops": int(fabric.Drops()), "connections": int(fabric.Connections()),
                       "ns3_time_ns": int(fabric.Now())}

    def link_rows(self) -> list[dict[str, Any]]:
        if self._rows is None:
            self.finish()
        assert self._rows is not None    # set by finish
        return self._rows

    def summary(self) -> JsonObject:
        rows = sorted(self.link_rows(), key=lambda r: (-r["bytes"], r["index"]))
        summary: JsonObject = {
            "topology": self.topo.source, "devices": self.topo.devices, "links": len(rows),
            "transport": "TCP NewReno, one connection per NPU pair, window-limited, no loss",
            "mtu_bytes": self.config.mtu_bytes, "segment_bytes": self.segment, "window_bytes": self.window,
            "queue_packets": self.queue_packets, "quantum_ns": self.config.quantum_ns,
            "messages": self.messages, "message_bytes": self.message_bytes,
            "link_bytes": sum(r["bytes"] for r in rows), "wire_bytes": sum(r["wire_bytes"] for r in rows),
            **self._final, "late_sends": self.late_sends, "max_late_ns": self.max_late_ns, "ticks": self.ticks,
            "hottest_links": rows}
        if self.flow.failed:
            summary["failed_links"] = [self.topo.link_name(link) for link in sorted(self.flow.failed)]
        if self.flow.degraded:
            summary["degraded_links"] = [{"link": self.topo.link_name(link), "bandwidth_factor": factor}
                                         for link, factor in self.flow.degraded]
        return summary

    def terminal_tables(self) -> list[tuple[str, list[str], list[list[str]]]]:
        rows = sorted(self.link_rows(), key=lambda r: (-r["busy_ns"], -r["bytes"], r["index"]))
        top = [r for r in rows if r["packets"]][: self.config.top_links]
        body = [[r["link"], f"{r['bytes']:,}", f"{r['busy_ns']:,}", f"{100 * r['utilization']:.1f}%",
                 f"{r['peak_queue_packets']:,}"] for r in top]
        return [(f"hottest links (top {len(body)} of {len(rows)})",
                 ["link", "payload bytes", "busy (ns)", "utilization", "peak queue (packets)"], body)]
