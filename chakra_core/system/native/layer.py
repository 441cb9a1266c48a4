"""The built-in system layer (`plugin: native`): collectives, chunking, scheduling, p2p.

A collective node becomes one `Collective` shared by its group's ranks: the
k-th collective a rank issues in a group matches the k-th of every other
member (type and size must agree). `NativeSystem` validates the network and
the settings, issues each collective, and reports; one collaborator does
each of the rest:

- planner.py (`CollectivePlanner`): a collective's chunks, their phases (one
  per network dimension) and the runs a phase splits into;
- queues.py (`ChunkQueues`): running phases event by event through every
  rank's per-dimension chunk queues;
- solver.py (`CollectiveSolver`): timing a run, or a whole collective at
  once, without events, when the network allows it;
- fold_guard.py (`FoldGuard`): in folded runs, when a collective is ready,
  and whether folding holds.

Point-to-point messages go through `chakra_core.comm.p2p` (eager, or with
`rendezvous-protocol`).
"""

from __future__ import annotations

from typing import Callable

from chakra_core.comm.collectives import ROOTED, collective_name, collective_wait, even_pieces
from chakra_core.contract.algorithm import CollectiveAlgorithm
from chakra_core.contract.inputs import LayerContext, ValidationInputs
from chakra_core.contract.layers import ProblemList
from chakra_core.contract.network import ClosedFormNetwork, ContentionFreeNetwork, FlowNetwork
from chakra_core.errors import SimulationError
from chakra_core.et.attrs import NodeView
from chakra_core.system.matching import MatchingSystem
from chakra_core.system.native.algorithms import resolve_algorithm
from chakra_core.system.native.config import IMPL_FIELD, NativeSystemConfig
from chakra_core.system.native.fold_guard import FoldGuard
from chakra_core.system.native.planner import Collective, CollectivePlanner
from chakra_core.system.native.queues import ChunkQueues
from chakra_core.system.native.solver import CollectiveSolver
from chakra_core.json_types import JsonObject

_UNEVEN = ("an uneven all-to-all (comm_send_splits / comm_recv_splits, PyTorch's all_to_all_single with split "
           "sizes) runs on the nccl system layer (system: {plugin: nccl}); the native layer plans every "
           "collective as ASTRA-sim does, even, from its first member's comm_size")


class NativeSystem(MatchingSystem[Collective]):
    collectives_start_waiting = True
    name = "native"
    uneven_all_to_all_refusal = _UNEVEN
    fidelity = ("ASTRA-sim's native collectives (ring, direct, halving-doubling, double binary tree, "
                "one* variants) per network dimension, chunked and pipelined, endpoint and reduction "
                "delays, LIFO/FIFO scheduling, communicator groups, eager/rendezvous p2p")
    Config = NativeSystemConfig

    def __init__(self, config: NativeSystemConfig, context: LayerContext):
        super().__init__(config, context)
        network = context.network
        if network is None:
            raise SimulationError("the native system layer needs a network layer")
        dim_sizes = [d.npus for d in network.dims]
        product = 1
        for size in dim_sizes:
            product *= size
        if not dim_sizes or product != network.npus_count:
            raise SimulationError(
                f"network plugin '{network.name}' declares dims {dim_sizes} for "
                f"{network.npus_count} NPUs: the native system layer needs at least one dimension, "
                "and the NPUs per dimension must multiply to the NPU count (a flat network is one "
                "dimension of all NPUs)")
        available = context.inputs.algorithms
        problems = self.config_problems(config, ValidationInputs(context.base_dir, available))
        if problems:
            loc, reason = problems[0]
            raise SimulationError(f"system.{'.'.join(map(str, loc))}: {reason}")
        # Every name resolves: config_problems refused unknown ones (resolve_algorithm's None).
        algorithms: dict[int, list[CollectiveAlgorithm]] = {
            t: [resolve_algorithm(name, available) for name in getattr(config, f)]  # type: ignore[misc]
            for t, f in IMPL_FIELD.items()}
        contention_free = bool(network.contention_free)
        if contention_free and not isinstance(network, ContentionFreeNetwork):
            raise SimulationError(f"network plugin '{network.name}' sets contention_free but has no "
                                  "message_delay(src, dst, size)")
        self.closed_form = (not contention_free and isinstance(network, ClosedFormNetwork)
                            and bool(network.closed_form))
        self.flow_level = (not contention_free and isinstance(network, FlowNetwork)
                           and bool(network.flow_level))
        self.reserving = self.closed_form or self.flow_level
        # One collective in flight per rank: its queues hold nothing else (see solver.py).
        self.solve_whole = ((contention_free or (self.reserving and config.active_chunks_per_dimension == 1))
                            and context.inputs.comm_capacity == 1)
        # Folding needs collectives solved whole and eager point-to-point messages (and, checked
        # per collective, algorithms whose timing turns with the ring of members).
        self.fold_safe = self.solve_whole and not config.rendezvous_protocol
        self.lifo = config.scheduling_policy == "LIFO"
        self.folding = context.inputs.folding
        self.scheduler = context.scheduler
        # Beyond send(), the solver and the fold guard call message_delay (contention-free or
        # reserving networks, checked above) and, when reserving, the rest of ClosedFormNetwork.
        self.network: ClosedFormNetwork = network  # type: ignore[assignment]  # only as far as used, see above
        self.flow_network: FlowNetwork = network  # type: ignore[assignment]  # used only when flow_level
        self._setup_matching(context, network, Collective, rendezvous=config.rendezvous_protocol)
        self.planner = CollectivePlanner(algorithms, dim_sizes, self.groups.world,
                                         config.preferred_dataset_splits,
                                         config.collective_optimization == "localBWAware",
                                         config.endpoint_delay, config.local_mem_bw)  # GB/s == bytes/ns
        self.solver = CollectiveSolver(self.planner, self.network, self.scheduler, self.reserving,
                                       config.active_chunks_per_dimension, self.folding,
                                       context.request_restart, self.bytes_sent, self.bytes_received,
                                       self._collective_done)
        self.chunk_queues = ChunkQueues(context.num_ranks, self.planner, self.solver, network, self.scheduler,
                                        contention_free, config.active_chunks_per_dimension, self.bytes_sent,
                                        self.bytes_received, self._collective_done, context.warn)
        self.rank_queues = self.chunk_queues.queues   # where issue_collective counts each rank's issues
        self.fold_guard: FoldGuard | None = None
        if self.folding is not None:
            self.fold_guard = FoldGuard(self.folding, self.planner, self.network, context, self.solver.solve)
            self.p2p.fold = self.fold_guard.fold_p2p   # the p2p matching exists once _setup_matching ran

    # Configuration -------------------------------------------------------------------------------
    @classmethod
    def config_problems(cls, config: NativeSystemConfig, inputs: ValidationInputs) -> ProblemList:
        available = inputs.algorithms
        problems: ProblemList = []
        for comm_type, field_name in IMPL_FIELD.items():
            alias = NativeSystemConfig.model_fields[field_name].alias
            assert alias is not None   # every field has one (pydantic types it str | None)
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
        # halvingDoubling for all-to-all) is an error only if such a collective runs: see
        # CollectivePlanner.algorithm.
        return problems

    # Issuing a collective ---------------------------------------------------------------------------
    def issue_collective(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        coll = self._join(rank, node)
        if coll.splits is not None and not even_pieces(coll.splits.get(rank)):   # even ones run as without
            raise SimulationError(f"rank {rank}, node {node.id}: {_UNEVEN}")
        if len(coll.nodes) == 1:   # the first member to issue it: plan it
            coll.set_plans(self.planner.plan(coll, node))
            coll.solve = self.solve_whole and all(spec.algorithm.causal for chunk in coll.plans
                                                  for spec in chunk)
            if coll.solve and self.reserving:
                coll.solve = self._claim(coll)
        seq = coll.seq
        queues = self.rank_queues[rank]
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
        if self.fold_guard is not None:
            self.fold_guard.issue(rank, coll, seq)
            return
        if coll.solve:
            coll.issued_at[rank] = self.scheduler.now
            if len(coll.issued_at) == len(coll.members):
                self.solver.solve(coll)
            return
        for chunk in coll.plans:
            self.chunk_queues.enqueue(rank, coll, chunk[0])

    def _claim(self, coll: Collective) -> bool:
        """Reserve the collective's links: one sender per link (closed form), or else the
        collective's flows as a whole (flow level). False when the network promises neither."""
        if self.closed_form:
            coll.claim = self.network.claim(self.planner.pairs(coll))
        if coll.claim is None and self.flow_level:
            runs = self.planner.flow_runs(coll, exact=bool(getattr(self.flow_network, "flow_exact", False)))
            if runs is not None:
                coll.claim = self.flow_network.claim_flows(runs)
                coll.flows = coll.claim is not None
        return coll.claim is not None

    def _note_waiting(self, rank: int, node_id: int, coll: Collective) -> None:
        """Time breakdown: a member waits for peers (from its issue on, see
        `collectives_start_waiting`) until every member has issued the collective."""
        members = coll.members
        release = self.context.comm_waiting
        if self.folding is not None:
            return        # FoldGuard releases the representatives once the group is ready
        if len(coll.nodes) < len(members):
            if coll.comm_type in ROOTED:
                algorithm = self.planner.algorithm(coll.comm_type, 0)
                if algorithm.only_sends(coll.comm_type, members.index(rank), members.index(coll.root),
                                        len(members)):
                    release(rank, node_id, False)
        else:
            self.context.comm_released(coll.nodes.items())

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
        return self.chunk_queues.break_cycle()

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

    def summary(self) -> JsonObject:
        unmatched = self.p2p.unmatched_sends()
        if self.folding is not None:   # each representative's row stands for its class's
            members, representative = self.folding.members, self.folding.representative
            ranks = len(representative)
            unmatched = sorted(({**row, "rank": mate, "peer": (row["peer"] + mate - row["rank"]) % ranks}
                                for row in unmatched for mate in members[representative[row["rank"]]]),
                               key=lambda row: (row["rank"], row["peer"], row["tag"], row["node"]))
        return {"unmatched_sends": unmatched, "oversubscribed_chunk_starts": self.chunk_queues.oversubscribed}
