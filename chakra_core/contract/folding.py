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
    rings: list[tuple[int, ...]] = field(default_factory=list)
    """rank -> the group (members in ring order) within which its point-to-point messages go round
    when their peers are folded into its own class, as ring attention's exchanges go round a CP
    group and wrap at its end; empty (every rank, or the list): a peer is at a fixed rank offset."""
    _pairs: dict[tuple[int, int], tuple[tuple[int, int], ...]] = field(default_factory=dict, init=False, repr=False,
                                                                       compare=False)
    _sources: dict[tuple[int, int], int] = field(default_factory=dict, init=False, repr=False, compare=False)
    _aliases: dict[int, tuple[Any, Any]] = field(default_factory=dict, init=False, repr=False, compare=False)
    """id(group) -> (group, the equal tuple `groups_of` holds): layers ask about a group for each
    of its members and class mates, and comparing a group of 32,768 ranks element by element
    each time costs more than the run; the tuple `groups_of` shares is found by identity."""

    @classmethod
    def of(cls, representative: list[int], groups_of: list[tuple[tuple[int, ...], ...]],
           rings: list[tuple[int, ...]] | None = None) -> "Folding":
        folding = cls(representative, groups_of, rings=rings or [])
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

    def pairs(self, src: int, dst: int) -> tuple[tuple[int, int], ...]:
        """Every (class mate, the rank it sends to) that representative `src`'s message to `dst`
        stands for: the mate's peer at the same position from it in its ring when `dst` is in
        `src`'s ring, else at the same rank offset (asked for each message: kept)."""
        found = self._pairs.get((src, dst))
        if found is None:
            found = self._pairs[src, dst] = tuple((mate, self._moved(src, dst, mate, 1)) for mate in self.members[src])
        return found

    def matched_source(self, src: int, dst: int) -> int:
        """The rank whose message `dst`'s representative receives where `src` (a representative)
        sends to `dst`: the one whose message src's stands for, as `pairs` finds peers, backwards."""
        found = self._sources.get((src, dst))
        if found is None:
            found = self._sources[src, dst] = self._moved(src, dst, self.representative[dst], -1)
        return found

    def _moved(self, src: int, dst: int, rank: int, way: int) -> int:
        """The rank `way` (1 or -1) times src's step to dst away from `rank`: by position in
        `rank`'s ring when dst is in src's ring, else by rank offset."""
        ring = self.rings[src] if self.rings else ()
        if dst not in ring:
            return (rank + way * (dst - src)) % len(self.representative)
        own = self.rings[rank]
        return own[(own.index(rank) + way * (ring.index(dst) - ring.index(src))) % len(own)]

    @property
    def representatives(self) -> list[int]:
        return sorted(self.members)

    def weight(self, rep: int) -> int:
        """How many ranks representative `rep` stands for."""
        return len(self.members[rep])

    def describe(self) -> str:
        return (f"folded {len(self.representative):,} ranks into {len(self.members):,} class(es) of "
                "equivalent ranks")
