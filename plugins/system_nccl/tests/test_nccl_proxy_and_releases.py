"""Across nodes, NCCL's proxy thread posts every network step (chakra_sim_system_nccl.execution.proxy_us),
and the NCCL release that ran chooses with its own tuner tables (chakra_sim_system_nccl.tuning.TUNERS)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from chakra_sim_system_nccl.section import Calibration, NcclSpec
from chakra_core.hardware.profiles import builtin_profiles, load_profile
from chakra_sim_system_nccl import execution, model as nccl, tuning
from chakra_sim_system_nccl.nccl_tests import parse
from chakra_sim_system_nccl.nccl_tests_scan import version_of_code
from nccl_logs import synthetic_log

NDR = "h100-hgx-ndr400"


def with_post(name: str, post_us: float | None) -> nccl.NcclModel:
    profile = load_profile(name)
    if post_us is not None:
        profile = profile.with_section("calibration", Calibration(source="test", proxy_post_us=post_us))
    return nccl.NcclModel(profile)


# -- the proxy thread ----------------------------------------------------------------------------

def test_network_steps_per_channel_follow_the_algorithm():
    # ring: every step crosses each node boundary once, a send out and a receive in, per slice
    ring = execution.plan("ring", nccl.ALL_GATHER, "LL128", 4 << 20, 32, 4, 24)
    assert ring.net_steps == 2 * 31 * 1
    simple = execution.plan("ring", nccl.ALL_GATHER, "Simple", 128 << 20, 32, 4, 24)
    assert simple.net_steps == 2 * 31 * 2   # two slices a chunk (ALLGATHER_CHUNKSTEPS / SLICESTEPS)
    # tree: each chunk up and down the N - 1 edges, a send and a receive each, shared by N nodes
    tree = execution.plan("tree", nccl.ALL_REDUCE, "LL128", 4 << 20, 32, 4, 24)
    chunks = math.ceil((4 << 20) / 24 / tree.chunk_bytes)
    assert tree.net_steps == pytest.approx(chunks * 4 * 3 / 4)
    assert execution.plan("ring", nccl.ALL_GATHER, "LL128", 4 << 20, 8, 1, 24).net_steps == 0


def test_small_chunks_across_nodes_wait_for_the_proxy_thread():
    # 4 x 8 H100, all-gather of 4 MiB: ring/LL128 on 16 channels moves 8 KiB chunks; each of the 8
    # proxies posts 31 steps x 2 ends x 2 channels at NCCL's 1 µs (Intel host)
    base = with_post(NDR, None)
    choice = base.time_us(nccl.ALL_GATHER, 4 << 20, 32, 4)
    assert (choice.algorithm, choice.protocol, choice.channels) == ("ring", "LL128", 16)
    proxy = execution.proxy_us(2 * 31, 16, 8, 1.0)
    assert proxy == pytest.approx(124.0)
    assert choice.time_us == pytest.approx(choice.latency_us + proxy)
    # a slower host is slower by exactly the proxy's share; one node has no proxy work
    assert with_post(NDR, 2.0).time_us(nccl.ALL_GATHER, 4 << 20, 32, 4).time_us == \
        pytest.approx(choice.latency_us + 2 * proxy)
    assert with_post(NDR, 2.0).time_us(nccl.ALL_GATHER, 4 << 20, 8, 1).time_us == \
        base.time_us(nccl.ALL_GATHER, 4 << 20, 8, 1).time_us
    # large chunks are bound by the NICs, not by the proxy
    big = base.time_us(nccl.ALL_GATHER, 8 << 30, 32, 4)
    assert big.time_us == with_post(NDR, 0.0).time_us(nccl.ALL_GATHER, 8 << 30, 32, 4).time_us


def test_channels_across_nodes_are_the_nics_search_doubled():
    # ncclTopoPostset doubles the search's channels; Hopper doubles again above 45 GB/s under 16
    ndr = load_profile(NDR)
    assert tuning.graph(ndr, "ring", 4, True, 1.0)[:2] == (8, 45.0)    # 8 NICs; NVLink caps 360/8
    assert tuning.comm_channels(ndr, 8, 45.0) == 16
    assert tuning.comm_channels(ndr, 2, 46.0) == 8                     # 2 x 2, doubled again
    # one GPU a node: its one 50 GB/s NIC, duplicated at half the bandwidth (ncclTopoDupChannels), x 2
    channels, bw = tuning.graph(ndr, "ring", 4, True, 1 / 8)[:2]
    assert (channels, bw) == (2, 25.0) and tuning.comm_channels(ndr, channels, bw) == 4
    # p5: the EFA plugin groups each GPU's 4 network cards into one device (32 cards, 8 devices)
    p5 = load_profile("h100-aws-p5-efa")
    assert tuning.graph(p5, "ring", 2, True, 1.0)[:2] == (8, 45.0)
    # p4de: 4 x 100 Gb/s cards, slower than 25 GB/s, not duplicated: 8 channels
    p4de = load_profile("a100-aws-p4de-efa")
    assert tuning.graph(p4de, "ring", 2, True, 1.0)[:2] == (4, 12.5)
    assert nccl.NcclModel(p4de).time_us(nccl.ALL_REDUCE, 64 << 20, 16, 2).channels == 8
    # one node keeps the intra-node search's channels
    assert nccl.NcclModel(ndr).time_us(nccl.ALL_GATHER, 64 << 20, 8, 1).channels == 24


def test_spec_post_cost_is_nccls_by_cpu_vendor():
    assert with_post(NDR, None).proxy_post_us() == 1.0                    # Intel (DGX H100)
    assert with_post("h100-aws-p5-efa", None).proxy_post_us() == 2.0      # AMD EPYC (p5)


def test_fewer_gpus_on_a_node_means_fewer_proxies_for_the_same_steps():
    model = with_post(NDR, None)
    whole = model.time_us(nccl.ALL_REDUCE, 1 << 20, 32, 4, 1.0)      # 8 GPUs a node
    sparse = model.time_us(nccl.ALL_REDUCE, 1 << 20, 8, 4, 0.25)     # 2 GPUs a node
    assert sparse.time_us > whole.time_us


def test_messages_across_nodes_post_each_network_chunk():
    # NCCL_P2P_NET_CHUNKSIZE: 128 KiB chunks (a half below 1 MiB, a quarter below 128 KiB)
    assert [execution.p2p_chunk(n) for n in (4096, 256 << 10, 4 << 20)] == [32768, 65536, 131072]
    slow = with_post(NDR, 30.0)   # a host far slower than NCCL's figure: the proxy bounds a 64 MiB send
    assert slow.p2p_transfer_us(64 << 20, same_node=False) == pytest.approx(512 * 30.0)
    assert slow.p2p_transfer_us(64 << 20, same_node=True) == \
        with_post(NDR, None).p2p_transfer_us(64 << 20, same_node=True)
    spec = with_post(NDR, None)   # at NCCL's 1 µs the NIC share bounds it
    assert spec.p2p_transfer_us(64 << 20, same_node=False) == pytest.approx((64 << 20) / (1000 * 50.0))


@settings(max_examples=150, deadline=None)
@given(profile_name=st.sampled_from([p for p in builtin_profiles() if load_profile(p).network is not None]),
       collective=st.sampled_from([nccl.ALL_REDUCE, nccl.ALL_GATHER, nccl.REDUCE_SCATTER, nccl.BROADCAST]),
       log_size=st.integers(10, 34), nodes=st.sampled_from([2, 4, 16]), post=st.floats(0.0, 8.0))
def test_proxy_cost_never_speeds_a_collective_up(profile_name, collective, log_size, nodes, post):
    """More proxy time per step never makes a collective faster, and its time never beats the
    proxy's own bound."""
    ranks = load_profile(profile_name).gpus_per_node * nodes
    cheap = with_post(profile_name, post).time_us(collective, 2**log_size, ranks, nodes)
    dear = with_post(profile_name, post + 1.0).time_us(collective, 2**log_size, ranks, nodes)
    assert (cheap.algorithm, cheap.protocol) == (dear.algorithm, dear.protocol)   # NCCL chooses without it
    assert dear.time_us >= cheap.time_us - 1e-9


@settings(max_examples=150, deadline=None)
@given(profile_name=st.sampled_from(builtin_profiles()),
       collective=st.sampled_from([nccl.ALL_REDUCE, nccl.ALL_GATHER, nccl.REDUCE_SCATTER]),
       log_size=st.integers(10, 33), nodes=st.sampled_from([1, 2, 4]), grow=st.floats(1.0, 1.5))
def test_time_grows_with_the_size_while_nccl_runs_it_the_same_way(profile_name, collective, log_size,
                                                                   nodes, grow):
    """Within one algorithm, protocol, channel count and chunk size, a larger message never takes
    less time (across a change of chunk NCCL's own times are not monotone)."""
    profile = load_profile(profile_name)
    if profile.network is None:
        nodes = 1
    ranks, model = profile.gpus_per_node * nodes, nccl.NcclModel(profile)
    small = model.time_us(collective, 2**log_size, ranks, nodes)
    large = model.time_us(collective, int(2**log_size * grow), ranks, nodes)
    same = (small.algorithm, small.protocol, small.channels, small.chunk_bytes) == \
        (large.algorithm, large.protocol, large.channels, large.chunk_bytes)
    if same and small.steps == large.steps:
        assert large.time_us >= small.time_us - 1e-9


# -- NCCL releases ---------------------------------------------------------------------------------

def test_each_release_gets_its_tuner_tables():
    assert tuning.tuner_for(None) is tuning.NEWEST and tuning.NEWEST.nvls_tree_net_us == 20.9
    assert tuning.tuner_for((2, 24, 3)).since == (2, 23, 0) and not tuning.tuner_for((2, 24, 3)).nvls_efficiency
    assert tuning.tuner_for((2, 28, 7)).since == (2, 28, 0) and tuning.tuner_for((2, 28, 7)).nvls_tree_net_us == 14
    assert tuning.tuner_for((2, 28, 9)) is tuning.NEWEST and tuning.tuner_for((2, 30, 7)) is tuning.NEWEST
    assert tuning.tuner_for((2, 18, 5)) is tuning.TUNERS[0]   # before 2.23: the oldest modelled


def test_a_release_changes_the_choice_not_what_the_hardware_does():
    profile = load_profile(NDR)
    old, new = nccl.NcclModel(profile, nccl_version=(2, 24, 3)), nccl.NcclModel(profile)
    # NCCL 2.24's NVLS-tree costs 25 + 4 x 14 µs and 5/6 of the graph's bandwidth: chosen from 2 MiB
    # on 4 x 8 H100; the newest (20.9 µs per network hop, nvlsEfficiency) keeps the tree to 8 MiB
    assert old.time_us(nccl.ALL_REDUCE, 2 << 20, 32, 4).algorithm == "nvls_tree"
    assert new.time_us(nccl.ALL_REDUCE, 2 << 20, 32, 4).algorithm == "tree"
    # where both choose the same, the executed time is the same
    for size in (1 << 10, 64 << 20):
        a, b = old.time_us(nccl.ALL_REDUCE, size, 32, 4), new.time_us(nccl.ALL_REDUCE, size, 32, 4)
        if (a.algorithm, a.protocol) == (b.algorithm, b.protocol):
            assert a.time_us == b.time_us


def test_logs_name_their_nccl_release():
    assert version_of_code(22403) == (2, 24, 3) and version_of_code(2708) == (2, 7, 8)
    text = synthetic_log(8, "all_reduce")   # `nccl-library=22403` in its header, then NCCL's banner
    assert parse(text).nccl_version == (2, 24, 3)
    no_banner = text.replace("NCCL version 2.24.3+cuda12.6\n", "")
    assert parse(no_banner.replace("nccl-library=22403", "nccl-library=22807")).nccl_version == (2, 28, 7)
    assert parse(text.replace("nccl-library=22403", "")).nccl_version == (2, 24, 3)   # the banner alone
    assert parse(no_banner.replace(" nccl-library=22403", "")).nccl_version is None


def test_the_layer_chooses_with_the_configured_release(tmp_path):
    from chakra_core import pb
    from chakra_core.testing import collective, simulate, write_ranks

    size = 2 << 20
    prefix = write_ranks(tmp_path / "t", [[collective(0, pb.ALL_REDUCE, size)]] * 32)
    finish = {}
    for version in (None, "2.24.3"):
        system = {"plugin": "nccl", "profile": NDR, **({"nccl_version": version} if version else {})}
        results = simulate({"workload": {"trace": prefix}, "system": system})
        [choice] = results["layers"]["system"]["summary"]["choices"]
        finish[version] = (choice["algorithm"], results["finish_ns"])
    assert finish[None][0] == "tree" and finish["2.24.3"][0] == "nvls_tree"
    expected = nccl.NcclModel(load_profile(NDR), nccl_version=(2, 24, 3)).time_us(nccl.ALL_REDUCE, size, 32, 4)
    assert finish["2.24.3"][1] == int(round(expected.time_us * 1000))


def test_calibration_fits_the_proxy_on_multi_node_logs():
    from chakra_sim_system_nccl import calibrate as cal

    truth = load_profile(NDR).with_section("calibration", Calibration(source="t", proxy_post_us=2.5))
    model = nccl.NcclModel(truth)
    points = [cal.Observation(nccl.ALL_GATHER, 2**k, 32, 4, model.time_us(nccl.ALL_GATHER, 2**k, 32, 4).time_us, "t")
              for k in range(16, 30)]
    assert "proxy_post_us" in cal.exercised(load_profile(NDR), points)
    fitted = cal.fit(load_profile(NDR), points, "test")
    assert fitted.section("calibration", Calibration).proxy_post_us == pytest.approx(2.5, rel=0.1)
    single = [cal.Observation(nccl.ALL_GATHER, 2**20, 8, 1, 30.0, "t")]
    assert "proxy_post_us" not in cal.exercised(load_profile(NDR), single)


@pytest.mark.parametrize("version, parsed", [("2.24.3", (2, 24, 3)), ("2.28", (2, 28, 0)), (None, None)])
def test_the_release_setting_reads_as_a_version(version, parsed):
    from chakra_sim_system_nccl.layer import NcclSystemConfig

    config = NcclSystemConfig.model_validate({"profile": NDR, **({"nccl_version": version} if version else {})})
    assert config.version() == parsed


def test_a_release_that_is_not_a_version_is_refused():
    from pydantic import ValidationError

    from chakra_sim_system_nccl.layer import NcclSystemConfig

    with pytest.raises(ValidationError, match="nccl_version"):
        NcclSystemConfig.model_validate({"profile": NDR, "nccl_version": "latest"})
