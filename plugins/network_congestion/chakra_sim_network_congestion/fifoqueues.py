"""The links of one step of messages (fifosteps.py) while it is timed: their FIFO state and
statistics, and the service of a window's events in bulk.

Each link serves the events that reach it in the order they run; `serve` serves the k-th event of
every link at once (numpy over the links) with the arithmetic of FifoLinks._pipe (cut-through)
or _serve (store and forward), so that times and statistics have the same bits as one by one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:
    from chakra_sim_network_congestion.fifosteps import FifoSteps

_NONE = np.int32(-(1 << 31))
"""Below any count: where a link's events in a window only leave it."""

Next = tuple[np.ndarray, np.ndarray | None, np.ndarray | None]
"""Messages' next events (ns) and, with cut-through, where their first and last bytes are then."""


def stable_order(keys: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """np.argsort(keys, kind="stable") of keys in 0..bound-1, and the keys in that order.

    Keys of 16 bits are sorted by numpy's stable argsort, a radix sort at that width (measured:
    260 k keys, 2.5 ms against 6.8 ms packed). Wider keys are sorted as (key, position) packed
    into one integer: numpy sorts those with SIMD, several times faster than its stable argsort
    of wide keys, a merge sort (measured: 250 k keys, 1.6 ms against 6.9 ms)."""
    if bound <= 1 << 16:
        narrow = keys.astype(np.uint16)
        order = np.argsort(narrow, kind="stable")
        return order, narrow[order]
    count = len(keys)
    shift = max(count - 1, 1).bit_length()
    packed_type = np.uint32 if (bound - 1).bit_length() + shift <= 32 else np.uint64
    packed = keys.astype(packed_type)
    packed <<= packed_type(shift)
    packed |= np.arange(count, dtype=packed_type)
    packed.sort()
    order = (packed & packed_type((1 << shift) - 1)).astype(np.intp)
    packed >>= packed_type(shift)
    return order, packed


class StepQueues:
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
        self.one_latency = float(self.latency[0]) if len(used) and (self.latency == self.latency[0]).all() else None
        transfer = size / steps.bw[used]
        self.transfer = transfer
        self.whole_transfer = transfer.astype(np.int64)                    # int(size / bw)
        self.whole_arrival = (self.latency + transfer).astype(np.int64)    # int(lat + size / bw)
        self.link_type = np.int16 if len(used) < (1 << 15) - 1 else np.int32    # local link numbers, -1: none

    def entries(self, times: np.ndarray, coarse: np.ndarray, sender: Callable[[np.ndarray], np.ndarray],
                into: np.ndarray, out_of: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A window's events (in the order they run; sender(events): who sent their messages) leave
        `out_of` and enter `into` (local links, -1: none). Counts the peaks and checks the order
        is known. Returns (the local links where it is not, or where an event would come before
        traffic timed earlier; the events entering a link and those links, by link, in the order
        the events run; links numbered from 1)."""
        both = np.empty(2 * len(times), dtype=self.link_type)
        both[0::2], both[1::2] = out_of, into        # an event leaves a link, then enters the next
        both += 1          # links from 1 (and so on to serve): none is 0 and sorts first
        order, link = stable_order(both, len(self.used) + 1)
        none = np.count_nonzero(both == 0)
        order, link = order[none:], link[none:]
        event = order >> 1
        entering = (order & 1).astype(bool)
        same = link[1:] == link[:-1]
        starts = np.flatnonzero(np.r_[True, ~same])
        ends = np.r_[starts[1:], len(link)] - 1
        links = link[starts].astype(np.intp) - 1
        early = times[event[starts]] <= self.until[links]     # a link's first event here is its earliest
        rank = coarse[event]          # equal only for events in one ns, ordered by what is unknown
        tie = np.flatnonzero(same & (rank[1:] == rank[:-1]))
        blind = tie[sender(event[tie]) != sender(event[tie + 1])]
        if early.any() or len(blind):
            return np.unique(np.concatenate([links[early], link[blind].astype(np.intp) - 1])), event[:0], link[:0]
        # messages on a link after each event: its count before the window, plus the window's
        # entries less its leaves (a running sum over all links, less the sum before the link's first)
        delta = entering.view(np.int8) * np.int8(2) - np.int8(1)
        total = np.cumsum(delta, dtype=np.int32)
        before = self.queued[links] - total[starts] + delta[starts]
        fullest = np.maximum.reduceat(np.where(entering, total, _NONE), starts).astype(np.int64)
        self.peak[links] = np.maximum(self.peak[links], fullest + before)
        self.queued[links] = total[ends] + before
        self.until[links] = times[event[ends]]
        entered = np.flatnonzero(entering)
        return np.empty(0, dtype=np.int64), event[entered], link[entered]

    def serve(self, events: np.ndarray, link: np.ndarray, times: np.ndarray, into: np.ndarray, final: np.ndarray,
              moved: np.ndarray, bytes_at: tuple[np.ndarray, np.ndarray] | None) -> Next:
        """The window's `events` (by link, in the order they run) reach `link` (numbered from 1)
        at times[event], with cut-through their first and last bytes where `bytes_at` says
        (head[event], tail[event]): serve each link's in order, the k-th of every link at once.
        Returns `moved`'s next events (`moved`: those entering a link, in the order they run)."""
        begins = np.flatnonzero(np.r_[True, link[1:] != link[:-1]])
        lengths = np.diff(np.r_[begins, len(link)])
        longest_first = np.argsort(-lengths, kind="stable")
        links = link[begins[longest_first]].astype(np.intp) - 1
        width = np.searchsorted(-lengths[longest_first], -np.arange(int(lengths.max())), side="left")
        # The k-th event of the r-th longest link sits at row k, column r, rows laid end to end and
        # each as long as the links with a k-th event (a prefix, longest first): contiguous slices,
        # no gathers in the loop, and no more cells than events
        groups = len(begins)
        rank = np.empty(groups, dtype=np.int64)
        rank[longest_first] = np.arange(groups)
        rows = np.zeros(len(width) + 1, dtype=np.int64)
        np.cumsum(width, out=rows[1:])
        cell = rows[np.arange(len(link)) - np.repeat(begins, lengths)]
        cell += np.repeat(rank, lengths)
        self.crossings += np.bincount(link, minlength=len(self.used) + 1)[1:]
        free, busy = self.free[links], self.busy[links]
        size = len(link)
        # each cell's event and each event's cell, then gathers: fewer scattered accesses than
        # moving every array between the two orders (those accesses are most of the time here)
        event_at = np.empty(size, dtype=np.intp)
        event_at[cell] = events
        cell_of = np.empty(len(times), dtype=np.intp)
        cell_of[events] = cell
        back = cell_of[moved]
        if self.steps.cut_through:
            assert bytes_at is not None
            transfer = self.transfer[links]
            head, tail = bytes_at[0][event_at], bytes_at[1][event_at]
            began, ended = np.empty(size), np.empty(size)
            for w, lo in zip(width.tolist(), rows.tolist()):
                row = slice(lo, lo + w)
                start = np.maximum(free[:w], head[row])
                stop = np.maximum(start + transfer[:w], tail[row])
                free[:w] = stop
                busy[:w] += stop - start
                began[row], ended[row] = start, stop
            self.free[links], self.busy[links] = free, busy
            return self.moved((began[back], ended[back]), into[moved], final)
        whole = self.whole_transfer[links]
        arriving = times[event_at]
        began = np.empty(size, dtype=np.int64)
        for w, lo in zip(width.tolist(), rows.tolist()):
            row = slice(lo, lo + w)
            start_whole = np.maximum(free[:w], arriving[row])
            stop_whole = start_whole + whole[:w]
            free[:w] = stop_whole
            busy[:w] += stop_whole - start_whole
            began[row] = start_whole
        self.free[links], self.busy[links] = free, busy
        return self.moved((began[back], None), into[moved], final)

    def moved(self, served: tuple[np.ndarray, np.ndarray | None], link: np.ndarray, final: np.ndarray) -> Next:
        """Messages were served on `link` (when their first byte started, and with cut-through
        when their last byte left): when their next events come (`final`: their deliveries); with
        cut-through, where their first and last bytes are then."""
        begin, end = served
        if end is None:
            return begin + self.whole_arrival[link], None, None
        # one latency for every link (a generated fabric's, often): added as a number, no gather
        latency = self.one_latency if self.one_latency is not None else self.latency[link]
        head, tail = begin + latency, end + latency
        nxt = head.astype(np.int64)
        delivered = np.flatnonzero(final)
        nxt[delivered] = tail[delivered]        # (truncated as astype does)
        return nxt, head, tail

    def sent_together(self, link: np.ndarray, time: int,
                      origin: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
        """A step's messages all sent at `time`, in order, over first links `link`: when each link
        is one member's, and free of earlier steps' traffic by then, its messages go back to back,
        in closed form (the sums added in the same order as one by one). Returns the messages
        (their positions in `link`) by their place on their link, the first of every link, then
        the second, and so on (so nearly by time: the windows take them in slices; a member's
        stay in the order it sent them, all the order a step's sends have among themselves),
        when each started, and with cut-through when its last byte left (None: time them as
        events)."""
        runs = np.flatnonzero(np.r_[True, link[1:] != link[:-1]])
        in_runs = np.bincount(link[runs], minlength=len(self.used)).max() == 1    # each link's sends in one run
        if in_runs:
            order, sorted_link, starts = None, link, runs
        else:
            order, sorted_link = stable_order(link, len(self.used))
            starts = np.flatnonzero(np.r_[True, sorted_link[1:] != sorted_link[:-1]])
        links = sorted_link[starts]
        lengths = np.diff(np.r_[starts, len(link)])
        widest = int(lengths.max())
        if len(links) * (widest + 1) > 4 * len(link) + 1024 or (self.until[links] >= time).any():
            return None
        by_link = origin if order is None else origin[order]
        if (by_link[1:] != by_link[:-1])[sorted_link[1:] == sorted_link[:-1]].any():
            return None        # two members' sends in one ns on one link: order unknown
        cut_through = self.steps.cut_through
        step = self.transfer[links] if cut_through else self.whole_transfer[links]
        # chain[k, g]: when link g's k-th message starts (and its (k-1)-th ends), row by row
        chain = np.empty((widest + 1, len(links)), dtype=np.float64 if cut_through else np.int64)
        chain[0] = np.maximum(self.free[links], time)
        chain[1:] = step
        np.add.accumulate(chain, axis=0, out=chain)     # each start: the previous end
        busy = np.empty((widest + 1, len(links)), dtype=np.float64)
        busy[0] = self.busy[links]
        np.subtract(chain[1:], chain[:-1], out=busy[1:])
        np.add.accumulate(busy, axis=0, out=busy)
        every = np.arange(len(links))
        self.free[links] = chain[lengths, every]
        self.busy[links] = busy[lengths, every]
        self.crossings[links] += lengths
        self.queued[links] += lengths
        self.peak[links] = np.maximum(self.peak[links], self.queued[links])
        self.until[links] = time
        if (lengths == widest).all():     # as many on every link: the rows in turn
            if order is None:
                index = (np.arange(widest)[:, None] + starts).ravel()
            else:
                index = order.reshape(len(links), widest).T.ravel()
            return index, chain[:-1].ravel(), chain[1:].ravel() if cut_through else None
        place = np.arange(len(link)) - np.repeat(starts, lengths)
        by_place = stable_order(place, widest)[0]
        at = np.repeat(np.arange(len(links)), lengths)
        at += place * len(links)
        at = at[by_place]
        flat = chain.ravel()
        index = by_place if order is None else order[by_place]
        return index, flat[at], flat[at + len(links)] if cut_through else None

    def keep(self) -> None:
        """The step is timed: its links' state is theirs."""
        steps, used = self.steps, self.used
        steps.free[used], steps.busy[used], steps.peak[used] = self.free, self.busy, self.peak
        steps.until[used] = self.until
        steps.bytes[used] += self.crossings * self.size
        steps.messages[used] += self.crossings
