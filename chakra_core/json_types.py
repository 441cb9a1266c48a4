"""JSON as types, for data that is JSON by nature: a table row, a document written as it is
built, a value a user's key path points at. mypy checks what goes in (no sets, no objects) and
makes readers narrow what comes out, where `dict[str, Any]` would check nothing."""

from __future__ import annotations

from typing import Mapping, Sequence, Union

JsonValue = Union[None, bool, int, float, str, Sequence["JsonValue"], Mapping[str, "JsonValue"]]
"""Covariant (Sequence, Mapping), so a list of rows or a dict of numbers is one as it is."""
JsonObject = dict[str, JsonValue]
