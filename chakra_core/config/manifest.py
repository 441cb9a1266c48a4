"""The YAML manifest: which plugin runs each layer, with which settings.

    workload:
      trace: traces/allreduce        # files traces/allreduce.<rank>.et
    system:  {plugin: native, astra_file: sys.json}
    compute: {plugin: roofline, peak_tflops: 900}
    network: {plugin: analytical, astra_file: net.yml}
    output:  {dir: results}

Each layer section holds `plugin: <name>` and that plugin's own settings,
validated by the plugin's pydantic `Config` (chakra_core.config.build).
`astra_file` loads an ASTRA-sim file into the section (inline keys override
it); a system file also speaks for compute and memory, as in ASTRA-sim (see
chakra_core.config.astra.SystemFileLinks), so the CLI's ASTRA-sim flags and a
manifest loading the same files build the same run. Relative paths resolve
against the manifest's folder.

This module holds the models of the core sections; docs/manifest.md is the
reference, and tests/test_docs.py checks it against them.
"""

from __future__ import annotations

import difflib
import typing
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator

from chakra_core.feeder import DEFAULT_CACHE_NODES

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

    @field_validator("fold", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        return fold_setting(value)


def fold_setting(value: Any) -> Any:
    """`workload.fold` as written: YAML 1.1 reads an unquoted `off` as false."""
    return "off" if value is False else value


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
        None, description="required unless the system plugin times communication itself (needs_network false)")
    output: OutputSection = Field(default_factory=OutputSection)


def format_loc(loc: tuple[str | int, ...]) -> str:
    """('network', 'bandwidth', 1) -> 'network.bandwidth[1]'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def validation_problems(exc: ValidationError, prefix: tuple[str | int, ...], source: str,
                        schema: type[BaseModel] | None = None) -> list[tuple[str, str]]:
    """(location, reason) per error of a pydantic validation, located in `source`; with the
    validated `schema`, an unknown key's reason lists the keys its section accepts."""
    problems = []
    for error in exc.errors():
        loc = tuple(part for part in error["loc"] if not _is_pydantic_tag(part))
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = unknown_key(schema, loc)
        problems.append((f"{source}: {format_loc(tuple(prefix) + loc)}", message))
    return problems


def _is_pydantic_tag(part: str | int) -> bool:
    """pydantic's own steps in an error's location ('function-after[_shape(), ModelSpec]'), not keys."""
    return isinstance(part, str) and ("[" in part or part.startswith("function-"))


def unknown_key(schema: type[BaseModel] | None, loc: tuple[str | int, ...]) -> str:
    """'unknown key', with the accepted keys of its section and the closest one when known."""
    keys = _section_keys(schema, loc[:-1]) if schema is not None else None
    if not keys:
        return "unknown key"
    close = difflib.get_close_matches(str(loc[-1]), keys, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown key{hint}; accepted: {', '.join(keys)}"


def _section_keys(schema: type[BaseModel], path: tuple[str | int, ...]) -> list[str] | None:
    section: type[BaseModel] | None = schema
    for part in path:
        if isinstance(part, int) or section is None:
            continue
        field = section.model_fields.get(part)
        section = _model_in(field.annotation) if field is not None else None
    return sorted(section.model_fields) if section is not None else None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (directly, optionally, or in a list)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
