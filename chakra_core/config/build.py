"""A manifest mapping -> a validated `RunConfig`, every problem reported at once.

Each layer section is validated by the selected plugin's own Config, its
settings taken (lowest precedence first) from what the system file says for
that layer (chakra_core.config.astra.SystemFileLinks), the section's
`astra_file`, and the keys written in the section; errors point at the key's
origin. The traces and communicator groups are resolved, relative paths
against the manifest's folder. Every problem is reported at once, with the
file, the key path (`network.bandwidth[1]`) and the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pydantic import ValidationError

from chakra_core.config.astra import (SYSTEM_FILE_LINKED_KEYS, Derived, SystemFileLinks, read_comm_groups,
                                      split_known)
from chakra_core.config.files import read_config_file
from chakra_core.config.manifest import (LAYER_DEFAULTS, LayerSection, Manifest, WorkloadSection, format_loc,
                                         validation_problems)
from chakra_core.config.spec import LayerChoice, Resources, RunConfig, RunSpec
from chakra_core.plugins import PluginHost
from chakra_core.contract.inputs import ValidationInputs
from chakra_core.contract.layers import SystemLayer
from chakra_core.errors import ManifestError, PluginError
from chakra_core.et.jsonize import duplicate_ranks, trace_files
from chakra_core.json_types import JsonObject


def load_manifest(path: str | Path, host: PluginHost, out_dir: str | Path | None = None) -> RunConfig:
    """Read and validate a manifest file; raise ManifestError listing every problem. (A job
    manifest, `job:`, generates its traces first: `chakra_core.run.load` reads both kinds.)"""
    path = Path(path)
    data = read_config_file(path)
    return build_config(data, host, base_dir=path.resolve().parent, source=str(path), out_dir=out_dir)


def build_config(data: Mapping[str, Any], host: PluginHost, base_dir: Path, source: str,
                 out_dir: str | Path | None = None, traces: list[Path] | None = None) -> RunConfig:
    """Validate a manifest mapping (from a file or built by the CLI from ASTRA-sim flags);
    `traces` replaces workload.trace's files (a generated job's: chakra_core.jobs.expand)."""
    problems: list[tuple[str, str]] = []
    warnings: list[str] = []
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        problems.extend(validation_problems(exc, (), source, Manifest))
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
    links = SystemFileLinks(files.get("system"), "compute" in manifest.model_fields_set,
                            {layer: s.plugin if s is not None else None for layer, s in sections.items()},
                            host, problems, warnings)
    if links.compute_plugin is not None:
        sections["compute"] = LayerSection(plugin=links.compute_plugin)

    choices: dict[str, LayerChoice] = {}
    echo: JsonObject = {}
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
    if (sections["network"] is None and system is not None and issubclass(system.impl.cls, SystemLayer)
            and system.impl.cls.needs_network):
        installed = ", ".join(impl.name for impl in host.implementations("network")) or "none"
        problems.append((f"{source}: network", f"required: system plugin '{system.impl.name}' sends its "
                         f"traffic through a network layer (installed network plugins: {installed})"))

    workload = manifest.workload
    trace_paths = traces if traces is not None else _resolve_traces(workload, base_dir, source, problems)
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
    return RunConfig(spec, output_dir, list(manifest.output.formats), source, manifest.output.timeline)


def _distinct(problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
    # A bad local-mem-bw is reported once, not once per layer that reads it.
    return list(dict.fromkeys(problems))


def _resolve(base_dir: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base_dir / path)


Problems = list[tuple[str, str]]
"""(location, reason) pairs, as ManifestError lists them."""


def _read_astra_file(layer: str, section: LayerSection, base_dir: Path, source: str,
                     problems: Problems) -> tuple[str, JsonObject] | None:
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


def _validate_layer(layer: str, section: LayerSection, host: PluginHost, source: str,
                    problems: Problems, warnings: list[str], file: tuple[str, JsonObject] | None,
                    derived: Derived | None = None,
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
    file_name: str | None = None
    file_settings: JsonObject = {}
    if file is not None:
        file_name = file[0]
        file_settings, file_warnings = split_known(file[1], config_cls, file_name, layer, impl.name,
                                                   consumed)
        warnings.extend(file_warnings)
    settings = dict(derived.settings) if derived is not None else {}
    for key, value in settings.items():
        chosen = inline.get(key, file_settings.get(key, value))
        if chosen != value and derived is not None:
            set_in = f"{source}: {layer}.{key}" if key in inline else f"{file_name}: {key}"
            warnings.append(f"{derived.where[key]} ({value}) not used for {layer}.{key}: "
                            f"{set_in} sets it to {chosen}")
    settings.update(file_settings)
    settings.update(inline)

    def origin(loc: tuple[str | int, ...]) -> str:
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
    extra_problems = impl.cls.config_problems(config, ValidationInputs(base_dir, host.algorithms()))
    problems.extend((origin(loc), message) for loc, message in extra_problems)
    if extra_problems:
        return None
    return LayerChoice(impl, config)


def _resolve_traces(workload: WorkloadSection, base_dir: Path, source: str,
                    problems: Problems) -> list[Path]:
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
