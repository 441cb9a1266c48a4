"""Uneven all-to-alls (comm_send_splits / comm_recv_splits, PyTorch's all_to_all_single with split
sizes): timed from each member's own pieces, bytes conserved, pieces that disagree refused with
both ranks named, pieces of another job size split evenly with a warning."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from chakra_core import SimulationError, pb
from chakra_core.hardware.profiles import load_profile
from chakra_core.testing import collective, simulate, write_ranks
from chakra_sim_system_nccl import model as nccl
from chakra_sim_system_nccl.traffic import collective_flows

NDR = "h100-hgx-ndr400"
GROUP = [0, 1, 8, 9]   # two GPUs on each of two nodes


def a2a(matrix: list[list[int]], rank_index: int, **attrs) -> list:
    """Member `rank_index`'s all-to-all of GROUP: it sends row `rank_index`, receives the column."""
    send = matrix[rank_index]
    recv = [row[rank_index] for row in matrix]
    return [collective(0, pb.ALL_TO_ALL, sum(send), pg_name="g", comm_send_splits=send, comm_recv_splits=recv,
                       **attrs)]


def run(tmp_path, matrix: list[list[int]] | None = None, traces=None, plugin="nccl", size=None):
    if traces is None:
        traces = [[] for _ in range(16)]
        for i, rank in enumerate(GROUP):
            traces[rank] = a2a(matrix, i) if matrix else [collective(0, pb.ALL_TO_ALL, size, pg_name="g")]
    prefix = write_ranks(tmp_path / "t", traces)
    system = {"plugin": "nccl", "profile": NDR} if plugin == "nccl" else {"plugin": plugin}
    data = {"workload": {"trace": prefix, "comm_groups": {"g": GROUP}}, "system": system}
    if plugin != "nccl":
        data["network"] = {"plugin": "analytical", "topology": ["Ring"], "npus_count": [16],
                           "bandwidth": [50.0], "latency": [500.0]}
    return simulate(data)


def fan_ns(matrix: list[list[int]]) -> int:
    """The slowest member's exchange: on its node and across, the larger of sent and received."""
    model, slowest = nccl.NcclModel(load_profile(NDR)), 0.0
    for i, rank in enumerate(GROUP):
        sums = [0, 0, 0, 0]
        peers = 0
        for j, other in enumerate(GROUP):
            if j != i:
                across = 2 * (rank // 8 != other // 8)
                sums[across] += matrix[i][j]
                sums[across + 1] += matrix[j][i]
                peers += 1 if across and (matrix[i][j] or matrix[j][i]) else 0
        if any(sums):   # a member with nothing to exchange posts no send or receive (PyTorch skips them)
            slowest = max(slowest, model.fan_time_us(max(sums[:2]), max(sums[2:]), max(peers, 1)).time_us)
    return int(round(slowest * 1000))


def test_even_pieces_time_as_the_even_all_to_all(tmp_path):
    piece = 2**20
    even = run(tmp_path / "a", size=4 * piece)
    pieces = run(tmp_path / "b", [[piece] * 4] * 4)
    assert pieces["finish_ns"] == even["finish_ns"] > 0
    for a, b in zip(even["ranks"], pieces["ranks"]):
        assert (a["bytes_sent"], a["bytes_received"]) == (b["bytes_sent"], b["bytes_received"])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**22), min_size=4, max_size=4), min_size=4, max_size=4))
def test_each_member_moves_its_pieces_and_the_slowest_sets_the_time(tmp_path_factory, matrix):
    """Bytes are conserved (what one sends another receives; the piece a rank keeps moves
    nowhere), and the collective takes the slowest member's exchange, never less than its bytes
    across nodes need at the NIC rate the model itself uses."""
    results = run(tmp_path_factory.mktemp("u"), matrix)
    rows = {r["rank"]: r for r in results["ranks"]}
    for i, rank in enumerate(GROUP):
        assert rows[rank]["bytes_sent"] == sum(matrix[i]) - matrix[i][i]
        assert rows[rank]["bytes_received"] == sum(row[i] for row in matrix) - matrix[i][i]
    assert sum(r["bytes_sent"] for r in results["ranks"]) == sum(r["bytes_received"] for r in results["ranks"])
    assert results["finish_ns"] == fan_ns(matrix)
    nic = nccl.NcclModel(load_profile(NDR)).p2p_bandwidth_gbps(False)
    for i, rank in enumerate(GROUP):
        across = sum(matrix[i][j] for j, other in enumerate(GROUP) if other // 8 != rank // 8)
        assert results["finish_ns"] >= across / nic


def test_a_skewed_member_is_slower_than_the_even_split_of_the_same_bytes(tmp_path):
    """Rank 9 receives 4x what the others do: the even all-to-all of the same total is faster."""
    hot = [[2**20, 2**20, 2**20, 4 * 2**20]] * 4
    skewed = run(tmp_path / "a", [row[:] for row in hot])["finish_ns"]
    even = run(tmp_path / "b", size=7 * 2**20)["finish_ns"]
    assert skewed > even


def test_pieces_that_disagree_name_both_ranks(tmp_path):
    matrix = [[0, 100, 100, 100]] * 4
    traces = [[] for _ in range(16)]
    for i, rank in enumerate(GROUP):
        traces[rank] = a2a(matrix, i)
    traces[1] = [collective(0, pb.ALL_TO_ALL, 300, pg_name="g", comm_send_splits=[0, 0, 150, 150],
                            comm_recv_splits=[0, 100, 100, 100])]
    with pytest.raises(SimulationError, match="rank 0 .* sends 100 B to rank 1, but rank 1 .* receives 0 B|"
                                              "rank 1 .* sends 0 B to rank 1"):
        run(tmp_path, traces=traces)


@pytest.mark.parametrize(("attrs", "message"), [
    ({"comm_send_splits": [1, 2, 3, 4]}, "needs both comm_send_splits and comm_recv_splits"),
    ({"comm_send_splits": [1, 2, 3, 5], "comm_recv_splits": [1, 1, 1, 1]}, "comm_size 10 B is not the sum"),
    ({"comm_send_splits": [5, 5], "comm_recv_splits": [5, 5]}, "among 4 ranks needs 4 send"),
])
def test_malformed_pieces_are_refused(tmp_path, attrs, message):
    traces = [[] for _ in range(16)]
    for rank in GROUP:
        traces[rank] = [collective(0, pb.ALL_TO_ALL, 10, pg_name="g", **attrs)]
    if "among 4" in message:   # pieces for 2 ranks in a group of 4: split evenly (the next test)
        results = run(tmp_path, traces=traces)
        assert results["warnings"] and "carry 2 pieces" in results["warnings"][0]
        return
    with pytest.raises(SimulationError, match=message):
        run(tmp_path, traces=traces)


def test_one_member_without_pieces_is_a_mismatch(tmp_path):
    traces = [[] for _ in range(16)]
    for i, rank in enumerate(GROUP):
        traces[rank] = a2a([[25] * 4] * 4, i)
    traces[9] = [collective(0, pb.ALL_TO_ALL, 100, pg_name="g")]
    with pytest.raises(SimulationError, match="one carries comm_send_splits / comm_recv_splits and the other not"):
        run(tmp_path, traces=traces)


def test_the_native_layer_refuses_them_and_names_the_nccl_layer(tmp_path):
    with pytest.raises(SimulationError, match=r"runs on the nccl system layer"):
        run(tmp_path, [[10, 20, 30, 40]] * 4, plugin="native")


def test_flows_carry_each_pair_s_piece():
    splits = {0: ((0, 1, 2, 3), (0, 0, 0, 0)), 1: ((4, 0, 5, 6), (1, 0, 0, 0)),
              8: ((7, 8, 0, 9), (2, 5, 0, 0)), 9: ((10, 11, 12, 0), (3, 6, 9, 0))}
    flows = collective_flows(pb.ALL_TO_ALL, "p2p", tuple(GROUP), 0, 100, 0, 8, splits)
    assert sorted(flows) == [(0, 8, 2), (0, 9, 3), (1, 8, 5), (1, 9, 6), (8, 0, 7), (8, 1, 8), (9, 0, 10), (9, 1, 11)]


def test_the_native_layer_runs_even_pieces_as_the_even_all_to_all(tmp_path):
    """A converted all_to_allv whose pieces are all equal is the even all-to-all the native layer
    runs: same finish as without the pieces."""
    pieces = run(tmp_path / "a", [[2**16] * 4] * 4, plugin="native")
    even = run(tmp_path / "b", size=4 * 2**16, plugin="native")
    assert pieces["finish_ns"] == even["finish_ns"] > 0


def test_even_pieces_on_identical_ranks_fold(tmp_path):
    """Ranks whose traces are identical (even pieces) still fold; uneven ones start over unfolded."""
    results = run(tmp_path / "a", [[2**18] * 4] * 4)
    assert results["folding"]["folded"] and not results["warnings"]
    skewed = run(tmp_path / "b", [[2**18, 2**18, 2**18, 2**19]] * 4)
    assert not skewed["folding"]["folded"] or any("pieces of its own" in w for w in skewed["warnings"])
