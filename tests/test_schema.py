"""The committed protobuf module matches et_def.proto and keeps MLCommons Chakra's wire numbers."""

from __future__ import annotations

import pytest

from chakra_core.schema import et_def_pb2, pb, regenerate


def test_committed_module_matches_regenerated(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools is needed to regenerate the schema")
    fresh = regenerate.generate(tmp_path)
    committed = regenerate.serialized_descriptor(regenerate.MODULE)
    assert regenerate.serialized_descriptor(fresh) == committed
    # ... and the module really registers that descriptor at import.
    assert et_def_pb2.DESCRIPTOR.serialized_pb == committed


def test_package_name():
    assert pb.DESCRIPTOR.package == "ChakraProtoMsg"
    assert pb.Node.DESCRIPTOR.full_name == "ChakraProtoMsg.Node"


@pytest.mark.parametrize("field, number", [
    ("id", 1), ("name", 2), ("type", 3), ("ctrl_deps", 4), ("data_deps", 5),
    ("start_time_micros", 6), ("duration_micros", 7), ("inputs", 8), ("outputs", 9), ("attr", 10),
])
def test_node_field_numbers(field, number):
    assert pb.Node.DESCRIPTOR.fields_by_name[field].number == number


def test_attribute_and_metadata_field_numbers():
    fields = pb.AttributeProto.DESCRIPTOR.fields_by_name
    assert (fields["name"].number, fields["int64_val"].number, fields["uint64_val"].number,
            fields["bool_val"].number, fields["string_val"].number) == (1, 9, 13, 27, 29)
    meta = pb.GlobalMetadata.DESCRIPTOR.fields_by_name
    assert (meta["version"].number, meta["attr"].number) == (1, 2)


@pytest.mark.parametrize("enum, name, value", [
    (pb.NodeType, "COMP_NODE", 4), (pb.NodeType, "COMM_SEND_NODE", 5),
    (pb.NodeType, "COMM_RECV_NODE", 6), (pb.NodeType, "COMM_COLL_NODE", 7),
    (pb.CollectiveCommType, "ALL_REDUCE", 0), (pb.CollectiveCommType, "ALL_GATHER", 2),
    (pb.CollectiveCommType, "ALL_TO_ALL", 6), (pb.CollectiveCommType, "REDUCE_SCATTER", 7),
    (pb.CollectiveCommType, "BARRIER", 9),
])
def test_enum_values(enum, name, value):
    assert enum.Value(name) == value
