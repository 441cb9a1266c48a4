"""Collective algorithms as step schedules.

An algorithm describes one run of a collective among `n` members (a
communicator group, or its slice along one network dimension) as a sequence
of synchronous steps. In step k, every member sends `step_bytes[k]` to each
peer in `send_to(pos, k)` and waits for the messages of the members that send
to it; when they have arrived (and, if `reduces[k]`, been reduced locally), it
moves to step k+1. The executors in `chakra_core.system.executor` time a
schedule either in closed form (contention-free networks) or message by
message through the network backend.

Adding an algorithm is adding one class here or in a plugin, registered with
``registry.add_algorithm(cls)`` in a ``chakra_sim_register_system`` hook; the
system JSON then names it (``all-reduce-implementation: [myalgo]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, ClassVar

from chakra_core.schema import pb

ALL_REDUCE = pb.ALL_REDUCE
ALL_GATHER = pb.ALL_GATHER
REDUCE_SCATTER = pb.REDUCE_SCATTER
ALL_TO_ALL = pb.ALL_TO_ALL


def collective_name(comm_type: int) -> str:
    try:
        return pb.CollectiveCommType.Name(comm_type)
    except ValueError:
        return f"UNKNOWN({comm_type})"


@dataclass(frozen=True)
class StepSchedule:
    """The timing-relevant shape of one algorithm run among `n` members."""

    n: int
    step_bytes: tuple[int, ...]
    reduces: tuple[bool, ...]
    send_to: Callable[[int, int], tuple[int, ...]]
    uniform: bool = False
    """Every member sends to exactly one peer at the same offset in every step (a ring):
    lets the closed-form executor take its O(steps) fast path."""

    @property
    def steps(self) -> int:
        return len(self.step_bytes)

    @cached_property
    def bytes_sent_per_member(self) -> int:
        """Bytes member 0 injects over the whole run (the same for every member of a symmetric algorithm)."""
        if self.uniform:
            return sum(self.step_bytes)
        return sum(b * len(self.send_to(0, k)) for k, b in enumerate(self.step_bytes))


class CollectiveAlgorithm:
    """Base class of collective algorithms (see module docstring)."""

    name: ClassVar[str]
    supports: ClassVar[frozenset[int]]

    def schedule(self, comm_type: int, chunk_bytes: int, n: int) -> StepSchedule:
        raise NotImplementedError


def _next_in_ring(pos: int, step: int, n: int) -> tuple[int, ...]:
    return ((pos + 1) % n,)


class Ring(CollectiveAlgorithm):
    """Ring algorithms, with ASTRA-sim's step counts and message sizes.

    With n members and a chunk of B bytes (ASTRA-sim's `comm_size` semantics):
    all-reduce 2(n-1) steps of B/n (the first n-1 reduce); reduce-scatter n-1
    steps of B/n, all reducing; all-gather n-1 steps of B (B is each member's
    input); all-to-all n(n-1)/2 steps of B/n over ring neighbours.
    """

    name = "ring"
    supports = frozenset({ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL})

    def schedule(self, comm_type: int, chunk_bytes: int, n: int) -> StepSchedule:
        if comm_type == ALL_REDUCE:
            steps, size = 2 * (n - 1), chunk_bytes // n
            reduces = tuple(k < n - 1 for k in range(steps))
        elif comm_type == REDUCE_SCATTER:
            steps, size = n - 1, chunk_bytes // n
            reduces = (True,) * steps
        elif comm_type == ALL_GATHER:
            steps, size = n - 1, chunk_bytes
            reduces = (False,) * steps
        elif comm_type == ALL_TO_ALL:
            steps, size = n * (n - 1) // 2, chunk_bytes // n
            reduces = (False,) * steps
        else:
            raise ValueError(f"ring does not implement {collective_name(comm_type)}")
        return StepSchedule(n, (size,) * steps, reduces,
                            lambda pos, step: _next_in_ring(pos, step, n), uniform=True)


BUILTIN_ALGORITHMS: tuple[type[CollectiveAlgorithm], ...] = (Ring,)
