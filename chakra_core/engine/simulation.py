"""One simulation run: build the layers, one driver per rank, run the event loop.

Layers are built in dependency order (memory, compute, network, system) from
the classes the manifest selected; each gets a `LayerContext` holding the
scheduler and the layers built before it. Every exception a layer raises is
re-raised as a `PluginError` that names the plugin. When the event queue
drains while a rank still holds unfinished nodes, the run stops with a
`DeadlockError` listing, per rank, what it waits for.

Observer hooks are called here, one implementation at a time (not through
pluggy's dispatch) so that an exception names the plugin that raised it.
They receive read-only copies (`ReadOnlyDict`); what a
`chakra_sim_simulation_end` returns is stored under `results["plugins"]`.
Feeders are closed however the run ends.
"""

from __future__ import annotations

import copy
import gc
import json
import re
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from chakra_core import __version__
from chakra_core.engine.driver import RankDriver, slot_table
from chakra_core.engine.events import EventQueue
from chakra_core.errors import ChakraSimError, DeadlockError, PluginError, RestartRun, SimulationError, Unfold
from chakra_core.feeder import open_feeder
from chakra_core.feeder.library import TraceLibrary
from chakra_core.fold import Folding
from chakra_core.layers import LayerContext, LayerModel
from chakra_core.plugins import Implementation, PluginHost


@dataclass
class Resources:
    """Operations a rank may have in flight at once, per hardware resource (None: unlimited)."""

    cpu: int | None = 1
    gpu: int | None = 1
    comm: int | None = 1
    memory: int | None | str = "comm"   # "comm": memory operations share the comm slot

    def capacities(self) -> list[int | None]:
        memory = None if self.memory == "comm" else self.memory
        return [self.cpu, self.gpu, self.comm, memory, None]


@dataclass
class LayerChoice:
    impl: Implementation
    config: Any


@dataclass
class RunSpec:
    """Everything a run needs, resolved (paths absolute, configs validated)."""

    trace_files: list[Path]
    layers: dict[str, LayerChoice]
    feeder: str = "streaming"
    cache_nodes: int = 4096
    missing_parents: str = "ignore-control"
    dependencies: str = "all"
    fold: str = "auto"
    """"auto": simulate one rank per class of equivalent ranks where that is exact; "off": all."""
    resources: Resources = field(default_factory=Resources)
    comm_groups: dict[str, list[int]] = field(default_factory=dict)
    base_dir: Path = Path(".")
    manifest: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


MAX_RESTARTS = 8
"""RestartRun attempts before the last one, which runs with extras["closed_form"] False."""


class Simulation:
    """Build with a RunSpec and a PluginHost, then call run()."""

    def __init__(self, spec: RunSpec, host: PluginHost, record_intervals: bool = False):
        self.spec = spec
        self.intervals: list | None = [] if record_intervals else None
        """With record_intervals: (rank, node id, name, type, slot, start ns, end ns, parent ids)
        per finished node, in completion order (for timelines)."""
        self.host = host
        self.num_ranks = len(spec.trace_files)
        self.restarts: list[str] = []
        """Why the run started over (RestartRun messages), oldest first."""
        self.node_observer_wanted = bool(self._observer_calls("chakra_sim_node_finished"))
        self._setup([])
        self.node_observer: Callable[..., Any] | None = None
        node_calls = self._observer_calls("chakra_sim_node_finished")
        if node_calls:
            self.node_observer = lambda **kwargs: self._call_observers(
                "chakra_sim_node_finished", node_calls, kwargs)
        self.drivers: list[RankDriver] = []
        self.finished = 0
        self.wall_s = 0.0

    def _setup(self, hints: list, folding: Folding | None = None) -> None:
        """Build the clock, the context and the layers (again, on a restart, with its hints; or
        to simulate one rank per class of `folding`)."""
        spec = self.spec
        self.queue = EventQueue()
        extras = {"comm_groups": spec.comm_groups, "comm_capacity": spec.resources.comm,
                  "algorithms": self.host.algorithms(), "trace_files": list(spec.trace_files),
                  "dependencies": spec.dependencies, "restart_hints": list(hints)}
        if len(hints) >= MAX_RESTARTS:
            extras["closed_form"] = False    # last attempt: every layer times everything event by event
        self.folding = folding
        if folding is not None:
            extras["folding"] = folding
            extras["rank_weights"] = {rep: folding.weight(rep) for rep in folding.representatives}
            self.fold_note = folding.describe()
        elif spec.fold == "off":
            self.fold_note = "workload.fold is off"
        elif any(isinstance(hint, Unfold) for hint in hints):
            self.fold_note = next(str(h) for h in hints if isinstance(h, Unfold))
        elif self.num_ranks < 2:
            self.fold_note = "one rank"
        else:
            self.fold_note = ""
        self.context = LayerContext(num_ranks=self.num_ranks, scheduler=self.queue,
                                    base_dir=spec.base_dir, extras=extras)
        for warning in spec.warnings:
            self.context.warn(warning)
        self.layers: dict[str, LayerModel] = {}
        self.memory = self._build("memory")
        self.context.memory = self.memory
        self.compute = self._build("compute")
        self.context.compute = self.compute
        self.network = self._build("network")
        self.context.network = self.network
        if self.network is not None and self.network.npus_count != self.num_ranks:
            first = spec.trace_files[0] if spec.trace_files else "?"
            raise SimulationError(
                f"the trace has {self.num_ranks} rank(s) ({first} ...) but the network "
                f"(plugin '{self.network.name}') has {self.network.npus_count} NPUs; they must match: "
                "change the network's size or give as many trace files as NPUs")
        self.system = self._build("system")
        if folding is None and not self.fold_note:
            self._check_foldable()

    def _check_foldable(self) -> None:
        """Why equivalent ranks cannot be folded whatever the traces say ("" when they can)."""
        unsafe = [f"{layer} plugin '{instance.name}'" for layer, instance in self.layers.items()
                  if not instance.fold_safe]
        if self.intervals is not None:
            self.fold_note = "a timeline records every rank"
        elif self.node_observer_wanted:
            self.fold_note = "a plugin observes every node"
        elif unsafe:
            self.fold_note = f"{', '.join(unsafe)} cannot stand one rank for another (fold_safe is false)"

    def _fold(self) -> None:
        """Find classes of equivalent ranks; if there are some, rebuild the layers for them."""
        from chakra_core.fold import find_folding

        folding, note = find_folding(self.spec.trace_files, self.spec.comm_groups)
        if folding is None:
            self.fold_note = note
        else:
            self._setup([], folding)

    def _build(self, layer: str) -> LayerModel | None:
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
        self.layers[layer] = instance
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

    def run(self, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Simulate to the end and return the results document.

        Feeders are closed on every way out: success, an error, KeyboardInterrupt.
        """
        started = time.perf_counter()
        try:
            if self.folding is None and not self.fold_note:
                self._fold()
            self._open_feeders()
            run_info = ReadOnlyDict.of(self.run_info())
            self._call_observers("chakra_sim_simulation_start",
                                 self._observer_calls("chakra_sim_simulation_start"), {"run": run_info})
            hints: list = []
            while True:
                try:
                    self._simulate(progress)
                    break
                except RestartRun as restart:
                    hints.append(restart.hint)
                    self.restarts.append(str(restart))
                    self._close_feeders()
                    self.drivers, self.finished = [], 0
                    if self.intervals is not None:
                        self.intervals.clear()
                    self._setup(hints)
                    self._open_feeders()
                except ChakraSimError:
                    raise
                except Exception as exc:
                    raise self._blame(exc) from exc
                finally:
                    self.wall_s = time.perf_counter() - started
            for reason in dict.fromkeys(self.restarts):
                self.context.warn(f"the run started over ({len(self.restarts)} time(s)): {reason}")
            unfinished = {d.rank: d.remaining for d in self.drivers if d.remaining}
            if unfinished:
                waits = {rank: self.driver_of[rank].waits() for rank in unfinished}
                raise DeadlockError(self.queue.now, waits, unfinished)
            from chakra_core.report.results import build_results
            try:   # layers' summary(), rank_summary() and terminal_tables() run here
                results = build_results(self)
            except ChakraSimError:
                raise
            except Exception as exc:
                raise self._blame(exc) from exc
            self._observe_end(run_info, results)
            return results
        finally:
            self._close_feeders()

    def _simulate(self, progress: Callable[[int], None] | None) -> None:
        """The event loop, to the end of the run."""
        with _lenient_gc() as collect_now:
            for driver in self.drivers:
                driver.start()
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
                if self.finished == len(self.drivers) or not self.system.on_idle():
                    break
                if not len(self.queue):   # on_idle said True but scheduled nothing: stuck
                    break
        if self.folding is not None and any(d.remaining for d in self.drivers):
            # A deadlock is reported rank by rank: find it again with every rank simulated.
            reason = "the folded run could not finish; simulating every rank to report why"
            raise RestartRun(reason, Unfold(reason))
        for layer in self.layers.values():
            layer.finish()

    def _close_feeders(self) -> None:
        """Close every opened feeder; one that fails to close does not keep the others open."""
        with ExitStack() as stack:
            for driver in self.drivers:
                stack.callback(driver.feeder.close)

    # Observer hooks ----------------------------------------------------------------------------
    def _observer_calls(self, hook_name: str) -> list[tuple[str, Callable[..., Any], tuple[str, ...]]]:
        """(plugin name, function, argument names) per implementation, in pluggy's order
        (last registered first). An implementation may take a subset of the hook's arguments."""
        hook = getattr(self.host.pm.hook, hook_name)
        return [(impl.plugin_name, impl.function, tuple(impl.argnames))
                for impl in reversed(hook.get_hookimpls())]

    def _call_observers(self, hook_name: str, calls: list[tuple[str, Callable[..., Any], tuple[str, ...]]],
                        kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
        """Call each implementation; return (plugin name, returned value) pairs."""
        out = []
        for plugin, function, argnames in calls:
            try:
                value = function(*[kwargs[name] for name in argnames])
            except ChakraSimError:
                raise
            except Exception as exc:
                raise self._observer_error(plugin, hook_name, exc) from exc
            out.append((plugin, value))
        return out

    def _observe_end(self, run_info: ReadOnlyDict, results: dict[str, Any]) -> None:
        """Call chakra_sim_simulation_end with a read-only copy of `results`; store what each
        plugin returns under results["plugins"][<plugin name>] (absent when none returns a dict)."""
        hook_name = "chakra_sim_simulation_end"
        calls = self._observer_calls(hook_name)
        if not calls:
            return
        view = ReadOnlyDict.of(results)
        returned: dict[str, Any] = {}
        for plugin, value in self._call_observers(hook_name, calls, {"run": run_info, "results": view}):
            if value is None:
                continue
            if not isinstance(value, dict):
                raise PluginError(f"{self._plugin_label(plugin)} returned {type(value).__name__} from "
                                  f"{hook_name}; return a JSON-serialisable dict or None")
            try:   # a JSON round trip: the stored value is exactly what results.json will hold
                returned[plugin] = json.loads(json.dumps(value))
            except (TypeError, ValueError) as exc:
                raise PluginError(f"{self._plugin_label(plugin)} returned a result from {hook_name} "
                                  f"that is not JSON-serialisable: {exc}") from exc
        if returned:
            results["plugins"] = dict(sorted(returned.items()))

    def _plugin_label(self, plugin: str) -> str:
        info = self.host.plugins.get(plugin)
        return f"plugin '{plugin}'" + (f" ({info.distribution} {info.version})" if info is not None else "")

    def _observer_error(self, plugin: str, hook_name: str, exc: Exception) -> PluginError:
        """One line naming the plugin, the hook and the innermost line of the plugin's code."""
        info = self.host.plugins.get(plugin)
        prefixes = info.modules if info is not None else ()
        where = ""
        tb = exc.__traceback__
        while tb is not None:
            module = tb.tb_frame.f_globals.get("__name__", "")
            if any(module == p or module.startswith(p + ".") for p in prefixes):
                where = f" ({module}:{tb.tb_lineno})"
            tb = tb.tb_next
        when = f" at t={self.queue.now} ns" if hook_name == "chakra_sim_node_finished" else ""
        detail = re.sub(r"\s*\n\s*", " ", str(exc)).strip()
        return PluginError(f"{self._plugin_label(plugin)} raised {type(exc).__name__}: {detail} "
                           f"in {hook_name}{when}{where}")

    def run_info(self) -> dict[str, Any]:
        return {"manifest": self.spec.manifest, "num_ranks": self.num_ranks,
                "layers": dict(self.layers), "version": __version__}

    def _blame(self, exc: BaseException) -> ChakraSimError:
        """Name the plugin whose code raised `exc` (innermost plugin frame wins)."""
        tb = exc.__traceback__
        culprit = None
        while tb is not None:
            module = tb.tb_frame.f_globals.get("__name__", "")
            info = self.host.owner_of_module(module)
            if info is not None and info.distribution != "chakra-sim":
                culprit = (info, module, tb.tb_lineno)
            tb = tb.tb_next
        if culprit is None:
            return SimulationError(f"internal error at t={self.queue.now} ns: "
                                   f"{type(exc).__name__}: {exc} (please report this)")
        info, module, line = culprit
        return PluginError(f"plugin '{info.name}' ({info.distribution} {info.version}) raised "
                           f"{type(exc).__name__}: {exc} at t={self.queue.now} ns ({module}:{line})")


@contextmanager
def _lenient_gc():
    """Pause the cyclic garbage collector during the event loop; yields a `collect_now` function.

    A run keeps millions of live objects (queued messages, node caches) and
    creates few reference cycles; CPython's collector would rescan the live
    ones over and over (measured: 45% of a 1,024-NPU all-to-all). The loop
    calls `collect_now` every few million events to bound cyclic garbage.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield lambda: gc.collect(1)
    finally:
        if enabled:
            gc.enable()


class ReadOnlyDict(dict):
    """A dict whose changes raise TypeError; observer hooks receive the run and the results so.

    `ReadOnlyDict.of(value)` copies dicts and lists recursively (lists become `ReadOnlyList`),
    so even a write that bypasses the checks leaves the engine's own document untouched. Other
    objects (the layer instances in `run["layers"]`) are shared, not copied. json.dumps works on
    it; copy.deepcopy returns plain, mutable dicts and lists.
    """

    @classmethod
    def of(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return cls((key, cls.of(item)) for key, item in value.items())
        if isinstance(value, list):
            return ReadOnlyList(cls.of(item) for item in value)
        if isinstance(value, tuple):
            return tuple(cls.of(item) for item in value)
        return value

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("read-only: observer hooks get copies they cannot change; "
                        "chakra_sim_simulation_end returns what it wants stored in the results "
                        "(copy.deepcopy() gives a mutable copy)")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]

    def __copy__(self) -> dict[Any, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[Any, Any]:
        return {key: copy.deepcopy(item, memo) for key, item in self.items()}

    def __reduce_ex__(self, protocol: Any) -> Any:
        return dict, (dict(self),)


class ReadOnlyList(list):
    """The list counterpart of `ReadOnlyDict`."""

    _refuse = ReadOnlyDict._refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = append = extend = insert = pop = remove = \
        clear = sort = reverse = _refuse  # type: ignore[assignment]

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return [copy.deepcopy(item, memo) for item in self]

    def __reduce_ex__(self, protocol: Any) -> Any:
        return list, (list(self),)
