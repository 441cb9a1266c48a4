"""Collectives as steps of flows (fair mode): the same results as flow by flow.

`closed_form: false` sends every message through FairLinks one flow at a time; the default
claims a collective's links and times each step's flows at once (flows.py), with routes
computed for all of them at once (fabric_routes.py). Finish times, bytes and per-link bytes and
messages must not change, whatever the fabric, ECMP rule, algorithm, size and skew, and
whatever other traffic shares the links (the run then starts over with those links shared).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from chakra_core import pb
from chakra_core.testing import collective, comp, manifest, recv, send, simulate, write_ranks
from chakra_core.topology.fabric import FabricRouter
from chakra_sim_network_congestion.fabric_routes import fabric_routes, next_seqs, reachable_links
from chakra_core.topology.graph import clos_fat_tree, fat_tree, rail_optimized

GENERATORS = [
    {"kind": "fat_tree", "k": 4, "bandwidth_gbps": 50, "latency_ns": 500},
    {"kind": "fat_tree", "k": 4, "bandwidth_gbps": 50, "latency_ns": 500, "ecmp": "hash"},
    {"kind": "fat_tree", "hosts": 16, "radix": 6, "tiers": 2, "oversubscription": 2, "bandwidth_gbps": 50,
     "latency_ns": 300},
    {"kind": "rail_optimized", "nodes": 4, "gpus_per_node": 4, "radix": 4, "spine_radix": 8,
     "bandwidth_gbps": 50, "latency_ns": 500, "nvlink_bandwidth_gbps": 450, "nvlink_latency_ns": 100},
    {"kind": "rail_optimized", "nodes": 4, "gpus_per_node": 4, "radix": 4, "spine_planes": 2, "pxn": True,
     "ecmp": "dmodk", "bandwidth_gbps": 50, "latency_ns": 500, "nvlink_bandwidth_gbps": 450,
     "nvlink_latency_ns": 100},
]
KINDS = {"all_to_all": pb.ALL_TO_ALL, "all_reduce": pb.ALL_REDUCE, "all_gather": pb.ALL_GATHER,
         "reduce_scatter": pb.REDUCE_SCATTER}


def _run(prefix: str, generator: dict, system: dict, closed_form: bool) -> dict:
    return simulate(manifest(prefix, {"plugin": "congestion", "mode": "fair", "generator": generator,
                                      "closed_form": closed_form}, system=system))


def _links(results: dict) -> dict:
    return {row["link"]: (row["bytes"], row["messages"])
            for row in results["layers"]["network"]["summary"]["hottest_links"]}


@settings(max_examples=25, deadline=None)
@given(generator=st.sampled_from(GENERATORS), algorithm=st.sampled_from(["ring", "direct"]),
       kinds=st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=3),
       size=st.sampled_from([0, 1000, 1 << 16, 3 << 18]), skew=st.lists(st.integers(0, 5), min_size=16, max_size=16),
       p2p=st.booleans())
def test_steps_of_flows_equal_flow_by_flow(tmp_path_factory, generator, algorithm, kinds, size, skew, p2p):
    ranks = []
    for rank in range(16):
        nodes = [comp(1, skew[rank])]
        for index, kind in enumerate(kinds):
            nodes.append(collective(index + 2, KINDS[kind], size, deps=[index + 1]))
        if p2p:   # point-to-point traffic that may share the collectives' links
            nodes.append(send(10, (rank + 5) % 16, 1 << 16, deps=[2]))
            nodes.append(recv(11, (rank - 5) % 16, 1 << 16, deps=[2]))
        ranks.append(nodes)
    prefix = write_ranks(tmp_path_factory.mktemp("flows"), ranks)
    system = {f"{kind.replace('_', '-')}-implementation": [algorithm] for kind in KINDS}
    steps, one_by_one = _run(prefix, generator, system, True), _run(prefix, generator, system, False)
    for key in ("bytes_sent", "bytes_received"):
        assert [r[key] for r in steps["ranks"]] == [r[key] for r in one_by_one["ranks"]], key
    finishes = [(r["finish_ns"], s["finish_ns"]) for r, s in zip(steps["ranks"], one_by_one["ranks"])]
    if algorithm == "ring":
        assert all(a == b for a, b in finishes)
    else:
        # ASTRA-sim's direct members send each message of a step as the packets before it are
        # processed; as flows, a step's messages leave together: the same when they arrive
        # together (a balanced fabric), a few ns apart otherwise
        assert all(abs(a - b) <= max(0.01 * b, 64) for a, b in finishes), finishes
    assert _links(steps) == _links(one_by_one)
    assert one_by_one["layers"]["network"]["summary"]["closed_form_messages"] == 0


def test_a_balanced_all_to_all_is_timed_as_one_step_of_flows(tmp_path):
    # k=4 fat-tree routed D-mod-k: every flow of the all-to-all gets the same rate
    prefix = write_ranks(tmp_path, [[collective(1, pb.ALL_TO_ALL, 1 << 20)] for _ in range(16)])
    results = _run(prefix, GENERATORS[0], {"all-to-all-implementation": ["direct"]}, True)
    summary = results["layers"]["network"]["summary"]
    assert summary["closed_form_messages"] == summary["messages"] == 16 * 15
    # each NPU's one link into the fabric carries its 15 messages of 64 KiB at 50 GB/s
    assert results["finish_ns"] >= 15 * (1 << 16) / 50


FABRICS = [fat_tree(8, 50, 500, 1.0, 3, "dmodk"), fat_tree(8, 50, 500, 1.0, 3, "hash"),
           clos_fat_tree(200, 16, 50, 500, 3, 1.0, None, None, "hash"),
           clos_fat_tree(100, 16, 50, 500, 2, 2.0, None, None, "dmodk"),
           rail_optimized(8, 4, 4, 50, 500, 450, 100, 1.0, 8, 2, None, None, True, "hash"),
           rail_optimized(8, 4, 4, 50, 500, 450, 100, 1.0, 8, 2, None, None, False, "dmodk")]


@settings(max_examples=40, deadline=None)
@given(index=st.integers(0, len(FABRICS) - 1), data=st.data())
def test_routes_of_many_messages_are_the_routers_one_by_one(index, data):
    topo = FABRICS[index]
    n = topo.npus
    pairs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda p: p[0] != p[1]),
                               min_size=1, max_size=200))
    one, many = FabricRouter(topo), FabricRouter(topo)
    expected = [one.route_next(s, d) for s, d in pairs]
    src, dst = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    flow_start, flow_links = fabric_routes(topo.fabric, src, dst, next_seqs(many._sent, src, dst))
    assert [tuple(flow_links[flow_start[i]:flow_start[i + 1]].tolist()) for i in range(len(pairs))] == expected
    assert set(flow_links.tolist()) <= set(reachable_links(topo.fabric, src, dst).tolist())
    # the counts moved on as one by one; and back, when a rolled-back step gives them back
    assert [one.route_next(s, d) for s, d in pairs] == [many.route_next(s, d) for s, d in pairs]
    next_seqs(many._sent, src, dst, back=True)
    again = FabricRouter(topo)
    for s, d in pairs:
        again.route_next(s, d)
    assert [many.route_next(s, d) for s, d in pairs] == [again.route_next(s, d) for s, d in pairs]
