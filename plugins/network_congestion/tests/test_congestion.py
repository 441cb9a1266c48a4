"""The congestion-aware network backend: topologies, routing, FIFO and fair sharing, statistics."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chakra_core import LayerContext, ManifestError, RunInputs, SimulationError, pb
from chakra_core.testing import EventQueue, collective, manifest, simulate, write_ranks
from chakra_sim_network_congestion.model import CongestionConfig, CongestionNetwork
from chakra_core.topology.graph import fat_tree, from_dims

CHECKOUT = Path(__file__).resolve().parents[3]
"""The chakra-sim checkout holding this plugin; the tests of its data skip without it."""
MICRO = CHECKOUT / "tests" / "data" / "astra-microbenchmarks"
needs_micro = pytest.mark.skipif(not MICRO.is_dir(), reason="needs the chakra-sim checkout's tests/data")

GIB = 1 << 30


def build(tmp_path=None, **settings_) -> tuple[CongestionNetwork, EventQueue]:
    queue = EventQueue()
    context = LayerContext(num_ranks=0, scheduler=queue, inputs=RunInputs(base_dir=tmp_path or Path(".")))
    network = CongestionNetwork(CongestionConfig.model_validate(settings_), context)
    context.num_ranks = network.npus_count
    return network, queue


def spec(kind="Ring", n=8, bw=50.0, lat=500.0, mode="fifo", **extra):
    return dict(mode=mode, topology=[kind], npus_count=[n], bandwidth=[bw], latency=[lat], **extra)


def deliver(network, queue, messages):
    """Send (src, dst, size, start) messages; return arrival times in message order."""
    arrivals = {}
    for index, (src, dst, size, start) in enumerate(messages):
        queue.schedule_at(start, lambda i, s=src, d=dst, b=size:
                          network.send(s, d, b, lambda j: arrivals.__setitem__(j, queue.now), i), index)
    queue.run()
    return [arrivals[i] for i in range(len(messages))]


# Topologies and routes -------------------------------------------------------------------------------
def test_astra_building_blocks_expand_into_devices_and_links():
    ring = from_dims(["Ring"], [4], [50.0], [500.0])
    assert ring.devices == 4 and len(ring.link_src) == 8          # bidirectional neighbours
    two = from_dims(["Ring"], [2], [50.0], [500.0])
    assert len(two.link_src) == 2                                 # no duplicate links on a 2-ring
    fc = from_dims(["FullyConnected"], [4], [50.0], [500.0])
    assert len(fc.link_src) == 12
    switch = from_dims(["Switch"], [4], [50.0], [500.0])
    assert switch.devices == 5 and len(switch.link_src) == 8
    grid = from_dims(["Ring", "Switch"], [4, 2], [50.0, 25.0], [1.0, 2.0])
    assert grid.devices == 8 + 4                                  # one switch per dimension-1 slice
    assert grid.link_bw[0] == 50.0 * GIB / 1e9


def test_dimension_order_routes():
    network, _ = build(mode="fifo", topology=["Ring", "Switch"], npus_count=[8, 2], bandwidth=[50, 50],
                       latency=[1, 1])
    assert network.route(0, 3) == ["npu0->npu1", "npu1->npu2", "npu2->npu3"]
    assert network.route(0, 6) == ["npu0->npu7", "npu7->npu6"]     # the shorter way round
    assert network.route(1, 12) == ["npu1->npu2", "npu2->npu3", "npu3->npu4", "sw1.4->npu12"][:3] + \
        network.route(4, 12)
    assert network.route(4, 12) == ["npu4->sw1.4", "sw1.4->npu12"]


def test_fat_tree_shape_and_ecmp_is_deterministic_and_spreads():
    topo = fat_tree(4, 10.0, 100.0)
    assert topo.npus == 16 and topo.devices == 16 + 4 + 8 + 8
    network, _ = build(mode="fifo", generator={"kind": "fat_tree", "k": 4, "bandwidth_gbps": 10,
                                               "latency_ns": 100})
    routes = {tuple(network.route(0, 15, flow)) for flow in range(32)}
    assert all(len(r) == 6 for r in routes)                       # host-edge-agg-core-agg-edge-host
    assert len(routes) > 1                                         # ECMP uses several cores
    again, _ = build(mode="fifo", generator={"kind": "fat_tree", "k": 4, "bandwidth_gbps": 10,
                                             "latency_ns": 100})
    assert [again.route(0, 15, f) for f in range(32)] == [network.route(0, 15, f) for f in range(32)]
    assert network.route(0, 1) == ["npu0->edge0.0", "edge0.0->npu1"]


def test_torus_and_dragonfly_generators():
    torus, _ = build(mode="fifo", generator={"kind": "torus", "dims": [4, 4], "bandwidth_gbps": 10,
                                             "latency_ns": 5})
    assert torus.npus_count == 16 and [d.npus for d in torus.dims] == [4, 4]
    assert len(torus.route(0, 10)) == 4                           # 2 hops in x, 2 in y
    fly, _ = build(mode="fifo", generator={"kind": "dragonfly", "groups": 5, "routers_per_group": 2,
                                           "hosts_per_router": 2, "global_links_per_router": 2,
                                           "bandwidth_gbps": 10, "latency_ns": 5})
    assert fly.npus_count == 20
    for dst in range(4, 20):
        assert 2 <= len(fly.route(0, dst)) <= 5                   # host, local, global, local, host


def test_topology_files(tmp_path):
    edges = tmp_path / "net.txt"
    edges.write_text("# two NPUs through a switch\n0 sw 100 10\n1 sw 50 10\n")
    network, queue = build(tmp_path, mode="fifo", topology_file="net.txt")
    assert network.npus_count == 2 and network.route(0, 1) == ["npu0->sw", "sw->npu1"]
    graphml = tmp_path / "net.graphml"
    graphml.write_text("""<?xml version="1.0" encoding="UTF-8"?>
<graphml xmlns="http://graphml.graphdrawing.org/xmlns">
  <key id="bw" for="edge" attr.name="bandwidth_gbps" attr.type="double"/>
  <key id="lat" for="edge" attr.name="latency_ns" attr.type="double"/>
  <graph edgedefault="undirected">
    <node id="0"/><node id="1"/><node id="s"/>
    <edge source="0" target="s"><data key="bw">10</data><data key="lat">5</data></edge>
    <edge source="1" target="s"><data key="bw">10</data><data key="lat">5</data></edge>
  </graph>
</graphml>""")
    network, _ = build(tmp_path, mode="fifo", topology_file="net.graphml")
    assert network.route(1, 0) == ["npu1->s", "s->npu0"]


@pytest.mark.parametrize("text,message", [
    ("0 1 0 10\n", "line 1.*bandwidth must be positive"),
    ("0 1 10\n", "line 1.*expected 'src dst bandwidth_gbps latency_ns"),
    ("0 1 x 10\n", "line 1.*must be numbers"),
    ("0 1 10 5\n0 3 10 5\n", "numbered 0..N-1; missing: \\[2\\]"),
    ("0 1 10 5 sideways\n", "line 1.*'uni' or 'bi'"),
])
def test_bad_edge_lists_name_the_line(tmp_path, text, message):
    (tmp_path / "bad.txt").write_text(text)
    with pytest.raises(ManifestError, match=message):
        build(tmp_path, mode="fifo", topology_file="bad.txt")


def test_graphml_edge_to_an_undeclared_node(tmp_path):
    (tmp_path / "bad.graphml").write_text("""<?xml version="1.0" encoding="UTF-8"?>
<graphml xmlns="http://graphml.graphdrawing.org/xmlns">
  <key id="bw" for="edge" attr.name="bandwidth_gbps" attr.type="double"/>
  <graph edgedefault="undirected"><node id="0"/><node id="1"/>
    <edge source="0" target="ghost"><data key="bw">10</data></edge>
    <edge source="1" target="0"><data key="bw">10</data></edge></graph></graphml>""")
    with pytest.raises(ManifestError, match="edge 0 -> ghost.*unknown node 'ghost'"):
        build(tmp_path, mode="fifo", topology_file="bad.graphml")


def test_disconnected_graph_fails_only_when_a_message_needs_the_path(tmp_path):
    (tmp_path / "split.txt").write_text("0 1 10 5\n2 3 10 5\n")
    network, queue = build(tmp_path, mode="fifo", topology_file="split.txt")
    assert deliver(network, queue, [(0, 1, 100, 0)]) == [int(5 + 100 / 10)]
    with pytest.raises(SimulationError, match="no path from NPU 0 to NPU 3"):
        network.send(0, 3, 100, print)


def test_config_needs_exactly_one_source():
    with pytest.raises(Exception, match="exactly one of"):
        CongestionConfig.model_validate({"mode": "fifo"})
    with pytest.raises(Exception, match="exactly one of"):
        CongestionConfig.model_validate({**spec(), "topology_file": "x"})


# Timing properties -------------------------------------------------------------------------------------
def analytical_delay(kind, n, bw, lat, src, dst, size):
    """The analytical backend's delay: the reference of an idle path (skips without that plugin)."""
    analytical = pytest.importorskip("chakra_sim_network_analytical.model")
    AnalyticalNetwork, AnalyticalNetworkConfig = analytical.AnalyticalNetwork, analytical.AnalyticalNetworkConfig
    queue = EventQueue()
    context = LayerContext(num_ranks=n, scheduler=queue)
    config = AnalyticalNetworkConfig(topology=[kind], npus_count=[n], bandwidth=[bw], latency=[lat])
    return AnalyticalNetwork(config, context).message_delay(src, dst, size)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["Ring", "FullyConnected", "Switch"]), n=st.integers(2, 12),
       bw=st.floats(1, 500), lat=st.floats(0, 5000), size=st.integers(1, 1 << 24), data=st.data())
def test_a_single_flow_on_an_idle_path_takes_the_analytical_time(kind, n, bw, lat, size, data):
    src = data.draw(st.integers(0, n - 1))
    dst = data.draw(st.integers(0, n - 1).filter(lambda d: d != src))
    expected = analytical_delay(kind, n, bw, lat, src, dst, size)
    fair, queue = build(**spec(kind, n, bw, lat, mode="fair"))
    assert deliver(fair, queue, [(src, dst, size, 0)]) == [expected]
    # FIFO is store-and-forward: the same as analytical on one hop, every hop's transfer otherwise.
    fifo, queue = build(**spec(kind, n, bw, lat, mode="fifo"))
    hops = len(fifo.route(src, dst))
    per_hop = int(lat + size / (bw * GIB / 1e9))
    assert deliver(fifo, queue, [(src, dst, size, 0)]) == [expected if hops == 1 else hops * per_hop]
    # Cut-through: one transfer, whatever the hops.
    fifo, queue = build(**spec(kind, n, bw, lat, mode="fifo", forwarding="cut_through"))
    assert deliver(fifo, queue, [(src, dst, size, 0)]) == [expected]


@settings(max_examples=60, deadline=None)
@given(bandwidths=st.lists(st.floats(1, 500), min_size=2, max_size=3), lat=st.floats(0, 5000),
       sizes=st.lists(st.integers(1, 1 << 22), min_size=1, max_size=6), gap=st.integers(0, 50_000))
def test_cut_through_pipelines_a_message_at_its_slowest_link(bandwidths, lat, sizes, gap):
    # One message after another from NPU 0 to the far corner of a multi-dimensional ring:
    # cut-through takes the latencies plus one transfer at the slowest link when the links are
    # idle, and never less than that after the message ahead of it (same links, FIFO).
    dims = len(bandwidths)
    fifo, queue = build(mode="fifo", forwarding="cut_through", topology=["Ring"] * dims, npus_count=[3] * dims,
                        bandwidth=bandwidths, latency=[lat] * dims)
    dst = fifo.npus_count - 1
    messages = [(0, dst, size, k * gap) for k, size in enumerate(sizes)]
    arrivals = deliver(fifo, queue, messages)
    hops = len(fifo.route(0, dst))
    slowest = min(bandwidths) * GIB / 1e9
    assert arrivals[0] == int(hops * lat + sizes[0] / slowest)
    for (_, _, size, start), arrived, before in zip(messages[1:], arrivals[1:], arrivals):
        assert arrived >= max(start + int(hops * lat + size / slowest), before + int(size / slowest) - 1)


@settings(max_examples=40, deadline=None)
@given(flows=st.integers(2, 8), size=st.integers(1000, 1 << 22), bw=st.floats(1, 200), lat=st.floats(0, 1000))
def test_equal_flows_through_one_bottleneck(flows, size, bw, lat):
    # NPUs 1..flows all send to NPU 0 through one switch: the switch->npu0 link is the bottleneck.
    n = flows + 1
    single = size / (bw * GIB / 1e9)
    messages = [(src, 0, size, 0) for src in range(1, n)]
    fair, queue = build(**spec("Switch", n, bw, lat, mode="fair"))
    arrivals = deliver(fair, queue, messages)
    # Fair: all finish together, after flows x the single-flow transfer time.
    assert max(arrivals) - min(arrivals) <= 1
    assert abs(max(arrivals) - (2 * lat + flows * single)) <= 2
    fifo, queue = build(**spec("Switch", n, bw, lat, mode="fifo"))
    arrivals = sorted(deliver(fifo, queue, messages))
    # FIFO: one after another on the shared link; the last after flows transfers.
    gaps = {b - a for a, b in zip(arrivals, arrivals[1:])}
    assert gaps <= {int(single), int(single) + 1}
    assert abs(arrivals[-1] - (int(lat + single) + lat + flows * single)) <= flows + 2


@settings(max_examples=30, deadline=None)
@given(mode=st.sampled_from(["fifo", "fair"]), data=st.data())
def test_bytes_are_conserved_on_every_link(mode, data):
    network, queue = build(mode=mode, generator={"kind": "fat_tree", "k": 4, "bandwidth_gbps": 10,
                                                 "latency_ns": 50})
    messages = data.draw(st.lists(st.tuples(st.integers(0, 15), st.integers(0, 15), st.integers(1, 100_000),
                                            st.integers(0, 10_000)).filter(lambda m: m[0] != m[1]),
                                  min_size=1, max_size=40))
    deliver(network, queue, messages)
    summary = network.summary()
    assert summary["link_bytes"] == sum(size * len(network.router.route(s, d, i))
                                        for i, (s, d, size, _) in enumerate(messages))
    assert summary["message_bytes"] == sum(m[2] for m in messages)
    assert all(0 <= row["utilization"] <= 1 for row in summary["hottest_links"])


def test_link_statistics_report_peak_concurrency_and_busy_time():
    network, queue = build(**spec("Switch", 4, 10.0, 0.0))
    deliver(network, queue, [(1, 0, 10_000, 0), (2, 0, 10_000, 0), (3, 0, 10_000, 0)])
    rows = {r["link"]: r for r in network.summary()["hottest_links"]}
    down = rows["sw0.0->npu0"]
    assert down["messages"] == 3 and down["peak_concurrent"] == 3
    assert down["busy_ns"] == 3 * int(10_000 / (10 * GIB / 1e9))
    tables = network.terminal_tables()
    assert tables[0][2][0][0] == "sw0.0->npu0"                     # hottest first


# End to end --------------------------------------------------------------------------------------------
ASTRA_AWARE = {("all_reduce", 4): 43000, ("all_reduce", 8): 64440, ("all_gather", 4): 64744,
               ("all_gather", 8): 151016, ("reduce_scatter", 4): 22240, ("reduce_scatter", 8): 33080,
               ("all_to_all", 4): 41560, ("all_to_all", 8): 125480}
RING_4CHUNKS = {"endpoint-delay": 10, "preferred-dataset-splits": 4, "active-chunks-per-dimension": 1,
                "local-mem-bw": 1600}


@needs_micro
@pytest.mark.parametrize("coll,n", sorted(ASTRA_AWARE))
def test_microbenchmarks_on_rings_match_astra_and_the_analytical_backend(coll, n):
    prefix = str(MICRO / coll / f"{n}npus_1MB" / coll)
    network = {"plugin": "congestion", **spec("Ring", n)}
    results = simulate(manifest(prefix, network, system=RING_4CHUNKS))
    assert results["finish_ns"] == ASTRA_AWARE[(coll, n)]
    assert results["layers"]["network"]["highlights"][0]["rows"]


@needs_micro
def test_switch_contention_matches_astra_sims_congestion_aware_number():
    # HGX-H100 example: Switch of 8, 400 GB/s, 936.25 ns, 2 active chunks. ASTRA-sim: 57,426 ns
    # congestion-aware (55,222 ns unaware): both chunks share each NPU's switch link.
    prefix = str(MICRO / "all_reduce" / "8npus_1MB" / "all_reduce")
    system = {**RING_4CHUNKS, "active-chunks-per-dimension": 2, "local-mem-bw": 3350}
    network = {"plugin": "congestion", **spec("Switch", 8, 400.0, 936.25)}
    assert simulate(manifest(prefix, network, system=system))["finish_ns"] == 57426


def test_fair_mode_runs_collectives_end_to_end(tmp_path):
    prefix = write_ranks(tmp_path, [[collective(1, pb.ALL_TO_ALL, 1 << 16)]] * 8)
    fair = simulate(manifest(prefix, {"plugin": "congestion", **spec("Switch", 8, mode="fair")},
                             system={"all-to-all-implementation": ["direct"]}))
    fifo = simulate(manifest(prefix, {"plugin": "congestion", **spec("Switch", 8, mode="fifo")},
                             system={"all-to-all-implementation": ["direct"]}))
    assert fair["finish_ns"] > 0 and fifo["finish_ns"] > 0
    assert fair["layers"]["network"]["summary"]["mode"] == "fair"


def test_traced_messages_show_routes_and_times():
    network, queue = build(**spec("Switch", 4, 10.0, 100.0), trace_messages=2)
    deliver(network, queue, [(1, 0, 1000, 0), (2, 0, 1000, 0), (3, 0, 1000, 0)])
    traced = network.summary()["traced_messages"]
    assert [t["route"] for t in traced] == [["npu1->sw0.0", "sw0.0->npu0"], ["npu2->sw0.0", "sw0.0->npu0"]]
    assert traced[0]["sent_ns"] == 0 and traced[0]["arrived_ns"] > 0
