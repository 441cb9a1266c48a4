"""The congestion-aware network layer (`plugin: congestion`): builds the topology and router
from its configuration (config.py), moves messages over FIFO links (links.py) or max-min fair
flows (fairlinks.py), times collectives in closed form (claims.py) or as steps of messages
(fifosteps.py) or flows (flows.py), and reports per-link statistics."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from chakra_core import AstraEquivalent, Dimension, LayerContext, NetworkModel, SimulationError, ValidationInputs
from chakra_core import JsonObject
from chakra_core.topology import DimensionOrderRouter, FabricRouter, build_network, source_problems
from chakra_sim_network_congestion.claims import SharedLinkHint
from chakra_sim_network_congestion.config import CongestionConfig
from chakra_sim_network_congestion.fairlinks import FairLinks
from chakra_sim_network_congestion.links import FifoLinks

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
        network = build_network(config.source(), context.base_dir)
        topo = self.topo = network.topo
        self.npus_count = topo.npus
        self.failed, self.degraded, self.router = network.failed, network.degraded, network.router
        if topo.dims:
            self.dims = tuple(Dimension(k, n, bw, lat) for k, n, bw, lat in topo.dims)
        else:
            self.dims = (Dimension("Custom", topo.npus, 0.0, 0.0),)
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
        # Collectives as steps of flows (fair) or of messages (fifo): on routers whose links a
        # collective can take are known in advance.
        self.flow_level = (config.closed_form and not config.trace_messages
                           and isinstance(self.router, (DimensionOrderRouter, FabricRouter))
                           and context.inputs.closed_form)
        # Both modes take only schedules that are the members' timing (StepSchedule.exact): the
        # flow level gives what message by message (flow by flow) gives, to the ns; fair took the
        # direct all-reduce's two steps once, which are 1 ns off when its members start apart.
        # fifo only on generated fabrics: on ASTRA-sim's lists (rings, where a step's messages
        # meet in ns ordered only by which member's send event ran first) the closed form or
        # message by message serve better than a restart (see fifosteps.py)
        self.flow_exact = True
        if config.mode == "fifo" and not isinstance(self.router, FabricRouter):
            self.flow_level = False
        self._advanced: list[tuple[Any, Any]] | None = None    # ECMP counts since checkpoint
        self.flows = 0
        self.flow_bytes = 0
        self.closed_form_messages = 0
        self.traced: list[dict[str, Any]] = []
        self._saved: tuple[int, int, int] | None = None

    @classmethod
    def config_problems(cls, config: CongestionConfig,
                        inputs: ValidationInputs) -> list[tuple[tuple[str | int, ...], str]]:
        """Link names in failed_links and degraded_links that the topology does not have."""
        return source_problems(config.source(), inputs.base_dir)

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

    # Flow level (fifosteps.py, flows.py) -----------------------------------------------------------
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

        found = []
        for members, offsets in runs:
            senders, receivers, ranks = self._pairs(members, offsets)
            src, dst = ranks[senders], ranks[receivers]
            if isinstance(self.router, FabricRouter):
                from chakra_sim_network_congestion.fabric_routes import reachable_links
                found.append(reachable_links(self.router.fabric, src, dst))   # the router's: self.topo.fabric
            else:
                route = self.router.route
                found.append(np.fromiter({link for s, d in zip(src.tolist(), dst.tolist())
                                          for link in route(s, d)}, dtype=np.int64))
        links = np.unique(np.concatenate(found)) if found else np.empty(0, dtype=np.int64)
        return self.links.claim_group(links.tolist())

    def transfer_flows(self, members: Sequence[int], offsets: Sequence[int], size: int,
                       send_times: Sequence[int]) -> list[int]:
        import numpy as np

        senders, receivers, ranks = self._pairs(members, offsets)
        src, dst = ranks[senders], ranks[receivers]
        times = np.asarray(send_times, dtype=np.int64)
        if isinstance(self.links, FifoLinks):    # a member sends its messages in offset order
            assert self.links.flow_steps is not None   # claimed first
            hops = self._hops(src, dst, len(offsets))
            arrivals, clash = self.links.flow_steps.step(hops, times[senders], size, senders)
        else:
            assert self.links.flow_steps is not None
            flow_start, flow_links = self._incidence(src, dst)
            arrivals, clash = self.links.flow_steps.step(flow_start, flow_links, times[senders], size)
        if len(clash):
            self._shared(frozenset(clash.tolist()))
        count = len(src)
        self.flows += count
        self.flow_bytes += count * size
        self.closed_form_messages += count
        received = times.copy()
        np.maximum.at(received, receivers, arrivals)
        done: list[int] = received.tolist()
        return done

    def _incidence(self, src: Any, dst: Any) -> tuple[Any, Any]:
        """The flow-link incidence of a step's messages (fabric_routes.py), their pairs counted."""
        import numpy as np

        router = self.router
        if isinstance(router, FabricRouter) and not router._dead:
            from chakra_sim_network_congestion.fabric_routes import fabric_routes, next_seqs
            seqs = next_seqs(router._sent, src, dst)
            if self._advanced is not None:
                self._advanced.append((src, dst))
            assert self.topo.fabric is not None
            return fabric_routes(self.topo.fabric, src, dst, seqs)
        routes = [router.route_next(s, d) for s, d in zip(src.tolist(), dst.tolist())]
        flow_start = np.zeros(len(routes) + 1, dtype=np.intp)
        np.cumsum(np.fromiter(map(len, routes), dtype=np.intp, count=len(routes)), out=flow_start[1:])
        return flow_start, np.fromiter((link for route in routes for link in route), dtype=np.int64,
                                       count=int(flow_start[-1]))

    def _link_type(self) -> type:
        import numpy as np

        return np.int16 if len(self.topo.link_src) < (1 << 15) - 1 else np.int32

    def _hops(self, src: Any, dst: Any, per_sender: int) -> Any:
        """A step's routes as rows of links and at least one -1 (fifosteps.py), pairs counted;
        the step's messages come in runs of `per_sender` from one sender to distinct peers."""
        import numpy as np

        router = self.router
        if isinstance(router, FabricRouter) and not router._dead:
            from chakra_sim_network_congestion.fabric_routes import fabric_hops, next_seqs_by_source
            seqs = next_seqs_by_source(router._sent, src, dst, per_sender)
            if self._advanced is not None:
                self._advanced.append((src, dst))
            assert self.topo.fabric is not None
            return fabric_hops(self.topo.fabric, src, dst, seqs, spare=1, dtype=self._link_type())
        routes = [router.route_next(s, d) for s, d in zip(src.tolist(), dst.tolist())]
        hops: Any = np.full((len(routes), max(map(len, routes), default=0) + 1), -1, dtype=self._link_type())
        for row, route in zip(hops, routes):
            row[:len(route)] = route
        return hops

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
        if isinstance(self.links, FifoLinks):
            self.links.settle()
        stats, topo = self.links.stats, self.topo
        makespan = max(self.context.scheduler.now, 1)
        link_bytes, messages, busy, peak = stats.bytes, stats.messages, stats.busy, stats.peak
        steps = self.links.flow_steps if isinstance(self.links, FairLinks) else None
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

    def summary(self) -> JsonObject:
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
