"""Bandwidth sharing on links: FIFO chunk queues, or max-min fair flows.

`fifo` (ASTRA-sim's congestion-aware backend): a message crosses its route
hop by hop; at each link it waits until the link is free, occupies it for
int(bytes / bandwidth) ns, and reaches the next device int(latency +
bytes / bandwidth) ns after it started (store and forward). Links serve
messages in arrival order.

`fair` (flow-level, as SimGrid-style models): a message is a flow over all
links of its route at once; active flows share every link max-min fairly
(progressive filling), recomputed whenever a flow starts or ends; a flow's
bytes are delivered `sum of link latencies` after its last byte left the
source. On an idle path this is exactly the analytical backend's
`int(hops x latency + bytes / bandwidth)`.

Both keep per-link statistics: bytes carried, busy time, peak concurrent
messages.
"""

from __future__ import annotations

from typing import Any, Callable


class LinkStats:
    __slots__ = ("bytes", "busy", "peak", "messages")

    def __init__(self, count: int):
        self.bytes = [0] * count
        self.busy = [0.0] * count
        self.peak = [0] * count
        self.messages = [0] * count


class _Chunk:
    __slots__ = ("route", "index", "size", "on_arrival", "arg")

    def __init__(self, route, size, on_arrival, arg):
        self.route, self.index, self.size, self.on_arrival, self.arg = route, 0, size, on_arrival, arg


class FifoLinks:
    """Store-and-forward chunks through per-link FIFO queues (one event per hop).

    A chunk's start on a link is computed when it reaches the link (max of
    now and the link's free time): the same schedule as an explicit queue
    served in arrival order, without link-free events.
    """

    def __init__(self, bandwidth: list[float], latency: list[float], scheduler):
        self.bw, self.lat, self.scheduler = bandwidth, latency, scheduler
        self.free_at = [0] * len(bandwidth)
        self.queued = [0] * len(bandwidth)       # chunks waiting or in service (for the peak)
        self.stats = LinkStats(len(bandwidth))

    def send(self, route: tuple[int, ...], size: int, on_arrival: Callable[[Any], None], arg: Any) -> None:
        if not route:
            self.scheduler.schedule(0, on_arrival, arg)
            return
        self._hop(_Chunk(route, size, on_arrival, arg))

    def _hop(self, chunk: _Chunk) -> None:
        route, index, size = chunk.route, chunk.index, chunk.size
        if index:
            self.queued[route[index - 1]] -= 1
        link = route[index]
        scheduler = self.scheduler
        now = scheduler.now
        start = self.free_at[link]
        if start < now:
            start = now
        transfer = size / self.bw[link]
        end = start + int(transfer)
        self.free_at[link] = end
        stats = self.stats
        queued = self.queued[link] = self.queued[link] + 1
        if queued > stats.peak[link]:
            stats.peak[link] = queued
        stats.bytes[link] += size
        stats.busy[link] += end - start
        stats.messages[link] += 1
        arrival = start + int(self.lat[link] + transfer)
        if index + 1 < len(route):
            chunk.index = index + 1
            scheduler.schedule_at(arrival, self._hop, chunk)
        else:
            scheduler.schedule_at(arrival, self._deliver, chunk)

    def _deliver(self, chunk: _Chunk) -> None:
        self.queued[chunk.route[-1]] -= 1
        chunk.on_arrival(chunk.arg)


class _Flow:
    __slots__ = ("seq", "route", "size", "remaining", "rate", "start", "latency", "version", "finish",
                 "on_arrival", "arg")

    def __init__(self, seq, route, size, latency, start, on_arrival, arg):
        self.seq, self.route, self.size, self.latency, self.start = seq, route, size, latency, start
        self.remaining = float(size)
        self.rate = 0.0
        self.version = 0
        self.finish = None
        self.on_arrival, self.arg = on_arrival, arg


class FairLinks:
    """Max-min fair sharing between concurrent flows, recomputed once per timestamp with changes.

    Flows live in insertion-ordered dicts keyed by a sequence number, so every
    iteration order, and hence the run, is deterministic.
    """

    def __init__(self, bandwidth: list[float], latency: list[float], scheduler):
        self.bw, self.lat, self.scheduler = bandwidth, latency, scheduler
        self.on_link: list[dict[int, _Flow]] = [dict() for _ in bandwidth]
        self.flows: dict[int, _Flow] = {}
        self.next_seq = 0
        self.last_update = 0
        self.pending_recompute = False
        self.stats = LinkStats(len(bandwidth))
        self._busy_since: list[int | None] = [None] * len(bandwidth)

    def send(self, route: tuple[int, ...], size: int, on_arrival: Callable[[Any], None], arg: Any) -> None:
        now = self.scheduler.now
        latency = sum(self.lat[link] for link in route)
        if not route:
            self.scheduler.schedule(0, on_arrival, arg)
            return
        stats = self.stats
        if size == 0:
            for link in route:
                stats.messages[link] += 1
            self.scheduler.schedule(int(latency), on_arrival, arg)
            return
        self._advance(now)
        flow = _Flow(self.next_seq, route, size, latency, now, on_arrival, arg)
        self.next_seq += 1
        self.flows[flow.seq] = flow
        for link in route:
            members = self.on_link[link]
            if not members:
                self._busy_since[link] = now
            members[flow.seq] = flow
            stats.bytes[link] += size
            stats.messages[link] += 1
            if len(members) > stats.peak[link]:
                stats.peak[link] = len(members)
        self._request_recompute()

    def _advance(self, now: int) -> None:
        """Drain bytes at the current rates up to `now`."""
        elapsed = now - self.last_update
        if elapsed > 0:
            for flow in self.flows.values():
                flow.remaining -= flow.rate * elapsed
        self.last_update = now

    def _request_recompute(self) -> None:
        if not self.pending_recompute:
            self.pending_recompute = True
            self.scheduler.schedule(0, self._recompute)

    def _recompute(self, _arg=None) -> None:
        self.pending_recompute = False
        now = self.scheduler.now
        self._advance(now)
        rates = self._max_min()
        for seq, flow in self.flows.items():
            rate = rates[seq]
            if rate == flow.rate and flow.finish is not None:
                continue   # unchanged rate: its completion event still holds
            flow.rate = rate
            flow.version += 1
            flow.finish = now + max(flow.remaining, 0.0) / rate
            # Integer event times: the flow leaves its links at the ns its last byte leaves
            # (floor), and its delivery, computed from the exact finish, is never earlier.
            self.scheduler.schedule_at(max(now, int(flow.finish)), self._complete, (flow, flow.version))

    def _max_min(self) -> dict[int, float]:
        """Progressive filling: saturate the link with the smallest fair share, freeze its flows, repeat."""
        capacity: dict[int, float] = {}
        unfrozen: dict[int, int] = {}
        for flow in self.flows.values():
            for link in flow.route:
                if link in unfrozen:
                    unfrozen[link] += 1
                else:
                    capacity[link] = self.bw[link]
                    unfrozen[link] = 1
        rates: dict[int, float] = {}
        while len(rates) < len(self.flows):
            link = min((l for l, count in unfrozen.items() if count),
                       key=lambda l: (capacity[l] / unfrozen[l], l))
            share = capacity[link] / unfrozen[link]
            for seq, flow in self.on_link[link].items():
                if seq in rates:
                    continue
                rates[seq] = share
                for other in flow.route:
                    capacity[other] -= share
                    unfrozen[other] -= 1
        return rates

    def _complete(self, arg) -> None:
        flow, version = arg
        if flow.version != version or flow.seq not in self.flows:
            return
        now = self.scheduler.now
        self._advance(now)
        del self.flows[flow.seq]
        for link in flow.route:
            members = self.on_link[link]
            del members[flow.seq]
            if not members:
                self.stats.busy[link] += now - self._busy_since[link]
                self._busy_since[link] = None
        delivered = flow.start + int(flow.latency + (flow.finish - flow.start))
        self.scheduler.schedule_at(max(now, delivered), flow.on_arrival, flow.arg)
        if self.flows:
            self._request_recompute()
