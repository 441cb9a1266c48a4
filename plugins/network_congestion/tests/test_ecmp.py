"""ECMP on graph topologies: every message takes a shortest path, D-mod-k spreads them over all of them."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chakra_core import LayerContext, SimulationError, pb
from chakra_core.testing import EventQueue, collective, manifest, simulate, write_ranks
from chakra_sim_network_congestion.model import CongestionConfig, CongestionNetwork
from chakra_core.topology.routing import ShortestPathRouter
from chakra_core.topology.graph import Topology, dragonfly, fat_tree
from chakra_core.topology.files import from_file

TIERS = [("npu", "edge"), ("edge", "agg"), ("agg", "core"), ("core", "agg"), ("agg", "edge"), ("edge", "npu")]


def tier_of(link: str) -> tuple[str, str]:
    """('edge', 'agg') for 'edge3.1->agg3.0' (device names from topology.fat_tree)."""
    src, dst = link.split("->")
    return src.rstrip("0123456789."), dst.rstrip("0123456789.")


def graph(topo: Topology) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(range(topo.devices))
    g.add_edges_from(zip(topo.link_src, topo.link_dst))
    return g


def shortest_paths(topo: Topology, src: int, dst: int) -> set[tuple[int, ...]]:
    """Every shortest path as a tuple of links, found by networkx (independently of the router)."""
    return {tuple(topo.out[a][b] for a, b in zip(path, path[1:]))
            for path in nx.all_shortest_paths(graph(topo), src, dst)}


def network(generator: dict) -> CongestionNetwork:
    context = LayerContext(num_ranks=0, scheduler=EventQueue())
    return CongestionNetwork(CongestionConfig.model_validate({"generator": generator}), context)


# The user-visible bug: an all-to-all on a non-blocking fat-tree ------------------------------------------
def test_uniform_all_to_all_loads_every_fat_tree_tier_evenly(tmp_path):
    # k=8: 128 NPUs, 16 core paths between pods. Per-hop hashing left some agg->core links idle and
    # others at 4x the mean, finishing at 3.8x the injection time.
    k, size, bandwidth = 8, 1 << 20, 50
    npus = k ** 3 // 4
    prefix = write_ranks(tmp_path, [[collective(1, pb.ALL_TO_ALL, size)]] * npus)
    net = {"plugin": "congestion", "mode": "fifo",
           "generator": {"kind": "fat_tree", "k": k, "bandwidth_gbps": bandwidth, "latency_ns": 500}}
    results = simulate(manifest(prefix, net, system={"all-to-all-implementation": ["direct"]}))
    rows = results["layers"]["network"]["summary"]["hottest_links"]
    for tier in TIERS:
        loads = [row["bytes"] for row in rows if tier_of(row["link"]) == tier]
        assert len(loads) == npus, tier                          # k^3/4 links in every tier
        assert min(loads) > 0, f"{tier}: {loads.count(0)} links carry nothing"
        assert max(loads) <= 1.10 * min(loads), f"{tier}: {min(loads)}..{max(loads)} B"
    injection = (npus - 1) * (size // npus) / bandwidth          # ns to push one NPU's bytes out
    assert results["finish_ns"] < 1.5 * injection


def test_shift_permutations_share_no_link():
    # D-mod-k's known property on a full fat-tree: when every NPU sends to NPU + s, no two messages meet.
    topo = fat_tree(8, 50.0, 500.0)
    router = ShortestPathRouter(topo)
    for shift in range(1, topo.npus):
        used = Counter(link for src in range(topo.npus) for link in router.route(src, (src + shift) % topo.npus))
        assert max(used.values()) == 1, f"shift {shift}"


def test_successive_messages_of_a_pair_use_every_equal_cost_path():
    net = network({"kind": "fat_tree", "k": 8, "bandwidth_gbps": 50, "latency_ns": 500})
    topo, router = net.topo, net.router
    for src, dst in [(0, 127), (5, 100), (0, 9), (3, 60)]:       # other pod (16 paths), same pod (4)
        paths = shortest_paths(topo, src, dst)
        routes = [router.route_next(src, dst) for _ in range(3 * len(paths))]
        assert Counter(routes) == {path: 3 for path in paths}
    # across the pod boundary each of the 16 cores carries 1/16 of a pair's messages
    queue = net.context.scheduler
    for _ in range(32):
        net.send(1, 126, 1000, lambda _arg: None)
    queue.run()
    cores = [r for r in net.summary()["hottest_links"] if tier_of(r["link"]) == ("agg", "core") and r["messages"]]
    assert len(cores) == 16 and {r["messages"] for r in cores} == {2}


# Any graph: shortest paths only, all of them, deterministically -----------------------------------------
@st.composite
def edge_lists(draw) -> str:
    """A random edge-list file: NPUs 0..n-1 on one or two switches, random extra links, some one-way."""
    npus, switches = draw(st.integers(2, 6)), draw(st.integers(1, 6))
    names = [str(n) for n in range(npus)] + [f"s{s}" for s in range(switches)]
    lines = [f"{n} s{s} 10 5" for n in range(npus)
             for s in draw(st.sets(st.integers(0, switches - 1), min_size=1, max_size=2))]
    extra = draw(st.lists(st.tuples(st.sampled_from(names), st.sampled_from(names),
                                    st.sampled_from([False, False, False, True]))
                          .filter(lambda e: e[0] != e[1]), max_size=16))
    lines += [f"{a} {b} 10 5{' uni' if uni else ''}" for a, b, uni in extra]
    return "\n".join(lines) + "\n"


@st.composite
def topologies(draw) -> Topology:
    kind = draw(st.sampled_from(["fat_tree", "dragonfly", "file"]))
    if kind == "fat_tree":
        return fat_tree(draw(st.sampled_from([2, 4, 6])), 10.0, 5.0)
    if kind == "dragonfly":
        routers, globals_ = draw(st.integers(1, 3)), draw(st.integers(1, 2))
        groups = draw(st.integers(2, routers * globals_ + 1))
        return dragonfly(groups, routers, draw(st.integers(1, 2)), globals_, 10.0, 5.0)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "net.txt"
        path.write_text(draw(edge_lists()))
        return from_file(path)


@settings(max_examples=80, deadline=None)
@given(topo=topologies(), data=st.data())
def test_routes_are_shortest_paths_cover_them_all_and_repeat(topo, data):
    g = graph(topo)
    npu = st.integers(0, topo.npus - 1)
    sends = data.draw(st.lists(st.tuples(npu, npu), min_size=1, max_size=60))
    router, again = ShortestPathRouter(topo), ShortestPathRouter(topo)
    sent: Counter = Counter()
    for src, dst in sends:
        if src != dst and not nx.has_path(g, src, dst):
            with pytest.raises(SimulationError, match="no path"):
                router.route_next(src, dst)
            continue
        route = router.route_next(src, dst)
        assert route == again.route_next(src, dst)               # same sends, same routes
        assert route == router.route(src, dst, sent[(src, dst)])   # the k-th message takes route k
        sent[(src, dst)] += 1
        if src == dst:
            assert route == ()
            continue
        assert topo.link_src[route[0]] == src and topo.link_dst[route[-1]] == dst
        assert all(topo.link_dst[a] == topo.link_src[b] for a, b in zip(route, route[1:]))
        assert len(route) == nx.shortest_path_length(g, src, dst)
    # P successive messages of a pair take its P shortest paths, each once
    src, dst = data.draw(st.tuples(npu, npu).filter(lambda p: p[0] != p[1] and nx.has_path(g, *p)))
    paths = shortest_paths(topo, src, dst)
    first = data.draw(st.integers(0, 50))
    assert sorted(router.route(src, dst, seq) for seq in range(first, first + len(paths))) == sorted(paths)
