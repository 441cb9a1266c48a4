"""Bandwidth sharing on links: FIFO chunk queues, or max-min fair flows.

`fifo` (ASTRA-sim's congestion-aware backend): a message crosses its route
hop by hop; at each link it waits until the link is free, occupies it for
int(bytes / bandwidth) ns, and reaches the next device int(latency +
bytes / bandwidth) ns after it started (store and forward). Links serve
messages in arrival order.

Closed form (`fifo` only): where a link carries the messages of one sender
only, a FIFO queue serves them in the order that sender sent them, so their
times need no events: `transfer` computes a message's hops at once, and
`transfer_uniform` a whole ring-like run whose messages never find a link
busy. The system layer uses this for collectives whose links it has claimed
(`claim`); every link remembers the one sender that may use it this way.
Message-by-message traffic on such a link while closed-form traffic is
still pending on it would have to be served in between; that cannot happen
after the fact, so the links report it (`on_shared`) and the network asks for
a restart knowing the link is shared (see CongestionNetwork).

`fair` (flow-level, as SimGrid-style models): a message is a flow over all
links of its route at once; active flows share every link max-min fairly
(progressive filling, `fairshare.MaxMinFair`), recomputed once per instant
at which flows start or end, for the flows connected to those through shared
links only; a flow's bytes are delivered `sum of link latencies` after its
last byte left the source. On an idle path this is exactly the analytical
backend's `int(hops x latency + bytes / bandwidth)`.

Both keep per-link statistics: bytes carried, busy time, peak concurrent
messages.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from chakra_sim_network_congestion.fairshare import MaxMinFair

if TYPE_CHECKING:
    from chakra_core import Scheduler



class LinkStats:
    __slots__ = ("bytes", "busy", "peak", "messages")

    def __init__(self, count: int) -> None:
        self.bytes = [0] * count
        self.busy = [0.0] * count
        self.peak = [0] * count
        self.messages = [0] * count


class _Chunk:
    __slots__ = ("route", "index", "size", "on_arrival", "arg")

    def __init__(self, route: tuple[int, ...], size: int, on_arrival: Callable[[Any], None], arg: Any) -> None:
        self.route, self.index, self.size, self.on_arrival, self.arg = route, 0, size, on_arrival, arg


class FifoLinks:
    """Store-and-forward chunks through per-link FIFO queues (one event per hop).

    A chunk's start on a link is computed when it reaches the link (max of
    now and the link's free time): the same schedule as an explicit queue
    served in arrival order, without link-free events.
    """

    def __init__(self, bandwidth: list[float], latency: list[float], scheduler: Scheduler,
                 shared: Iterable[int] = (), on_shared: Callable[[frozenset[int]], None] | None = None) -> None:
        self.bw, self.lat, self.scheduler = bandwidth, latency, scheduler
        self.on_shared = on_shared or (lambda links: None)
        """Told when closed-form traffic was timed on links that turn out to carry other traffic
        (or to serve it out of order): what was timed is wrong and the run must start over."""
        count = len(bandwidth)
        self.free_at = [0] * count
        self.queued = [0] * count       # chunks waiting or in service (for the peak)
        self.stats = LinkStats(count)
        # Closed form: the one sender whose closed-form messages a link carries (FREE, SHARED),
        # claims not yet timed, when the last closed-form message leaves it, where that message
        # arrived at it, and when the closed-form messages still on it leave.
        self.owner = [FREE] * count
        for link in shared:
            self.owner[link] = SHARED
        self.pending = [0] * count
        self.cf_until = [0] * count
        self.cf_last = [0] * count
        self.cf_departs: dict[int, deque] = {}
        self._journal: dict[int, tuple] | None = None

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
        if self.owner[link] != SHARED:
            self._share(link, now)
        queued = self.queued[link] = self.queued[link] + 1
        if queued > self.stats.peak[link]:
            self.stats.peak[link] = queued
        arrival = self._serve(link, size, now)
        if index + 1 < len(route):
            chunk.index = index + 1
            scheduler.schedule_at(arrival, self._hop, chunk)
        else:
            scheduler.schedule_at(arrival, self._deliver, chunk)

    def _serve(self, link: int, size: int, t: int) -> int:
        """A message reaching `link` at `t` is served once the link is free (FIFO): occupy the link
        and count it; return when the message reaches the link's far end (store and forward)."""
        start = self.free_at[link]
        if start < t:
            start = t
        transfer = size / self.bw[link]
        end = start + int(transfer)
        self.free_at[link] = end
        stats = self.stats
        stats.bytes[link] += size
        stats.busy[link] += end - start
        stats.messages[link] += 1
        return start + int(self.lat[link] + transfer)

    def _deliver(self, chunk: _Chunk) -> None:
        self.queued[chunk.route[-1]] -= 1
        chunk.on_arrival(chunk.arg)

    # Closed form ----------------------------------------------------------------------------------
    def _share(self, link: int, now: int) -> None:
        """From now on `link` carries message-by-message traffic too. Closed-form traffic still
        to come on it would have been served in between: that run must start over."""
        if self.owner[link] >= 0 and (self.pending[link] or self.cf_until[link] > now):
            self.on_shared(frozenset({link}))
        self.owner[link] = SHARED

    def claim(self, routes: Iterable[tuple[int, tuple[int, ...]]]) -> list[int] | None:
        """Claim the links of (sender, route) pairs for closed-form messages; the claimed links,
        or None (nothing claimed) when a link is shared or another sender's."""
        owner = self.owner
        wanted: dict[int, int] = {}
        for sender, route in routes:
            for link in route:
                holder = wanted.setdefault(link, sender)
                if holder != sender or owner[link] == SHARED or (owner[link] >= 0 and owner[link] != sender):
                    return None
        for link, sender in wanted.items():
            owner[link] = sender
            self.pending[link] += 1
        return list(wanted)

    def release(self, links: Iterable[int]) -> None:
        """A claim's messages are all timed."""
        for link in links:
            self.pending[link] -= 1

    def transfer(self, route: tuple[int, ...], size: int, send_time: int) -> int:
        """A closed-form message along claimed links: their state as its hops would leave it;
        returns its arrival time. Reports `on_shared` if a link would serve it out of order."""
        t = send_time
        stats = self.stats
        for link in route:
            if t < self.cf_last[link]:
                self.on_shared(frozenset({link}))
            self._note(link)
            depart = self._serve(link, size, t)
            departs = self.cf_departs.get(link)
            if departs is None:
                departs = self.cf_departs[link] = deque()
            while departs and departs[0] <= t:
                departs.popleft()
            departs.append(depart)
            if len(departs) > stats.peak[link]:
                stats.peak[link] = len(departs)
            self.cf_last[link] = t
            if depart > self.cf_until[link]:
                self.cf_until[link] = depart
            t = depart
        return t

    def transfer_uniform(self, routes: list[tuple[int, ...]], step_bytes: Sequence[int],
                         send_times: Sequence[int]) -> bool:
        """Every route carries step k's message, sent at send_times[k]. When every link of every
        route is idle at the first send and each message has arrived before the next is sent,
        no message waits anywhere: record them all and return True; else change nothing and
        return False."""
        free_at, bw, lat, cf_until = self.free_at, self.bw, self.lat, self.cf_until
        first = send_times[0]
        checked: set[tuple] = set()
        for route in routes:
            for link in route:
                if free_at[link] > first or cf_until[link] > first:
                    return False
            shape = tuple((lat[link], bw[link]) for link in route)
            if shape in checked:
                continue
            checked.add(shape)
            for k in range(len(step_bytes) - 1):
                b = step_bytes[k]
                if send_times[k + 1] < send_times[k] + sum(int(la + b / w) for la, w in shape):
                    return False
        stats = self.stats
        steps, total = len(step_bytes), sum(step_bytes)
        busy_by_bw: dict[float, int] = {}
        last_bytes, last_send = step_bytes[-1], send_times[-1]
        for route in routes:
            t = last_send          # the last message's hops set what the links remember
            for link in route:
                self._note(link)
                link_bw = bw[link]
                busy = busy_by_bw.get(link_bw)
                if busy is None:
                    busy = busy_by_bw[link_bw] = sum(int(b / link_bw) for b in step_bytes)
                stats.bytes[link] += total
                stats.busy[link] += busy
                stats.messages[link] += steps
                if stats.peak[link] < 1:
                    stats.peak[link] = 1
                free_at[link] = t + int(last_bytes / link_bw)
                depart = t + int(lat[link] + last_bytes / link_bw)
                self.cf_last[link] = t
                cf_until[link] = depart
                self.cf_departs[link] = deque((depart,))
                t = depart
        return True

    def checkpoint(self) -> None:
        """Remember every link's state as first changed from now on, until rollback/commit."""
        self._journal = {}

    def _note(self, link: int) -> None:
        journal = self._journal
        if journal is not None and link not in journal:
            stats = self.stats
            departs = self.cf_departs.get(link)
            journal[link] = (self.free_at[link], stats.bytes[link], stats.busy[link], stats.messages[link],
                             stats.peak[link], self.cf_last[link], self.cf_until[link],
                             None if departs is None else deque(departs))

    def rollback(self) -> None:
        stats = self.stats
        for link, saved in (self._journal or {}).items():
            (self.free_at[link], stats.bytes[link], stats.busy[link], stats.messages[link],
             stats.peak[link], self.cf_last[link], self.cf_until[link], departs) = saved
            if departs is None:
                self.cf_departs.pop(link, None)
            else:
                self.cf_departs[link] = departs
        self._journal = None

    def commit(self) -> None:
        self._journal = None


FREE, SHARED = -1, -2
"""`FifoLinks.owner` values besides a sender's NPU number."""


class SharedLinkHint:
    """What a restarted run learned: these links carry more than one sender's traffic."""

    def __init__(self, links: frozenset[int]) -> None:
        self.links = links


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


class FairLinks:
    """Max-min fair sharing between concurrent flows, recomputed once per timestamp with changes.

    The rates come from `fairshare.MaxMinFair`, which re-solves only the connected components
    (flows linked through shared links) that flows started or ended in; every other flow keeps
    its rate and its completion event. A flow's remaining bytes are brought up to date only
    when its rate changes (they drain linearly in between). Flows are numbered in sending
    order and handled in that order, so the run is deterministic.
    """

    def __init__(self, bandwidth: list[float], latency: list[float], scheduler: Scheduler) -> None:
        self.bw, self.lat, self.scheduler = bandwidth, latency, scheduler
        self.solver = MaxMinFair(bandwidth)
        self.flows: dict[int, _Flow] = {}
        self.next_seq = 0
        self.pending_recompute = False
        self.stats = LinkStats(len(bandwidth))
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
        if size == 0:
            for link in route:
                stats.messages[link] += 1
            self.scheduler.schedule(int(latency), on_arrival, arg)
            return
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
