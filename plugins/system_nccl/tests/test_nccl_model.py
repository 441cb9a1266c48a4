"""NCCL's cost model (chakra_sim_system_nccl.model): NCCL's published tuning numbers, its choices,
and physics: no collective beats the bandwidth of the links it must cross."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from chakra_sim_system_nccl import model as nccl
from chakra_core.hardware.profiles import builtin_profiles, load_profile

H100 = "h100-sxm-hgx"


def model(name: str = H100) -> nccl.NcclModel:
    return nccl.NcclModel(load_profile(name))


def test_single_node_latencies_are_nccls_tables():
    # cost_model.cc: ring latency = baseLat + nsteps x hwLat(NVLink); NVLS = hwLat(NVLS) alone
    pairs = {(p.algorithm, p.protocol): p for p in model().pairs(nccl.ALL_REDUCE, 8, 1)}
    assert pairs[("ring", "LL")].latency_us == pytest.approx(6.6 + 14 * 0.6)
    assert pairs[("ring", "Simple")].latency_us == pytest.approx(8.4 + 14 * 3.4)
    assert pairs[("tree", "LL")].latency_us == pytest.approx(6.8 + 2 * 7 * 0.6)
    assert pairs[("tree", "Simple")].latency_us == pytest.approx(8.4 + 2 * 7 * 4.0)
    assert pairs[("nvls", "Simple")].latency_us == pytest.approx(25.0)


def test_single_node_bandwidths_follow_nccls_refinements():
    profile = load_profile(H100)
    spec = profile.nccl
    bus = spec.graph_channels.value * spec.channel_bw_gbps.value
    pairs = {(p.algorithm, p.protocol): p for p in model().pairs(nccl.ALL_REDUCE, 8, 1)}
    assert pairs[("ring", "Simple")].bandwidth_gbps == pytest.approx(bus * 8 / 14)
    assert pairs[("ring", "LL")].bandwidth_gbps == pytest.approx(min(141.0, bus * 0.5) * 8 / 14)
    # NVLS: nvlsEfficiency x (n-1)/n x 2 of each head's bwIntra, capped by bwInter, x heads
    head = spec.nvls_bus_bw_gbps.value / 8
    nvls_bus = min(head * 0.85 * 7 / 8 * 2, spec.nvls_inter_bw_gbps.value) * 8
    assert pairs[("nvls", "Simple")].bandwidth_gbps == pytest.approx(nvls_bus * 8 / 14)


def test_efa_chooses_with_the_reported_latency_and_prices_with_the_real_one():
    p4de = nccl.NcclModel(load_profile("a100-aws-p4de-efa"))
    chosen = {(p.algorithm, p.protocol): p for p in p4de.pairs(nccl.ALL_REDUCE, 16, 2)}
    priced = {(p.algorithm, p.protocol): p for p in p4de.pairs(nccl.ALL_REDUCE, 16, 2, priced=True)}
    assert {protocol for _, protocol in chosen} == {"Simple"}     # the plugin sets NCCL_PROTO=simple
    # tree: 2 x (7 NVLink hops + 1 network hop); the network hop = hwLat + latency, twice with the flush
    assert chosen[("tree", "Simple")].latency_us == pytest.approx(8.4 + 2 * (7 * 4.0 + (14 + 2 * 75)))
    assert priced[("tree", "Simple")].latency_us == pytest.approx(8.4 + 2 * (7 * 4.0 + (14 + 2 * 20)))
    choice = p4de.time_us(nccl.ALL_REDUCE, 1024, 16, 2)
    assert choice.latency_us == pytest.approx(priced[(choice.algorithm, choice.protocol)].latency_us)


def test_choices_by_size_and_hardware():
    h100, a100 = model(), model("a100-sxm-hgx")
    assert (h100.time_us(nccl.ALL_REDUCE, 1024, 8, 1).algorithm,
            h100.time_us(nccl.ALL_REDUCE, 1024, 8, 1).protocol) == ("ring", "LL")
    assert h100.time_us(nccl.ALL_REDUCE, 2**30, 8, 1).algorithm == "nvls"
    big = a100.time_us(nccl.ALL_REDUCE, 2**30, 8, 1)   # no NVLink SHARP on A100
    assert (big.algorithm, big.protocol) == ("ring", "Simple")


def test_small_messages_run_on_fewer_channels():
    small = model().time_us(nccl.ALL_REDUCE, 4096, 8, 1)
    large = model().time_us(nccl.ALL_REDUCE, 256 * 1024, 8, 1)
    assert small.channels == 1 and large.channels > small.channels


def test_nvls_chunk_sizes_follow_calccollchunking():
    # 16 channels x 8 heads: 64 KiB chunks below 1 GiB, 32 KiB below 64 MiB, 16 KiB below 8 MiB
    assert nccl.nvls_chunk_size(2**30, 16, 8) == 131072
    assert nccl.nvls_chunk_size(2**30 - 1, 16, 8) == 65536
    assert nccl.nvls_chunk_size(64 * 2**20 - 1, 16, 8) == 32768
    assert nccl.nvls_chunk_size(8 * 2**20 - 1, 16, 8) == 16384


def test_unknown_collective_is_named():
    with pytest.raises(ValueError, match="unknown collective 'gather'"):
        model().time_us("gather", 1024, 8, 1)


def _per_gpu_link_bound_us(profile, collective: str, nbytes: int, ranks: int, nodes: int) -> float:
    """Time the busiest link needs at its nominal rate (spec sheet, no NCCL efficiency)."""
    nvlink = profile.gpu.nvlink_gbps.value
    intra = {nccl.ALL_REDUCE: nbytes * (ranks - 1) / ranks,    # NVLS: the switch reduces; S out, S in at best
             nccl.ALL_GATHER: nbytes * (ranks - 1) / ranks, nccl.REDUCE_SCATTER: nbytes * (ranks - 1) / ranks,
             nccl.ALL_TO_ALL: nbytes * (ranks // nodes - 1) / ranks}[collective]
    bound = intra / (1000 * nvlink) if ranks // nodes > 1 else 0.0
    if nodes > 1:
        network = profile.network
        node_bw = network.nics_per_node.value * network.nic_gbits.value / 8
        per_node = {nccl.ALL_REDUCE: 2 * nbytes * (nodes - 1) / nodes,
                    nccl.ALL_GATHER: nbytes * (nodes - 1) / nodes,
                    nccl.REDUCE_SCATTER: nbytes * (nodes - 1) / nodes,
                    nccl.ALL_TO_ALL: nbytes * (ranks - ranks // nodes) / ranks * (ranks // nodes)}[collective]
        factor = 1 if collective != nccl.ALL_REDUCE else 0.5   # in-network (NVLS) halves it at best
        bound = max(bound, factor * per_node / (1000 * node_bw))
    return bound


@settings(max_examples=200, deadline=None)
@given(profile_name=st.sampled_from(builtin_profiles()),
       collective=st.sampled_from([nccl.ALL_REDUCE, nccl.ALL_GATHER, nccl.REDUCE_SCATTER, nccl.ALL_TO_ALL]),
       log_size=st.integers(3, 36), nodes=st.sampled_from([1, 2, 4, 16]))
def test_no_collective_beats_its_links(profile_name, collective, log_size, nodes):
    profile = load_profile(profile_name)
    if nodes > 1 and profile.network is None:
        nodes = 1
    ranks = profile.gpus_per_node * nodes
    nbytes = 2**log_size
    choice = nccl.NcclModel(profile).time_us(collective, nbytes, ranks, nodes)
    assert choice.time_us > 0
    assert choice.time_us >= _per_gpu_link_bound_us(profile, collective, nbytes, ranks, nodes)
    assert choice.latency_us >= 0 and choice.bandwidth_gbps > 0
