"""Key paths: where a sweep's overrides go in a manifest, and where its metric is in results.json.

`network.bandwidth[0]` is the key path ('network', 'bandwidth', 0): names joined by '.', each
optionally followed by [index]; `format_loc` writes it back. A metric is a key path into a
point's results.json, or an aggregate over its ranks (`max(exposed_comm_ns)`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from chakra_core.config.manifest import format_loc
from chakra_core.json_types import JsonObject, JsonValue

KeyPath = tuple[str | int, ...]  # ('network', 'bandwidth', 0): the parts format_loc joins into 'network.bandwidth[0]'

AGGREGATES = ("max", "min", "mean", "sum")

# Names are what manifest keys are made of (ASTRA-sim's have hyphens); an index is a
# non-negative integer.
_NAME = r"[\w-]+"
_PATH = re.compile(rf"{_NAME}(\[\d+\])*(\.{_NAME}(\[\d+\])*)*")
_PART = re.compile(rf"({_NAME})|\[(\d+)\]")
_AGGREGATE = re.compile(r"(\w+)\((.*)\)")


class KeyPathError(ValueError):
    """A key path that cannot be parsed, or that does not fit the mapping it is applied to."""


def parse_key_path(text: Any) -> KeyPath:
    """'network.bandwidth[0]' -> ('network', 'bandwidth', 0), the inverse of `format_loc`."""
    if not isinstance(text, str) or not _PATH.fullmatch(text):
        raise KeyPathError(f"not a key path: {text!r} (expected names of letters, digits, _ and - "
                           "joined by '.', each optionally followed by [index], e.g. network.bandwidth[0])")
    return tuple(int(index) if index else name for name, index in _PART.findall(text))


def set_key_path(data: JsonObject, path: KeyPath, value: JsonValue) -> None:
    """Set `path` in `data` to `value`, creating missing mapping keys on the way.

    A list index must exist: what a new item would hold in between is anyone's guess,
    so growing a list is done by setting the whole list.
    """
    node: Any = data
    for depth, part in enumerate(path):
        last = depth == len(path) - 1
        here = format_loc(path[:depth]) if depth else "the manifest"
        if isinstance(part, int):
            if not isinstance(node, list):
                raise KeyPathError(f"{here} is {describe(node)}, not a list: [{part}] cannot index it")
            if part >= len(node):
                items = f"{len(node)} item" + ("" if len(node) == 1 else "s")
                raise KeyPathError(f"index {part} out of range: {here} has {items}; "
                                   f"set the whole list ({format_loc(path[:depth])}: [...]) instead")
        elif not isinstance(node, dict):
            raise KeyPathError(f"{here} is {describe(node)}, not a mapping: it has no key '{part}'")
        elif not last and part not in node:
            if isinstance(path[depth + 1], int):
                raise KeyPathError(f"{format_loc(path[:depth + 1])} is not in the base manifest, so "
                                   f"[{path[depth + 1]}] cannot index it; set the whole list instead")
            node[part] = {}
        if last:
            node[part] = copy.deepcopy(value)
        else:
            node = node[part]


def describe(value: Any) -> str:
    """How a value reads in a message: "null", "a list", "an int (3)"."""
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        return f"a {'mapping' if isinstance(value, dict) else 'list'}"
    kind = type(value).__name__
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} ({value!r})"


# The metric ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    """A number taken from a point's results.json: a path into it, or an aggregate over ranks."""

    text: str
    path: KeyPath
    aggregate: str | None = None
    """max, min, mean or sum of `path` in every entry of `ranks`; None: `path` from the top level."""

    @classmethod
    def parse(cls, text: Any) -> "Metric":
        if not isinstance(text, str):
            raise KeyPathError(f"expected a string such as finish_ns or max(exposed_comm_ns), "
                               f"found {describe(text)}")
        text = text.strip()
        call = _AGGREGATE.fullmatch(text)
        if call is None:
            return cls(text, parse_key_path(text))
        if call.group(1) not in AGGREGATES:
            raise KeyPathError(f"unknown aggregate {call.group(1)!r} (use {', '.join(AGGREGATES)})")
        return cls(text, parse_key_path(call.group(2).strip()), call.group(1))

    def value(self, results: Mapping[str, Any]) -> int | float:
        """The metric in `results`; KeyPathError saying why when it is missing or not a number."""
        if self.aggregate is None:
            return _number_at(results, self.path)
        values = [_number_at(rank, self.path, f"ranks[{i}].") for i, rank in enumerate(results["ranks"])]
        if not values:
            raise KeyPathError("the results have no ranks")
        if self.aggregate == "mean":
            return sum(values) / len(values)
        aggregates: dict[str, Callable[[list[int | float]], int | float]] = {"max": max, "min": min, "sum": sum}
        return aggregates[self.aggregate](values)

    @property
    def unit(self) -> str | None:
        """'ns' or 'bytes' when the key's name says so (for the plot's axis)."""
        name = str(next((p for p in reversed(self.path) if isinstance(p, str)), ""))
        if name.endswith("_ns"):
            return "ns"
        if "bytes" in name:
            return "bytes"
        return None


def _number_at(data: Any, path: KeyPath, prefix: str = "") -> int | float:
    node = data
    for depth, part in enumerate(path):
        missing = (isinstance(part, int) and not (isinstance(node, list) and part < len(node))) or \
                  (isinstance(part, str) and not (isinstance(node, dict) and part in node))
        if missing:
            raise KeyPathError(f"the results have no {prefix}{format_loc(path[:depth + 1])}")
        node = node[part]
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        raise KeyPathError(f"{prefix}{format_loc(path)} in the results is {describe(node)}, not a number")
    return node
