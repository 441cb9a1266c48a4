"""Rates a profile inherits although what they depend on changed (issue 31; docs/hardware.md).

A rate measured on one GPU holds for that GPU: the memory a program can allocate for its memory,
the maximum power for its part and clocks (its model and bf16 peak),
and in a plugin's section what its plugin says (`rates` of chakra_core.contract.profile_sections:
the `achievable` compute model's matmul rate (MAMF) for the GPU's peak, its STREAM bandwidth for
the HBM, its SM count for the GPU's model). A profile that `extends` another and changes one of
those without restating the rates that depend on it keeps the parent's rates, which then
describe another GPU: a profile raising an H100's peaks to a B200's would give the H100's step.
The loader records each such rate on the profile (`Profile.inherited_rates`), so that
`chakra-sim profiles` shows it and a layer that uses it warns (the `achievable` compute model,
`chakra-sim plan` for the usable memory).

A rate is restated when the extending file gives it with a `source` (the same value with a new
source is a statement that it still holds). A profile written out flat (`chakra-sim profiles
--json`, `chakra-sim calibrate`) carries its `inherited_rates`, which the loader keeps while the
value is the one recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Union

from pydantic import BaseModel, ConfigDict

from chakra_core.contract.profile_sections import ProfileSections

Setting = Union[float, str]
"""A value a rate depends on: a number, or the GPU's model name."""


class DependencyChange(BaseModel):
    """A value an inherited rate depends on, where the rate was stated and in this profile."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    was: Setting
    now: Setting


class InheritedRate(BaseModel):
    """A rate kept from the parent although a value it depends on changed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    """Its key path, e.g. gpu.achievable.matmul_tflops.bf16."""
    value: Union[float, list[float]]
    """The inherited value (an attention curve: its TFLOP/s points)."""
    parent: str
    """The profile this one extends, through which the rate came."""
    stated_in: str
    """The profile whose file gives the value and its source."""
    changed: list[DependencyChange]

    def message(self) -> str:
        """One line naming the rate, its value, where it came from and what changed."""
        shown = (f"{min(self.value):g}-{max(self.value):g} TFLOP/s" if isinstance(self.value, list)
                 else f"{self.value:g}")
        origin = self.parent if self.stated_in == self.parent else f"{self.parent} (stated in {self.stated_in})"
        changes = ", ".join(f"{c.key} changed {_shown(c.was)} -> {_shown(c.now)}" for c in self.changed)
        return f"{self.key} = {shown} inherited from {origin} although {changes}: restate it with a source"


def _shown(value: Setting) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value)


@dataclass(frozen=True)
class Origin:
    """Where a dependent value was stated: the profile, the profile it came through (None: this
    one's own), and the values it depends on there."""

    stated_in: str
    via: str | None
    depends: tuple[tuple[str, Any], ...]


def dependents(data: Mapping[str, Any], sections: ProfileSections) -> dict[str, tuple[str, ...]]:
    """Key path of each dependent value in a raw (merged) profile -> the key paths it depends on:
    the core's own, and those the sections' plugins name."""
    gpu = data.get("gpu")
    found: dict[str, tuple[str, ...]] = {}
    if isinstance(gpu, Mapping) and isinstance(gpu.get("usable_memory_gib"), Mapping):
        found["gpu.usable_memory_gib"] = ("gpu.memory_gib",)
    if isinstance(gpu, Mapping) and isinstance(gpu.get("power_w"), Mapping):
        found["gpu.power_w"] = ("gpu.model", "gpu.peak_tflops.bf16")     # another part, or other clocks
    for section in sections.entries:
        raw = _node(data, section.key)
        if section.rates is not None and isinstance(raw, Mapping):
            found.update({f"{section.key}.{key}": tuple(depends) for key, depends in section.rates(raw).items()})
    return found


def _node(data: Mapping[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def value_at(data: Mapping[str, Any], key: str) -> Any:
    """The value at `key` of a raw profile: a sourced number's value, a curve's TFLOP/s, a setting."""
    node = _node(data, key)
    if isinstance(node, Mapping):
        return node.get("value", node.get("tflops"))
    return node


def restated(own: Mapping[str, Any], key: str) -> bool:
    """Whether a file (before merging) gives `key` with a source of its own."""
    node = _node(own, key)
    return isinstance(node, Mapping) and "source" in node


def origins(merged: Mapping[str, Any], own: Mapping[str, Any], name: str, parent: str | None,
            from_parent: Mapping[str, Origin], records: list[InheritedRate],
            sections: ProfileSections) -> dict[str, Origin]:
    """Where each dependent value of `merged` (profile `name`, extending `parent`, whose own file
    is `own`) was stated: here if this file gives it a source, else where the parent's was. A
    flat file's `records` keep their origin while the value is the one recorded."""
    recorded = {record.key: record for record in records}
    found: dict[str, Origin] = {}
    for key, depends in dependents(merged, sections).items():
        now = tuple((dep, value_at(merged, dep)) for dep in depends)
        record = recorded.get(key)
        if record is not None and value_at(merged, key) == record.value:
            was = {change.key: change.was for change in record.changed}
            found[key] = Origin(record.stated_in, record.parent, tuple((dep, was.get(dep, v)) for dep, v in now))
        elif parent is None or restated(own, key) or key not in from_parent:
            found[key] = Origin(name, None, now)
        else:
            found[key] = Origin(from_parent[key].stated_in, parent, from_parent[key].depends)
    return found


def inherited(merged: Mapping[str, Any], found: Mapping[str, Origin]) -> list[InheritedRate]:
    """The dependent values of `merged` stated elsewhere for values it depends on that changed."""
    rates = []
    for key, origin in found.items():
        changed = [DependencyChange(key=dep, was=was, now=now) for dep, was in origin.depends
                   if (now := value_at(merged, dep)) != was and None not in (now, was)]
        if origin.via is not None and changed:
            rates.append(InheritedRate(key=key, value=value_at(merged, key), parent=origin.via,
                                       stated_in=origin.stated_in, changed=changed))
    return sorted(rates, key=lambda rate: rate.key)
