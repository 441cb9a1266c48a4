"""The per-rank time breakdown: six exclusive categories that sum to the finish time."""

from __future__ import annotations

from chakra_core.schema import pb
from tests.helpers import make_node
from tests.simhelpers import (collective, comp, hop_ns, manifest, recv, ring_network, send, simulate,
                              write_ranks)

BREAKDOWN = ("gpu_compute_ns", "cpu_compute_ns", "memory_ns", "exposed_network_ns", "waiting_ns", "idle_ns")


def _run(tmp_path, ranks, **kwargs):
    prefix = write_ranks(tmp_path / "t", ranks)
    results = simulate(manifest(prefix, ring_network(len(ranks)), **kwargs))
    for row in results["ranks"]:
        assert sum(row[key] for key in BREAKDOWN) == row["finish_ns"]
    return results


def _times(row):
    return {key: row[key] for key in BREAKDOWN if row[key]}


def test_gpu_time_hides_overlapping_cpu_time(tmp_path):
    overlapped = [comp(1, 10, is_cpu_op=True), comp(2, 20)]
    serial = [comp(1, 10, is_cpu_op=True), comp(2, 20, deps=[1])]
    results = _run(tmp_path, [overlapped, serial])
    assert _times(results["ranks"][0]) == {"gpu_compute_ns": 20_000}
    assert _times(results["ranks"][1]) == {"cpu_compute_ns": 10_000, "gpu_compute_ns": 20_000}


def test_skew_before_a_collective_is_waiting_not_network(tmp_path):
    size = 1 << 20
    late = [comp(1, 10), collective(2, pb.ALL_REDUCE, size, deps=[1])]
    early = [collective(2, pb.ALL_REDUCE, size)]
    rank0, rank1 = _run(tmp_path, [late, early])["ranks"]
    assert _times(rank0) == {"gpu_compute_ns": 10_000, "exposed_network_ns": rank0["finish_ns"] - 10_000}
    assert _times(rank1) == {"waiting_ns": 10_000, "exposed_network_ns": rank1["finish_ns"] - 10_000}
    assert rank1["exposed_comm_ns"] == rank1["finish_ns"]    # ASTRA-sim's figure lumps them together


def test_a_receive_waits_for_its_sender_then_the_message_is_network_time(tmp_path):
    # a pipeline bubble: stage 1 posts its receive before stage 0 has computed what it sends
    size = 100_000
    results = _run(tmp_path, [[comp(1, 5), send(2, 1, size, deps=[1])], [recv(1, 0, size)]])
    d = hop_ns(size)
    assert _times(results["ranks"][0]) == {"gpu_compute_ns": 5000, "exposed_network_ns": d}
    assert _times(results["ranks"][1]) == {"waiting_ns": 5000, "exposed_network_ns": d}


def test_a_receive_posted_after_its_message_left_does_not_wait(tmp_path):
    size = 100_000
    results = _run(tmp_path, [[send(1, 1, size)], [comp(1, 1), recv(2, 0, size, deps=[1])]])
    d = hop_ns(size)
    assert _times(results["ranks"][1]) == {"gpu_compute_ns": 1000, "exposed_network_ns": d - 1000}


def test_a_rendezvous_send_waits_for_its_receiver(tmp_path):
    size = 100_000
    ranks = [[send(1, 1, size)], [comp(1, 5), recv(2, 0, size, deps=[1])]]
    results = _run(tmp_path, ranks, system={"rendezvous-protocol": True})
    moving = hop_ns(8192) + hop_ns(size)
    assert _times(results["ranks"][0]) == {"waiting_ns": 5000, "exposed_network_ns": moving}
    assert _times(results["ranks"][1]) == {"gpu_compute_ns": 5000, "exposed_network_ns": moving}


def test_the_root_of_a_broadcast_never_waits_for_its_peers(tmp_path):
    size = 1 << 16
    root = [collective(1, pb.BROADCAST, size)]
    late = [comp(1, 50), collective(2, pb.BROADCAST, size, deps=[1])]
    results = _run(tmp_path, [root, late], system={"broadcast-implementation": ["star"]})
    assert results["ranks"][0]["waiting_ns"] == 0
    assert results["ranks"][1]["waiting_ns"] == 0     # its data had arrived: it waited for nothing
    assert results["ranks"][0]["exposed_network_ns"] == results["ranks"][0]["finish_ns"]


def test_a_collective_counts_as_waiting_only_while_a_member_is_missing(tmp_path):
    size = 1 << 18
    ranks = [[comp(1, 7 * (r + 1)), collective(2, pb.ALL_GATHER, size, deps=[1])] for r in range(4)]
    results = _run(tmp_path, ranks)
    last_issue = 28_000
    for r, row in enumerate(results["ranks"]):
        assert row["waiting_ns"] == last_issue - 7000 * (r + 1)
        assert row["gpu_compute_ns"] == 7000 * (r + 1)


def test_memory_time_with_the_hbm_model(tmp_path):
    load = make_node(1, pb.MEM_LOAD_NODE, attrs={"tensor_size": 1 << 20})
    results = _run(tmp_path, [[load, comp(2, 3, deps=[1])]] * 2, memory={"plugin": "hbm"})
    row = results["ranks"][0]
    assert row["memory_ns"] > 0 and row["gpu_compute_ns"] == 3000
    assert row["finish_ns"] == row["memory_ns"] + 3000


def test_a_pipeline_bubble_is_waiting_not_network_time(tmp_path):
    """Generated GPT, PP=4 on a network that costs (almost) nothing: the pipeline's bubble used
    to show up as exposed communication."""
    from click.testing import CliRunner

    from chakra_core.tools.generate import generate

    prefix = tmp_path / "gpt"
    result = CliRunner().invoke(generate, [
        "transformer", "--layers", "4", "--hidden", "256", "--heads", "4", "--seq", "128", "--batch", "8",
        "--vocab", "1024", "--pp", "4", "--tp", "2", "--microbatches", "4", "--output", str(prefix)])
    assert result.exit_code == 0, result.output
    free = {"plugin": "analytical", "topology": ["Switch"], "npus_count": [8], "bandwidth": [1e9],
            "latency": [0]}
    results = simulate(manifest(str(prefix), free, system={"endpoint-delay": 0, "local-mem-bw": 1e12},
                                compute={"plugin": "roofline", "peak_tflops": 100, "memory_bandwidth_gbps": 2000}))
    for row in results["ranks"]:
        assert sum(row[key] for key in BREAKDOWN) == row["finish_ns"]
        assert row["exposed_network_ns"] <= 0.01 * row["finish_ns"], row
    # 1F1B with 4 stages and 4 micro-batches: every stage idles for (pp - 1) slots of the pipeline
    waiting = [row["waiting_ns"] for row in results["ranks"]]
    assert min(waiting) > 0.2 * results["finish_ns"], waiting
