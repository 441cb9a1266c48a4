"""The one path from a manifest (or ASTRA-sim files) to a finished run.

Every caller goes through here: the `run`, `validate` and `timeline` commands,
sweep workers, and the tests and benchmarks.

    from chakra_core import run

    config = run.load("examples/allreduce_8npu.yaml")        # or a mapping, or run.load_astra(...)
    result = run.simulate(config)                             # RunResult
    print(result.results.finish_ns)                           # typed; result.document: results.json

In steps, as `chakra-sim run` does: `prepare` builds the layers (a plugin that
refuses its settings stops here, before anything is written; `build_layers`
builds them alone, for plan's compute bound), then
`PreparedRun.simulate` runs the event loop, builds the results document and
calls the observers. `validate` finds what a run would reject without
simulating.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Mapping

from chakra_core.config.astra import astra_manifest
from chakra_core.config.build import build_config
from chakra_core.config.files import read_config_file
from chakra_core.config.checks import check_traces
from chakra_core.config.spec import RunConfig
from chakra_core.contract.layers import LayerModel, SystemLayer
from chakra_core.plugins import PluginHost, make_plugin_host
from chakra_core.engine.driver import Interval
from chakra_core.engine.collector import lenient_gc
from chakra_core.engine.simulation import Simulation
from chakra_core.errors import ChakraSimError
from chakra_core.hardware.devices import device_mismatch
from chakra_core.hardware.profiles import load_profile
from chakra_core.jobs.expand import is_job, job_config
from chakra_core.jobs.rank_writer import GenerationProgress
from chakra_core.jobs.report import training_section
from chakra_core.json_types import JsonObject
from chakra_core.report.document import Results
from chakra_core.report.results import build_results
from chakra_core.report.writers import output_dir_problem, result_files

ManifestData = Mapping[str, Any]
"""A manifest as a mapping (what a YAML manifest file reads as)."""


def load(source: str | Path | ManifestData, host: PluginHost | None = None, *,
         base_dir: str | Path | None = None, name: str | None = None,
         out_dir: str | Path | None = None, progress: GenerationProgress | None = None,
         workers: int = 1) -> RunConfig:
    """Read and validate a manifest: a YAML file, or a mapping (relative paths resolve against
    `base_dir`, default the current folder; `name` names it in messages). `out_dir` overrides
    `output.dir`; `progress(ranks written, ranks)` hears a training job's trace generation, which
    runs in up to `workers` processes (chakra_core.jobs.rank_writer).
    Raises ManifestError listing every problem, PluginError for an unknown plugin."""
    host = host if host is not None else make_plugin_host()
    if isinstance(source, Mapping):
        folder = Path(base_dir) if base_dir is not None else Path.cwd()
        if is_job(source):   # a training job: its traces are generated first
            return job_config(source, host, folder, name or "manifest", out_dir, progress, workers)
        return build_config(source, host, base_dir=folder, source=name or "manifest", out_dir=out_dir)
    path = Path(source)
    data = read_config_file(path)
    if is_job(data):
        return job_config(data, host, path.resolve().parent, str(path), out_dir, progress, workers)
    return build_config(data, host, base_dir=path.resolve().parent, source=str(path), out_dir=out_dir)


def load_astra(workload: str, system: str, network: str, memory: str | None = None,
               comm_group: str | None = None, network_plugin: str | None = None,
               host: PluginHost | None = None, out_dir: str | Path | None = None) -> RunConfig:
    """A run of ASTRA-sim's own inputs, as `chakra-sim run --workload --astra-*` reads them."""
    host = host if host is not None else make_plugin_host()
    data = astra_manifest(host, workload, system, network, memory, comm_group, network_plugin)
    if out_dir:
        data["output"] = {"dir": str(out_dir)}
    return build_config(data, host, base_dir=Path.cwd(), source="command line")


@dataclass
class RunResult:
    """A finished run: its results and what else it recorded."""

    results: Results
    intervals: list[Interval] | None
    """Every finished node, when the run recorded a timeline."""
    wall_s: float
    restarts: list[str] = field(default_factory=list)

    @cached_property
    def document(self) -> JsonObject:
        """The results as results.json holds them."""
        return self.results.to_json()

    def files(self, formats: list[str], plots: bool = False) -> dict[str, str | bytes]:
        """The files `chakra-sim run` writes: file name -> contents (see report.writers)."""
        return result_files(self.results, formats, self.intervals, plots=plots)


class PreparedRun:
    """A run whose layers are built (they accepted their settings), ready to simulate."""

    def __init__(self, config: RunConfig, host: PluginHost, timeline: bool | None = None):
        self.config, self.host = config, host
        record = config.timeline if timeline is None else timeline
        _warn_replayed_device(config)
        self.simulation = Simulation(config.spec, host, record_intervals=record)

    def node_progress(self) -> tuple[int, int]:
        """(nodes finished, nodes in the trace), for progress bars."""
        return self.simulation.node_progress()

    def simulate(self, progress: Callable[[int], None] | None = None) -> RunResult:
        """Run to the end; the results document with every layer's statistics and the observers'
        additions. Raises what a run raises (SimulationError, DeadlockError, PluginError)."""
        sim = self.simulation
        with lenient_gc():     # one pause from opening the traces to the results document
            finished = sim.run(progress)
            with sim.blaming():   # layers' summary(), rank_summary() and terminal_tables() run here
                results = build_results(finished)
            if finished.spec.training is not None:
                results = replace(results, training=training_section(finished))
            plugins = sim.observe_end(results.to_json())
            if plugins is not None:
                results = replace(results, plugins=plugins)
        return RunResult(results, finished.intervals, finished.wall_s, finished.restarts)


def _warn_replayed_device(config: RunConfig) -> None:
    """Replayed durations keep the device they were traced (or estimated) for: say so when the
    run's hardware profile (a layer's `profile` setting) names another GPU than the trace."""
    spec = config.spec
    compute = spec.layers.get("compute")
    if compute is None or compute.impl.name != "replay" or not spec.trace_files:
        return
    for choice in spec.layers.values():
        name = getattr(choice.config, "profile", None)
        if isinstance(name, str):
            try:
                profile = load_profile(name, spec.base_dir)
            except ChakraSimError:
                continue   # the layer reports its own profile problems
            message = device_mismatch(spec.trace_files[0], profile)
            if message is not None:
                message += ("; a compute layer with a model (chakra-sim plugins --layer compute) times "
                            "kernels for the profile's GPU")
                if message not in spec.warnings:   # a config prepared twice warns once
                    spec.warnings.append(message)
            return


def prepare(config: RunConfig, host: PluginHost | None = None, timeline: bool | None = None) -> PreparedRun:
    """Build the layers of a run (`timeline`: record every node; default: as the config says)."""
    return PreparedRun(config, host if host is not None else make_plugin_host(), timeline)


def build_layers(config: RunConfig, host: PluginHost | None = None, ranks: int | None = None) -> dict[str, LayerModel]:
    """The layers of a run by name, built as `prepare` builds them (same order, context and
    errors), for a caller that times operations with them instead of simulating a trace (plan's
    compute bound); `ranks`: how many ranks they serve when `config` lists no traces."""
    host = host if host is not None else make_plugin_host()
    return Simulation(config.spec, host, ranks=ranks).layers


def simulate(config: RunConfig | str | Path | ManifestData, host: PluginHost | None = None, *,
             timeline: bool | None = None, progress: Callable[[int], None] | None = None) -> RunResult:
    """Load (when given a manifest), prepare and simulate a run."""
    host = host if host is not None else make_plugin_host()
    if not isinstance(config, RunConfig):
        config = load(config, host)
    return prepare(config, host, timeline).simulate(progress)


@dataclass
class Validation:
    """What `validate` found: problems (a run would stop) and warnings."""

    problems: list[str]
    warnings: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def validate(config: RunConfig, host: PluginHost | None = None) -> Validation:
    """What a run of `config` would reject, found without simulating: the layers are built as for
    a run, the traces read through (config.checks), the output folder checked. Its warnings are
    those a run would give before simulating, the layers' included."""
    host = host if host is not None else make_plugin_host()
    spec = config.spec
    problems: list[str] = []
    warnings: list[str] = list(spec.warnings)
    try:
        built = Simulation(spec, host)
    except ChakraSimError as exc:
        problems.append(f"{config.source}: {exc}")
    else:   # what the layers warn of when they are built (e.g. rates a profile inherited), a run would too
        warnings.extend(w for w in built.context.warnings if w not in warnings)
    system = spec.layers.get("system")
    system_cls = system.impl.cls if system is not None and issubclass(system.impl.cls, SystemLayer) else None
    check_traces(spec, system_cls, config.source, problems, warnings)
    problem = output_dir_problem(config.output_dir)
    if problem:
        problems.append(problem)
    return Validation(problems, warnings)
