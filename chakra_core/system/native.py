"""The built-in system layer (`plugin: native`): collectives, chunking, scheduling, p2p.

A collective node becomes one `Collective` shared by its group's ranks: the
k-th collective a rank issues in a group matches the k-th of every other
member (type and size must agree). Its `comm_size` bytes are split into
`preferred-dataset-splits` chunks; each chunk runs the configured algorithm
as one `Phase` per network dimension it spans. Every rank has, per dimension,
a queue of phases and at most `active-chunks-per-dimension` running at once;
`scheduling-policy` LIFO puts a newly issued collective's chunks ahead of
older waiting ones, FIFO behind.

Timing of a phase (see `executor`): on a contention-free network the phase is
solved in closed form as soon as its last member starts it (every member's
finish depends on every member's start, so nothing is scheduled in the past);
otherwise it runs message by message through the network backend.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Literal

from pydantic import Field, PositiveFloat, PositiveInt, NonNegativeInt

from chakra_core.errors import SimulationError
from chakra_core.et.attrs import NodeView
from chakra_core.layers import LayerContext, PluginConfig, SystemLayer
from chakra_core.system.algorithms import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER,
                                           CollectiveAlgorithm, StepSchedule, collective_name)
from chakra_core.system.executor import MessageLevelRun, closed_form_finishes
from chakra_core.system.groups import GroupRegistry
from chakra_core.system.p2p import PointToPoint


class NativeSystemConfig(PluginConfig):
    """Keys of ASTRA-sim's system JSON (hyphenated or with underscores)."""

    scheduling_policy: Literal["LIFO", "FIFO"] = Field(
        "LIFO", alias="scheduling-policy",
        description="order of waiting chunks of different collectives on a dimension")
    endpoint_delay: NonNegativeInt = Field(
        10, alias="endpoint-delay", description="ns added at each endpoint for every message step")
    active_chunks_per_dimension: PositiveInt = Field(
        1, alias="active-chunks-per-dimension", description="chunks in flight per rank and dimension")
    preferred_dataset_splits: PositiveInt = Field(
        1, alias="preferred-dataset-splits", description="chunks a collective is split into")
    all_reduce_implementation: list[str] = Field(
        ["ring"], alias="all-reduce-implementation", description="algorithm per network dimension")
    all_gather_implementation: list[str] = Field(
        ["ring"], alias="all-gather-implementation", description="algorithm per network dimension")
    reduce_scatter_implementation: list[str] = Field(
        ["ring"], alias="reduce-scatter-implementation", description="algorithm per network dimension")
    all_to_all_implementation: list[str] = Field(
        ["ring"], alias="all-to-all-implementation", description="algorithm per network dimension")
    local_mem_bw: PositiveFloat = Field(
        1600.0, alias="local-mem-bw",
        description="GB/s (10^9 B/s); a reducing step costs 3 x int(bytes / local-mem-bw) ns")
    collective_optimization: Literal["baseline", "localBWAware"] = Field(
        "baseline", alias="collective-optimization",
        description="ASTRA-sim's multi-dimensional chunk-size optimisation; no effect on one dimension")


_IMPL_FIELD = {
    ALL_REDUCE: "all_reduce_implementation",
    ALL_GATHER: "all_gather_implementation",
    REDUCE_SCATTER: "reduce_scatter_implementation",
    ALL_TO_ALL: "all_to_all_implementation",
}


class Collective:
    """One collective operation, shared by the ranks of its group."""

    __slots__ = ("group", "seq", "comm_type", "size", "members", "nodes", "done", "remaining",
                 "chunks", "first_rank", "issue_times")

    def __init__(self, group: str, seq: int, comm_type: int, size: int, members: tuple[int, ...],
                 first_rank: int):
        self.group, self.seq = group, seq
        self.comm_type, self.size, self.members = comm_type, size, members
        self.first_rank = first_rank
        self.nodes: dict[int, int] = {}                    # rank -> node id
        self.done: dict[int, Callable[[int], None]] = {}   # rank -> completion callback
        self.remaining: dict[int, int] = {}                # rank -> chunks not finished
        self.issue_times: dict[int, int] = {}
        self.chunks: list[list[Phase]] = []

    def describe(self) -> str:
        group = f"group '{self.group}'" if self.group else "all ranks"
        return f"{collective_name(self.comm_type)} of {self.size} B among {group} (#{self.seq + 1} there)"


class Phase:
    """One algorithm run among `members` for one chunk (a dimension's slice of the group)."""

    __slots__ = ("collective", "chunk", "index", "dim", "members", "position", "schedule",
                 "starts", "run", "finished")

    def __init__(self, collective: Collective, chunk: int, index: int, dim: int,
                 members: tuple[int, ...], schedule: StepSchedule):
        self.collective, self.chunk, self.index, self.dim = collective, chunk, index, dim
        self.members = members
        self.position = {rank: pos for pos, rank in enumerate(members)}
        self.schedule = schedule
        self.starts: dict[int, int] = {}
        self.run: MessageLevelRun | None = None
        self.finished = 0


class RankQueues:
    """Per-rank, per-dimension queues of phases and counts of running ones."""

    __slots__ = ("active", "waiting")

    def __init__(self, dims: int):
        self.active = [0] * dims
        self.waiting: list[deque[Phase]] = [deque() for _ in range(dims)]


class NativeSystem(SystemLayer):
    name = "native"
    fidelity = ("ASTRA-sim's native collectives: chunked ring algorithms per dimension, "
                "endpoint and reduction delays, LIFO/FIFO chunk scheduling, p2p matching")
    Config = NativeSystemConfig

    def __init__(self, config: NativeSystemConfig, context: LayerContext):
        super().__init__(config, context)
        network = context.network
        if network is None:
            raise SimulationError("the native system layer needs a network layer")
        self.network = network
        self.scheduler = context.scheduler
        self.num_ranks = context.num_ranks
        self.dims = len(network.dims)
        self.groups = GroupRegistry(context.num_ranks, context.extras.get("comm_groups"))
        algorithms: dict[str, type[CollectiveAlgorithm]] = context.extras.get("algorithms", {})
        self.algorithms = self._select_algorithms(config, algorithms)
        self.closed_form = bool(getattr(network, "contention_free", False))
        self.endpoint_delay = config.endpoint_delay
        self.mem_bw = config.local_mem_bw  # GB/s == bytes/ns
        self.lifo = config.scheduling_policy == "LIFO"
        self.active_limit = config.active_chunks_per_dimension
        self.splits = config.preferred_dataset_splits
        self.queues = [RankQueues(self.dims) for _ in range(context.num_ranks)]
        self.collectives: dict[tuple[str, int], Collective] = {}
        self.issued: list[dict[str, int]] = [dict() for _ in range(context.num_ranks)]
        self.open: list[dict[int, Collective]] = [dict() for _ in range(context.num_ranks)]
        self.bytes_sent = [0] * context.num_ranks
        self.collectives_done = [0] * context.num_ranks
        self.p2p = PointToPoint(network, context.scheduler, context.warn, self.bytes_sent)
        self._reduce_cache: dict[int, int] = {}
        if config.collective_optimization == "localBWAware" and self.dims > 1:
            context.warn("system.collective-optimization: localBWAware is not implemented for "
                         "multi-dimensional networks yet; running baseline")

    @classmethod
    def config_problems(cls, config: NativeSystemConfig, extras: dict) -> list[tuple[tuple, str]]:
        available = extras.get("algorithms", {})
        problems = []
        for comm_type, field_name in _IMPL_FIELD.items():
            alias = NativeSystemConfig.model_fields[field_name].alias
            names = getattr(config, field_name)
            if not names:
                problems.append(((alias,), "give at least one algorithm"))
            for index, name in enumerate(names):
                algorithm = available.get(name)
                if algorithm is None:
                    problems.append(((alias, index), f"unknown collective algorithm '{name}'; "
                                     f"available: {', '.join(sorted(available)) or 'none'}"))
                elif comm_type not in algorithm.supports:
                    problems.append(((alias, index), f"algorithm '{name}' does not implement "
                                     f"{collective_name(comm_type)}"))
        return problems

    def _select_algorithms(self, config: NativeSystemConfig,
                           available: dict[str, type[CollectiveAlgorithm]]) -> dict[int, list[CollectiveAlgorithm]]:
        problems = self.config_problems(config, {"algorithms": available})
        if problems:
            (loc, reason) = problems[0]
            raise SimulationError(f"system.{'.'.join(map(str, loc))}: {reason}")
        chosen = {}
        for comm_type, field_name in _IMPL_FIELD.items():
            instances = [available[name]() for name in getattr(config, field_name)]
            if len(instances) < self.dims:
                instances += [instances[-1]] * (self.dims - len(instances))
            chosen[comm_type] = instances
        return chosen

    # Collectives ---------------------------------------------------------------------------
    def issue_collective(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        comm_type = node.int("comm_type")
        size = node.int("comm_size")
        if comm_type not in _IMPL_FIELD:
            raise SimulationError(
                f"rank {rank}, node {node.id} ({node.name!r}): collective "
                f"{collective_name(comm_type)} is not implemented by the native system layer yet "
                f"(implemented: {', '.join(collective_name(t) for t in _IMPL_FIELD)})")
        if size < 0:
            raise SimulationError(f"rank {rank}, node {node.id}: negative comm_size {size}")
        group = node.str("pg_name", "")
        if group == "0":
            group = ""
        members = self.groups.members(group, node, rank)
        seq = self.issued[rank].get(group, 0)
        self.issued[rank][group] = seq + 1
        key = (group, seq)
        coll = self.collectives.get(key)
        if coll is None:
            coll = Collective(group, seq, comm_type, size, members, rank)
            coll.chunks = self._plan_chunks(coll)
            self.collectives[key] = coll
        elif coll.comm_type != comm_type or coll.size != size or coll.members != members:
            first = coll.first_rank
            raise SimulationError(
                f"collectives do not match: rank {rank}'s node {node.id} ({node.name!r}) is "
                f"{collective_name(comm_type)} of {size} B, but rank {first}'s matching collective "
                f"(node {coll.nodes[first]}, #{seq + 1} in {('group ' + repr(group)) if group else 'all ranks'}) "
                f"is {collective_name(coll.comm_type)} of {coll.size} B")
        coll.nodes[rank] = node.id
        coll.done[rank] = done
        coll.issue_times[rank] = self.scheduler.now
        coll.remaining[rank] = len(coll.chunks)
        self.open[rank][node.id] = coll
        if not coll.chunks:  # zero bytes, or a group of one: nothing to move
            self._collective_done(rank, coll)
            return
        firsts = [chunk[0] for chunk in coll.chunks]
        self._enqueue(rank, firsts)

    def _plan_chunks(self, coll: Collective) -> list[list[Phase]]:
        n = len(coll.members)
        if n < 2 or coll.size == 0:
            return []
        splits = min(self.splits, coll.size)
        base, extra = divmod(coll.size, splits)
        chunk_sizes = [base + (1 if i < extra else 0) for i in range(splits)]
        algorithm = self.algorithms[coll.comm_type][0]
        chunks = []
        for index, chunk_bytes in enumerate(chunk_sizes):
            schedule = algorithm.schedule(coll.comm_type, chunk_bytes, n)
            chunks.append([Phase(coll, index, 0, 0, coll.members, schedule)])
        return chunks

    def _enqueue(self, rank: int, phases: list[Phase]) -> None:
        by_dim: dict[int, list[Phase]] = {}
        for phase in phases:
            by_dim.setdefault(phase.dim, []).append(phase)
        for dim, batch in by_dim.items():
            waiting = self.queues[rank].waiting[dim]
            if self.lifo:
                waiting.extendleft(reversed(batch))
            else:
                waiting.extend(batch)
            self._dispatch(rank, dim)

    def _dispatch(self, rank: int, dim: int) -> None:
        queues = self.queues[rank]
        waiting = queues.waiting[dim]
        while waiting and queues.active[dim] < self.active_limit:
            phase = waiting.popleft()
            queues.active[dim] += 1
            self._start_phase(rank, phase)

    def _start_phase(self, rank: int, phase: Phase) -> None:
        now = self.scheduler.now
        self.bytes_sent[rank] += phase.schedule.bytes_sent_per_member
        if not self.closed_form:
            if phase.run is None:
                phase.run = MessageLevelRun(
                    phase.schedule, phase.members, self.network, self.scheduler,
                    self.endpoint_delay, self._reduce_delay,
                    lambda pos, _t, phase=phase: self._member_done((phase, phase.members[pos])))
            phase.run.start(phase.position[rank])
            return
        phase.starts[rank] = now
        if len(phase.starts) < len(phase.members):
            return
        starts = [phase.starts[r] for r in phase.members]
        finishes = closed_form_finishes(phase.schedule, phase.members, starts,
                                        self.network.message_delay, self.endpoint_delay,
                                        self._reduce_delay)
        schedule_at = self.scheduler.schedule_at
        for member, finish in zip(phase.members, finishes):
            if finish < now:
                raise SimulationError(
                    f"internal error: {phase.collective.describe()} chunk {phase.chunk} would finish "
                    f"on rank {member} at {finish} ns, before its last member started ({now} ns)")
            schedule_at(finish, self._member_done, (phase, member))
        phase.starts.clear()

    def _reduce_delay(self, size: int) -> int:
        value = self._reduce_cache.get(size)
        if value is None:
            value = self._reduce_cache[size] = 3 * int(size / self.mem_bw)
        return value

    def _member_done(self, arg: tuple[Phase, int]) -> None:
        phase, rank = arg
        coll = phase.collective
        self.queues[rank].active[phase.dim] -= 1
        chunk = coll.chunks[phase.chunk]
        if phase.index + 1 < len(chunk):
            self._enqueue(rank, [chunk[phase.index + 1]])
        else:
            coll.remaining[rank] -= 1
            if coll.remaining[rank] == 0:
                self._collective_done(rank, coll)
        self._dispatch(rank, phase.dim)

    def _collective_done(self, rank: int, coll: Collective) -> None:
        node_id = coll.nodes[rank]
        del self.open[rank][node_id]
        self.collectives_done[rank] += 1
        del coll.remaining[rank]
        done = coll.done.pop(rank)
        if not coll.remaining and len(coll.nodes) == len(coll.members):
            del self.collectives[(coll.group, coll.seq)]
        done(node_id)

    # Point-to-point and groups --------------------------------------------------------------
    def issue_send(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        self.p2p.send(rank, node, done)

    def issue_recv(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        self.p2p.recv(rank, node, done)

    def define_groups(self, rank: int, node: NodeView) -> None:
        self.groups.define_from_metadata(rank, node)

    # Reporting -----------------------------------------------------------------------------
    def waits(self, rank: int) -> list[str]:
        out = []
        for node_id, coll in self.open[rank].items():
            missing = [r for r in coll.members if r not in coll.nodes]
            if missing:
                shown = ", ".join(map(str, missing[:16])) + (" ..." if len(missing) > 16 else "")
                out.append(f"collective node {node_id}: {coll.describe()} waits for rank(s) {shown}, "
                           "which never issued it")
            else:
                out.append(f"collective node {node_id}: {coll.describe()} is in progress")
        out.extend(self.p2p.waits(rank))
        return out

    def finish(self) -> None:
        for row in self.p2p.unmatched_sends():
            self.context.warn(f"rank {row['rank']}: COMM_SEND node {row['node']} of {row['size']} B "
                              f"to rank {row['peer']} (tag {row['tag']}) was never received")

    def summary(self) -> dict:
        return {"unmatched_sends": self.p2p.unmatched_sends()}

    def rank_summary(self, rank: int) -> dict:
        return {"bytes_sent": self.bytes_sent[rank], "collectives": self.collectives_done[rank]}

