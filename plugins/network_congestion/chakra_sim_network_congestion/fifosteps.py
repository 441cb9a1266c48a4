"""A collective's step of messages through FIFO links, timed at once and exactly as one by one.

Sent message by message, a step (every member sends `size` bytes to the members at some
offsets, at its send time) costs an event per hop (FifoLinks): a message reaching a link waits
until the link is free, and a link serves messages in the order their events run, that is by
time (whole ns) and, within a ns, by the order the events were scheduled, which is the order in
which the events that scheduled them ran. `FifoSteps.step` replays that order without events:

- Windows. A hop's event comes at least int(latency) ns after the event that scheduled it, so
  with W the smallest whole-ns latency of the step's links, every event of [t, t + W) was
  scheduled by an event before t. Once those have run, the window's events and their order are
  known: by (time, rank of the event that scheduled it), ranks counting events in the order they
  run. A member's sends (first hops) run in its send event, by its position, then offset.
- Links in bulk. In a window each link serves its messages in that order: the k-th message of
  every link is served at once (numpy over the links) with the arithmetic of FifoLinks._pipe
  (cut-through) or _serve (store and forward), so times and statistics have the same bits.
- Peak concurrent messages: a message counts on a link from its event there to its next one
  (or its delivery), counted in the order the events run.
- Sends in one ns. Where each member's first link carries only its messages, they go back to
  back, in closed form (`sent_together`: np.add.accumulate adds the same numbers in the same
  order as one by one).

Two things the network cannot know: the order of two members' send events in the same ns, and
that of a send and a hop's event in the same ns. Events are also ranked coarsely, members'
sends in one ns alike; two events at one ns on one link, of different senders and equal coarse
rank, are ordered by what is not known. `step` then reports the links where that happens (and
where a message would meet traffic timed before it, which it cannot serve in between): the
network starts the run over, timing them message by message.

While a link carries steps, its FIFO state and statistics live here (`take`, `give_back`), so
that every link's sums are added in the order its messages came, as one by one.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from chakra_sim_network_congestion.links import FifoLinks

_NO_LINK = -1
_LOW = (1 << 32) - 1

_Next = tuple[np.ndarray, np.ndarray | None, np.ndarray | None]
"""Messages' next events (ns) and, with cut-through, where their first and last bytes are then."""


class FifoSteps:
    """Times steps of messages on claimed links (see the module docstring)."""

    def __init__(self, links: FifoLinks) -> None:
        self.links = links
        count = len(links.bw)
        self.bw = np.asarray(links.bw, dtype=np.float64)
        self.lat = np.asarray(links.lat, dtype=np.float64)
        self.cut_through = links.cut_through
        self.held = np.zeros(count, dtype=bool)
        """Links whose state lives here rather than in FifoLinks' lists."""
        self.free = np.zeros(count, dtype=np.float64 if self.cut_through else np.int64)
        self.busy = np.zeros(count, dtype=np.float64)
        self.bytes = np.zeros(count, dtype=np.int64)
        self.messages = np.zeros(count, dtype=np.int64)
        self.peak = np.zeros(count, dtype=np.int64)
        self.until = np.full(count, -1, dtype=np.int64)
        """The last ns at which a step's event arrives at or leaves each link."""
        self._saved: tuple[np.ndarray, ...] | None = None

    # Where a link's state lives ---------------------------------------------------------------------
    def take(self, links: list[int]) -> None:
        """Hold these links' state from now on (a collective claimed them)."""
        fresh = [link for link in links if not self.held[link]]
        if not fresh:
            return
        owner, stats = self.links, self.links.stats
        index = np.asarray(fresh, dtype=np.int64)
        self.free[index] = [owner.free_at[link] for link in fresh]
        self.busy[index] = [stats.busy[link] for link in fresh]
        self.bytes[index] = [stats.bytes[link] for link in fresh]
        self.messages[index] = [stats.messages[link] for link in fresh]
        self.peak[index] = [stats.peak[link] for link in fresh]
        self.held[index] = True

    def give_back(self, link: int) -> None:
        """FifoLinks times this link's messages again (one by one)."""
        owner, stats = self.links, self.links.stats
        owner.free_at[link] = self.free[link].item()
        stats.busy[link] = self.busy[link].item()
        stats.bytes[link] = int(self.bytes[link])
        stats.messages[link] = int(self.messages[link])
        stats.peak[link] = int(self.peak[link])
        self.held[link] = False

    def give_back_all(self) -> None:
        for link in np.flatnonzero(self.held).tolist():
            self.give_back(link)

    # A step --------------------------------------------------------------------------------------------
    def step(self, hops: np.ndarray, starts: np.ndarray, size: int,
             origin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Messages f over the links of row f of `hops` (then -1s, at least one; int16 when the
        links are fewer than 32,767), each of `size` bytes, sent at starts[f] (whole ns) by
        member origin[f], in the order f (a member's in the order it sends them). Returns (each
        message's delivery in whole ns, the links whose order this cannot know: when not empty,
        nothing changed)."""
        arrival = starts.astype(np.int64, copy=True)     # a message to itself: at once
        moving = np.flatnonzero(hops[:, 0] >= 0)
        if not len(moving):
            return arrival, np.empty(0, dtype=np.int64)
        flat = hops.ravel()             # routes in a row, a -1 after each (the last: at -1)
        present = np.zeros(len(self.bw) + 1, dtype=bool)
        present[flat] = True                          # -1 marks the last entry
        used = np.flatnonzero(present[:-1])
        window = int(self.lat[used].min())
        if window < 1:     # events could come in the ns that scheduled them: no windows
            return arrival, used
        self.take(used.tolist())
        if hops.dtype == np.int16:     # link numbers that sort by radix as they are
            queue = _Queues(self, np.arange(len(self.bw)), size)
            route = flat
        else:
            queue = _Queues(self, used, size)
            local = np.full(len(self.bw) + 1, _NO_LINK, dtype=queue.link_type)
            local[used] = np.arange(len(used))
            route = local[flat]
        every = len(moving) == len(starts)      # (then slices, not copies)
        pick = slice(None) if every else moving
        sending = starts[pick]
        base = int(sending.min())
        buckets: dict[int, list[_Batch]] = {}
        pending: list[int] = []
        coarse_base = 0
        at = moving * hops.shape[1]     # each message's first link in the routes laid end to end
        sent = queue.sent_together(route[at], base, origin[pick]) if base == int(sending.max()) else None
        if sent is None:
            first = np.argsort(sending, kind="stable")
            ids, times = moving[first], sending[first]
            begun = times.astype(np.float64) if self.cut_through else None
            _bucket(buckets, pending, _Batch(ids, times, (at[first] << 32), begun, begun), (times - base) // window, 0)
        else:      # the sends' events are timed: on to their next ones (one coarse rank, 0: sends in one ns)
            nxt_time, head, tail = queue.moved(sent, route[at], route[at + 1] < 0)
            coarse_base = 1
            _bucket(buckets, pending, _Batch(moving, nxt_time, ((at + 1) << 32) | 1, head, tail),
                    (nxt_time - base) // window, 1)
        while pending:
            w = heapq.heappop(pending)
            batch = _Batch.joined(buckets.pop(w))
            offset = batch.time - (base + w * window)     # radix sort: within a window, 0..window-1
            order = np.argsort(offset.astype(np.uint16) if window <= 1 << 16 else offset, kind="stable")
            ids, times, place = batch.ids[order], batch.time[order], batch.place[order]
            at, parent = place >> 32, place & _LOW
            out_of, into = route[at - 1], route[at]
            sends = out_of < 0
            if sends.any() and not sends.all() and np.intersect1d(times[sends], times[~sends]).size:
                return arrival, used     # a send and a hop's event in one ns: order unknown
            count = len(ids)
            new_group = np.ones(count, dtype=bool)
            new_group[1:] = (times[1:] != times[:-1]) | (parent[1:] != parent[:-1])
            coarse = np.cumsum(new_group)
            coarse += coarse_base - 1
            coarse_base = int(coarse[-1]) + 1
            unknown, entering, link = queue.entries(times, coarse, origin, ids, into, out_of)
            if len(unknown):
                return arrival, queue.used[unknown]
            moved = into >= 0                           # the others are deliveries
            done = ~moved
            arrival[ids[done]] = times[done]
            if not len(entering):
                continue
            bytes_at = None if batch.head is None or batch.tail is None else (batch.head[order], batch.tail[order])
            nxt_time, head, tail = queue.serve(entering, link, times, into, route[at[moved] + 1] < 0, moved, bytes_at)
            _bucket(buckets, pending, _Batch(ids[moved], nxt_time, ((at[moved] + 1) << 32) | (coarse[moved] + 1),
                                             head, tail), (nxt_time - base) // window, w + 1)
        queue.keep()
        return arrival, np.empty(0, dtype=np.int64)

    # Rolling back a collective's timing (see ClaimedLinks.checkpoint) ------------------------------
    def checkpoint(self) -> None:
        self._saved = (self.held.copy(), self.free.copy(), self.busy.copy(), self.bytes.copy(),
                       self.messages.copy(), self.peak.copy(), self.until.copy())

    def rollback(self) -> None:
        if self._saved is not None:
            self.held, self.free, self.busy, self.bytes, self.messages, self.peak, self.until = self._saved
        self._saved = None

    def commit(self) -> None:
        self._saved = None


class _Batch(NamedTuple):
    """Events filed under a window: their messages and each one's next event, when (ns), where and
    after what (`place`), and with cut-through where its first and last bytes are. Carried with
    the events, in their order, rather than kept per message: a window then reads them in
    sequence, not scattered over every message of the step."""

    ids: np.ndarray
    time: np.ndarray
    place: np.ndarray
    """(its next link's index in the routes laid end to end; the -1 after its route: its
    delivery) << 32 | (the coarse rank of the event that scheduled it + 1; 0: a send)."""
    head: np.ndarray | None
    tail: np.ndarray | None

    @staticmethod
    def joined(batches: list[_Batch]) -> _Batch:
        if len(batches) == 1:
            return batches[0]
        bytes_at = batches[0].head is not None
        return _Batch(np.concatenate([b.ids for b in batches]), np.concatenate([b.time for b in batches]),
                      np.concatenate([b.place for b in batches]),
                      np.concatenate([b.head for b in batches if b.head is not None]) if bytes_at else None,
                      np.concatenate([b.tail for b in batches if b.tail is not None]) if bytes_at else None)

    def pick(self, index: slice | np.ndarray) -> _Batch:
        return _Batch(self.ids[index], self.time[index], self.place[index],
                      None if self.head is None else self.head[index], None if self.tail is None else self.tail[index])


class _Queues:
    """The step's links (renumbered 0..U-1): their FIFO state and statistics while it runs."""

    def __init__(self, steps: FifoSteps, used: np.ndarray, size: int) -> None:
        self.steps, self.used, self.size = steps, used, size
        self.free = steps.free[used]
        self.busy = steps.busy[used]
        self.peak = steps.peak[used]
        self.until = steps.until[used]
        self.crossings = np.zeros(len(used), dtype=np.int64)
        self.queued = np.zeros(len(used), dtype=np.int64)
        self.latency = steps.lat[used]
        transfer = size / steps.bw[used]
        self.transfer = transfer
        self.whole_transfer = transfer.astype(np.int64)                    # int(size / bw)
        self.whole_arrival = (self.latency + transfer).astype(np.int64)    # int(lat + size / bw)
        # local link numbers, -1 for none; read unsigned (-1 last) they sort by radix
        self.link_type = np.int16 if len(used) < (1 << 15) - 1 else np.int32
        self.sort_key = np.uint16 if self.link_type == np.int16 else np.uint32

    def entries(self, times: np.ndarray, coarse: np.ndarray, origin: np.ndarray, ids: np.ndarray, into: np.ndarray,
                out_of: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A window's events (messages `ids`, sent by origin[ids], in the order they run) leave
        `out_of` and enter `into` (local links, -1: none). Counts the peaks and checks the order is known. Returns (the local links where
        it is not, or where an event would come before traffic timed earlier; the events entering
        a link and those links, by link, in the order the events run)."""
        both = np.empty(2 * len(times), dtype=self.link_type)
        both[0::2], both[1::2] = out_of, into        # an event leaves a link, then enters the next
        order = np.argsort(both.view(self.sort_key), kind="stable")    # -1 (none) sorts last
        order = order[:np.count_nonzero(both >= 0)]
        link = both[order]
        event = order >> 1
        entering = (order & 1).astype(bool)
        same = link[1:] == link[:-1]
        starts = np.flatnonzero(np.r_[True, ~same])
        ends = np.r_[starts[1:], len(link)] - 1
        links = link[starts]
        early = times[event[starts]] <= self.until[links]     # a link's first event here is its earliest
        rank = coarse[event]          # equal only for events in one ns, ordered by what is unknown
        tie = np.flatnonzero(same & (rank[1:] == rank[:-1]))
        blind = tie[origin[ids[event[tie]]] != origin[ids[event[tie + 1]]]]
        if early.any() or len(blind):
            return np.unique(np.concatenate([links[early], link[blind]])), event[:0], link[:0]
        delta = entering.astype(np.int64) * 2 - 1
        total = np.cumsum(delta)
        lengths = np.diff(np.r_[starts, len(link)])
        running = total + np.repeat(self.queued[links] - total[starts] + delta[starts], lengths)
        self.peak[links] = np.maximum(self.peak[links], np.maximum.reduceat(np.where(entering, running, 0), starts))
        self.queued[links] = running[ends]
        self.until[links] = times[event[ends]]
        return np.empty(0, dtype=np.int64), event[entering], link[entering]

    def serve(self, events: np.ndarray, link: np.ndarray, times: np.ndarray, into: np.ndarray, final: np.ndarray,
              moved: np.ndarray, bytes_at: tuple[np.ndarray, np.ndarray] | None) -> _Next:
        """The window's `events` (by link, in the order they run) reach `link` (at times[event]),
        with cut-through their first and last bytes where `bytes_at` says: serve each link's in
        order, the k-th of every link at once. Returns `moved`'s next events (`moved`)."""
        starts = np.flatnonzero(np.r_[True, link[1:] != link[:-1]])
        lengths = np.diff(np.r_[starts, len(link)])
        longest_first = np.argsort(-lengths, kind="stable")
        starts, lengths = starts[longest_first], lengths[longest_first]
        links = link[starts]
        active = np.searchsorted(-lengths, -np.arange(int(lengths[0])), side="left")   # groups longer than k
        self.crossings += np.bincount(link, minlength=len(self.used))
        free, busy = self.free, self.busy
        if self.steps.cut_through:
            assert bytes_at is not None
            (head, tail), transfer = bytes_at, self.transfer
            begin, end = np.empty(len(times)), np.empty(len(times))
            for k, width in enumerate(active.tolist()):
                at, here = events[starts[:width] + k], links[:width]
                start = np.maximum(free[here], head[at])
                stop = np.maximum(start + transfer[here], tail[at])
                free[here] = stop
                busy[here] += stop - start
                begin[at], end[at] = start, stop
            return self.moved((begin[moved], end[moved]), into[moved], final)
        whole, begin_whole = self.whole_transfer, np.empty(len(times), dtype=np.int64)
        for k, width in enumerate(active.tolist()):
            at, here = events[starts[:width] + k], links[:width]
            start_whole = np.maximum(free[here], times[at])
            stop_whole = start_whole + whole[here]
            free[here] = stop_whole
            busy[here] += stop_whole - start_whole
            begin_whole[at] = start_whole
        return self.moved((begin_whole[moved], None), into[moved], final)

    def moved(self, served: tuple[np.ndarray, np.ndarray | None], link: np.ndarray, final: np.ndarray) -> _Next:
        """Messages were served on `link` (when their first byte started, and with cut-through
        when their last byte left): when their next events come (`final`: their deliveries); with
        cut-through, where their first and last bytes are then."""
        begin, end = served
        if end is None:
            return begin + self.whole_arrival[link], None, None
        latency = self.latency[link]
        head, tail = begin + latency, end + latency
        return np.where(final, tail, head).astype(np.int64), head, tail

    def sent_together(self, link: np.ndarray, time: int, origin: np.ndarray) -> tuple[np.ndarray, np.ndarray | None] | None:
        """A step's messages all sent at `time`, in order, over first links `link`: when each link
        is one member's, and free of earlier steps' traffic by then, its messages go back to back,
        in closed form (the sums added in the same order as one by one). Returns when each
        started, and with cut-through when its last byte left (None: time them as events)."""
        order = np.argsort(link.view(self.sort_key), kind="stable")
        sorted_link = link[order]
        starts = np.flatnonzero(np.r_[True, sorted_link[1:] != sorted_link[:-1]])
        links = sorted_link[starts]
        lengths = np.diff(np.r_[starts, len(link)])
        widest = int(lengths.max())
        if len(links) * (widest + 1) > 4 * len(link) + 1024 or (self.until[links] >= time).any():
            return None
        by_link = origin[order]
        if (by_link[1:] != by_link[:-1])[sorted_link[1:] == sorted_link[:-1]].any():
            return None        # two members' sends in one ns on one link: order unknown
        cut_through = self.steps.cut_through
        step = self.transfer[links] if cut_through else self.whole_transfer[links]
        chain = np.empty((len(links), widest + 1), dtype=np.float64 if cut_through else np.int64)
        chain[:, 0] = np.maximum(self.free[links], time)
        chain[:, 1:] = step[:, None]
        np.add.accumulate(chain, axis=1, out=chain)     # each start: the previous end
        busy = np.empty((len(links), widest + 1), dtype=np.float64)
        busy[:, 0] = self.busy[links]
        busy[:, 1:] = chain[:, 1:] - chain[:, :-1]
        np.add.accumulate(busy, axis=1, out=busy)
        every = np.arange(len(links))
        self.free[links] = chain[every, lengths]
        self.busy[links] = busy[every, lengths]
        self.crossings[links] += lengths
        self.queued[links] += lengths
        self.peak[links] = np.maximum(self.peak[links], self.queued[links])
        self.until[links] = time
        # the k-th message of link g started at chain[g, k] and ended at chain[g, k + 1]
        at = np.repeat(np.arange(0, len(links) * (widest + 1), widest + 1) - starts, lengths)
        at += np.arange(len(link))
        flat = chain.ravel()
        begin, end = np.empty(len(link), dtype=chain.dtype), np.empty(len(link), dtype=chain.dtype)
        begin[order] = flat[at]
        at += 1
        end[order] = flat[at]
        return begin, end if cut_through else None

    def keep(self) -> None:
        """The step is timed: its links' state is theirs."""
        steps, used = self.steps, self.used
        steps.free[used], steps.busy[used], steps.peak[used] = self.free, self.busy, self.peak
        steps.until[used] = self.until
        steps.bytes[used] += self.crossings * self.size
        steps.messages[used] += self.crossings


def _bucket(buckets: dict[int, list[_Batch]], pending: list[int], batch: _Batch,
            windows: np.ndarray, lowest: int) -> None:
    """File events (in the order they were scheduled) under their windows (from `lowest` on)."""
    if not len(batch.ids):
        return
    relative = windows - lowest
    if relative.max() > 0:
        order = np.argsort(relative.astype(np.uint16) if relative.max() < 1 << 16 else relative, kind="stable")
        batch, windows = batch.pick(order), windows[order]
    cuts = np.flatnonzero(np.r_[True, windows[1:] != windows[:-1]])
    for lo, hi in zip(cuts.tolist(), np.r_[cuts[1:], len(windows)].tolist()):
        w = int(windows[lo])
        found = buckets.get(w)
        if found is None:
            buckets[w] = [batch.pick(slice(lo, hi))]
            heapq.heappush(pending, w)
        else:
            found.append(batch.pick(slice(lo, hi)))
