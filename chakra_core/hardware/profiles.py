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
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from chakra_core.config.files import check_values, load_yaml, yaml_error_text
from chakra_core.hardware.achievable import AchievableSpec as AchievableSpec, AttentionCurve as AttentionCurve
from chakra_core.hardware.values import DTYPES as DTYPES, Sourced as Sourced, _Strict
from chakra_core.errors import InputFileError, ManifestError
from chakra_core.input_files import read_input_text
from chakra_core.hardware.inheritance import InheritedRate, Origin, inherited, origins

ARCHITECTURES = ("volta", "ampere", "hopper")
"""GPU generations NCCL's tuning tables distinguish (compute capability 7.x, 8.x, 9.x)."""

BUILTIN_DIR = Path(__file__).with_name("profiles")


class GpuSpec(_Strict):
    model: str
    architecture: Literal["volta", "ampere", "hopper"]
    peak_tflops: dict[str, Sourced] = Field(
        ..., description="dense peak per data type (TFLOP/s; TOP/s for int8), without sparsity")
    memory_bandwidth_gbps: Sourced = Field(..., description="HBM bandwidth, GB/s (10^9 B/s)")
    memory_gib: Sourced
    usable_memory_gib: Sourced | None = Field(
        None, description="memory a program can allocate per GPU, GiB: the device's total as CUDA reports it "
                          "(the memory less what the driver reserves); default memory_gib")
    nvlink_links: Sourced = Field(..., description="NVLink links per GPU")
    nvlink_gbps: Sourced = Field(..., description="NVLink bandwidth per GPU and direction, GB/s")
    achievable: AchievableSpec | None = Field(
        None, description="achievable (not peak) rates, for the `achievable` compute model")

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

    @model_validator(mode="after")
    def _achievable_below_peak(self) -> "GpuSpec":
        """Achieved <= achievable <= peak: an achievable rate above the datasheet is a typo."""
        ach = self.achievable
        if ach is None:
            return self
        # a data type without a peak is not checked here; the compute model ignores its rates
        for dtype, rate in ach.matmul_tflops.items():
            peak = self.peak_tflops.get(dtype)
            if peak is not None and rate.value > peak.value:
                raise ValueError(f"achievable.matmul_tflops.{dtype} ({rate.value:g}) is above the "
                                 f"{dtype} peak ({peak.value:g})")
        if ach.hbm_gbps.value > self.memory_bandwidth_gbps.value:
            raise ValueError(f"achievable.hbm_gbps ({ach.hbm_gbps.value:g}) is above "
                             f"memory_bandwidth_gbps ({self.memory_bandwidth_gbps.value:g})")
        for dtype, passes in ach.attention.items():
            peak = self.peak_tflops.get(dtype)
            for name, curve in passes.items():
                if peak is not None and max(curve.tflops) > peak.value:
                    raise ValueError(f"achievable.attention.{dtype}.{name}: above the {dtype} peak "
                                     f"({peak.value:g})")
        return self


class NodeSpec(_Strict):
    gpus: Sourced = Field(..., description="GPUs per node (NVLink domain)")
    nvswitch: bool = Field(..., description="GPUs reach each other through NVSwitches (all-to-all NVLink)")
    nvls: bool = Field(False, description="NVLink SHARP (multicast reductions in the NVSwitch), NCCL's NVLS")
    cpu_vendor: Literal["intel", "amd"] = Field(
        "intel", description="host CPU vendor: NCCL's per-step network overhead and multi-node LL bandwidth "
                             "depend on it")
    cpu_source: str | None = Field(None, description="the public document naming the host CPU")
    kernel_launch_us: Sourced | None = Field(
        None, description="host (CPU) time to launch one kernel asynchronously, µs: one thread driving "
                          "several GPUs launches their collectives one after the other")
    pcie_gbps: Sourced | None = Field(
        None, description="PCIe bandwidth between one GPU and host memory, GB/s per direction: what a "
                          "host-staged network transfer crosses twice")


class NcclSpec(_Strict):
    """What NCCL's topology search and tuning derive from this hardware (NCCL's public source)."""

    graph_channels: Sourced = Field(
        ..., description="channels NCCL's intra-node ring search finds (graph nChannels); tuning's bus "
                         "bandwidth is graph_channels x channel_bw_gbps")
    channel_bw_gbps: Sourced = Field(..., description="bandwidth per channel the search settles on (bwIntra), GB/s")
    channels: Sourced = Field(..., description="ring/tree channels of a communicator (comm->nChannels, "
                                               "the search's channels duplicated)")
    nvls_channels: Sourced | None = Field(None, description="NVLS channels (NVLS_NCHANNELS_SM90)")
    nvls_bus_bw_gbps: Sourced | None = Field(
        None, description="bus bandwidth of the NVLS graph (one channel per GPU x its bwIntra), GB/s; "
                          "NCCL's tuning takes nvlsEfficiency of twice it for an all-reduce")
    nvls_inter_bw_gbps: Sourced | None = Field(
        None, description="bwInter of the NVLS graph per channel, GB/s (the search's second pass raises it); "
                          "caps an NVLS channel's bandwidth; default its bwIntra")


class NetworkSpec(_Strict):
    """The scale-out network between nodes."""

    fabric: str
    nics_per_node: Sourced
    nic_gbits: Sourced = Field(..., description="line rate of one NIC, Gb/s")
    nccl_devices_per_node: Sourced | None = Field(
        None, description="network devices NCCL sees per node, where the network plugin groups several "
                          "NICs into one device (their rates add up); default: one per NIC")
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


class Calibration(_Strict):
    """Physical parameters `chakra-sim calibrate` fits to measurements, in place of the spec-only
    values (absent from spec-only profiles). Each is one property of the machine, so a fit on one
    collective at one scale carries to the others."""

    source: str
    step_overhead_us: float | None = Field(
        None, ge=0, description="synchronisation cost of one Simple-protocol step over NVLink, µs "
                                "(spec-only: NCCL's LL per-hop NVLink latency)")
    hop_latency_scale: float = Field(1.0, gt=0, description="factor on NCCL's per-hop step latencies over NVLink")
    nvlink_efficiency: float = Field(1.0, gt=0, le=1.0, description="fraction of the NVLink bandwidth NCCL's "
                                                                     "topology search counts that collectives reach")
    nic_efficiency: float = Field(1.0, gt=0, le=1.0, description="fraction of the NICs' line rate reached")
    network_latency_us: float | None = Field(
        None, ge=0, description="latency of one network step beyond NCCL's table, µs (spec-only: the profile's "
                                "network.extra_latency_us)")
    launch_us: float | None = Field(None, ge=0, description="host time to launch one kernel, µs "
                                                            "(spec-only: node.kernel_launch_us)")
    proxy_post_us: float | None = Field(
        None, ge=0, description="host time NCCL's proxy thread spends on one network step, µs (spec-only: "
                                "NCCL's network post overhead, 1 µs on Intel hosts, 2 on AMD)")


class Profile(_Strict):
    name: str
    description: str
    gpu: GpuSpec
    node: NodeSpec
    nccl: NcclSpec
    network: NetworkSpec | None = None
    calibration: Calibration | None = None
    inherited_rates: list[InheritedRate] = Field(
        default_factory=list, description="rates kept from the parent profile although a value they depend on "
                                          "changed (worked out when the profile loads)")

    @model_validator(mode="after")
    def _staging_needs_pcie(self) -> "Profile":
        if self.network is not None and self.network.transport == "host_staged" and self.node.pcie_gbps is None:
            raise ValueError("network.transport host_staged copies every network step through host memory: "
                             "give node.pcie_gbps (the GPU's PCIe bandwidth)")
        return self

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


def _merge(base: dict[str, Any], override: dict[str, Any], where: str, problems: list[tuple[str, str]],
           parent: str) -> dict[str, Any]:
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
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value, f"{where}{key}.", problems, parent)
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

    data: dict[str, Any]
    origins: dict[str, Origin]


def _records(data: dict[str, Any], path: Path) -> list[InheritedRate]:
    """A flat profile's record of the rates it inherited (written by --json or calibrate)."""
    raw = data.pop("inherited_rates", None) or []
    try:
        if not isinstance(raw, list):
            raise ValueError("a list of the rates the profile inherited")
        return [InheritedRate.model_validate(item) for item in raw]
    except (ValueError, ValidationError) as exc:
        raise ManifestError([(f"{path}: inherited_rates", f"not a record of inherited rates: {exc}")]) from None


def _raw(path: Path, seen: tuple[Path, ...]) -> _Resolved:
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
        return _Resolved(data, origins(data, data, name, None, {}, records))
    if not isinstance(parent, str) or not parent:
        raise ManifestError([(f"{path}: extends", "give a shipped profile's name or a .yaml path")])
    # Resolved, so that a loop through '..' or a symlink is seen as one.
    try:
        parent_path = _path_of(parent, path.parent)
    except ManifestError as exc:   # name the file that says `extends`
        raise ManifestError([(f"{path}: extends: {where}", why) for where, why in exc.problems]) from None
    base = _raw(parent_path.resolve(), (*seen, path))
    parent_name = base.data.pop("name", parent_path.stem)   # a profile is named after its own file unless it says
    problems: list[tuple[str, str]] = []
    merged = _merge(base.data, data, "", problems, parent)
    if problems:
        raise ManifestError([(f"{path}: {where}", why) for where, why in problems])
    return _Resolved(merged, origins(merged, data, name, str(parent_name), base.origins, records))


@lru_cache(maxsize=64)
def _load(path: Path) -> Profile:
    resolved = _raw(path, ())
    data = resolved.data
    data.setdefault("name", path.stem)
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        raise ManifestError([(f"{path}: {'.'.join(str(p) for p in err['loc'])}", err["msg"])
                             for err in exc.errors()]) from None
    return profile.model_copy(update={"inherited_rates": inherited(data, resolved.origins)})


def load_profile(name: str | Path, base_dir: Path = Path(".")) -> Profile:
    """A shipped profile by name, or a profile file (relative paths against `base_dir`)."""
    return _load(_path_of(name, base_dir).resolve())


def profile_problems(name: str | Path, base_dir: Path) -> list[tuple[tuple[str | int, ...], str]]:
    """For a plugin's `config_problems`: why the profile a manifest names cannot be loaded
    (as `(("profile",), reason)`), or nothing."""
    try:
        load_profile(name, base_dir)
    except ManifestError as exc:
        return [(("profile",), "; ".join(f"{where}: {why}" for where, why in exc.problems))]
    return []
