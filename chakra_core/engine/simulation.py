"""One simulation: build the layers, one driver per rank, run the event loop to the end.

Layers are built in dependency order (memory, compute, network, system) from
the classes the manifest selected; each gets a `LayerContext` holding the
scheduler, the run's inputs and the layers built before it. Every exception a
layer raises is re-raised as a `PluginError` that names the plugin. When the
event queue drains while a rank still holds unfinished nodes, the run stops
with a `DeadlockError` listing, per rank, what it waits for.

A layer that learns something which invalidates what it already timed asks
for a restart (`LayerContext.request_restart`): the event loop stops after the
current event, and the run starts over with every layer built again and the
hints gathered so far in `RunInputs.restart_hints`. A folded run that cannot
finish starts over unfolded the same way, so that a deadlock is reported rank
by rank. After `MAX_RESTARTS` restarts, the last attempt runs with
`RunInputs.closed_form` False (every layer times everything event by event).

A generated job's traces may keep fewer micro-batches than its step (`RunSpec.time_folding`):
a `PeriodWatch` (engine/time_folding.py) then finds the instant the run repeats and carries the
results forward; a run that does not repeat, or a layer that is not `time_fold_safe`, gets the
whole step's traces instead.

`run()` returns a `FinishedRun`: per-rank records and the layers, from which
chakra_core.report builds the results document. Feeders are closed however the
run ends.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from chakra_core._version import __version__
from chakra_core.config.spec import RunSpec
from chakra_core.contract.folding import Folding
from chakra_core.contract.time_folding import TimeFoldResult
from chakra_core.plugins import PluginHost
from chakra_core.contract.inputs import LayerContext, RestartRequest, RunInputs, Unfold
from chakra_core.contract.layers import ComputeModel, LayerModel, MemoryModel, SystemLayer
from chakra_core.contract.network import NetworkModel
from chakra_core.engine.collector import lenient_gc
from chakra_core.engine.driver import Interval, RankDriver, slot_table, step_part
from chakra_core.et.attr_cache import AttributeCache
from chakra_core.engine.events import EventQueue
from chakra_core.engine.folding import unfolded_job
from chakra_core.engine.observers import Observers, ReadOnlyDict, blame
from chakra_core.engine.time_folding import PeriodWatch, TimeUnfold, time_fold_refusal, time_fold_result, traces_after
from chakra_core.errors import ChakraSimError, DeadlockError, PluginError, SimulationError
from chakra_core.feeder import open_feeder
from chakra_core.feeder.library import TraceLibrary
from chakra_core.json_types import JsonObject

MAX_RESTARTS = 8
"""Restarts before the last attempt, which runs with RunInputs.closed_form False."""


@dataclass
class RankRecord:
    """What one simulated rank did: its finish time and where the time went."""

    rank: int
    finish_ns: int
    breakdown: dict[str, int]
    """The six exclusive time categories (engine.driver.BREAKDOWN); they sum to finish_ns."""
    compute_ns: int
    comm_ns: int
    comm_bytes: dict[str, int]
    node_counts: dict[str, int]
    parts: dict[str, dict[str, int]] | None = None
    """With RunSpec.step_parts: each breakdown category split by the nodes' step_part."""


@dataclass
class FinishedRun:
    """A run simulated to its end, before its results document is built."""

    spec: RunSpec
    num_ranks: int
    ranks: list[RankRecord]
    """One per simulated rank (every rank, or the representatives of a folded run)."""
    layers: dict[str, LayerModel]
    folding: Folding | None
    fold_note: str
    """Why the run was not folded ("" when it was)."""
    events: int
    warnings: list[str]
    intervals: list[Interval] | None
    restarts: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    time_fold: TimeFoldResult | None = None
    """A generated job's time folding: what was folded, or why not (None: the run had no periods)."""


class Simulation:
    """Build with a RunSpec and a PluginHost (the layers are built at once), then call run()."""

    def __init__(self, spec: RunSpec, host: PluginHost, record_intervals: bool = False, ranks: int | None = None):
        self.spec = spec
        self.host = host
        self.intervals: list[Interval] | None = [] if record_intervals else None
        """With record_intervals: one per finished node, in completion order (for timelines)."""
        self.part_of = AttributeCache(step_part)
        """A node's step part, by its attributes, for every rank's driver."""
        # `ranks`: layers built for a job's ranks without its traces (run.build_layers)
        self.num_ranks = len(spec.trace_files) if ranks is None else ranks
        self.restarts: list[str] = []
        """Why the run started over (restart requests' reasons), oldest first."""
        self.observers = Observers(host, lambda: self.queue.now)   # _setup builds the queue
        self.node_observer: Callable[..., None] | None = self.observers.node_observer()
        self.drivers: list[RankDriver] = []
        self.driver_of: dict[int, RankDriver] = {}
        self.finished, self.wall_s = 0, 0.0
        self.watch: PeriodWatch | None = None
        self.time_fold_note = spec.time_fold_note
        """Why a generated job was not folded in time ("" when it was, or nothing to say)."""
        self._setup([])

    # Building ----------------------------------------------------------------------------------
    def _setup(self, hints: list[object], folding: Folding | None = None) -> None:
        """Build the clock, the context and the layers (again, on a restart, with its hints; or
        to simulate one rank per class of `folding`)."""
        spec = self.spec
        self.queue: EventQueue = EventQueue()
        self.folding = folding
        if folding is not None:
            self.fold_note = folding.describe()
        elif spec.fold == "off":
            self.fold_note = "workload.fold is off"
        elif any(isinstance(hint, Unfold) for hint in hints):
            self.fold_note = next(str(h) for h in hints if isinstance(h, Unfold))
        elif self.num_ranks < 2:
            self.fold_note = "one rank"
        else:
            self.fold_note = ""
        inputs = RunInputs(
            trace_files=tuple(spec.trace_files), comm_groups=spec.comm_groups,
            dependencies=spec.dependencies, comm_capacity=spec.resources.comm,
            algorithms=self.host.algorithms(), base_dir=spec.base_dir, folding=folding,
            restart_hints=tuple(hints),
            closed_form=len(hints) < MAX_RESTARTS)   # the last attempt times everything by events
        self.context = LayerContext(num_ranks=self.num_ranks, scheduler=self.queue, inputs=inputs,
                                    stop=self.queue.stop)
        for warning in spec.warnings:
            self.context.warn(warning)
        self.layers: dict[str, LayerModel] = {}
        self.memory = self._build("memory", MemoryModel)
        self.context.memory = self.memory
        self.compute = self._required("compute", ComputeModel)
        self.context.compute = self.compute
        self.network = self._build("network", NetworkModel)
        self.context.network = self.network
        if self.network is not None and self.network.npus_count != self.num_ranks:
            first = spec.trace_files[0] if spec.trace_files else "?"
            raise SimulationError(
                f"the trace has {self.num_ranks} rank(s) ({first} ...) but the network "
                f"(plugin '{self.network.name}') has {self.network.npus_count} NPUs; they must match: "
                "change the network's size or give as many trace files as NPUs")
        self.system = self._required("system", SystemLayer)
        if type(self.system).gpu_load is not SystemLayer.gpu_load:   # compute models ask only if it can answer
            self.context.gpu_load = self.system.gpu_load
            if self.compute.retimes and self.system.reports_comm_starts:   # kernels' ends move as it starts
                self.context.comm_start = lambda rank: self.driver_of[rank].move_kernels(self.compute.retime(rank))
        if folding is None and not self.fold_note:
            self._check_foldable()
        self.watch = None
        if spec.time_folding is not None:
            refusal = time_fold_refusal(self.layers, self.intervals is not None, self.node_observer is not None)
            if refusal:   # build the layers again: their inputs must name the whole step's traces
                self._unfold_time(refusal)
                self._setup(hints, folding)
                return
            watch = PeriodWatch(spec.time_folding, self.queue, list(self.layers.values()), lambda reason: (
                self.context.request_restart(reason, TimeUnfold(reason, watch.unfit_cycle, retry=True))))
            self.watch = watch

    def _unfold_time(self, reason: str, hint: TimeUnfold | None = None) -> None:
        """Start over on another try at folding (`hint`: no instant repeated) or on the whole step's traces."""
        assert self.spec.time_folding is not None
        traces, folding, said = traces_after(self.spec.time_folding, reason, hint)
        self.spec = dataclasses.replace(self.spec, trace_files=traces, time_folding=folding)
        if folding is not None:   # another try: its restart says what it does
            self.restarts[-1] = said
        self.time_fold_note = reason if folding is None else ""

    def _check_foldable(self) -> None:
        """Why equivalent ranks cannot be folded whatever the traces say ("" when they can)."""
        mirrored = getattr(self.system, "mirrors_folded_traffic", False)   # the network sees every rank's
        unsafe = [f"{layer} plugin '{instance.name}'" for layer, instance in self.layers.items()
                  if not instance.fold_safe and not (layer == "network" and mirrored)]
        if self.intervals is not None:
            self.fold_note = "a timeline records every rank"
        elif self.node_observer is not None:
            self.fold_note = "a plugin observes every node"
        elif unsafe:
            self.fold_note = f"{', '.join(unsafe)} cannot stand one rank for another (fold_safe is false)"

    def _fold(self) -> None:
        """Find classes of equivalent ranks; if there are some, rebuild the layers for them."""
        if self.spec.folding is not None:   # known by construction
            self._setup([], self.spec.folding)
            return
        from chakra_core.engine.folding import find_folding

        folding, note = find_folding(list(self.spec.trace_files), self.spec.comm_groups)
        if folding is None:
            self.fold_note = note
        else:
            self._setup([], folding)

    def _build(self, layer: str, kind: type[Any]) -> Any:
        choice = self.spec.layers.get(layer)
        if choice is None:
            return None
        impl = choice.impl
        try:
            instance = impl.cls(choice.config, self.context)
        except ChakraSimError:
            raise
        except Exception as exc:
            raise PluginError(f"{layer} plugin '{impl.name}' ({impl.plugin.distribution}) failed to "
                              f"initialise: {type(exc).__name__}: {exc}") from exc
        assert isinstance(instance, kind)
        self.layers[layer] = instance
        return instance

    def _required(self, layer: str, kind: type[Any]) -> Any:
        instance = self._build(layer, kind)
        if instance is None:
            raise SimulationError(f"the run has no {layer} layer")
        return instance

    def _open_feeders(self) -> None:
        spec = self.spec
        slots = slot_table(spec.resources.memory == "comm")
        capacities = spec.resources.capacities()
        library = (TraceLibrary(spec.cache_nodes, spec.missing_parents, spec.dependencies)
                   if spec.feeder == "streaming" else None)
        simulated = (range(self.num_ranks) if self.folding is None else self.folding.representatives)
        for rank in simulated:
            path = spec.trace_files[rank]
            if library is not None:
                feeder = library.open(path)
            else:
                feeder = open_feeder(path, spec.feeder, spec.cache_nodes, spec.missing_parents,
                                     spec.dependencies)
            for warning in getattr(feeder, "warnings", []):
                self.context.warn(warning)
            if self.watch is not None:
                self.drivers.append(self.watch.driver(rank, feeder, self, capacities, slots))
            else:
                self.drivers.append(RankDriver(rank, feeder, self, capacities, slots))
        drivers = self.driver_of = {driver.rank: driver for driver in self.drivers}
        self.context.comm_state = lambda rank, node_id, waiting: drivers[rank].comm_waiting(node_id, waiting)

        def release(nodes: Iterable[tuple[int, int]]) -> None:
            for rank, node_id in nodes:
                drivers[rank].comm_waiting(node_id, False)

        self.context.comm_release = release

    def rank_finished(self, rank: int) -> None:
        self.finished += 1

    def node_progress(self) -> tuple[int, int]:
        """(nodes finished, nodes in the trace) over all ranks, for progress bars."""
        total = sum(d.feeder.num_nodes for d in self.drivers)
        return total - sum(d.remaining for d in self.drivers), total

    # Running -----------------------------------------------------------------------------------
    def run(self, progress: Callable[[int], None] | None = None) -> FinishedRun:
        """Simulate to the end (starting over as layers ask); return what every rank did.

        Feeders are closed on every way out: success, an error, KeyboardInterrupt.
        """
        started = time.perf_counter()
        try:
            if self.folding is None and not self.fold_note:
                self._fold()
            elif self.folding is None and self.spec.folding is not None:
                note = self.fold_note
                if self.spec.unfolded_traces is None:
                    raise SimulationError(f"the traces were generated for a folded run (one rank per class) but "
                                          f"this run cannot fold: {note}; set workload.fold: off")
                self.spec, self.time_fold_note = unfolded_job(self.spec, note, self.time_fold_note)
                self._setup([])
                self.fold_note = note   # what _setup found before the traces changed
            self._open_feeders()
            self.run_info = ReadOnlyDict.of(self.describe())
            self.observers.start(self.run_info)
            hints: list[object] = []
            while True:
                try:
                    restart = self._simulate(progress)
                except ChakraSimError:
                    if self.context.restart is None:
                        raise
                    restart = self.context.restart    # superseded: a real error comes back
                except Exception as exc:
                    if self.context.restart is None:
                        raise blame(self.host, exc, self.queue.now) from exc
                    restart = self.context.restart
                finally:
                    self.wall_s = time.perf_counter() - started
                if restart is None:
                    break
                if len(hints) > MAX_RESTARTS:    # the last attempt was to time everything by events
                    raise SimulationError(f"the run started over {len(hints)} times and a layer still asks to "
                                          f"start over: {restart.reason}")
                unfold_job = isinstance(restart.hint, Unfold) and self.spec.folding is not None
                if unfold_job and self.spec.unfolded_traces is None:
                    raise SimulationError(f"{restart.reason}, but the traces were generated for a folded run "
                                          "(one rank per class); set workload.fold: off to simulate every rank")
                hints.append(restart.hint)
                self.restarts.append(restart.reason)
                self._close_feeders()
                if unfold_job:   # after the feeders close: the representatives' files are written again
                    self.spec, self.time_fold_note = unfolded_job(self.spec, restart.reason, self.time_fold_note)
                self.drivers, self.finished = [], 0
                if self.intervals is not None:
                    self.intervals.clear()
                if isinstance(restart.hint, TimeUnfold):
                    self._unfold_time(restart.reason, restart.hint)
                # classes known by construction stay (only representatives' traces exist)
                self._setup(hints, self.folding if self.spec.folding is not None else None)
                self._open_feeders()
            for reason in dict.fromkeys(self.restarts):
                self.context.warn(f"the run started over ({len(self.restarts)} time(s)): {reason}")
            unfinished = {d.rank: d.remaining for d in self.drivers if d.remaining}
            if unfinished:
                waits = {rank: self.driver_of[rank].waits() for rank in unfinished}
                raise DeadlockError(self.queue.now, waits, unfinished)
            return self._finished()
        finally:
            self._close_feeders()

    def _simulate(self, progress: Callable[[int], None] | None) -> RestartRequest | None:
        """The event loop, to the end of the run or to a restart request (returned)."""
        context = self.context
        with lenient_gc() as collect_now:
            for driver in self.drivers:
                driver.start()
                if context.restart is not None:
                    return context.restart
            ticks = 0

            def tick(now: int) -> None:
                nonlocal ticks
                ticks += 1
                if ticks % 64 == 0:   # every ~4M events
                    collect_now()
                if progress is not None:
                    progress(now)

            while True:
                self.queue.run(tick)
                if context.restart is not None:
                    return context.restart
                if self.finished == len(self.drivers) or not self.system.on_idle():
                    break
                if context.restart is not None:
                    return context.restart
                if not len(self.queue):   # on_idle said True but scheduled nothing: stuck
                    break
        if self.watch is not None:
            refusal = self.watch.why_not([d.remaining for d in self.drivers])
            if refusal:
                return RestartRequest(refusal, TimeUnfold(refusal))
        if self.folding is not None and any(d.remaining for d in self.drivers):
            # A deadlock is reported rank by rank: find it again with every rank simulated.
            reason = "the folded run could not finish; simulating every rank to report why"
            return RestartRequest(reason, Unfold(reason))
        if self.watch is not None:
            self.watch.carry_forward()
        for layer in self.layers.values():
            layer.finish()
        return context.restart

    def _finished(self) -> FinishedRun:
        ranks = []
        for driver in self.drivers:
            assert driver.finish_ns is not None
            ranks.append(RankRecord(driver.rank, driver.finish_ns, driver.breakdown(), driver.compute_ns,
                                    driver.comm_ns, dict(driver.comm_bytes), driver.node_counts,
                                    driver.parts()))
        return FinishedRun(self.spec, self.num_ranks, ranks, dict(self.layers), self.folding, self.fold_note,
                           self.queue.executed, self.context.warnings, self.intervals, list(self.restarts),
                           self.wall_s, time_fold_result(self.watch, self.time_fold_note))

    def _close_feeders(self) -> None:
        """Close every opened feeder; one that fails to close does not keep the others open."""
        with ExitStack() as stack:
            for driver in self.drivers:
                stack.callback(driver.feeder.close)

    # After the run -----------------------------------------------------------------------------
    @contextmanager
    def blaming(self) -> Iterator[None]:
        """Errors raised inside (layers' summaries, observers) name the plugin that raised them."""
        try:
            yield
        except ChakraSimError:
            raise
        except Exception as exc:
            raise blame(self.host, exc, self.queue.now) from exc

    def observe_end(self, document: Mapping[str, Any]) -> JsonObject | None:
        """chakra_sim_simulation_end with the results document; what the observers returned (see Observers.end)."""
        return self.observers.end(self.run_info, document)

    def describe(self) -> dict[str, object]:
        """What observers see of the run (`chakra_sim_simulation_start`)."""
        return {"manifest": self.spec.manifest, "num_ranks": self.num_ranks,
                "layers": dict(self.layers), "version": __version__}

