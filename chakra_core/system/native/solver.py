"""Timing runs without events: one phase run at a time, or a whole collective at once.

`CollectiveSolver.time_phase` times a causal run on a contention-free network
once its last member has started it: in closed form (ring), or by simulating
it in isolation (executor.py, runner.py).

Whole collectives in one step: when a rank can have only one collective in
flight (`resources.comm: 1`, ASTRA-sim's default) on a contention-free
network, nothing but the collective itself touches its ranks' chunk queues,
so the queue schedule is a recurrence over its phases, solved once its last
member has issued it (`solve`): a phase starts on a rank when its previous
phase there has finished, the phase before it in the queue's fixed order has
started, and fewer than `active-chunks-per-dimension` of the earlier ones are
still running; each run then finishes as its closed form says. This gives
exactly the event-by-event schedule of queues.py without its events (the two
are checked against each other by property tests). Rooted collectives, whose
root may finish before the others start, always run event by event.

The same holds on a network with shared links (`closed_form` networks, such
as the congestion backend in fifo mode) for a collective whose links carry
nothing else: with one chunk in flight per dimension, each link then carries
one sender's messages in the order it sends them. The collective claims its
links when first issued (`NetworkModel.claim`); if the network cannot promise
them, the collective runs message by message instead.

On a flow-level network (`FlowNetwork`, the congestion backend in fair mode)
a collective whose links carry nothing else but whose own messages share
links (an all-to-all on a fat-tree) is claimed as a whole, and each step of
each phase run is timed as one set of flows (`flow_finishes`).
"""

from __future__ import annotations

from heapq import heappush, heapreplace
from typing import Callable, Hashable, Sequence

from chakra_core.contract.algorithm import StepSchedule
from chakra_core.contract.folding import Folding
from chakra_core.contract.inputs import Scheduler, Unfold
from chakra_core.contract.network import ClosedFormNetwork, FlowNetwork
from chakra_core.errors import SimulationError
from chakra_core.system.native.executor import (UniformCache, closed_form_finishes, closed_form_transfers,
                                                flow_finishes, uniform_delays, uniform_send_times)
from chakra_core.system.native.planner import Collective, CollectivePlanner, PhaseSpec
from chakra_core.system.native.runner import IsolatedPhase

_UNFOLD_FINISH = ("members of one class of equivalent ranks finished a collective at different "
                  "times; simulating every rank")


def _queue_start(ready: int, previous: int | None, running: list[int] | None, limit: int) -> int:
    """When a phase starts in a chunk queue (`solve`): once its chunk is ready, not before the
    phase ahead of it in the queue started, and once fewer than `limit` phases are running
    (`running`: a min-heap of the latest `limit` finishes)."""
    start = ready
    if previous is not None and previous > start:
        start = previous
    if running is not None and len(running) == limit and running[0] > start:
        start = running[0]
    return start


def _queue_finished(latest: dict[Hashable, list[int]], queue: Hashable, finish: int, limit: int) -> None:
    """Record a phase finishing in `queue`, keeping its `limit` latest finishes."""
    running = latest.get(queue)
    if running is None:
        latest[queue] = [finish]
    elif len(running) < limit:
        heappush(running, finish)
    elif finish > running[0]:
        heapreplace(running, finish)


class CollectiveSolver:
    """Times phase runs and whole collectives without events (see the module docstring)."""

    def __init__(self, planner: CollectivePlanner, network: ClosedFormNetwork, scheduler: Scheduler,
                 reserving: bool, active_limit: int, folding: Folding | None,
                 request_restart: Callable[[str, object], None], bytes_sent: list[int],
                 bytes_received: list[int], collective_done: Callable[[int, Collective], None]):
        """`network`: its `message_delay` times runs; its other ClosedFormNetwork methods are
        called only when `reserving` (timing runs on claimed links). `collective_done(rank,
        coll)` is called when a solved collective has finished on a rank."""
        self.planner = planner
        self.network = network
        self.scheduler = scheduler
        self.reserving = reserving
        self.active_limit = active_limit
        self.folding = folding
        self.request_restart = request_restart
        self.bytes_sent, self.bytes_received = bytes_sent, bytes_received
        self.collective_done = collective_done
        self._runs = planner.runs
        self._schedule = planner.schedule
        self._reduce_delay = planner.reduce_delay
        self._endpoint_delay = planner.endpoint_delay
        self._uniform_delays: UniformCache = {}   # closed_form_finishes' cache

    def solve(self, coll: Collective) -> None:
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
        ranks: Sequence[int] = coll.members
        if self.folding is not None:     # only the representatives among the members are simulated
            representative = self.folding.representative
            finish: dict[int, int] = {}
            for rank in coll.members:
                if finish.setdefault(representative[rank], done_at[rank]) != done_at[rank]:
                    self.request_restart(_UNFOLD_FINISH, Unfold(_UNFOLD_FINISH))
                    return
            ranks = [rank for rank in coll.members if rank in coll.done]
        by_time: dict[int, list[int]] = {}
        for rank in ranks:
            by_time.setdefault(done_at[rank], []).append(rank)
        for time, ranks in sorted(by_time.items()):
            self.scheduler.schedule_at(time, self._solved_done, (coll, ranks))

    def _solve_together(self, coll: Collective, entries: list[tuple[int, int, PhaseSpec]],
                        issued: int) -> dict[int, int] | None:
        """`solve` when every member issued at the same time: while every run finishes on all its
        members at once, the members stay in step and one timeline serves them all. None when a
        run does not (a rank then runs ahead); `_solve_each` takes over."""
        limit = self.active_limit
        last_start: dict[int, int] = {}            # per queue
        latest: dict[Hashable, list[int]] = {}     # per queue: the `limit` latest finishes
        ready = [issued] * len(coll.plans)
        sent: dict[int, int] = {}
        received: dict[int, int] = {}
        done = 0
        for _, chunk, spec in entries:
            queue = spec.queue
            start = last_start[queue] = _queue_start(ready[chunk], last_start.get(queue), latest.get(queue), limit)
            # None only until the first run's finish (every phase has a run)
            finish: int = None  # type: ignore[assignment]  # no per-phase narrowing check
            for run_members in self._runs(coll, spec):
                finishes, out, into = self.time_phase(coll, spec, run_members, [start] * len(run_members))
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

    def _solve_each(self, coll: Collective, entries: list[tuple[int, int, PhaseSpec]]) -> dict[int, int]:
        """`solve`, member by member."""
        members = coll.members
        limit = self.active_limit
        # per member and queue: start of the last phase started, and the `limit` latest finishes
        last_start: dict[tuple[int, int], int] = {}
        latest: dict[Hashable, list[int]] = {}
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
                finishes, sent, received = self.time_phase(coll, spec, run_members,
                                                           [starts[r] for r in run_members])
                for rank, finish, out, into in zip(run_members, finishes, sent, received):
                    chunk_ready[rank] = finish
                    self.bytes_sent[rank] += out
                    self.bytes_received[rank] += into
                    _queue_finished(latest, (rank, queue), finish, limit)
                    if final and finish > done_at[rank]:
                        done_at[rank] = finish
        return done_at

    def time_phase(self, coll: Collective, spec: PhaseSpec, members: tuple[int, ...],
                   starts: list[int]) -> tuple[list[int], Sequence[int], Sequence[int]]:
        """A causal phase run on a contention-free network: finish time, bytes sent and bytes
        received of each member (aligned with `members`), given when each started it."""
        n = len(members)
        network = self.network
        if coll.flows:   # claimed as flows: every phase has a flow schedule (planner.flow_runs)
            flow_schedule = self.planner.flow_schedule(spec, n)
            assert flow_schedule is not None
            flows: FlowNetwork = network  # type: ignore[assignment]  # claimed through claim_flows
            finishes = flow_finishes(flow_schedule, members, starts, flows.transfer_flows,
                                     self._endpoint_delay(spec), self._reduce_delay)
            return (self._check_finishes(coll, spec, members, starts, finishes),
                    (flow_schedule.bytes_sent_per_member,) * n, flow_schedule.bytes_received_per_position)
        schedule = self._schedule(spec, n)
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
            machines = self.planner.phase_machines(coll, spec, members, io)
            by_pos = io.run(starts, lambda pos: machines[pos].start())
            io.release()
            if len(by_pos) != n:
                stuck = [members[p] for p in range(n) if p not in by_pos]
                raise SimulationError(f"internal error: {coll.describe()} chunk {spec.chunk}: "
                                      f"'{spec.algorithm.name}' left rank(s) {stuck} unfinished")
            finishes = [by_pos[p] for p in range(n)]
            sent, received = io.bytes_sent, io.bytes_received
        return self._check_finishes(coll, spec, members, starts, finishes), sent, received

    @staticmethod
    def _check_finishes(coll: Collective, spec: PhaseSpec, members: tuple[int, ...], starts: list[int],
                        finishes: list[int]) -> list[int]:
        last = max(starts)
        for member, finish in zip(members, finishes):
            if finish < last:
                raise SimulationError(
                    f"internal error: {coll.describe()} chunk {spec.chunk} would finish on "
                    f"rank {member} at {finish} ns, before its last member started ({last} ns)")
        return finishes

    def _reserve_steps(self, schedule: StepSchedule, spec: PhaseSpec, members: tuple[int, ...],
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

    def _solved_done(self, arg: tuple[Collective, list[int]]) -> None:
        coll, ranks = arg
        for rank in ranks:
            self.collective_done(rank, coll)
