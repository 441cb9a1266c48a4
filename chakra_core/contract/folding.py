"""Classes of equivalent ranks, as a folded run hands them to its layers.

When every layer is `fold_safe` and ranks are equivalent (the same trace up to rank ids, in
equivalent places; see docs/performance.md), the engine simulates one representative per class
and gives the others its results. Layers see the classes through `RunInputs.folding`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Folding:
    """Classes of equivalent ranks."""

    representative: list[int]
    """rank -> the representative of its class."""
    groups_of: list[tuple[tuple[int, ...], ...]] = field(default_factory=list)
    """rank -> the communicator groups its trace uses (members, sorted), ordered by shape, so
    that equivalent ranks' corresponding groups sit at the same index."""
    members: dict[int, list[int]] = field(default_factory=dict)
    """representative -> every rank of its class, in order."""
    _aliases: dict[int, tuple[Any, Any]] = field(default_factory=dict, init=False, repr=False, compare=False)
    """id(group) -> (group, the equal tuple `groups_of` holds): layers ask about a group for each
    of its members and class mates, and comparing a group of 32,768 ranks element by element
    each time costs more than the run; the tuple `groups_of` shares is found by identity."""

    @classmethod
    def of(cls, representative: list[int], groups_of: list[tuple[tuple[int, ...], ...]]) -> "Folding":
        folding = cls(representative, groups_of)
        for rank, rep in enumerate(representative):
            folding.members.setdefault(rep, []).append(rank)
        return folding

    def corresponding(self, group: tuple[int, ...], rep: int, rank: int) -> tuple[int, ...]:
        """The group `rank` uses where its representative `rep` uses `group`."""
        return self.groups_of[rank][self._position(group, rep)]

    def _position(self, group: tuple[int, ...], rank: int) -> int:
        """`self.groups_of[rank].index(group)`, without comparing every member when `groups_of`
        shares one tuple per group (a ValueError if the rank does not use it)."""
        own = self.groups_of[rank]
        alias = self._aliases.get(id(group))
        if alias is not None and alias[0] is group:
            try:
                return own.index(alias[1])   # equal to group: the same answer, found by identity
            except ValueError:
                pass
        position = own.index(group)
        self._aliases[id(group)] = (group, own[position])
        return position

    @property
    def representatives(self) -> list[int]:
        return sorted(self.members)

    def weight(self, rep: int) -> int:
        """How many ranks representative `rep` stands for."""
        return len(self.members[rep])

    def describe(self) -> str:
        return (f"folded {len(self.representative):,} ranks into {len(self.members):,} class(es) of "
                "equivalent ranks")
