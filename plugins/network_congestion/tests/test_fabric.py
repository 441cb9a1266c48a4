"""Generated fabrics (fat-trees of any size, rail-optimized clusters): shapes, arithmetic routes, ECMP,
failed and degraded links."""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import networkx as nx
import pytest

from chakra_core import LayerContext, ManifestError, RunInputs, SimulationError
from chakra_core.testing import EventQueue, manifest, recv, send, simulate, write_ranks
from chakra_core.topology.ecmp import ecmp_hash
from chakra_core.topology.fabric import Clos, FabricRouter
from chakra_sim_network_congestion.model import CongestionConfig, CongestionNetwork
from chakra_core.topology.routing import ShortestPathRouter
from chakra_core.topology.graph import Topology, clos_fat_tree, fat_tree, rail_optimized


def build(**settings) -> CongestionNetwork:
    context = LayerContext(num_ranks=0, scheduler=EventQueue(), inputs=RunInputs(base_dir=Path(".")))
    network = CongestionNetwork(CongestionConfig.model_validate(settings), context)
    context.num_ranks = network.npus_count
    return network


def graph(topo: Topology, without: frozenset[int] = frozenset()) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(range(topo.devices))
    g.add_edges_from((a, b) for link, (a, b) in enumerate(zip(topo.link_src, topo.link_dst)) if link not in without)
    return g


def fabric(topo: Topology) -> Clos:
    assert topo.fabric is not None
    return topo.fabric


def assert_path(topo: Topology, route: tuple[int, ...], src: int, dst: int) -> None:
    assert topo.link_src[route[0]] == src and topo.link_dst[route[-1]] == dst
    assert all(topo.link_dst[a] == topo.link_src[b] for a, b in zip(route, route[1:]))


def up_down_hops(f: Clos, src: int, dst: int) -> int:
    """The up-down distance, from the shape alone."""
    g = f.gpus_per_node
    if src == dst:
        return 0
    if g > 1 and src // g == dst // g:
        return 2                                                  # NVLink
    nvlink = 0
    if g > 1 and src % g != dst % g and (f.pxn or (src % g) * f.rail_leaves // f.plane_leaves
                                         != (dst % g) * f.rail_leaves // f.plane_leaves):
        nvlink, src = 2, (src // g) * g + dst % g                 # PXN first
    ls, lt = f.leaf_of(src), f.leaf_of(dst)
    if ls == lt:
        return nvlink + 2
    if f.tiers == 2 or ls // f.pod_leaves == lt // f.pod_leaves:
        return nvlink + 4
    return nvlink + 6


SMALL = {
    "fat_tree 2 tiers": lambda: clos_fat_tree(22, 8, 10.0, 5.0, tiers=2),                  # last leaf half full
    "fat_tree 2 tiers oversubscribed": lambda: clos_fat_tree(24, 8, 10.0, 5.0, tiers=2, oversubscription=3),
    "fat_tree 3 tiers": lambda: clos_fat_tree(40, 6, 10.0, 5.0),                          # last pod partial
    "fat_tree 3 tiers oversubscribed": lambda: clos_fat_tree(36, 8, 10.0, 5.0, oversubscription=3,
                                                             spine_oversubscription=1.5),
    "fat_tree k=4, 2 tiers": lambda: fat_tree(4, 10.0, 5.0, tiers=2),
    "rail one plane": lambda: rail_optimized(5, 4, 4, 10.0, 5.0, 40.0, 1.0, spine_radix=12),
    "rail pxn": lambda: rail_optimized(5, 4, 4, 10.0, 5.0, 40.0, 1.0, spine_radix=12, pxn=True),
    "rail two planes": lambda: rail_optimized(6, 4, 6, 10.0, 5.0, 40.0, 1.0, spine_planes=2, oversubscription=2),
    "rail plane per rail, dmodk": lambda: rail_optimized(4, 2, 4, 10.0, 5.0, 40.0, 1.0, spine_planes=2, ecmp="dmodk"),
}


# Shapes, numbering, counts ---------------------------------------------------------------------------
def test_the_k_form_is_the_k_ary_fat_tree_as_before_and_routes_exactly_as_shortest_paths_did():
    def fingerprint(topo: Topology) -> str:
        data = [topo.names, topo.link_src, topo.link_dst, topo.link_bw, topo.link_latency, topo.source]
        return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:16]

    # fingerprints of topology.fat_tree before the fabrics existed
    assert fingerprint(fat_tree(4, 10.0, 100.0)) == "897729be735cae0c"
    assert fingerprint(fat_tree(8, 50.0, 500.0, 2.0)) == "9f5c951778128242"
    for k in (4, 6):
        topo = fat_tree(k, 10.0, 100.0)
        old, new = ShortestPathRouter(topo), FabricRouter(topo)
        for src in range(topo.npus):
            for dst in range(topo.npus):
                assert [old.route(src, dst, s) for s in range(9)] == [new.route(src, dst, s) for s in range(9)]
                assert [old.route_next(src, dst) for _ in range(5)] == [new.route_next(src, dst) for _ in range(5)]
    network = build(generator={"kind": "fat_tree", "k": 4, "bandwidth_gbps": 10, "latency_ns": 100})
    assert isinstance(network.router, FabricRouter) and fabric(network.topo).ecmp == "dmodk"


@pytest.mark.parametrize("make,hosts,devices,links", [
    (lambda: clos_fat_tree(22, 8, 1, 1, tiers=2), 22, 22 + 6 + 4, 2 * 22 + 2 * 6 * 4),
    (lambda: clos_fat_tree(40, 6, 1, 1), 40, 40 + 14 + 5 * 3 + 9, 2 * 40 + 2 * 14 * 3 + 2 * 5 * 3 * 3),
    (lambda: clos_fat_tree(48, 8, 1, 1, oversubscription=3), 48, 48 + 8 + 2 * 2 + 2 * 4,
     2 * 48 + 2 * 8 * 2 + 2 * 2 * 2 * 4),
    (lambda: fat_tree(8, 1, 1, tiers=2), 32, 32 + 8 + 4, 2 * 32 + 2 * 8 * 4),
    (lambda: rail_optimized(5, 4, 4, 1, 1, 1, 1, spine_radix=12), 20, 20 + 5 + 4 * 3 + 2, 2 * 20 + 2 * 20 + 2 * 12 * 2),
    (lambda: rail_optimized(3, 1, 4, 1, 1, 1, 1), 3, 3 + 2 + 2, 2 * 3 + 2 * 2 * 2),            # no NVSwitch
    # 16,384 hosts: 3 tiers of radix 64 (16 pods of 32 leaves, 32 aggs, 1,024 cores), 2 tiers of
    # radix 128 under 256-port spines, 2,048 DGX-like nodes under 576-port spines (Meta's CTSW)
    (lambda: clos_fat_tree(16384, 64, 50, 500), 16384, 16384 + 512 + 16 * 32 + 32 * 32,
     2 * 16384 + 2 * 512 * 32 + 2 * 16 * 32 * 32),
    (lambda: clos_fat_tree(16384, 128, 50, 500, tiers=2, spine_radix=256), 16384, 16384 + 256 + 64,
     2 * 16384 + 2 * 256 * 64),
    (lambda: rail_optimized(2048, 8, 64, 50, 500, 450, 100, spine_radix=576), 16384, 16384 + 2048 + 8 * 64 + 32,
     2 * 16384 + 2 * 16384 + 2 * 512 * 32),
    (lambda: rail_optimized(2048, 8, 64, 50, 500, 450, 100, spine_planes=8), 16384, 16384 + 2048 + 8 * 64 + 8 * 32,
     2 * 16384 + 2 * 16384 + 2 * 512 * 32),
])
def test_device_and_link_counts(make, hosts, devices, links):
    topo = make()
    assert (topo.npus, topo.devices, len(topo.link_src)) == (hosts, devices, links)
    assert all(name == f"npu{i}" for i, name in enumerate(topo.names[:hosts]))
    assert not any(name.startswith("npu") for name in topo.names[hosts:])          # switches after the NPUs
    f = fabric(topo)
    arrays = [f.host_up, f.host_down, f.up2, f.down2, f.up3, f.down3, f.nv_up, f.nv_down]
    assert sorted(link for a in arrays for link in a) == list(range(links))          # every link once


def test_numbering_of_a_rail_optimized_cluster():
    topo = rail_optimized(5, 4, 4, 10.0, 5.0, 40.0, 1.0, spine_radix=12)     # 2 nodes per rail switch, 2 spines
    names = topo.names
    assert names[20:25] == [f"nvsw{n}" for n in range(5)]
    assert names[25:37] == [f"rail{r}.{s}" for r in range(4) for s in range(3)]
    assert names[37:] == ["spine0.0", "spine0.1"]
    f = fabric(topo)
    # NPU 9 is GPU 1 of node 2: rail 1, rail switch 2 // 2 = 1
    assert topo.link_name(f.host_up[9]) == "npu9->rail1.1" and topo.link_name(f.nv_down[9]) == "nvsw2->npu9"
    assert topo.link_name(f.up2[5 * 2 + 1]) == "rail1.2->spine0.1"
    two = rail_optimized(6, 4, 6, 10.0, 5.0, 40.0, 1.0, spine_planes=2)    # rails 0-1 and 2-3
    assert {two.names[two.link_dst[link]] for link in fabric(two).up2[:fabric(two).up]} == {"spine0.0", "spine0.1",
                                                                                             "spine0.2"}
    assert two.names[two.link_dst[fabric(two).up2[-1]]] == "spine1.2"


def test_sixteen_thousand_hosts_build_fast_and_their_routing_state_is_small():
    started = time.perf_counter()
    topo = clos_fat_tree(16384, 64, 50.0, 500.0)
    assert time.perf_counter() - started < 1.0
    f = fabric(topo)
    lists = (f.host_up, f.host_down, f.up2, f.down2, f.up3, f.down3)
    assert sum(len(ids) for ids in lists) == len(topo.link_src)
    assert sum(sys.getsizeof(ids) for ids in lists) < 8 * len(topo.link_src) + 1000    # a pointer per link
    rng = random.Random(7)
    pairs = [(rng.randrange(16384), rng.randrange(16384)) for _ in range(20_000)]
    tracemalloc.start()
    router = FabricRouter(topo)
    for src, dst in pairs:
        router.route(src, dst, 3)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, f"{peak:,} B"                # a list over the NPUs (the message counts), no tables
    for src, dst in pairs[:2000]:
        route = router.route(src, dst, 5)
        if src != dst:
            assert_path(topo, route, src, dst)
        assert len(route) == up_down_hops(f, src, dst)


@pytest.mark.parametrize("kwargs,message", [
    ({"k": 5}, "even number"),
    ({"hosts": 16384, "radix": 64, "tiers": 2}, "2 tiers: 16,384 hosts at 32 per leaf need 512 leaves"),
    ({"hosts": 70000, "radix": 64}, "3 tiers of radix 64 reach 65,536 hosts"),
    ({"hosts": 16}, "both hosts and radix"),
    ({"k": 4, "radix": 8}, "not both"),
    ({"hosts": 16, "radix": 2, "oversubscription": 0.5}, "gets 0 down and 2 up ports"),
    ({"hosts": 16, "radix": 8, "tiers": 2, "spine_oversubscription": 2}, "applies to 3 tiers"),
])
def test_fat_tree_shapes_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CongestionConfig.model_validate({"generator": {"kind": "fat_tree", "bandwidth_gbps": 50, "latency_ns": 500,
                                                       **kwargs}})


@pytest.mark.parametrize("kwargs,message", [
    ({"nodes": 2048, "gpus_per_node": 8, "radix": 64}, "512 rail switches per plane, more than a spine's 64 ports"),
    ({"nodes": 4, "gpus_per_node": 8, "radix": 64, "spine_planes": 3}, "must divide gpus_per_node"),
    ({"nodes": 4, "gpus_per_node": 8, "radix": 64, "nvlink_bandwidth_gbps": None}, "nvlink_bandwidth_gbps"),
])
def test_rail_shapes_are_validated(kwargs, message):
    generator = {"kind": "rail_optimized", "bandwidth_gbps": 50, "latency_ns": 500, "nvlink_bandwidth_gbps": 450,
                 "nvlink_latency_ns": 100, **kwargs}
    with pytest.raises(ValueError, match=message):
        CongestionConfig.model_validate({"generator": generator})


# Routes ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SMALL))
def test_every_route_is_an_up_down_shortest_path(name):
    topo = SMALL[name]()
    f, router, g = fabric(topo), FabricRouter(topo), graph(topo)
    lengths = dict(nx.all_pairs_shortest_path_length(g))
    used: set[tuple[int, ...]] = set()
    for src in range(topo.npus):
        for dst in range(topo.npus):
            for seq in range(6):
                route = router.route(src, dst, seq)
                if src == dst:
                    assert route == ()
                    continue
                assert_path(topo, route, src, dst)
                assert len(route) == up_down_hops(f, src, dst)
                # shortest, but for pxn: it always crosses NVLink first, then the spine if it must
                assert len(route) == lengths[src][dst] or (f.pxn and len(route) == lengths[src][dst] + 2)
                used.add(route)
    # ECMP uses every link above the leaves
    assert {*f.up2, *f.down2, *f.up3, *f.down3} <= {link for route in used for link in route}


def test_routes_are_the_same_in_every_run():
    assert [ecmp_hash(s, d, q) for s, d, q in [(0, 0, 0), (1, 2, 3), (16383, 0, 7)]] == [0, 3591307500, 942585103]
    network = build(generator={"kind": "fat_tree", "hosts": 40, "radix": 6, "bandwidth_gbps": 10, "latency_ns": 5})
    assert network.route(0, 39, 0) == ["npu0->edge0.0", "edge0.0->agg0.2", "agg0.2->core8", "core8->agg4.2",
                                       "agg4.2->edge4.1", "edge4.1->npu39"]
    again = build(generator={"kind": "fat_tree", "hosts": 40, "radix": 6, "bandwidth_gbps": 10, "latency_ns": 5})
    sends = [(s, d) for s in range(40) for d in range(40)] * 3
    assert [network.router.route_next(s, d) for s, d in sends] == [again.router.route_next(s, d) for s, d in sends]
    # the n-th message of a pair takes route(src, dst, n)
    assert [network.router.route(7, 30, n) for n in (3, 4, 5)] == [again.router.route_next(7, 30) for _ in range(3)]


def loads(topo: Topology, messages_per_pair: int) -> dict[tuple[str, str], list[int]]:
    """Messages per link, by tier (device kinds at both ends), for a uniform all-to-all."""
    router, count = FabricRouter(topo), Counter()
    for _ in range(messages_per_pair):
        for src in range(topo.npus):
            for dst in range(topo.npus):
                count.update(router.route_next(src, dst))
    tiers: dict[tuple[str, str], list[int]] = {}
    for link in range(len(topo.link_src)):
        ends = (topo.names[topo.link_src[link]].rstrip("0123456789."),
                topo.names[topo.link_dst[link]].rstrip("0123456789."))
        tiers.setdefault(ends, []).append(count[link])
    return tiers


@pytest.mark.parametrize("make", [lambda e: clos_fat_tree(32, 8, 1, 1, tiers=2, ecmp=e),
                                  lambda e: clos_fat_tree(64, 8, 1, 1, ecmp=e),
                                  lambda e: rail_optimized(8, 4, 4, 1, 1, 1, 1, spine_radix=16, ecmp=e)])
def test_ecmp_spreads_a_uniform_all_to_all_over_the_equal_cost_links(make):
    # D-mod-k: every link of a tier carries the same number of messages, from one message per pair on
    for tier, counts in loads(make("dmodk"), 1).items():
        assert min(counts) == max(counts) > 0, tier
    # hash: statistically; with 64 messages per pair no link of a tier is 25% above another
    for tier, counts in loads(make("hash"), 64).items():
        assert max(counts) <= 1.25 * min(counts), (tier, min(counts), max(counts))


# Failed and degraded links -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SMALL))
def test_failed_links_are_never_used_and_the_rest_still_routes_shortest(name):
    topo = SMALL[name]()
    f, rng = fabric(topo), random.Random(name)
    above = [*f.up2, *f.down2, *f.up3, *f.down3]
    failed = frozenset(rng.sample(above, len(above) // 4))
    router, g = FabricRouter(topo, failed), graph(topo, failed)
    lengths = dict(nx.all_pairs_shortest_path_length(g))
    routed = 0
    for src in range(topo.npus):
        for dst in range(topo.npus):
            if src == dst:
                continue
            try:
                routes = [router.route(src, dst, seq) for seq in range(4)]
            except SimulationError as exc:
                assert f"NPU {src} cannot reach NPU {dst}: failed links" in str(exc)
                assert any(topo.link_name(link) in str(exc) for link in failed)
                continue
            routed += 1
            for route in routes:
                assert not failed & set(route)
                assert_path(topo, route, src, dst)
                assert len(route) == up_down_hops(f, src, dst)
                assert len(route) == lengths[src][dst] or (f.pxn and len(route) == lengths[src][dst] + 2)
    assert routed > topo.npus * (topo.npus - 1) // 2


def test_failed_links_by_name_through_the_manifest():
    generator = {"kind": "fat_tree", "hosts": 16, "radix": 8, "tiers": 2, "bandwidth_gbps": 10, "latency_ns": 5}
    network = build(generator=generator, failed_links=["leaf0->spine0", "spine1 <-> leaf3", "leaf0->spine2"])
    routes = [network.route(0, 12, seq) for seq in range(20)]
    used = {link for route in routes for link in route}
    assert not used & {"leaf0->spine0", "spine1->leaf3", "leaf3->spine1", "leaf0->spine2"}
    assert {route[1] for route in routes} == {"leaf0->spine3"}                    # the one spine left
    assert network.summary()["failed_links"] == ["leaf0->spine0", "leaf0->spine2", "leaf3->spine1", "spine1->leaf3"]
    cut = build(generator=generator, failed_links=["npu12->leaf3"])
    with pytest.raises(SimulationError, match="NPU 12 cannot reach NPU 0: failed links npu12->leaf3"):
        cut.send(12, 0, 100, print)
    # graphs route around failures too (shortest paths of what is left)
    fly = build(generator={"kind": "dragonfly", "groups": 3, "routers_per_group": 2, "hosts_per_router": 1,
                           "global_links_per_router": 1, "bandwidth_gbps": 10, "latency_ns": 5},
                failed_links=["r0.0<->r0.1"])
    assert "r0.0->r0.1" not in fly.route(0, 1) and len(fly.route(0, 1)) > 3


def test_unknown_link_names_are_config_errors_with_valid_names(tmp_path):
    generator = {"kind": "fat_tree", "hosts": 16, "radix": 8, "tiers": 2, "bandwidth_gbps": 10, "latency_ns": 5}
    with pytest.raises(ManifestError, match=r"failed_links\[1\]: unknown link 'leaf0->spine9'.*e.g. leaf0->spine3"):
        build(generator=generator, failed_links=["leaf0->spine1", "leaf0->spine9"])
    with pytest.raises(ManifestError, match=r"network.degraded_links\[0\].link: unknown link 'core->x'; .*e.g. npu0"):
        build(generator=generator, degraded_links=[{"link": "core->x", "bandwidth_factor": 0.5}])
    with pytest.raises(ManifestError, match="dimension order"):
        build(topology=["Ring"], npus_count=[4], bandwidth=[50.0], latency=[5.0], failed_links=["npu0->npu1"])
    # in a manifest, the key is located like any other configuration problem
    prefix = write_ranks(tmp_path, [[send(1, 1, 100)], [recv(1, 0, 100)]] + [[]] * 14)
    with pytest.raises(ManifestError, match=r"network.failed_links\[0\]: unknown link 'npu0->leaf9'"):
        simulate(manifest(prefix, {"plugin": "congestion", "generator": generator, "failed_links": ["npu0->leaf9"]},
                          system={}))


def test_degraded_links_keep_their_routes_with_less_bandwidth():
    generator = {"kind": "rail_optimized", "nodes": 2, "gpus_per_node": 2, "radix": 4, "bandwidth_gbps": 50,
                 "latency_ns": 500, "nvlink_bandwidth_gbps": 400, "nvlink_latency_ns": 100}
    plain = build(generator=generator)
    slow = build(generator=generator, degraded_links=[{"link": "rail0.0->npu2", "bandwidth_factor": 0.5},
                                                      {"link": "nvsw0<->npu1", "bandwidth_factor": 0.25}])
    index = {slow.topo.link_name(l): l for l in range(len(slow.topo.link_src))}
    assert slow.links.bw[index["rail0.0->npu2"]] == 25.0 and slow.links.bw[index["npu1->nvsw0"]] == 100.0
    assert slow.links.bw[index["nvsw0->npu1"]] == 100.0 and slow.links.bw[index["npu2->rail0.0"]] == 50.0
    assert [slow.route(0, 2, s) for s in range(4)] == [plain.route(0, 2, s) for s in range(4)]
    assert slow.summary()["degraded_links"][0] == {"link": "npu1->nvsw0", "bandwidth_factor": 0.25}


# End to end ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode, forwarding", [("fifo", None), ("fair", None), ("fifo", "store_and_forward")])
def test_uncongested_messages_on_a_rail_optimized_cluster_take_the_analytical_time(tmp_path, mode, forwarding):
    # 2 nodes x 4 GPUs; 4-port rail switches: both nodes under one switch per rail, 2 spines.
    size, generator = 1 << 20, {"kind": "rail_optimized", "nodes": 2, "gpus_per_node": 4, "radix": 4,
                                "spine_radix": 8, "bandwidth_gbps": 50, "latency_ns": 500,
                                "nvlink_bandwidth_gbps": 450, "nvlink_latency_ns": 100}
    ranks: list[list] = [[] for _ in range(8)]
    for tag, (src, dst) in enumerate([(0, 4), (1, 2), (5, 7), (3, 6)], start=1):
        ranks[src].append(send(len(ranks[src]) + 1, dst, size, tag=tag))
        ranks[dst].append(recv(len(ranks[dst]) + 1, src, size, tag=tag))
    results = simulate(manifest(write_ranks(tmp_path, ranks),
                                {"plugin": "congestion", "mode": mode, "generator": generator,
                                 **({"forwarding": forwarding} if forwarding else {})}, system={}))
    # no two messages share a link: each takes its idle route's time; cut-through (the default, and
    # fair) the latencies plus one transfer, store and forward every hop's latency and transfer
    if forwarding == "store_and_forward":   # rail: 2 hops at 50 GB/s and 500 ns, NVLink: 2 at 450 and 100, spine: 4 at 50 and 500
        rail_t, nvlink_t, spine_t = 2 * int(500 + size / 50), 2 * int(100 + size / 450), 4 * int(500 + size / 50)
    else:
        rail_t, nvlink_t, spine_t = int(2 * 500 + size / 50), int(2 * 100 + size / 450), int(4 * 500 + size / 50)
    finish = [r["finish_ns"] for r in results["ranks"]]
    assert finish == [rail_t, nvlink_t, nvlink_t, spine_t, rail_t, nvlink_t, spine_t, nvlink_t]
    rows = {r["link"]: r for r in results["layers"]["network"]["summary"]["hottest_links"]}
    assert rows["rail3.0->spine0.0"]["bytes"] + rows["rail3.0->spine0.1"]["bytes"] == size   # cross-rail: a spine
    assert rows["npu1->nvsw0"]["bytes"] == size and rows["rail2.0->npu2"]["bytes"] == 0      # intra-node: NVLink


def test_a_network_larger_than_the_limit_is_refused_at_once(monkeypatch):
    import time

    from pydantic import ValidationError

    from chakra_sim_network_congestion.config import CongestionConfig as Config

    started = time.perf_counter()
    for generator in ({"kind": "fat_tree", "k": 1_000_000, "bandwidth_gbps": 50, "latency_ns": 500},
                      {"kind": "torus", "dims": [4096, 4096], "bandwidth_gbps": 50, "latency_ns": 500}):
        with pytest.raises(ValidationError, match="more than the limit of 2,097,152 .CHAKRA_SIM_MAX_NETWORK_HOSTS"):
            Config.model_validate({"generator": generator})
    assert time.perf_counter() - started < 1
    monkeypatch.setenv("CHAKRA_SIM_MAX_NETWORK_HOSTS", str(1 << 25))
    Config.model_validate({"generator": {"kind": "torus", "dims": [4096, 4096], "bandwidth_gbps": 50,
                                         "latency_ns": 500}})


@pytest.mark.parametrize("key, value", [("npus_count", [True]), ("latency", [1e300]), ("latency", ["1e300"])])
def test_absurd_list_values_are_configuration_errors(key, value):
    from pydantic import ValidationError

    from chakra_sim_network_congestion.config import CongestionConfig as Config

    section = {"topology": ["Ring"], "npus_count": [8], "bandwidth": [50.0], "latency": [500.0], key: value}
    with pytest.raises(ValidationError, match=key):
        Config.model_validate(section)
