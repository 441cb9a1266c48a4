"""Processor sharing of one bandwidth between concurrent transfers, exact in integer ns.

A `SharedBandwidth` is one memory (a rank's HBM, a node's expansion memory,
the pool) serving transfers of known sizes. With `n` transfers in progress
and `channels` channels, each transfer gets

    bandwidth / max(n, channels)          bytes per ns

so up to `channels` transfers each get one channel's share (bandwidth /
channels) and more than that split the whole bandwidth equally
(processor sharing, which is also the max-min fair share here because every
transfer may use any amount). With channels = 1 a lone transfer gets the
full bandwidth and two equal transfers started together both take twice as
long.

Because every transfer in progress advances at the same rate, the model
keeps one "virtual" counter `served`: the bytes each transfer in progress
has received since the server was created. A transfer of S bytes started
when the counter read V finishes when the counter reaches V + S, so
transfers finish in order of that mark (a heap), and only the first one's
completion needs an event. Whenever a transfer starts or ends the rate
changes, the counter is brought up to date and the next completion is
rescheduled; the version number makes the superseded event a no-op.

Exactness: the counter is a `fractions.Fraction` and the bandwidth the
exact decimal the user wrote (819.2 GB/s is 4096/5 bytes per ns), so no
floating-point error accumulates and runs are bit-for-bit repeatable.
Events happen at integer ns: a transfer ends at the last whole ns before
(or at) its exact end, and the caller receives the fraction of a ns left
over, to add to its own fixed latency before rounding once.
"""

from __future__ import annotations

from fractions import Fraction
from heapq import heappop, heappush
from typing import Any, Callable

from chakra_core import Scheduler


def exact(value: float | int, what: str) -> Fraction:
    """The decimal a user wrote (as Python prints the float) as an exact fraction."""
    try:
        return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
    except (ValueError, OverflowError):
        raise ValueError(f"{what} must be a finite number, got {value!r}") from None


class SharedBandwidth:
    """One bandwidth shared by the transfers in progress (see module docstring)."""

    __slots__ = ("scheduler", "bandwidth", "channels", "served", "last", "heap", "version", "seq",
                 "transfers", "busy_ns", "_busy_since")

    def __init__(self, scheduler: Scheduler, bytes_per_ns: Fraction, channels: int = 1):
        if bytes_per_ns <= 0 or channels < 1:
            raise ValueError("a shared bandwidth needs bytes_per_ns > 0 and channels >= 1")
        self.scheduler = scheduler
        self.bandwidth = Fraction(bytes_per_ns)
        self.channels = channels
        self.served = Fraction(0)    # bytes received by every transfer in progress since creation
        self.last = 0                # time `served` was brought up to date (ns)
        self.heap: list[tuple[Fraction, int, Callable[[Any, Fraction], None], Any]] = []
        self.version = 0
        self.seq = 0
        self.transfers = 0           # transfers started, for statistics
        self.busy_ns = 0             # time with at least one transfer in progress
        self._busy_since = 0

    def rate(self, in_progress: int | None = None) -> Fraction:
        """Bytes per ns each transfer gets with `in_progress` transfers (default: now)."""
        n = len(self.heap) if in_progress is None else in_progress
        return self.bandwidth / max(n, self.channels)

    def alone_ns(self, size: int) -> Fraction:
        """Exact duration of a transfer of `size` bytes that never shares."""
        return size / self.rate(1)

    def start(self, size: int, on_end: Callable[[Any, Fraction], None], arg: Any = None) -> None:
        """Begin a transfer of `size` bytes now; later call `on_end(arg, leftover)`.

        `leftover` (0 <= leftover < 1) is the part of a ns the transfer still had to
        run at the integer time `on_end` is called.
        """
        now = self.scheduler.now
        self._advance(now)
        if not self.heap:
            self._busy_since = now
        self.seq += 1
        self.transfers += 1
        heappush(self.heap, (self.served + size, self.seq, on_end, arg))
        self._plan()

    def _advance(self, now: int) -> None:
        if now != self.last:
            if self.heap:
                self.served += self.rate() * (now - self.last)
            self.last = now

    def _plan(self) -> None:
        """Schedule the event at which the first transfer in the heap ends (superseding others)."""
        self.version += 1
        if self.heap:
            delay = (self.heap[0][0] - self.served) // self.rate()   # whole ns: floor
            self.scheduler.schedule(int(delay), self._fire, self.version)

    def _fire(self, version: int) -> None:
        if version != self.version:
            return                     # the rate changed since this event was planned
        now = self.scheduler.now
        self._advance(now)
        heap = self.heap
        ended = []
        while heap:
            rate = self.rate()
            left = heap[0][0] - self.served
            if left >= rate:           # needs at least one more whole ns
                break
            _, _, on_end, arg = heappop(heap)
            ended.append((on_end, arg, left / rate))
        if not heap:
            self.busy_ns += now - self._busy_since
        self._plan()
        for on_end, arg, leftover in ended:
            on_end(arg, leftover)
