"""GraphFeeder behaviour, checked identically for InMemoryFeeder and StreamingFeeder."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chakra_core.errors import TraceFormatError, TraceGraphError
from chakra_core.et.io import read_trace
from chakra_core.feeder import CPU_FLAG, FEEDER_KINDS, StreamingFeeder, open_feeder
from chakra_core.schema import pb
from tests.helpers import CYCLIC_REF_TRACE, REF_TRACES, drain, make_node, ref_et_params, write_et


@pytest.fixture(params=FEEDER_KINDS)
def feeder_kind(request) -> str:
    return request.param


@pytest.fixture
def make_feeder(feeder_kind, tmp_path):
    """Factory: `make_feeder(nodes, compress=False, **open_feeder options)` writes the nodes to a
    temporary .et and opens it with the feeder under test (closed after the test)."""
    opened = []

    def build(nodes, compress: bool = False, **options):
        path = write_et(tmp_path / f"trace{len(opened)}.et", nodes, compress=compress)
        feeder = open_feeder(path, feeder_kind, **options)
        opened.append(feeder)
        return feeder

    yield build
    for feeder in opened:
        feeder.close()


def pop_all(feeder) -> list[int]:
    out = []
    while (node_id := feeder.next_issuable_node()) is not None:
        out.append(node_id)
    return out


def expected_order(nodes, use_ctrl: bool = True) -> list[int]:
    """Reference drain order: Kahn levels (wave by wave), ascending id within a wave."""
    parents = {n.id: {p for p in [*n.data_deps, *(n.ctrl_deps if use_ctrl else ())] if p != n.id}
               for n in nodes}
    level: dict[int, int] = {}

    def depth(node_id):
        if node_id not in level:
            level[node_id] = 1 + max((depth(p) for p in parents[node_id]), default=-1)
        return level[node_id]

    return sorted(parents, key=lambda n: (depth(n), n))


def cycle_in(message: str) -> list[int]:
    match = re.search(r"dependency cycle among node ids ([\d >-]+?) \(", message)
    assert match, message
    chain = [int(n) for n in match.group(1).split(" -> ")]
    assert chain[0] == chain[-1], message
    return chain[:-1]


def is_rotation(cycle: list[int], expected: list[int]) -> bool:
    return len(cycle) == len(expected) and any(cycle == expected[i:] + expected[:i]
                                               for i in range(len(expected)))


# Issue order and dependencies ----------------------------------------------------------------------
def test_issues_smallest_id_first(make_feeder):
    feeder = make_feeder([make_node(5), make_node(3), make_node(9), make_node(1),
                          make_node(7, data_deps=[9])])
    assert feeder.num_nodes == 5 and feeder.has_nodes_to_issue()
    assert pop_all(feeder) == [1, 3, 5, 9]
    assert not feeder.has_nodes_to_issue() and feeder.next_issuable_node() is None
    assert feeder.free_children(9) == [7]
    assert pop_all(feeder) == [7]


def test_data_and_control_dependencies_are_both_honoured(make_feeder):
    feeder = make_feeder([make_node(1), make_node(2), make_node(3, data_deps=[1], ctrl_deps=[2]),
                          make_node(4, ctrl_deps=[1])])
    assert pop_all(feeder) == [1, 2]
    assert feeder.free_children(1) == [4]        # 3 still waits for its control parent 2
    assert feeder.free_children(2) == [3]
    assert pop_all(feeder) == [3, 4]


def test_data_mode_ignores_control_dependencies(make_feeder):
    feeder = make_feeder([make_node(1), make_node(2), make_node(3, data_deps=[1], ctrl_deps=[2]),
                          make_node(4, ctrl_deps=[1])], dependencies="data")
    assert pop_all(feeder) == [1, 2, 4]
    assert feeder.free_children(2) == []
    assert feeder.free_children(1) == [3]


def test_parent_listed_twice_counts_once(make_feeder):
    feeder = make_feeder([make_node(1), make_node(2, data_deps=[1], ctrl_deps=[1]),
                          make_node(3, data_deps=[1, 1])])
    assert pop_all(feeder) == [1]
    assert sorted(feeder.free_children(1)) == [2, 3]


def test_self_dependency_is_ignored(make_feeder):
    feeder = make_feeder([make_node(1, data_deps=[1], ctrl_deps=[1]), make_node(2, data_deps=[1, 2])])
    assert pop_all(feeder) == [1]
    assert feeder.free_children(1) == [2]


def test_free_children_returns_newly_issuable(make_feeder):
    feeder = make_feeder([make_node(1), make_node(2, data_deps=[1]), make_node(3, data_deps=[1, 2]),
                          make_node(4, ctrl_deps=[1])])
    assert pop_all(feeder) == [1]
    assert sorted(feeder.free_children(1)) == [2, 4]
    assert feeder.free_children(4) == []
    assert feeder.free_children(2) == [3]
    assert sorted(feeder.pending_nodes()) == [3]


def test_push_back_returns_node_to_queue(make_feeder):
    feeder = make_feeder([make_node(1), make_node(2), make_node(3)])
    assert feeder.next_issuable_node() == 1
    assert feeder.next_issuable_node() == 2
    feeder.push_back_issuable_node(2)
    feeder.push_back_issuable_node(2)            # idempotent
    assert pop_all(feeder) == [2, 3]
    feeder.push_back_issuable_node(1)
    assert feeder.has_nodes_to_issue() and pop_all(feeder) == [1]


# Bodies and kinds ------------------------------------------------------------------------------------
def test_lookup_node(make_feeder):
    feeder = make_feeder([make_node(1, type="COMM_COLL_NODE", duration_micros=5,
                                    attrs={"comm_size": ("uint64_val", 1 << 20)}),
                          make_node(2, data_deps=[1], name="second")])
    node = feeder.lookup_node(1)
    assert (node.id, node.type, node.duration_micros, node.int("comm_size")) == \
        (1, pb.COMM_COLL_NODE, 5, 1 << 20)
    assert feeder.lookup_node(2).name == "second" and list(feeder.lookup_node(2).pb.data_deps) == [1]
    with pytest.raises(KeyError):
        feeder.lookup_node(3)
    with pytest.raises(KeyError):
        feeder.node_kind(3)


@pytest.mark.parametrize("node_type", ["COMP_NODE", "COMM_COLL_NODE", "MEM_LOAD_NODE"])
@pytest.mark.parametrize("attrs", [
    {}, {"is_cpu_op": True}, {"is_cpu_op": False}, {"is_cpu_op": ("int32_val", 1)},
    {"is_cpu_op": ("uint64_val", 0)}, {"is_cpu_op": "false"}, {"is_cpu_op": "true"},
], ids=["absent", "true", "false", "int-1", "uint-0", "str-false", "str-true"])
def test_node_kind_matches_is_cpu_op(make_feeder, node_type, attrs):
    feeder = make_feeder([make_node(1, type=node_type, attrs=attrs)])
    view = feeder.lookup_node(1)
    assert feeder.node_kind(1) == pb.NodeType.Value(node_type) | (CPU_FLAG if view.is_cpu_op else 0)
    assert view.is_cpu_op == (attrs.get("is_cpu_op") in (True, ("int32_val", 1), "true"))


def test_node_kind_uses_the_last_is_cpu_op_like_node_view(make_feeder):
    node = make_node(1)
    node.attr.add(name="is_cpu_op", bool_val=True)
    node.attr.add(name="is_cpu_op", bool_val=False)
    feeder = make_feeder([node])
    assert feeder.lookup_node(1).is_cpu_op is False
    assert feeder.node_kind(1) == pb.COMP_NODE


# Editing the graph -------------------------------------------------------------------------------------
def test_add_node_with_finished_parents_is_issuable(make_feeder):
    feeder = make_feeder([make_node(1)])
    assert pop_all(feeder) == [1]
    feeder.free_children(1)
    feeder.add_node(make_node(10, data_deps=[1], attrs={"is_cpu_op": True}))
    assert feeder.num_nodes == 2
    assert pop_all(feeder) == [10]
    assert feeder.lookup_node(10).name == "node10"
    assert feeder.node_kind(10) == pb.COMP_NODE | CPU_FLAG


def test_add_node_waits_for_unfinished_parents(make_feeder):
    feeder = make_feeder([make_node(1), make_node(2, data_deps=[1])])
    feeder.add_node(make_node(10, data_deps=[2], ctrl_deps=[1]))
    feeder.add_node(make_node(11, data_deps=[10, 11]))    # on an added node; self-dependency ignored
    feeder.add_node(make_node(12))
    assert pop_all(feeder) == [1, 12]
    assert feeder.free_children(1) == [2]
    assert feeder.free_children(2) == [10]
    assert feeder.free_children(10) == [11]
    assert pop_all(feeder) == [2, 10, 11]
    assert feeder.num_nodes == 5


def test_add_node_errors(make_feeder):
    feeder = make_feeder([make_node(1)])
    with pytest.raises(TraceGraphError, match=r"node 10 .*depends on node 77"):
        feeder.add_node(make_node(10, ctrl_deps=[77]))
    with pytest.raises(TraceGraphError, match="duplicate node id 1"):
        feeder.add_node(make_node(1))
    feeder.add_node(make_node(20))
    with pytest.raises(TraceGraphError, match="duplicate node id 20"):
        feeder.add_node(make_node(20))
    assert feeder.num_nodes == 2 and pop_all(feeder) == [1, 20]


@pytest.mark.parametrize("added", [False, True], ids=["trace-node", "added-node"])
def test_removed_node_id_stays_known(make_feeder, added):
    feeder = make_feeder([make_node(1)])
    if added:
        feeder.add_node(make_node(5))
    node_id = 5 if added else 1
    assert node_id in pop_all(feeder)
    feeder.lookup_node(node_id)
    feeder.free_children(node_id)
    count = feeder.num_nodes
    feeder.remove_node(node_id)
    assert feeder.num_nodes == count
    assert feeder.node_kind(node_id) == pb.COMP_NODE
    with pytest.raises(TraceGraphError, match=f"duplicate node id {node_id}"):
        feeder.add_node(make_node(node_id))
    feeder.add_node(make_node(30, data_deps=[node_id]))   # its parent has finished
    assert pop_all(feeder) == [30]
    assert node_id not in feeder.pending_nodes()


def test_remove_node_drops_the_body(make_feeder, feeder_kind):
    feeder = make_feeder([make_node(1), make_node(2)])
    feeder.lookup_node(1)
    feeder.remove_node(1)
    if feeder_kind == "memory":
        with pytest.raises(KeyError):
            feeder.lookup_node(1)
    else:
        assert feeder.cached_nodes == 0
        assert feeder.lookup_node(1).id == 1        # reloaded from disk on demand


# Broken graphs ------------------------------------------------------------------------------------
def test_duplicate_ids(make_feeder):
    with pytest.raises(TraceGraphError, match="duplicate node id 2"):
        make_feeder([make_node(1), make_node(2), make_node(3), make_node(2)])


@pytest.mark.parametrize("policy", ["ignore-control", "error"])
@pytest.mark.parametrize("ctrl_too", [False, True])
def test_missing_data_parent_is_an_error(make_feeder, policy, ctrl_too):
    nodes = [make_node(1), make_node(5, data_deps=[1, 99], ctrl_deps=[99] if ctrl_too else [])]
    with pytest.raises(TraceGraphError) as excinfo:
        make_feeder(nodes, missing_parents=policy)
    assert "node 5 ('node5') depends on node 99" in str(excinfo.value)


def test_missing_control_parent_is_a_warning_by_default(make_feeder):
    feeder = make_feeder([make_node(1), make_node(5, data_deps=[1], ctrl_deps=[99, 98]),
                          make_node(6, ctrl_deps=[99])])
    assert len(feeder.warnings) == 1
    assert "3 control dependencies" in feeder.warnings[0] and "node 5 -> 99" in feeder.warnings[0]
    assert drain(feeder) == [1, 6, 5]


def test_missing_control_parent_with_error_policy(make_feeder):
    with pytest.raises(TraceGraphError, match=r"node 5 \('node5'\) depends on node 99"):
        make_feeder([make_node(1), make_node(5, ctrl_deps=[1, 99])], missing_parents="error")


def test_missing_control_parent_is_not_checked_in_data_mode(make_feeder):
    feeder = make_feeder([make_node(5, ctrl_deps=[99])], dependencies="data", missing_parents="error")
    assert feeder.warnings == [] and drain(feeder) == [5]


@pytest.mark.parametrize("option", [{"missing_parents": "maybe"}, {"dependencies": "ctrl"}])
def test_invalid_options(make_feeder, option):
    with pytest.raises(ValueError):
        make_feeder([make_node(1)], **option)


@pytest.mark.parametrize("deps", ["data", "ctrl", "mixed"])
def test_cycle_names_its_node_ids(make_feeder, deps):
    # 11 -> 22 -> 33 -> 11 ("must finish before"); 1 is fine, 40 is blocked by the cycle.
    kinds = {"data": ("data_deps",) * 3, "ctrl": ("ctrl_deps",) * 3,
             "mixed": ("data_deps", "ctrl_deps", "data_deps")}[deps]
    nodes = [make_node(1), make_node(40, data_deps=[33]),
             make_node(22, **{kinds[0]: [11]}), make_node(33, **{kinds[1]: [22]}),
             make_node(11, **{kinds[2]: [33, 1]})]
    with pytest.raises(TraceGraphError) as excinfo:
        make_feeder(nodes)
    assert is_rotation(cycle_in(str(excinfo.value)), [11, 22, 33]), str(excinfo.value)
    assert "4 node(s) can never be issued" in str(excinfo.value)
    if deps == "ctrl":
        assert drain(make_feeder(nodes, dependencies="data")) == [1, 11, 22, 33, 40]


def test_cycle_report_skips_self_dependencies(make_feeder):
    nodes = [make_node(1, data_deps=[1, 2]), make_node(2, ctrl_deps=[3]), make_node(3, data_deps=[2])]
    with pytest.raises(TraceGraphError) as excinfo:
        make_feeder(nodes)
    assert sorted(cycle_in(str(excinfo.value))) == [2, 3], str(excinfo.value)


# Streaming specifics (and ids and gzip for both) -------------------------------------------------------
def test_streaming_cache_is_bounded(tmp_path):
    count, cache = 5000, 16
    path = write_et(tmp_path / "chain.et", (make_node(i, data_deps=[i - 1] if i else []) for i in range(count)))
    feeder = StreamingFeeder(path, cache_nodes=cache)
    try:
        order, high = [], 0
        while (node_id := feeder.next_issuable_node()) is not None:
            assert feeder.lookup_node(node_id).id == node_id
            if node_id >= 3:
                feeder.lookup_node(node_id - 3)
            high = max(high, feeder.cached_nodes)
            order.append(node_id)
            feeder.free_children(node_id)
        assert order == list(range(count))
        assert high == cache == feeder.cached_nodes
        last = feeder.lookup_node(count - 1)
        assert feeder.lookup_node(count - 1) is last      # a cache hit returns the same view
    finally:
        feeder.close()


@pytest.mark.parametrize("order", ["forward", "backward", "strided"])
def test_streaming_bodies_read_in_blocks_are_the_nodes(tmp_path, order):
    """Bodies come from blocks of the file (streaming.READ_BLOCK): any order of lookups, nodes
    straddling a block's end, and bodies longer than a block read as the file holds them."""
    nodes = [make_node(i, name=("n" * (40_000 if i % 97 == 5 else i % 300)), attrs={"k": i})
             for i in range(1, 700)]
    path = write_et(tmp_path / "t.et", nodes)
    ids = [n.id for n in nodes]
    ids = {"forward": ids, "backward": ids[::-1], "strided": ids[::7] + ids[3::7] + ids[1::7]}[order]
    feeder = StreamingFeeder(path, cache_nodes=1)
    try:
        by_id = {n.id: n for n in read_trace(path).nodes}
        assert all(feeder.lookup_node(i).pb == by_id[i] for i in ids)
    finally:
        feeder.close()


def test_streaming_names_a_trace_that_shrank_after_indexing(tmp_path):
    path = write_et(tmp_path / "t.et", [make_node(i, name="n" * 100) for i in range(1, 50)])
    feeder = StreamingFeeder(path, cache_nodes=1)
    try:
        with open(path, "r+b") as handle:
            handle.truncate(path.stat().st_size - 50)
        with pytest.raises(TraceFormatError, match="shrank"):
            feeder.lookup_node(49)
    finally:
        feeder.close()


def test_streaming_rejects_empty_cache(tmp_path):
    with pytest.raises(ValueError):
        StreamingFeeder(write_et(tmp_path / "t.et", [make_node(1)]), cache_nodes=0)


def test_gzip_trace(make_feeder, tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    nodes = [make_node(3, data_deps=[1]), make_node(1), make_node(2, ctrl_deps=[1], name="two")]
    feeder = make_feeder(nodes, compress=True)
    assert feeder.lookup_node(2).name == "two"
    assert drain(feeder) == [1, 2, 3]
    feeder.close()
    assert list(scratch.iterdir()) == []          # the streaming feeder's decompressed copy is gone


SPARSE = [2**63 + 5, 7, 2**40, 123_456_789, 2**64 - 1, 0]


def test_sparse_large_ids(make_feeder):
    nodes = [make_node(2**64 - 1, data_deps=[7], type="COMM_COLL_NODE"),
             make_node(2**40, ctrl_deps=[2**63 + 5]), make_node(2**63 + 5), make_node(7),
             make_node(123_456_789, data_deps=[2**64 - 1, 0]), make_node(0)]
    feeder = make_feeder(nodes)
    for node_id in SPARSE:
        assert feeder.lookup_node(node_id).name == f"node{node_id}"
    assert feeder.node_kind(2**64 - 1) == pb.COMM_COLL_NODE
    with pytest.raises(KeyError):
        feeder.lookup_node(8)
    assert drain(feeder) == expected_order(nodes) == [0, 7, 2**63 + 5, 2**40, 2**64 - 1, 123_456_789]


# Random DAGs: both feeders drain in the same topological order --------------------------------------
@st.composite
def dags(draw):
    count = draw(st.integers(1, 25))
    ids = draw(st.lists(st.one_of(st.integers(0, 3 * count), st.integers(0, 2**64 - 1)),
                        min_size=count, max_size=count, unique=True))
    nodes = []
    for index, node_id in enumerate(ids):
        data, ctrl = [], []
        if index:
            for parent, kind in draw(st.lists(st.tuples(st.integers(0, index - 1),
                                                        st.sampled_from(["data", "ctrl", "both"])),
                                              max_size=4)):
                if kind != "ctrl":
                    data.append(ids[parent])
                if kind != "data":
                    ctrl.append(ids[parent])
        nodes.append(make_node(node_id, data_deps=data, ctrl_deps=ctrl))
    return draw(st.permutations(nodes))


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=dags(), dependencies=st.sampled_from(["all", "data"]))
def test_random_dags_drain_in_topological_order(nodes, dependencies):
    with tempfile.TemporaryDirectory() as folder:
        path = write_et(Path(folder) / "dag.et", nodes)
        orders = {}
        for kind in FEEDER_KINDS:
            feeder = open_feeder(path, kind, dependencies=dependencies)
            try:
                orders[kind] = drain(feeder)
            finally:
                feeder.close()
    order = orders["memory"]
    assert orders["streaming"] == order
    assert sorted(order) == sorted(n.id for n in nodes)          # every node exactly once
    position = {node_id: i for i, node_id in enumerate(order)}
    for node in nodes:
        parents = [*node.data_deps, *(node.ctrl_deps if dependencies == "all" else ())]
        assert all(position[p] < position[node.id] for p in parents)
    assert order == expected_order(nodes, dependencies == "all")


# Reference traces ---------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ref_et_params())
def test_ref_traces_drain_identically(path):
    dependencies = "all"
    if path.relative_to(REF_TRACES).as_posix() == CYCLIC_REF_TRACE:
        for kind in FEEDER_KINDS:
            with pytest.raises(TraceGraphError, match="cycle"):
                open_feeder(path, kind)
        dependencies = "data"
    ids = sorted(node.id for node in read_trace(path).nodes)
    orders = {}
    for kind in FEEDER_KINDS:
        feeder = open_feeder(path, kind, dependencies=dependencies)
        try:
            assert feeder.num_nodes == len(ids)
            orders[kind] = drain(feeder)
            assert list(feeder.pending_nodes()) == []
        finally:
            feeder.close()
    assert orders["memory"] == orders["streaming"]
    assert sorted(orders["memory"]) == ids


def test_topological_positions_keep_file_order_and_report_a_cycle():
    from chakra_core.feeder.base import topological_positions

    # 2 waits for 0 and 3; 1 is free: smallest ready position first.
    assert topological_positions([(), (), (0, 3), ()]) == ([0, 1, 3, 2], [])
    # 1 <-> 2 form a cycle; 3 waits behind it.
    assert topological_positions([(), (2,), (1,), (2,)]) == ([0], [1, 2, 3])
