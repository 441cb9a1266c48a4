"""NCCL's tuner on Blackwell (compute capability 10.0): the Blackwell rows of its cost-model tables
(NVIDIA/nccl src/tuning/cost_model.cc and nvls.cc at 1fc949c5, = v2.30.7-1), and the NVLS graph of an
NVLink domain larger than NCCL_MAX_NVLS_ARITY GPUs."""

from __future__ import annotations

import pytest

from chakra_sim_system_nccl import model as nccl
from chakra_sim_system_nccl import tuning
from chakra_sim_system_nccl.section import NcclSpec
from chakra_core.hardware.profiles import load_profile


def pairs(name: str, collective: str, ranks: int, nodes: int) -> dict[tuple[str, str], tuning.Pair]:
    return {(p.algorithm, p.protocol): p for p in nccl.NcclModel(load_profile(name)).pairs(collective, ranks, nodes)}


def test_blackwell_rows_of_nccls_tables():
    arch = tuning.ARCH_INDEX["blackwell"]
    assert tuning.LL_MAX_BW[arch] == (282.0, 90.0, 70.0)            # 2 x Hopper's
    assert tuning.PER_CH_MAX_RING_LL128_BW[arch] == (40.0, 40.0, 40.0)
    assert tuning.PER_CH_MAX_TREE_LL128_BW[arch] == (55.6, 31.67, 20.0)
    assert tuning.PER_CH_MAX_TREE_BW[arch] == (70.0, 42.8, 24.0)
    assert tuning.PER_CH_MAX_NVLS_TREE_BW[arch] == (0.0, 96.0, 80.0)
    assert tuning.NVLS_EFFICIENCY[arch] == 0.74


def test_a_b200_node_is_tuned_with_the_blackwell_rows():
    profile = load_profile("b200-sxm-hgx")
    spec = profile.section("nccl", NcclSpec)
    assert spec is not None and spec.nvls_bus_bw_gbps is not None and spec.nvls_inter_bw_gbps is not None
    bus = spec.graph_channels.value * spec.channel_bw_gbps.value          # 16 x 45
    found = pairs("b200-sxm-hgx", nccl.ALL_REDUCE, 8, 1)
    assert found[("ring", "LL")].bandwidth_gbps == pytest.approx(min(282.0, bus * 0.5) * 8 / 14)
    assert found[("ring", "LL128")].bandwidth_gbps == pytest.approx(min(bus * 0.92, 16 * 40.0) * 8 / 14)
    head = spec.nvls_bus_bw_gbps.value / 8
    nvls_bus = min(head * 0.74 * 7 / 8 * 2, spec.nvls_inter_bw_gbps.value) * 8
    assert found[("nvls", "Simple")].bandwidth_gbps == pytest.approx(nvls_bus * 8 / 14)
    assert found[("nvls", "Simple")].channels == 24                       # NVLS_NCHANNELS_SM100_NVL


def test_the_nvls_graph_of_a_72_gpu_domain_has_32_heads():
    rack = load_profile("gb200-nvl72")
    assert tuning.nvls_heads(rack) == 32 and tuning.nvls_heads(load_profile("b200-sxm-hgx")) == 8
    channels, bw_intra, _, _ = tuning.graph(rack, tuning.NVLS, 1, False, 1.0)
    assert (channels, bw_intra) == (32, 20.0)


def test_a_72_gpu_domain_is_one_nccl_node_its_collectives_cross_no_network():
    for pair in pairs("gb200-nvl72-ndr400", nccl.ALL_REDUCE, 72, 1).values():
        assert pair.inter_hops == 0 and pair.inter_gbps == float("inf")


def test_more_search_channels_from_hopper_on():
    # connect.cc ncclTopoPostset: minCompCap >= 90 doubles fast channels once more below 16
    b200, a100 = load_profile("b200-hgx-ndr400"), load_profile("a100-hgx-hdr200")
    assert tuning.comm_channels(b200, 4, 50.0) == 16 and tuning.comm_channels(a100, 4, 50.0) == 8
