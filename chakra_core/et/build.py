"""Building Chakra traces programmatically: nodes, attributes, process groups, files.

Shared by the text converter and the generators. Everything here is
deterministic: node ids are assigned in creation order, attributes are
written in the order given, and `write_rank_files` goes through
`chakra_core.et.io.write_trace` (atomic, byte-identical for identical input).

`Stream` models what ASTRA-sim 1.0's workload loop and a framework's
single-stream program have in common: operations run one after another, an
asynchronous collective may run in the background, and a later operation
may wait for it. Each new operation depends on the stream's *frontier* (the
last operation plus anything it was told to wait for).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Sequence

from chakra_core.errors import ChakraSimError
from chakra_core.et.io import write_trace
from chakra_core.et.rank_files import RankFiles, rank_path as rank_path
from chakra_core.schema import pb

TRACE_VERSION = "0.0.4"
"""GlobalMetadata.version written by the tools (what ASTRA-sim's own example traces carry)."""


_RANGES = {"int64_val": (-(1 << 63), (1 << 63) - 1), "uint64_val": (0, (1 << 64) - 1),
           "int32_val": (-(1 << 31), (1 << 31) - 1), "uint32_val": (0, (1 << 32) - 1)}


def int_attr(name: str, value: int, field: str = "int64_val") -> pb.AttributeProto:
    """An integer attribute; a value its field cannot hold is a ChakraSimError (protobuf's own
    ValueError names neither the attribute nor the limit)."""
    attr = pb.AttributeProto(name=name)
    low, high = _RANGES.get(field, (None, None))
    if low is not None and high is not None and not low <= int(value) <= high:
        raise ChakraSimError(f"attribute {name} = {int(value):,} ({int(value):.2g}) does not fit the "
                             f"{field.removesuffix('_val')} a Chakra trace holds it in ({low:,} to {high:,})")
    setattr(attr, field, int(value))
    return attr


def uint_attr(name: str, value: int) -> pb.AttributeProto:
    return int_attr(name, value, "uint64_val")


def uint_list_attr(name: str, values: Iterable[int]) -> pb.AttributeProto:
    attr = pb.AttributeProto(name=name)
    attr.uint64_list.values.extend(values)
    return attr


def str_attr(name: str, value: str) -> pb.AttributeProto:
    return pb.AttributeProto(name=name, string_val=value)


def bool_attr(name: str, value: bool) -> pb.AttributeProto:
    return pb.AttributeProto(name=name, bool_val=value)


def read_collective(comm_type: int, size: int, pg_name: str | None = None) -> list[pb.AttributeProto]:
    """The attributes of a COMM_COLL node (in the order ASTRA-sim's example traces use)."""
    attrs = [bool_attr("is_cpu_op", False), int_attr("comm_type", comm_type), int_attr("comm_size", size)]
    if pg_name is not None:
        attrs.append(str_attr("pg_name", pg_name))
    return attrs


def p2p_attrs(src: int, dst: int, tag: int, size: int) -> list[pb.AttributeProto]:
    """The attributes of a COMM_SEND / COMM_RECV node."""
    return [bool_attr("is_cpu_op", False), int_attr("comm_src", src), int_attr("comm_dst", dst),
            int_attr("comm_tag", tag), int_attr("comm_size", size)]


def metadata(attrs: dict[str, object]) -> pb.GlobalMetadata:
    """A GlobalMetadata with string / int attributes, in the order given."""
    meta = pb.GlobalMetadata(version=TRACE_VERSION)
    for name, value in attrs.items():
        if isinstance(value, bool):
            meta.attr.append(bool_attr(name, value))
        elif isinstance(value, int):
            meta.attr.append(int_attr(name, value))
        else:
            meta.attr.append(str_attr(name, str(value)))
    return meta


def process_group_json(groups: Sequence[tuple[str, Sequence[int]]]) -> str:
    """The METADATA `inputs.values` text defining process groups (PyTorch `pg_config` shape)."""
    return json.dumps([{"pg_name": name, "ranks": list(ranks)} for name, ranks in groups],
                      separators=(",", ":"))


class Stream:
    """The nodes of one rank, built in program order (see module docstring)."""

    def __init__(self) -> None:
        self.nodes: list[pb.Node] = []
        self.frontier: list[int] = []
        self.root_deps: list[int] = []

    # Raw nodes --------------------------------------------------------------------------
    def add(self, node_type: pb.NodeType, name: str, deps: Iterable[int] = (), ctrl: Iterable[int] = (),
            duration_micros: int = 0, attrs: Iterable[pb.AttributeProto] = (), attr_blob: bytes = b"") -> int:
        """A node; `attr_blob`: more attributes, after `attrs`, as the wire bytes of a Node holding
        only them (`attributes_blob`): parsing them costs a tenth of copying the messages."""
        node_id = len(self.nodes)
        node = pb.Node(id=node_id, name=name, type=node_type, duration_micros=duration_micros)
        # (each extend skipped when empty: a call costs more than most nodes' deps)
        data = _unique(deps)
        if data:
            node.data_deps.extend(data)
        control = _unique(ctrl) if ctrl else []
        if not data and not control and self.root_deps and node_type != pb.METADATA_NODE:
            control = list(self.root_deps)
        if control:
            node.ctrl_deps.extend(control)
        if attrs:
            node.attr.extend(attrs)
        if attr_blob:
            node.MergeFromString(attr_blob)
        self.nodes.append(node)
        return node_id

    def define_groups(self, groups: Sequence[tuple[str, Sequence[int]]]) -> int | None:
        """A METADATA node defining `groups`; every later node without parents waits for it."""
        if not groups:
            return None
        node_id = self.add(pb.METADATA_NODE, "process_groups")
        self.nodes[node_id].inputs.values = process_group_json(groups)
        self.root_deps = [node_id]
        return node_id

    # Stream operations -------------------------------------------------------------------
    def step(self, node_type: pb.NodeType, name: str, duration_micros: int = 0,
             attrs: Iterable[pb.AttributeProto] = (), attr_blob: bytes = b"") -> int:
        """An operation of the stream: it waits for the frontier and becomes the frontier."""
        node_id = self.add(node_type, name, deps=self.frontier, duration_micros=duration_micros,
                           attrs=attrs, attr_blob=attr_blob)
        self.frontier = [node_id]
        return node_id

    def launch(self, node_type: pb.NodeType, name: str, duration_micros: int = 0,
               attrs: Iterable[pb.AttributeProto] = (), after: Sequence[int] | None = None,
               attr_blob: bytes = b"") -> int:
        """An asynchronous operation started after the frontier (or `after`); the frontier stays."""
        deps = self.frontier if after is None else after
        return self.add(node_type, name, deps=deps, duration_micros=duration_micros, attrs=attrs,
                        attr_blob=attr_blob)

    def wait(self, *node_ids: int | None) -> None:
        """The next stream operation also waits for these (None: nothing to wait for)."""
        for node_id in node_ids:
            if node_id is not None and node_id not in self.frontier:
                self.frontier.append(node_id)


def attributes_blob(attrs: Iterable[pb.AttributeProto]) -> bytes:
    """The wire bytes of a Node holding only `attrs`, for Stream.add's `attr_blob`."""
    return pb.Node(attr=attrs).SerializeToString()


def _unique(ids: Iterable[int]) -> list[int]:
    if isinstance(ids, (list, tuple)) and len(ids) < 2:    # most nodes': one parent or none
        return list(ids)
    seen: set[int] = set()
    out = []
    for value in ids:
        if value not in seen:
            seen.add(value)
            out.append(value)
    return out


def write_rank_files(prefix: str | os.PathLike[str], ranks: Iterable[Sequence[pb.Node]],
                     meta: pb.GlobalMetadata, compress: bool = False, count: int | None = None,
                     what: str = "ranks") -> list[Path]:
    """Write PREFIX.<rank>.et for every rank (taken one at a time): all or none, stale ranks of
    an earlier trace removed (chakra_core.et.rank_files); return the paths. `count`, when known,
    is checked (as `what`) before the first file is written."""
    with RankFiles(prefix, count, what) as staged:
        for rank, nodes in enumerate(ranks):
            write_trace(staged.path(rank), meta, nodes, compress=compress)
        return staged.commit()


def micros_from_ns(ns: int) -> int:
    """Whole microseconds, rounded half up (Chakra's duration_micros is an integer)."""
    return (int(ns) + 500) // 1000
