"""Typed access to Chakra node attributes.

Real traces disagree on attribute types: `comm_size` is int64 in ASTRA-sim's
microbenchmarks, uint64 in converted PyTorch traces; `comm_src` is int32 in
custom collectives. Every reader of attributes goes through this module, which
accepts every integer variant of `AttributeProto`, integral floats and
decimal strings (some converters write numbers as text), and raises
`AttributeTypeError` naming the node and attribute otherwise.
"""

from __future__ import annotations

import builtins
from typing import Any, Callable, TypeVar, overload

from chakra_core.errors import AttributeTypeError
from chakra_core.schema import pb

_MISSING = object()
_D = TypeVar("_D")  # the type of a typed reader's default

INT_FIELDS = frozenset({
    "int32_val", "int64_val", "uint32_val", "uint64_val", "sint32_val", "sint64_val",
    "fixed32_val", "fixed64_val", "sfixed32_val", "sfixed64_val",
})
FLOAT_FIELDS = frozenset({"double_val", "float_val"})


def attr_value(attr: pb.AttributeProto) -> Any:
    """The Python value of an AttributeProto (lists as Python lists, None if unset)."""
    which = attr.WhichOneof("value")
    if which is None:
        return None
    value = getattr(attr, which)
    if which.endswith("_list"):
        return list(value.values)
    return value


def attr_map(node: pb.Node) -> dict[str, pb.AttributeProto]:
    """name -> AttributeProto; the last one wins when a name repeats (as in Chakra's feeder)."""
    return {attr.name: attr for attr in node.attr}


def _as_int(attr: pb.AttributeProto, node_id: int, name: str) -> int:
    which = attr.WhichOneof("value")
    if which in INT_FIELDS:
        number: int = getattr(attr, which)
        return number
    if which == "bool_val":
        return int(attr.bool_val)
    if which in FLOAT_FIELDS:
        value = getattr(attr, which)
        if float(value).is_integer():
            return int(value)
    if which == "string_val" and attr.string_val.strip().lstrip("-").isdigit():
        try:
            return int(attr.string_val)
        except ValueError:  # "--5", "²": isdigit() but not an int literal
            pass
    raise AttributeTypeError(
        f"node {node_id}: attribute '{name}' must be an integer, found {which or 'no value'}"
        f" ({attr_value(attr)!r})")


def _as_float(attr: pb.AttributeProto, node_id: int, name: str) -> float:
    which = attr.WhichOneof("value")
    if which in FLOAT_FIELDS or which in INT_FIELDS:
        return float(getattr(attr, which))
    raise AttributeTypeError(
        f"node {node_id}: attribute '{name}' must be a number, found {which or 'no value'}")


def _as_bool(attr: pb.AttributeProto, node_id: int, name: str) -> bool:
    which = attr.WhichOneof("value")
    if which == "bool_val":
        return attr.bool_val
    if which in INT_FIELDS:
        return bool(getattr(attr, which))
    if which == "string_val" and attr.string_val.lower() in ("true", "false", "0", "1"):
        return attr.string_val.lower() in ("true", "1")
    raise AttributeTypeError(
        f"node {node_id}: attribute '{name}' must be a boolean, found {which or 'no value'}")


def _as_str(attr: pb.AttributeProto, node_id: int, name: str) -> str:
    which = attr.WhichOneof("value")
    if which == "string_val":
        return attr.string_val
    if which in INT_FIELDS:
        return str(getattr(attr, which))
    if which == "bytes_val":
        return attr.bytes_val.decode("utf-8", "replace")
    raise AttributeTypeError(
        f"node {node_id}: attribute '{name}' must be a string, found {which or 'no value'}")


_ATTR_TAG = 0x52
"""Node.attr's field tag (field 10, length-delimited) on the wire."""


def _first_attr(body: bytes) -> int:
    """Where a Node's first attribute starts in its wire form (0, the whole node, for a form this
    reader does not walk: tags of two bytes, groups)."""
    at, end = 0, len(body)
    while at < end:
        tag = body[at]
        if tag == _ATTR_TAG:
            return at
        if tag & 0x80:
            return 0
        at += 1
        wire = tag & 7
        if wire == 0:        # varint
            while body[at] & 0x80:
                at += 1
            at += 1
        elif wire == 2:      # length-delimited: a varint length, then that many bytes
            # (read here, not by et.io.decode_varint: its message-size check per field tripled the cost)
            length = shift = 0
            while True:
                byte = body[at]
                at += 1
                length |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            at += length
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        else:
            return 0
    return end


class NodeView:
    """A Chakra node with typed, cached attribute access.

    Wraps the protobuf `Node` without copying it; the attribute index is built
    on first use. Layers receive NodeViews, never raw protobuf messages.
    """

    __slots__ = ("pb", "_attrs", "_memo", "_body", "_key")

    def __init__(self, node: pb.Node, body: bytes | None = None):
        """`body`: the bytes `node` was parsed from, when the caller has them (attrs_key reads them)."""
        self.pb = node
        self._attrs: dict[str, pb.AttributeProto] | None = None
        self._memo: dict[Any, Any] | None = None
        self._body = body
        self._key: bytes | None = None

    @property
    def memo(self) -> dict[Any, Any]:
        """A scratch dict for values derived from this node's own content, e.g. a compute
        model's duration when it depends on nothing else. Ranks whose trace files are identical
        share their NodeViews, so what one computes the others reuse; the view, and its memo,
        is dropped when it leaves the feeder's cache. Key it by something of your own (your
        model instance, a private object) and never store anything that depends on the rank."""
        memo = self._memo
        if memo is None:
            memo = self._memo = {}
        return memo

    # Plain fields -----------------------------------------------------------------
    @property
    def id(self) -> int:
        return self.pb.id

    @property
    def name(self) -> str:
        return self.pb.name

    @property
    def type(self) -> int:
        return self.pb.type

    @property
    def type_name(self) -> str:
        return pb.NodeType.Name(self.pb.type)

    @property
    def duration_micros(self) -> int:
        return self.pb.duration_micros

    # Attributes -------------------------------------------------------------------
    def attrs_key(self) -> bytes:
        """The node's attributes as bytes, for keying what is derived from them alone: two nodes
        whose keys are equal have equal attributes. The node's wire form from its first attribute
        on (what follows the attributes, nothing in Chakra's writers, is kept too): about 2 µs,
        where serializing each attribute takes about 1.5 µs."""
        key = self._key
        if key is None:
            body = self._body if self._body is not None else self.pb.SerializeToString()
            key = self._key = body[_first_attr(body):]
        return key

    def _index(self) -> dict[str, pb.AttributeProto]:
        if self._attrs is None:
            self._attrs = attr_map(self.pb)
        return self._attrs

    def has(self, name: str) -> bool:
        return name in self._index()

    def raw(self, name: str, default: Any = None) -> Any:
        attr = self._index().get(name)
        return default if attr is None else attr_value(attr)

    def _typed(self, name: str, default: Any, convert: Callable[[pb.AttributeProto, int, str], object]) -> Any:
        attr = self._index().get(name)
        if attr is None:
            if default is _MISSING:
                raise AttributeTypeError(f"node {self.pb.id} ({self.pb.name!r}): missing attribute '{name}'")
            return default
        return convert(attr, self.pb.id, name)

    # The typed readers return `default` as given when the attribute is absent, hence the overloads;
    # once `int` is defined in this class, annotations spell the builtins as `builtins.`.
    @overload
    def int(self, name: str) -> int: ...
    @overload
    def int(self, name: str, default: _D) -> builtins.int | _D: ...

    def int(self, name: str, default: Any = _MISSING) -> Any:
        """Integer attribute, from any integer variant (or an integral float / decimal string)."""
        return self._typed(name, default, _as_int)

    @overload
    def float(self, name: builtins.str) -> builtins.float: ...
    @overload
    def float(self, name: builtins.str, default: _D) -> builtins.float | _D: ...

    def float(self, name: builtins.str, default: Any = _MISSING) -> Any:
        return self._typed(name, default, _as_float)

    @overload
    def bool(self, name: builtins.str) -> builtins.bool: ...
    @overload
    def bool(self, name: builtins.str, default: _D) -> builtins.bool | _D: ...

    def bool(self, name: builtins.str, default: Any = _MISSING) -> Any:
        return self._typed(name, default, _as_bool)

    @overload
    def str(self, name: builtins.str) -> builtins.str: ...
    @overload
    def str(self, name: builtins.str, default: _D) -> builtins.str | _D: ...

    def str(self, name: builtins.str, default: Any = _MISSING) -> Any:
        return self._typed(name, default, _as_str)

    def bool_list(self, name: builtins.str) -> list[builtins.bool] | None:
        value = self.raw(name)
        if value is None:
            return None
        if isinstance(value, list):
            return [bool(v) for v in value]
        raise AttributeTypeError(f"node {self.pb.id}: attribute '{name}' must be a list of booleans")

    # Common Chakra attributes ---------------------------------------------------------
    @property
    def is_cpu_op(self) -> builtins.bool:
        return self.bool("is_cpu_op", False)

    def __repr__(self) -> builtins.str:
        return f"NodeView(id={self.pb.id}, name={self.pb.name!r}, type={self.type_name})"
