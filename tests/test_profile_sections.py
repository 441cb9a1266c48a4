"""Sections of a hardware profile that plugins own (chakra_core.contract.profile_sections): registered
through the contract, validated when the profile is read, read back typed; the core names none."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import pytest
import yaml

from chakra_core import ManifestError, PluginError, Profile, Sourced, hookimpl, load_profile, make_plugin_host
from chakra_core.contract import ProfileSectionModel, ProfileSectionRegistry

PARENT = "h100-sxm-hgx"


class Cooling(ProfileSectionModel):
    """A third party's section: how the node is cooled, and the clock it sustains so."""

    kind: str
    sustained_tflops: Sourced


def sustained_below_peak(cooling: Cooling, profile: Profile) -> None:
    if cooling.sustained_tflops.value > profile.gpu.peak_tflops["bf16"].value:
        raise ValueError("sustained_tflops is above the bf16 peak")


def measured_for(raw: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    return {"sustained_tflops": ("gpu.peak_tflops.bf16",)} if "sustained_tflops" in raw else {}


class CoolingPlugin:
    @hookimpl
    def chakra_sim_register_profile_sections(self, registry: ProfileSectionRegistry) -> None:
        registry.add("node.cooling", Cooling, check=sustained_below_peak, rates=measured_for)


class TakesNccl:
    @hookimpl
    def chakra_sim_register_profile_sections(self, registry: ProfileSectionRegistry) -> None:
        registry.add("nccl", Cooling)


def write(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cooled(tflops: float, **node: Any) -> dict[str, Any]:
    return {"extends": PARENT, "description": "liquid-cooled",
            "node": {**node, "cooling": {"kind": "liquid", "sustained_tflops": {"value": tflops, "source": "test"}}}}


def test_a_third_party_section_is_validated_and_read_back_typed(tmp_path):
    host = make_plugin_host(extra_plugins=[("cooling", CoolingPlugin())])
    sections = host.profile_sections()
    assert sections.get("node.cooling") is not None and sections.get("node.cooling").owner == "cooling"
    profile = load_profile(write(tmp_path / "cooled.yaml", cooled(900.0)), sections=sections)
    cooling = profile.section("node.cooling", Cooling)
    assert cooling is not None and cooling.kind == "liquid" and cooling.sustained_tflops.value == 900.0
    assert load_profile(PARENT, sections=sections).section("node.cooling", Cooling) is None
    # shown and written where the file puts it, and read back the same
    assert profile.as_data()["node"]["cooling"]["kind"] == "liquid"
    again = load_profile(write(tmp_path / "flat.yaml", profile.as_data()), sections=sections)
    assert again.as_data() == profile.as_data()
    # without the plugin the key is unknown, and the error names who registers what
    with pytest.raises(ManifestError) as info:
        load_profile(tmp_path / "cooled.yaml")
    message = str(info.value)
    assert "cooled.yaml: node.cooling" in message and "no installed plugin registers" in message
    assert "nccl (plugin 'system_nccl')" in message and "gpu.achievable (plugin 'compute_achievable')" in message


def test_a_section_s_errors_name_the_file_and_key_path(tmp_path):
    sections = make_plugin_host(extra_plugins=[("cooling", CoolingPlugin())]).profile_sections()
    bad = cooled(900.0)
    bad["node"]["cooling"]["sustained_tflops"] = {"value": "fast", "source": "test"}
    with pytest.raises(ManifestError) as info:
        load_profile(write(tmp_path / "bad.yaml", bad), sections=sections)
    assert "bad.yaml: node.cooling.sustained_tflops.value" in str(info.value)
    # the section's cross-check against the core profile
    with pytest.raises(ManifestError, match="node.cooling: sustained_tflops is above the bf16 peak"):
        load_profile(write(tmp_path / "hot.yaml", cooled(5000.0)), sections=sections)
    # a shipped plugin's section: the file, the key path inside the section
    data = {"extends": PARENT, "description": "x", "nccl": {"channels": {"value": -1, "source": "t"}}}
    with pytest.raises(ManifestError) as info:
        load_profile(write(tmp_path / "nccl.yaml", data))
    assert "nccl.yaml: nccl.channels.value" in str(info.value)


def test_a_section_s_rates_are_recorded_when_inherited(tmp_path):
    sections = make_plugin_host(extra_plugins=[("cooling", CoolingPlugin())]).profile_sections()
    write(tmp_path / "cooled.yaml", cooled(900.0))
    faster = {"extends": "cooled.yaml", "description": "faster",
              "gpu": {"peak_tflops": {"bf16": {"value": 2000.0, "source": "test"}}}}
    profile = load_profile(write(tmp_path / "faster.yaml", faster), sections=sections)
    keys = {rate.key for rate in profile.inherited("node.cooling.")}
    assert keys == {"node.cooling.sustained_tflops"}


def test_achievable_above_the_peak_is_still_refused(tmp_path):
    data = {"extends": PARENT, "description": "typo",
            "gpu": {"achievable": {"matmul_tflops": {"bf16": {"value": 9999.0, "source": "typo"}}}}}
    with pytest.raises(ManifestError, match=r"gpu.achievable: matmul_tflops.bf16 \(9999\) is above the bf16 peak"):
        load_profile(write(tmp_path / "typo.yaml", data))


def test_an_inherited_achievable_rate_is_still_recorded(tmp_path):
    data = {"extends": PARENT, "description": "faster peak",
            "gpu": {"peak_tflops": {"bf16": {"value": 1200.0, "source": "test"}}}}
    profile = load_profile(write(tmp_path / "fast.yaml", data))
    rate = next(r for r in profile.inherited_rates if r.key == "gpu.achievable.matmul_tflops.bf16")
    assert "gpu.peak_tflops.bf16 changed 989.5 -> 1200" in rate.message()


def test_a_key_taken_twice_or_the_core_s_is_refused():
    host = make_plugin_host(extra_plugins=[("takes-nccl", TakesNccl())])
    failed = {info.name: info.error for info in host.failed()}
    assert "profile section 'nccl' is registered twice: by 'system_nccl' and by 'takes-nccl'" in failed["takes-nccl"]
    assert host.profile_sections().get("nccl").schema.__name__ == "NcclSpec"
    registry = ProfileSectionRegistry()
    for key in ("gpu", "name", "cooling.fans", "Nccl", "gpu.a.b"):
        with pytest.raises(Exception, match="not one a plugin may take"):
            registry.add(key, Cooling)


class TakesThePeak:
    @hookimpl
    def chakra_sim_register_profile_sections(self, registry: ProfileSectionRegistry) -> None:
        registry.add("gpu.peak_tflops", Cooling)


def test_a_section_may_not_take_a_key_of_a_core_part():
    sections = make_plugin_host(extra_plugins=[("peak", TakesThePeak())]).profile_sections()
    with pytest.raises(PluginError, match="plugin 'peak' registers profile section 'gpu.peak_tflops', a key of the core"):
        load_profile(PARENT, sections=sections)


def test_a_section_read_with_another_schema_is_a_type_error():
    with pytest.raises(TypeError, match="profile section 'nccl' is a NcclSpec, not a Cooling"):
        load_profile(PARENT).section("nccl", Cooling)
