"""The built-in system layer (`plugin: native`): collectives, chunking, scheduling, p2p.

A collective node becomes one `Collective` shared by its group's ranks: the
k-th collective a rank issues in a group matches the k-th of every other
member (type and size must agree). Its bytes are split into
`preferred-dataset-splits` chunks. Each chunk runs as a sequence of phases,
one per network dimension it spans (ASTRA-sim's decomposition):

- all-reduce with `collective-optimization: localBWAware`: reduce-scatter on
  dimensions 0..D-2, all-reduce on the last, all-gather back down; with
  `baseline`: an all-reduce on every dimension in turn;
- reduce-scatter and all-to-all: dimensions 0..D-1; all-gather: D-1..0;
- `one*` algorithms and communicator groups other than all ranks: one phase
  over all members; rooted collectives (broadcast, reduce, gather, scatter):
  one phase over the group with the `chain` or `star` algorithm.

A phase on dimension d is a set of independent runs, one per slice of NPUs
differing only in their d-th coordinate. Every rank has, per dimension, a
queue of waiting phases and at most `active-chunks-per-dimension` running;
waiting phases are ordered by collective priority (`scheduling-policy` LIFO:
newest collective first; FIFO: oldest first), then by arrival.

Timing of a run (see executor.py, runner.py): on a contention-free network
it is solved when its last member starts it, in closed form (ring) or by
simulating it in isolation; otherwise it runs message by message through
the network backend.

Whole collectives in one step: when a rank can have only one collective in
flight (`resources.comm: 1`, ASTRA-sim's default) on a contention-free
network, nothing but the collective itself touches its ranks' chunk queues,
so the queue schedule is a recurrence over its phases, solved once its last
member has issued it (`_solve`): a phase starts on a rank when its previous
phase there has finished, the phase before it in the queue's fixed order has
started, and fewer than `active-chunks-per-dimension` of the earlier ones are
still running; each run then finishes as its closed form says. This gives
exactly the event-by-event schedule without its events (the two are checked
against each other by property tests). Rooted collectives, whose root may
finish before the others start, always run event by event.

Folded runs (chakra_core.fold): only one rank per class of equivalent ranks
issues its nodes. A collective then stands for one per equivalent group: it
is ready once, for every class among its members, that class's
representative has issued its k-th collective on its own group of the same
shape; each member starts when its representative did. The layer checks
what folding assumes: equivalent groups see the same delays, every member of
a class finishes at the same time, and a point-to-point message takes as long
for every pair it stands for; if not, the run starts over unfolded.

The same holds on a network with shared links (`closed_form` networks, such
as the congestion backend in fifo mode) for a collective whose links carry
nothing else: with one chunk in flight per dimension, each link then carries
one sender's messages in the order it sends them. The collective claims its
links when first issued (`NetworkModel.claim`); if the network cannot promise
them, the collective runs message by message instead.

If ranks' queues ever wait on each other in a cycle (ASTRA-sim deadlocks
there: astra-sim issue 370), the ranks holding back a run that others have
started join it beyond their active-chunk limit, and a warning says so.
"""

from __future__ import annotations

from heapq import heappush, heapreplace
from typing import Callable, Literal, Sequence

from pydantic import Field, PositiveFloat, PositiveInt, NonNegativeInt

from chakra_core.comm.collectives import collective_wait, read_collective
from chakra_core.comm.groups import group_shape
from chakra_core.comm.matcher import OpenCollective
from chakra_core.contract.inputs import LayerContext, Unfold, ValidationInputs
from chakra_core.contract.layers import PluginConfig
from chakra_core.contract.network import ClosedFormNetwork, ContentionFreeNetwork
from chakra_core.errors import SimulationError
from chakra_core.et.attrs import NodeView
from chakra_core.schema import pb
from chakra_core.comm.collectives import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER, ROOTED, collective_name)
from chakra_core.contract.algorithm import CollectiveAlgorithm
from chakra_core.system.native.algorithms import resolve_algorithm
from chakra_core.system.native.executor import (closed_form_finishes, closed_form_transfers, uniform_delays,
                                         uniform_send_times)
from chakra_core.system.native.config import IMPL_FIELD, RUNS_AS, NativeSystemConfig
from chakra_core.contract.algorithm import PhaseContext
from chakra_core.system.native.machines import StepMember
from chakra_core.system.matching import MatchingSystem
from chakra_core.system.native.runner import IsolatedPhase, NetworkPhase

FAST_ENDPOINT_DELAY = 10
"""ASTRA-sim's fixed memory-bus delay on a communicator group's own ring ("local" dimension)."""


class Collective(OpenCollective):
    """One collective operation, shared by the ranks of its group."""

    __slots__ = ("remaining", "plans", "priority", "runs", "order", "cursor", "begun",
                 "solve", "issued_at", "claim", "needs")

    def __init__(self, group: str, seq: int, comm_type: int, size: int, members: tuple[int, ...],
                 first_rank: int, root: int):
        super().__init__(group, seq, comm_type, size, members, first_rank, root)
        self.remaining: dict[int, int] = {}                # rank -> chunks not finished
        self.priority: dict[int, int] = {}                 # rank -> scheduling priority
        self.plans: list[list[PhaseSpec]] = []             # per chunk, its phases
        self.runs: dict[tuple, PhaseRun] = {}
        self.order: dict[int, list[tuple[int, int]]] = {}  # queue -> (phase index, chunk) start order
        self.cursor: dict[tuple[int, int], int] = {}       # (rank, queue) -> position in that order
        self.begun: dict[tuple[int, int], set] = {}        # (rank, queue) -> keys started out of order
        self.solve = False                                 # solved whole once all have issued (_solve)
        self.issued_at: dict[int, int] = {}                # rank -> issue time, when `solve`
        self.claim: object | None = None                   # the network's token for its links
        self.needs: dict[tuple, list[int]] = {}            # folded: fact -> members it starts

    def set_plans(self, plans: list[list["PhaseSpec"]]) -> None:
        """Fix the phases, and the order every rank starts them in on each dimension."""
        self.plans = plans
        for chunk in plans:
            for spec in chunk:
                self.order.setdefault(spec.queue, []).append((spec.index, spec.chunk))
        for keys in self.order.values():
            keys.sort()

    def may_start(self, rank: int, spec: "PhaseSpec") -> bool:
        """A rank starts a collective's phases on a dimension in one fixed order (deadlock-free)."""
        return self.order[spec.queue][self.cursor.get((rank, spec.queue), 0)] == (spec.index, spec.chunk)

    def started(self, rank: int, spec: "PhaseSpec") -> None:
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

    def __init__(self, chunk, index, queue, comm_type, size, algorithm, dim, variant=0, local=False):
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
        self.io = None
        self.machines = None
        self.done = 0


_UNSET = object()
_UNFOLD_DELAYS = ("equivalent ranks' groups see different network delays; simulating every rank")
_UNFOLD_FINISH = ("members of one class of equivalent ranks finished a collective at different "
                  "times; simulating every rank")
_UNFOLD_P2P = ("point-to-point messages between equivalent ranks take different times; "
               "simulating every rank")
_COLLECTIVE = object()
"""NodeView.memo key of a collective node's checked (comm_type, comm_size, group)."""


def _check_size(coll: Collective, spec: PhaseSpec, members: tuple[int, ...]) -> None:
    if spec.algorithm.powers_of_two and len(members) & (len(members) - 1):
        raise SimulationError(f"{coll.describe()}: algorithm '{spec.algorithm.name}' needs a "
                              f"power-of-two number of members, not {len(members)}")


class RankQueues:
    """Per-rank, per-dimension queues of waiting runs and counts of running ones."""

    __slots__ = ("active", "waiting", "counter")

    def __init__(self, dims: int):
        self.active = [0] * dims
        self.waiting: list[list[tuple[int, PhaseRun]]] = [[] for _ in range(dims)]
        self.counter = 0


def _queue_start(ready: int, previous: int | None, running: list[int] | None, limit: int) -> int:
    """When a phase starts in a chunk queue (`_solve`): once its chunk is ready, not before the
    phase ahead of it in the queue started, and once fewer than `limit` phases are running
    (`running`: a min-heap of the latest `limit` finishes)."""
    start = ready
    if previous is not None and previous > start:
        start = previous
    if running is not None and len(running) == limit and running[0] > start:
        start = running[0]
    return start


def _queue_finished(latest: dict, queue: object, finish: int, limit: int) -> None:
    """Record a phase finishing in `queue`, keeping its `limit` latest finishes."""
    running = latest.get(queue)
    if running is None:
        latest[queue] = [finish]
    elif len(running) < limit:
        heappush(running, finish)
    elif finish > running[0]:
        heapreplace(running, finish)


class NativeSystem(MatchingSystem):
    collectives_start_waiting = True
    name = "native"
    fidelity = ("ASTRA-sim's native collectives (ring, direct, halving-doubling, double binary tree, "
                "one* variants) per network dimension, chunked and pipelined, endpoint and reduction "
                "delays, LIFO/FIFO scheduling, communicator groups, eager/rendezvous p2p")
    Config = NativeSystemConfig

    def __init__(self, config: NativeSystemConfig, context: LayerContext):
        super().__init__(config, context)
        network = context.network
        if network is None:
            raise SimulationError("the native system layer needs a network layer")
        self.network = network
        self.scheduler = context.scheduler
        self.num_ranks = context.num_ranks
        self.dim_sizes = [d.npus for d in network.dims]
        product = 1
        for size in self.dim_sizes:
            product *= size
        if not self.dim_sizes or product != network.npus_count:
            raise SimulationError(
                f"network plugin '{network.name}' declares dims {self.dim_sizes} for "
                f"{network.npus_count} NPUs: the native system layer needs at least one dimension, "
                "and the NPUs per dimension must multiply to the NPU count (a flat network is one "
                "dimension of all NPUs)")
        self.strides = []
        stride = 1
        for size in self.dim_sizes:
            self.strides.append(stride)
            stride *= size
        available = context.inputs.algorithms
        problems = self.config_problems(config, ValidationInputs(context.base_dir, available))
        if problems:
            loc, reason = problems[0]
            raise SimulationError(f"system.{'.'.join(map(str, loc))}: {reason}")
        self.algorithms = {t: [resolve_algorithm(name, available) for name in getattr(config, f)]
                           for t, f in IMPL_FIELD.items()}
        self.contention_free = bool(network.contention_free)
        if self.contention_free and not isinstance(network, ContentionFreeNetwork):
            raise SimulationError(f"network plugin '{network.name}' sets contention_free but has no "
                                  "message_delay(src, dst, size)")
        self.reserving = (not self.contention_free and isinstance(network, ClosedFormNetwork)
                          and bool(network.closed_form))
        # One collective in flight per rank: its queues hold nothing else (see module docstring).
        self.solve_whole = ((self.contention_free or
                             (self.reserving and config.active_chunks_per_dimension == 1))
                            and context.inputs.comm_capacity == 1)
        # Folding needs collectives solved whole and eager point-to-point messages (and, checked
        # per collective, algorithms whose timing turns with the ring of members).
        self.fold_safe = self.solve_whole and not config.rendezvous_protocol
        self.endpoint_delay = config.endpoint_delay
        self.mem_bw = config.local_mem_bw  # GB/s == bytes/ns
        self.lifo = config.scheduling_policy == "LIFO"
        self.local_bw_aware = config.collective_optimization == "localBWAware"
        self.active_limit = config.active_chunks_per_dimension
        self.splits = config.preferred_dataset_splits
        self.queues = [RankQueues(len(self.dim_sizes)) for _ in range(context.num_ranks)]
        self.tree_counters: dict[tuple[int, int], int] = {}
        self.oversubscribed = 0
        self.folding = context.inputs.folding
        self.facts: dict[tuple, int] = {}              # folded: (representative, shape, seq) -> issue time
        self.awaiting: dict[tuple, list[Collective]] = {}
        self._symmetric: dict[tuple, bool] = {}
        self._shapes: dict[int, tuple] = {}
        self._setup_matching(context, network, Collective, rendezvous=config.rendezvous_protocol,
                             fold=self._fold_p2p if self.folding is not None else None)
        self._reduce_cache: dict[int, int] = {}
        self._slices: dict[tuple[int, int], tuple[int, ...]] = {}
        self._runs_cache: dict[tuple[int, int | None], tuple[tuple[int, ...], list]] = {}
        self._schedules: dict[tuple, object] = {}
        self._pair_cache: dict[tuple, frozenset] = {}
        self._uniform_delays: dict = {}

    # Configuration -------------------------------------------------------------------------------
    @classmethod
    def config_problems(cls, config: NativeSystemConfig, inputs: ValidationInputs) -> list[tuple[tuple, str]]:
        available = inputs.algorithms
        problems = []
        for comm_type, field_name in IMPL_FIELD.items():
            alias = NativeSystemConfig.model_fields[field_name].alias
            names = getattr(config, field_name)
            if not names:
                problems.append(((alias,), "give at least one algorithm"))
            for index, name in enumerate(names):
                algorithm = resolve_algorithm(name, available)
                if algorithm is None:
                    fitting = sorted(n for n, c in available.items() if comm_type in c.supports)
                    problems.append(((alias, index), f"unknown collective algorithm '{name}'; "
                                     f"available for {collective_name(comm_type)}: "
                                     f"{', '.join(fitting) or 'none'}"))
        # An algorithm listed for a type it does not implement (ASTRA-sim's example files list
        # halvingDoubling for all-to-all) is an error only if such a collective runs: see _algorithm.
        return problems

    def _algorithm(self, comm_type: int, dim: int) -> CollectiveAlgorithm:
        chosen = self.algorithms[comm_type]
        index = min(dim, len(chosen) - 1)
        algorithm = chosen[index]
        if comm_type not in algorithm.supports:
            alias = NativeSystemConfig.model_fields[IMPL_FIELD[comm_type]].alias
            raise SimulationError(f"system.{alias}[{index}]: algorithm '{algorithm.name}' does not "
                                  f"implement {collective_name(comm_type)} (ASTRA-sim rejects it too)")
        return algorithm

    # Issuing a collective ---------------------------------------------------------------------------
    def issue_collective(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        memo = node.memo
        call = memo.get(_COLLECTIVE)
        if call is None:
            call = memo[_COLLECTIVE] = read_collective(rank, node, self.context.warn)
        coll = self.matcher.join(rank, node, call)
        if len(coll.nodes) == 1:   # the first member to issue it: plan it
            coll.set_plans(self._plan(coll, node))
            coll.solve = self.solve_whole and all(spec.algorithm.causal for chunk in coll.plans
                                                  for spec in chunk)
            if coll.solve and self.reserving:
                coll.claim = self.network.claim(self._pairs(coll))
                coll.solve = coll.claim is not None
        seq = coll.seq
        queues = self.queues[rank]
        queues.counter += 1
        node_id = node.pb.id
        coll.priority[rank] = queues.counter if self.lifo else -queues.counter
        coll.done[rank] = done
        coll.remaining[rank] = len(coll.plans)
        self.open[rank][node_id] = coll
        self._note_waiting(rank, node_id, coll)
        if not coll.plans:  # nothing to move: zero bytes, or a group of one
            self._collective_done(rank, coll)
            return
        if self.folding is not None:
            self._issue_folded(rank, coll, seq)
            return
        if coll.solve:
            coll.issued_at[rank] = self.scheduler.now
            if len(coll.issued_at) == len(coll.members):
                self._solve(coll)
            return
        for chunk in coll.plans:
            self._enqueue(rank, coll, chunk[0])

    # Folded runs (see module docstring) -------------------------------------------------------------
    def _issue_folded(self, rank: int, coll: Collective, seq: int) -> None:
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
        now = self.facts[fact] = self.scheduler.now
        for waiting in self.awaiting.pop(fact, ()):
            for member in waiting.needs.pop(fact):
                waiting.issued_at[member] = now
            if not waiting.needs:
                self.context.comm_released(waiting.nodes.items())
                self._solve(waiting)

    def _shape(self, members: tuple[int, ...]) -> tuple | None:
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
                for run_members in self._runs(coll, spec):
                    offsets = {(b - a) % len(run_members)
                               for a, b in self._pair_positions(coll, spec, len(run_members))}
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
        if coll.members == self.groups.world:      # every mate's slice of the world
            runs = {run for run in self._runs_of_members(coll, run_members) if any(m in run for m in mates)}
        else:                                      # the same positions in each mate's group
            positions = [coll.members.index(m) for m in run_members]
            runs = {tuple(group[i] for i in positions)
                    for group in {folding.corresponding(coll.members, rank, mate) for mate in mates}}
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

    def _runs_of_members(self, coll: Collective, run_members: tuple[int, ...]) -> list[tuple[int, ...]]:
        """All the runs of the phase `run_members` is one run of (the slices of its dimension)."""
        for chunk in coll.plans:
            for spec in chunk:
                runs = self._runs(coll, spec)
                if run_members in runs:
                    return runs
        return [run_members]

    def _fold_p2p(self, src: int, dst: int, size: int) -> tuple[int, int]:
        """A message `src` (a representative) sends to `dst` stands for one from every rank of
        src's class to its peer at the same offset: it reaches dst's representative, from the
        rank at that offset from it, after the delay every such pair must share."""
        folding = self.folding
        ranks = len(folding.representative)
        offset = (dst - src) % ranks
        key = ("p2p", src, offset, size)
        if key not in self._symmetric:
            self._symmetric[key] = True
            delay = self.network.message_delay
            expected = delay(src, dst, size)
            for mate in folding.members[src]:
                if delay(mate, (mate + offset) % ranks, size) != expected:
                    self.context.request_restart(_UNFOLD_P2P, Unfold(_UNFOLD_P2P))
                    break
        target = folding.representative[dst]
        return (target - offset) % ranks, target

    def _solve(self, coll: Collective) -> None:
        """Time every phase of every chunk on every member at once (see module docstring)."""
        entries = sorted((spec.index, spec.chunk, spec) for chunk in coll.plans for spec in chunk)
        issued = coll.issued_at
        first = issued[coll.members[0]]
        done_at = None
        network = self.network
        if all(t == first for t in issued.values()):
            if self.reserving:
                network.checkpoint()
            done_at = self._solve_together(coll, entries, first)
            if self.reserving:
                if done_at is None:
                    network.rollback()
                else:
                    network.commit()
        if done_at is None:
            done_at = self._solve_each(coll, entries)
        if coll.claim is not None:
            network.release(coll.claim)
            coll.claim = None
        ranks = coll.members
        if self.folding is not None:     # only the representatives among the members are simulated
            representative = self.folding.representative
            finish: dict[int, int] = {}
            for rank in coll.members:
                if finish.setdefault(representative[rank], done_at[rank]) != done_at[rank]:
                    self.context.request_restart(_UNFOLD_FINISH, Unfold(_UNFOLD_FINISH))
                    return
            ranks = [rank for rank in coll.members if rank in coll.done]
        by_time: dict[int, list[int]] = {}
        for rank in ranks:
            by_time.setdefault(done_at[rank], []).append(rank)
        for time, ranks in sorted(by_time.items()):
            self.scheduler.schedule_at(time, self._solved_done, (coll, ranks))

    def _solve_together(self, coll: Collective, entries: list, issued: int) -> dict[int, int] | None:
        """`_solve` when every member issued at the same time: while every run finishes on all its
        members at once, the members stay in step and one timeline serves them all. None when a
        run does not (a rank then runs ahead); `_solve_each` takes over."""
        limit = self.active_limit
        last_start: dict[int, int] = {}            # per queue
        latest: dict[int, list[int]] = {}          # per queue: the `limit` latest finishes
        ready = [issued] * len(coll.plans)
        sent: dict[int, int] = {}
        received: dict[int, int] = {}
        done = 0
        for _, chunk, spec in entries:
            queue = spec.queue
            start = last_start[queue] = _queue_start(ready[chunk], last_start.get(queue), latest.get(queue), limit)
            finish = None
            for run_members in self._runs(coll, spec):
                finishes, out, into = self._time_phase(coll, spec, run_members, [start] * len(run_members))
                if finish is None:
                    finish = finishes[0]
                if any(f != finish for f in finishes):
                    return None
                for rank, a, b in zip(run_members, out, into):
                    sent[rank] = sent.get(rank, 0) + a
                    received[rank] = received.get(rank, 0) + b
            ready[chunk] = finish
            _queue_finished(latest, queue, finish, limit)
            if spec.index + 1 == len(coll.plans[chunk]) and finish > done:
                done = finish
        for rank, value in sent.items():
            self.bytes_sent[rank] += value
        for rank, value in received.items():
            self.bytes_received[rank] += value
        return dict.fromkeys(coll.members, done)

    def _solve_each(self, coll: Collective, entries: list) -> dict[int, int]:
        """`_solve`, member by member."""
        members = coll.members
        limit = self.active_limit
        # per member and queue: start of the last phase started, and the `limit` latest finishes
        last_start: dict[tuple[int, int], int] = {}
        latest: dict[tuple[int, int], list[int]] = {}
        ready = [dict(coll.issued_at) for _ in coll.plans]        # per chunk: rank -> ready time
        done_at = dict.fromkeys(members, 0)
        for _, chunk, spec in entries:
            queue, chunk_ready = spec.queue, ready[chunk]
            starts: dict[int, int] = {}
            for rank in members:
                key = (rank, queue)
                starts[rank] = last_start[key] = _queue_start(chunk_ready[rank], last_start.get(key),
                                                              latest.get(key), limit)
            final = spec.index + 1 == len(coll.plans[chunk])
            for run_members in self._runs(coll, spec):
                finishes, sent, received = self._time_phase(coll, spec, run_members,
                                                            [starts[r] for r in run_members])
                for rank, finish, out, into in zip(run_members, finishes, sent, received):
                    chunk_ready[rank] = finish
                    self.bytes_sent[rank] += out
                    self.bytes_received[rank] += into
                    _queue_finished(latest, (rank, queue), finish, limit)
                    if final and finish > done_at[rank]:
                        done_at[rank] = finish
        return done_at

    def _pairs(self, coll: Collective) -> set[tuple[int, int]]:
        """Every (sender, receiver) pair the collective's phases will use."""
        pairs: set[tuple[int, int]] = set()
        seen = set()
        for chunk in coll.plans:
            for spec in chunk:
                key = (spec.index, spec.variant)
                if key in seen:
                    continue
                seen.add(key)
                for run_members in self._runs(coll, spec):
                    for a, b in self._pair_positions(coll, spec, len(run_members)):
                        pairs.add((run_members[a], run_members[b]))
        return pairs

    def _pair_positions(self, coll: Collective, spec: PhaseSpec, n: int) -> frozenset[tuple[int, int]]:
        """(sender, receiver) positions of a phase's messages among its n members."""
        key = (spec.algorithm, spec.comm_type, spec.size, n, spec.variant, spec.local)
        pairs = self._pair_cache.get(key)
        if pairs is None:
            schedule = self._schedule(spec, n)
            if schedule is not None:
                steps = 1 if schedule.uniform else schedule.steps
                pairs = frozenset((i, j) for k in range(steps) for i in range(n)
                                  for j in schedule.send_to(i, k))
            else:   # run the members alone once and note who sends to whom
                io = IsolatedPhase(tuple(range(n)), lambda src, dst, size: 1, record_pairs=True)
                machines = self._phase_machines(coll, spec, io.ranks, io)
                io.run([0] * n, lambda pos: machines[pos].start())
                io.release()
                pairs = frozenset(io.pairs)
            self._pair_cache[key] = pairs
        return pairs

    def _schedule(self, spec: PhaseSpec, n: int):
        key = (spec.algorithm, spec.comm_type, spec.size, n)
        schedule = self._schedules.get(key, _UNSET)
        if schedule is _UNSET:
            schedule = self._schedules[key] = spec.algorithm.step_schedule(spec.comm_type, spec.size, n)
        return schedule

    def _runs(self, coll: Collective, spec: PhaseSpec) -> list[tuple[int, ...]]:
        """The runs (slices) a phase of `coll` splits into, each in ring order."""
        key = (id(coll.members), spec.dim)
        cached = self._runs_cache.get(key)
        if cached is None or cached[0] is not coll.members:
            runs: dict[tuple[int, ...], None] = {}
            for rank in coll.members:
                runs.setdefault(self._slice(coll, spec, rank))
            for run_members in runs:
                _check_size(coll, spec, run_members)
            cached = self._runs_cache[key] = (coll.members, list(runs))
        elif spec.algorithm.powers_of_two:
            for run_members in cached[1]:
                _check_size(coll, spec, run_members)
        return cached[1]

    def _solved_done(self, arg: tuple[Collective, list[int]]) -> None:
        coll, ranks = arg
        for rank in ranks:
            self._collective_done(rank, coll)

    def _note_waiting(self, rank: int, node_id: int, coll: Collective) -> None:
        """Time breakdown: a member waits for peers (from its issue on, see
        `collectives_start_waiting`) until every member has issued the collective."""
        members = coll.members
        release = self.context.comm_waiting
        if self.folding is not None:
            return        # _issue_folded releases the representatives once the group is ready
        if len(coll.nodes) < len(members):
            if coll.comm_type in ROOTED:
                algorithm = self._algorithm(coll.comm_type, 0)
                if algorithm.only_sends(coll.comm_type, members.index(rank), members.index(coll.root),
                                        len(members)):
                    release(rank, node_id, False)
        else:
            self.context.comm_released(coll.nodes.items())

    def _plan(self, coll: Collective, node: NodeView) -> list[list[PhaseSpec]]:
        """The phases of every chunk (see the module docstring)."""
        n = len(coll.members)
        comm_type = RUNS_AS.get(coll.comm_type, coll.comm_type)
        if n < 2 or (coll.size == 0 and coll.comm_type != pb.BARRIER):
            return []
        splits = min(self.splits, max(coll.size, 1))
        base, extra = divmod(coll.size, splits)
        chunk_sizes = [base + (1 if i < extra else 0) for i in range(splits)]
        world = coll.members == self.groups.world
        plans = []
        for chunk, chunk_bytes in enumerate(chunk_sizes):
            if comm_type in ROOTED or not world:
                algorithm = self._algorithm(comm_type, 0)
                plans.append([PhaseSpec(chunk, 0, 0, comm_type, chunk_bytes, algorithm, None,
                                        local=not world)])
            else:
                plans.append(self._plan_world_chunk(chunk, comm_type, chunk_bytes, node))
        return plans

    def _plan_world_chunk(self, chunk: int, comm_type: int, size: int, node: NodeView) -> list[PhaseSpec]:
        # Logical dimensions: the network's, up to the first one* algorithm, which spans all NPUs.
        dims: list[tuple[int | None, CollectiveAlgorithm]] = []
        for d in range(len(self.dim_sizes)):
            algorithm = self._algorithm(comm_type, d)
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
                steps = [(i, REDUCE_SCATTER) for i in live[:-1]] + [(last, ALL_REDUCE)]
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

    def _slice(self, coll: Collective, spec: PhaseSpec, rank: int) -> tuple[int, ...]:
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

    # Scheduling ------------------------------------------------------------------------------------
    def _enqueue(self, rank: int, coll: Collective, spec: PhaseSpec) -> None:
        members = self._slice(coll, spec, rank)
        key = (spec.chunk, spec.index, members[0])
        run = coll.runs.get(key)
        if run is None:
            _check_size(coll, spec, members)
            run = coll.runs[key] = PhaseRun(coll, spec, members)
        waiting = self.queues[rank].waiting[spec.queue]
        priority = coll.priority[rank]
        index = 0
        while index < len(waiting) and waiting[index][0] >= priority:
            index += 1
        waiting.insert(index, (priority, run))
        self._dispatch(rank, spec.queue)

    def _dispatch(self, rank: int, queue: int) -> None:
        queues = self.queues[rank]
        waiting = queues.waiting[queue]
        index = 0
        while index < len(waiting) and queues.active[queue] < self.active_limit:
            run = waiting[index][1]
            if not run.collective.may_start(rank, run.spec):
                index += 1
                continue
            del waiting[index]
            queues.active[queue] += 1
            run.collective.started(rank, run.spec)
            self._start(rank, run)
            index = 0   # the collective's next phase in order may be one skipped above

    def _start(self, rank: int, run: PhaseRun) -> None:
        now = self.scheduler.now
        run.starts[rank] = now
        spec = run.spec
        n = len(run.members)
        if not self.contention_free or not spec.algorithm.causal:
            if run.io is None:
                run.io = NetworkPhase(run.members, self.network, self.scheduler,
                                      lambda pos, run=run: self._member_done((run, run.members[pos])))
                run.machines = self._phase_machines(run.collective, run.spec, run.members, run.io)
            run.machines[run.position[rank]].start()
            return
        if len(run.starts) < n:
            return
        finishes, sent, received = self._time_phase(run.collective, spec, run.members,
                                                    [run.starts[r] for r in run.members])
        for member, finish, out, into in zip(run.members, finishes, sent, received):
            self.bytes_sent[member] += out
            self.bytes_received[member] += into
            self.scheduler.schedule_at(finish, self._member_done, (run, member))

    def _time_phase(self, coll: Collective, spec: PhaseSpec, members: tuple[int, ...],
                    starts: list[int]) -> tuple[list[int], Sequence[int], Sequence[int]]:
        """A causal phase run on a contention-free network: finish time, bytes sent and bytes
        received of each member (aligned with `members`), given when each started it."""
        n = len(members)
        schedule = self._schedule(spec, n)
        network = self.network
        if schedule is not None:
            if self.reserving:
                finishes = self._reserve_steps(schedule, spec, members, starts)
            else:
                finishes = closed_form_finishes(schedule, members, starts, network.message_delay,
                                                self._endpoint_delay(spec), self._reduce_delay,
                                                self._uniform_delays)
            sent: Sequence[int] = (schedule.bytes_sent_per_member,) * n
            received: Sequence[int] = schedule.bytes_received_per_position
        else:
            if self.reserving:
                def delay(src: int, dst: int, size: int) -> int:
                    return network.transfer(src, dst, size, io.now) - io.now
            else:
                delay = network.message_delay
            io = IsolatedPhase(members, delay)
            machines = self._phase_machines(coll, spec, members, io)
            by_pos = io.run(starts, lambda pos: machines[pos].start())
            io.release()
            if len(by_pos) != n:
                stuck = [members[p] for p in range(n) if p not in by_pos]
                raise SimulationError(f"internal error: {coll.describe()} chunk {spec.chunk}: "
                                      f"'{spec.algorithm.name}' left rank(s) {stuck} unfinished")
            finishes = [by_pos[p] for p in range(n)]
            sent, received = io.bytes_sent, io.bytes_received
        last = max(starts)
        for member, finish in zip(members, finishes):
            if finish < last:
                raise SimulationError(
                    f"internal error: {coll.describe()} chunk {spec.chunk} would finish on "
                    f"rank {member} at {finish} ns, before its last member started ({last} ns)")
        return finishes, sent, received

    def _reserve_steps(self, schedule, spec: PhaseSpec, members: tuple[int, ...],
                       starts: list[int]) -> list[int]:
        """`closed_form_finishes` on a closed-form network: each message is a `transfer`."""
        network, endpoint = self.network, self._endpoint_delay(spec)
        n = len(members)
        if schedule.uniform and min(starts) == max(starts):
            delays = uniform_delays(schedule, members, network.message_delay)
            if delays is not None:
                send_times, t = uniform_send_times(schedule, delays, starts[0], endpoint, self._reduce_delay)
                pairs = [(members[i], members[schedule.send_to(i, 0)[0]]) for i in range(n)]
                if network.transfer_uniform(pairs, schedule.step_bytes, send_times):
                    return [t] * n
        return closed_form_transfers(schedule, members, starts, network.transfer, endpoint,
                                     self._reduce_delay)

    def _phase_machines(self, coll: Collective, spec: PhaseSpec, members: tuple[int, ...], io) -> list:
        ctx = PhaseContext(io, len(members), self._endpoint_delay(spec), self._reduce_delay,
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

    def _endpoint_delay(self, spec: PhaseSpec) -> int:
        return FAST_ENDPOINT_DELAY if spec.local else self.endpoint_delay

    def _reduce_delay(self, size: int) -> int:
        value = self._reduce_cache.get(size)
        if value is None:
            value = self._reduce_cache[size] = 3 * int(size / self.mem_bw)
        return value

    def _member_done(self, arg: tuple[PhaseRun, int]) -> None:
        run, rank = arg
        spec, coll = run.spec, run.collective
        if isinstance(run.io, NetworkPhase):
            pos = run.position[rank]
            self.bytes_sent[rank] += run.io.bytes_sent[pos]
            self.bytes_received[rank] += run.io.bytes_received[pos]
        run.done += 1
        if run.done == len(run.members):
            del coll.runs[(spec.chunk, spec.index, run.members[0])]
            run.io = run.machines = None   # break the run <-> io <-> machines cycle
        self.queues[rank].active[spec.queue] -= 1
        chunk = coll.plans[spec.chunk]
        if spec.index + 1 < len(chunk):
            self._enqueue(rank, coll, chunk[spec.index + 1])
        else:
            coll.remaining[rank] -= 1
            if coll.remaining[rank] == 0:
                self._collective_done(rank, coll)
        self._dispatch(rank, spec.queue)

    def _collective_done(self, rank: int, coll: Collective) -> None:
        node_id = coll.nodes[rank]
        del self.open[rank][node_id]
        self.collectives_done[rank] += 1
        del coll.remaining[rank]
        done = coll.done.pop(rank)
        if not coll.remaining and (len(coll.nodes) == len(coll.members)
                                   or (self.folding is not None and not coll.needs)):
            self.matcher.close(coll)
        done(node_id)

    def on_idle(self) -> bool:
        """Break a cycle of ranks waiting on each other's queues (see module docstring)."""
        forced = False
        for rank, queues in enumerate(self.queues):
            for queue, waiting in enumerate(queues.waiting):
                for entry in list(waiting):
                    run = entry[1]
                    if run.starts and rank not in run.starts:
                        waiting.remove(entry)
                        queues.active[queue] += 1
                        run.collective.started(rank, run.spec)
                        self.oversubscribed += 1
                        self._start(rank, run)
                        forced = True
        if forced:
            self.context.warn(
                "ranks waited on each other's chunk queues in a cycle (ASTRA-sim deadlocks here, "
                "astra-sim issue 370); ranks joined started chunks beyond active-chunks-per-dimension "
                f"({self.oversubscribed} time(s) so far)")
        return forced

    # Reporting --------------------------------------------------------------------------------------
    def waits(self, rank: int) -> list[str]:
        out = []
        for node_id, coll in self.open[rank].items():
            if self.folding is not None:   # the representatives whose side is missing
                missing = sorted({fact[0] for fact in coll.needs})
            else:
                missing = [r for r in coll.members if r not in coll.nodes]
            out.append(collective_wait(node_id, coll.describe(), missing))
        out.extend(self.p2p.waits(rank))
        return out

    def summary(self) -> dict:
        unmatched = self.p2p.unmatched_sends()
        if self.folding is not None:   # each representative's row stands for its class's
            members, representative = self.folding.members, self.folding.representative
            ranks = len(representative)
            unmatched = sorted(({**row, "rank": mate, "peer": (row["peer"] + mate - row["rank"]) % ranks}
                                for row in unmatched for mate in members[representative[row["rank"]]]),
                               key=lambda row: (row["rank"], row["peer"], row["tag"], row["node"]))
        return {"unmatched_sends": unmatched, "oversubscribed_chunk_starts": self.oversubscribed}
