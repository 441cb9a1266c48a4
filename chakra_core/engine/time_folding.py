"""Time folding in the engine: find the instant at which a run repeats itself one period on, and
carry the run's results forward by the periods its traces leave out (the rule and what a layer
must guarantee: chakra_core.contract.time_folding).

While a folded-in-time run goes, each simulated rank tracks its lowest unfinished node (`low`)
and the nodes finished above it. Whenever the clock rank (the first simulated one) finishes the
first node of one of its periods, at the end of that instant (every event of the ns run), the
watch writes down the run's state relative to that instant: per rank, its in-flight, ready and
finished nodes counted from `low`, with their start times counted from now; every pending event
(the engine's own compute completions with their nodes relabelled the same way, a layer's by its
callback's name) with its time from now; and what each layer adds (`time_fold_state`). Two
instants t1 < t2 with equal states, where every rank moved exactly one period of nodes and both
lie inside every rank's repeating nodes, prove that the step repeats with period t2 - t1; the
counters' snapshots at t1 and t2 give what a period adds.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from chakra_core.contract.time_folding import TimeFoldResult, TimeFolding, unsafe_layers
from chakra_core.engine.driver import RankDriver
from chakra_core.engine.events import EventQueue

if TYPE_CHECKING:
    from chakra_core.contract.layers import LayerModel


@dataclass
class Counters:
    """A rank's counters at an instant (RankDriver's accounting)."""

    time: list[int]
    compute_ns: int
    comm_ns: int
    comm_bytes: dict[str, int]
    type_counts: dict[int, int]
    part_time: list[list[int]]
    replayed_host_collectives: int


class PeriodicDriver(RankDriver):
    """A rank driver that also tracks its lowest unfinished node, for the watch."""

    __slots__ = ("low", "done_above", "watch", "markers")

    def __init__(self, *args: Any, watch: PeriodWatch, markers: frozenset[int] | None = None):
        super().__init__(*args)
        self.low = 0
        self.done_above: set[int] = set()
        self.watch = watch
        self.markers = markers

    def _computed(self, arg: tuple[int, int, int, int]) -> None:
        super()._computed(arg)
        node_id = arg[0]
        if node_id == self.low:
            low, done = node_id + 1, self.done_above
            while low in done:
                done.discard(low)
                low += 1
            self.low = low
        else:
            self.done_above.add(node_id)
        if self.markers is not None and node_id in self.markers:
            self.watch.marked(node_id)

    def counters(self) -> Counters:
        """The counters now (time accounted up to this instant)."""
        self._account()
        return Counters(list(self.time), self.compute_ns, self.comm_ns, dict(self.comm_bytes), dict(self._type_counts),
                        [list(row) for row in self._part_time], self.replayed_host_collectives)

    def advance(self, shift: int, periods: int, before: Counters, after: Counters) -> None:
        """Finish `shift` ns later with `periods` times what [before, after) added to every counter."""
        assert self.finish_ns is not None
        self.finish_ns += shift
        self.time = [now + periods * (b - a) for now, a, b in zip(self.time, before.time, after.time)]
        self.compute_ns += periods * (after.compute_ns - before.compute_ns)
        self.comm_ns += periods * (after.comm_ns - before.comm_ns)
        for key, value in after.comm_bytes.items():
            self.comm_bytes[key] += periods * (value - before.comm_bytes.get(key, 0))
        for kind, count in after.type_counts.items():
            self._type_counts[kind] += periods * (count - before.type_counts.get(kind, 0))
        self._part_time = [[now + periods * (b - a) for now, a, b in zip(row, r1, r2)]
                           for row, r1, r2 in zip(self._part_time, before.part_time, after.part_time)]
        self.replayed_host_collectives += periods * (after.replayed_host_collectives - before.replayed_host_collectives)


@dataclass
class _Snapshot:
    """Every counter of the run at an instant (the end of its events)."""

    now: int
    lows: tuple[int, ...]
    ranks: list[Counters]
    events: int
    layers: list[object]


class PeriodWatch:
    """Watches a folded-in-time run for its period (see the module docstring)."""

    def __init__(self, folding: TimeFolding, queue: EventQueue, layers: Sequence[LayerModel],
                 give_up: Callable[[str], None]):
        self.folding = folding
        self.queue = queue
        self.layers = list(layers)
        self.give_up = give_up
        """Told why, once the last instant that could repeat an earlier one has not: the run stops."""
        self.drivers: list[PeriodicDriver] = []
        self._seen: dict[bytes, _Snapshot] = {}
        self._pending = False
        self._last_look = False
        self.found: tuple[_Snapshot, _Snapshot] | None = None
        self._parts_seen: dict[int | str, set[bytes]] = {}
        self._unsettled: list[int | str] = []
        """What did not repeat at the latest look: the simulated ranks (numbers) and layers (labels)
        whose own part of the state matched none of theirs at earlier looks (said when no instant
        repeats)."""
        self.cycle = 1
        """Periods between the two instants found alike: the run repeats every `cycle` periods (a
        pipeline's stages can settle into a pattern several micro-batches long)."""
        self.unfit_cycle = 0
        """The shortest cycle seen that the periods left out are not a multiple of (0: none): a
        retry whose traces leave out a multiple of it folds."""

    def driver(self, rank: int, *args: Any) -> PeriodicDriver:
        """The driver of simulated rank `rank` (the first one is the clock)."""
        markers = None
        if not self.drivers:
            span = self.folding.ranks[rank]
            markers = frozenset(range(span.first, span.end + 1, span.nodes))
        driver = PeriodicDriver(rank, *args, watch=self, markers=markers)
        self.drivers.append(driver)
        return driver

    def marked(self, node_id: int) -> None:
        """The clock rank began a period: look at the state once this instant's events have run."""
        span = self.folding.ranks[self.drivers[0].rank]
        # the look at the last marker, `end`, names node `end` (just finished): it can repeat an
        # earlier instant only where the nodes after `end` are alike too (reach), else the look a
        # period before it is the last that can
        last = span.end if span.alike_below > span.end else span.end - span.nodes
        self._last_look = self._last_look or node_id >= last
        if not self._pending and self.found is None:
            self._pending = True
            self.queue.after_instant.append(self._look)

    # The state at an instant -----------------------------------------------------------------------
    def _look(self) -> None:
        self._pending = False
        self._compare()
        if self.found is None and self._last_look:
            self.give_up(self.no_repeat())

    def no_repeat(self) -> str:
        """Why the run does not fold: no instant repeated, and what kept changing."""
        if not self._unsettled:
            return NO_REPEAT
        ranks = [str(who) for who in self._unsettled if isinstance(who, int)]
        said = [f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_listed(ranks)}"] if ranks else []
        said += [who for who in self._unsettled if isinstance(who, str)]
        return (f"{NO_REPEAT[:-len(SIMULATING)]}; what kept changing from one period to the next: "
                f"{_listed(said)}{SIMULATING}")

    def _compare(self) -> None:
        now = self.queue.now
        lows = tuple(d.low for d in self.drivers)
        spans = [self.folding.ranks[d.rank] for d in self.drivers]
        if any(low < span.first for low, span in zip(lows, spans)):
            return    # a rank has not reached its repeating nodes: this instant cannot be t1 or t2
        state, highest, parts = self._state(now)
        digest = hashlib.blake2b(repr(state).encode()).digest()
        earlier = self._seen.get(digest)
        inside = all(high < span.alike_below for high, span in zip(highest, spans))
        cycle = 0 if earlier is None else (lows[0] - earlier.lows[0]) // spans[0].nodes
        repeats = earlier is not None and inside and cycle > 0 and all(
            low - before == cycle * span.nodes for low, before, span in zip(lows, earlier.lows, spans))
        if repeats and self.folding.periods % cycle:
            self.unfit_cycle = self.unfit_cycle or cycle
        elif repeats and earlier is not None:
            self.found = (earlier, self._snapshot(now, lows))
            self.cycle = cycle
            self._seen.clear()
            for driver in self.drivers:
                driver.markers = None
            return
        if inside:    # the latest instant with this state: the shortest cycle
            self._seen[digest] = self._snapshot(now, lows)
            self._unsettled = []
            for who, part in parts.items():
                seen = self._parts_seen.setdefault(who, set())
                part_digest = hashlib.blake2b(repr(part).encode()).digest()
                if seen and part_digest not in seen:
                    self._unsettled.append(who)
                seen.add(part_digest)

    def _state(self, now: int) -> tuple[tuple[object, ...], list[int], dict[int | str, object]]:
        """The run's state relative to `now` and each rank's lowest unfinished node, the highest
        node id each rank's state names, and the state's parts by whom they describe (a simulated
        rank, by its number, with its compute events; a layer, by its label) to say what did not
        repeat."""
        ranks: list[object] = []
        highest: list[int] = []
        by_driver = {id(d): position for position, d in enumerate(self.drivers)}
        for d in self.drivers:
            low = d.low
            flying = sorted((n - low, slot, category, start - now) for n, (slot, category, start) in d.inflight.items())
            ready = tuple(tuple(sorted(n - low for n in heap)) for heap in d.ready)
            done = tuple(sorted(n - low for n in d.done_above))
            ranks.append((tuple(flying), ready, done, tuple(d.in_use)))
            names = [low, *(n for n in d.inflight), *(n for heap in d.ready for n in heap), *d.done_above]
            highest.append(max(names))
        events: list[object] = []
        own_events: list[list[object]] = [[] for _ in self.drivers]
        for time in sorted(self.queue.pending_times()):
            for callback, arg in self.queue.bucket(time):
                position = by_driver.get(id(getattr(callback, "__self__", None)))
                if position is not None:     # a compute node of a rank: (node, slot, category, start[, part])
                    owner = self.drivers[position]
                    events.append((time - now, owner.rank, callback.__name__, arg[0] - owner.low, arg[1], arg[2],
                                   arg[3] - now, *arg[4:]))
                    own_events[position].append(events[-1])
                    highest[position] = max(highest[position], arg[0])
                else:
                    events.append((time - now, getattr(callback, "__qualname__", repr(callback))))

        view = _View(self)
        layers = tuple(layer.time_fold_state(now, view) for layer in self.layers)
        parts: dict[int | str, object] = {d.rank: (rank, tuple(mine))
                                          for d, rank, mine in zip(self.drivers, ranks, own_events)}
        parts.update((f"the {layer.layer} layer '{layer.name}'", state) for layer, state in zip(self.layers, layers))
        return (tuple(ranks), tuple(events), layers), highest, parts

    def _snapshot(self, now: int, lows: tuple[int, ...]) -> _Snapshot:
        return _Snapshot(now, lows, [d.counters() for d in self.drivers], self.queue.executed,
                         [layer.statistics_snapshot() for layer in self.layers])

    # Carrying the results forward ------------------------------------------------------------------
    @property
    def cycle_ns(self) -> int:
        assert self.found is not None
        first, second = self.found
        return second.now - first.now

    def why_not(self, unfinished: Sequence[int]) -> str:
        """After the run (each rank's unfinished nodes given): why its results cannot be carried
        forward ("" when they can), said as the reason to simulate every micro-batch."""
        if any(unfinished):
            return "time folding: the run could not finish; simulating every micro-batch to report why"
        if self.found is None:
            return self.no_repeat()
        first, second = self.found
        for layer, before, after in zip(self.layers, first.layers, second.layers):
            reason = layer.time_fold_refusal(first.now, before, after)
            if reason:
                return f"time folding: {layer.layer} plugin '{layer.name}': {reason}; simulating every micro-batch"
        return ""

    def carry_forward(self) -> None:
        """Add `periods` periods to every rank's finish and counters, to the clock, the event
        count and every layer's statistics (the run has drained its events)."""
        assert self.found is not None
        first, second = self.found
        periods = self.folding.periods // self.cycle    # cycles left out
        shift = periods * (second.now - first.now)
        for driver, counted, recounted in zip(self.drivers, first.ranks, second.ranks):
            driver.advance(shift, periods, counted, recounted)
        self.queue.advance(shift, periods * (second.events - first.events))
        for layer, before, after in zip(self.layers, first.layers, second.layers):
            layer.advance_statistics(periods, before, after)


SIMULATING = "; simulating every micro-batch"
NO_REPEAT = ("time folding: no instant of the step repeated the state of an earlier one a period on (a layer's "
             f"state or the traces are not periodic there){SIMULATING}")


def _listed(names: list[str], shown: int = 8) -> str:
    """'a, b and c' (the first `shown`, then how many more)."""
    if len(names) > shown:
        return ", ".join(names[:shown]) + f" and {len(names) - shown} more"
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


class _View:
    """FoldView of the watched run at the instant it looks."""

    def __init__(self, watch: PeriodWatch):
        self._low = {d.rank: d.low for d in watch.drivers}
        self._spans = watch.folding.ranks

    def relabel(self, rank: int, node_id: int) -> int:
        return node_id - self._low.get(rank, 0)

    def part(self, rank: int, node_id: int) -> str:
        span = self._spans[rank]
        return "before" if node_id < span.first else "repeats" if node_id < span.alike_below else "after"


@dataclass
class TimeUnfold:
    """Restart hint: simulate the whole step's traces (no period was found), or with `retry`, first
    traces that may fold (traces_after)."""

    reason: str
    cycle: int = 0
    """The cycle the run repeated with, which the periods left out were not a multiple of (0: none)."""
    retry: bool = False

    def __str__(self) -> str:
        return self.reason


def traces_after(folding: TimeFolding, reason: str, hint: TimeUnfold | None) -> tuple[list[Path], TimeFolding | None, str]:
    """What a run that cannot fold starts over on: after no instant repeated (`hint`), another try's
    traces and folding (TimeFolding.retry) with what the restart says; else the whole step's
    traces (written now, when they are not yet), no folding, and `reason`."""
    again = folding.retry(hint.cycle) if hint is not None and hint.retry and folding.retry is not None else None
    if again is not None and hint is not None:
        retried, traces = again
        how = (f"it repeats every {hint.cycle} periods, so {retried.periods} periods are left out (a multiple of "
               "it)" if hint.cycle else f"{retried.steady_periods} steady periods are kept to see a longer cycle")
        return [Path(p) for p in traces], retried, f"{reason.removesuffix(SIMULATING)}; folding again: {how}"
    assert folding.full_traces is not None
    return [Path(p) for p in folding.full_traces()], None, reason


def time_fold_result(watch: PeriodWatch | None, note: str) -> TimeFoldResult | None:
    """What results.json says of time folding (None: the run's traces had no periods)."""
    if watch is not None and watch.found is not None:
        folding = watch.folding
        return TimeFoldResult(True, "", folding.periods, watch.cycle, watch.cycle_ns, folding.microbatches_per_period,
                              folding.microbatches_simulated, folding.microbatches)
    return TimeFoldResult(False, note) if note else None


def time_fold_refusal(layers: dict[str, LayerModel], timeline: bool, observed: bool) -> str:
    """Why a run cannot fold in time ("" when it can)."""
    if timeline:
        return "a timeline records every node"
    if observed:
        return "a plugin observes every node"
    return unsafe_layers((layer, instance.name, instance.time_fold_safe) for layer, instance in layers.items())

