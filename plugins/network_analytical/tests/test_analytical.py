"""The analytical network against ASTRA-sim's congestion-unaware formula and reference numbers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from chakra_core import LayerContext
from chakra_core.testing import EventQueue
from chakra_sim_network_analytical import AnalyticalNetwork, AnalyticalNetworkConfig

GIB = 2 ** 30


def make(topology, npus_count, bandwidth, latency) -> AnalyticalNetwork:
    config = AnalyticalNetworkConfig(topology=topology, npus_count=npus_count,
                                     bandwidth=bandwidth, latency=latency)
    ranks = 1
    for n in npus_count:
        ranks *= n
    return AnalyticalNetwork(config, LayerContext(num_ranks=ranks, scheduler=EventQueue()))


def astra_delay(hops: int, bandwidth_gbps: float, latency_ns: float, size: int) -> int:
    """ASTRA-sim analytical: hops x latency + size / (bandwidth x 2^30 / 1e9), truncated to ns."""
    return int(hops * latency_ns + size / (bandwidth_gbps * GIB / 1e9))


# One dimension -----------------------------------------------------------------------------------
@pytest.mark.parametrize("src, dst, hops", [
    (0, 1, 1), (1, 0, 1), (0, 7, 1), (0, 4, 4), (0, 5, 3), (5, 0, 3), (2, 6, 4), (6, 1, 3), (3, 5, 2)])
def test_ring_takes_the_shorter_way_round(src, dst, hops):
    net = make(["Ring"], [8], [50.0], [500.0])
    size = 1 << 20
    assert net.message_delay(src, dst, size) == astra_delay(hops, 50.0, 500.0, size)


@pytest.mark.parametrize("src, dst", [(0, 1), (0, 7), (3, 4), (6, 2)])
def test_fully_connected_is_one_hop(src, dst):
    net = make(["FullyConnected"], [8], [100.0], [250.0])
    assert net.message_delay(src, dst, 4096) == astra_delay(1, 100.0, 250.0, 4096)


@pytest.mark.parametrize("src, dst", [(0, 1), (0, 7), (3, 4), (6, 2)])
def test_switch_is_two_hops(src, dst):
    net = make(["Switch"], [8], [400.0], [936.25])
    assert net.message_delay(src, dst, 4096) == astra_delay(2, 400.0, 936.25, 4096)


def test_reference_ring_one_hop():
    """Ring at 50 GB/s and 500 ns: 64 KiB to a neighbour takes 1720 ns (500 + 1220.7)."""
    net = make(["Ring"], [8], [50.0], [500.0])
    assert net.message_delay(0, 1, 65536) == 1720


def test_reference_switch():
    """Switch at 400 GB/s and 936.25 ns: 32 KiB takes 1948 ns (2 x 936.25 + 76.3)."""
    net = make(["Switch"], [8], [400.0], [936.25])
    assert net.message_delay(0, 5, 32768) == 1948


def test_same_npu_and_empty_message():
    net = make(["Ring"], [8], [50.0], [500.0])
    assert net.message_delay(3, 3, 1 << 20) == 0
    assert net.message_delay(0, 1, 0) == 500


# Several dimensions ------------------------------------------------------------------------------
MULTI = (["Ring", "FullyConnected", "Switch"], [2, 2, 4], [200.0, 100.0, 25.0], [10.0, 100.0, 1000.0])


def test_npus_count_is_the_product():
    net = make(*MULTI)
    assert net.npus_count == 16
    assert [d.npus for d in net.dims] == [2, 2, 4]


@pytest.mark.parametrize("src, dst, dim", [
    (0, 1, 0), (0, 2, 1), (0, 4, 2), (1, 2, 0), (3, 7, 2), (2, 6, 2), (5, 7, 1), (15, 14, 0), (12, 0, 2)])
def test_first_differing_coordinate_picks_the_dimension(src, dst, dim):
    net = make(*MULTI)
    assert net.dim_of(src, dst) == dim


def test_each_dimension_uses_its_own_bandwidth_and_latency():
    net = make(*MULTI)
    size = 1 << 20
    assert net.message_delay(0, 1, size) == astra_delay(1, 200.0, 10.0, size)     # Ring of 2
    assert net.message_delay(0, 2, size) == astra_delay(1, 100.0, 100.0, size)    # FullyConnected
    assert net.message_delay(0, 4, size) == astra_delay(2, 25.0, 1000.0, size)    # Switch
    assert len({net.message_delay(0, d, size) for d in (1, 2, 4)}) == 3


def test_ring_hops_are_counted_in_the_dimension_coordinates():
    net = make(["Ring", "Ring"], [2, 8], [100.0, 50.0], [10.0, 500.0])
    size = 8192
    # NPU 0 is (0, 0); NPU 10 is (0, 5): 3 hops the short way round the 8-ring of dimension 1.
    assert net.message_delay(0, 10, size) == astra_delay(3, 50.0, 500.0, size)
    # NPU 15 is (1, 7): dimension 0 differs first, one hop.
    assert net.message_delay(0, 15, size) == astra_delay(1, 100.0, 10.0, size)


def test_npu_outside_the_network_is_an_error():
    net = make(["Ring"], [4], [50.0], [500.0])
    with pytest.raises(ValueError, match="outside the network"):
        net.message_delay(0, 4, 1024)


# send() -----------------------------------------------------------------------------------------
def test_send_schedules_arrival_at_now_plus_delay():
    queue = EventQueue()
    config = AnalyticalNetworkConfig(topology=["Ring"], npus_count=[8], bandwidth=[50.0], latency=[500.0])
    net = AnalyticalNetwork(config, LayerContext(num_ranks=8, scheduler=queue))
    arrivals = []
    on_arrival = lambda arg: arrivals.append((queue.now, arg))  # noqa: E731
    queue.schedule(1000, lambda _: net.send(0, 5, 65536, on_arrival, "msg"))
    queue.run()
    assert arrivals == [(1000 + astra_delay(3, 50.0, 500.0, 65536), "msg")]


def test_is_contention_free():
    """Two messages on the same link at once do not slow each other down."""
    queue = EventQueue()
    config = AnalyticalNetworkConfig(topology=["Ring"], npus_count=[4], bandwidth=[50.0], latency=[500.0])
    net = AnalyticalNetwork(config, LayerContext(num_ranks=4, scheduler=queue))
    arrivals = []
    for tag in ("a", "b"):
        net.send(0, 1, 65536, lambda arg: arrivals.append((queue.now, arg)), tag)
    queue.run()
    assert arrivals == [(1720, "a"), (1720, "b")]
    assert AnalyticalNetwork.contention_free


# Config -----------------------------------------------------------------------------------------
def test_config_rejects_mismatched_lengths():
    with pytest.raises(ValidationError) as info:
        AnalyticalNetworkConfig(topology=["Ring", "Switch"], npus_count=[4, 2], bandwidth=[50.0],
                                latency=[500.0, 700.0])
    message = str(info.value)
    assert "bandwidth" in message and "'bandwidth': 1" in message


@pytest.mark.parametrize("bandwidth", [0.0, -50.0])
def test_config_rejects_non_positive_bandwidth(bandwidth):
    with pytest.raises(ValidationError) as info:
        AnalyticalNetworkConfig(topology=["Ring", "Ring"], npus_count=[4, 2], bandwidth=[50.0, bandwidth],
                                latency=[500.0, 500.0])
    errors = info.value.errors()
    assert [e["loc"] for e in errors] == [("bandwidth", 1)]
    assert "bandwidth.1" in str(info.value)


@pytest.mark.parametrize("settings_, key", [
    ({"topology": ["Torus"]}, "topology"), ({"npus_count": [0]}, "npus_count"),
    ({"latency": [-1.0]}, "latency"), ({"topology": []}, "topology")])
def test_config_rejects_bad_values_naming_the_key(settings_, key):
    data = {"topology": ["Ring"], "npus_count": [4], "bandwidth": [50.0], "latency": [500.0], **settings_}
    with pytest.raises(ValidationError) as info:
        AnalyticalNetworkConfig.model_validate(data)
    assert {e["loc"][0] for e in info.value.errors()} == {key}


def test_config_rejects_unknown_keys():
    with pytest.raises(ValidationError, match="links-per-tier"):
        AnalyticalNetworkConfig.model_validate({"topology": ["Ring"], "npus_count": [4], "bandwidth": [50.0],
                                                "latency": [500.0], "links-per-tier": [1]})


# Properties -------------------------------------------------------------------------------------
TOPOLOGIES = st.sampled_from(["Ring", "FullyConnected", "Switch"])
SIZES = st.integers(min_value=0, max_value=1 << 34)


@st.composite
def networks_and_pairs(draw):
    dims = draw(st.integers(min_value=1, max_value=3))
    topology = draw(st.lists(TOPOLOGIES, min_size=dims, max_size=dims))
    npus = draw(st.lists(st.integers(min_value=2, max_value=8), min_size=dims, max_size=dims))
    bandwidth = draw(st.lists(st.floats(min_value=0.5, max_value=2000.0), min_size=dims, max_size=dims))
    latency = draw(st.lists(st.floats(min_value=0.0, max_value=5000.0), min_size=dims, max_size=dims))
    net = make(topology, npus, bandwidth, latency)
    src = draw(st.integers(min_value=0, max_value=net.npus_count - 1))
    dst = draw(st.integers(min_value=0, max_value=net.npus_count - 1))
    return net, src, dst


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(networks_and_pairs(), SIZES)
def test_delay_is_symmetric(case, size):
    net, src, dst = case
    assert net.message_delay(src, dst, size) == net.message_delay(dst, src, size)


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(networks_and_pairs(), SIZES, SIZES)
def test_delay_is_monotone_in_size(case, a, b):
    net, src, dst = case
    small, large = sorted((a, b))
    assert 0 <= net.message_delay(src, dst, small) <= net.message_delay(src, dst, large)
