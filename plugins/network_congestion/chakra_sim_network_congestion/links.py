"""FIFO link queues: a message waits for each link of its route in turn.

A message crosses its route hop by hop; at each link it waits until the
link is free (links serve messages in the order their first byte arrives)
and occupies it while its bytes cross. Two ways to forward:

- store and forward (ASTRA-sim's congestion-aware backend, whose chunks move
  link by link whole): the link is busy int(bytes / bandwidth) ns, and the
  message reaches the next device int(latency + bytes / bandwidth) ns after it
  started there. A message over h equal hops takes h serialisations.
- cut-through (pipelined, as switches forward packets): the first byte moves
  on as soon as it arrives, one latency per hop; the last byte leaves a link
  once the link has sent every byte and once it has itself arrived from the
  previous link. On idle links a message takes the sum of the latencies plus
  one serialisation at the slowest link, int(sum(latency) + bytes / min(bw)),
  as the analytical backend and `fair` give.

Closed form (claims.py): `transfer` computes a claimed message's hops at
once, and `transfer_uniform` a whole ring-like run whose messages never find
a link busy. Steps of messages (fifosteps.py): a collective claimed as a
whole (`claim_group`) has each step's messages timed at once, exactly as
here. Per-link statistics: bytes carried, busy time, peak concurrent
messages.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from chakra_sim_network_congestion.claims import SHARED, ClaimedLinks

if TYPE_CHECKING:
    from chakra_core import Scheduler
    from chakra_sim_network_congestion.fifosteps import FifoSteps


class _Chunk:
    __slots__ = ("route", "index", "size", "on_arrival", "arg", "head", "tail")

    def __init__(self, route: tuple[int, ...], size: int, on_arrival: Callable[[Any], None], arg: Any,
                 sent: float) -> None:
        self.route, self.index, self.size, self.on_arrival, self.arg = route, 0, size, on_arrival, arg
        # cut-through: when the first byte reaches the next link, and when the last byte has
        # reached it (a chunk's event fires at floor(head))
        self.head = self.tail = sent


class FifoLinks(ClaimedLinks):
    """Chunks through per-link FIFO queues (one event per hop).

    A chunk's start on a link is computed when it reaches the link (max of
    now and the link's free time): the same schedule as an explicit queue
    served in arrival order, without link-free events.
    """

    def __init__(self, bandwidth: list[float], latency: list[float], scheduler: Scheduler,
                 shared: Iterable[int] = (), on_shared: Callable[[frozenset[int]], None] | None = None,
                 cut_through: bool = False) -> None:
        super().__init__(len(bandwidth), shared, on_shared)
        self.bw, self.lat, self.scheduler = bandwidth, latency, scheduler
        self.cut_through = cut_through
        self.queued = [0] * len(bandwidth)       # chunks waiting or in service (for the peak)
        self.hinted = frozenset(shared)
        """Links a previous attempt found shared: never claimed for steps again in this run."""
        self.flow_steps: FifoSteps | None = None     # once a collective is claimed as steps

    def send(self, route: tuple[int, ...], size: int, on_arrival: Callable[[Any], None], arg: Any) -> None:
        if not route:
            self.scheduler.schedule(0, on_arrival, arg)
            return
        self._hop(_Chunk(route, size, on_arrival, arg, self.scheduler.now))

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
        if self.cut_through:
            chunk.head, chunk.tail = self._pipe(link, size, chunk.head, chunk.tail)
            arrival = int(chunk.head) if index + 1 < len(route) else int(chunk.tail)
        else:
            arrival = self._serve(link, size, now)
        if index + 1 < len(route):
            chunk.index = index + 1
            scheduler.schedule_at(arrival, self._hop, chunk)
        else:
            scheduler.schedule_at(arrival, self._deliver, chunk)

    def _serve(self, link: int, size: int, t: int) -> int:
        """A message reaching `link` at `t` is served once the link is free (FIFO): occupy the link
        and count it; return when the message reaches the link's far end (store and forward)."""
        start = int(self.free_at[link])    # whole ns when storing and forwarding
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

    def _pipe(self, link: int, size: int, head: float, tail: float) -> tuple[float, float]:
        """Cut-through: a message whose first byte reaches `link` at `head` and whose last byte has
        arrived by `tail` starts once the link is free, and its last byte leaves once the link
        has sent it all and not before it arrived; returns (head, tail) at the far end."""
        start = self.free_at[link]
        if start < head:
            start = head
        end = start + size / self.bw[link]
        if end < tail:
            end = tail
        self.free_at[link] = end
        stats = self.stats
        stats.bytes[link] += size
        stats.busy[link] += end - start
        stats.messages[link] += 1
        latency = self.lat[link]
        return start + latency, end + latency

    def _deliver(self, chunk: _Chunk) -> None:
        self.queued[chunk.route[-1]] -= 1
        chunk.on_arrival(chunk.arg)

    # Steps of messages (fifosteps.py) --------------------------------------------------------------
    def _share(self, link: int, now: int) -> None:
        steps = self.flow_steps
        if steps is not None and steps.held[link]:
            # a step's message at this ns or later would have been served in between
            if steps.until[link] >= now:
                self.on_shared(frozenset({link}))
            steps.give_back(link)
        super()._share(link, now)

    def claim_group(self, links: Iterable[int]) -> list[int] | None:
        """Claim links for one collective's steps, whichever of its members send on them: the
        claimed links, or None (nothing claimed) when one may carry other traffic: shared in a
        previous attempt, holding a message now, or claimed and not yet over."""
        now = self.scheduler.now
        owner, pending, until, queued, hinted = self.owner, self.pending, self.cf_until, self.queued, self.hinted
        if self.flow_steps is None:
            from chakra_sim_network_congestion.fifosteps import FifoSteps
            self.flow_steps = FifoSteps(self)
        steps_until = self.flow_steps.until
        wanted = list(links)
        for link in wanted:
            holder = owner[link]
            if holder == SHARED:
                if link in hinted or queued[link]:
                    return None
            elif holder >= 0 and (pending[link] or until[link] > now or steps_until[link] >= now):
                return None
        self.flow_steps.take(wanted)
        return self._grant_group(wanted)

    def settle(self) -> None:
        """Every link's state back in the lists (for the statistics)."""
        if self.flow_steps is not None:
            self.flow_steps.give_back_all()

    # Closed form (claims.py) ------------------------------------------------------------------------
    def transfer(self, route: tuple[int, ...], size: int, send_time: int) -> int:
        """A closed-form message along claimed links: their state as its hops would leave it;
        returns its arrival time. Reports `on_shared` if a link would serve it out of order."""
        t: float = send_time
        tail: float = send_time
        stats = self.stats
        last = len(route) - 1
        for index, link in enumerate(route):
            if t < self.cf_last[link]:
                self.on_shared(frozenset({link}))
            self._note(link)
            # A message counts on a link from its event there to its next one, as _hop counts it:
            # its event at the next link (when its first byte gets there) or its delivery
            if self.cut_through:
                head, tail = self._pipe(link, size, t, tail)
                depart: float = int(head) if index < last else int(tail)
                done: float = tail         # when its last byte has crossed the link
            else:
                head = depart = done = self._serve(link, size, int(t))
            departs = self.cf_departs.get(link)
            if departs is None:
                departs = self.cf_departs[link] = deque()
            while departs and departs[0] <= int(t):
                departs.popleft()
            departs.append(depart)
            if len(departs) > stats.peak[link]:
                stats.peak[link] = len(departs)
            self.cf_last[link] = t
            if done > self.cf_until[link]:
                self.cf_until[link] = done
            t = head
        return int(tail if self.cut_through else t)

    def transfer_uniform(self, routes: list[tuple[int, ...]], step_bytes: Sequence[int],
                         send_times: Sequence[int]) -> bool:
        """Every route carries step k's message, sent at send_times[k]. When every link of every
        route is idle at the first send and each message has arrived before the next is sent,
        no message waits anywhere: record them all and return True; else change nothing and
        return False."""
        free_at, bw, lat, cf_until = self.free_at, self.bw, self.lat, self.cf_until
        first = send_times[0]
        checked: set[tuple[tuple[float, float], ...]] = set()
        for route in routes:
            for link in route:
                if free_at[link] > first or cf_until[link] > first:
                    return False
            shape = tuple((lat[link], bw[link]) for link in route)
            if shape in checked:
                continue
            checked.add(shape)
            slowest = min(w for _, w in shape)
            for k in range(len(step_bytes) - 1):
                b = step_bytes[k]
                # cut-through: every link has sent the message when the next one's head arrives
                busy = b / slowest if self.cut_through else sum(int(la + b / w) for la, w in shape)
                if send_times[k + 1] < send_times[k] + busy:
                    return False
        stats = self.stats
        steps, total = len(step_bytes), sum(step_bytes)
        busy_by_bw: dict[float, int] = {}
        last_bytes, last_send = step_bytes[-1], send_times[-1]
        for route in routes:
            t: float = last_send          # the last message's hops set what the links remember
            slowest = float("inf")        # cut-through: the slowest link so far paces the bytes
            for index, link in enumerate(route):
                self._note(link)
                link_bw = bw[link]
                if self.cut_through:
                    slowest = min(slowest, link_bw)
                    stats.busy[link] += sum(b / slowest for b in step_bytes)
                    free_at[link] = t + last_bytes / slowest
                    head, depart = t + lat[link], t + lat[link] + last_bytes / slowest
                else:
                    whole_ns = busy_by_bw.get(link_bw)
                    if whole_ns is None:
                        whole_ns = busy_by_bw[link_bw] = sum(int(b / link_bw) for b in step_bytes)
                    stats.busy[link] += whole_ns
                    free_at[link] = t + int(last_bytes / link_bw)
                    head = depart = t + int(lat[link] + last_bytes / link_bw)
                stats.bytes[link] += total
                stats.messages[link] += steps
                if stats.peak[link] < 1:
                    stats.peak[link] = 1
                self.cf_last[link] = t
                cf_until[link] = depart
                # it counts on the link until its next event (as in transfer)
                self.cf_departs[link] = deque((int(head) if index < len(route) - 1 else int(depart),))
                t = head
        return True
