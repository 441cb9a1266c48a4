"""Values derived from a node's attributes alone, computed once per distinct set of attributes.

A training step repeats each kernel's attributes for every micro-batch and layer: a compute
model's timing of a node, or the step part it counts under, is the same for all of them. Keyed
by `NodeView.attrs_key` (the attributes' wire form), a hit reads no attribute at all.
"""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

from chakra_core.et.attrs import NodeView

V = TypeVar("V")

KEPT = 1 << 16
"""Distinct attribute sets kept: a trace whose nodes all differ (a converted trace with an id
in every node's attributes) must not grow the cache with the trace; past this it starts over."""

_ABSENT = object()


class AttributeCache(Generic[V]):
    """`derive(node)` for each distinct attribute set (see the module docstring)."""

    def __init__(self, derive: Callable[[NodeView], V], kept: int = KEPT) -> None:
        self._derive = derive
        self._kept = kept
        self._values: dict[bytes, V] = {}

    def __call__(self, node: NodeView) -> V:
        key = node.attrs_key()
        value = self._values.get(key, _ABSENT)
        if value is _ABSENT:
            if len(self._values) >= self._kept:
                self._values.clear()
            value = self._values[key] = self._derive(node)
        return value  # type: ignore[return-value]  # not _ABSENT: derived above

    def __len__(self) -> int:
        return len(self._values)
