"""Folding in time for the hbm model (chakra_core.contract.time_folding): its state at an
instant, and its statistics carried forward by whole periods.

State. Beyond its pending events the model holds, per simulated rank, the storages alive and the
memory accesses in flight. A storage is described by its bytes and by what will free it, in terms
that hold for the whole step's traces as for the fewer micro-batches simulated (whose pre-pass
counts fewer references to a weight, and frees the last periods' activations in the cool-down):

- `lifetime: trace`, a storage allocated among the repeating nodes: by its allocating node
  (relabeled) and the references to it completed so far; its counterpart a period on is
  described alike, and its future references are its counterpart's;
- `lifetime: trace`, a storage allocated before them (in the warm-up): by its own id, the same
  storage at every instant; with the references completed so far, unless it is referenced after
  the repeats (a weight, a gradient buffer: the optimizer frees it, in the whole step too);
- `lifetime: issued`: by the issued nodes still referencing it (relabeled).

A warm-up activation whose backward the fewer micro-batches push into the cool-down looks like a
weight (allocated before the repeats, referenced after them), though the whole step frees it among
the repeats. No two instants match while one is alive: backwards free activations in the order
their forwards allocated them, so until it is freed the activations allocated among the repeats
only accumulate, and their descriptions differ from one instant to the next (randomized jobs in
tests/test_time_folding.py check folded against whole).

An instant with a memory access in flight is never taken for another (a transfer's progress
through a shared bandwidth is not part of the state): a job with memory nodes folds at the
instants between them, or not at all.

Statistics. Counters add `periods` times what the period added. The peak stays (the periods left
out repeat the one measured); its instant moves on by the periods left out when it came after the
period. The bytes-in-use series is rebuilt as the whole step would have written it: from the
first snapshot on, every change is logged; after the run the series is replayed to the second
instant, the period's changes are replayed `periods` more times, each a period later, then the
rest of the run's, shifted by all of them, so that the bounded series coarsens as it would have.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count
from typing import Any, Callable, Hashable, Sequence

from chakra_core import FoldView, Scheduler
from chakra_sim_memory_hbm.tensors import MemorySeries, RankTensors, TensorTracker

_LOOKS = count()
"""Numbers an instant with accesses in flight, so that no other instant's state equals its."""


@dataclass(frozen=True)
class RankCounts:
    """A simulated rank's tensor figures at an instant."""

    allocations: int
    logged: int
    """Series changes logged by then."""


@dataclass(frozen=True)
class Snapshot:
    """The hbm model's counters at an instant of a folded-in-time run."""

    now: int
    counters: tuple[int, ...]
    loaded: tuple[int, ...]
    stored: tuple[int, ...]
    tensors: tuple[RankCounts, ...]
    last_oom_ns: int


def state(tracker: TensorTracker | None, ranks: Sequence[int], in_flight: int, view: FoldView) -> Hashable:
    """The model's state at an instant, beyond its pending events (see the module docstring)."""
    if in_flight:
        return ("memory accesses in flight", next(_LOOKS))
    if tracker is None:
        return ()
    return tuple(_rank_state(tracker.ranks[rank], view) for rank in ranks)


def _rank_state(tensors: RankTensors, view: FoldView) -> Hashable:
    rank = tensors.rank
    issued_by: dict[int, list[int]] = {}
    for node_id, storages in tensors.pending.items():
        for storage, _ in storages:
            issued_by.setdefault(storage, []).append(view.relabel(rank, node_id))
    live = []
    for storage, (size, left, issued, last, allocated, references) in tensors.live.items():
        if issued:
            freed_by: tuple[object, ...] = ("issued", tuple(sorted(issued_by.get(storage, ()))))
        elif view.part(rank, allocated) == "repeats":
            freed_by = ("allocated", view.relabel(rank, allocated), references - left)
        elif view.part(rank, last) == "after":
            freed_by = ("kept", storage)
        else:
            freed_by = ("early", storage, references - left)
        live.append((size, freed_by))
    return tensors.in_use, tuple(sorted(live, key=repr))     # (a canonical order: the entries mix types)


class SeriesLog:
    """The simulated ranks' series changes from the first snapshot on, to rebuild them after a
    folded run (see the module docstring)."""

    def __init__(self) -> None:
        self.origin: dict[int, MemorySeries] = {}
        """Each rank's series when logging began."""

    def start(self, tensors: RankTensors) -> None:
        if tensors.series.log is None:
            self.origin[tensors.rank] = tensors.series.copy()
            tensors.series.log = []

    def rebuild(self, tensors: RankTensors, periods: int, period_ns: int, first: int, second: int) -> None:
        """The series of the whole step: the changes logged up to the second instant (`second` of
        them), those between the instants (from `first`) `periods` times more, then the rest."""
        log = tensors.series.log
        assert log is not None
        series = self.origin[tensors.rank].copy()
        change = series.change
        for time, value in log[:second]:
            change(time, value)
        for k in range(1, periods + 1):
            shift = k * period_ns
            for time, value in log[first:second]:
                change(time + shift, value)
        shift = periods * period_ns
        for time, value in log[second:]:
            change(time + shift, value)
        tensors.series = series


def snapshot(now: int, counters: tuple[int, ...], loaded: Sequence[int], stored: Sequence[int],
             tracker: TensorTracker | None, ranks: Sequence[int], log: SeriesLog, last_oom_ns: int) -> Snapshot:
    tensors: tuple[RankCounts, ...] = ()
    if tracker is not None:
        states = [tracker.ranks[rank] for rank in ranks]
        for rank_tensors in states:
            log.start(rank_tensors)
        tensors = tuple(RankCounts(s.allocations, len(s.series.log or ())) for s in states)
    return Snapshot(now, counters, tuple(loaded), tuple(stored), tensors, last_oom_ns)


def advance_tensors(tracker: TensorTracker, ranks: Sequence[int], log: SeriesLog, periods: int,
                    before: Snapshot, after: Snapshot) -> None:
    """Carry the simulated ranks' tensor figures forward by `periods` periods."""
    period_ns = after.now - before.now
    for rank, first, second in zip(ranks, before.tensors, after.tensors):
        tensors = tracker.ranks[rank]
        tensors.allocations += periods * (second.allocations - first.allocations)
        if tensors.peak_ns > after.now:       # first reached after the period: that much later
            tensors.peak_ns += periods * period_ns
        log.rebuild(tensors, periods, period_ns, first.logged, second.logged)


def advanced(values: Sequence[int], periods: int, before: Sequence[int], after: Sequence[int]) -> list[int]:
    """Each value plus `periods` times what it gained from `before` to `after`."""
    return [value + periods * (b - a) for value, a, b in zip(values, before, after)]


COUNTERS = ("local_accesses", "remote_accesses", "queueing_delay_ns", "queued_accesses", "local_sharing_delay_ns",
            "remote_sharing_delay_ns")
"""HBMMemory's run counters."""


class TimeFolded:
    """HBMMemory's part in a folded-in-time run (chakra_core.contract.time_folding)."""

    tensors: TensorTracker | None
    _simulated: Sequence[int]
    _scheduler: Scheduler
    _loaded: list[int]
    _stored: list[int]
    _in_flight: int
    _series_log: SeriesLog
    _last_oom_ns: int

    def _done(self, access: tuple[Callable[[int], None], int]) -> None:
        """An access is over: the engine hears of it (through here, to count accesses in flight)."""
        self._in_flight -= 1
        access[0](access[1])

    def _counters(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in COUNTERS)

    def time_fold_state(self, now: int, view: FoldView) -> Hashable:
        return state(self.tensors, self._simulated, self._in_flight, view)

    def statistics_snapshot(self) -> object:
        return snapshot(self._scheduler.now, self._counters(), self._loaded, self._stored, self.tensors,
                        self._simulated, self._series_log, self._last_oom_ns)

    def advance_statistics(self, periods: int, before: Any, after: Any) -> None:
        for name, value in zip(COUNTERS, advanced(self._counters(), periods, before.counters, after.counters)):
            setattr(self, name, value)
        self._loaded = advanced(self._loaded, periods, before.loaded, after.loaded)
        self._stored = advanced(self._stored, periods, before.stored, after.stored)
        if self.tensors is not None:
            advance_tensors(self.tensors, self._simulated, self._series_log, periods, before, after)

    def time_fold_refusal(self, start_ns: int, before: Any, after: Any) -> str:
        if self._last_oom_ns > start_ns:       # its message names a time of the folded run
            return "a rank ran out of memory after the period began"
        return ""
