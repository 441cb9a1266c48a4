"""Values keyed by a node's attributes (`NodeView.attrs_key`, `AttributeCache`) and the node kind
read from a node's bytes while indexing (`feeder.base.node_kind`)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from chakra_core.et.attr_cache import AttributeCache
from chakra_core.et.attrs import NodeView
from chakra_core.feeder.base import node_kind
from chakra_core.schema import pb

_VALUES = st.one_of(
    st.builds(lambda v: ("bool_val", v), st.booleans()),
    st.builds(lambda v: ("int64_val", v), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda v: ("uint64_val", v), st.integers(0, 2**64 - 1)),
    st.builds(lambda v: ("string_val", v), st.sampled_from(["", "gemm", "true", "false", "1", "is_cpu_op"])),
    st.builds(lambda v: ("double_val", v), st.floats(allow_nan=False)),
)
_ATTRS = st.lists(st.tuples(st.sampled_from(["kernel", "num_ops", "is_cpu_op", "step_part", "x"]), _VALUES),
                  max_size=6)


def _node(node_id: int, name: str, deps: list[int], ctrl: list[int], attrs: list[tuple[str, tuple[str, object]]],
          duration: int = 0) -> pb.Node:
    node = pb.Node(id=node_id, name=name, type=pb.COMP_NODE, data_deps=deps, ctrl_deps=ctrl,
                   duration_micros=duration)
    for attr_name, (field, value) in attrs:
        node.attr.add(name=attr_name, **{field: value})
    return node


_NODES = st.builds(_node, st.integers(0, 2**64 - 1), st.sampled_from(["", "a", "is_cpu_op", "x" * 300]),
                   st.lists(st.integers(0, 2**40), max_size=4), st.lists(st.integers(0, 2**40), max_size=3),
                   _ATTRS, st.integers(0, 2**40))


@settings(max_examples=300, deadline=None)
@given(_NODES, _NODES)
def test_equal_keys_exactly_when_attributes_are_equal(a: pb.Node, b: pb.Node) -> None:
    """Ids, names, dependencies and durations do not enter the key; every attribute does."""
    same = list(a.attr) == list(b.attr)
    assert (NodeView(a).attrs_key() == NodeView(b).attrs_key()) is same
    # read from the bytes the node was parsed from, as the streaming feeder has them
    body = a.SerializeToString()
    assert NodeView(pb.Node.FromString(body), body).attrs_key() == NodeView(a).attrs_key()


def test_a_key_ignores_what_differs_between_micro_batches() -> None:
    attrs = [("kernel", ("string_val", "gemm")), ("num_ops", ("uint64_val", 1 << 30))]
    first, later = _node(1, "mb0.L3.fc1", [0], [], attrs), _node(9_001, "mb7.L3.fc1", [9_000, 12], [4], attrs, 5)
    assert NodeView(first).attrs_key() == NodeView(later).attrs_key()
    other = _node(1, "mb0.L3.fc1", [0], [], [*attrs[:1], ("num_ops", ("uint64_val", 1 << 31))])
    assert NodeView(first).attrs_key() != NodeView(other).attrs_key()


def test_attribute_cache_derives_once_per_attribute_set_and_stays_bounded() -> None:
    calls: list[int] = []

    def derive(node: NodeView) -> int | None:
        calls.append(node.id)
        return None if node.int("n") % 2 else node.int("n")    # None is a value like any other

    cache = AttributeCache(derive, kept=4)
    views = [NodeView(_node(i, f"n{i}", [i + 100], [], [("n", ("int64_val", i % 4))])) for i in range(8)]
    assert [cache(view) for view in views] == [0, None, 2, None] * 2
    assert calls == [0, 1, 2, 3] and len(cache) == 4     # nodes 4-7 repeat the first four sets
    fifth = NodeView(_node(8, "n8", [], [], [("n", ("int64_val", 4))]))
    assert cache(fifth) == 4 and len(cache) == 1          # a fifth set: the cache starts over
    assert cache(views[0]) == 0 and calls == [0, 1, 2, 3, 8, 0]


@settings(max_examples=400, deadline=None)
@given(_NODES)
def test_node_kind_from_the_bytes_equals_the_attribute_walk(node: pb.Node) -> None:
    body = node.SerializeToString()
    assert node_kind(node, body) == node_kind(node)


def test_node_kind_reads_a_cpu_flag_hidden_among_names() -> None:
    """The name `is_cpu_op` in the node's name, or twice among its attributes, walks them."""
    for attrs, name, cpu in [([("is_cpu_op", ("bool_val", False))], "is_cpu_op", False),
                             ([("is_cpu_op", ("bool_val", False)), ("is_cpu_op", ("bool_val", True))], "", True),
                             ([("is_cpu_op", ("bool_val", True)), ("is_cpu_op", ("bool_val", False))], "", False),
                             ([("is_cpu_op", ("string_val", "true"))], "", True),
                             ([("x", ("string_val", "is_cpu_op"))], "", False)]:
        node = _node(1, name, [], [], attrs)
        assert node_kind(node, node.SerializeToString()) == (pb.COMP_NODE | 0x80 if cpu else pb.COMP_NODE)
