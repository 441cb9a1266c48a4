"""The native system layer: ring algorithms, chunking, groups, point-to-point."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chakra_core.engine.events import EventQueue
from chakra_core.errors import DeadlockError, SimulationError
from chakra_core.schema import pb
from chakra_core.system.native.algorithms import Ring
from chakra_core.system.native.executor import closed_form_finishes
from chakra_core.contract.algorithm import PhaseContext
from chakra_core.system.native.machines import StepMember
from chakra_core.system.native.runner import IsolatedPhase, NetworkPhase
from tests.helpers import make_node
from tests.simhelpers import (DATA, MICRO, PairDelayNetwork, collective, comp, hop_ns, manifest, recv,
                              ring_network, send, simulate, write_ranks)

ASTRA_RING_4CHUNKS = {"scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 1,
                      "preferred-dataset-splits": 4, "local-mem-bw": 1600}

# ASTRA-sim's numbers for its microbenchmarks with Ring_4chunks.json + Ring_<n>npus.yml
# (../shared/ref-results/astra-sim.json), copied so the core suite runs without ../shared.
ASTRA_MICRO = {("all_reduce", 4): 43000, ("all_reduce", 8): 64440, ("all_gather", 4): 64744,
               ("all_gather", 8): 151016, ("reduce_scatter", 4): 22240, ("reduce_scatter", 8): 33080,
               ("all_to_all", 4): 41560, ("all_to_all", 8): 125480}


@pytest.mark.parametrize("coll,n", sorted(ASTRA_MICRO))
def test_microbenchmarks_match_astra_sim(coll, n):
    prefix = str(MICRO / coll / f"{n}npus_1MB" / coll)
    results = simulate(manifest(prefix, ring_network(n), system=ASTRA_RING_4CHUNKS))
    assert results["finish_ns"] == ASTRA_MICRO[(coll, n)]
    assert {r["finish_ns"] for r in results["ranks"]} == {ASTRA_MICRO[(coll, n)]}


def test_active_chunks_run_concurrently():
    # HGX-H100 example: Switch of 8, 2 active chunks of 4 -> two rounds of one chunk time.
    prefix = str(MICRO / "all_reduce" / "8npus_1MB" / "all_reduce")
    system = {**ASTRA_RING_4CHUNKS, "active-chunks-per-dimension": 2, "local-mem-bw": 3350}
    network = ring_network(8, bandwidth=400.0, latency=936.25, topology="Switch")
    assert simulate(manifest(prefix, network, system=system))["finish_ns"] == 55222


# Closed forms -----------------------------------------------------------------------------------
def _one_collective(tmp_path, comm_type, n, size, bandwidth, latency, endpoint, mem_bw):
    prefix = write_ranks(tmp_path, [[collective(1, comm_type, size)]] * n)
    system = {"endpoint-delay": endpoint, "preferred-dataset-splits": 1, "local-mem-bw": mem_bw}
    return simulate(manifest(prefix, ring_network(n, bandwidth, latency), system=system))["finish_ns"]


ring_cases = dict(n=st.integers(2, 12), size=st.integers(1, 1 << 24), bandwidth=st.floats(1, 800),
                  latency=st.floats(0, 5000), endpoint=st.integers(0, 100), mem_bw=st.floats(10, 5000))


@settings(max_examples=25, deadline=None)
@given(**ring_cases)
def test_ring_closed_forms(tmp_path_factory, n, size, bandwidth, latency, endpoint, mem_bw):
    tmp = tmp_path_factory.mktemp("ring")

    def reduce(b):
        return 3 * int(b / mem_bw)

    piece = size // n
    d_piece, d_whole = hop_ns(piece, bandwidth, latency), hop_ns(size, bandwidth, latency)
    expected = {
        # 2(n-1) steps of S/n, the first n-1 reduce
        pb.ALL_REDUCE: endpoint + 2 * (n - 1) * (d_piece + endpoint) + (n - 1) * reduce(piece),
        pb.REDUCE_SCATTER: endpoint + (n - 1) * (d_piece + endpoint + reduce(piece)),
        pb.ALL_GATHER: endpoint + (n - 1) * (d_whole + endpoint),
        pb.ALL_TO_ALL: endpoint + n * (n - 1) // 2 * (d_piece + endpoint),
    }
    for comm_type, value in expected.items():
        got = _one_collective(tmp / str(comm_type), comm_type, n, size, bandwidth, latency, endpoint, mem_bw)
        assert got == value, pb.CollectiveCommType.Name(comm_type)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 9), size=st.integers(0, 100_000), data=st.data(),
       comm_type=st.sampled_from([pb.ALL_REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.ALL_TO_ALL]),
       endpoint=st.integers(0, 50))
def test_closed_form_equals_the_state_machines_for_any_start_times(n, size, data, comm_type, endpoint):
    members = list(range(n))
    starts = data.draw(st.lists(st.integers(0, 20_000), min_size=n, max_size=n))
    delays = {(i, j): data.draw(st.integers(0, 3000)) for i in members for j in members}
    ring = Ring()
    schedule = ring.step_schedule(comm_type, size, n)

    def reduce(b):
        return b // 1000

    queue = EventQueue()
    network = PairDelayNetwork(queue, delays)
    expected = closed_form_finishes(schedule, members, starts, network.message_delay, endpoint, reduce)
    # Causality, which lets the closed form resolve when the last member starts:
    assert min(expected) >= max(starts)

    # ASTRA-sim's ring state machine, simulated in isolation.
    isolated = IsolatedPhase(members, network.message_delay)
    machines = ring.members(PhaseContext(isolated, n, endpoint, reduce), comm_type, size)
    finishes = isolated.run(starts, lambda pos: machines[pos].start())
    assert [finishes[p] for p in members] == expected

    # The generic step-schedule members, on the global scheduler through the network.
    done = {}
    live = NetworkPhase(members, network, queue, lambda pos: done.__setitem__(pos, queue.now))
    steps = [StepMember(PhaseContext(live, n, endpoint, reduce), pos, schedule) for pos in members]
    for pos in members:
        queue.schedule_at(starts[pos], lambda p: steps[p].start(), pos)
    queue.run()
    assert [done[p] for p in members] == expected


def test_chunks_split_the_collective_and_conserve_bytes(tmp_path):
    size, n = 1_000_003, 4   # not divisible: the first chunks take one byte more
    prefix = write_ranks(tmp_path, [[collective(1, pb.ALL_GATHER, size)]] * n)
    results = simulate(manifest(prefix, ring_network(n), system={"preferred-dataset-splits": 3}))
    # all-gather sends each chunk n-1 times; chunk sizes add up to the collective size
    assert {r["bytes_sent"] for r in results["ranks"]} == {(n - 1) * size}
    assert results["ranks"][0]["comm_bytes_by_type"] == {"ALL_GATHER": size}


def test_zero_byte_collective_completes_immediately(tmp_path):
    prefix = write_ranks(tmp_path, [[collective(1, pb.ALL_REDUCE, 0), comp(2, 1, deps=[1])]] * 2)
    assert simulate(manifest(prefix, ring_network(2)))["finish_ns"] == 1000


def test_unknown_collective_type_is_a_clear_error(tmp_path):
    prefix = write_ranks(tmp_path, [[collective(1, 42, 8)]] * 2)
    with pytest.raises(SimulationError, match="node 1 .*unknown collective type 42"):
        simulate(manifest(prefix, ring_network(2)))


# Communicator groups ----------------------------------------------------------------------------
def test_subgroups_run_different_collectives_at_the_same_time(tmp_path):
    # Ranks {0,2} all-reduce while {1,3} all-gather; on a 4-ring both pairs are two hops apart.
    ranks = [[collective(1, pb.ALL_REDUCE, 1 << 16, pg_name="a")],
             [collective(1, pb.ALL_GATHER, 1 << 15, pg_name="b")],
             [collective(1, pb.ALL_REDUCE, 1 << 16, pg_name="a")],
             [collective(1, pb.ALL_GATHER, 1 << 15, pg_name="b")]]
    prefix = write_ranks(tmp_path / "t", ranks)
    results = simulate(manifest(prefix, ring_network(4), comm_groups={"a": [0, 2], "b": [1, 3]}))
    finish = [r["finish_ns"] for r in results["ranks"]]
    ar = 10 + 2 * (hop_ns(1 << 15, hops=2) + 10) + 3 * int((1 << 15) / 1600)
    ag = 10 + (hop_ns(1 << 15, hops=2) + 10)
    assert finish == [ar, ag, ar, ag]


def test_groups_from_a_comm_group_file_and_from_metadata(tmp_path):
    groups = tmp_path / "groups.json"
    groups.write_text(json.dumps({"7": [0, 1]}))
    ranks = [[collective(1, pb.ALL_REDUCE, 4096, pg_name="7")]] * 2 + [[comp(1, 1)]] * 2
    prefix = write_ranks(tmp_path / "file", ranks)
    from_file = simulate(manifest(prefix, ring_network(4), comm_groups=str(groups)))
    assert from_file["ranks"][0]["native"]["collectives"] == 1 and from_file["ranks"][2]["native"]["collectives"] == 0

    pg = '[{"pg_name": "7", "ranks": [0, 1], "group_desc": "dp"}]'
    meta = make_node(0, pb.METADATA_NODE, name="[pytorch|profiler|execution_trace|process]")
    meta.inputs.values = pg
    ranks = [[meta, collective(1, pb.ALL_REDUCE, 4096, deps=[0], pg_name="7")]] * 2 + [[meta]] * 2
    prefix = write_ranks(tmp_path / "meta", ranks)
    from_meta = simulate(manifest(prefix, ring_network(4)))
    assert from_meta["ranks"][1]["finish_ns"] == from_file["ranks"][1]["finish_ns"]


def test_group_errors(tmp_path):
    prefix = write_ranks(tmp_path / "undef", [[collective(1, pb.ALL_REDUCE, 64, pg_name="x")]] * 2)
    with pytest.raises(SimulationError, match="group 'x' is not defined"):
        simulate(manifest(prefix, ring_network(2)))
    prefix = write_ranks(tmp_path / "member", [[collective(1, pb.ALL_REDUCE, 64, pg_name="x")]] * 2)
    with pytest.raises(SimulationError, match="rank 1 is not a member"):
        simulate(manifest(prefix, ring_network(2), comm_groups={"x": [0]}))


# Point-to-point ---------------------------------------------------------------------------------
def test_custom_ring_allreduce_of_sends_and_receives_runs_to_completion():
    prefix = str(DATA / "astra-custom-collectives" / "custom_ring_allreduce_8npus_1MB" / "custom_allreduce")
    results = simulate(manifest(prefix, ring_network(8)))
    counts = results["ranks"][0]["node_counts"]
    assert counts == {"COMM_RECV_NODE": 14, "COMM_SEND_NODE": 14, "COMP_NODE": 7}
    assert results["warnings"] == []
    # Every rank sends 14 messages of 128 KiB.
    assert {r["bytes_sent"] for r in results["ranks"]} == {14 * 131072}


def test_send_and_receive_match_by_tag_and_time_like_astra_sim(tmp_path):
    # Rank 1 posts the tag-2 receive first, but the tag-1 message arrives first.
    ranks = [[send(1, 1, 1000, tag=1), send(2, 1, 1000, tag=2, deps=[1])],
             [recv(1, 0, 1000, tag=2), recv(2, 0, 1000, tag=1)]]
    prefix = write_ranks(tmp_path, ranks)
    results = simulate(manifest(prefix, ring_network(2)))
    d = hop_ns(1000)
    assert [r["finish_ns"] for r in results["ranks"]] == [2 * d, 2 * d]


def test_unmatched_send_and_size_mismatch_are_reported(tmp_path):
    ranks = [[send(1, 1, 100, tag=1), send(2, 1, 100, tag=9)], [recv(1, 0, 50, tag=1)]]
    prefix = write_ranks(tmp_path, ranks)
    results = simulate(manifest(prefix, ring_network(2)))
    text = "\n".join(results["warnings"])
    assert "expects 50 B from rank 0 (tag 1) but the matching send carries 100 B" in text
    assert "COMM_SEND node 2 of 100 B to rank 1 (tag 9) was never received" in text
    assert results["layers"]["system"]["summary"]["unmatched_sends"] == [
        {"rank": 0, "peer": 1, "tag": 9, "size": 100, "node": 2}]


def test_send_must_come_from_its_source(tmp_path):
    bad = make_node(1, pb.COMM_SEND_NODE, attrs={"comm_src": 1, "comm_dst": 0, "comm_size": 8})
    prefix = write_ranks(tmp_path, [[bad], [comp(1, 1)]])
    with pytest.raises(SimulationError, match="comm_src is 1"):
        simulate(manifest(prefix, ring_network(2)))


def test_rendezvous_sends_wait_for_the_receiver(tmp_path):
    # Rank 1 computes for 5 us before posting its receive.
    ranks = [[send(1, 1, 100_000)], [comp(1, 5), recv(2, 0, 100_000, deps=[1])]]
    prefix = write_ranks(tmp_path, ranks)
    eager = simulate(manifest(prefix, ring_network(2)))
    assert [r["finish_ns"] for r in eager["ranks"]] == [hop_ns(100_000), 5000]
    rendezvous = simulate(manifest(prefix, ring_network(2), system={"rendezvous-protocol": True}))
    data_at = 5000 + hop_ns(8192) + hop_ns(100_000)
    assert [r["finish_ns"] for r in rendezvous["ranks"]] == [data_at, data_at]
    assert rendezvous["ranks"][1]["bytes_sent"] == 8192


def test_rendezvous_send_without_receiver_is_reported_as_waiting(tmp_path):
    prefix = write_ranks(tmp_path, [[send(1, 1, 64, tag=3)], [comp(1, 1)]])
    with pytest.raises(DeadlockError, match="rendezvous send of 64 B to rank 1 with tag 3 waits"):
        simulate(manifest(prefix, ring_network(2), system={"rendezvous-protocol": True}))


def test_native_runs_every_collective_type_the_layers_accept():
    """matching.COLLECTIVE_TYPES (what read_collective accepts) is what native has an algorithm
    field for or runs as another type."""
    from chakra_core.comm.collectives import COLLECTIVE_TYPES
    from chakra_core.system.native.config import IMPL_FIELD, RUNS_AS

    assert set(IMPL_FIELD) | set(RUNS_AS) == COLLECTIVE_TYPES
