"""Max-min fair flows on links (`mode: fair`), and their closed form on claimed links.

A message is a flow over all links of its route at once (flow-level, as
SimGrid-style models); active flows share every link max-min fairly
(progressive filling, `fairshare.MaxMinFair`), recomputed once per instant
at which flows start or end, for the flows connected to those through shared
links only; a flow's bytes are delivered `sum of link latencies` after its
last byte left the source. On an idle path this is exactly the analytical
backend's `int(hops x latency + bytes / bandwidth)`, and cut-through `fifo`'s.

Per-link statistics: bytes carried, busy time, peak concurrent flows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from chakra_sim_network_congestion.claims import SHARED, ClaimedLinks
from chakra_sim_network_congestion.fairshare import MaxMinFair

if TYPE_CHECKING:
    from chakra_core import Scheduler
    from chakra_sim_network_congestion.flows import FlowSteps


class _Flow:
    __slots__ = ("seq", "route", "size", "remaining", "rate", "since", "start", "latency", "version",
                 "finish", "on_arrival", "arg")

    def __init__(self, seq: int, route: tuple[int, ...], size: int, latency: float, start: int,
                 on_arrival: Callable[[Any], None], arg: Any) -> None:
        self.seq, self.route, self.size, self.latency, self.start = seq, route, size, latency, start
        self.remaining = float(size)
        """Bytes still to leave the source at `since`, when `rate` took effect."""
        self.rate = 0.0
        self.since = start
        self.version = 0
        self.finish: float | None = None
        self.on_arrival, self.arg = on_arrival, arg


class FairLinks(ClaimedLinks):
    """Max-min fair sharing between concurrent flows, recomputed once per timestamp with changes.

    The rates come from `fairshare.MaxMinFair`, which re-solves only the connected components
    (flows linked through shared links) that flows started or ended in; every other flow keeps
    its rate and its completion event. A flow's remaining bytes are brought up to date only
    when its rate changes (they drain linearly in between). Flows are numbered in sending
    order and handled in that order, so the run is deterministic.
    """

    def __init__(self, bandwidth: list[float], latency: list[float], scheduler: Scheduler,
                 shared: Iterable[int] = (), on_shared: Callable[[frozenset[int]], None] | None = None) -> None:
        super().__init__(len(bandwidth), shared, on_shared)
        self.hinted = frozenset(shared)
        """Links a previous attempt found shared: never claimed again in this run."""
        self.bw, self.lat, self.scheduler = bandwidth, latency, scheduler
        self.flow_steps: FlowSteps | None = None     # once a collective is claimed as flows
        self.solver = MaxMinFair(bandwidth)
        self.flows: dict[int, _Flow] = {}
        self.next_seq = 0
        self.pending_recompute = False
        self._busy_since: list[int | None] = [None] * len(bandwidth)

    @property
    def on_link(self) -> list[dict[int, None]]:
        """The ids of the flows on each link, in sending order."""
        return self.solver.on_link

    def send(self, route: tuple[int, ...], size: int, on_arrival: Callable[[Any], None], arg: Any) -> None:
        now = self.scheduler.now
        latency = sum(map(self.lat.__getitem__, route))
        if not route:
            self.scheduler.schedule(0, on_arrival, arg)
            return
        stats = self.stats
        if size == 0:     # crosses in no time: a message on each link for an instant
            for link in route:
                stats.messages[link] += 1
                if not stats.peak[link]:
                    stats.peak[link] = 1
            self.scheduler.schedule(int(latency), on_arrival, arg)
            return
        owner = self.owner
        for link in route:
            if owner[link] != SHARED:
                self._share(link, now)
        seq = self.next_seq
        self.next_seq = seq + 1
        self.flows[seq] = _Flow(seq, route, size, latency, now, on_arrival, arg)
        solver = self.solver
        solver.add(seq, route)
        on_link, busy_since = solver.on_link, self._busy_since
        link_bytes, messages, peak = stats.bytes, stats.messages, stats.peak
        for link in route:
            members = len(on_link[link])
            if members == 1:
                busy_since[link] = now
            link_bytes[link] += size
            messages[link] += 1
            if members > peak[link]:
                peak[link] = members
        if not self.pending_recompute:
            self.pending_recompute = True
            self.scheduler.schedule(0, self._recompute)

    def _recompute(self, _arg: object = None) -> None:
        self.pending_recompute = False
        now = self.scheduler.now
        flows, schedule_at, complete = self.flows, self.scheduler.schedule_at, self._complete
        rates = self.solver.rates
        for seq in self.solver.update():   # only the changed rates: other events still hold
            flow = flows[seq]
            rate = rates[seq]
            flow.remaining -= flow.rate * (now - flow.since)
            flow.since = now
            flow.rate = rate
            flow.version += 1
            flow.finish = finish = now + max(flow.remaining, 0.0) / rate
            # Integer event times: the flow leaves its links at the ns its last byte leaves
            # (floor), and its delivery, computed from the exact finish, is never earlier.
            end = int(finish)
            schedule_at(end if end > now else now, complete, (flow, flow.version))

    def _complete(self, arg: tuple[_Flow, int]) -> None:
        flow, version = arg
        flows = self.flows
        if flow.version != version or flow.seq not in flows:
            return
        now = self.scheduler.now
        del flows[flow.seq]
        self.solver.remove(flow.seq)
        on_link, busy_since, busy = self.solver.on_link, self._busy_since, self.stats.busy
        for link in flow.route:
            if not on_link[link]:
                since = busy_since[link]
                assert since is not None   # set while the link carries flows
                busy[link] += now - since
                busy_since[link] = None
        assert flow.finish is not None   # set by the _recompute that scheduled this event
        delivered = flow.start + int(flow.latency + (flow.finish - flow.start))
        self.scheduler.schedule_at(delivered if delivered > now else now, flow.on_arrival, flow.arg)
        if flows and not self.pending_recompute:
            self.pending_recompute = True
            self.scheduler.schedule(0, self._recompute)

    # Flow level (flows.py) ------------------------------------------------------------------------
    def _share(self, link: int, now: int) -> None:
        steps = self.flow_steps
        if steps is not None and self.owner[link] >= 0 and steps.free_at[link] > now:
            self.on_shared(frozenset({link}))
        super()._share(link, now)

    def claim_group(self, links: Iterable[int]) -> list[int] | None:
        """Claim links for one collective's flows, whichever of its members send on them: the
        claimed links, or None (nothing claimed) when one may carry other traffic: shared in a
        previous attempt, carrying message-by-message flows now, or claimed and not yet over."""
        now = self.scheduler.now
        owner, pending, until, on_link, hinted = self.owner, self.pending, self.cf_until, self.solver.on_link, self.hinted
        if self.flow_steps is None:
            from chakra_sim_network_congestion.flows import FlowSteps
            self.flow_steps = FlowSteps(self.bw, self.lat)
        flow_until = self.flow_steps.free_at
        wanted = list(links)
        for link in wanted:
            holder = owner[link]
            if holder == SHARED:
                if link in hinted or on_link[link]:
                    return None
            elif holder >= 0 and (pending[link] or until[link] > now or flow_until[link] > now):
                return None
        return self._grant_group(wanted)

    # Closed form (claims.py) ------------------------------------------------------------------------
    # A claimed link carries one sender's closed-form messages. While they do not overlap in time,
    # each is a flow alone on its links: it gets their smallest bandwidth, and its bytes, busy time
    # and delivery are computed below exactly as send/_recompute/_complete would. One that would
    # overlap the previous one on a link (or come too close to tell: within 1 ns) is reported
    # `on_shared`: only the solver can time flows that share.

    def transfer(self, route: tuple[int, ...], size: int, send_time: int) -> int:
        """A closed-form message along claimed links; returns its arrival time."""
        if not route:
            return send_time
        stats, free_at, cf_last, cf_until = self.stats, self.free_at, self.cf_last, self.cf_until
        latency = sum(map(self.lat.__getitem__, route))
        if size == 0:
            for link in route:
                self._note(link)
                stats.messages[link] += 1
                if not stats.peak[link]:
                    stats.peak[link] = 1
            return send_time + int(latency)
        finish = send_time + size / min(map(self.bw.__getitem__, route))
        for link in route:
            if send_time < cf_last[link] or send_time < free_at[link] + 1:
                self.on_shared(frozenset({link}))
            self._note(link)
            stats.bytes[link] += size
            stats.messages[link] += 1
            stats.busy[link] += int(finish) - send_time
            if not stats.peak[link]:
                stats.peak[link] = 1
            free_at[link] = finish
            cf_last[link] = send_time
            if finish > cf_until[link]:
                cf_until[link] = finish
        return send_time + int(latency + (finish - send_time))

    def transfer_uniform(self, routes: list[tuple[int, ...]], step_bytes: Sequence[int],
                         send_times: Sequence[int]) -> bool:
        """Every route carries step k's message, sent at send_times[k]. When every link is idle at
        the first send and every message has left its links 1 ns before the next is sent, record
        them all and return True; else change nothing and return False."""
        if not routes or not all(routes):
            return False
        free_at, bw, cf_until = self.free_at, self.bw, self.cf_until
        first = send_times[0]
        checked: set[float] = set()
        for route in routes:
            for link in route:
                if free_at[link] + 1 > first or cf_until[link] > first:
                    return False
            slowest = min(map(bw.__getitem__, route))
            if slowest in checked:
                continue
            checked.add(slowest)
            for k in range(len(step_bytes) - 1):
                if send_times[k + 1] < send_times[k] + step_bytes[k] / slowest + 1:
                    return False
        stats = self.stats
        steps, total = len(step_bytes), sum(step_bytes)
        last_send = send_times[-1]
        busy_by_bw: dict[float, tuple[int, float]] = {}
        for route in routes:
            slowest = min(map(bw.__getitem__, route))
            known = busy_by_bw.get(slowest)
            if known is None:
                busy = sum(int(t + b / slowest) - t for t, b in zip(send_times, step_bytes) if b)
                known = busy_by_bw[slowest] = (busy, last_send + step_bytes[-1] / slowest)
            busy, finish = known
            for link in route:
                self._note(link)
                stats.bytes[link] += total
                stats.busy[link] += busy
                stats.messages[link] += steps
                if stats.peak[link] < 1:
                    stats.peak[link] = 1
                free_at[link] = finish
                self.cf_last[link] = last_send
                cf_until[link] = finish
        return True
