"""The `nccl` layer on a network layer: its inter-node traffic as flows (traffic.py), folded and not."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from chakra_core import SimulationError, pb
from chakra_core.hardware.profiles import load_profile
from chakra_core.run import load, simulate as run_manifest
from chakra_core.testing import collective, comp, recv, send, simulate, write_ranks
from chakra_sim_system_nccl import model as nccl
from chakra_sim_system_nccl.traffic import btree_parent, collective_flows, dtree_parents

NDR = "h100-hgx-ndr400"
NIC_GBPS = 50.0   # the NDR profile: 8 x 400 Gb/s NICs for 8 GPUs, one per GPU


def rail_network(nodes: int, bandwidth: float = NIC_GBPS, **extra: Any) -> dict[str, Any]:
    return {"plugin": "congestion", "mode": "fair",
            "generator": {"kind": "rail_optimized", "nodes": nodes, "gpus_per_node": 8, "radix": 16,
                          "bandwidth_gbps": bandwidth, "latency_ns": 700, "nvlink_bandwidth_gbps": 450,
                          "nvlink_latency_ns": 100, **extra}}


def run(tmp_path, ranks, network=None, comm_groups=None):
    prefix = write_ranks(tmp_path / "t", ranks)
    data: dict[str, Any] = {"workload": {"trace": prefix}, "system": {"plugin": "nccl", "profile": NDR}}
    if network is not None:
        data["network"] = network
    if comm_groups is not None:
        data["workload"]["comm_groups"] = comm_groups
    return simulate(data)


# Flows of NCCL's algorithms ------------------------------------------------------------------------

def test_btree_is_nccls():
    """NCCL's src/graph/trees.cc illustration for 14 ranks."""
    parents = {8: 0, 4: 8, 12: 8, 2: 4, 6: 4, 10: 12, 1: 2, 3: 2, 5: 6, 7: 6, 9: 10, 11: 10, 13: 12}
    assert [btree_parent(14, rank) for rank in range(14)] == [-1] + [parents[r] for r in range(1, 14)]
    first, second = dtree_parents(12)     # mirrored: the second tree's root is rank 11
    assert second.index(-1) == 11 and second[3] == 11


@given(st.integers(1, 300))
def test_both_trees_span_every_node(nranks):
    for parents in dtree_parents(nranks):
        assert parents.count(-1) == 1
        for rank in range(nranks):
            seen = set()
            while parents[rank] != -1:
                assert rank not in seen
                seen.add(rank)
                rank = parents[rank]


@settings(max_examples=60, deadline=None)
@given(nodes=st.integers(2, 12), local=st.integers(1, 8), size=st.integers(1, 2**30),
       kind=st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "tree"]))
def test_ring_and_tree_flows_conserve_bytes_and_stay_on_rails(nodes, local, size, kind):
    members = tuple(node * 8 + slot for node in range(nodes) for slot in range(local))
    n = len(members)
    per_rank = {"all_reduce": 2 * (n - 1) * size // n}.get(kind, (n - 1) * size // n)
    comm = {"all_gather": pb.ALL_GATHER, "reduce_scatter": pb.REDUCE_SCATTER}.get(kind, pb.ALL_REDUCE)
    flows = collective_flows(comm, "tree" if kind == "tree" else "ring", members, members[0], size, per_rank, 8)
    assert all(src // 8 != dst // 8 and src % 8 == dst % 8 and bytes_ > 0 for src, dst, bytes_ in flows)
    total = sum(bytes_ for _, _, bytes_ in flows)
    if kind == "tree":   # each tree: half the buffer up and down each of its nodes - 1 edges
        assert total == 2 * (nodes - 1) * size
    else:                # every node boundary of the ring carries what one rank sends
        assert total == nodes * per_rank


def test_all_to_all_and_p2p_flows():
    members = (0, 1, 8, 9)
    flows = collective_flows(pb.ALL_TO_ALL, "p2p", members, 0, 4096, 3072, 8)
    assert sorted((s, d) for s, d, _ in flows) == [(0, 8), (0, 9), (1, 8), (1, 9), (8, 0), (8, 1), (9, 0), (9, 1)]
    assert {b for _, _, b in flows} == {1024}
    assert collective_flows(pb.ALL_REDUCE, "ring", (0, 1, 2, 3), 0, 2**20, 2**20, 8) == []   # one node


def test_broadcast_and_reduce_chain_from_and_to_the_root():
    members = tuple(range(0, 32, 8))    # one GPU on each of 4 nodes
    down = collective_flows(pb.BROADCAST, "ring", members, 16, 100, 100, 8)
    assert [(s, d) for s, d, _ in down] == [(16, 24), (24, 0), (0, 8)]
    up = collective_flows(pb.REDUCE, "ring", members, 16, 100, 100, 8)
    assert [(s, d) for s, d, _ in up] == [(24, 16), (0, 24), (8, 0)]


# The layer on a network --------------------------------------------------------------------------

def test_an_idle_network_as_fast_as_the_nics_changes_nothing(tmp_path):
    """One all-reduce across 2 nodes, alone: NCCL's time, as without a network."""
    size = 2**28
    traces = [[collective(0, pb.ALL_REDUCE, size)]] * 16
    alone = run(tmp_path / "a", traces)["finish_ns"]
    networked = run(tmp_path / "b", traces, rail_network(2))
    assert networked["finish_ns"] == alone
    summary = networked["layers"]["network"]["summary"]
    [choice] = networked["layers"]["system"]["summary"]["choices"]
    if choice["algorithm"].endswith("tree"):   # two trees: half the buffer up and down their one edge
        assert summary["message_bytes"] == 2 * size
    else:                                      # two node boundaries of the ring
        assert summary["message_bytes"] == 2 * (2 * 15 * size // 16)


def test_a_slow_network_bounds_the_collective_and_no_flow_beats_its_link(tmp_path):
    size = 2**28
    traces = [[collective(0, pb.ALL_REDUCE, size)]] * 16
    alone = run(tmp_path / "a", traces)["finish_ns"]
    slow = run(tmp_path / "b", traces, rail_network(2, bandwidth=5.0))
    assert slow["finish_ns"] > alone
    nic_links = [row for row in slow["layers"]["network"]["summary"]["hottest_links"]
                 if "rail" in row["link"]]
    assert max(row["bytes"] for row in nic_links) >= size // 8     # each NIC carries its share
    for row in nic_links:   # 5 GB/s = 5 bytes per ns
        assert row["busy_ns"] * 5.0 >= row["bytes"] * 0.999
        assert slow["finish_ns"] * 5.0 >= row["bytes"]


def test_concurrent_communicators_share_the_spines(tmp_path):
    """Two groups on rail 0 (nodes 0 and 3, nodes 1 and 4) whose rail switches have one up-link
    each (3:1 oversubscribed): together they take longer than either alone."""
    size = 2**28
    groups = {"a": [0, 24], "b": [8, 32]}
    network = rail_network(6)
    network["generator"].update(radix=4, oversubscription=3.0, spine_radix=16)

    def traces(which: str) -> list[list[Any]]:
        out: list[list[Any]] = [[] for _ in range(48)]
        for name in which:
            for rank in groups[name]:
                out[rank] = [collective(0, pb.ALL_REDUCE, size, pg_name=name)]
        return out

    one = run(tmp_path / "one", traces("a"), network, comm_groups=groups)
    both = run(tmp_path / "both", traces("ab"), network, comm_groups=groups)
    assert both["finish_ns"] > one["finish_ns"]
    peaks = {row["link"]: row["peak_concurrent"] for row in both["layers"]["network"]["summary"]["hottest_links"]}
    assert max(peaks.values()) == 2


def test_messages_across_nodes_cross_the_network(tmp_path):
    size = 2**24
    traces: list[list[Any]] = [[] for _ in range(16)]
    traces[0] = [send(0, 8, size)]
    traces[8] = [recv(0, 0, size)]
    fast = run(tmp_path / "fast", traces, rail_network(2))
    model = nccl.NcclModel(load_profile(NDR))
    assert fast["ranks"][8]["finish_ns"] == int(round(model.p2p_time_us(size, False) * 1000))
    slow = run(tmp_path / "slow", traces, rail_network(2, bandwidth=1.0))
    assert slow["ranks"][8]["finish_ns"] >= size / 1.0
    assert slow["layers"]["network"]["summary"]["message_bytes"] == size


# Folding ------------------------------------------------------------------------------------------

SMALL_MODEL = {"layers": 4, "hidden": 1024, "ffn_hidden": 2816, "heads": 16, "kv_heads": 4, "vocab": 32000}


def job_manifest(tmp_path, fold: str, job: dict[str, Any] | None = None, **generator: Any) -> dict[str, Any]:
    return {"job": job or {"name": "t", "model": SMALL_MODEL, "parallel": {"tp": 2, "pp": 2},
                           "training": {"seq": 1024, "global_batch": 16},
                           "cluster": {"gpus": 32, "profile": NDR}},
            "workload": {"fold": fold}, "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"},
            "network": {"plugin": "congestion", "mode": "fair",
                        "generator": {"kind": "rail_optimized", "nodes": 4, "gpus_per_node": 8, "radix": 4,
                                      "spine_radix": 16, "bandwidth_gbps": 12.5, "latency_ns": 700,
                                      "nvlink_bandwidth_gbps": 450, "nvlink_latency_ns": 100, **generator}},
            "output": {"dir": str(tmp_path / fold)}}


def test_folded_job_on_a_congested_network_equals_every_rank_simulated(tmp_path):
    folded = run_manifest(load(job_manifest(tmp_path, "auto", ecmp="dmodk"), base_dir=tmp_path)).document
    assert folded["folding"]["folded"]
    unfolded = run_manifest(load(job_manifest(tmp_path, "off", ecmp="dmodk"), base_dir=tmp_path)).document
    assert not unfolded["folding"]["folded"]
    assert folded["finish_ns"] == unfolded["finish_ns"]
    net_f, net_u = (r["layers"]["network"]["summary"] for r in (folded, unfolded))
    assert net_f["message_bytes"] == net_u["message_bytes"] > 0
    assert net_f["link_bytes"] == net_u["link_bytes"]


def test_ring_attention_across_nodes_folds_on_a_congested_network(tmp_path):
    """TP 8, CP 2: every ring exchange crosses between nodes, so one CP rank stands for the other
    and its exchanges send the flows of every ring it stands for."""
    job = {"name": "t", "model": {**SMALL_MODEL, "kv_heads": 8}, "parallel": {"tp": 8, "pp": 2, "cp": 2},
           "training": {"seq": 4096, "global_batch": 4}, "cluster": {"gpus": 32, "profile": NDR}}
    folded = run_manifest(load(job_manifest(tmp_path, "auto", job, ecmp="dmodk"), base_dir=tmp_path)).document
    assert folded["folding"]["simulated_ranks"] == 2
    unfolded = run_manifest(load(job_manifest(tmp_path, "off", job, ecmp="dmodk"), base_dir=tmp_path)).document
    assert folded["ranks"] == unfolded["ranks"] and folded["training"] == unfolded["training"]
    net_f, net_u = (r["layers"]["network"]["summary"] for r in (folded, unfolded))
    assert net_f["message_bytes"] == net_u["message_bytes"] > 0
    assert net_f["link_bytes"] == net_u["link_bytes"]


def test_a_failed_link_breaks_the_symmetry_says_where_and_the_job_runs_unfolded(tmp_path):
    """Class mates whose flows cross a failed link get through apart: the folded job writes every
    rank's traces and starts over with every rank simulated, saying why, and gives fold: off's results."""
    data = job_manifest(tmp_path, "auto", ecmp="dmodk")
    data["network"]["failed_links"] = ["rail0.0<->spine0.0"]
    started_over = run_manifest(load(data, base_dir=tmp_path)).document
    assert not started_over["folding"]["folded"]
    assert re.search(r"takes [\d,]+ ns on the network and .* folded with", started_over["folding"]["reason"])
    assert any(w.startswith("the run started over (1 time(s)): ") for w in started_over["warnings"])
    data = job_manifest(tmp_path, "off", ecmp="dmodk")
    data["network"]["failed_links"] = ["rail0.0<->spine0.0"]
    unfolded = run_manifest(load(data, base_dir=tmp_path)).document
    assert started_over["ranks"] == unfolded["ranks"] and started_over["training"] == unfolded["training"]
    assert started_over["layers"]["network"]["summary"]["link_bytes"] == unfolded["layers"]["network"]["summary"]["link_bytes"]


def test_idle_time_is_accounted(tmp_path):
    """Time categories still sum to each rank's finish with the network in the loop."""
    size = 2**26
    traces = [[comp(0, 100), collective(1, pb.ALL_REDUCE, size, deps=[0])]] * 16
    results = run(tmp_path, traces, rail_network(2, bandwidth=10.0))
    keys = ("gpu_compute_ns", "cpu_compute_ns", "memory_ns", "exposed_network_ns", "waiting_ns", "idle_ns")
    for rank in results["ranks"]:
        assert sum(rank[k] for k in keys) == rank["finish_ns"]
