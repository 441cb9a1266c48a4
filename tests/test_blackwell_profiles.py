"""Blackwell profiles (issue 35, item 1): HGX B200, GB200 NVL72 and GB300 NVL72 load, their numbers are
their sources' (spot checks naming each source), every achievable rate that is not a measurement of the
part says how it was derived, and a B200 job beats the H100's step below 100% MFU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chakra_sim_compute_achievable import AchievableSpec
from chakra_sim_compute_achievable.provenance import derived_rates
from chakra_sim_system_nccl import NcclSpec
from chakra_core.hardware.profiles import Profile, load_profile
from chakra_core.run import load, simulate

BLACKWELL = ("b200-sxm-hgx", "b200-hgx-ndr400", "gb200-nvl72", "gb200-nvl72-ndr400", "gb300-nvl72",
             "gb300-nvl72-xdr800")
MLE = "stas00/ml-engineering compute/accelerator/README.md @744d01e18b79512572f64a6bbd8b5f4a725203a7"


def achievable(profile: Profile) -> AchievableSpec:
    found = profile.section("gpu.achievable", AchievableSpec)
    assert found is not None
    return found


@pytest.mark.parametrize("name", BLACKWELL)
def test_every_blackwell_profile_loads_as_blackwell_and_states_its_own_rates(name):
    profile = load_profile(name)
    assert profile.gpu.architecture == "blackwell" and profile.inherited_rates == []
    ach = achievable(profile)
    for dtype in ("bf16", "fp8", "mxfp8", "nvfp4"):
        assert 0 < ach.matmul_tflops[dtype].value < profile.gpu.peak_tflops[dtype].value, dtype
    assert profile.gpu.peak_tflops["mxfp8"].value == profile.gpu.peak_tflops["fp8"].value
    assert profile.gpu.nvlink_links.value == 18 and profile.gpu.nvlink_gbps.value == 900


def test_b200_numbers_are_its_sources():
    b200 = load_profile("b200-sxm-hgx")
    peaks = b200.gpu.peak_tflops
    # ml-engineering's TFLOPS table (w/o sparsity), row NVIDIA B200 SXM
    assert (peaks["bf16"].value, peaks["fp8"].value, peaks["tf32"].value, peaks["nvfp4"].value) == (2250, 4500, 1125, 9000)
    assert MLE in peaks["bf16"].source and "'NVIDIA B200 SXM'" in peaks["bf16"].source
    assert "144 petaFLOPS FP4" in peaks["nvfp4"].source
    # NVIDIA's Blackwell datasheet (HGX B200 column) as pytorch/pytorch PR 194297 quotes it; the driver's bus width
    assert b200.gpu.memory_bandwidth_gbps.value == 7700
    assert "dram_bw_gbs=7700" in b200.gpu.memory_bandwidth_gbps.source and "7.672 TB/s" in b200.gpu.memory_bandwidth_gbps.source
    # DGX B200 user guide: 1,440 GB over 8 GPUs; pytorch/ao PR 4002's device query
    assert b200.gpu.memory_gib.value == 180 and "1,440 GB total GPU memory" in b200.gpu.memory_gib.source
    assert b200.gpu.usable_memory_gib is not None and b200.gpu.usable_memory_gib.value == 178.35
    assert "'Total Global Memory: 178.35 GB'" in b200.gpu.usable_memory_gib.source
    ach = achievable(b200)
    assert ach.sm_count.value == 148 and "'Number of SMs: 148'" in ach.sm_count.source
    # mamf-finder's measured B200 rows
    assert ach.matmul_tflops["bf16"].value == 1745.0 and "MAMF 1745.0 of 2250 (77.6%)" in ach.matmul_tflops["bf16"].source
    assert ach.matmul_tflops["fp8"].value == 3432.5 and "MAMF 3432.5 of 4500 (76.3%)" in ach.matmul_tflops["fp8"].source
    assert b200.node.gpus.value == 8 and "docs.nvidia.com/dgx/dgxb200-user-guide" in b200.node.gpus.source
    net = load_profile("b200-hgx-ndr400").network
    assert net is not None and (net.nics_per_node.value, net.nic_gbits.value, net.gdr_flush) == (8, 400, False)
    assert "8 x NVIDIA ConnectX-7 Single Port Cards" in net.nics_per_node.source


def test_gb200_and_gb300_racks_are_their_sources():
    gb200, gb300 = load_profile("gb200-nvl72"), load_profile("gb300-nvl72")
    for rack in (gb200, gb300):
        assert rack.gpus_per_node == 72 and "72-GPU NVL domains" in rack.node.gpus.source
        assert rack.node.cpu_vendor == "arm" and "Grace" in (rack.node.cpu_source or "")
        assert (rack.peak_flops("bf16"), rack.peak_flops("fp8")) == (2500e12, 5000e12)
        assert rack.gpu.memory_bandwidth_gbps.value == 8000
    assert gb200.gpu.peak_tflops["nvfp4"].value == 10000 and "'NVIDIA GB200 SXM'" in gb200.gpu.peak_tflops["nvfp4"].source
    assert gb300.gpu.peak_tflops["nvfp4"].value == 15000 and "'NVIDIA GB300 SXM'" in gb300.gpu.peak_tflops["nvfp4"].source
    assert gb200.gpu.memory_gib.value == 186 and "'NVIDIA GB200 SXM'" in gb200.gpu.memory_gib.source
    assert gb300.gpu.memory_gib.value == 279 and "GPU Memory 279 GB HBM3E" in gb300.gpu.memory_gib.source
    # GB200: measured; GB300: the B300's measured fraction on its peak, said so
    bf16_200, bf16_300 = achievable(gb200).matmul_tflops["bf16"], achievable(gb300).matmul_tflops["bf16"]
    assert bf16_200.value == 1822.0 and bf16_200.derived is None and "MAMF 1822.0 of 2500" in bf16_200.source
    assert bf16_300.value == pytest.approx(1769.0 / 2250 * 2500, abs=0.05) and "B300" in (bf16_300.derived or "")
    # the Grace host launches at the x86 host's rate slowed by TransformerEngine issue #2053's Grace/Xeon ratio
    x86 = achievable(load_profile("h100-sxm-hgx")).host_launch_us
    assert x86 is not None
    for rack in (gb200, gb300):
        grace = achievable(rack).host_launch_us
        assert grace is not None and grace.value == pytest.approx(x86.value * 37.08 / 13.48, abs=0.005)
        assert "TransformerEngine/issues/2053" in grace.source and "37.08 us on GB200" in grace.source
        assert "13.48 us on an H100 DGX" in grace.source and grace.derived
    nets = load_profile("gb200-nvl72-ndr400").network, load_profile("gb300-nvl72-xdr800").network
    assert nets[0] is not None and (nets[0].nics_per_node.value, nets[0].nic_gbits.value) == (72, 400)
    assert "4x NVIDIA ConnectX-7 single port 400G OSFP NIC" in nets[0].nics_per_node.source
    assert nets[1] is not None and (nets[1].nics_per_node.value, nets[1].nic_gbits.value) == (72, 800)
    assert "supports 800Gb/s or XDR IB" in nets[1].nic_gbits.source


@pytest.mark.parametrize("name", ["b200-sxm-hgx", "gb200-nvl72", "gb300-nvl72"])
def test_nccl_sections_follow_nccls_sm100_search(name):
    profile = load_profile(name)
    nccl = profile.section("nccl", NcclSpec)
    assert nccl is not None and nccl.nvls_bus_bw_gbps is not None and nccl.nvls_inter_bw_gbps is not None
    per_gpu = profile.gpu.nvlink_links.value * 40.1          # src/graph/topo.h SM100_NVLINK_BW
    assert (nccl.graph_channels.value, nccl.channel_bw_gbps.value, nccl.channels.value) == (16, 45, 32)
    assert nccl.graph_channels.value * nccl.channel_bw_gbps.value <= per_gpu
    heads = min(32, profile.gpus_per_node)                   # NCCL_MAX_NVLS_ARITY
    head_bw = nccl.nvls_bus_bw_gbps.value / heads
    assert (heads + 1) * head_bw <= per_gpu                   # a head's link carries every head once, its own twice
    assert nccl.nvls_channels is not None and nccl.nvls_channels.value == 24   # NVLS_NCHANNELS_SM100_NVL


def test_derived_rates_say_how_and_measured_ones_do_not():
    ach = achievable(load_profile("b200-sxm-hgx"))
    derived = derived_rates(ach)
    measured = {"gpu.achievable.matmul_tflops.bf16", "gpu.achievable.matmul_tflops.fp8", "gpu.achievable.sm_count"}
    assert not measured & set(derived)
    assert {"gpu.achievable.hbm_gbps", "gpu.achievable.sustained_fraction", "gpu.achievable.attention.bf16.forward",
            "gpu.achievable.matmul_tflops.nvfp4"} <= set(derived)
    assert "H200's STREAM fraction" in derived["gpu.achievable.hbm_gbps"]
    assert all(how.strip() for how in derived.values())


def job(profile: str, precision: str) -> dict[str, Any]:
    return {"job": {"name": "llama3-8b", "model": "llama3-8b",
                    "training": {"seq": 8192, "global_batch": 8, "micro_batch": 1, "precision": precision},
                    "cluster": {"gpus": 8, "profile": profile}},
            "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_a_b200_step_beats_the_h100s_below_its_peak_and_lists_its_derived_rates(tmp_path: Path, precision):
    results = {}
    for profile in ("b200-hgx-ndr400", "h100-hgx-ndr400"):
        document = simulate(load(job(profile, precision), base_dir=tmp_path, out_dir=tmp_path / profile)).document
        results[profile] = document
        assert not any("inherited" in w for w in document["warnings"])
    b200, h100 = results["b200-hgx-ndr400"], results["h100-hgx-ndr400"]
    assert 0 < b200["training"]["mfu"] < 1
    assert b200["training"]["tflops_per_gpu"] <= load_profile("b200-sxm-hgx").peak_flops(precision) / 1e12
    assert b200["training"]["step_time_s"] < h100["training"]["step_time_s"]
    assert "gpu.achievable.hbm_gbps" in b200["layers"]["compute"]["summary"]["derived_rates"]
    assert "derived_rates" not in h100["layers"]["compute"]["summary"]   # the H100's results are unchanged
