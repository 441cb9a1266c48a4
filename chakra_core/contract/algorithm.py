"""The collective algorithm interface of the built-in system layer.

A phase of a collective is one algorithm run among `n` members (a network
dimension's slice of the group, the whole group, or all NPUs for the `one*`
variants). An algorithm class says which collective types it implements, how
much data a member holds after the phase (`final_size`), and how the phase
runs: either as a `StepSchedule` (symmetric, synchronous steps, which the
system layer times in closed form on contention-free networks and with its
generic step members elsewhere), or as member state machines (`members`) that
talk to the world through a `PhaseIO`.

A plugin adds an algorithm with ``registry.add_algorithm(MyAlgorithm)`` from
its ``chakra_sim_register_system`` hook; users select it by name in the system
section (``all-reduce-implementation: [my_algorithm]``). The built-in ones are
in ``chakra_core.system.native.algorithms``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, ClassVar, Protocol, Sequence

from chakra_core.schema import pb


class PhaseIO(Protocol):
    """What a member state machine may do. `pos` is a member's position in the phase."""

    @property
    def now(self) -> int:
        """Current simulated time in ns."""

    def send(self, src: int, dst: int, size: int, delivered: Callable[[Any], None] | None = None) -> None:
        """Send `size` bytes from position `src` to `dst`; call `delivered(None)` (if given) once
        they have arrived."""

    def recv(self, dst: int, src: int, callback: Callable[[Any], None], arg: Any) -> None:
        """Post a receive at `dst` for the next message from `src`; call `callback(arg)` when it
        completes (at once, in a fresh event, if the message already arrived)."""

    def after(self, delay: int, callback: Callable[[Any], None], arg: Any = None) -> None:
        """Call `callback(arg)` `delay` ns from now."""

    def finish(self, pos: int) -> None:
        """The member at `pos` has finished its part of the phase."""


class PhaseMember(Protocol):
    """One member's state machine; `start()` is called when the member starts the phase."""

    def start(self) -> None: ...


@dataclass
class PhaseContext:
    """What all members of one phase share."""

    io: PhaseIO
    n: int
    endpoint_delay: int
    """ns a member spends on every message step at its endpoint."""
    reduce_delay: Callable[[int], int]
    """ns to reduce a received message of the given size."""
    local: bool = False
    """A communicator group's own ring (ASTRA-sim's "local" dimension), not a network dimension."""


@dataclass(frozen=True)
class StepSchedule:
    """A symmetric synchronous algorithm: per step, bytes sent, peers, and whether it reduces."""

    n: int
    step_bytes: tuple[int, ...]
    reduces: tuple[bool, ...]
    send_to: Callable[[int, int], tuple[int, ...]]
    """(position, step) -> the positions it sends that step's message to."""
    uniform: bool = False
    """Every member sends to exactly one peer at the same offset in every step (a ring):
    lets the closed-form executor take its O(steps) fast path."""
    offsets: Callable[[int], tuple[int, ...]] | None = None
    """Optional, for rotation-symmetric steps: step -> the offsets o for which the member at
    position i sends to position (i + o) % n (send_to must agree). Lets a flow-level network
    time a whole step as one set of flows (`FlowNetwork.transfer_flows`)."""
    exact: bool = True
    """The steps time the members as they run, message for message. False: an approximation a
    flow-level network may take (direct all-reduce: its members start the all-gather as each
    piece is processed, the steps when all have arrived); a network that must match messages
    to the ns (`FlowNetwork.flow_exact`) does not."""

    @property
    def steps(self) -> int:
        return len(self.step_bytes)

    @cached_property
    def bytes_sent_per_member(self) -> int:
        """Bytes member 0 injects over the whole run (the same for every member)."""
        if self.uniform:
            return sum(self.step_bytes)
        if self.offsets is not None:
            return sum(b * len(self.offsets(k)) for k, b in enumerate(self.step_bytes))
        return sum(b * len(self.send_to(0, k)) for k, b in enumerate(self.step_bytes))

    @cached_property
    def bytes_received_per_position(self) -> tuple[int, ...]:
        """Bytes each member receives over the whole run, by position."""
        if self.uniform:
            return (sum(self.step_bytes),) * self.n
        if self.offsets is not None:   # every position receives from the same offsets
            return (self.bytes_sent_per_member,) * self.n
        received = [0] * self.n
        for k, b in enumerate(self.step_bytes):
            for i in range(self.n):
                for j in self.send_to(i, k):
                    received[j] += b
        return tuple(received)


class CollectiveAlgorithm:
    """Base class of collective algorithms (see the module docstring)."""

    name: ClassVar[str]
    """What users write in the system section (`ring`, `direct`)."""
    supports: ClassVar[frozenset[int]]
    """The collective types (`pb.CollectiveCommType` values) it implements."""
    flat: ClassVar[bool] = False
    """True for `one*` variants: one phase over all NPUs instead of one per dimension."""
    parameter: ClassVar[str | None] = None
    """Name of an optional integer parameter appended to the name (`direct8`: window 8)."""
    powers_of_two: ClassVar[bool] = False
    """True when it needs a power-of-two number of members."""
    rotation_symmetric: ClassVar[bool] = False
    """Turning the ring of members turns the timing with it: a member's part does not depend on
    its position (ring, direct). Needed to fold equivalent ranks."""
    causal: ClassVar[bool] = True
    """Every member's finish depends on every member's start (true of the symmetric collectives).
    Lets a contention-free run be solved when its last member starts; rooted collectives, where a
    root may finish before others start, run event by event instead."""

    def __init__(self, value: int | None = None):
        self.value = value

    def final_size(self, comm_type: int, size: int, n: int) -> int:
        """Bytes each member holds after the phase (ASTRA-sim's `final_data_size`)."""
        if comm_type == pb.ALL_GATHER:
            return size * n
        if comm_type == pb.REDUCE_SCATTER:
            return size // n
        return size

    def step_schedule(self, comm_type: int, size: int, n: int) -> StepSchedule | None:
        """The phase as symmetric synchronous steps, or None if it is not one."""
        return None

    def flow_schedule(self, comm_type: int, size: int, n: int) -> StepSchedule | None:
        """The phase as steps of flows for a flow-level network (`FlowNetwork`): a schedule with
        `offsets`, or None to run it as on any other network. Default: `step_schedule` when it
        has offsets. An algorithm whose members send several messages at once (direct) may give
        one here that it does not give as `step_schedule`, whose closed form times messages one
        at a time."""
        schedule = self.step_schedule(comm_type, size, n)
        return schedule if schedule is not None and schedule.offsets is not None else None

    def members(self, ctx: PhaseContext, comm_type: int, size: int, variant: int = 0,
                root: int = 0) -> Sequence[PhaseMember] | None:
        """Member state machines, one per position; None (the default) runs `step_schedule` with
        the system layer's generic step members."""
        return None

    def only_sends(self, comm_type: int, pos: int, root: int, n: int) -> bool:
        """True if the member at `pos` only sends (it never waits for a peer's data), e.g. the
        root of a broadcast. Such a member does not count as waiting for peers that have not
        joined yet; every member of a symmetric collective does."""
        return False
