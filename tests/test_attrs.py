"""NodeView: typed attribute access across the integer variants real traces use."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chakra_core.errors import AttributeTypeError
from chakra_core.et.attrs import NodeView, attr_value
from chakra_core.schema import pb
from tests.helpers import make_node

INT_RANGES = {
    "int32_val": (-2**31, 2**31 - 1), "sint32_val": (-2**31, 2**31 - 1),
    "sfixed32_val": (-2**31, 2**31 - 1), "int64_val": (-2**63, 2**63 - 1),
    "sint64_val": (-2**63, 2**63 - 1), "sfixed64_val": (-2**63, 2**63 - 1),
    "uint32_val": (0, 2**32 - 1), "fixed32_val": (0, 2**32 - 1),
    "uint64_val": (0, 2**64 - 1), "fixed64_val": (0, 2**64 - 1),
}


def view(node_id: int = 7, **attrs) -> NodeView:
    """A NodeView of a node that went through the wire format (serialize + parse)."""
    node = pb.Node()
    node.ParseFromString(make_node(node_id, attrs=attrs).SerializeToString())
    return NodeView(node)


def test_int_variants_cover_the_schema():
    oneof = pb.AttributeProto.DESCRIPTOR.oneofs_by_name["value"]
    scalar_ints = {f.name for f in oneof.fields if f.name.endswith("_val")
                   and f.cpp_type in (f.CPPTYPE_INT32, f.CPPTYPE_INT64, f.CPPTYPE_UINT32, f.CPPTYPE_UINT64)}
    assert scalar_ints == set(INT_RANGES)


@pytest.mark.parametrize("field", sorted(INT_RANGES))
@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=st.data())
def test_int_round_trip_through_every_variant(field, data):
    low, high = INT_RANGES[field]
    value = data.draw(st.one_of(st.integers(low, high), st.sampled_from([low, high, 0])))
    node = view(comm_size=(field, value))
    assert node.int("comm_size") == value
    assert node.raw("comm_size") == value
    assert node.str("comm_size") == str(value)
    assert node.bool("comm_size") is (value != 0)
    assert node.float("comm_size") == float(value)


@pytest.mark.parametrize("field", ["double_val", "float_val"])
@settings(max_examples=40, deadline=None, derandomize=True)
@given(value=st.integers(-2**24, 2**24))
def test_integral_floats_read_as_int(field, value):
    node = view(num_ops=(field, float(value)))
    assert node.int("num_ops") == value and type(node.int("num_ops")) is int


@pytest.mark.parametrize("value, expected", [(True, 1), (False, 0)])
def test_bool_reads_as_int(value, expected):
    assert view(flag=value).int("flag") == expected


@pytest.mark.parametrize("attr", [
    ("string_val", "abc"), ("string_val", ""), ("string_val", "--5"), ("string_val", "1-2"),
    ("string_val", "\u00b2"), ("double_val", 1.5), ("double_val", math.inf), ("double_val", math.nan),
    ("float_val", 0.25), ("bytes_val", b"12"), ("int64_list", [1, 2]), ("bool_list", [True]),
])
def test_non_integers_are_rejected_naming_node_and_attribute(attr):
    with pytest.raises(AttributeTypeError) as excinfo:
        view(1234, comm_size=attr).int("comm_size")
    assert "node 1234" in str(excinfo.value) and "'comm_size'" in str(excinfo.value)


def test_unset_oneof_is_rejected():
    with pytest.raises(AttributeTypeError, match="node 7: attribute 'comm_size'.*no value"):
        view(comm_size=("doc_string", "set but without a value")).int("comm_size")


@pytest.mark.parametrize("method", ["int", "float", "bool", "str"])
def test_missing_attribute(method):
    node = view(42, other=1)
    assert getattr(node, method)("comm_size", None) is None
    assert getattr(node, method)("comm_size", 5) == 5
    with pytest.raises(AttributeTypeError) as excinfo:
        getattr(node, method)("comm_size")
    assert "node 42" in str(excinfo.value) and "missing attribute 'comm_size'" in str(excinfo.value)
    assert not node.has("comm_size") and node.has("other")


def test_default_is_not_used_when_present():
    assert view(comm_type=("int32_val", 0)).int("comm_type", -1) == 0


@pytest.mark.parametrize("attr, expected", [
    (("double_val", 2.5), 2.5), (("float_val", 0.5), 0.5), (("uint64_val", 2**40), float(2**40)),
    (("sint32_val", -3), -3.0),
])
def test_float(attr, expected):
    assert view(x=attr).float("x") == expected


@pytest.mark.parametrize("attr", [("string_val", "1.5"), ("bool_val", True), ("bytes_val", b"1")])
def test_float_rejects_non_numbers(attr):
    with pytest.raises(AttributeTypeError, match="node 7: attribute 'x'"):
        view(x=attr).float("x")


@pytest.mark.parametrize("attr, expected", [
    (("bool_val", True), True), (("bool_val", False), False), (("uint32_val", 2), True),
    (("int64_val", 0), False), (("string_val", "True"), True), (("string_val", "false"), False),
    (("string_val", "1"), True), (("string_val", "0"), False),
])
def test_bool(attr, expected):
    assert view(x=attr).bool("x") is expected


@pytest.mark.parametrize("attr", [("string_val", "yes"), ("double_val", 1.0)])
def test_bool_rejects(attr):
    with pytest.raises(AttributeTypeError, match="node 7: attribute 'x' must be a boolean"):
        view(x=attr).bool("x")


@pytest.mark.parametrize("attr, expected", [
    (("string_val", "pg-0"), "pg-0"), (("int32_val", -4), "-4"), (("bytes_val", b"ab"), "ab"),
])
def test_str(attr, expected):
    assert view(x=attr).str("x") == expected


def test_str_rejects_double():
    with pytest.raises(AttributeTypeError, match="node 7: attribute 'x' must be a string"):
        view(x=2.0).str("x")


def test_bool_list():
    node = view(flags=[True, False, True], ints=("int32_list", [0, 3]), scalar=True)
    assert node.bool_list("flags") == [True, False, True]
    assert node.bool_list("ints") == [False, True]
    assert node.bool_list("missing") is None
    with pytest.raises(AttributeTypeError, match="node 7: attribute 'scalar'"):
        node.bool_list("scalar")


@pytest.mark.parametrize("attrs, expected", [
    ({}, False), ({"is_cpu_op": True}, True), ({"is_cpu_op": False}, False),
    ({"is_cpu_op": ("int32_val", 1)}, True), ({"is_cpu_op": "false"}, False),
])
def test_is_cpu_op(attrs, expected):
    assert view(**attrs).is_cpu_op is expected


def test_last_attribute_of_a_name_wins():
    node = make_node(3)
    node.attr.add(name="comm_size", int64_val=1)
    node.attr.add(name="comm_size", uint64_val=2)
    assert NodeView(node).int("comm_size") == 2


def test_plain_fields_and_raw_values():
    node = NodeView(make_node(9, type="COMM_COLL_NODE", duration_micros=12, name="ar",
                              attrs={"sizes": [1, 2], "blob": b"\x00"}))
    assert (node.id, node.name, node.type, node.type_name, node.duration_micros) == \
        (9, "ar", pb.COMM_COLL_NODE, "COMM_COLL_NODE", 12)
    assert node.raw("sizes") == [1, 2] and node.raw("blob") == b"\x00"
    assert node.raw("missing", "dflt") == "dflt"
    assert attr_value(pb.AttributeProto(name="unset")) is None
    assert "id=9" in repr(node) and "COMM_COLL_NODE" in repr(node)
