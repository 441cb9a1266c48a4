"""Planning a collective: its chunks, each chunk's phases, and the runs a phase splits into.

A collective's bytes are split into `preferred-dataset-splits` chunks. Each
chunk runs as a sequence of phases, one per network dimension it spans
(ASTRA-sim's decomposition):

- all-reduce with `collective-optimization: localBWAware`: reduce-scatter on
  dimensions 0..D-2, all-reduce on the last, all-gather back down; with
  `baseline`: an all-reduce on every dimension in turn;
- reduce-scatter and all-to-all: dimensions 0..D-1; all-gather: D-1..0;
- `one*` algorithms and communicator groups other than all ranks: one phase
  over all members; rooted collectives (broadcast, reduce, gather, scatter):
  one phase over the group with the `chain` or `star` algorithm.

A phase on dimension d is a set of independent runs, one per slice of NPUs
differing only in their d-th coordinate. `CollectivePlanner` also builds a
run's member state machines, and the endpoint and reduction delays they
spend, for the chunk queues and the solver, which run them.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Callable, Final, Iterator, Mapping, Sequence

from chakra_core.comm.collectives import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, ROOTED, collective_name
from chakra_core.comm.matcher import OpenCollective
from chakra_core.contract.algorithm import CollectiveAlgorithm, PhaseContext, PhaseIO, PhaseMember, StepSchedule
from chakra_core.errors import SimulationError
from chakra_core.et.attrs import NodeView
from chakra_core.schema import pb
from chakra_core.system.native.config import IMPL_FIELD, RUNS_AS, NativeSystemConfig
from chakra_core.system.native.machines import StepMember
from chakra_core.system.native.runner import IsolatedPhase, NetworkPhase

FAST_ENDPOINT_DELAY = 10
"""ASTRA-sim's fixed memory-bus delay on a communicator group's own ring ("local" dimension)."""

FoldFact = tuple[int, tuple[Any, ...], int]
"""Folded runs: (representative, its group's shape, seq), a representative's seq-th collective on
a group of that shape (see fold_guard.py)."""


class Collective(OpenCollective):
    """One collective operation, shared by the ranks of its group."""

    __slots__ = ("remaining", "plans", "priority", "runs", "order", "cursor", "begun",
                 "solve", "issued_at", "claim", "flows", "needs")

    def __init__(self, group: str, seq: int, comm_type: int, size: int, members: tuple[int, ...],
                 first_rank: int, root: int):
        super().__init__(group, seq, comm_type, size, members, first_rank, root)
        self.remaining: dict[int, int] = {}                # rank -> chunks not finished
        self.priority: dict[int, int] = {}                 # rank -> scheduling priority
        self.plans: list[list[PhaseSpec]] = []             # per chunk, its phases
        self.runs: dict[tuple[int, int, int], PhaseRun] = {}   # (chunk, phase index, first member) -> run
        self.order: dict[int, list[tuple[int, int]]] = {}  # queue -> (phase index, chunk) start order
        self.cursor: dict[tuple[int, int], int] = {}       # (rank, queue) -> position in that order
        # (rank, queue) -> (phase index, chunk) keys started out of order
        self.begun: dict[tuple[int, int], set[tuple[int, int]]] = {}
        self.solve = False                                 # solved whole once all have issued (solver.py)
        self.issued_at: dict[int, int] = {}                # rank -> issue time, when `solve`
        self.claim: object | None = None                   # the network's token for its links
        self.flows = False                                 # claimed as flows (FlowNetwork)
        self.needs: dict[FoldFact, list[int]] = {}         # folded: fact -> members it starts

    def set_plans(self, plans: list[list[PhaseSpec]]) -> None:
        """Fix the phases, and the order every rank starts them in on each dimension."""
        self.plans = plans
        for chunk in plans:
            for spec in chunk:
                self.order.setdefault(spec.queue, []).append((spec.index, spec.chunk))
        for keys in self.order.values():
            keys.sort()

    def may_start(self, rank: int, spec: PhaseSpec) -> bool:
        """A rank starts a collective's phases on a dimension in one fixed order (deadlock-free)."""
        return self.order[spec.queue][self.cursor.get((rank, spec.queue), 0)] == (spec.index, spec.chunk)

    def started(self, rank: int, spec: PhaseSpec) -> None:
        key = (rank, spec.queue)
        order, position = self.order[spec.queue], self.cursor.get(key, 0)
        if order[position] == (spec.index, spec.chunk):
            position += 1
            begun = self.begun.get(key)
            while begun and position < len(order) and order[position] in begun:
                begun.discard(order[position])
                position += 1
            self.cursor[key] = position
        else:  # only the deadlock breaker starts phases out of order
            self.begun.setdefault(key, set()).add((spec.index, spec.chunk))


class PhaseSpec:
    """One phase of one chunk: which dimension, what it does, with which algorithm."""

    __slots__ = ("chunk", "index", "queue", "comm_type", "size", "algorithm", "dim", "variant", "local")

    def __init__(self, chunk: int, index: int, queue: int, comm_type: int, size: int,
                 algorithm: CollectiveAlgorithm, dim: int | None, variant: int = 0, local: bool = False):
        self.chunk, self.index, self.queue = chunk, index, queue
        self.comm_type, self.size, self.algorithm = comm_type, size, algorithm
        self.dim, self.variant, self.local = dim, variant, local


class PhaseRun:
    """One run of a phase among its members (one slice of the group)."""

    __slots__ = ("collective", "spec", "members", "position", "starts", "io", "machines", "done")

    def __init__(self, collective: Collective, spec: PhaseSpec, members: tuple[int, ...]):
        self.collective, self.spec, self.members = collective, spec, members
        self.position = {rank: pos for pos, rank in enumerate(members)}
        self.starts: dict[int, int] = {}
        self.io: NetworkPhase | None = None
        self.machines: list[PhaseMember] | None = None
        self.done = 0


class _Unset(Enum):
    """A cache miss, where None is a cached value."""

    UNSET = 0


_UNSET: Final = _Unset.UNSET


def check_size(coll: Collective, spec: PhaseSpec, members: tuple[int, ...]) -> None:
    """Refuse a run whose algorithm needs a power-of-two number of members it does not have."""
    if spec.algorithm.powers_of_two and len(members) & (len(members) - 1):
        raise SimulationError(f"{coll.describe()}: algorithm '{spec.algorithm.name}' needs a "
                              f"power-of-two number of members, not {len(members)}")


class CollectivePlanner:
    """The phases, runs, algorithms and step schedules of collectives, with their caches."""

    def __init__(self, algorithms: Mapping[int, Sequence[CollectiveAlgorithm]], dim_sizes: list[int],
                 world: tuple[int, ...], splits: int, local_bw_aware: bool, endpoint_delay: int,
                 mem_bw: float):
        """`algorithms`: per collective type, the configured algorithm of each dimension;
        `world`: the group of all ranks; `mem_bw`: local memory bandwidth in bytes/ns."""
        self.algorithms = algorithms
        self.dim_sizes = dim_sizes
        self.strides: list[int] = []
        stride = 1
        for size in dim_sizes:
            self.strides.append(stride)
            stride *= size
        self.world = world
        self.num_ranks = len(world)
        self.splits = splits
        self.local_bw_aware = local_bw_aware
        self.network_endpoint_delay = endpoint_delay
        self.mem_bw = mem_bw
        self.tree_counters: dict[tuple[int, int], int] = {}   # (type, logical dim) -> next phase's variant
        self._reduce_cache: dict[int, int] = {}
        self._slices: dict[tuple[int, int], tuple[int, ...]] = {}
        self._runs_cache: dict[tuple[int, int | None], tuple[tuple[int, ...], list[tuple[int, ...]]]] = {}
        self._schedules: dict[tuple[CollectiveAlgorithm, int, int, int], StepSchedule | None] = {}
        self._flow_schedules: dict[tuple[CollectiveAlgorithm, int, int, int], StepSchedule | None] = {}
        self._pair_cache: dict[tuple[CollectiveAlgorithm, int, int, int, int, bool],
                               frozenset[tuple[int, int]]] = {}

    def algorithm(self, comm_type: int, dim: int) -> CollectiveAlgorithm:
        """The algorithm configured for `comm_type` on dimension `dim` (the last one listed, past
        the end of the list)."""
        chosen = self.algorithms[comm_type]
        index = min(dim, len(chosen) - 1)
        algorithm = chosen[index]
        if comm_type not in algorithm.supports:
            alias = NativeSystemConfig.model_fields[IMPL_FIELD[comm_type]].alias
            raise SimulationError(f"system.{alias}[{index}]: algorithm '{algorithm.name}' does not "
                                  f"implement {collective_name(comm_type)} (ASTRA-sim rejects it too)")
        return algorithm

    def plan(self, coll: Collective, node: NodeView) -> list[list[PhaseSpec]]:
        """The phases of every chunk (see the module docstring)."""
        n = len(coll.members)
        comm_type = RUNS_AS.get(coll.comm_type, coll.comm_type)
        if n < 2 or (coll.size == 0 and coll.comm_type != pb.BARRIER):
            return []
        splits = min(self.splits, max(coll.size, 1))
        base, extra = divmod(coll.size, splits)
        chunk_sizes = [base + (1 if i < extra else 0) for i in range(splits)]
        world = coll.members == self.world
        plans = []
        for chunk, chunk_bytes in enumerate(chunk_sizes):
            if comm_type in ROOTED or not world:
                algorithm = self.algorithm(comm_type, 0)
                plans.append([PhaseSpec(chunk, 0, 0, comm_type, chunk_bytes, algorithm, None,
                                        local=not world)])
            else:
                plans.append(self._plan_world_chunk(chunk, comm_type, chunk_bytes, node))
        return plans

    def _plan_world_chunk(self, chunk: int, comm_type: int, size: int, node: NodeView) -> list[PhaseSpec]:
        # Logical dimensions: the network's, up to the first one* algorithm, which spans all NPUs.
        dims: list[tuple[int | None, CollectiveAlgorithm]] = []
        for d in range(len(self.dim_sizes)):
            algorithm = self.algorithm(comm_type, d)
            if algorithm.flat:
                dims.append((None, algorithm))
                break
            dims.append((d, algorithm))
        involved = node.bool_list("involved_dim") or []

        def active(index: int) -> bool:
            dim = dims[index][0]
            n = self.num_ranks if dim is None else self.dim_sizes[dim]
            return n > 1 and (index >= len(involved) or involved[index])

        order = list(range(len(dims)))
        if comm_type == ALL_GATHER:
            order.reverse()
        steps: list[tuple[int, int]] = []   # (logical dimension, phase collective type)
        if comm_type != ALL_REDUCE or not self.local_bw_aware:
            steps = [(i, comm_type) for i in order if active(i)]
        else:
            live = [i for i in order if active(i)]
            if live:
                last = live[-1]
                steps = [(i, REDUCE_SCATTER) for i in live[:-1]]
                steps += [(last, ALL_REDUCE)]
                steps += [(i, ALL_GATHER) for i in reversed(live[:-1])]
        specs = []
        remain = size
        for index, (logical, phase_type) in enumerate(steps):
            dim, algorithm = dims[logical]
            n = self.num_ranks if dim is None else self.dim_sizes[dim]
            queue = 0 if dim is None else dim
            counter_key = (comm_type, logical)
            variant = self.tree_counters.get(counter_key, 0)
            self.tree_counters[counter_key] = variant + 1
            specs.append(PhaseSpec(chunk, index, queue, phase_type, remain, algorithm, dim, variant))
            remain = algorithm.final_size(phase_type, remain, n)
        return specs

    def slice(self, coll: Collective, spec: PhaseSpec, rank: int) -> tuple[int, ...]:
        """The members of the run of `spec` that `rank` belongs to, in ring order."""
        dim = spec.dim
        if dim is None:
            return coll.members
        stride, size = self.strides[dim], self.dim_sizes[dim]
        base = rank - ((rank // stride) % size) * stride
        members = self._slices.get((dim, base))
        if members is None:
            members = self._slices[(dim, base)] = tuple(base + i * stride for i in range(size))
        return members

    def runs(self, coll: Collective, spec: PhaseSpec) -> list[tuple[int, ...]]:
        """The runs (slices) a phase of `coll` splits into, each in ring order."""
        key = (id(coll.members), spec.dim)
        cached = self._runs_cache.get(key)
        if cached is None or cached[0] is not coll.members:
            runs: dict[tuple[int, ...], None] = {}
            for rank in coll.members:
                runs.setdefault(self.slice(coll, spec, rank))
            for run_members in runs:
                check_size(coll, spec, run_members)
            cached = self._runs_cache[key] = (coll.members, list(runs))
        elif spec.algorithm.powers_of_two:
            for run_members in cached[1]:
                check_size(coll, spec, run_members)
        return cached[1]

    def runs_of_members(self, coll: Collective, run_members: tuple[int, ...]) -> list[tuple[int, ...]]:
        """All the runs of the phase `run_members` is one run of (the slices of its dimension)."""
        for chunk in coll.plans:
            for spec in chunk:
                runs = self.runs(coll, spec)
                if run_members in runs:
                    return runs
        return [run_members]

    def phase_runs(self, coll: Collective) -> Iterator[tuple[PhaseSpec, tuple[int, ...]]]:
        """Each distinct phase of the collective (chunks repeat them) with each of its runs."""
        seen = set()
        for chunk in coll.plans:
            for spec in chunk:
                key = (spec.index, spec.variant)
                if key not in seen:
                    seen.add(key)
                    for run_members in self.runs(coll, spec):
                        yield spec, run_members

    def pairs(self, coll: Collective) -> set[tuple[int, int]]:
        """Every (sender, receiver) pair the collective's phases will use."""
        pairs: set[tuple[int, int]] = set()
        for spec, run_members in self.phase_runs(coll):
            for a, b in self.pair_positions(coll, spec, len(run_members)):
                pairs.add((run_members[a], run_members[b]))
        return pairs

    def pair_positions(self, coll: Collective, spec: PhaseSpec, n: int) -> frozenset[tuple[int, int]]:
        """(sender, receiver) positions of a phase's messages among its n members."""
        key = (spec.algorithm, spec.comm_type, spec.size, n, spec.variant, spec.local)
        pairs = self._pair_cache.get(key)
        if pairs is None:
            schedule = self.schedule(spec, n)
            if schedule is not None:
                steps = 1 if schedule.uniform else schedule.steps
                pairs = frozenset((i, j) for k in range(steps) for i in range(n)
                                  for j in schedule.send_to(i, k))
            else:   # run the members alone once and note who sends to whom
                io = IsolatedPhase(tuple(range(n)), lambda src, dst, size: 1, record_pairs=True)
                machines = self.phase_machines(coll, spec, io.ranks, io)
                io.run([0] * n, lambda pos: machines[pos].start())
                io.release()
                assert io.pairs is not None   # record_pairs
                pairs = frozenset(io.pairs)
            self._pair_cache[key] = pairs
        return pairs

    def flow_runs(self, coll: Collective,
                  exact: bool = False) -> list[tuple[tuple[int, ...], tuple[int, ...]]] | None:
        """Every run of the collective's phases as (members, the offsets its flows use), or None
        when a phase has no flow schedule (see `CollectiveAlgorithm.flow_schedule`), or, if
        `exact`, one that only approximates its members (`StepSchedule.exact`)."""
        found: dict[tuple[tuple[int, ...], tuple[int, ...]], None] = {}
        for spec, run_members in self.phase_runs(coll):
            schedule = self.flow_schedule(spec, len(run_members))
            if schedule is None or schedule.offsets is None or (exact and not schedule.exact):
                return None
            offsets = sorted({o for k in range(schedule.steps) for o in schedule.offsets(k)})
            found[(run_members, tuple(offsets))] = None
        return list(found)

    def flow_schedule(self, spec: PhaseSpec, n: int) -> StepSchedule | None:
        """The phase's steps of flows among n members (see `CollectiveAlgorithm.flow_schedule`)."""
        return self._memo(self._flow_schedules, spec, n, spec.algorithm.flow_schedule)

    def schedule(self, spec: PhaseSpec, n: int) -> StepSchedule | None:
        """The phase's step schedule among n members (None: it runs as member state machines)."""
        return self._memo(self._schedules, spec, n, spec.algorithm.step_schedule)

    @staticmethod
    def _memo(cache: dict[tuple[CollectiveAlgorithm, int, int, int], StepSchedule | None], spec: PhaseSpec, n: int,
              make: Callable[[int, int, int], StepSchedule | None]) -> StepSchedule | None:
        """`make(comm_type, size, n)` once per algorithm, type, size and member count."""
        key = (spec.algorithm, spec.comm_type, spec.size, n)
        schedule = cache.get(key, _UNSET)
        if schedule is _UNSET:
            schedule = cache[key] = make(spec.comm_type, spec.size, n)
        return schedule

    def phase_machines(self, coll: Collective, spec: PhaseSpec, members: Sequence[int],
                       io: PhaseIO) -> list[PhaseMember]:
        """The member state machines of a run of `spec` among `members`, talking through `io`."""
        ctx = PhaseContext(io, len(members), self.endpoint_delay(spec), self.reduce_delay,
                           local=spec.local)
        root = members.index(coll.root) if coll.root in members else 0
        machines = spec.algorithm.members(ctx, spec.comm_type, spec.size, spec.variant, root)
        if machines is not None:
            return list(machines)
        schedule = spec.algorithm.step_schedule(spec.comm_type, spec.size, ctx.n)
        if schedule is None:
            raise SimulationError(f"algorithm '{spec.algorithm.name}' defines neither members() nor "
                                  "step_schedule()")
        return [StepMember(ctx, pos, schedule) for pos in range(ctx.n)]

    def endpoint_delay(self, spec: PhaseSpec) -> int:
        """ns a member of a phase spends at its endpoint on every message step."""
        return FAST_ENDPOINT_DELAY if spec.local else self.network_endpoint_delay

    def reduce_delay(self, size: int) -> int:
        """ns to reduce a received message of `size` bytes."""
        value = self._reduce_cache.get(size)
        if value is None:
            value = self._reduce_cache[size] = 3 * int(size / self.mem_bw)
        return value
