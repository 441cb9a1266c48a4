"""Communicator groups: which ranks take part in a collective.

A collective node names its group with the `pg_name` attribute. Groups come
from (in order of precedence) the manifest / ASTRA-sim communicator-group JSON
(`{"<id>": [ranks...]}`) and METADATA nodes of converted PyTorch traces that
define process groups. A node without `pg_name`, or with `pg_name` "" or "0",
runs among all ranks, as in ASTRA-sim.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from chakra_core.errors import SimulationError
from chakra_core.et.attrs import NodeView

WORLD = ""
"""The group name of a collective among all ranks (as are "0" and no `pg_name`)."""


class GroupRegistry:
    """Group name -> sorted tuple of ranks."""

    def __init__(self, num_ranks: int, groups: Mapping[str, Sequence[int]] | None = None):
        self.num_ranks = num_ranks
        self.world = tuple(range(num_ranks))
        self._groups: dict[str, tuple[int, ...]] = {}
        self._sources: dict[str, str] = {}
        for name, ranks in (groups or {}).items():
            self.define(str(name), ranks, "the communicator-group file")

    def define(self, name: str, ranks: Iterable[int | str] | None, source: str) -> None:
        members = tuple(sorted(int(r) for r in ranks)) if ranks else self.world
        bad = [r for r in members if not 0 <= r < self.num_ranks]
        if bad:
            raise SimulationError(f"communicator group '{name}' ({source}) names rank(s) "
                                  f"{bad} but the run has ranks 0..{self.num_ranks - 1}")
        if len(set(members)) != len(members):
            raise SimulationError(f"communicator group '{name}' ({source}) lists a rank twice")
        known = self._groups.get(name)
        if known is not None and known != members:
            raise SimulationError(
                f"communicator group '{name}' is defined twice with different ranks: "
                f"{list(known)} ({self._sources[name]}) and {list(members)} ({source})")
        if known is None:    # a group defined again keeps its first tuple: layers cache by identity
            self._groups[name] = members
        self._sources.setdefault(name, source)

    def defined(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Every group defined so far: name -> (ranks, where it was first defined)."""
        return {name: (members, self._sources[name]) for name, members in self._groups.items()}

    def members(self, name: str, node: NodeView, rank: int) -> tuple[int, ...]:
        if name in (WORLD, "0") and name not in self._groups:
            return self.world
        members = self._groups.get(name)
        if members is None:
            raise SimulationError(
                f"rank {rank}, node {node.id} ({node.name!r}): communicator group '{name}' is not "
                "defined (give a comm-group JSON, or a METADATA node defining it)")
        if rank not in members:
            raise SimulationError(
                f"rank {rank}, node {node.id} ({node.name!r}): rank {rank} is not a member of "
                f"communicator group '{name}' {list(members)}")
        return members

    def define_from_metadata(self, rank: int, node: NodeView) -> int:
        """Read process groups from a METADATA node (PyTorch `pg_config` format); return how many.

        The node's `inputs.values` holds a JSON list of {"pg_name", "ranks", ...}
        (possibly wrapped in brackets and quotes, as the PyTorch converter writes it).
        """
        text = node.pb.inputs.values.strip()
        if "pg_name" not in text:
            return 0
        parsed = parse_pg_list(text)
        if parsed is None:
            raise SimulationError(f"rank {rank}, METADATA node {node.id}: cannot parse the process "
                                  f"groups in inputs.values: {text[:120]!r}")
        for entry in parsed:
            self.define(entry.name, entry.ranks, f"METADATA node {node.id} of rank {rank}")
        return len(parsed)


@dataclass(frozen=True)
class ProcessGroupEntry:
    """One process group a METADATA node defines: its name and ranks (none: every rank)."""

    name: str
    ranks: tuple[int, ...]


def _entries(value: object) -> list[ProcessGroupEntry] | None:
    """Parsed JSON as process groups: a list of {"pg_name", "ranks" (ints or digit strings), ...}."""
    if not isinstance(value, list):
        return None
    entries = []
    for item in value:
        if not isinstance(item, dict) or "pg_name" not in item:
            return None
        ranks = item.get("ranks") or []
        if not isinstance(ranks, list) or not all(
                (isinstance(r, int) and not isinstance(r, bool)) or (isinstance(r, str) and r.isdigit())
                for r in ranks):
            return None
        entries.append(ProcessGroupEntry(str(item["pg_name"]), tuple(int(r) for r in ranks)))
    return entries


def parse_pg_list(text: str) -> list[ProcessGroupEntry] | None:
    """The process groups a METADATA node's `inputs.values` lists (PyTorch `pg_config`), or None."""
    candidates = [text]
    # The converter stores "[['<json>']]"-like strings; peel wrappers until JSON parses.
    stripped = text
    for _ in range(4):
        stripped = stripped.strip()
        if stripped[:1] in "[" and stripped[-1:] == "]":
            stripped = stripped[1:-1]
        stripped = stripped.strip().strip("'\"")
        candidates.append(stripped)
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except (ValueError, TypeError):
            continue
        if isinstance(value, dict):
            value = list(value.values()) if all(isinstance(v, dict) for v in value.values()) else [value]
        entries = _entries(value)
        if entries is not None:
            return entries
    return None


def group_shape(members: tuple[int, ...], rank: int) -> tuple[Any, ...]:
    """How a group looks from one of its ranks, independent of where the rank sits in a ring."""
    n = len(members)
    if n > 1:
        stride = members[1] - members[0]
        if stride > 0 and all(members[i] - members[i - 1] == stride for i in range(2, n)):
            return ("ring", n, stride)
    return ("set",) + tuple(m - rank for m in members)
