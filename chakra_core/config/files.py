"""Reading configuration files (manifests, sweep files, ASTRA-sim's JSON and YAML) into mappings.

Every problem is a `ManifestError` naming the file (and line, or key path). Stricter than the
YAML and JSON specifications allow, because a configuration that means something other than
what its author sees must not run: a key given twice (YAML and JSON keep the last silently),
NaN or infinity, numbers beyond 64-bit integers (ASTRA-sim cannot read them), nesting deeper
than `limits.CONFIG_DEPTH`, and YAML aliases that expand beyond `limits.CONFIG_NODES` values
(an alias bomb: a few lines that expand to billions of values).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from chakra_core.errors import InputFileError, ManifestError
from chakra_core.input_files import read_input_text
from chakra_core.json_types import JsonObject, JsonValue
from chakra_core.limits import CONFIG_DEPTH, CONFIG_NODES

_INT64 = 1 << 63


def _line_of(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return f" (line {mark.line + 1}, column {mark.column + 1})"
    lineno = getattr(exc, "lineno", None)
    return f" (line {lineno})" if lineno else ""


def yaml_error_text(exc: yaml.YAMLError) -> str:
    """What went wrong and where: PyYAML's problem at its mark, then the construct it was in
    ("while parsing a flow sequence") at the line that construct starts, which is often the
    line to fix (an unclosed bracket is found where the next token is)."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return str(exc).splitlines()[0]
    text = (exc.problem or exc.context or "syntax error") + _line_of(exc)
    if exc.problem and exc.context:
        mark = exc.context_mark
        text += f"; {exc.context.strip()}" + (f" started at line {mark.line + 1}, column {mark.column + 1}"
                                               if mark is not None else "")
    return text


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader refusing a key given twice in one mapping (merge keys `<<` may be overridden,
    as YAML intends)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:       # an unhashable key: SafeLoader reports it
                continue
            if first is not None:
                raise _DuplicateKey(key, first, key_node.start_mark.line + 1)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first_line: int, line: int):
        self.key, self.first_line, self.line = key, first_line, line


def _yaml_shape(text: str, where: str) -> None:
    """Depth and size after alias expansion, from the event stream (no recursion, no
    expansion): a ManifestError before the composer recurses or an alias bomb expands."""
    max_depth, max_nodes = CONFIG_DEPTH.value(), CONFIG_NODES.value()
    anchors: dict[str, int] = {}
    stack: list[list[Any]] = [[0, None]]      # [values so far, anchor] per open collection
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        line = event.start_mark.line + 1 if event.start_mark is not None else 0
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            stack.append([1, event.anchor])
            if len(stack) - 1 > max_depth:
                raise ManifestError([(f"{where}: line {line}", f"nested more than {max_depth} levels deep; "
                                                               f"{CONFIG_DEPTH.hint()}")])
            continue
        if isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            size, anchor = stack.pop()
        elif isinstance(event, yaml.ScalarEvent):
            size, anchor = 1, event.anchor
        elif isinstance(event, yaml.AliasEvent):
            size, anchor = anchors.get(event.anchor or "", 1), None
        else:
            continue
        if anchor is not None:
            anchors[anchor] = size
        stack[-1][0] += size
        if stack[-1][0] > max_nodes or size > max_nodes:
            raise ManifestError([(f"{where}: line {line}", f"expands to more than {max_nodes:,} values "
                                                           f"(YAML aliases?); {CONFIG_NODES.hint()}")])


def load_yaml(text: str, where: str) -> Any:
    """YAML `text` (from `where`) with the checks of the module docstring but the value checks."""
    _yaml_shape(text, where)
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506  # a SafeLoader subclass
    except _DuplicateKey as dup:
        raise ManifestError([(f"{where}: line {dup.line}", f"key {dup.key!r} is given twice (first on line "
                                                           f"{dup.first_line}); keep one")]) from None


def _load_json(text: str, where: str) -> Any:
    def pairs(items: list[tuple[str, JsonValue]]) -> JsonObject:
        out: JsonObject = {}
        for key, value in items:
            if key in out:
                raise ManifestError([(where, f"key {key!r} is given twice in one object; keep one")])
            out[key] = value
        return out

    def constant(name: str) -> Any:
        raise ManifestError([(where, f"{name} is not a number a configuration may hold")])

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except RecursionError:
        raise ManifestError([(where, f"nested more than {CONFIG_DEPTH.value()} levels deep; "
                                     f"{CONFIG_DEPTH.hint()}")]) from None


def check_values(data: Any, where: str) -> None:
    """A ManifestError naming the key path of the first value nested too deep, a float that is
    not finite, or an integer beyond 64 bits (iterative: no recursion limit to hit)."""
    max_depth = CONFIG_DEPTH.value()
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, key_path, depth = stack.pop()
        location = f"{where}: {key_path or '(top level)'}"
        if depth > max_depth:
            raise ManifestError([(location, f"nested more than {max_depth} levels deep; {CONFIG_DEPTH.hint()}")])
        if isinstance(value, dict):
            stack.extend((v, f"{key_path}.{k}" if key_path else str(k), depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{key_path}[{i}]", depth + 1) for i, v in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise ManifestError([(location, f"{value} is not a finite number")])
        elif isinstance(value, float) and abs(value) >= _INT64:   # no setting needs it; times overflow
            raise ManifestError([(location, f"{value} is beyond the range of a 64-bit integer")])
        elif isinstance(value, int) and not isinstance(value, bool) and not -_INT64 <= value < _INT64:
            raise ManifestError([(location, f"{value} does not fit a 64-bit integer")])


def read_config_file(path: Path) -> JsonObject:
    """A JSON or YAML mapping from `path`, or a ManifestError naming the file and the problem."""
    try:
        text = read_input_text(path, "configuration file")
    except InputFileError as exc:
        raise ManifestError([(exc.path, exc.reason)]) from None
    is_json = path.suffix.lower() == ".json"
    try:
        data = _load_json(text, str(path)) if is_json else load_yaml(text, str(path))
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        reason = exc.msg + _line_of(exc) if isinstance(exc, json.JSONDecodeError) else yaml_error_text(exc)
        raise ManifestError([(str(path), f"not valid {'JSON' if is_json else 'YAML'}: {reason}")]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ManifestError([(str(path), f"expected a mapping of keys, found {type(data).__name__}")])
    check_values(data, str(path))
    return data
