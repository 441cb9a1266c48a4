"""Running phases event by event through every rank's chunk queues.

Every rank has, per dimension, a queue of waiting phases and at most
`active-chunks-per-dimension` running; waiting phases are ordered by
collective priority (`scheduling-policy` LIFO: newest collective first; FIFO:
oldest first), then by arrival. A rank starts a collective's phases on a
dimension in one fixed order (`Collective.may_start`).

Timing of a run: on a contention-free network it is solved when its last
member starts it (`CollectiveSolver.time_phase`); otherwise it runs message
by message through the network backend (runner.py).

If ranks' queues ever wait on each other in a cycle (ASTRA-sim deadlocks
there: astra-sim issue 370), the ranks holding back a run that others have
started join it beyond their active-chunk limit, and a warning says so.
"""

from __future__ import annotations

from typing import Callable

from chakra_core.contract.inputs import Scheduler
from chakra_core.contract.network import NetworkModel
from chakra_core.system.native.planner import Collective, CollectivePlanner, PhaseRun, PhaseSpec, check_size
from chakra_core.system.native.runner import NetworkPhase
from chakra_core.system.native.solver import CollectiveSolver


class RankQueues:
    """Per-rank, per-dimension queues of waiting runs and counts of running ones."""

    __slots__ = ("active", "waiting", "counter")

    def __init__(self, dims: int):
        self.active = [0] * dims
        self.waiting: list[list[tuple[int, PhaseRun]]] = [[] for _ in range(dims)]
        self.counter = 0
        """Collectives the rank has issued so far: the latest one's count is its priority."""


class ChunkQueues:
    """Every rank's chunk queues, and the runs that go through them (see the module docstring)."""

    def __init__(self, num_ranks: int, planner: CollectivePlanner, solver: CollectiveSolver,
                 network: NetworkModel, scheduler: Scheduler, contention_free: bool, active_limit: int,
                 bytes_sent: list[int], bytes_received: list[int],
                 collective_done: Callable[[int, Collective], None], warn: Callable[[str], None]):
        """`collective_done(rank, coll)` is called when a collective has finished on a rank."""
        self.queues = [RankQueues(len(planner.dim_sizes)) for _ in range(num_ranks)]
        self.network = network
        self.scheduler = scheduler
        self.contention_free = contention_free
        self.active_limit = active_limit
        self.bytes_sent, self.bytes_received = bytes_sent, bytes_received
        self.collective_done = collective_done
        self.warn = warn
        self.oversubscribed = 0
        """Runs ranks joined beyond their active-chunk limit to break a cycle."""
        self._slice = planner.slice
        self._phase_machines = planner.phase_machines
        self._time_phase = solver.time_phase

    def enqueue(self, rank: int, coll: Collective, spec: PhaseSpec) -> None:
        """`rank` is ready to run phase `spec` of `coll`: queue it, and start what may start."""
        members = self._slice(coll, spec, rank)
        key = (spec.chunk, spec.index, members[0])
        run = coll.runs.get(key)
        if run is None:
            check_size(coll, spec, members)
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
            machines = run.machines
            if machines is None:   # the run's first member (io and machines are set and cleared together)
                def member_done(pos: int, run: PhaseRun = run) -> None:
                    self._member_done((run, run.members[pos]))

                run.io = NetworkPhase(run.members, self.network, self.scheduler, member_done)
                machines = run.machines = self._phase_machines(run.collective, run.spec, run.members, run.io)
            machines[run.position[rank]].start()
            return
        if len(run.starts) < n:
            return
        finishes, sent, received = self._time_phase(run.collective, spec, run.members,
                                                    [run.starts[r] for r in run.members])
        for member, finish, out, into in zip(run.members, finishes, sent, received):
            self.bytes_sent[member] += out
            self.bytes_received[member] += into
            self.scheduler.schedule_at(finish, self._member_done, (run, member))

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
            self.enqueue(rank, coll, chunk[spec.index + 1])
        else:
            coll.remaining[rank] -= 1
            if coll.remaining[rank] == 0:
                self.collective_done(rank, coll)
        self._dispatch(rank, spec.queue)

    def break_cycle(self) -> bool:
        """Break a cycle of ranks waiting on each other's queues (see the module docstring);
        True if some rank joined a run."""
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
            self.warn(
                "ranks waited on each other's chunk queues in a cycle (ASTRA-sim deadlocks here, "
                "astra-sim issue 370); ranks joined started chunks beyond active-chunks-per-dimension "
                f"({self.oversubscribed} time(s) so far)")
        return forced
