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

from chakra_sim_network_congestion.fifoqueues import StepQueues, stable_order

if TYPE_CHECKING:
    from chakra_sim_network_congestion.links import FifoLinks

_NO_LINK = -1
_LOW = (1 << 32) - 1


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
            queue = StepQueues(self, np.arange(len(self.bw)), size)
            route = flat
        else:
            queue = StepQueues(self, used, size)
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
        width = hops.shape[1]     # message m's links start at m * width in the routes laid end to end
        at = moving * width       # each message's first link
        on = route[at]
        sent = queue.sent_together(on, base, origin[pick]) if base == int(sending.max()) else None
        if sent is None:
            first = np.argsort(sending, kind="stable")
            times = sending[first]
            begun = times.astype(np.float64) if self.cut_through else None
            _bucket(buckets, pending, _Batch(times, (at[first] << 32), begun, begun,
                                             np.full(len(times), _NO_LINK, dtype=route.dtype), route[at[first]]),
                    (times - base) // window, 0)
        else:      # the sends' events are timed: on to their next ones (one coarse rank, 0: sends in one ns)
            index, begin, end = sent
            on, then, at = on[index], route[at + 1][index], at[index]
            nxt_time, head, tail = queue.moved((begin, end), on, then < 0)
            coarse_base = 1
            _bucket(buckets, pending, _Batch(nxt_time, ((at + 1) << 32) | 1, head, tail, on, then),
                    (nxt_time - base) // window, 1)
        # The last window's next events, not yet filed under their windows: nearly all come in the
        # next one (measured: 98% on a fat-tree all-to-all), so they join it whole, and those that
        # come later are filed then, still after everything filed before them
        follow: _Batch | None = None
        while pending or follow is not None:
            follow_at = -1 if follow is None else int(follow.time.min() - base) // window
            w = min(([pending[0]] if pending else []) + ([follow_at] if follow is not None else []))
            parts = buckets.pop(w) if pending and pending[0] == w else []
            if parts:
                heapq.heappop(pending)
            joining = follow is not None and follow_at == w
            if joining:
                assert follow is not None
                parts.append(follow)
                follow = None
            batch = _Batch.joined(parts)
            offset = batch.time - (base + w * window)     # within a window: 0..window-1; later: more
            if joining:
                order, keys = stable_order(np.minimum(offset, window), window + 1)
                within = int(np.searchsorted(keys, window))
                if within < len(order):       # (in the order they were scheduled: equal keys)
                    later = batch.pick(order[within:])
                    _bucket(buckets, pending, later, (later.time - base) // window, w + 1)
                    order = order[:within]
            else:
                order = stable_order(offset, window)[0]
            times, place = batch.time[order], batch.place[order]
            bytes_at = None if batch.head is None or batch.tail is None else (batch.head[order], batch.tail[order])
            out_of, into = batch.out_of[order], batch.into[order]
            at, parent = place >> 32, place & _LOW
            sends = out_of < 0
            if sends.any() and not sends.all() and np.intersect1d(times[sends], times[~sends]).size:
                return arrival, used     # a send and a hop's event in one ns: order unknown
            count = len(times)
            new_group = np.ones(count, dtype=bool)
            new_group[1:] = (times[1:] != times[:-1]) | (parent[1:] != parent[:-1])
            coarse = np.cumsum(new_group, dtype=np.int32)
            coarse += coarse_base - 1
            coarse_base = int(coarse[-1]) + 1
            unknown, entering, link = queue.entries(times, coarse, lambda events: origin[at[events] // width],
                                                    into, out_of)
            if len(unknown):
                return arrival, queue.used[unknown]
            # positions rather than masks: numpy gathers by index several times faster than it
            # picks by a boolean mask (measured: 150 k events, 0.4 ms against 2 ms an array)
            moved = np.flatnonzero(into >= 0)           # the others are deliveries
            done = np.flatnonzero(into < 0)
            arrival[at[done] // width] = times[done]
            if not len(entering):
                continue
            at_moved = at[moved]
            then = route[at_moved + 1]
            nxt_time, head, tail = queue.serve(entering, link, times, into, then < 0, moved, bytes_at)
            if follow is not None:       # not joined yet (an earlier window came first): filed now
                _bucket(buckets, pending, follow, (follow.time - base) // window, w + 1)
            follow = _Batch(nxt_time, ((at_moved + 1) << 32) | (coarse[moved] + 1), head, tail, into[moved], then)
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
    """Events filed under a window: each one's next event, when (ns), where (and so whose message:
    `place`'s link index // the routes' width) and after what, and with cut-through where its
    first and last bytes are. Carried with the events, in their order, rather than kept per
    message: a window then reads them in sequence, not scattered over every message of the step."""

    time: np.ndarray
    place: np.ndarray
    """(its next link's index in the routes laid end to end; the -1 after its route: its
    delivery) << 32 | (the coarse rank of the event that scheduled it + 1; 0: a send)."""
    head: np.ndarray | None
    tail: np.ndarray | None
    out_of: np.ndarray
    """The link each event leaves (-1: a send) and the one it enters (-1: a delivery), both known
    when the event is scheduled: carried so as not to look them up in the routes again."""
    into: np.ndarray

    @staticmethod
    def joined(batches: list[_Batch]) -> _Batch:
        if len(batches) == 1:
            return batches[0]
        bytes_at = batches[0].head is not None
        return _Batch(np.concatenate([b.time for b in batches]), np.concatenate([b.place for b in batches]),
                      np.concatenate([b.head for b in batches if b.head is not None]) if bytes_at else None,
                      np.concatenate([b.tail for b in batches if b.tail is not None]) if bytes_at else None,
                      np.concatenate([b.out_of for b in batches]), np.concatenate([b.into for b in batches]))

    def pick(self, index: slice | np.ndarray) -> _Batch:
        return _Batch(self.time[index], self.place[index],
                      None if self.head is None else self.head[index], None if self.tail is None else self.tail[index],
                      self.out_of[index], self.into[index])


def _bucket(buckets: dict[int, list[_Batch]], pending: list[int], batch: _Batch,
            windows: np.ndarray, lowest: int) -> None:
    """File events (in the order they were scheduled) under their windows (from `lowest` on)."""
    if not len(batch.time):
        return
    relative = windows - lowest
    low, high = int(relative.min()), int(relative.max())
    if low == high:
        parts = [(lowest + low, batch)]
    elif not (relative[1:] < relative[:-1]).any():     # in order (a step's sends, often): slices
        cuts = np.flatnonzero(relative[1:] != relative[:-1]) + 1
        bounds = [0, *cuts.tolist(), len(relative)]
        parts = [(lowest + int(relative[lo]), batch.pick(slice(lo, hi))) for lo, hi in zip(bounds, bounds[1:])]
    elif high - low < 4:     # most batches span two windows: picks by position beat a sort
        parts = []
        for r in range(low, high + 1):
            index = np.flatnonzero(relative == r)
            if len(index):
                parts.append((lowest + r, batch.pick(index)))
    else:
        order = stable_order(relative, high + 1)[0]
        batch, windows = batch.pick(order), windows[order]
        cuts = np.flatnonzero(np.r_[True, windows[1:] != windows[:-1]])
        parts = [(int(windows[lo]), batch.pick(slice(lo, hi)))
                 for lo, hi in zip(cuts.tolist(), np.r_[cuts[1:], len(windows)].tolist())]
    for w, part in parts:
        found = buckets.get(w)
        if found is None:
            buckets[w] = [part]
            heapq.heappush(pending, w)
        else:
            found.append(part)
