"""Collective algorithms: what one phase of a collective does among its members.

A phase is one algorithm run among `n` members (a network dimension's slice
of the group, the whole group, or all NPUs for the `one*` variants). An
algorithm class says which collective types it implements, how much data a
member holds after the phase (`final_size`), and builds the members' state
machines (`members`). An algorithm whose members all do the same symmetric,
synchronous steps may also return a `StepSchedule`, which the closed-form
executor times in O(steps) on contention-free networks.

The built-in algorithms reproduce ASTRA-sim's (names as in its system JSON):
`ring`, `direct` (optionally `direct<window>`), `halvingDoubling`,
`doubleBinaryTree`, and the `oneRing`/`oneDirect`/`oneHalvingDoubling`
variants that treat all NPUs as one dimension. `chain` and `star` time the
rooted collectives ASTRA-sim does not run.

Adding an algorithm is adding one class (a `chakra_core.CollectiveAlgorithm`)
registered with ``registry.add_algorithm(cls)`` from a
``chakra_sim_register_system`` hook.
"""

from __future__ import annotations

import re
from typing import ClassVar, Mapping

from chakra_core.comm.collectives import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER, ROOTED,
                                          SYMMETRIC, collective_name)
from chakra_core.contract.algorithm import CollectiveAlgorithm, PhaseContext, StepSchedule
from chakra_core.schema import pb
from chakra_core.system.native.machines import DirectMember, HalvingDoublingMember, RingMember
from chakra_core.system.native.rooted_machines import RootedMember
from chakra_core.system.native.tree_machines import DoubleBinaryTreeMember, binary_tree


def _to_next(step: int) -> tuple[int, ...]:
    """A ring's offsets: every member sends to the next."""
    return (1,)


class Ring(CollectiveAlgorithm):
    """Ring: all-reduce 2(n-1) steps of B/n (the first n-1 reduce); reduce-scatter n-1 steps of B/n;
    all-gather n-1 steps of B (each member's input); all-to-all n(n-1)/2 steps of B/n."""

    name = "ring"
    supports = SYMMETRIC
    rotation_symmetric = True

    def step_schedule(self, comm_type: int, size: int, n: int) -> StepSchedule:
        if comm_type == ALL_REDUCE:
            steps, msg = 2 * (n - 1), size // n
            reduces = tuple(k < n - 1 for k in range(steps))
        elif comm_type == REDUCE_SCATTER:
            steps, msg = n - 1, size // n
            reduces = (True,) * steps
        elif comm_type == ALL_GATHER:
            steps, msg = n - 1, size
            reduces = (False,) * steps
        elif comm_type == ALL_TO_ALL:
            steps, msg = n * (n - 1) // 2, size // n
            reduces = (False,) * steps
        else:
            raise ValueError(f"ring does not implement {collective_name(comm_type)}")
        return StepSchedule(n, (msg,) * steps, reduces, lambda pos, step: ((pos + 1) % n,), uniform=True,
                            offsets=_to_next)

    def members(self, ctx: PhaseContext, comm_type: int, size: int, variant: int = 0,
                root: int = 0) -> list[RingMember]:
        return [RingMember(ctx, pos, comm_type, size) for pos in range(ctx.n)]


class OneRing(Ring):
    """Ring over all NPUs as a single dimension (ASTRA-sim's oneRing)."""

    name = "oneRing"
    flat = True


class Direct(CollectiveAlgorithm):
    """Direct: each member exchanges with every other member, `window` messages at a time
    (default n-1). All-reduce = a direct reduce-scatter, then a direct all-gather."""

    name = "direct"
    supports = SYMMETRIC
    parameter = "window"
    rotation_symmetric = True

    def flow_schedule(self, comm_type: int, size: int, n: int) -> StepSchedule | None:
        """With every peer in the window: each member sends to all others at once (all-reduce: a
        reduce-scatter step, then an all-gather step), the messages' sizes as the members send."""
        if self.value is not None and self.value < n - 1:
            return None
        step_bytes: tuple[int, ...]
        reduces: tuple[bool, ...]
        if comm_type == ALL_REDUCE:
            step_bytes, reduces = (size // n, size // n), (True, False)
        elif comm_type == REDUCE_SCATTER:
            step_bytes, reduces = (size // n,), (True,)
        elif comm_type == ALL_GATHER:
            step_bytes, reduces = (size,), (False,)
        elif comm_type == ALL_TO_ALL:
            step_bytes, reduces = (size // n,), (False,)
        else:
            return None
        others = tuple(range(1, n))
        return StepSchedule(n, step_bytes, reduces, lambda pos, step: tuple((pos + o) % n for o in others),
                            offsets=lambda step: others, exact=len(step_bytes) == 1)

    def members(self, ctx: PhaseContext, comm_type: int, size: int, variant: int = 0,
                root: int = 0) -> list[DirectMember]:
        window = -1 if self.value is None else self.value
        return [DirectMember(ctx, pos, comm_type, size, window) for pos in range(ctx.n)]


class OneDirect(Direct):
    name = "oneDirect"
    flat = True


class HalvingDoubling(CollectiveAlgorithm):
    """Recursive halving (reduce-scatter) and doubling (all-gather), log2(n) steps each;
    needs a power-of-two number of members. ASTRA-sim rejects it for all-to-all."""

    name = "halvingDoubling"
    supports = frozenset({ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER})
    powers_of_two = True

    def members(self, ctx: PhaseContext, comm_type: int, size: int, variant: int = 0,
                root: int = 0) -> list[HalvingDoublingMember]:
        return [HalvingDoublingMember(ctx, pos, comm_type, size) for pos in range(ctx.n)]


class OneHalvingDoubling(HalvingDoubling):
    name = "oneHalvingDoubling"
    flat = True


class DoubleBinaryTree(CollectiveAlgorithm):
    """Double binary tree all-reduce (chunks alternate between the two trees); needs a power-of-two
    number of members. Like ASTRA-sim, it times every collective type as an all-reduce."""

    name = "doubleBinaryTree"
    supports = SYMMETRIC
    powers_of_two = True

    def final_size(self, comm_type: int, size: int, n: int) -> int:
        return size

    def members(self, ctx: PhaseContext, comm_type: int, size: int, variant: int = 0,
                root: int = 0) -> list[DoubleBinaryTreeMember]:
        tree = binary_tree(ctx.n, root_max=variant % 2 == 0)
        return [DoubleBinaryTreeMember(ctx, pos, size, *tree[pos]) for pos in range(ctx.n)]


class Chain(CollectiveAlgorithm):
    """Rooted collectives along the ring from/to the root (pipelined by chunks)."""

    name = "chain"
    supports = ROOTED
    causal = False
    star: ClassVar[bool] = False

    def members(self, ctx: PhaseContext, comm_type: int, size: int, variant: int = 0,
                root: int = 0) -> list[RootedMember]:
        return [RootedMember(ctx, pos, comm_type, size, root, star=self.star) for pos in range(ctx.n)]

    def only_sends(self, comm_type: int, pos: int, root: int, n: int) -> bool:
        if comm_type in (pb.BROADCAST, pb.SCATTER):
            return pos == root
        if self.star:
            return pos != root
        return (pos - root) % n == n - 1     # the far end of the chain towards the root


class Star(Chain):
    """Rooted collectives with direct messages between the root and every member."""

    name = "star"
    star = True


BUILTIN_ALGORITHMS: tuple[type[CollectiveAlgorithm], ...] = (
    Ring, OneRing, Direct, OneDirect, HalvingDoubling, OneHalvingDoubling, DoubleBinaryTree, Chain, Star)

_PARAMETERISED = re.compile(r"^(?P<base>.*?)(?P<value>\d+)$")


def resolve_algorithm(name: str, available: Mapping[str, type[CollectiveAlgorithm]]) -> CollectiveAlgorithm | None:
    """An algorithm instance for a configured name (`ring`, `direct`, `direct8`), or None."""
    cls = available.get(name)
    if cls is not None:
        return cls()
    match = _PARAMETERISED.match(name)
    if match:
        cls = available.get(match.group("base"))
        if cls is not None and cls.parameter:
            return cls(int(match.group("value")))
    return None
