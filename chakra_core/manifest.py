"""The YAML manifest: which plugin runs each layer, with which settings.

    workload:
      trace: traces/allreduce        # files traces/allreduce.<rank>.et
    system:  {plugin: native, astra_file: sys.json}
    compute: {plugin: roofline, peak_tflops: 900}
    network: {plugin: analytical, astra_file: net.yml}
    output:  {dir: results}

Each layer section holds `plugin: <name>` and that plugin's own settings,
validated by the plugin's pydantic `Config`. `astra_file` loads an ASTRA-sim
file into the section (inline keys override it). Relative paths resolve
against the manifest's folder. Every problem is reported at once, with the
file, the key path (`network.bandwidth[1]`) and the reason.

docs/manifest.md is the reference; tests/test_docs.py checks it against these models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError

from chakra_core.astra import COMPUTE_KEYS, read_comm_groups, read_config_file, split_known
from chakra_core.engine.simulation import LayerChoice, Resources, RunSpec
from chakra_core.errors import ManifestError, PluginError
from chakra_core.et.jsonize import trace_files
from chakra_core.feeder import DEFAULT_CACHE_NODES
from chakra_core.plugins import PluginHost

LAYER_DEFAULTS = {"system": "native", "compute": "replay", "memory": None, "network": None}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResourcesSection(_Strict):
    """Operations a rank may have in flight at once (null = unlimited). Defaults are ASTRA-sim's."""

    cpu: PositiveInt | None = Field(1, description="CPU compute nodes (is_cpu_op) in flight")
    gpu: PositiveInt | None = Field(1, description="GPU compute nodes in flight")
    comm: PositiveInt | None = Field(1, description="collectives and sends in flight")
    memory: Union[Literal["comm"], PositiveInt, None] = Field(
        "comm", description="memory loads/stores in flight; 'comm' shares the comm slot (ASTRA-sim)")


class WorkloadSection(_Strict):
    trace: str = Field(..., description="trace prefix: files <trace>.<rank>.et (plain or gzip)")
    ranks: PositiveInt | None = Field(None, description="number of ranks; default: count the files")
    feeder: Literal["streaming", "memory"] = Field(
        "streaming", description="'streaming' keeps only a compact index and a node cache in memory "
                                 "(memory bounded by the cache, not the trace); 'memory' parses every node up front")
    cache_nodes: PositiveInt = Field(DEFAULT_CACHE_NODES, description="streaming feeder's node cache")
    dependencies: Literal["all", "data"] = Field(
        "all", description="'data' ignores control dependencies, as Chakra's C++ feeder does")
    missing_parents: Literal["ignore-control", "error"] = Field(
        "ignore-control", description="dependencies on node ids absent from the trace: drop "
                                      "missing control parents with a warning, or reject the trace")
    comm_groups: Union[str, dict[str, list[int]], None] = Field(
        None, description="communicator groups: an ASTRA-sim comm-group JSON file, or {name: [ranks]}")
    resources: ResourcesSection = Field(default_factory=ResourcesSection)


class LayerSection(BaseModel):
    """`plugin` plus the plugin's own keys (validated by the plugin's Config)."""

    model_config = ConfigDict(extra="allow")
    plugin: str = Field(..., description="name of the implementation (see `chakra-sim plugins`)")
    astra_file: str | None = Field(None, description="ASTRA-sim file whose keys fill this section")


class OutputSection(_Strict):
    dir: str = Field("results", description="folder for results.json / results.csv")
    formats: list[Literal["json", "csv"]] = Field(["json", "csv"], description="files to write")
    timeline: bool = Field(False, description="also write timeline.json (Perfetto / Chrome trace; "
                                              "open in ui.perfetto.dev)")


class Manifest(_Strict):
    workload: WorkloadSection
    system: LayerSection = Field(default_factory=lambda: LayerSection(plugin="native"))
    compute: LayerSection = Field(default_factory=lambda: LayerSection(plugin="replay"))
    memory: LayerSection | None = None
    network: LayerSection
    output: OutputSection = Field(default_factory=OutputSection)


def format_loc(loc: tuple) -> str:
    """('network', 'bandwidth', 1) -> 'network.bandwidth[1]'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def validation_problems(exc: ValidationError, prefix: tuple, source: str) -> list[tuple[str, str]]:
    problems = []
    for error in exc.errors():
        loc = tuple(prefix) + tuple(p for p in error["loc"] if p not in ("function-after",))
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        problems.append((f"{source}: {format_loc(loc)}", message))
    return problems


class LoadedManifest:
    """A validated manifest: the RunSpec for the engine and the output settings."""

    def __init__(self, spec: RunSpec, output_dir: Path, formats: list[str], source: str,
                 timeline: bool = False):
        self.spec, self.output_dir, self.formats, self.source = spec, output_dir, formats, source
        self.timeline = timeline


def load_manifest(path: str | Path, host: PluginHost, out_dir: str | None = None) -> LoadedManifest:
    """Read and validate a manifest file; raise ManifestError listing every problem."""
    path = Path(path)
    data = read_config_file(path)
    return build_manifest(data, host, base_dir=path.resolve().parent, source=str(path),
                          out_dir=out_dir)


def build_manifest(data: dict[str, Any], host: PluginHost, base_dir: Path, source: str,
                   out_dir: str | None = None) -> LoadedManifest:
    """Validate a manifest mapping (from a file or built by the CLI from ASTRA-sim flags)."""
    problems: list[tuple[str, str]] = []
    warnings: list[str] = []
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        problems.extend(validation_problems(exc, (), source))
        manifest = None
    if manifest is None:
        # Report layer problems too, where the sections themselves are well formed.
        layers = {name: data.get(name) for name in LAYER_DEFAULTS if isinstance(data.get(name), dict)}
        for name, section in layers.items():
            if "plugin" in section:
                _validate_layer(name, LayerSection.model_validate(section), host, base_dir, source,
                                problems, warnings)
        raise ManifestError(problems)

    choices: dict[str, LayerChoice] = {}
    echo: dict[str, Any] = {}
    for layer in ("system", "compute", "memory", "network"):
        section = getattr(manifest, layer)
        if section is None:
            continue
        result = _validate_layer(layer, section, host, base_dir, source, problems, warnings)
        if result is not None:
            choices[layer] = result
            echo[layer] = {"plugin": result.impl.name, **result.config.model_dump(mode="json")}

    workload = manifest.workload
    trace_paths = _resolve_traces(workload, base_dir, source, problems)
    comm_groups: dict[str, list[int]] = {}
    if isinstance(workload.comm_groups, str):
        try:
            comm_groups = read_comm_groups(_resolve(base_dir, workload.comm_groups))
        except ManifestError as exc:
            problems.extend(exc.problems)
    elif isinstance(workload.comm_groups, dict):
        comm_groups = {str(k): v for k, v in workload.comm_groups.items()}

    if problems:
        raise ManifestError(problems)

    output_dir = Path(out_dir) if out_dir else _resolve(base_dir, manifest.output.dir)
    echo = {
        "workload": {**workload.model_dump(mode="json"),
                     "trace": str(_resolve(base_dir, workload.trace)), "ranks": len(trace_paths),
                     "comm_groups": comm_groups},
        **echo,
        "output": {"dir": str(output_dir), "formats": manifest.output.formats,
                   "timeline": manifest.output.timeline},
    }
    resources = workload.resources
    spec = RunSpec(
        trace_files=trace_paths, layers=choices, feeder=workload.feeder,
        cache_nodes=workload.cache_nodes, missing_parents=workload.missing_parents,
        dependencies=workload.dependencies,
        resources=Resources(resources.cpu, resources.gpu, resources.comm, resources.memory),
        comm_groups=comm_groups, base_dir=base_dir, manifest=echo, warnings=warnings)
    return LoadedManifest(spec, output_dir, list(manifest.output.formats), source, manifest.output.timeline)


def _resolve(base_dir: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base_dir / path)


def _validate_layer(layer: str, section: LayerSection, host: PluginHost, base_dir: Path, source: str,
                    problems: list, warnings: list) -> LayerChoice | None:
    """Validate one layer section with its plugin's Config; errors point at the key's origin."""
    try:
        impl = host.get(layer, section.plugin)
    except PluginError as exc:
        problems.append((f"{source}: {layer}.plugin", str(exc)))
        return None
    config_cls = impl.cls.Config
    inline = dict(section.model_extra or {})
    settings: dict[str, Any] = {}
    file_name = None
    if section.astra_file:
        file_path = _resolve(base_dir, section.astra_file)
        file_name = str(file_path)
        try:
            file_data = read_config_file(file_path)
        except ManifestError as exc:
            problems.extend((f"{source}: {layer}.astra_file: {loc}", why) for loc, why in exc.problems)
            return None
        consumed = COMPUTE_KEYS if layer == "system" else frozenset()
        settings, file_warnings = split_known(file_data, config_cls, file_name, layer, impl.name,
                                              consumed)
        warnings.extend(file_warnings)
    settings.update(inline)

    def origin(loc: tuple) -> str:
        """Where the setting at `loc` was written: the ASTRA-sim file, or the manifest."""
        if file_name is not None and (loc[0] not in inline if loc else not inline):
            return f"{file_name}: {format_loc(loc) if loc else f'(whole file, loaded by {layer}.astra_file)'}"
        return f"{source}: {format_loc((layer,) + tuple(loc))}"

    try:
        config = config_cls.model_validate(settings)
    except ValidationError as exc:
        problems.extend((origin(error["loc"]),
                         "unknown key" if error["type"] == "extra_forbidden" else error["msg"])
                        for error in exc.errors())
        return None
    extra_problems = impl.cls.config_problems(config, {"algorithms": host.algorithms()})
    problems.extend((origin(loc), message) for loc, message in extra_problems)
    if extra_problems:
        return None
    return LayerChoice(impl, config)


def _resolve_traces(workload: WorkloadSection, base_dir: Path, source: str,
                    problems: list) -> list[Path]:
    prefix = _resolve(base_dir, workload.trace)
    found = trace_files(prefix)
    if not found:
        problems.append((f"{source}: workload.trace",
                         f"no trace files {prefix}.<rank>.et found"))
        return []
    ranks = [rank for rank, _ in found]
    expected = workload.ranks or (ranks[-1] + 1)
    missing = sorted(set(range(expected)) - set(ranks))
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        problems.append((f"{source}: workload.trace",
                         f"missing trace file(s) for rank(s) {shown} ({prefix}.<rank>.et)"))
    extra = [r for r in ranks if r >= expected]
    if workload.ranks and extra:
        problems.append((f"{source}: workload.ranks",
                         f"is {workload.ranks} but trace files exist for rank(s) up to {ranks[-1]}"))
    return [path for rank, path in found if rank < expected]
