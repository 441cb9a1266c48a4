"""The discrete-event core: a clock and a heap of (time, seq, callback, arg).

Time is integer nanoseconds. Events at the same time run in the order they
were scheduled (the sequence number breaks ties), which makes every run
deterministic. The loop is deliberately tiny; all model knowledge lives in
the layers.
"""

from __future__ import annotations

from heapq import heappop, heappush
from itertools import count
from typing import Any, Callable

from chakra_core.errors import SimulationError


class EventQueue:
    """Clock + event heap; implements the `Scheduler` protocol of chakra_core.layers."""

    __slots__ = ("now", "_heap", "_seq", "executed")

    def __init__(self) -> None:
        self.now = 0
        self._heap: list[tuple[int, int, Callable[[Any], None], Any]] = []
        self._seq = count()
        self.executed = 0

    def schedule(self, delay: int, callback: Callable[[Any], None], arg: Any = None) -> None:
        if delay.__class__ is not int or delay < 0:
            raise SimulationError(f"event delay must be a non-negative int of ns, got {delay!r} "
                                  f"(from {getattr(callback, '__qualname__', callback)})")
        heappush(self._heap, (self.now + delay, next(self._seq), callback, arg))

    def schedule_at(self, time: int, callback: Callable[[Any], None], arg: Any = None) -> None:
        if time.__class__ is not int or time < self.now:
            raise SimulationError(f"event time must be an int >= now ({self.now} ns), got {time!r} "
                                  f"(from {getattr(callback, '__qualname__', callback)})")
        heappush(self._heap, (time, next(self._seq), callback, arg))

    def __len__(self) -> int:
        return len(self._heap)

    def run(self, progress: Callable[[int], None] | None = None, every: int = 1 << 16) -> None:
        """Run until the heap is empty; call `progress(now)` every `every` events."""
        heap = self._heap
        pop = heappop
        executed = self.executed
        if progress is None:
            while heap:
                time, _, callback, arg = pop(heap)
                self.now = time
                callback(arg)
                executed += 1
        else:
            while heap:
                time, _, callback, arg = pop(heap)
                self.now = time
                callback(arg)
                executed += 1
                if not executed % every:
                    self.executed = executed
                    progress(time)
        self.executed = executed
