"""Hardware profiles: GPUs, nodes and scale-out networks, as data with a source for every value.

A profile is a YAML file. Shipped profiles live in `chakra_core/hardware/profiles/`
and are named by their file stem (`h100-sxm-hgx`); a manifest may also name a
file path (a profile `chakra-sim calibrate` wrote). Every number is a
`{value: ..., source: "..."}` pair: shipped profiles cite vendor documents or
NCCL's public source, never a measurement that the accuracy tables judge.

`extends: <profile>` starts from another profile and overrides keys
(a scale-out profile extends its node's), merged key by key; a sourced value the
extending file changes must carry its own source (the parent's would be untrue), and a rate it
keeps although what the rate depends on changed is recorded (`Profile.inherited_rates`,
chakra_core.hardware.inheritance) for the layers that use it to say so.

The core profile is the GPU, the node and the network. Everything else in a profile file (`nccl`,
`calibration`, `gpu.achievable`) is a section a plugin registers (chakra_core.contract.
profile_sections), validated here against its schema and read with `Profile.section`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, Field, PrivateAttr, ValidationError, field_validator, model_validator

from chakra_core.config.files import check_values, load_yaml, yaml_error_text
from chakra_core.contract.profile_sections import ProfileSections
from chakra_core.hardware.values import DTYPES as DTYPES, Sourced as Sourced, _Strict
from chakra_core.errors import InputFileError, ManifestError, PluginError
from chakra_core.input_files import read_input_text
from chakra_core.hardware.inheritance import InheritedRate, Origin, inherited, origins
from chakra_core.plugins import installed_profile_sections
from chakra_core.json_types import JsonObject

M = TypeVar("M", bound=BaseModel)

ARCHITECTURES = ("volta", "ampere", "hopper", "blackwell")
"""GPU generations NCCL's tuning tables distinguish (compute capability 7.x, 8.x, 9.x, 10.x)."""

BUILTIN_DIR = Path(__file__).with_name("profiles")


class GpuSpec(_Strict):
    model: str
    architecture: Literal["volta", "ampere", "hopper", "blackwell"]
    peak_tflops: dict[str, Sourced] = Field(
        ..., description="dense peak per data type (TFLOP/s; TOP/s for int8), without sparsity")
    memory_bandwidth_gbps: Sourced = Field(..., description="HBM bandwidth, GB/s (10^9 B/s)")
    memory_gib: Sourced
    usable_memory_gib: Sourced | None = Field(None, description="memory a program can allocate per GPU, GiB (as "
                                                "CUDA reports it); default memory_gib")
    nvlink_links: Sourced = Field(..., description="NVLink links per GPU")
    nvlink_gbps: Sourced = Field(..., description="NVLink bandwidth per GPU and direction, GB/s")
    power_w: Sourced | None = Field(None, description="the GPU's maximum power, W (vendor's TDP, TGP or per-GPU power)")

    @field_validator("peak_tflops")
    @classmethod
    def _known_dtypes(cls, value: dict[str, Sourced]) -> dict[str, Sourced]:
        unknown = sorted(set(value) - set(DTYPES))
        if unknown:
            raise ValueError(f"unknown data type(s) {unknown}; known: {', '.join(DTYPES)}")
        if not value:
            raise ValueError("needs at least one data type")
        return value

    @model_validator(mode="after")
    def _usable_within_memory(self) -> "GpuSpec":
        usable = self.usable_memory_gib
        if usable is not None and not 0 < usable.value <= self.memory_gib.value:
            raise ValueError(f"usable_memory_gib ({usable.value:g}) must be above 0 and at most memory_gib "
                             f"({self.memory_gib.value:g})")
        return self


class NodeSpec(_Strict):
    gpus: Sourced = Field(..., description="GPUs per node (NVLink domain)")
    gpus_per_host: Sourced | None = Field(
        None, description="GPUs per host (one OS, its CPUs and NICs) when the NVLink domain spans several "
                          "hosts, as an NVL72 rack's 18 compute trays of 4 GPUs; unset: the node is the host")
    nvswitch: bool = Field(..., description="GPUs reach each other through NVSwitches (all-to-all NVLink)")
    nvls: bool = Field(False, description="NVLink SHARP (multicast reductions in the NVSwitch), NCCL's NVLS")
    cpu_vendor: Literal["intel", "amd", "arm"] = Field(
        "intel", description="host CPU vendor: NCCL's per-step network overhead and multi-node LL bandwidth "
                             "depend on it (an Arm host, e.g. Grace, gets NCCL's non-AMD values)")
    cpu_source: str | None = Field(None, description="the public document naming the host CPU")
    kernel_launch_us: Sourced | None = Field(None, description="host (CPU) time to launch one kernel asynchronously, "
                                             "µs: one thread driving several GPUs launches their collectives in turn")
    pcie_gbps: Sourced | None = Field(
        None, description="PCIe bandwidth between one GPU and host memory, GB/s per direction: what a "
                          "host-staged network transfer crosses twice")
    host_link_gbps: Sourced | None = Field(
        None, description="bandwidth of one GPU's copies to and from host memory where the link is not PCIe "
                          "(NVLink-C2C on a Grace superchip), GB/s per direction; unset: pcie_gbps")
    host_adam_ns_per_param: Sourced | None = Field(None, description="one rank's CPU Adam (optimizer offload), ns "
                                                   "per fp32 parameter stepped")
    host_optimizer_call_us: Sourced | None = Field(None, description="host time per CPU optimizer call, µs")


class NetworkSpec(_Strict):
    """The scale-out network between nodes."""

    fabric: str
    nics_per_node: Sourced
    nic_gbits: Sourced = Field(..., description="line rate of one NIC, Gb/s")
    nccl_devices_per_node: Sourced | None = Field(None, description="network devices NCCL sees per node, where its "
                                                  "plugin groups NICs into one (rates add up); default: one per NIC")
    extra_latency_us: Sourced | None = Field(
        None, description="per-hop latency beyond NCCL's InfiniBand figure (e.g. another transport); "
                          "what a network step really costs on top of NCCL's table")
    reported_latency_us: Sourced | None = Field(
        None, description="latency the network plugin reports to NCCL (props->latency): NCCL chooses "
                          "algorithms with it; default extra_latency_us")
    transport: Literal["gpudirect", "host_staged"] = Field(
        "gpudirect", description="gpudirect: NICs read and write GPU memory (GPUDirect RDMA, or GPUDirect-TCPX "
                                 "on GCP); host_staged: each network step is copied through host memory")
    transport_source: str | None = Field(None, description="the public document that says which")
    gdr_flush: bool = Field(
        True, description="Simple-protocol receives flush GPUDirect writes through the NIC (one more "
                          "network latency), as NCCL's tuning assumes; false where the GPU needs none")
    protocols: list[Literal["LL", "LL128", "Simple"]] | None = Field(
        None, description="protocols NCCL may use across nodes (e.g. the network plugin sets "
                          "NCCL_PROTO); default all")
    protocols_source: str | None = None

    @model_validator(mode="after")
    def _protocols_sourced(self) -> "NetworkSpec":
        if self.protocols is not None and not self.protocols_source:
            raise ValueError("protocols needs protocols_source (the public document that says so)")
        return self


class Profile(_Strict):
    name: str
    description: str
    gpu: GpuSpec
    node: NodeSpec
    network: NetworkSpec | None = None
    inherited_rates: list[InheritedRate] = Field(
        default_factory=list, description="rates kept from the parent profile although a value they depend on "
                                          "changed (worked out when the profile loads)")
    _sections: dict[str, BaseModel] = PrivateAttr(default_factory=dict)
    """The plugins' sections, validated, by key path (`section`)."""
    _order: tuple[str, ...] = PrivateAttr(default=())
    """`network` and the top-level sections in the order the file gives them (shown so)."""

    @model_validator(mode="after")
    def _staging_needs_pcie(self) -> "Profile":
        if self.network is not None and self.network.transport == "host_staged" and self.node.pcie_gbps is None:
            raise ValueError("network.transport host_staged copies every network step through host memory: "
                             "give node.pcie_gbps (the GPU's PCIe bandwidth)")
        return self

    def section(self, key: str, schema: type[M]) -> M | None:
        """The section at `key` (e.g. "nccl") as its plugin's `schema` validated it; None if the
        profile has none. TypeError if another schema was registered for the key."""
        value = self._sections.get(key)
        if value is None:
            return None
        if not isinstance(value, schema):
            raise TypeError(f"profile section '{key}' is a {type(value).__name__}, not a {schema.__name__}")
        return value

    def section_keys(self) -> tuple[str, ...]:
        return tuple(self._sections)

    def with_section(self, key: str, value: BaseModel | None) -> "Profile":
        """A copy with the section at `key` replaced (None: removed), e.g. a fitted calibration."""
        copy = self.model_copy()
        copy._sections = {k: v for k, v in self._sections.items() if k != key}
        if value is not None:
            copy._sections[key] = value
        return copy

    def parts(self) -> list[tuple[str, Any]]:
        """(key path, value) of everything the profile holds, as a file would order it: a section
        inside a core part right after that part, the top-level ones where the file put them."""
        tops = [key for key in (*self._order, "network", *self._sections) if "." not in key]
        found: list[tuple[str, Any]] = [("name", self.name), ("description", self.description)]
        for key in ("gpu", "node", *dict.fromkeys(tops)):
            value = getattr(self, key) if key in ("gpu", "node", "network") else self._sections.get(key)
            if value is None:
                continue
            found.append((key, value))
            found.extend((k, v) for k, v in self._sections.items() if k.startswith(key + "."))
        found.append(("inherited_rates", self.inherited_rates))
        return found

    def as_data(self) -> JsonObject:
        """The profile as a flat file holds it (JSON types, unset values left out): what
        `chakra-sim profiles --json` prints and `load_profile` reads back."""
        data: JsonObject = {}
        for key, value in self.parts():
            if isinstance(value, BaseModel):
                value = value.model_dump(mode="json", exclude_none=True)
            elif isinstance(value, list):
                value = [item.model_dump(mode="json", exclude_none=True) for item in value]
            part, _, inner = key.partition(".")
            if inner:   # a section inside gpu, node or network, which parts() gives first
                holder = data[part]
                if not isinstance(holder, dict):
                    raise TypeError(f"profile part '{part}' holds {holder!r}, not a mapping")
                holder[inner] = value
            else:
                data[key] = value
        return data

    def inherited(self, prefix: str) -> list[InheritedRate]:
        """The inherited rates whose key path starts with `prefix` (e.g. "gpu.achievable.")."""
        return [rate for rate in self.inherited_rates if rate.key.startswith(prefix)]

    @property
    def gpus_per_node(self) -> int:
        return int(self.node.gpus.value)

    def peak_flops(self, dtype: str) -> float:
        """Dense peak of `dtype` in FLOP/s; KeyError names the data types the profile has."""
        try:
            return self.gpu.peak_tflops[dtype].value * 1e12
        except KeyError:
            raise KeyError(f"profile '{self.name}' has no {dtype} peak (it has "
                           f"{', '.join(self.gpu.peak_tflops)})") from None


def builtin_profiles() -> list[str]:
    """Names of the profiles shipped with chakra-sim."""
    return sorted(path.stem for path in BUILTIN_DIR.glob("*.yaml"))


def shipped_or_file(value: str) -> str:
    """A layer's `profile` setting, checked when the manifest is read: a shipped profile's name
    or a .yaml file (read later, relative to the manifest); ValueError otherwise."""
    if Path(value).suffix not in (".yaml", ".yml"):
        shipped = builtin_profiles()
        if value not in shipped:
            raise ValueError(f"no shipped profile '{value}'; shipped: {', '.join(shipped)} (or give a .yaml file)")
    return value


SIBLING_SOURCES = {"transport": "transport_source", "protocols": "protocols_source", "cpu_vendor": "cpu_source"}
"""Settings whose source is a sibling key rather than a `source` inside them."""


def _merge(base: JsonObject, override: JsonObject, where: str, problems: list[tuple[str, str]],
           parent: str) -> JsonObject:
    """`override` over `base` key by key. A sourced value the child changes takes the child's source
    and note only: the parent's would cite a document for a number it does not give."""
    if "source" in base and any(value != base.get(key) for key, value in override.items()
                                if key not in ("source", "note")):
        if "source" not in override:
            problems.append((where.rstrip("."), f"changes {parent}'s value: give its own source "
                             "(the parent's cites another number)"))
        return dict(override)
    merged = dict(base)
    for key, value in override.items():
        current = merged.get(key)
        if isinstance(value, dict) and isinstance(current, dict):
            merged[key] = _merge(current, value, f"{where}{key}.", problems, parent)
        else:
            merged[key] = value
        sibling = SIBLING_SOURCES.get(key)
        if sibling and sibling in base and sibling not in override and base.get(key) != value:
            problems.append((f"{where}{key}", f"changes {parent}'s value: give {where}{sibling} too "
                             "(the parent's cites another setting)"))
    return merged


def _path_of(name: str | Path, base_dir: Path) -> Path:
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        return path if path.is_absolute() else base_dir / path
    builtin = BUILTIN_DIR / f"{name}.yaml"
    if not builtin.is_file():
        raise ManifestError([(str(name), "no such profile; shipped profiles: "
                              + ", ".join(builtin_profiles()) + " (or give a .yaml path)")])
    return builtin


@dataclass
class _Resolved:
    """A profile file with its `extends` chain merged, and where each rate that depends on another
    value was stated (chakra_core.hardware.inheritance)."""

    data: JsonObject
    origins: dict[str, Origin]


def _records(data: JsonObject, path: Path) -> list[InheritedRate]:
    """A flat profile's record of the rates it inherited (written by --json or calibrate)."""
    raw = data.pop("inherited_rates", None) or []
    try:
        if not isinstance(raw, list):
            raise ValueError("a list of the rates the profile inherited")
        return [InheritedRate.model_validate(item) for item in raw]
    except (ValueError, ValidationError) as exc:
        raise ManifestError([(f"{path}: inherited_rates", f"not a record of inherited rates: {exc}")]) from None


def _raw(path: Path, seen: tuple[Path, ...], sections: ProfileSections) -> _Resolved:
    if path in seen:
        raise ManifestError([(str(path), "profile 'extends' chain loops: "
                              + " -> ".join(p.name for p in (*seen, path)))])
    try:
        data = load_yaml(read_input_text(path, "profile"), str(path))
        check_values(data, str(path))
    except InputFileError as exc:
        reason = "profile file not found" if exc.reason == "file not found" else exc.reason
        raise ManifestError([(exc.path, reason)]) from None
    except yaml.YAMLError as exc:
        raise ManifestError([(str(path), f"not valid YAML: {yaml_error_text(exc)}")]) from None
    if not isinstance(data, dict):
        raise ManifestError([(str(path), "a profile is a mapping of keys")])
    name = data["name"] if isinstance(data.get("name"), str) else path.stem
    records = _records(data, path)
    parent = data.pop("extends", None)
    if parent is None:
        return _Resolved(data, origins(data, data, name, None, {}, records, sections))
    if not isinstance(parent, str) or not parent:
        raise ManifestError([(f"{path}: extends", "give a shipped profile's name or a .yaml path")])
    # Resolved, so that a loop through '..' or a symlink is seen as one.
    try:
        parent_path = _path_of(parent, path.parent)
    except ManifestError as exc:   # name the file that says `extends`
        raise ManifestError([(f"{path}: extends: {where}", why) for where, why in exc.problems]) from None
    base = _raw(parent_path.resolve(), (*seen, path), sections)
    parent_name = base.data.pop("name", parent_path.stem)   # a profile is named after its own file unless it says
    problems: list[tuple[str, str]] = []
    merged = _merge(base.data, data, "", problems, parent)
    if problems:
        raise ManifestError([(f"{path}: {where}", why) for where, why in problems])
    return _Resolved(merged, origins(merged, data, name, str(parent_name), base.origins, records, sections))


@lru_cache(maxsize=64)
def _load(path: Path, sections: ProfileSections) -> Profile:
    resolved = _raw(path, (), sections)
    data = resolved.data
    data.setdefault("name", path.stem)
    rates = inherited(data, resolved.origins)
    order = tuple(key for key in data if key == "network" or sections.get(key) is not None)
    raw_sections, problems = _take_sections(data, sections, path)
    profile = None
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        problems.extend(_problems(exc, path))
    found: dict[str, BaseModel] = {}
    for key, raw in raw_sections.items():
        section = sections.get(key)
        assert section is not None   # _take_sections took only registered keys
        try:
            found[key] = value = section.schema.model_validate(raw)
            if profile is not None and section.check is not None:
                section.check(value, profile)
        except ValidationError as exc:
            problems.extend(_problems(exc, path, key))
        except ValueError as exc:   # the section contradicts the core profile
            problems.append((f"{path}: {key}", str(exc)))
    if problems or profile is None:
        raise ManifestError(problems)
    profile = profile.model_copy(update={"inherited_rates": rates})
    profile._sections, profile._order = found, order
    return profile


def _problems(exc: ValidationError, path: Path, *head: str) -> list[tuple[str, str]]:
    """Each error at its key path in the file (`head`: the section's key)."""
    return [(f"{path}: {'.'.join(str(p) for p in (*head, *err['loc']))}", err["msg"]) for err in exc.errors()]


CORE_PARTS: tuple[tuple[str, type[BaseModel]], ...] = (("gpu", GpuSpec), ("node", NodeSpec), ("network", NetworkSpec))


def _take_sections(data: JsonObject, sections: ProfileSections,
                   path: Path) -> tuple[JsonObject, list[tuple[str, str]]]:
    """Take the plugins' sections out of a raw profile ({key path: raw value}, in file order), and
    the keys neither the core profile nor a registered section knows, as problems."""
    found: JsonObject = {}
    problems: list[tuple[str, str]] = []
    for section in sections.entries:   # the registry cannot see the core's fields: a section may not take one
        part, _, inner = section.key.partition(".")
        if inner in dict(CORE_PARTS).get(part, Profile).model_fields:
            raise PluginError(f"plugin '{section.owner}' registers profile section '{section.key}', a key of the "
                              "core profile")

    def take(holder: JsonObject, key: str, full: str) -> None:
        value = holder.pop(key)
        if sections.get(full) is not None:
            found[full] = value
        else:
            problems.append((f"{path}: {full}", f"not a key of the core profile, and no installed plugin registers "
                                                f"a '{full}' section; registered sections: {sections.listing()}"))

    for key in [key for key in data if key not in Profile.model_fields]:
        take(data, key, key)
    for part, model in CORE_PARTS:
        raw = data.get(part)
        if isinstance(raw, dict):
            for key in [key for key in raw if key not in model.model_fields]:
                take(raw, key, f"{part}.{key}")
    return found, problems


def load_profile(name: str | Path, base_dir: Path = Path("."), sections: ProfileSections | None = None) -> Profile:
    """A shipped profile by name, or a profile file (relative paths against `base_dir`), its
    plugin sections validated against `sections` (default: those the installed plugins register)."""
    return _load(_path_of(name, base_dir).resolve(), installed_profile_sections() if sections is None else sections)


def profile_problems(name: str | Path, base_dir: Path) -> list[tuple[tuple[str | int, ...], str]]:
    """For a plugin's `config_problems`: why the profile a manifest names cannot be loaded
    (as `(("profile",), reason)`), or nothing."""
    try:
        load_profile(name, base_dir)
    except ManifestError as exc:
        return [(("profile",), "; ".join(f"{where}: {why}" for where, why in exc.problems))]
    return []
