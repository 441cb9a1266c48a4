"""The YAML manifest: which plugin runs each layer, with which settings.

    workload:
      trace: traces/allreduce        # files traces/allreduce.<rank>.et
    system:  {plugin: native, astra_file: sys.json}
    compute: {plugin: roofline, peak_tflops: 900}
    network: {plugin: analytical, astra_file: net.yml}
    output:  {dir: results}

Each layer section holds `plugin: <name>` and that plugin's own settings,
validated by the plugin's pydantic `Config`. `astra_file` loads an ASTRA-sim
file into the section (inline keys override it); a system file also speaks
for compute and memory, as in ASTRA-sim (see `_SystemFileLinks`), so the
CLI's ASTRA-sim flags and a manifest loading the same files build the same
run. Relative paths resolve
against the manifest's folder. Every problem is reported at once, with the
file, the key path (`network.bandwidth[1]`) and the reason.

docs/manifest.md is the reference; tests/test_docs.py checks it against these models.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError

from chakra_core.astra import (ROOFLINE_KEYS, SYSTEM_FILE_LINKED_KEYS, field_keys, read_comm_groups,
                               read_config_file, split_known)
from chakra_core.engine.simulation import LayerChoice, Resources, RunSpec
from chakra_core.errors import ManifestError, PluginError
from chakra_core.et.jsonize import duplicate_ranks, trace_files
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
    trace: str = Field(..., description="trace prefix: files <trace>.<rank>.et, or <trace>.<rank>.et.gz "
                                        "(gzip; any file may be gzip-compressed whatever its name)")
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
    fold: Literal["auto", "off"] = Field(
        "auto", description="'auto': when ranks are equivalent (the same trace up to rank ids, "
                            "equivalent places in the network), simulate one per class and give the "
                            "others its results (exact; see docs/performance.md); 'off': simulate every rank")


class LayerSection(BaseModel):
    """`plugin` plus the plugin's own keys (validated by the plugin's Config)."""

    model_config = ConfigDict(extra="allow")
    plugin: str = Field(..., description="name of the implementation (see `chakra-sim plugins`)")
    astra_file: str | None = Field(None, description="ASTRA-sim file whose keys fill this section")


class OutputSection(_Strict):
    dir: str = Field("results", description="folder for results.json / results.csv, created if missing; "
                                            "a rerun replaces the files the previous run wrote there "
                                            "and removes those it does not write again")
    formats: list[Literal["json", "csv"]] = Field(["json", "csv"], description="files to write")
    timeline: bool = Field(False, description="also write timeline.json (Perfetto / Chrome trace; "
                                              "open in ui.perfetto.dev)")


class Manifest(_Strict):
    workload: WorkloadSection
    system: LayerSection = Field(default_factory=lambda: LayerSection(plugin="native"))
    compute: LayerSection = Field(default_factory=lambda: LayerSection(plugin="replay"))
    memory: LayerSection | None = None
    network: LayerSection | None = Field(
        None, description="required unless the system plugin times communication itself (nccl)")
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
            try:
                layer_section = LayerSection.model_validate(section)
            except ValidationError:
                continue   # already reported by the Manifest model
            file = _read_astra_file(name, layer_section, base_dir, source, problems)
            if file is not None or not layer_section.astra_file:
                _validate_layer(name, layer_section, host, source, problems, warnings, file,
                                consumed=SYSTEM_FILE_LINKED_KEYS, base_dir=base_dir)
        raise ManifestError(_distinct(problems))

    sections: dict[str, LayerSection | None] = {layer: getattr(manifest, layer) for layer in LAYER_DEFAULTS}
    files = {layer: _read_astra_file(layer, section, base_dir, source, problems)
             for layer, section in sections.items() if section is not None and section.astra_file}
    links = _SystemFileLinks(files.get("system"), "compute" in manifest.model_fields_set,
                             sections, host, problems, warnings)
    if links.compute_section is not None:
        sections["compute"] = links.compute_section

    choices: dict[str, LayerChoice] = {}
    echo: dict[str, Any] = {}
    for layer, section in sections.items():
        if section is None or (section.astra_file and files[layer] is None):
            continue   # absent, or its ASTRA-sim file is unreadable (already reported)
        result = _validate_layer(layer, section, host, source, problems, warnings, files.get(layer),
                                 derived=links.derived.get(layer),
                                 consumed=links.consumed if layer == "system" else frozenset(),
                                 base_dir=base_dir)
        if result is not None:
            choices[layer] = result
            echo[layer] = {"plugin": result.impl.name, **result.config.model_dump(mode="json")}
    system = choices.get("system")
    if sections["network"] is None and system is not None and system.impl.cls.needs_network:
        problems.append((f"{source}: network", f"required: system plugin '{system.impl.name}' sends its "
                         "traffic through a network layer (plugin: analytical, congestion, ...)"))

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
        raise ManifestError(_distinct(problems))

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
        dependencies=workload.dependencies, fold=workload.fold,
        resources=Resources(resources.cpu, resources.gpu, resources.comm, resources.memory),
        comm_groups=comm_groups, base_dir=base_dir, manifest=echo, warnings=warnings)
    return LoadedManifest(spec, output_dir, list(manifest.output.formats), source, manifest.output.timeline)


def _distinct(problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
    # A bad local-mem-bw is reported once, not once per layer that reads it.
    return list(dict.fromkeys(problems))


def _resolve(base_dir: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base_dir / path)


def _read_astra_file(layer: str, section: LayerSection, base_dir: Path, source: str,
                     problems: list) -> tuple[str, dict[str, Any]] | None:
    """(file name, contents) of a section's `astra_file`; None when there is none or it is unreadable
    (a problem is recorded)."""
    if not section.astra_file:
        return None
    file_path = _resolve(base_dir, section.astra_file)
    try:
        return str(file_path), read_config_file(file_path)
    except ManifestError as exc:
        problems.extend((f"{source}: {layer}.astra_file: {loc}", why) for loc, why in exc.problems)
        return None


@dataclass
class _Derived:
    """Settings a layer takes from the system layer's ASTRA-sim file."""

    settings: dict[str, Any]
    where: dict[str, str]
    """setting -> "file: key" it was read from."""
    section_at: str | None = None
    """Where the section itself comes from, when the manifest has none (the compute section
    that `roofline-enabled` selects)."""


class _SystemFileLinks:
    """What an ASTRA-sim system file says about the other layers, as ASTRA-sim reads it.

    Besides the system layer's own settings, the file selects the compute model
    (`roofline-enabled`, `peak-perf`) and gives the local memory bandwidth
    (`local-mem-bw`, also read by the native system layer). Without a `compute:`
    section, `roofline-enabled: 1` selects `compute: {plugin: roofline}` with
    `peak_tflops` = `peak-perf` and `memory_bandwidth_gbps` = `local-mem-bw`;
    a memory plugin with a `bandwidth_gbps` setting (hbm) gets `local-mem-bw`
    unless its section sets it. Keys no layer uses are warnings.
    """

    def __init__(self, file: tuple[str, dict[str, Any]] | None, compute_given: bool,
                 sections: dict[str, LayerSection | None], host: PluginHost, problems: list,
                 warnings: list):
        self.compute_section: LayerSection | None = None
        self.derived: dict[str, _Derived] = {}
        self.consumed: frozenset[str] = frozenset()
        if file is None:
            return
        name, data = file
        consumed = set()
        roofline = [key for key in ROOFLINE_KEYS if key in data]
        enabled = data.get("roofline-enabled", 0)
        if compute_given:
            if roofline:
                warnings.append(f"{name}: {_keys(roofline)} not used: the manifest's compute section "
                                f"selects plugin '{sections['compute'].plugin}'")
        elif enabled not in (0, 1):   # bool is an int: true/false pass too
            problems.append((f"{name}: roofline-enabled", "must be 0 or 1"))
        elif enabled:
            self._roofline(name, data, problems)
        elif "peak-perf" in data:
            off = f"is {enabled}" if "roofline-enabled" in data else "is not set"
            warnings.append(f"{name}: key 'peak-perf' not used: roofline-enabled {off}, so compute "
                            "nodes replay their traced durations")
        consumed.update(roofline)
        if "local-mem-bw" in data:
            if "compute" in self.derived:
                consumed.add("local-mem-bw")
            memory = sections.get("memory")
            if memory is not None and self._memory_takes_bandwidth(memory, host):
                self.derived["memory"] = _Derived({"bandwidth_gbps": data["local-mem-bw"]},
                                                  {"bandwidth_gbps": f"{name}: local-mem-bw"})
                consumed.add("local-mem-bw")
        self.consumed = frozenset(consumed)

    def _roofline(self, name: str, data: dict[str, Any], problems: list) -> None:
        if "peak-perf" not in data:
            problems.append((f"{name}: peak-perf", "required with roofline-enabled: 1 "
                                                   "(TFLOP/s of the roofline compute model)"))
            return
        settings = {"peak_tflops": data["peak-perf"]}
        where = {"peak_tflops": f"{name}: peak-perf"}
        if "local-mem-bw" in data:
            settings["memory_bandwidth_gbps"] = data["local-mem-bw"]
            where["memory_bandwidth_gbps"] = f"{name}: local-mem-bw"
        self.compute_section = LayerSection(plugin="roofline")
        self.derived["compute"] = _Derived(settings, where, f"{name}: roofline-enabled")

    @staticmethod
    def _memory_takes_bandwidth(section: LayerSection, host: PluginHost) -> bool:
        try:
            impl = host.get("memory", section.plugin)
        except PluginError:
            return False   # reported when the memory section is validated
        return "bandwidth_gbps" in field_keys(impl.cls.Config)


def _keys(keys: list[str]) -> str:
    return ("key " if len(keys) == 1 else "keys ") + ", ".join(f"'{k}'" for k in keys)


def _validate_layer(layer: str, section: LayerSection, host: PluginHost, source: str,
                    problems: list, warnings: list, file: tuple[str, dict[str, Any]] | None,
                    derived: _Derived | None = None,
                    consumed: frozenset[str] = frozenset(), base_dir: Path = Path(".")) -> LayerChoice | None:
    """Validate one layer section with its plugin's Config; errors point at the key's origin.

    Settings come from, lowest precedence first: `derived` (the system file's keys for other
    layers), the section's `astra_file`, the keys written in the section.
    """
    section_at = derived.section_at if derived is not None else None
    try:
        impl = host.get(layer, section.plugin)
    except PluginError as exc:
        problems.append((section_at or f"{source}: {layer}.plugin", str(exc)))
        return None
    config_cls = impl.cls.Config
    inline = dict(section.model_extra or {})
    file_name, file_settings = None, {}
    if file is not None:
        file_name = file[0]
        file_settings, file_warnings = split_known(file[1], config_cls, file_name, layer, impl.name,
                                                   consumed)
        warnings.extend(file_warnings)
    settings = dict(derived.settings) if derived is not None else {}
    for key, value in settings.items():
        chosen = inline.get(key, file_settings.get(key, value))
        if chosen != value:
            set_in = f"{source}: {layer}.{key}" if key in inline else f"{file_name}: {key}"
            warnings.append(f"{derived.where[key]} ({value}) not used for {layer}.{key}: "
                            f"{set_in} sets it to {chosen}")
    settings.update(file_settings)
    settings.update(inline)

    def origin(loc: tuple) -> str:
        """Where the setting at `loc` was written: the manifest, or an ASTRA-sim file."""
        key = loc[0] if loc else None
        if key in inline:
            return f"{source}: {format_loc((layer,) + tuple(loc))}"
        if derived is not None and key in derived.where and key not in file_settings:
            return derived.where[key] + (f": {format_loc(loc[1:])}" if loc[1:] else "")
        if file_name is not None:
            return f"{file_name}: {format_loc(loc) if loc else f'(whole file, loaded by {layer}.astra_file)'}"
        if section_at is not None:
            return f"{section_at} (selects {layer} plugin '{impl.name}'): {format_loc(loc)}"
        return f"{source}: {format_loc((layer,) + tuple(loc))}"

    try:
        config = config_cls.model_validate(settings)
    except ValidationError as exc:
        problems.extend((origin(error["loc"]),
                         "unknown key" if error["type"] == "extra_forbidden" else error["msg"])
                        for error in exc.errors())
        return None
    extra_problems = impl.cls.config_problems(config, {"algorithms": host.algorithms(), "base_dir": base_dir})
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
                         f"no trace files {prefix}.<rank>.et (or .et.gz) found"))
        return []
    for rank, paths in duplicate_ranks(found).items():
        problems.append((f"{source}: workload.trace", f"rank {rank} has two trace files "
                         f"({', '.join(map(str, paths))}); keep one"))
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
