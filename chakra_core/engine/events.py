"""The discrete-event core: a clock and a time-ordered queue of (callback, arg) events.

Time is integer nanoseconds. Events at the same time run in the order they
were scheduled, which makes every run deterministic. Collective traffic puts
many events at the same instant (all ranks step together), so events are
kept in one FIFO bucket per distinct time, and a heap orders the times: the
heap sees one entry per instant instead of one per event. An event scheduled
for the current instant joins the bucket being run.

The loop is deliberately tiny; all model knowledge lives in the layers.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Any, Callable

from chakra_core.errors import SimulationError


class EventQueue:
    """Clock + event queue; implements the `Scheduler` protocol of chakra_core.contract."""

    __slots__ = ("now", "_times", "_buckets", "executed", "pending", "after_instant")

    def __init__(self) -> None:
        self.now = 0
        self._times: list[int] = []
        self._buckets: dict[int, list[tuple[Callable[[Any], None], Any]]] = {}
        self.executed = 0
        self.pending = 0
        self.after_instant: list[Callable[[], None]] = []
        """Called once the events of the current instant have all run (time folding looks then)."""

    def schedule(self, delay: int, callback: Callable[[Any], None], arg: Any = None) -> None:
        if delay.__class__ is not int or delay < 0:
            raise SimulationError(f"event delay must be a non-negative int of ns, got {delay!r} "
                                  f"(from {getattr(callback, '__qualname__', callback)})")
        time = self.now + delay
        bucket = self._buckets.get(time)     # _push, inlined: this is the hottest call of a run
        if bucket is None:
            self._buckets[time] = bucket = []
            heappush(self._times, time)
        bucket.append((callback, arg))
        self.pending += 1

    def schedule_at(self, time: int, callback: Callable[[Any], None], arg: Any = None) -> None:
        if time.__class__ is not int or time < self.now:
            raise SimulationError(f"event time must be an int >= now ({self.now} ns), got {time!r} "
                                  f"(from {getattr(callback, '__qualname__', callback)})")
        self._push(time, callback, arg)

    def _push(self, time: int, callback: Callable[[Any], None], arg: Any) -> None:
        bucket = self._buckets.get(time)
        if bucket is None:
            self._buckets[time] = bucket = []
            heappush(self._times, time)
        bucket.append((callback, arg))
        self.pending += 1

    def cancel(self, time: int, callback: Callable[[Any], None], arg: Any) -> None:
        """Drop the pending event `(callback, arg)` at `time` > now (the very `arg` it was scheduled
        with): a kernel whose end moved (ComputeModel.retime). An instant left empty keeps its heap
        entry, which `run` skips."""
        bucket = self._buckets.get(time) if time > self.now else None
        for index, (pending, pending_arg) in enumerate(bucket or ()):
            if pending_arg is arg and pending == callback:
                del bucket[index]   # type: ignore[union-attr]
                break
        else:
            raise SimulationError(f"no event of {getattr(callback, '__qualname__', callback)} is pending at "
                                  f"{time} ns (now {self.now} ns) to cancel")
        self.pending -= 1
        if not bucket:
            del self._buckets[time]

    def pending_times(self) -> list[int]:
        """The instants that have events pending (any order)."""
        return list(self._buckets)

    def bucket(self, time: int) -> list[tuple[Callable[[Any], None], Any]]:
        """The events pending at `time`, in the order they will run (read, do not change)."""
        return self._buckets[time]

    def advance(self, shift: int, events: int) -> None:
        """A drained queue skips `shift` ns in which `events` events would have run (time folding)."""
        assert not self._times, "only a drained queue skips time"
        self.now += shift
        self.executed += events

    def __len__(self) -> int:
        return max(self.pending, 0)   # `run` subtracts what it ran from a count `stop` zeroed

    def stop(self) -> None:
        """End `run` once the callback running now returns: every pending event is dropped.

        The loop in `run` holds the structures it drains; emptying them in place (the current
        instant's bucket included) ends it without a check per event. Events scheduled from now
        on go to fresh structures that are never run: a stopped queue is thrown away.
        """
        times, buckets = self._times, self._buckets
        self._times, self._buckets = [], {}
        times.clear()
        current = buckets.get(self.now)
        buckets.clear()
        if current is not None:
            current.clear()
            buckets[self.now] = current   # `run` deletes the instant it was running
        self.pending = 0

    def run(self, progress: Callable[[int], None] | None = None, every: int = 1 << 16) -> None:
        """Run until no event is left; call `progress(now)` about every `every` events."""
        times, buckets = self._times, self._buckets
        next_report = self.executed + every
        while times:
            time = heappop(times)
            bucket = buckets.get(time)
            if bucket is None:   # every event of the instant was cancelled
                continue
            self.now = time
            index = 0
            while index < len(bucket):   # callbacks may append to this bucket
                callback, arg = bucket[index]
                index += 1
                callback(arg)
            del buckets[time]
            self.pending -= index
            self.executed += index
            if self.after_instant:   # one check per instant, not per event
                hooks, self.after_instant = self.after_instant, []
                for hook in hooks:
                    hook()
            if progress is not None and self.executed >= next_report:
                next_report = self.executed + every
                progress(time)
