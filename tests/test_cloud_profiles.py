"""The shipped cloud-instance profiles: each resolves through its `extends` chain to the machine
the provider documents (GPUs, GPU NICs x rate, transport), and every number of every shipped
profile carries a source."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from pydantic import BaseModel

from chakra_sim_system_nccl import NcclSpec
from chakra_sim_compute_achievable import AchievableSpec
from chakra_core.hardware.profiles import Profile, Sourced, builtin_profiles, load_profile

SHIPPED = builtin_profiles()

# name: (GPU model, GPUs per node, NICs per node, Gb/s per NIC, node Gb/s, transport, base profile)
CLOUD = {
    "gcp-a3-highgpu-8g": ("H100 SXM5 80GB", 8, 4, 200, 800, "gpudirect", "h100-sxm-hgx"),
    "gcp-a3-megagpu-8g": ("H100 SXM5 80GB", 8, 8, 200, 1600, "gpudirect", "h100-sxm-hgx"),
    "azure-nd-h100-v5": ("H100 SXM5 80GB", 8, 8, 400, 3200, "gpudirect", "h100-sxm-hgx"),
    "oci-bm-gpu-h100-8": ("H100 SXM5 80GB", 8, 16, 200, 3200, "gpudirect", "h100-sxm-hgx"),
    "oci-bm-gpu4-8": ("A100 SXM4 40GB", 8, 16, 100, 1600, "gpudirect", "a100-sxm-hgx"),
    "aws-p5-48xlarge": ("H100 SXM5 80GB", 8, 32, 100, 3200, "gpudirect", "h100-aws-p5-efa"),
    "aws-p4de-24xlarge": ("A100 SXM4 80GB", 8, 4, 100, 400, "gpudirect", "a100-aws-p4de-efa"),
    "gcp-a4": ("B200 SXM 180GB", 8, 8, 400, 3200, "gpudirect", "b200-sxm-hgx"),
    "aws-p6-b200-48xlarge": ("B200 SXM 180GB", 8, 8, 400, 3200, "gpudirect", "b200-sxm-hgx"),
    # NVL72 racks: the node is the 72-GPU NVLink domain (18 VMs of 4 GPUs), one NIC per GPU
    "azure-nd-gb200-v6": ("B200 (GB200 NVL72) 186GB", 72, 72, 400, 28800, "gpudirect", "gb200-nvl72-ndr400"),
    "azure-nd-gb300-v6": ("B300 (GB300 NVL72) 279GB", 72, 72, 800, 57600, "gpudirect", "gb300-nvl72-xdr800"),
    "gcp-a4x": ("B200 (GB200 NVL72) 186GB", 72, 72, 400, 28800, "gpudirect", "gb200-nvl72"),
    "aws-u-p6e-gb200x72": ("B200 (GB200 NVL72) 186GB", 72, 72, 400, 28800, "gpudirect", "gb200-nvl72"),
}
ALIASES = {"aws-p5-48xlarge": "h100-aws-p5-efa", "aws-p4de-24xlarge": "a100-aws-p4de-efa"}


def sourced(value: Any, path: str = "") -> Iterator[tuple[str, Sourced]]:
    """Every Sourced in a profile, found by walking its fields (models, dicts, lists)."""
    if isinstance(value, Sourced):
        yield path, value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from sourced(getattr(value, name), f"{path}.{name}" if path else name)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from sourced(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from sourced(item, f"{path}[{i}]")


def test_the_cloud_profiles_ship():
    assert set(CLOUD) <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_profile_loads(name):
    profile = load_profile(name)
    assert isinstance(profile, Profile) and profile.name == name and profile.description


@pytest.mark.parametrize("name", SHIPPED)
def test_every_sourced_value_has_a_source(name):
    values = list(sourced(load_profile(name)))
    assert len(values) >= 13
    for path, value in values:
        assert value.source.strip(), f"{name}: {path} has an empty source"
        assert "nccl-tests" not in value.source, f"{name}: {path}: no benchmark numbers as sources"


@pytest.mark.parametrize("name", SHIPPED)
def test_a_network_says_where_its_transport_and_protocols_come_from(name):
    network = load_profile(name).network
    if network is None:
        return
    assert network.protocols is None or (network.protocols_source or "").strip()
    if name in CLOUD and name not in ALIASES:
        assert (network.transport_source or "").strip(), f"{name}: transport without a source"


@pytest.mark.parametrize("name", sorted(CLOUD))
def test_cloud_profile_resolves_to_the_documented_machine(name):
    model, gpus, nics, gbits, node_gbits, transport, base = CLOUD[name]
    profile, parent = load_profile(name), load_profile(base)
    assert profile.gpu.model == model
    assert profile.gpus_per_node == gpus
    network = profile.network
    assert network is not None
    assert (network.nics_per_node.value, network.nic_gbits.value) == (nics, gbits)
    assert network.nics_per_node.value * network.nic_gbits.value == node_gbits
    assert network.transport == transport
    # the node's NCCL search is its base's: the cloud profiles change no NVLink value
    assert profile.section("nccl", NcclSpec) == parent.section("nccl", NcclSpec)
    assert profile.gpu.nvlink_gbps == parent.gpu.nvlink_gbps
    assert profile.node.kernel_launch_us is not None and profile.node.kernel_launch_us.value == 3.8


@pytest.mark.parametrize("alias,target", sorted(ALIASES.items()))
def test_instance_name_aliases_change_only_the_description(alias, target):
    profile, original = load_profile(alias), load_profile(target)
    assert profile.description != original.description
    assert {k: v for k, v in profile.as_data().items() if k not in ("name", "description")} == \
        {k: v for k, v in original.as_data().items() if k not in ("name", "description")}


def test_google_plugins_report_no_latency_and_restrict_protocols():
    high, mega = load_profile("gcp-a3-highgpu-8g").network, load_profile("gcp-a3-megagpu-8g").network
    assert high is not None and mega is not None
    for network, plugin in ((high, "nccl-plugin-gpudirecttcpx"), (mega, "nccl-plugin-gpudirect-tcpxo")):
        assert network.reported_latency_us is not None and network.reported_latency_us.value == 0
        assert plugin in network.reported_latency_us.source
        assert network.extra_latency_us is None, "no public per-step latency for TCPX/TCPXO"
        assert not network.gdr_flush
    assert high.protocols == ["Simple"] and mega.protocols == ["LL128", "Simple"]


def test_efa_profiles_take_aws_plugin_values_per_platform():
    """aws-ofi-nccl steers NCCL with a per-platform latency and its tuner model counts its own per
    step: P5's 75 and 20 us, P6-B200's (grouped with P5en) 35 and P5en's 18 us."""
    p5, p6 = load_profile("aws-p5-48xlarge").network, load_profile("aws-p6-b200-48xlarge").network
    assert p5 is not None and p6 is not None
    assert (p5.reported_latency_us.value, p5.extra_latency_us.value) == (75, 20)   # type: ignore[union-attr]
    assert (p6.reported_latency_us.value, p6.extra_latency_us.value) == (35, 18)   # type: ignore[union-attr]
    assert "P5en" in (p6.extra_latency_us.derived or "")                              # type: ignore[union-attr]
    assert p6.nccl_devices_per_node is not None and p6.nccl_devices_per_node.value == 8
    assert not p6.gdr_flush


def test_native_nccl_fabrics_set_no_plugin_values():
    for name in ("azure-nd-h100-v5", "oci-bm-gpu-h100-8", "oci-bm-gpu4-8", "azure-nd-gb200-v6", "azure-nd-gb300-v6",
                 "gcp-a4", "gcp-a4x"):
        network = load_profile(name).network
        assert network is not None
        assert network.extra_latency_us is None and network.reported_latency_us is None
        assert network.protocols is None
    # Hopper needs no flush of GPUDirect receives, Ampere does (NCCL's ncclTopoNeedFlush)
    assert not load_profile("oci-bm-gpu-h100-8").network.gdr_flush   # type: ignore[union-attr]
    assert load_profile("oci-bm-gpu4-8").network.gdr_flush            # type: ignore[union-attr]


def test_a100_40gb_overrides_memory_and_keeps_compute():
    a100_40, a100_80 = load_profile("oci-bm-gpu4-8"), load_profile("a100-sxm-hgx")
    assert a100_40.gpu.memory_gib.value == 40 and a100_40.gpu.memory_bandwidth_gbps.value == 1555
    achievable = a100_40.section("gpu.achievable", AchievableSpec)
    assert achievable is not None and achievable.hbm_gbps.value <= a100_40.gpu.memory_bandwidth_gbps.value
    assert a100_40.gpu.peak_tflops == a100_80.gpu.peak_tflops
    assert a100_40.node.cpu_vendor == "amd"


def test_node_profiles_give_launch_and_pcie():
    expected = {"h100-sxm-hgx": 64, "h200-sxm-hgx": 64, "a100-sxm-hgx": 32}
    for name, pcie in expected.items():
        node = load_profile(name).node
        assert node.kernel_launch_us is not None and node.kernel_launch_us.value == 3.8
        assert "cuda-graphs" in node.kernel_launch_us.source
        assert node.pcie_gbps is not None and node.pcie_gbps.value == pcie
        assert node.pcie_gbps.note and "direction" in node.pcie_gbps.note
