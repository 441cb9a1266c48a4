"""Building nodes from attribute blobs (chakra_core.et.build.Stream.add's `attr_blob`, the
generator's kernel_blob and collective_blob): the same node, bit for bit, as extending it with the
attribute messages."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from chakra_core.errors import ChakraSimError
from chakra_core.et.build import Stream, attributes_blob, bool_attr, read_collective, str_attr, uint_attr
from chakra_core.jobs.kernels import collective_blob, kernel_blob
from chakra_core.schema import pb

names = st.text(alphabet="abcdefgh_", min_size=1, max_size=12)
attrs = st.lists(st.one_of(st.builds(uint_attr, names, st.integers(0, (1 << 64) - 1)),
                           st.builds(str_attr, names, st.text(max_size=20)),
                           st.builds(bool_attr, names, st.booleans())), max_size=8)


@settings(max_examples=50, deadline=None)
@given(first=attrs, rest=attrs, deps=st.lists(st.integers(0, 5), max_size=4))
def test_a_blob_adds_the_same_attributes_as_the_messages(first, rest, deps):
    """`attrs` then `attr_blob` make the node that `attrs + rest` make, in that order."""
    by_blob, by_messages = Stream(), Stream()
    for stream in (by_blob, by_messages):
        for _ in range(6):
            stream.add(pb.COMP_NODE, "parent")
    by_blob.add(pb.COMP_NODE, "n", deps=deps, attrs=first, attr_blob=attributes_blob(rest))
    by_messages.add(pb.COMP_NODE, "n", deps=deps, attrs=[*first, *rest])
    assert by_blob.nodes[-1].SerializeToString() == by_messages.nodes[-1].SerializeToString()


def test_kernel_blob_holds_the_kernel_attributes_in_order():
    node = pb.Node()
    node.MergeFromString(kernel_blob(10, 20, "gemm", "bf16", "forward",
                                     (("uint", "gemm_m", 4), ("uints", "gemm_m_list", (1, 3)),
                                      ("bool", "attn_causal", True), ("str", "attn_pass", "forward"))))
    expected = [bool_attr("is_cpu_op", False), uint_attr("num_ops", 10), uint_attr("tensor_size", 20),
                str_attr("kernel", "gemm"), str_attr("dtype", "bf16"), str_attr("step_part", "forward"),
                uint_attr("gemm_m", 4), pb.AttributeProto(name="gemm_m_list"), bool_attr("attn_causal", True),
                str_attr("attn_pass", "forward")]
    expected[7].uint64_list.values.extend([1, 3])
    assert list(node.attr) == expected


def test_collective_blob_holds_the_collective_attributes():
    node = pb.Node()
    node.MergeFromString(collective_blob(pb.ALL_GATHER, 1 << 20, "tp_0", "tp", 8))
    assert list(node.attr) == [*read_collective(pb.ALL_GATHER, 1 << 20, "tp_0"), str_attr("step_part", "tp"),
                               uint_attr("comm_ctas", 8)]
    node = pb.Node()
    node.MergeFromString(collective_blob(pb.ALL_REDUCE, 4, "dp_0", "dp", 0))
    assert [attr.name for attr in node.attr][-1] == "step_part"     # no comm_ctas without userbuffers


def test_a_value_the_trace_cannot_hold_is_refused_by_name():
    with pytest.raises(ChakraSimError, match="num_ops"):
        kernel_blob(1 << 64, 1, "gemm", "bf16", "forward")
