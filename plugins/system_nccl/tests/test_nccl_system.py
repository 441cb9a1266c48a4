"""The `nccl` system layer: collectives take NCCL's time, matched and reported like the native layer's."""

from __future__ import annotations

import pytest

from chakra_core import ManifestError, SimulationError, pb
from chakra_sim_system_nccl import model as nccl
from chakra_core.hardware.profiles import load_profile
from chakra_core.testing import collective, comp, recv, send, simulate, write_ranks

H100, NDR = "h100-sxm-hgx", "h100-hgx-ndr400"


def run(tmp_path, ranks, profile=H100, comm_groups=None, **system):
    prefix = write_ranks(tmp_path / "t", ranks)
    data = {"workload": {"trace": prefix}, "system": {"plugin": "nccl", "profile": profile, **system}}
    if comm_groups is not None:
        data["workload"]["comm_groups"] = comm_groups
    return simulate(data)


def ns(time_us: float) -> int:
    return int(round(time_us * 1000))


def test_all_reduce_takes_nccls_time(tmp_path):
    size = 2**30
    results = run(tmp_path, [[collective(0, pb.ALL_REDUCE, size)]] * 8)
    expected = nccl.NcclModel(load_profile(H100)).time_us(nccl.ALL_REDUCE, size, 8, 1)
    assert results["finish_ns"] == ns(expected.time_us)
    assert all(r["bytes_sent"] == r["bytes_received"] == 2 * 7 * size // 8 for r in results["ranks"])
    [choice] = results["layers"]["system"]["summary"]["choices"]
    assert (choice["algorithm"], choice["protocol"], choice["count"]) == (expected.algorithm, expected.protocol, 1)


def test_all_gather_counts_its_output(tmp_path):
    results = run(tmp_path, [[collective(0, pb.ALL_GATHER, 2**20)]] * 8)
    expected = nccl.NcclModel(load_profile(H100)).time_us(nccl.ALL_GATHER, 8 * 2**20, 8, 1)
    assert results["finish_ns"] == ns(expected.time_us)


def test_collective_starts_when_its_last_member_joins(tmp_path):
    late = [comp(0, 5_000), collective(1, pb.ALL_REDUCE, 2**20, deps=[0])]
    results = run(tmp_path, [late] + [[collective(1, pb.ALL_REDUCE, 2**20)]] * 7)
    expected = nccl.NcclModel(load_profile(H100)).time_us(nccl.ALL_REDUCE, 2**20, 8, 1)
    assert results["finish_ns"] == 5_000_000 + ns(expected.time_us)
    # the early ranks waited for rank 0: skew, not network time
    assert results["ranks"][1]["waiting_ns"] == 5_000_000


def test_groups_spanning_nodes_are_slower(tmp_path):
    size = 2**28
    inside = {"a": list(range(8)), "b": list(range(8, 16))}
    across = {"a": [r for r in range(16) if r % 2 == 0], "b": [r for r in range(16) if r % 2]}
    traces = [[collective(0, pb.ALL_REDUCE, size, pg_name="a" if r in inside["a"] else "b")] for r in range(16)]
    fast = run(tmp_path / "in", traces, NDR, comm_groups=inside)["finish_ns"]
    traces = [[collective(0, pb.ALL_REDUCE, size, pg_name="a" if r % 2 == 0 else "b")] for r in range(16)]
    slow = run(tmp_path / "across", traces, NDR, comm_groups=across)["finish_ns"]
    model = nccl.NcclModel(load_profile(NDR))
    assert fast == ns(model.time_us(nccl.ALL_REDUCE, size, 8, 1).time_us)
    # 4 GPUs per node in each group: each drives its GPUs' 4 of the node's 8 NICs
    assert slow == ns(model.time_us(nccl.ALL_REDUCE, size, 8, 2, 0.5).time_us)
    assert slow > fast


def test_send_recv_within_and_across_nodes(tmp_path):
    size = 2**24
    traces = [[] for _ in range(16)]
    traces[0] = [send(0, 1, size), send(1, 8, size, tag=1)]
    traces[1] = [recv(0, 0, size)]
    traces[8] = [recv(0, 0, size, tag=1)]
    results = run(tmp_path, traces, NDR)
    model = nccl.NcclModel(load_profile(NDR))
    local, remote = ns(model.p2p_time_us(size, True)), ns(model.p2p_time_us(size, False))
    assert results["ranks"][1]["finish_ns"] == local
    assert results["ranks"][8]["finish_ns"] == local + remote
    assert remote > local


def test_mismatched_collectives_are_reported(tmp_path):
    traces = [[collective(0, pb.ALL_REDUCE, 1024)]] * 7 + [[collective(0, pb.ALL_REDUCE, 2048)]]
    with pytest.raises(SimulationError, match="collectives do not match.*2048 B.*1024 B"):
        run(tmp_path, traces)


def test_a_rank_that_never_joins_is_named(tmp_path):
    traces = [[collective(0, pb.ALL_REDUCE, 1024)]] * 7 + [[comp(0, 10)]]
    with pytest.raises(SimulationError, match=r"waits for rank\(s\) 7"):
        run(tmp_path, traces)


def test_unknown_profile_lists_the_shipped_ones(tmp_path):
    with pytest.raises(ManifestError, match="no such profile.*h100-sxm-hgx"):
        run(tmp_path, [[collective(0, pb.ALL_REDUCE, 1024)]] * 2, profile="h900")


def test_more_ranks_than_a_single_node_profile_holds(tmp_path):
    with pytest.raises(SimulationError, match="16 ranks but profile 'h100-sxm-hgx' describes one node"):
        run(tmp_path, [[collective(0, pb.ALL_REDUCE, 1024)]] * 16)


def test_native_still_needs_a_network(tmp_path):
    prefix = write_ranks(tmp_path / "t", [[collective(0, pb.ALL_REDUCE, 1024)]] * 2)
    with pytest.raises(ManifestError, match="network.*required: system plugin 'native'"):
        simulate({"workload": {"trace": prefix}})


def test_runs_are_deterministic(tmp_path):
    traces = [[collective(0, pb.ALL_REDUCE, 3 * 2**20), collective(1, pb.ALL_TO_ALL, 2**22, deps=[0])]] * 8
    first = run(tmp_path / "a", traces)
    second = run(tmp_path / "b", traces)
    assert first["ranks"] == second["ranks"] and first["finish_ns"] == second["finish_ns"]


# Physics (hypothesis): whatever mix of collectives, groups and sizes a job issues ---------------------

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

BREAKDOWN = ("gpu_compute_ns", "cpu_compute_ns", "memory_ns", "exposed_network_ns", "waiting_ns", "idle_ns")
KINDS = [pb.ALL_REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.ALL_TO_ALL, pb.BROADCAST, pb.REDUCE]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.sampled_from(KINDS), st.integers(10, 30), st.sampled_from(["a", "b", ""]),
                                st.integers(0, 3000)), min_size=1, max_size=6))
def test_bytes_conserved_time_adds_up_and_nothing_beats_its_links(tmp_path_factory, steps):
    """16 ranks on two NDR nodes; groups a (even ranks, both nodes), b (ranks 0-7, one node)."""
    groups = {"a": list(range(0, 16, 2)), "b": list(range(8))}
    traces = [[] for _ in range(16)]
    for rank in range(16):
        previous = None
        for index, (kind, log_size, group, compute_us) in enumerate(steps):
            if group and rank not in groups[group]:
                continue
            nodes = [comp(2 * index, compute_us, deps=[previous] if previous is not None else [])]
            attrs = {"pg_name": group} if group else {}
            nodes.append(collective(2 * index + 1, kind, 2**log_size, deps=[2 * index], **attrs))
            traces[rank].extend(nodes)
            previous = 2 * index + 1
    results = run(tmp_path_factory.mktemp("phys"), traces, NDR, comm_groups=groups)
    ranks = results["ranks"]
    assert sum(r["bytes_sent"] for r in ranks) == sum(r["bytes_received"] for r in ranks)
    for r in ranks:
        assert sum(r[key] for key in BREAKDOWN) == r["finish_ns"] and min(r[key] for key in BREAKDOWN) >= 0
    # each rank's traffic over its NVLinks (450 GB/s each way) and its NIC share takes at least that long.
    # Bytes are counted by nccl-tests' bus convention, 2(n-1)/n of an all-reduce's size; NVLS reduces in
    # the switch, so a GPU puts only the size itself on its NVLinks: 8/14 of the bus count for 8 GPUs.
    nvls = any(choice["algorithm"].startswith("nvls") for choice in results["layers"]["system"]["summary"]["choices"])
    link_share = 8 / 14 if nvls else 1.0
    nvlink_bytes_per_ns = 450.0
    for r in ranks:
        assert r["finish_ns"] * nvlink_bytes_per_ns >= r["bytes_sent"] * link_share * 0.999


def test_gather_times_the_roots_links(tmp_path):
    """The root (rank 9, second node) takes S from its 7 node mates over NVLink and from the
    first node's 8 ranks through its NIC share."""
    size = 2**22
    results = run(tmp_path, [[collective(0, pb.GATHER, size, root_rank=9)]] * 16, NDR)
    expected = nccl.NcclModel(load_profile(NDR)).fan_time_us(size * 7, size * 8)
    assert results["finish_ns"] == ns(expected.time_us)


def test_choices_count_one_operation_per_communicator_group_and_say_so(tmp_path):
    groups = {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}
    traces = [[collective(0, pb.ALL_REDUCE, 2**20, pg_name="a" if r < 4 else "b")] for r in range(8)]
    results = run(tmp_path, traces, comm_groups=groups)
    system = results["layers"]["system"]
    [choice] = system["summary"]["choices"]
    assert choice["count"] == 2      # one trace node per rank, 8 ranks, 2 groups: 2 operations
    assert "one per communicator group" in system["summary"]["choices_counted"]
    [table] = system["highlights"]
    assert "one per communicator group" in table["title"]
    assert table["columns"][3:] == ["operations (per group)", "time µs (sum over groups)"]


def test_idle_collective_time_is_the_time_of_a_collective_alone(tmp_path):
    """What `chakra-sim plan` bounds a collective by: exactly its time when nothing else runs."""
    from chakra_core.contract.inputs import LayerContext
    from chakra_core.engine.events import EventQueue
    from chakra_sim_system_nccl.layer import NcclSystem

    size = 2**26
    for members in (tuple(range(8)), tuple(range(16))):
        traces = [[collective(0, pb.ALL_REDUCE, size)] if r in members else [] for r in range(16)]
        groups = {"g": list(members)}
        for r in members:
            traces[r] = [collective(0, pb.ALL_REDUCE, size, pg_name="g")]
        finish = run(tmp_path / str(len(members)), traces, NDR, comm_groups=groups)["finish_ns"]
        system = NcclSystem(NcclSystem.Config.model_validate({"profile": NDR}),
                            LayerContext(num_ranks=16, scheduler=EventQueue()))
        assert system.idle_collective_ns(pb.ALL_REDUCE, size, members) == finish
