"""Collectives as steps of messages (fifo mode): the same results as message by message.

`closed_form: false` sends every message through FifoLinks' events one hop at a time; the
default claims a collective's links and times each step's messages at once (fifosteps.py).
Every rank's finish time and every link's bytes, messages, busy time and peak must be the
same, to the ns, whatever the network, forwarding, algorithm, size and skew, and whatever
other traffic shares the links (the run then starts over with those links shared).
"""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from chakra_core import pb
from chakra_core.testing import collective, comp, manifest, recv, send, simulate, write_ranks

NETWORKS = [
    {"generator": {"kind": "fat_tree", "k": 4, "bandwidth_gbps": 50, "latency_ns": 500}},
    {"generator": {"kind": "fat_tree", "k": 4, "bandwidth_gbps": 50, "latency_ns": 500, "ecmp": "hash"}},
    {"generator": {"kind": "fat_tree", "hosts": 16, "radix": 6, "tiers": 2, "oversubscription": 2,
                   "bandwidth_gbps": 50, "latency_ns": 300}},
    {"generator": {"kind": "rail_optimized", "nodes": 4, "gpus_per_node": 4, "radix": 4, "spine_radix": 8,
                   "bandwidth_gbps": 50, "latency_ns": 500, "nvlink_bandwidth_gbps": 450,
                   "nvlink_latency_ns": 100}},
    {"generator": {"kind": "fat_tree", "k": 4, "bandwidth_gbps": 37.5, "latency_ns": 7}},
    {"topology": ["Switch"], "npus_count": [16], "bandwidth": [50], "latency": [500]},
    {"topology": ["Ring", "Switch"], "npus_count": [4, 4], "bandwidth": [50, 37.5], "latency": [500, 20]},
    {"topology": ["FullyConnected"], "npus_count": [16], "bandwidth": [200], "latency": [1]},
]
KINDS = {"all_to_all": pb.ALL_TO_ALL, "all_reduce": pb.ALL_REDUCE, "all_gather": pb.ALL_GATHER,
         "reduce_scatter": pb.REDUCE_SCATTER}
LINK_KEYS = ("bytes", "messages", "busy_ns", "peak_concurrent", "utilization")


def _run(prefix: str, network: dict, forwarding: str, system: dict, closed_form: bool) -> dict:
    return simulate(manifest(prefix, {"plugin": "congestion", "mode": "fifo", "forwarding": forwarding,
                                      "closed_form": closed_form, **network}, system=system))


def _links(results: dict) -> dict:
    return {row["link"]: tuple(row[key] for key in LINK_KEYS)
            for row in results["layers"]["network"]["summary"]["hottest_links"]}


def _same(steps: dict, one_by_one: dict) -> None:
    for key in ("finish_ns", "bytes_sent", "bytes_received", "exposed_network_ns", "waiting_ns"):
        assert [r[key] for r in steps["ranks"]] == [r[key] for r in one_by_one["ranks"]], key
    assert _links(steps) == _links(one_by_one)
    a, b = steps["layers"]["network"]["summary"], one_by_one["layers"]["network"]["summary"]
    assert (a["messages"], a["message_bytes"]) == (b["messages"], b["message_bytes"])
    assert b["closed_form_messages"] == 0


@settings(max_examples=40, deadline=None)
@given(network=st.sampled_from(NETWORKS), forwarding=st.sampled_from(["cut_through", "store_and_forward"]),
       algorithm=st.sampled_from(["ring", "direct"]),
       kinds=st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=3),
       size=st.sampled_from([0, 1000, 1 << 16, 3 << 18]), skew=st.lists(st.integers(0, 5), min_size=16, max_size=16),
       p2p=st.booleans())
def test_steps_of_messages_equal_message_by_message(tmp_path_factory, network, forwarding, algorithm, kinds, size,
                                                    skew, p2p):
    # ASTRA-sim's lists store and forward: there the closed form (claims.py) times what one sender's
    # links carry, and counts a cut-through message on a link until its last byte left (not
    # until its next hop's event, as message by message does: a peak of 2 instead of 1)
    assume(not ("topology" in network and forwarding == "cut_through"))
    ranks = []
    for rank in range(16):
        nodes = [comp(1, skew[rank])]
        for index, kind in enumerate(kinds):
            nodes.append(collective(index + 2, KINDS[kind], size, deps=[index + 1]))
        if p2p:   # point-to-point traffic that may share the collectives' links
            nodes.append(send(10, (rank + 5) % 16, 1 << 16, deps=[2]))
            nodes.append(recv(11, (rank - 5) % 16, 1 << 16, deps=[2]))
        ranks.append(nodes)
    prefix = write_ranks(tmp_path_factory.mktemp("steps"), ranks)
    system = {f"{kind.replace('_', '-')}-implementation": [algorithm] for kind in KINDS}
    _same(_run(prefix, network, forwarding, system, True), _run(prefix, network, forwarding, system, False))


def test_an_all_to_all_on_a_fat_tree_is_timed_as_one_step(tmp_path):
    prefix = write_ranks(tmp_path, [[collective(1, pb.ALL_TO_ALL, 1 << 20)] for _ in range(16)])
    system = {"all-to-all-implementation": ["direct"]}
    steps = _run(prefix, NETWORKS[0], "cut_through", system, True)
    summary = steps["layers"]["network"]["summary"]
    assert summary["closed_form_messages"] == summary["messages"] == 16 * 15
    assert steps["events"] < 100
    _same(steps, _run(prefix, NETWORKS[0], "cut_through", system, False))


def test_a_direct_all_reduce_runs_message_by_message(tmp_path):
    # its members start the all-gather as each piece is processed: steps would not be exact
    prefix = write_ranks(tmp_path, [[collective(1, pb.ALL_REDUCE, 1 << 20)] for _ in range(16)])
    results = _run(prefix, NETWORKS[0], "cut_through", {"all-reduce-implementation": ["direct"]}, True)
    assert results["layers"]["network"]["summary"]["closed_form_messages"] == 0


def test_sends_whose_order_the_network_cannot_know_start_the_run_over(tmp_path):
    # hashed ECMP puts two members' messages, sent in one ns, on one link in one ns: which goes
    # first depends on the order of the members' send events; the links go message by message
    prefix = write_ranks(tmp_path, [[collective(1, pb.ALL_TO_ALL, 1 << 20)] for _ in range(16)])
    system = {"all-to-all-implementation": ["direct"]}
    steps = _run(prefix, NETWORKS[1], "cut_through", system, True)
    assert any("started over" in warning for warning in steps["warnings"])
    _same(steps, _run(prefix, NETWORKS[1], "cut_through", system, False))


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.integers(0, (1 << 30) - 1), max_size=300), bound=st.sampled_from([64, 1 << 17, 1 << 30]))
def test_stable_order_is_a_stable_argsort(keys, bound):
    # the three ways it sorts: 16-bit keys (radix), keys that pack with their positions into
    # 32 bits, and into 64
    import numpy as np

    from chakra_sim_network_congestion.fifoqueues import stable_order

    values = np.asarray([key % bound for key in keys], dtype=np.int64)
    order, sorted_keys = stable_order(values, bound)
    assert order.tolist() == np.argsort(values, kind="stable").tolist()
    assert sorted_keys.tolist() == sorted(values.tolist())
