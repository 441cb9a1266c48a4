"""Builders shared by the test suite: nodes with typed attributes, small .et files, feeder drains.

Import them as `from tests.helpers import make_node, write_et, ...`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import pytest

from chakra_core.et.io import encode_message, write_trace
from chakra_core.schema import pb

SHARED_DIR = Path(__file__).resolve().parents[1].parent / "shared"
"""`../shared` next to the repository root (CI checks it out there); may be absent."""
REF_TRACES = SHARED_DIR / "ref-traces"
REF_PYTORCH = REF_TRACES / "pytorch"
REF_PYTORCH_PAIRS = [
    ("hta/benchmark_simple_add_et.json.gz", "hta/benchmark_simple_add_trace.json.gz"),
    ("param/linear_et.json.gz", "param/linear_kineto.json.gz"),
    ("param/dlrm/dlrm_eg_0.json", "param/dlrm/worker0_step_12.1694128201545.pt.trace.json"),
    ("param/dlrm/dlrm_eg_1.json", "param/dlrm/worker1_step_12.1694128201556.pt.trace.json"),
    ("selfgen-cpu/host.0.json.gz", "selfgen-cpu/device.0.json.gz"),
    ("selfgen-cpu/host.1.json.gz", "selfgen-cpu/device.1.json.gz"),
]
"""PyTorch host trace -> the Kineto trace of the same run (paths relative to REF_PYTORCH)."""
CYCLIC_REF_TRACE = "chakra-et/chakra-tests/chakra.0.et"
"""The reference trace whose control dependencies form cycles (run it with dependencies="data")."""

_LIST_FIELDS = {bool: "bool_list", int: "int64_list", float: "double_list", str: "string_list",
                bytes: "bytes_list"}


def make_attr(name: str, value: Any) -> pb.AttributeProto:
    """An AttributeProto. `value` is an AttributeProto field given as `("uint64_val", 5)`, or a
    Python value whose type picks the field: bool, int (int64), float (double), str, bytes, or a
    non-empty list of one of those (`*_list`)."""
    attr = pb.AttributeProto(name=name)
    if isinstance(value, tuple):
        field, val = value
        if field.endswith("_list"):
            getattr(attr, field).values.extend(val)
        else:
            setattr(attr, field, val)
    elif isinstance(value, bool):
        attr.bool_val = value
    elif isinstance(value, int):
        attr.int64_val = value
    elif isinstance(value, float):
        attr.double_val = value
    elif isinstance(value, str):
        attr.string_val = value
    elif isinstance(value, bytes):
        attr.bytes_val = value
    elif isinstance(value, list) and value:
        getattr(attr, _LIST_FIELDS[type(value[0])]).values.extend(value)
    else:
        raise TypeError(f"cannot infer the attribute field of {name}={value!r}; pass (field, value)")
    return attr


def make_node(id: int, type: int | str = pb.COMP_NODE, data_deps: Iterable[int] = (),
              ctrl_deps: Iterable[int] = (), attrs: Mapping[str, Any] | None = None,
              duration_micros: int = 0, name: str | None = None) -> pb.Node:
    """A Node; `type` is a NodeType value or name, `attrs` maps names to `make_attr` values."""
    node = pb.Node(id=id, name=f"node{id}" if name is None else name,
                   type=pb.NodeType.Value(type) if isinstance(type, str) else type,
                   duration_micros=duration_micros)
    node.data_deps.extend(data_deps)
    node.ctrl_deps.extend(ctrl_deps)
    for attr_name, value in (attrs or {}).items():
        node.attr.append(make_attr(attr_name, value))
    return node


def make_metadata(version: str = "0.0.4", attrs: Mapping[str, Any] | None = None) -> pb.GlobalMetadata:
    meta = pb.GlobalMetadata(version=version)
    for attr_name, value in (attrs or {}).items():
        meta.attr.append(make_attr(attr_name, value))
    return meta


def write_et(path: str | os.PathLike, nodes: Iterable[pb.Node],
             metadata: pb.GlobalMetadata | None = None, compress: bool = False) -> Path:
    """Write nodes (after a default GlobalMetadata) to a .et file with `write_trace`; return the path."""
    write_trace(path, make_metadata() if metadata is None else metadata, nodes, compress=compress)
    return Path(path)


def frame_offsets(metadata: pb.GlobalMetadata, nodes: Iterable[pb.Node]) -> list[int]:
    """Byte offset of every frame (metadata first) in the uncompressed encoding of a trace."""
    offsets, pos = [], 0
    for message in [metadata, *nodes]:
        offsets.append(pos)
        pos += len(encode_message(message))
    return offsets


def ref_et_files() -> list[Path]:
    """Every .et file under the shared reference traces, sorted (empty when they are absent)."""
    return sorted(REF_TRACES.rglob("*.et")) if REF_TRACES.is_dir() else []


def ref_et_params() -> list:
    """pytest.parametrize values over `ref_et_files()`: ids relative to ref-traces, one skipped
    placeholder when the shared folder is missing."""
    files = ref_et_files()
    if not files:
        return [pytest.param(None, id="no-ref-traces",
                             marks=pytest.mark.skip(reason=f"{REF_TRACES} not found"))]
    return [pytest.param(f, id=f.relative_to(REF_TRACES).as_posix()) for f in files]


def drain(feeder) -> list[int]:
    """Run a feeder to completion in waves (pop every issuable id, then free them all)."""
    order: list[int] = []
    while feeder.has_nodes_to_issue():
        wave = []
        while (node_id := feeder.next_issuable_node()) is not None:
            wave.append(node_id)
        order += wave
        for node_id in wave:
            feeder.free_children(node_id)
            feeder.remove_node(node_id)
    return order
