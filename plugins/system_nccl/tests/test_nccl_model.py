"""NCCL's cost model (chakra_sim_system_nccl.model): NCCL's published tuning numbers, its choices,
and physics: no collective beats the bandwidth of the links it must cross."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from chakra_sim_system_nccl import model as nccl
from chakra_sim_system_nccl.section import Calibration, NcclSpec
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
    spec = profile.section("nccl", NcclSpec)
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
    assert (choice.algorithm, choice.protocol) == ("tree", "Simple")
    # ... plus the first 1 KiB chunk stored and forwarded along 14 NVLink hops at NCCL's per-channel
    # tree ceiling for 2 Ampere nodes (23.6 GB/s) and 2 network hops (50 GB/s of EFA, one channel)
    fill = 14 * 1024 / (1000 * 23.6) + 2 * 1024 / (1000 * 50)
    assert choice.latency_us == pytest.approx(priced[("tree", "Simple")].latency_us + fill)


def test_two_node_tree_gets_twice_the_nic_rate_inside_the_node_and_pays_its_fill():
    """search.cc lets a tree's NVLink chain run at twice the NIC rate and tuning.cc reads that rate
    for 2 nodes, so NCCL's tree beats the ring on 2 p4de nodes at 2 GiB, as the measured 78 GB/s of
    bus bandwidth (above the 50 GB/s a ring's crossing could carry) shows; a Simple tree fills its
    pipeline one whole chunk per hop."""
    p4de = nccl.NcclModel(load_profile("a100-aws-p4de-efa"))
    pairs = {(p.algorithm, p.protocol): p for p in p4de.pairs(nccl.ALL_REDUCE, 16, 2)}
    assert pairs[("tree", "Simple")].bandwidth_gbps > pairs[("ring", "Simple")].bandwidth_gbps
    big = p4de.time_us(nccl.ALL_REDUCE, 2**31, 16, 2)
    assert big.algorithm == "tree"
    assert 2**31 / (1000 * big.time_us) <= 50.0     # never beyond a node's four 100 Gb/s NICs
    # 8 MiB: one 512 KiB chunk per hop over 8 channels
    mid = p4de.time_us(nccl.ALL_REDUCE, 2**23, 16, 2)
    fill = 14 * 2**19 / (1000 * 23.6) + 2 * 2**19 / (1000 * 50 / 8)
    assert mid.latency_us >= fill
    assert mid.time_us >= fill + 2**23 / (1000 * 50)


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


# -- what NCCL executes (chakra_sim_system_nccl.execution) ------------------------------------------

def test_ring_runs_every_loop_of_steps_and_small_chunks_pay_their_syncs():
    from chakra_sim_system_nccl import execution

    # 24 channels x 8 ranks x 2 MiB chunks: one loop up to 384 MiB, then one more per 384 MiB
    one = model().time_us(nccl.ALL_GATHER, 256 * 2**20, 8, 1)
    three = model().time_us(nccl.ALL_GATHER, 2**30, 8, 1)
    assert (one.steps, three.steps) == (7, 21)
    assert one.chunk_bytes == execution.ring_chunk("Simple", 256 * 2**20 // 24 + 1, 8)[0]
    # a Simple slice waits for its flag: smaller slices reach less of the link
    assert model().time_us(nccl.ALL_GATHER, 32 * 2**20, 8, 1).bandwidth_gbps < three.bandwidth_gbps


def test_nvls_bandwidth_grows_with_the_chunk_nccl_moves():
    sizes = (4 * 2**20, 32 * 2**20, 512 * 2**20, 2**31)   # 16, 32, 64, 128 KiB chunks
    choices = [model().time_us(nccl.ALL_REDUCE, size, 8, 1) for size in sizes]
    assert [c.chunk_bytes for c in choices] == [16384, 32768, 65536, 131072]
    rates = [c.bandwidth_gbps for c in choices]
    assert rates == sorted(rates) and rates[0] < 0.8 * rates[-1]
    # and never beyond the NVLS graph's bandwidth: bwInter caps each of the 8 heads
    spec = load_profile(H100).section("nccl", NcclSpec)
    assert rates[-1] <= spec.nvls_inter_bw_gbps.value * 8 * 8 / 14 + 1e-9


def test_one_thread_driving_eight_gpus_launches_eight_kernels_per_collective():
    profile = load_profile(H100)
    launch = profile.node.kernel_launch_us.value if profile.node.kernel_launch_us else 3.8
    node = profile.node.model_copy(update={"kernel_launch_us": profile.node.kernel_launch_us
                                           or type(profile.gpu.nvlink_links)(value=3.8, source="test")})
    profile = profile.model_copy(update={"node": node})
    per_process = nccl.NcclModel(profile).time_us(nccl.ALL_REDUCE, 1024, 8, 1)
    one_thread = nccl.NcclModel(profile, gpus_per_thread=8).time_us(nccl.ALL_REDUCE, 1024, 8, 1)
    graphed = nccl.NcclModel(profile, gpus_per_thread=8, cuda_graph=True).time_us(nccl.ALL_REDUCE, 1024, 8, 1)
    assert one_thread.time_us == pytest.approx(8 * launch)
    assert per_process.time_us < one_thread.time_us and graphed.time_us == per_process.time_us
    big = 2**30   # the GPU, not the host, bounds large messages
    assert nccl.NcclModel(profile, gpus_per_thread=8).time_us(nccl.ALL_REDUCE, big, 8, 1).time_us == \
        pytest.approx(nccl.NcclModel(profile).time_us(nccl.ALL_REDUCE, big, 8, 1).time_us)


def test_calibrated_parameters_act_where_they_belong():

    base = load_profile("h100-hgx-ndr400")

    def timed(calibration, nodes, size=64 * 2**20):
        profile = base.with_section("calibration", calibration)
        return nccl.NcclModel(profile).time_us(nccl.ALL_REDUCE, size, 8 * nodes, nodes).time_us

    slow_nvlink = Calibration(source="t", nvlink_efficiency=0.5)
    slow_nic = Calibration(source="t", nic_efficiency=0.5)
    assert timed(slow_nvlink, 1) > 1.5 * timed(None, 1) and timed(slow_nic, 1) == timed(None, 1)
    assert timed(slow_nic, 4) > 1.5 * timed(None, 4)
    far = Calibration(source="t", network_latency_us=50.0)
    assert timed(far, 4, 4096) > timed(None, 4, 4096) + 50 and timed(far, 1, 4096) == timed(None, 1, 4096)


def test_host_staged_transfers_cross_pcie_and_cost_more_than_gpudirect():
    from chakra_core.hardware.profiles import Profile, Sourced

    direct = load_profile("h100-hgx-ndr400")
    data = direct.model_dump()
    data["network"]["transport"] = "host_staged"
    data["node"]["pcie_gbps"] = None
    with pytest.raises(ValueError, match="node.pcie_gbps"):
        Profile.model_validate(data)
    data["node"]["pcie_gbps"] = Sourced(value=25.0, source="test").model_dump()   # slower than a 50 GB/s NIC
    staged = Profile.model_validate(data).with_section("nccl", direct.section("nccl", NcclSpec))   # the core's copy
    for size in (4096, 2**26):
        fast = nccl.NcclModel(direct).time_us(nccl.ALL_REDUCE, size, 32, 4)
        slow = nccl.NcclModel(staged).time_us(nccl.ALL_REDUCE, size, 32, 4)
        assert slow.time_us > fast.time_us
    assert nccl.NcclModel(staged).time_us(nccl.ALL_REDUCE, 2**26, 8, 1).time_us == \
        nccl.NcclModel(direct).time_us(nccl.ALL_REDUCE, 2**26, 8, 1).time_us   # one node: no network
