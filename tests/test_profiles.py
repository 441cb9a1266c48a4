"""Hardware profiles: the shipped files, `extends`, the errors a profile author sees, and
`chakra-sim profiles`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from chakra_sim_system_nccl import Calibration, NcclSpec
from chakra_core.cli import main
from chakra_core.errors import ManifestError
from chakra_core.hardware.profiles import (BUILTIN_DIR, Profile, Sourced, builtin_profiles,
                                           load_profile)
from chakra_core.cli.profiles import rows

SHIPPED = builtin_profiles()
NODES = {"h100-sxm-hgx", "h200-sxm-hgx", "a100-sxm-hgx", "b200-sxm-hgx", "gb200-nvl72", "gb300-nvl72"}
SCALE_OUT = {"h100-hgx-ndr400": "h100-sxm-hgx", "h200-hgx-ndr400": "h200-sxm-hgx",
             "a100-hgx-hdr200": "a100-sxm-hgx", "h100-aws-p5-efa": "h100-sxm-hgx",
             "a100-aws-p4de-efa": "a100-sxm-hgx", "h100-hgx-roce400": "h100-sxm-hgx",
             "b200-hgx-ndr400": "b200-sxm-hgx", "gb200-nvl72-ndr400": "gb200-nvl72",
             "gb300-nvl72-xdr800": "gb300-nvl72"}
NVLINK_DOMAIN = {"gb200-nvl72": 72, "gb200-nvl72-ndr400": 72, "gb300-nvl72": 72, "gb300-nvl72-xdr800": 72,
                 "azure-nd-gb200-v6": 72, "azure-nd-gb300-v6": 72, "gcp-a4x": 72, "aws-u-p6e-gb200x72": 72}
"""Rack-scale profiles: the node is the 72-GPU NVLink domain (tests/test_blackwell_profiles.py)."""
NCCL_LINK_GBPS = {"ampere": 20.0, "hopper": 20.6, "blackwell": 40.1}
"""NCCL's per-NVLink bandwidth (src/graph/topo.h SM80/SM90/SM100_NVLINK_BW)."""


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def sourced_values(profile: Profile) -> list[tuple[str, Sourced]]:
    return [(path, sourced) for path, _value, sourced in rows(profile) if sourced is not None]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# A complete, valid node profile a test can break one key at a time.
NODE_YAML = """\
description: test node
gpu:
  model: Test GPU
  architecture: hopper
  peak_tflops:
    bf16: {value: 100, source: "test datasheet"}
    fp32: {value: 10, source: "test datasheet"}
  memory_bandwidth_gbps: {value: 1000, source: "test datasheet"}
  memory_gib: {value: 16, source: "test datasheet"}
  nvlink_links: {value: 4, source: "test datasheet"}
  nvlink_gbps: {value: 100, source: "test datasheet"}
node:
  gpus: {value: 4, source: "test datasheet"}
  nvswitch: true
nccl:
  graph_channels: {value: 2, source: "test"}
  channel_bw_gbps: {value: 20, source: "test"}
  channels: {value: 4, source: "test"}
"""


# shipped profiles ----------------------------------------------------------------------------
def test_the_expected_profiles_ship():
    cloud = {"gcp-a3-highgpu-8g", "gcp-a3-megagpu-8g", "azure-nd-h100-v5", "oci-bm-gpu4-8",
             "oci-bm-gpu-h100-8", "aws-p5-48xlarge", "aws-p4de-24xlarge", "azure-nd-gb200-v6",
             "azure-nd-gb300-v6", "gcp-a4", "gcp-a4x", "aws-p6-b200-48xlarge",
             "aws-u-p6e-gb200x72"}   # tests/test_cloud_profiles.py
    assert set(SHIPPED) == NODES | set(SCALE_OUT) | cloud
    assert all((BUILTIN_DIR / f"{name}.yaml").is_file() for name in SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_profile_loads(name):
    profile = load_profile(name)
    assert profile.name == name
    assert profile.description
    assert profile.gpus_per_node == NVLINK_DOMAIN.get(name, 8)
    assert profile.section("calibration", Calibration) is None, "shipped profiles are spec-only"
    assert "bf16" in profile.gpu.peak_tflops


@pytest.mark.parametrize("name", SHIPPED)
def test_every_value_has_a_real_source(name):
    values = sourced_values(load_profile(name))
    assert len(values) >= 13   # every number of the gpu, node and nccl sections
    for path, sourced in values:
        assert sourced.source.strip(), f"{name}: {path} has an empty source"
        assert "TODO" not in sourced.source.upper(), f"{name}: {path}: {sourced.source}"
        assert "nccl-tests" not in sourced.source, f"{name}: {path}: no benchmark numbers as sources"


@pytest.mark.parametrize("name", sorted(NODES))
def test_node_nccl_values_follow_the_derivation(name):
    profile = load_profile(name)
    nccl = profile.section("nccl", NcclSpec)
    # channels = the search's channels duplicated by ncclTopoPostset
    assert nccl.channels.value == 2 * nccl.graph_channels.value
    # the ring graph's bandwidth cannot exceed what NCCL counts per GPU (links x per-link bw)
    per_link = NCCL_LINK_GBPS[profile.gpu.architecture]
    assert nccl.graph_channels.value * nccl.channel_bw_gbps.value <= profile.gpu.nvlink_links.value * per_link
    assert (nccl.nvls_channels is not None) == profile.node.nvls
    assert "NVIDIA/nccl" in nccl.graph_channels.source


def test_a100_has_no_nvls_and_no_fp8():
    a100 = load_profile("a100-sxm-hgx")
    assert a100.gpu.architecture == "ampere" and not a100.node.nvls and a100.section("nccl", NcclSpec).nvls_channels is None
    assert a100.gpu.nvlink_links.value == 12 and a100.gpu.nvlink_gbps.value == 300
    with pytest.raises(KeyError, match="fp8"):
        a100.peak_flops("fp8")


def test_h200_is_h100_with_more_and_faster_memory():
    h100, h200 = load_profile("h100-sxm-hgx"), load_profile("h200-sxm-hgx")
    assert h200.gpu.memory_bandwidth_gbps.value == 4800 and h200.gpu.memory_gib.value == 141
    assert h200.peak_flops("bf16") == h100.peak_flops("bf16") == 989.5e12
    assert h200.section("nccl", NcclSpec).model_dump(exclude={"graph_channels": {"note"}, "channel_bw_gbps": {"note"},
                                         "channels": {"note"}}) == \
        h100.section("nccl", NcclSpec).model_dump(exclude={"graph_channels": {"note"}, "channel_bw_gbps": {"note"},
                                      "channels": {"note"}})


# extends -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,node", sorted(SCALE_OUT.items()))
def test_scale_out_profiles_extend_their_node(name, node):
    scale_out, base = load_profile(name), load_profile(node)
    assert base.network is None
    assert scale_out.network is not None and scale_out.network.fabric
    assert scale_out.gpu == base.gpu and scale_out.section("nccl", NcclSpec) == base.section("nccl", NcclSpec)
    # a cloud instance names its own host CPU; everything else about the node is the base's
    assert scale_out.node.model_copy(update={"cpu_vendor": base.node.cpu_vendor, "cpu_source": base.node.cpu_source}) \
        == base.node
    assert scale_out.description != base.description


def test_network_values():
    nets = {name: load_profile(name).network for name in SCALE_OUT}
    assert (nets["h100-hgx-ndr400"].nics_per_node.value, nets["h100-hgx-ndr400"].nic_gbits.value) == (8, 400)
    assert (nets["a100-hgx-hdr200"].nics_per_node.value, nets["a100-hgx-hdr200"].nic_gbits.value) == (8, 200)
    p5, p4de = nets["h100-aws-p5-efa"], nets["a100-aws-p4de-efa"]
    assert p5.nics_per_node.value * p5.nic_gbits.value == 3200
    assert p4de.nics_per_node.value * p4de.nic_gbits.value == 400
    # AWS's NCCL plugin: a 20 us EFA step, 75 us reported to NCCL; p4de runs Simple only and flushes
    assert (p5.extra_latency_us.value, p5.reported_latency_us.value, p5.gdr_flush) == (20, 75, False)
    assert (p4de.extra_latency_us.value, p4de.protocols, p4de.gdr_flush) == (20, ["Simple"], True)
    assert "aws-ofi-nccl" in p5.extra_latency_us.source and p4de.protocols_source


def test_extends_merges_key_by_key(tmp_path):
    write(tmp_path / "base.yaml", NODE_YAML)
    child = write(tmp_path / "child.yaml", """\
extends: base.yaml
description: test cluster
gpu:
  memory_bandwidth_gbps: {value: 2000, source: "faster memory"}
network:
  fabric: test fabric
  nics_per_node: {value: 4, source: "test"}
  nic_gbits: {value: 400, source: "test"}
""")
    profile = load_profile(child)
    assert profile.name == "child" and profile.description == "test cluster"
    assert profile.gpu.memory_bandwidth_gbps.value == 2000          # overridden
    assert profile.gpu.peak_tflops["bf16"].value == 100             # kept from the base
    assert profile.network.nic_gbits.value == 400


def test_extends_a_shipped_profile_by_name(tmp_path):
    write(tmp_path / "mine.yaml", """\
extends: h100-sxm-hgx
description: my cluster
network:
  fabric: RoCE
  nics_per_node: {value: 8, source: "our rack drawing"}
  nic_gbits: {value: 400, source: "our rack drawing"}
""")
    profile = load_profile("mine.yaml", base_dir=tmp_path)
    assert profile.gpu == load_profile("h100-sxm-hgx").gpu
    assert profile.network.fabric == "RoCE"


def test_an_overridden_value_carries_its_own_source_not_the_parents(tmp_path):
    write(tmp_path / "unsourced.yaml", "extends: h100-sxm-hgx\ngpu:\n  memory_gib: {value: 96}\n")
    with pytest.raises(ManifestError, match=r"unsourced\.yaml: gpu\.memory_gib: changes h100-sxm-hgx's value: "
                                            "give its own source"):
        load_profile(tmp_path / "unsourced.yaml")
    write(tmp_path / "sourced.yaml",
          'extends: h100-sxm-hgx\ngpu:\n  memory_gib: {value: 96, source: "our datasheet"}\n'
          "  memory_bandwidth_gbps: {note: a note on the parent's value}\n")
    profile = load_profile(tmp_path / "sourced.yaml")
    parent = load_profile("h100-sxm-hgx")
    # the parent's note explained the parent's number: it goes with it
    assert profile.gpu.memory_gib == Sourced(value=96, source="our datasheet")
    assert profile.gpu.memory_bandwidth_gbps.source == parent.gpu.memory_bandwidth_gbps.source
    assert profile.gpu.memory_bandwidth_gbps.note == "a note on the parent's value"
    shown = invoke("profiles", str(tmp_path / "sourced.yaml")).output
    assert "our datasheet" in shown and "five 16 GiB HBM3 stacks" not in shown
    # an unchanged value needs no new source
    write(tmp_path / "same.yaml", "extends: h100-sxm-hgx\ngpu:\n  memory_gib: {value: 80}\n")
    assert load_profile(tmp_path / "same.yaml").gpu.memory_gib == parent.gpu.memory_gib


def test_a_setting_with_a_sibling_source_needs_that_source_when_changed(tmp_path):
    write(tmp_path / "a3.yaml", "extends: gcp-a3-megagpu-8g\nnetwork:\n  protocols: [Simple]\n")
    with pytest.raises(ManifestError, match=r"network\.protocols: changes .* give network\.protocols_source"):
        load_profile(tmp_path / "a3.yaml")


def test_a_loop_in_extends_is_a_clear_error(tmp_path):
    write(tmp_path / "a.yaml", "extends: b.yaml\ndescription: a\n")
    write(tmp_path / "b.yaml", "extends: ../" + tmp_path.name + "/a.yaml\ndescription: b\n")
    with pytest.raises(ManifestError, match=r"'extends' chain loops: a\.yaml -> b\.yaml -> a\.yaml"):
        load_profile(tmp_path / "a.yaml")
    write(tmp_path / "self.yaml", "extends: self.yaml\n")
    with pytest.raises(ManifestError, match="loops"):
        load_profile(tmp_path / "self.yaml")


def test_extends_must_name_a_profile(tmp_path):
    path = write(tmp_path / "bad.yaml", "extends: [h100-sxm-hgx]\n")
    with pytest.raises(ManifestError, match="extends"):
        load_profile(path)


# errors --------------------------------------------------------------------------------------
def test_an_unknown_key_names_the_file_and_key_path(tmp_path):
    path = write(tmp_path / "typo.yaml", NODE_YAML.replace("  nvswitch: true", "  nvswitch: true\n  nvlss: true"))
    with pytest.raises(ManifestError) as info:
        load_profile(path)
    message = str(info.value)
    assert str(path) in message and "node.nvlss" in message and "no installed plugin registers" in message


def test_a_missing_value_names_the_file_and_key_path(tmp_path):
    path = write(tmp_path / "missing.yaml",
                 NODE_YAML.replace('  memory_gib: {value: 16, source: "test datasheet"}\n', "")
                 .replace('bf16: {value: 100, source: "test datasheet"}', 'bf16: {value: 100}'))
    with pytest.raises(ManifestError) as info:
        load_profile(path)
    message = str(info.value)
    assert f"{path}: gpu.memory_gib" in message
    assert f"{path}: gpu.peak_tflops.bf16.source" in message
    assert "2 problems" in message


def test_an_unknown_data_type_lists_the_known_ones(tmp_path):
    path = write(tmp_path / "dtype.yaml", NODE_YAML.replace("    fp32:", "    fp4:"))
    with pytest.raises(ManifestError, match=r"gpu\.peak_tflops.*fp4.*known: fp64, fp32"):
        load_profile(path)


def test_an_unknown_name_lists_the_shipped_profiles():
    with pytest.raises(ManifestError) as info:
        load_profile("h100-sxm")
    message = str(info.value)
    assert "no such profile" in message
    assert all(name in message for name in SHIPPED)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ManifestError, match="profile file not found"):
        load_profile(tmp_path / "nowhere.yaml")
    with pytest.raises(ManifestError, match="not valid YAML"):
        load_profile(write(tmp_path / "broken.yaml", "gpu: [unclosed\n"))
    with pytest.raises(ManifestError, match="mapping"):
        load_profile(write(tmp_path / "list.yaml", "- 1\n- 2\n"))


def test_peak_flops_and_its_key_error():
    h100 = load_profile("h100-sxm-hgx")
    assert h100.peak_flops("bf16") == pytest.approx(989.5e12)
    with pytest.raises(KeyError) as info:
        h100.peak_flops("fp4")
    message = str(info.value)
    assert "h100-sxm-hgx" in message and "fp4" in message
    assert all(dtype in message for dtype in ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8"))


# chakra-sim profiles -------------------------------------------------------------------------
def test_cli_lists_every_shipped_profile():
    result = invoke("profiles")
    assert result.exit_code == 0, result.output
    for name in SHIPPED:
        assert name in result.output
    assert "single node" in result.output and "InfiniBand NDR" in result.output
    assert "989.5" in result.output and "4,800" in result.output


def test_cli_list_as_json():
    result = invoke("profiles", "--json")
    assert result.exit_code == 0, result.output
    listing = json.loads(result.output)
    assert [line["name"] for line in listing] == SHIPPED
    p5 = next(line for line in listing if line["name"] == "h100-aws-p5-efa")
    assert p5["fabric"] == "AWS EFA (SRD, Ethernet)" and p5["bf16_tflops"] == 989.5 and p5["power_w"] == 700


def test_cli_shows_a_profile_with_its_sources():
    result = invoke("profiles", "h100-sxm-hgx")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())   # the table wraps long sources
    assert "gpu.peak_tflops.bf16" in text and "nccl.graph_channels" in text
    assert "NVIDIA H100 Tensor Core GPU Datasheet" in text
    assert "SM90_NVLINK_BW" in text and "NVLS_NCHANNELS_SM90" in text


def test_cli_json_is_the_resolved_profile():
    result = invoke("profiles", "h100-hgx-ndr400", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["name"] == "h100-hgx-ndr400"
    assert data["network"]["nic_gbits"]["value"] == 400
    assert data["gpu"]["peak_tflops"]["bf16"]["value"] == 989.5        # from h100-sxm-hgx
    assert data == load_profile("h100-hgx-ndr400").as_data()


def test_cli_shows_a_profile_file(tmp_path, monkeypatch):
    write(tmp_path / "mine.yaml", NODE_YAML)
    monkeypatch.chdir(tmp_path)
    result = invoke("profiles", "mine.yaml")
    assert result.exit_code == 0, result.output
    assert "Test GPU" in result.output and "test datasheet" in result.output


def test_cli_unknown_name_exits_2_with_a_clear_message():
    result = CliRunner().invoke(main, ["profiles", "h100"])
    assert result.exit_code == 2
    assert "error:" in result.output and "no such profile" in result.output
    assert "h100-sxm-hgx" in result.output
    assert "Traceback" not in result.output


def test_cli_invalid_file_exits_2(tmp_path):
    path = write(tmp_path / "typo.yaml", NODE_YAML.replace("  nvswitch: true", "  nvswitch: true\n  nvlss: true"))
    result = CliRunner().invoke(main, ["profiles", str(path)])
    assert result.exit_code == 2
    assert "node.nvlss" in result.output


def test_an_extending_profile_is_named_after_its_own_file(tmp_path):
    write(tmp_path / "base.yaml", "name: the-base\n" + NODE_YAML)
    write(tmp_path / "child.yaml", "extends: base.yaml\n")
    assert load_profile(tmp_path / "base.yaml").name == "the-base"
    assert load_profile(tmp_path / "child.yaml").name == "child"
