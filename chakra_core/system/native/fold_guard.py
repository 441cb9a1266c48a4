"""Folded runs: when collectives are ready, and whether folding holds (the classes of
equivalent ranks are found by chakra_core.engine.folding).

Only one rank per class of equivalent ranks issues its nodes. A collective
then stands for one per equivalent group: it is ready once, for every class
among its members, that class's representative has issued its k-th
collective on its own group of the same shape; each member starts when its
representative did. `FoldGuard` checks what folding assumes: equivalent
groups see the same delays, and a point-to-point message takes as long for
every pair it stands for (that every member of a class finishes at the same
time, the solver checks). If not, the run starts over unfolded.
"""

from __future__ import annotations

from typing import Any, Callable

from chakra_core.comm.groups import group_shape
from chakra_core.contract.folding import Folding
from chakra_core.contract.inputs import LayerContext, Unfold
from chakra_core.contract.network import ContentionFreeNetwork
from chakra_core.system.native.planner import Collective, CollectivePlanner, FoldFact

_UNFOLD_DELAYS = "equivalent ranks' groups see different network delays; simulating every rank"
_UNFOLD_P2P = ("point-to-point messages between equivalent ranks take different times; "
               "simulating every rank")


class FoldGuard:
    """Readiness of folded collectives, and the checks folding needs (see the module docstring)."""

    def __init__(self, folding: Folding, planner: CollectivePlanner, network: ContentionFreeNetwork,
                 context: LayerContext, solve: Callable[[Collective], None]):
        """`solve(coll)` times a collective once every member's representative has issued it."""
        self.folding = folding
        self.planner = planner
        self.network = network
        self.context = context
        self.solve = solve
        self.facts: dict[FoldFact, int] = {}              # fact -> when its representative issued it
        self.awaiting: dict[FoldFact, list[Collective]] = {}
        self._symmetric: dict[tuple[Any, ...], bool] = {}   # what has been checked already
        self._shapes: dict[int, tuple[tuple[int, ...], tuple[Any, ...] | None]] = {}

    def issue(self, rank: int, coll: Collective, seq: int) -> None:
        """`rank` (a representative) issued its seq-th collective on coll's group."""
        folding = self.folding
        members = coll.members
        unsupported = [spec.algorithm.name for chunk in coll.plans for spec in chunk
                       if not (coll.solve and spec.algorithm.rotation_symmetric)]
        if unsupported:
            reason = (f"{coll.describe()} runs with '{unsupported[0]}', whose timing depends on where "
                      "each rank sits; simulating every rank")
            self.context.request_restart(reason, Unfold(reason))
            return
        if not coll.needs and not coll.issued_at:     # first issue on this group: what it waits for
            shape = self._shape(members)
            for member in members:
                fact = (folding.representative[member], shape or group_shape(members, member), seq)
                known = self.facts.get(fact)
                if known is None:
                    coll.needs.setdefault(fact, []).append(member)
                else:
                    coll.issued_at[member] = known
            for fact in coll.needs:
                self.awaiting.setdefault(fact, []).append(coll)
        if not self._check_symmetric(rank, coll):
            return
        fact = (rank, self._shape(members) or group_shape(members, rank), seq)
        now = self.facts[fact] = self.context.scheduler.now
        for waiting in self.awaiting.pop(fact, ()):
            for member in waiting.needs.pop(fact):
                waiting.issued_at[member] = now
            if not waiting.needs:
                self.context.comm_released(waiting.nodes.items())
                self.solve(waiting)

    def _shape(self, members: tuple[int, ...]) -> tuple[Any, ...] | None:
        """The group's shape when it is a ring (the same from every member), else None."""
        hit = self._shapes.get(id(members))
        if hit is None or hit[0] is not members:
            shape = group_shape(members, members[0])
            hit = self._shapes[id(members)] = (members, shape if shape[0] == "ring" else None)
        return hit[1]

    def _check_symmetric(self, rank: int, coll: Collective) -> bool:
        """Folding assumes every group equivalent to coll's has the same delays between the
        members its algorithms pair, seen from the member that stands where `rank` stands."""
        members = coll.members
        for chunk in coll.plans:
            for spec in chunk:
                key = (id(members), rank, spec.algorithm, spec.comm_type, spec.size, spec.dim)
                if key in self._symmetric:
                    continue
                self._symmetric[key] = True
                for run_members in self.planner.runs(coll, spec):
                    offsets = {(b - a) % len(run_members)
                               for a, b in self.planner.pair_positions(coll, spec, len(run_members))}
                    if not self._runs_alike(coll, rank, run_members, offsets, spec.size):
                        self.context.request_restart(_UNFOLD_DELAYS, Unfold(_UNFOLD_DELAYS))
                        return False
        return True

    def _runs_alike(self, coll: Collective, rank: int, run_members: tuple[int, ...],
                    offsets: set[int], size: int) -> bool:
        """The runs that `run_members` stands for (where rank's class mates sit in their own
        groups) must each pair members at every offset with one and the same delay."""
        folding, delay = self.folding, self.network.message_delay
        mates = folding.members[rank]
        if coll.members == self.planner.world:      # every mate's slice of the world
            runs = {run for run in self.planner.runs_of_members(coll, run_members)
                    if any(m in run for m in mates)}
        else:                                       # the same positions in each mate's group
            positions = [coll.members.index(m) for m in run_members]
            # class mates share group tuples (Folding.corresponding): tell them apart by identity,
            # not by hashing a group of thousands of ranks once per mate
            groups = {id(g): g for g in (folding.corresponding(coll.members, rank, mate) for mate in mates)}
            runs = {tuple(group[i] for i in positions) for group in groups.values()}
        profile = None
        for run in runs:
            n = len(run)
            here = {}
            for d in offsets:
                values = {delay(run[i], run[(i + d) % n], size) for i in range(n)}
                if len(values) != 1:
                    return False
                here[d] = values.pop()
            if profile is None:
                profile = here
            elif here != profile:
                return False
        return True

    def fold_p2p(self, src: int, dst: int, size: int) -> tuple[int, int]:
        """A message `src` (a representative) sends to `dst` stands for one from every rank of
        src's class to its peer at the same offset (or ring position: Folding.pairs): it reaches
        dst's representative, from the rank that stands in the same place, after the delay every
        such pair must share."""
        folding = self.folding
        key = ("p2p", src, dst, size)
        if key not in self._symmetric:
            self._symmetric[key] = True
            delay = self.network.message_delay
            expected = delay(src, dst, size)
            for mate, peer in folding.pairs(src, dst):
                if delay(mate, peer, size) != expected:
                    self.context.request_restart(_UNFOLD_P2P, Unfold(_UNFOLD_P2P))
                    break
        return folding.matched_source(src, dst), folding.representative[dst]
