"""Host execution traces (PyTorch `ExecutionTraceObserver` JSON) in one shape for every schema.

A host trace is `{"schema", "pid", "time", "start_ts", "finish_ts", "nodes": [...]}`; each node
is one record-function scope (an operator, a user annotation, or a profiler wrapper) of the
host program. Two node layouts exist:

- schema 1.0.1: `parent`, `rf_id`, `tid`, `op_schema`... are top-level keys; operands are
  `inputs` / `input_shapes` / `input_types` (and the same for outputs) as plain lists;
- schemas 1.0.2-chakra.0.0.4 .. 1.1.x: `ctrl_deps` is the parent id, operands are
  `inputs` / `outputs` objects `{values, shapes, types[, strides]}`, and everything else is an
  `attrs` list of `{name, type, value}`.

The layout is recognised per node from its keys, so a newer schema that keeps either layout
converts (with a warning). Problems with single nodes (no id, no parent, operand lists that do
not line up) become warnings naming the node; only a document without a `nodes` list is an error.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from chakra_core.tools.pytorch.errors import ConversionError
from chakra_core.tools.pytorch.jsonfile import load_json

KNOWN_SCHEMAS = ("1.0.1", "1.0.2-chakra.0.0.4", "1.0.3-chakra.0.0.4", "1.1.0-chakra.0.0.4",
                 "1.1.1-chakra.0.0.4")
NEWEST_SCHEMA = (1, 1, 1)

_OLD_OPERAND_KEYS = {"inputs": ("inputs", "input_shapes", "input_types"),
                     "outputs": ("outputs", "output_shapes", "output_types")}
_STRUCTURAL = {"id", "name", "parent", "ctrl_deps", "attrs", "inputs", "outputs", "input_shapes",
               "input_types", "output_shapes", "output_types", "input_strides", "output_strides"}
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


@dataclass(slots=True)
class Operands:
    """An operator's inputs or outputs: parallel lists of values, shapes and type strings."""

    values: list[Any] = field(default_factory=list)
    shapes: list[Any] = field(default_factory=list)
    types: list[Any] = field(default_factory=list)


@dataclass(slots=True)
class HostOp:
    """One node of the host trace, whatever its schema."""

    id: int
    name: str
    parent: int | None
    inputs: Operands
    outputs: Operands
    attrs: dict[str, Any]

    @property
    def rf_id(self) -> int | None:
        value = self.attrs.get("rf_id")
        return value if isinstance(value, int) else None

    @property
    def tid(self) -> int | None:
        value = self.attrs.get("tid")
        return value if isinstance(value, int) else None

    @property
    def op_schema(self) -> str:
        value = self.attrs.get("op_schema")
        return value if isinstance(value, str) else ""

    def label(self) -> str:
        return f"node {self.id} ({self.name!r})"


@dataclass
class HostTrace:
    path: str
    schema: str
    meta: dict[str, Any]
    ops: dict[int, HostOp]
    """By id, ascending (ids are assigned when a scope starts, so this is start order)."""
    warnings: list[str]


def load_host_trace(path: str | os.PathLike[str]) -> HostTrace:
    doc = load_json(path, "host execution trace")
    spath = str(path)
    if not isinstance(doc, dict):
        raise ConversionError(f"{spath}: a host execution trace is a JSON object with a 'nodes' list, "
                              f"found a JSON {type(doc).__name__}")
    nodes = doc.get("nodes")
    if not isinstance(nodes, list):
        found = "no 'nodes' key" if nodes is None else f"'nodes' is a {type(nodes).__name__}"
        raise ConversionError(f"{spath}: not a host execution trace: {found} (expected a list of nodes; "
                              "is this a Kineto trace? give it with --kineto)")
    warnings: list[str] = []
    schema = doc.get("schema")
    schema = schema if isinstance(schema, str) else ""
    warnings.extend(_schema_warnings(spath, schema))
    meta = {key: doc[key] for key in ("pid", "time", "start_ts", "finish_ts", "rank") if key in doc}
    ops: dict[int, HostOp] = {}
    for index, raw in enumerate(nodes):
        op = _normalise(raw, index, spath, warnings)
        if op is None:
            continue
        if op.id in ops:
            warnings.append(f"{spath}: nodes[{index}]: duplicate id {op.id} ({op.name!r}; the first "
                            f"node with this id is {ops[op.id].name!r}); skipped")
            continue
        ops[op.id] = op
    if not ops:
        raise ConversionError(f"{spath}: the host execution trace has no usable nodes")
    ordered = {op_id: ops[op_id] for op_id in sorted(ops)}
    for op in ordered.values():
        if op.parent is not None and op.parent != op.id and op.parent not in ordered:
            warnings.append(f"{spath}: {op.label()}: parent {op.parent} is not in the trace; "
                            "treated as top-level")
            op.parent = None
    return HostTrace(spath, schema, meta, ordered, warnings)


def _schema_warnings(path: str, schema: str) -> list[str]:
    if schema in KNOWN_SCHEMAS:
        return []
    match = _VERSION.match(schema)
    if not match:
        return [f"{path}: unrecognised schema {schema!r}; node layouts are detected from their keys"]
    version = tuple(int(part) for part in match.groups())
    if version > NEWEST_SCHEMA:
        return [f"{path}: schema {schema!r} is newer than the newest known "
                f"({KNOWN_SCHEMAS[-1]}); converted as 1.1.x, check the result"]
    return [f"{path}: schema {schema!r} is not one of the known schemas ({', '.join(KNOWN_SCHEMAS)}); "
            "node layouts are detected from their keys"]


def _normalise(raw: Any, index: int, path: str, warnings: list[str]) -> HostOp | None:
    where = f"{path}: nodes[{index}]"
    if not isinstance(raw, dict):
        warnings.append(f"{where} is a JSON {type(raw).__name__}, not a node object; skipped")
        return None
    name = raw.get("name")
    node_id = raw.get("id")
    if not isinstance(node_id, int) or isinstance(node_id, bool):
        shown = f" ({name!r})" if isinstance(name, str) else ""
        warnings.append(f"{where}{shown} has no integer 'id' (found {node_id!r}); skipped")
        return None
    if not isinstance(name, str):
        warnings.append(f"{path}: node {node_id} has no 'name'; named ''")
        name = ""
    label = f"{path}: node {node_id} ({name!r})"
    new_layout = "ctrl_deps" in raw or "attrs" in raw or isinstance(raw.get("inputs"), dict)
    attrs: dict[str, Any] = {}
    if new_layout:
        parent = raw.get("ctrl_deps")
        if isinstance(parent, list):  # some writers emit a one-element list
            parent = parent[0] if parent else None
        raw_attrs = raw.get("attrs", [])
        if not isinstance(raw_attrs, list):
            warnings.append(f"{label}: 'attrs' is not a list; ignored")
            raw_attrs = []
        for attr in raw_attrs:
            if isinstance(attr, dict) and isinstance(attr.get("name"), str):
                attrs[attr["name"]] = attr.get("value")
        inputs = _new_operands(raw.get("inputs"), "inputs", label, warnings)
        outputs = _new_operands(raw.get("outputs"), "outputs", label, warnings)
    else:
        parent = raw.get("parent")
        inputs = _old_operands(raw, "inputs", label, warnings)
        outputs = _old_operands(raw, "outputs", label, warnings)
    for key, value in raw.items():
        if key not in _STRUCTURAL:
            attrs.setdefault(key, value)
    if parent is None:
        warnings.append(f"{label}: no parent ('ctrl_deps' or 'parent'); treated as top-level")
    elif not isinstance(parent, int) or isinstance(parent, bool):
        warnings.append(f"{label}: parent {parent!r} is not a node id; treated as top-level")
        parent = None
    return HostOp(node_id, name, parent, inputs, outputs, attrs)


def _new_operands(raw: Any, which: str, label: str, warnings: list[str]) -> Operands:
    if raw is None:
        return Operands()
    if not isinstance(raw, dict):
        warnings.append(f"{label}: '{which}' is not an object {{values, shapes, types}}; ignored")
        return Operands()
    return _checked(raw.get("values"), raw.get("shapes"), raw.get("types"), which, label, warnings)


def _old_operands(raw: dict[str, Any], which: str, label: str, warnings: list[str]) -> Operands:
    values_key, shapes_key, types_key = _OLD_OPERAND_KEYS[which]
    return _checked(raw.get(values_key), raw.get(shapes_key), raw.get(types_key), which, label, warnings)


def _checked(values: Any, shapes: Any, types: Any, which: str, label: str, warnings: list[str]) -> Operands:
    values = values if isinstance(values, list) else []
    shapes = shapes if isinstance(shapes, list) else []
    types = types if isinstance(types, list) else []
    if values and (len(shapes) != len(values) or len(types) != len(values)):
        warnings.append(f"{label}: {which} have {len(values)} values but {len(shapes)} shapes and "
                        f"{len(types)} types; missing entries are treated as unknown")
        shapes = (shapes + [None] * len(values))[:len(values)]
        types = (types + [""] * len(values))[:len(values)]
    return Operands(values, shapes, types)
