"""The congestion-aware network layer (`plugin: congestion`): builds the topology and router
from its configuration (config.py), moves messages over FIFO links (links.py) or max-min fair
flows (fairlinks.py), times collectives in closed form (claims.py) or as steps of flows
(flows.py), and reports per-link statistics."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from chakra_core import (
    AstraEquivalent, ChakraSimError, Dimension, LayerContext, ManifestError, NetworkModel, SimulationError,
    ValidationInputs,
)
from chakra_sim_network_congestion.claims import SharedLinkHint
from chakra_sim_network_congestion.config import CongestionConfig
from chakra_sim_network_congestion.fabric import FabricRouter
from chakra_sim_network_congestion.fairlinks import FairLinks
from chakra_sim_network_congestion.links import FifoLinks
from chakra_sim_network_congestion.routing import DimensionOrderRouter, ShortestPathRouter
from chakra_sim_network_congestion.topology import (Topology, clos_fat_tree, dragonfly, fat_tree, from_dims,
                                                    rail_optimized)
from chakra_sim_network_congestion.topology_files import from_file

__all__ = ["CongestionConfig", "CongestionNetwork"]   # the config as before its move to config.py


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
        # Links a previous attempt of this run found shared (see links.SharedLinkHint).
        shared: set[int] = set()
        for hint in context.inputs.hints(SharedLinkHint):
            shared |= hint.links
        self.links: FifoLinks | FairLinks
        if config.mode == "fifo":
            self.links = FifoLinks(topo.link_bw, topo.link_latency, context.scheduler, shared,
                                   on_shared=self._shared, cut_through=config.cut_through)
        else:
            self.links = FairLinks(topo.link_bw, topo.link_latency, context.scheduler, shared, on_shared=self._shared)
        self.closed_form = (config.closed_form and not config.trace_messages
                            and isinstance(self.router, DimensionOrderRouter)
                            and context.inputs.closed_form)
        # Collectives as steps of flows (fair mode): on routers whose links a collective can take
        # are known in advance.
        self.flow_level = (config.mode == "fair" and config.closed_form and not config.trace_messages
                           and isinstance(self.router, (DimensionOrderRouter, FabricRouter))
                           and context.inputs.closed_form)
        self._advanced: list[tuple[Any, Any]] | None = None    # ECMP counts since checkpoint
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
        """Delay of a message on idle links: every hop's latency, plus one serialisation at the
        slowest link (cut-through) or each hop's (store and forward)."""
        links = self.links
        route = self.router.route(src, dst)
        if self.config.cut_through:
            if not route:
                return 0
            return int(sum(map(links.lat.__getitem__, route)) + size / min(map(links.bw.__getitem__, route)))
        return sum(int(links.lat[link] + size / links.bw[link]) for link in route)

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
        self._advanced = []
        self.links.checkpoint()

    def rollback(self) -> None:
        if self._saved is not None:
            self.flows, self.flow_bytes, self.closed_form_messages = self._saved
        self._saved = None
        if self._advanced:    # give back the ECMP message numbers the rolled-back flows took
            from chakra_sim_network_congestion.fabric_routes import next_seqs
            assert isinstance(self.router, FabricRouter)
            for src, dst in reversed(self._advanced):
                next_seqs(self.router._sent, src, dst, back=True)
        self._advanced = None
        self.links.rollback()

    def commit(self) -> None:
        self._saved = None
        self._advanced = None
        self.links.commit()

    # Flow level (flows.py; fair mode) ----------------------------------------------------------------
    def _pairs(self, members: Sequence[int], offsets: Sequence[int]) -> tuple[Any, Any, Any]:
        """(sender positions, receiver positions, receivers) of a step's flows, as numpy arrays."""
        import numpy as np

        ranks = np.asarray(members, dtype=np.int64)
        n, shifts = len(ranks), np.asarray(offsets, dtype=np.int64)
        senders = np.repeat(np.arange(n, dtype=np.int64), len(shifts))
        receivers = (senders + np.tile(shifts, n)) % n
        return senders, receivers, ranks

    def claim_flows(self, runs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[int] | None:
        import numpy as np

        assert isinstance(self.links, FairLinks)    # flow_level: fair mode
        found = []
        for members, offsets in runs:
            senders, receivers, ranks = self._pairs(members, offsets)
            src, dst = ranks[senders], ranks[receivers]
            if isinstance(self.router, FabricRouter):
                from chakra_sim_network_congestion.fabric_routes import reachable_links
                found.append(reachable_links(self.topo.fabric, src, dst))   # type: ignore[arg-type]
            else:
                route = self.router.route
                found.append(np.fromiter({link for s, d in zip(src.tolist(), dst.tolist())
                                          for link in route(s, d)}, dtype=np.int64))
        links = np.unique(np.concatenate(found)) if found else np.empty(0, dtype=np.int64)
        return self.links.claim_group(links.tolist())

    def transfer_flows(self, members: Sequence[int], offsets: Sequence[int], size: int,
                       send_times: Sequence[int]) -> list[int]:
        import numpy as np

        assert isinstance(self.links, FairLinks) and self.links.flow_steps is not None   # claimed first
        senders, receivers, ranks = self._pairs(members, offsets)
        src, dst = ranks[senders], ranks[receivers]
        router = self.router
        if isinstance(router, FabricRouter) and not router._dead:
            from chakra_sim_network_congestion.fabric_routes import fabric_routes, next_seqs
            seqs = next_seqs(router._sent, src, dst)
            if self._advanced is not None:
                self._advanced.append((src, dst))
            assert self.topo.fabric is not None
            flow_start, flow_links = fabric_routes(self.topo.fabric, src, dst, seqs)
        else:   # a route per flow, counted as send() would count it
            routes = [router.route_next(s, d) for s, d in zip(src.tolist(), dst.tolist())]
            flow_start = np.zeros(len(routes) + 1, dtype=np.intp)
            np.cumsum(np.fromiter(map(len, routes), dtype=np.intp, count=len(routes)), out=flow_start[1:])
            flow_links = np.fromiter((link for route in routes for link in route), dtype=np.int64,
                                     count=int(flow_start[-1]))
        times = np.asarray(send_times, dtype=np.int64)
        arrivals, clash = self.links.flow_steps.step(flow_start, flow_links, times[senders], size)
        if len(clash):
            self._shared(frozenset(clash.tolist()))
        count = len(src)
        self.flows += count
        self.flow_bytes += count * size
        self.closed_form_messages += count
        received = times.copy()
        np.maximum.at(received, receivers, arrivals)
        return received.tolist()

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
        link_bytes, messages, busy, peak = stats.bytes, stats.messages, stats.busy, stats.peak
        steps = getattr(self.links, "flow_steps", None)
        if steps is not None:   # add what collectives timed as flows carried
            link_bytes = [a + b for a, b in zip(link_bytes, steps.bytes.tolist())]
            messages = [a + b for a, b in zip(messages, steps.messages.tolist())]
            busy = [a + b for a, b in zip(busy, steps.busy.tolist())]
            peak = [max(a, b) for a, b in zip(peak, steps.peak.tolist())]
        rows = []
        for link in range(len(topo.link_src)):
            rows.append({
                "index": link, "link": topo.link_name(link), "bytes": link_bytes[link], "messages": messages[link],
                "busy_ns": int(busy[link]), "utilization": round(busy[link] / makespan, 6),
                "peak_concurrent": peak[link],
            })
        return rows

    def summary(self) -> dict[str, Any]:
        rows = self.link_rows()
        rows.sort(key=lambda r: (-r["bytes"], r["index"]))
        summary = {"mode": self.config.mode,
                   "forwarding": "cut_through" if self.config.cut_through else "store_and_forward",
                   "topology": self.topo.source, "devices": self.topo.devices,
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
