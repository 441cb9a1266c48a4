"""ASTRA-sim configuration files, read as they are.

- network YAML: `topology`, `npus_count`, `bandwidth` (GB/s, GB = 2^30), `latency` (ns) lists;
- system JSON: `scheduling-policy`, `endpoint-delay`, `preferred-dataset-splits`, ...,
  plus `roofline-enabled`, `peak-perf` (TFLOP/s = 10^12) and `local-mem-bw` (GB/s = 10^9),
  which the manifest loader also hands to the compute and memory layers;
- remote-memory JSON: `memory-type`, `remote-mem-latency`, `remote-mem-bw`, ...;
- communicator-group JSON: `{"<group id>": [ranks...]}`.

Files are parsed into plain dicts; the plugin's pydantic Config validates
them. Keys a plugin does not implement produce one warning each instead of
being silently dropped.

As in ASTRA-sim, a system file also speaks for compute and memory
(`SystemFileLinks`), and a command line of ASTRA-sim files is a manifest
(`astra_manifest`). Which plugin stands for which of ASTRA-sim's models is
what the plugins declare (`AstraEquivalent`): this module names none.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel

from chakra_core.config.files import read_config_file
from chakra_core.plugins import Implementation, PluginHost
from chakra_core.errors import ManifestError, PluginError
from chakra_core.json_types import JsonObject

ROOFLINE_KEYS = ("roofline-enabled", "peak-perf")
"""System JSON keys that select and configure ASTRA-sim's roofline compute model."""
SYSTEM_FILE_LINKED_KEYS = frozenset(ROOFLINE_KEYS + ("local-mem-bw",))
"""System JSON keys other layers may read (see SystemFileLinks)."""
NATIVE_SYSTEM = "native"
"""The built-in system layer, which reads ASTRA-sim's system JSON."""


def read_comm_groups(path: Path) -> dict[str, list[int]]:
    """ASTRA-sim communicator-group JSON: {"<id>": [ranks]}."""
    data = read_config_file(path)
    groups: dict[str, list[int]] = {}
    problems: list[tuple[str, str]] = []
    for key, ranks in data.items():
        if not isinstance(ranks, list) or not all(isinstance(r, int) and r >= 0 for r in ranks):
            problems.append((f"{path}: {key}", "must be a list of non-negative rank numbers"))
            continue
        groups[str(key)] = ranks
    if problems:
        raise ManifestError(problems)
    return groups


def field_keys(config_cls: type[BaseModel]) -> set[str]:
    """Every key a pydantic Config accepts (field names and aliases)."""
    keys: set[str] = set()
    for name, info in config_cls.model_fields.items():
        keys.add(name)
        if info.alias:
            keys.add(info.alias)
    return keys


ASTRA_SYSTEM_KEYS = frozenset({
    "scheduling-policy", "all-reduce-implementation", "reduce-scatter-implementation",
    "all-gather-implementation", "all-to-all-implementation", "collective-optimization",
    "local-reduction-delay", "active-chunks-per-dimension", "L", "o", "g", "G", "endpoint-delay",
    "model-shared-bus", "preferred-dataset-splits", "peak-perf", "local-mem-bw", "roofline-enabled",
    "trace-enabled", "replay-only", "boost-mode", "intra-dimension-scheduling",
    "inter-dimension-scheduling"})
"""Every key ASTRA-sim's `Sys::initialize_sys` reads from a system JSON. It looks each up with
`j.contains(...)` and never complains about others: a misspelt key is ignored silently there."""


def split_known(data: Mapping[str, Any], config_cls: type[BaseModel], source: str, layer: str, plugin: str,
                consumed_elsewhere: frozenset[str] = frozenset()) -> tuple[JsonObject, list[str]]:
    """Keep the keys `config_cls` implements; return (kept, warnings for the rest). A key that is
    not ASTRA-sim's either (system files) or is close to a known one is named as a likely typo."""
    known = field_keys(config_cls)
    kept: JsonObject = {}
    warnings: list[str] = []
    for key, value in data.items():
        if key in known:
            kept[key] = value
        elif key not in consumed_elsewhere:
            warnings.append(_unknown_key(key, known, source, layer, plugin, consumed_elsewhere))
    return kept, warnings


def _unknown_key(key: str, known: set[str], source: str, layer: str, plugin: str,
                 consumed_elsewhere: frozenset[str]) -> str:
    astra_keys = ASTRA_SYSTEM_KEYS if layer == "system" else frozenset()
    if key in astra_keys:   # ASTRA-sim's, not this plugin's: a feature, not a typo
        return f"{source}: key '{key}' is not implemented by {layer} plugin '{plugin}'; ignored"
    candidates = sorted(known | consumed_elsewhere | astra_keys)
    closest = difflib.get_close_matches(key, candidates, n=1, cutoff=0.75)
    hint = f" (did you mean '{closest[0]}'?)" if closest else ""
    if layer == "system":
        return (f"{source}: unknown key '{key}'{hint}: not a key of ASTRA-sim's system file; "
                "ignored, as ASTRA-sim ignores unknown keys")
    if closest:
        return f"{source}: unknown key '{key}'{hint}: not implemented by {layer} plugin '{plugin}'; ignored"
    return f"{source}: key '{key}' is not implemented by {layer} plugin '{plugin}'; ignored"


@dataclass
class Derived:
    """Settings a layer takes from the system layer's ASTRA-sim file."""

    settings: JsonObject
    where: dict[str, str]
    """setting -> "file: key" it was read from."""
    section_at: str | None = None
    """Where the section itself comes from, when the manifest has none (the compute section
    that `roofline-enabled` selects)."""
    read: frozenset[str] = frozenset()
    """The system-file keys these settings come from."""

    @classmethod
    def of(cls, name: str, data: Mapping[str, Any], keys: Mapping[str, str],
           section_at: str | None = None) -> "Derived":
        """The settings `keys` (system-file key -> Config key) take from file `name`'s `data`."""
        present = [key for key in keys if key in data]
        return cls({keys[key]: data[key] for key in present}, {keys[key]: f"{name}: {key}" for key in present},
                   section_at, frozenset(present))


class SystemFileLinks:
    """What an ASTRA-sim system file says about the other layers, as ASTRA-sim reads it.

    Besides the system layer's own settings, the file selects the compute model
    (`roofline-enabled`, `peak-perf`) and gives the local memory bandwidth
    (`local-mem-bw`, also read by the native system layer). Without a compute
    section, `roofline-enabled: 1` selects the compute plugin that stands for
    ASTRA-sim's roofline model, its settings filled from the file's keys it
    declares (`AstraEquivalent.system_keys`); a memory plugin declaring
    `local-mem-bw` gets it unless its section sets it. Keys no layer uses are
    warnings.
    """

    def __init__(self, file: tuple[str, JsonObject] | None, compute_given: bool,
                 plugins: Mapping[str, str | None], host: PluginHost, problems: list[tuple[str, str]],
                 warnings: list[str]):
        """`plugins`: layer -> the plugin its manifest section selects (None: no section)."""
        self.compute_plugin: str | None = None
        """The compute plugin `roofline-enabled: 1` selects (when the manifest has no compute section)."""
        self.derived: dict[str, Derived] = {}
        self.consumed: frozenset[str] = frozenset()
        if file is None:
            return
        name, data = file
        consumed: set[str] = set()
        roofline = [key for key in ROOFLINE_KEYS if key in data]
        enabled = data.get("roofline-enabled", 0)
        if compute_given:
            if roofline:
                warnings.append(f"{name}: {_keys(roofline)} not used: the manifest's compute section "
                                f"selects plugin '{plugins.get('compute')}'")
        elif enabled not in (0, 1):   # bool is an int: true/false pass too
            problems.append((f"{name}: roofline-enabled", "must be 0 or 1"))
        elif enabled:
            self._roofline(name, data, host, problems)
        elif "peak-perf" in data:
            off = f"is {enabled}" if "roofline-enabled" in data else "is not set"
            warnings.append(f"{name}: key 'peak-perf' not used: roofline-enabled {off}, so compute "
                            "nodes replay their traced durations")
        consumed.update(roofline)
        memory = plugins.get("memory")
        if memory is not None:
            derived = Derived.of(name, data, _system_keys(host, "memory", memory))
            if derived.settings:
                self.derived["memory"] = derived
        for derived in self.derived.values():
            consumed.update(derived.read)
        self.consumed = frozenset(consumed)

    def _roofline(self, name: str, data: JsonObject, host: PluginHost, problems: list[tuple[str, str]]) -> None:
        if "peak-perf" not in data:
            problems.append((f"{name}: peak-perf", "required with roofline-enabled: 1 "
                                                   "(TFLOP/s of the roofline compute model)"))
            return
        impl = _one(host, "compute", "roofline", f"{name}: roofline-enabled", problems)
        if impl is None or impl.cls.astra_sim is None:
            return
        self.compute_plugin = impl.name
        self.derived["compute"] = Derived.of(name, data, impl.cls.astra_sim.system_keys,
                                             f"{name}: roofline-enabled")


def _system_keys(host: PluginHost, layer: str, plugin: str) -> Mapping[str, str]:
    """The system-file keys an implementation declares it takes (none if it is not installed)."""
    try:
        impl = host.get(layer, plugin)
    except PluginError:
        return {}   # reported when the section is validated
    return impl.cls.astra_sim.system_keys if impl.cls.astra_sim is not None else {}


def _one(host: PluginHost, layer: str, model: str, where: str,
         problems: list[tuple[str, str]]) -> Implementation | None:
    """The one installed implementation standing for ASTRA-sim's `model`, or a problem saying why not."""
    found = host.astra_equivalents(layer, model)
    if len(found) == 1:
        return found[0]
    if not found:
        problems.append((where, f"selects ASTRA-sim's {model} {layer} model, but no installed {layer} "
                                "plugin implements it (see `chakra-sim plugins`)"))
    else:
        problems.append((where, f"selects ASTRA-sim's {model} {layer} model, which several {layer} "
                                f"plugins implement ({', '.join(i.name for i in found)}): give a "
                                f"`{layer}:` section naming one"))
    return None


def _keys(keys: list[str]) -> str:
    return ("key " if len(keys) == 1 else "keys ") + ", ".join(f"'{k}'" for k in keys)


def astra_manifest(host: PluginHost, workload: str, system: str, network: str, memory: str | None = None,
                   comm_group: str | None = None, network_plugin: str | None = None) -> JsonObject:
    """A manifest equivalent to an ASTRA-sim command line (paths relative to the cwd).

    The network plugin is `network_plugin`, or the one standing for ASTRA-sim's congestion-unaware
    analytical backend. What the system file says about compute (roofline) and memory bandwidth
    is read when the manifest is built, as for a manifest that loads the file itself.
    """
    problems: list[tuple[str, str]] = []
    if network_plugin is None:
        impl = _one(host, "network", "congestion-unaware", "command line: --astra-network", problems)
        network_plugin = impl.name if impl is not None else None
    workload_section: JsonObject = {"trace": workload}
    if comm_group:
        workload_section["comm_groups"] = comm_group
    manifest: JsonObject = {
        "workload": workload_section,
        "system": {"plugin": NATIVE_SYSTEM, "astra_file": system},
        "network": {"plugin": network_plugin, "astra_file": network},
    }
    if memory:
        section = _memory_section(host, memory, problems)
        if section is not None:
            manifest["memory"] = section
    if problems:
        raise ManifestError(problems)
    return manifest


def _memory_section(host: PluginHost, memory: str, problems: list[tuple[str, str]]) -> JsonObject | None:
    """The `memory` section of a remote-memory JSON, or None for NO_MEMORY_EXPANSION: that gives
    ASTRA-sim no model for memory nodes, so here too (MEM_LOAD/MEM_STORE nodes then stop with a
    clear error)."""
    mem_data = read_config_file(Path(memory))
    if mem_data.get("memory-type", "NO_MEMORY_EXPANSION") == "NO_MEMORY_EXPANSION":
        return None
    impl = _one(host, "memory", "remote-memory", "command line: --astra-memory", problems)
    return None if impl is None else {"plugin": impl.name, "astra_file": memory}


def override_manifest(host: PluginHost, data: Mapping[str, Any], workload: str | None = None,
                      system: str | None = None, network: str | None = None, memory: str | None = None,
                      comm_group: str | None = None, network_plugin: str | None = None,
                      ) -> tuple[JsonObject, list[str]]:
    """A manifest with the ASTRA-style command-line flags put in place of its own settings (paths
    made absolute: they are relative to the cwd, the manifest's to its folder), and one note per
    flag saying what it replaced."""
    manifest = {key: dict(value) if isinstance(value, Mapping) else value for key, value in data.items()}
    notes: list[str] = []
    problems: list[tuple[str, str]] = []

    def section(name: str) -> JsonObject:
        value = manifest.get(name)
        return value if isinstance(value, dict) else {}

    def was(name: str, key: str) -> str:
        value = section(name).get(key)
        return "unset" if value is None else f"was {value}"

    if workload:
        notes.append(f"--workload {workload} replaces the manifest's workload.trace ({was('workload', 'trace')})"
                     + ("; its workload.ranks, which counted the old traces, is dropped"
                        if "ranks" in section("workload") else ""))
        manifest["workload"] = {key: value for key, value in section("workload").items() if key != "ranks"}
        manifest["workload"]["trace"] = str(Path(workload).absolute())
    if comm_group:
        notes.append(f"--comm-group {comm_group} replaces the manifest's workload.comm_groups "
                     f"({was('workload', 'comm_groups')})")
        manifest["workload"] = {**section("workload"), "comm_groups": str(Path(comm_group).absolute())}
    if system:
        notes.append(f"--astra-system {system} replaces the manifest's system section")
        manifest["system"] = {"plugin": NATIVE_SYSTEM, "astra_file": str(Path(system).absolute())}
    if network or network_plugin:
        plugin = network_plugin or section("network").get("plugin")
        if network and network_plugin is None:   # the plugin standing for ASTRA-sim's, as without a manifest
            impl = _one(host, "network", "congestion-unaware", "command line: --astra-network", problems)
            plugin = impl.name if impl is not None else None
        if network:
            notes.append(f"--astra-network {network} replaces the manifest's network section "
                         f"(plugin {plugin})")
            manifest["network"] = {"plugin": plugin, "astra_file": str(Path(network).absolute())}
        else:
            notes.append(f"--network {plugin} replaces the manifest's network.plugin "
                         f"({was('network', 'plugin')}); the section's other keys stay")
            manifest["network"] = {**section("network"), "plugin": plugin}
    if memory:
        memory_section = _memory_section(host, str(Path(memory).absolute()), problems)
        notes.append(f"--astra-memory {memory} replaces the manifest's memory section"
                     + (" (NO_MEMORY_EXPANSION: no memory layer)" if memory_section is None else ""))
        manifest.pop("memory", None)
        if memory_section is not None:
            manifest["memory"] = memory_section
    if problems:
        raise ManifestError(problems)
    return manifest, notes
