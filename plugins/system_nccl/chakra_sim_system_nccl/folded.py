"""Folded runs of the `nccl` layer: when a collective is ready, and how a message is matched,
when only one representative per class of equivalent ranks issues nodes.

The classes come from `RunInputs.folding` (a `chakra_core.contract.folding.Folding`, found in
the traces or handed over by whoever built the job). A collective a representative issues on
group G stands for one on every group equivalent to G. Each member m of G has a representative
p, which uses the group corresponding to G (`Folding.groups_of`: equivalent ranks list their
groups in the same order); the collective is ready once, for every member, p has issued its
k-th collective on its corresponding group, where this is the k-th on G. That is the instant
the last member issues it in the unfolded run.

A message a representative sends to its peer at offset d stands for one from every rank of its
class to the rank at offset d (or, to a peer folded into its own class, at the same position in
its ring: `Folding.rings`); it is matched with the receive of the destination's representative,
as in the built-in layer. The timing must be the same for every pair and group
a representative stands for: each of them must sit on its nodes the same way (node count, GPUs
per node, a message within or across nodes). If not, the run starts over unfolded.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Protocol

from chakra_core import Folding, Unfold

Members = tuple[int, ...]
Fact = tuple[int, Members, int]
"""(representative, a group it uses, k): it has issued its k-th collective there."""


class Waiting(Protocol):
    """A collective being matched (the layer's `_Pending`)."""

    members: Members
    needs: set[Fact] | None


class FoldedMatching:
    """Readiness of collectives and matching of messages in a folded run (see the module docstring)."""

    def __init__(self, folding: Folding, num_ranks: int, placement: Callable[[Members], Hashable],
                 same_node: Callable[[int, int], bool], restart: Callable[[str, object], None],
                 ready: Callable[[Any], None]):
        """`placement(members)`: how a group sits on its nodes (equal for groups timed alike);
        `ready(coll)` starts a collective once every member's representative has issued it."""
        self.folding = folding
        self.num_ranks = num_ranks
        self.placement, self.same_node = placement, same_node
        self.restart, self.ready = restart, ready
        self.facts: set[Fact] = set()
        self.awaiting: dict[Fact, list[Waiting]] = {}
        self.issued: dict[tuple[int, Members], int] = {}   # (rank, group) -> collectives issued
        self._needed: dict[int, tuple[Members, tuple[tuple[int, Members], ...] | None]] = {}
        self._checked: set[tuple[Any, ...]] = set()
        self._weights: dict[int, tuple[Members, tuple[Members, ...]]] = {}

    def issue(self, rank: int, coll: Waiting) -> None:
        """`rank` (a representative) issued collective `coll`."""
        members = coll.members
        key = (rank, members)
        seq = self.issued.get(key, 0)
        self.issued[key] = seq + 1
        if not self._alike(rank, members):
            return
        if coll.needs is None:    # its first member to issue it: what it waits for
            counterparts = self._counterparts(members)
            if counterparts is None:
                return
            coll.needs = {(p, group, seq) for p, group in counterparts} - self.facts
            for fact in coll.needs:
                self.awaiting.setdefault(fact, []).append(coll)
        fact = (rank, members, seq)
        self.facts.add(fact)
        for waiting in self.awaiting.pop(fact, ()):
            assert waiting.needs is not None   # set before it waits
            waiting.needs.discard(fact)
            if not waiting.needs:
                self.ready(waiting)

    def _counterparts(self, members: Members) -> tuple[tuple[int, Members], ...] | None:
        """(representative, its group corresponding to `members`) for every member, once each."""
        hit = self._needed.get(id(members))
        if hit is not None and hit[0] is members:
            return hit[1]
        representative = self.folding.representative
        # by identity first: hashing a group of 32,768 ranks once per member would cost more than
        # the run; then by value (equal groups may be distinct tuples)
        found: dict[tuple[int, int], tuple[int, Members]] = {}
        for member in members:
            rep = representative[member]
            group = self._corresponding(members, member, rep)
            found.setdefault((rep, id(group)), (rep, group))
        distinct = tuple(dict.fromkeys(found.values()))
        result = None if any(group is None for _, group in distinct) else distinct
        if result is None:
            reason = (f"the folding does not say which group of a representative corresponds to group "
                      f"{list(members)[:8]}; simulating every rank")
            self.restart(reason, Unfold(reason))
        self._needed[id(members)] = (members, result)   # None: restarting
        return result

    def _corresponding(self, group: Members, rank: int, other: int) -> Any:
        """The group `other` (equivalent to `rank`) uses where `rank` uses `group`; None if unknown."""
        if rank == other or len(group) == self.num_ranks:   # the world corresponds to itself
            return group
        try:
            # groups_of lists equivalent ranks' groups in the same order: an index maps either way
            return self.folding.corresponding(group, rank, other)
        except (ValueError, IndexError):
            return None

    def weight(self, members: Members) -> int:
        """How many groups a collective on `members` stands for."""
        return len(self.groups(members))

    def groups(self, members: Members) -> tuple[Members, ...]:
        """The groups a collective on `members` stands for, `members` first: the distinct groups
        that its first representative's class mates use in its place."""
        hit = self._weights.get(id(members))
        if hit is None or hit[0] is not members:
            representative = self.folding.representative
            rep = next(m for m in members if representative[m] == m)   # a representative issued it
            found = {id(members): members}    # by identity, then by value (as in _counterparts)
            for mate in self.folding.members[rep]:
                group = self._corresponding(members, rep, mate)
                found.setdefault(id(group), group)
            hit = self._weights[id(members)] = (members, tuple(dict.fromkeys(found.values())))
        return hit[1]

    def _alike(self, rank: int, members: Members) -> bool:
        """Every group `rank`'s class mates use where it uses `members` sits on its nodes alike."""
        key = (rank, id(members))
        if key in self._checked:
            return True
        self._checked.add(key)
        placement = self.placement(members)
        for mate in self.folding.members[rank]:
            group = self._corresponding(members, rank, mate)
            if group is None or self.placement(group) != placement:
                reason = (f"group {list(members)[:8]} and the groups it stands for sit differently on "
                          "their nodes; simulating every rank")
                self.restart(reason, Unfold(reason))
                return False
        return True

    def fold_p2p(self, src: int, dst: int, size: int) -> tuple[int, int]:
        """The (src, dst) a message from representative `src` to `dst` is matched as: the
        destination's representative receives it from the rank at the same offset from it, or the
        same position in its ring (Folding.matched_source)."""
        folding = self.folding
        key = ("p2p", src, dst)
        if key not in self._checked:
            self._checked.add(key)
            local = self.same_node(src, dst)
            if any(self.same_node(mate, peer) != local for mate, peer in folding.pairs(src, dst)):
                reason = ("point-to-point messages a representative stands for go within and across "
                          "nodes; simulating every rank")
                self.restart(reason, Unfold(reason))
        return folding.matched_source(src, dst), folding.representative[dst]
