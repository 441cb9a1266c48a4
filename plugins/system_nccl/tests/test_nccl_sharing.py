"""NIC shares, fabrics shared by communicators in flight together, and folded runs of the nccl layer."""

from __future__ import annotations

import pytest

from chakra_core import pb
from chakra_core.contract.folding import Folding
from chakra_core.hardware.profiles import load_profile
from chakra_core.testing import collective, comp, recv, send, simulate, write_ranks
from chakra_core.jobs.expand import read_job, write_job
from chakra_core.jobs.placement import Placement
from chakra_core.tools.generate import transformer_job
from chakra_sim_system_nccl import model as nccl
from chakra_sim_system_nccl.folded import FoldedMatching
from chakra_sim_system_nccl.sharing import NIC, NVLINK, FabricLoad, group_shape

H100, NDR = "h100-sxm-hgx", "h100-hgx-ndr400"


def run(tmp_path, ranks, profile=NDR, comm_groups=None, fold="auto", streams=1):
    prefix = write_ranks(tmp_path / "t", ranks)
    data = {"workload": {"trace": prefix, "fold": fold, "resources": {"comm": streams}},
            "system": {"plugin": "nccl", "profile": profile}}
    if comm_groups is not None:
        data["workload"]["comm_groups"] = comm_groups
    return simulate(data)


def ns(time_us: float) -> int:
    return int(round(time_us * 1000))


def test_one_gpu_per_node_drives_one_nic(tmp_path):
    """32 ranks, one on each of 32 nodes: the ring is bound by each GPU's own 400 Gb/s NIC."""
    size, n = 2**33, 32
    members = [8 * i for i in range(n)]
    traces = [[collective(0, pb.ALL_REDUCE, size, pg_name="dp")] if r % 8 == 0 else [] for r in range(8 * n)]
    results = run(tmp_path, traces, comm_groups={"dp": members})
    profile = load_profile(NDR)
    nic_bytes_per_s = profile.network.nic_gbits.value / 8 * 1e9
    bound_ns = 2 * (n - 1) / n * size / nic_bytes_per_s * 1e9
    assert results["finish_ns"] >= bound_ns
    expected = nccl.NcclModel(profile).time_us(nccl.ALL_REDUCE, size, n, n, 1 / 8)
    assert results["finish_ns"] == ns(expected.time_us)
    # the whole node's NICs would have made it about 8 times faster: the share is what binds
    assert nccl.NcclModel(profile).time_us(nccl.ALL_REDUCE, size, n, n).time_us * 1000 < bound_ns / 4


def test_full_node_groups_keep_all_nics():
    model = nccl.NcclModel(load_profile(NDR))
    assert group_shape(tuple(range(16)), 8).nic_share == 1.0
    assert model.time_us(nccl.ALL_REDUCE, 2**28, 16, 2, 1.0) == model.time_us(nccl.ALL_REDUCE, 2**28, 16, 2)
    shape = group_shape((0, 1, 2, 8, 9, 10, 11), 8)   # the node with 3 of them bounds it
    assert (shape.nodes, shape.local, shape.nic_share) == (2, 3, 3 / 8)


def test_nvls_needs_more_than_two_gpus_of_a_node():
    model = nccl.NcclModel(load_profile(H100))
    assert model.time_us(nccl.ALL_REDUCE, 2**30, 4, 1).algorithm == "nvls"
    assert model.time_us(nccl.ALL_REDUCE, 2**30, 2, 1).algorithm != "nvls"


def _overlapping(size_a, size_b, delay_us):
    """Ranks 0-7 all-reduce `size_a` on the node; from `delay_us` on, pairs all-reduce `size_b`."""
    return [[collective(0, pb.ALL_REDUCE, size_a, pg_name="node"), comp(1, delay_us),
             collective(2, pb.ALL_REDUCE, size_b, deps=[1], pg_name=f"tp{r // 2}")] for r in range(8)]


@pytest.mark.parametrize("fold", ["auto", "off"])
def test_collectives_in_flight_share_nvlink(tmp_path, fold):
    groups = {"node": list(range(8)), **{f"tp{i}": [2 * i, 2 * i + 1] for i in range(4)}}
    # two communication streams per GPU (workload.resources.comm), as TP and DP use in training
    results = run(tmp_path, _overlapping(2**30, 2**30, 10), H100, groups, fold, streams=2)
    model = nccl.NcclModel(load_profile(H100))
    big = model.time_us(nccl.ALL_REDUCE, 2**30, 8, 1)
    pair = model.time_us(nccl.ALL_REDUCE, 2**30, 2, 1)
    # the pairs start while the node's all-reduce runs, and would end before it alone
    assert 10 + pair.time_us < big.time_us
    # the pair's bandwidth term is halved: one other operation on each member's NVLink
    shared = ns(pair.latency_us + 2 * (pair.time_us - pair.latency_us))
    assert results["finish_ns"] == 10_000 + shared > ns(big.time_us)
    assert (results["folding"]["folded"], len(results["ranks"])) == (fold == "auto", 8)


def test_operations_starting_together_do_not_slow_each_other(tmp_path):
    groups = {"node": list(range(8)), **{f"tp{i}": [2 * i, 2 * i + 1] for i in range(4)}}
    traces = [[collective(0, pb.ALL_REDUCE, 2**30, pg_name="node"),
               collective(1, pb.ALL_REDUCE, 2**28, pg_name=f"tp{r // 2}")] for r in range(8)]
    results = run(tmp_path, traces, H100, groups, streams=2)
    model = nccl.NcclModel(load_profile(H100))
    assert results["finish_ns"] == ns(model.time_us(nccl.ALL_REDUCE, 2**30, 8, 1).time_us)


def test_send_shares_the_nic_with_a_collective(tmp_path):
    size = 2**27
    traces = [[collective(0, pb.ALL_REDUCE, size, pg_name="dp")] if r in (0, 8) else [] for r in range(16)]
    traces[0] += [comp(1, 5), send(2, 8, size, deps=[1])]
    traces[8] += [recv(1, 0, size)]
    results = run(tmp_path, traces, comm_groups={"dp": [0, 8]}, streams=2)
    model = nccl.NcclModel(load_profile(NDR))
    coll = model.time_us(nccl.ALL_REDUCE, size, 2, 2, 1 / 8)
    latency = model.p2p_latency_us(False)
    transfer = size / (1000 * model.p2p_bandwidth_gbps(False))
    assert 5 < coll.time_us < 5 + latency + 2 * transfer   # the message leaves while the all-reduce runs
    # the message at half of the NIC: the all-reduce is in flight at both of its ends
    arrival = 5_000 + ns(latency + 2 * transfer)
    assert [results["ranks"][r]["finish_ns"] for r in (0, 8)] == [arrival] * 2
    assert results["layers"]["system"]["summary"]["unmatched_sends"] == []


def test_send_after_a_collective_has_the_nic_to_itself(tmp_path):
    size = 2**26
    traces = [[] for _ in range(16)]
    traces[0] = [comp(0, 5), send(1, 8, size, deps=[0])]
    traces[8] = [recv(0, 0, size)]
    results = run(tmp_path, traces)
    model = nccl.NcclModel(load_profile(NDR))
    assert results["ranks"][8]["finish_ns"] == 5_000 + ns(model.p2p_time_us(size, False))


def test_fabric_load_counts_only_earlier_operations():
    load = FabricLoad(4)
    load.add(NIC, (0, 1), 0, 100)
    load.add(NVLINK, (2,), 0, 100)
    assert load.others(NIC, (1, 2), 50) == 1
    assert load.others(NIC, (0,), 0) == 0     # started at the same instant
    load.add(NIC, (0,), 50, 200)
    assert load.others(NIC, (0, 3), 60) == 2
    assert load.others(NIC, (0,), 100) == 1   # the first finished at this instant


def test_folding_without_groups_starts_over():
    """A Folding handed over without groups_of: the layer cannot match groups, so it asks to unfold."""
    requests = []
    folding = Folding.of([0, 0, 2, 2], [])
    matching = FoldedMatching(folding, 4, lambda members: len(members), lambda a, b: a // 2 == b // 2,
                              lambda reason, hint: requests.append(reason), lambda coll: None)

    class Coll:
        members, needs = (0, 2), None

    matching.issue(0, Coll())
    assert requests and "simulating every rank" in requests[0]


@pytest.mark.parametrize("dp,tp,pp,gpus_per_node,reduce", [(4, 2, 2, 8, "allreduce"), (4, 2, 2, 2, "allreduce"),
                                                          (2, 2, 4, 2, "rs-ag")])
def test_generated_transformer_folds_exactly(tmp_path, dp, tp, pp, gpus_per_node, reduce):
    job = read_job(transformer_job(layers=4, hidden=512, heads=8, seq=512, batch=dp * pp, vocab=51200, dp=dp,
                                   tp=tp, pp=pp, sp=True, dp_reduce=reduce), "test")
    write_job(job, Placement(job, gpus_per_node), tmp_path / "gpt")
    outs = {}
    for fold in ("auto", "off"):
        outs[fold] = simulate({"workload": {"trace": str(tmp_path / "gpt"), "fold": fold},
                               "compute": {"plugin": "roofline", "profile": H100},
                               "system": {"plugin": "nccl", "profile": NDR, "gpus-per-node": gpus_per_node}})
    folded, unfolded = outs["auto"], outs["off"]
    assert folded["folding"]["folded"] and folded["folding"]["simulated_ranks"] < dp * tp * pp
    for results in (folded, unfolded):
        for key in ("folding", "events"):
            results.pop(key)
        results["manifest"]["workload"].pop("fold")
    assert folded == unfolded
