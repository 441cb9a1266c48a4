"""One simulation run: build the layers, one driver per rank, run the event loop.

Layers are built in dependency order (memory, compute, network, system) from
the classes the manifest selected; each gets a `LayerContext` holding the
scheduler and the layers built before it. Every exception a layer raises is
re-raised as a `PluginError` that names the plugin. When the event queue
drains while a rank still holds unfinished nodes, the run stops with a
`DeadlockError` listing, per rank, what it waits for.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from chakra_core import __version__
from chakra_core.engine.driver import RankDriver, slot_table
from chakra_core.engine.events import EventQueue
from chakra_core.errors import ChakraSimError, DeadlockError, PluginError, SimulationError
from chakra_core.feeder import open_feeder
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
    resources: Resources = field(default_factory=Resources)
    comm_groups: dict[str, list[int]] = field(default_factory=dict)
    base_dir: Path = Path(".")
    manifest: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


class Simulation:
    """Build with a RunSpec and a PluginHost, then call run()."""

    def __init__(self, spec: RunSpec, host: PluginHost, record_intervals: bool = False):
        self.spec = spec
        self.intervals: list | None = [] if record_intervals else None
        """With record_intervals: (rank, node id, name, type, slot, start ns, end ns, parent ids)
        per finished node, in completion order (for timelines)."""
        self.host = host
        self.num_ranks = len(spec.trace_files)
        self.queue = EventQueue()
        self.context = LayerContext(num_ranks=self.num_ranks, scheduler=self.queue,
                                    base_dir=spec.base_dir,
                                    extras={"comm_groups": spec.comm_groups,
                                            "algorithms": host.algorithms(),
                                            "trace_files": list(spec.trace_files),
                                            "dependencies": spec.dependencies})
        for warning in spec.warnings:
            self.context.warn(warning)
        self.layers: dict[str, LayerModel] = {}
        self.memory = self._build("memory")
        self.context.memory = self.memory
        self.compute = self._build("compute")
        self.context.compute = self.compute
        self.network = self._build("network")
        self.context.network = self.network
        self.system = self._build("system")
        if self.network is not None and self.network.npus_count != self.num_ranks:
            raise SimulationError(
                f"the trace has {self.num_ranks} rank(s) but the network has "
                f"{self.network.npus_count} NPUs; they must match")
        self.node_observer: Callable | None = None
        if host.has_observer("chakra_sim_node_finished"):
            self.node_observer = host.pm.hook.chakra_sim_node_finished
        self.drivers: list[RankDriver] = []
        self.finished = 0
        self.wall_s = 0.0

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
        for rank, path in enumerate(spec.trace_files):
            feeder = open_feeder(path, spec.feeder, spec.cache_nodes, spec.missing_parents,
                                 spec.dependencies)
            for warning in getattr(feeder, "warnings", []):
                self.context.warn(warning)
            self.drivers.append(RankDriver(rank, feeder, self, capacities, slots))

    def rank_finished(self, rank: int) -> None:
        self.finished += 1

    def node_progress(self) -> tuple[int, int]:
        """(nodes finished, nodes in the trace) over all ranks, for progress bars."""
        total = sum(d.feeder.num_nodes for d in self.drivers)
        return total - sum(d.remaining for d in self.drivers), total

    def run(self, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Simulate to the end and return the results document."""
        started = time.perf_counter()
        self._open_feeders()
        run_info = self.run_info()
        self.host.pm.hook.chakra_sim_simulation_start(run=run_info)
        try:
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
        except ChakraSimError:
            raise
        except Exception as exc:
            raise self._blame(exc) from exc
        finally:
            self.wall_s = time.perf_counter() - started
        self.system.finish()
        unfinished = {d.rank: d.remaining for d in self.drivers if d.remaining}
        if unfinished:
            waits = {rank: self.drivers[rank].waits() for rank in unfinished}
            raise DeadlockError(self.queue.now, waits, unfinished)
        from chakra_core.report.results import build_results
        results = build_results(self)
        self.host.pm.hook.chakra_sim_simulation_end(run=run_info, results=results)
        for driver in self.drivers:
            driver.feeder.close()
        return results

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
