"""The `nccl` system layer: each collective runs with the algorithm, protocol and channels NCCL's cost
model chooses and takes the time of what NCCL then executes (chakra_sim_system_nccl.model, .execution),
on its communicator's share of the node's fabrics, launched as the config's `launch` says.

Collectives match as in the built-in layer (the k-th collective a rank issues in a group
matches the k-th of every other member; type and size must agree). Once the last member has
issued it, the collective runs with the algorithm and protocol NCCL would pick for its size, rank
count, node count and NIC share (chakra_sim_system_nccl.model), and every member finishes that long
after the last one joined. Ranks are numbered node by node, `gpus-per-node` to a node.

Sends and receives match by (src, dst, tag) as in the built-in layer; a message takes one NCCL
step's latency plus its size over the sender's NVLinks (same node) or NIC share (other node).

Sharing (chakra_sim_system_nccl.sharing): a communicator reaches the NICs of its own GPUs'
rails only, and collectives and messages in flight at once on NVLink or on the NICs divide
that fabric's bandwidth (a static share fixed when each starts).

On a network (a `network:` section; chakra_sim_system_nccl.traffic): what crosses nodes goes
through the network layer as flows, which share its links as its model says (instead of the
static NIC share); an operation ends when NCCL's time alone says, or its latency after its last
flow got through, whichever is later. On an idle network as fast as the profile's NICs the
times are those without a network.

Folding (chakra_sim_system_nccl.folded): with `RunInputs.folding` only representatives issue nodes; a
collective is ready when every member's representative has issued its counterpart, and times and
bytes are those of the unfolded run.

Not modelled without a network: shares revised as operations start and finish.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Callable, Hashable, NamedTuple, Sequence

from pydantic import Field, PositiveInt, SerializerFunctionWrapHandler, model_serializer

from chakra_core import (
    FoldView, GpuLoad, JsonObject, LayerContext, MatchingSystem, NodeView, OpenCollective, PluginConfig, SimulationError,
    Unfold, ValidationInputs, collective_name, collective_wait, even_pieces, load_profile, pb, profile_problems,
)
from chakra_sim_system_nccl import model as nccl
from chakra_sim_system_nccl.folded import Fact, FoldedMatching
from chakra_sim_system_nccl.footprint import GpuFootprint, link_gbps
from chakra_sim_system_nccl.p2p_timing import P2PTiming, apart as _apart, ns as _ns
from chakra_sim_system_nccl.section import NCCL_KEY, NcclSpec, communicator_bytes, nccl_of
from chakra_sim_system_nccl.sharing import NIC, FabricLoad, GroupShape, group_shape
from chakra_sim_system_nccl.traffic import NetworkTraffic, collective_flows
from chakra_sim_system_nccl.tuning import AlgorithmName, ProtocolName
from chakra_sim_system_nccl.uneven import moved_pieces, uneven_all_to_all

# A collective is one operation of one communicator group: 8 data-parallel groups each
# all-reducing once are 8 operations of one trace node. Said wherever the counts are shown.
CHOICES_COUNTED = ("count: collective operations, one per communicator group that runs one (not per rank, "
                   "not per trace node: an all-reduce run by 8 groups counts 8); time: their durations summed")

_NCCL_NAME: dict[int, str] = {
    pb.ALL_REDUCE: nccl.ALL_REDUCE, pb.ALL_GATHER: nccl.ALL_GATHER, pb.REDUCE_SCATTER: nccl.REDUCE_SCATTER,
    pb.REDUCE_SCATTER_BLOCK: nccl.REDUCE_SCATTER, pb.ALL_TO_ALL: nccl.ALL_TO_ALL,
    pb.BROADCAST: nccl.BROADCAST, pb.REDUCE: nccl.REDUCE, pb.BARRIER: nccl.ALL_REDUCE,
}
BARRIER_BYTES = 4
"""PyTorch's NCCL barrier is an all-reduce of one float."""


class LaunchConfig(PluginConfig):
    """How the host launches each collective (nccl-tests prints it in its header)."""

    gpus_per_thread: PositiveInt = Field(
        1, description="GPUs one host thread drives (nccl-tests -g): their kernels launch one after the "
                       "other; training frameworks run one process per GPU (1)")
    cuda_graph: bool = Field(
        False, description="collectives replayed from a CUDA graph (nccl-tests -G, CUDA-graphed training "
                           "steps): no per-collective launch on the host")


class NcclSystemConfig(PluginConfig):
    profile: str = Field(..., description="hardware profile: a shipped name (chakra-sim profiles) or a "
                                          ".yaml file, relative to the manifest")
    gpus_per_node: PositiveInt | None = Field(
        None, alias="gpus-per-node", description="ranks per node; default: the profile's GPUs per node")
    launch: LaunchConfig = Field(default_factory=LaunchConfig, description="how the host launches collectives")
    algorithms: list[AlgorithmName] | None = Field(
        None, min_length=1, description="NCCL_ALGO: the algorithms NCCL may choose among (ring, tree, nvls, "
                                        "nvls_tree); default: all it supports. A collective left with none is an "
                                        "error, as in NCCL")
    protocols: list[ProtocolName] | None = Field(
        None, min_length=1, description="NCCL_PROTO: the protocols NCCL may choose among (LL, LL128, Simple); "
                                        "default: all")
    nccl_version: str | None = Field(
        None, pattern=r"^\d+\.\d+(\.\d+)?$",
        description="the NCCL release whose tuner chooses algorithms and protocols (its tables differ by "
                    "release, e.g. 2.24.3); default: the newest modelled. The time is what the hardware "
                    "executes, whichever release chose")

    @model_serializer(mode="wrap")
    def _echo(self, handler: SerializerFunctionWrapHandler) -> object:
        # unforced, the echo (results.json's manifest) is as before NCCL_ALGO / NCCL_PROTO were settings
        data = handler(self)
        if isinstance(data, dict):
            for key in ("algorithms", "protocols"):
                if data.get(key) is None:
                    data.pop(key, None)
        return data

    def version(self) -> tuple[int, int, int] | None:
        """`nccl_version` as (major, minor, patch)."""
        if self.nccl_version is None:
            return None
        parts = [int(part) for part in self.nccl_version.split(".")] + [0]
        return parts[0], parts[1], parts[2]


class _Pending(OpenCollective):
    """One collective, from its first member's issue until its last member's."""

    __slots__ = ("needs",)

    def __init__(self, group: str, seq: int, comm_type: int, size: int, members: tuple[int, ...],
                 first_rank: int, root: int):
        super().__init__(group, seq, comm_type, size, members, first_rank, root)
        self.needs: set[Fact] | None = None
        """Folded runs: the representatives' issues it still waits for (FoldedMatching)."""


class _Cost(NamedTuple):
    """What NCCL's model says of one collective."""

    time_ns: int          # alone on the network (or at its static share of the fabric)
    per_rank: int         # bytes each member sends and receives (nccl-tests' bus convention)
    nbytes: int           # the buffer NCCL counts (an all-gather's output)
    latency_ns: int       # the part that does not scale with the size
    algorithm: str
    key: tuple[str, str, str]   # (collective, algorithm, protocol) in the choice table


def _shown(members: Sequence[int]) -> str:
    return str(list(members)) if len(members) <= 8 else f"[{', '.join(map(str, members[:8]))}, ...]"



class NcclSystem(MatchingSystem[_Pending]):
    name = "nccl"
    fidelity = ("NCCL's own cost model per collective (algorithm ring/tree/NVLS/NVLS-tree, protocol "
                "LL/LL128/Simple, channels) from a hardware profile; each communicator drives its own "
                "GPUs' share of the NICs; collectives and point-to-point messages in flight together "
                "share NVLink or the NICs (a fair share fixed when each starts); with a network layer, "
                "what crosses nodes goes through it as flows")
    Config = NcclSystemConfig
    collectives_start_waiting = True
    reports_comm_starts = True   # footprint.py
    needs_network = False
    fold_safe = True
    time_fold_safe = True   # without a network layer (__init__): in-flight operations' load and footprint

    def __init__(self, config: NcclSystemConfig, context: LayerContext):
        super().__init__(config, context)
        self.profile = load_profile(config.profile, context.base_dir)
        self.model = nccl.NcclModel(self.profile, config.launch.gpus_per_thread, config.launch.cuda_graph,
                                    config.version(), config.algorithms, config.protocols)
        self.gpus_per_node = config.gpus_per_node or self.profile.gpus_per_node
        n = context.num_ranks
        if n > self.gpus_per_node and self.profile.network is None:
            raise SimulationError(
                f"the run has {n} ranks but profile '{self.profile.name}' describes one node of "
                f"{self.gpus_per_node} GPUs and no network between nodes: choose a scale-out profile "
                "(chakra-sim profiles lists them) or set gpus-per-node")
        self.choices: Counter[tuple[str, str, str]] = Counter()
        self.choice_ns: Counter[tuple[str, str, str]] = Counter()
        self.load = FabricLoad(n)
        self.footprint = GpuFootprint(n, 3 * link_gbps(self.profile, self.gpus_per_node), context.comm_started)
        network = context.network
        self.internode = None if network is None else NetworkTraffic(network, context.scheduler)
        self.mirrors_folded_traffic = network is not None
        self.time_fold_safe = network is None   # the flows a network layer times are its own state
        self._shapes: dict[int, tuple[tuple[int, ...], GroupShape, tuple[int, ...], tuple[int, ...]]] = {}
        self._setup_matching(context, P2PTiming(self), _Pending)
        self.folding = context.inputs.folding
        self.representative: list[int] | range = range(n)
        self.folded: FoldedMatching | None = None
        if self.folding is not None:
            self.representative = self.folding.representative
            self.folded = FoldedMatching(self.folding, n, self.shape, self.same_node,
                                         context.request_restart, self._ready)
            self.p2p.fold = self.folded.fold_p2p

    def same_node(self, a: int, b: int) -> bool:
        return a // self.gpus_per_node == b // self.gpus_per_node

    def shape(self, members: tuple[int, ...]) -> GroupShape:
        return self._group(members)[1]

    def _group(self, members: tuple[int, ...]) -> tuple[tuple[int, ...], GroupShape, tuple[int, ...], tuple[int, ...]]:
        """(members, their shape, the representatives to look up in-flight operations at, the
        members that are representatives: where this group's operations are recorded)."""
        hit = self._shapes.get(id(members))
        if hit is None or hit[0] is not members:
            rep = self.representative
            hit = self._shapes[id(members)] = (
                members, group_shape(members, self.gpus_per_node), tuple(sorted({rep[m] for m in members})),
                tuple(m for m in members if rep[m] == m))
        return hit

    @classmethod
    def config_problems(cls, config: NcclSystemConfig, inputs: ValidationInputs) -> list[tuple[tuple[str | int, ...], str]]:
        problems = profile_problems(config.profile, inputs.base_dir)
        if not problems and load_profile(config.profile, inputs.base_dir).section(NCCL_KEY, NcclSpec) is None:
            problems.append((("profile",), f"profile '{config.profile}' has no nccl section (docs/hardware.md)"))
        return problems

    @classmethod
    def communicator_memory_bytes(cls, config: NcclSystemConfig, base_dir: Path) -> int:
        return communicator_bytes(nccl_of(load_profile(config.profile, base_dir)))

    # Collectives ------------------------------------------------------------------------------------
    def issue_collective(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        coll = self._join(rank, node)
        if coll.splits is not None and self.folded is not None and not even_pieces(coll.splits.get(rank)):
            # uneven pieces are each member's own: no rank stands for another
            reason = (f"rank {rank}'s node {node.id} is an all-to-all with pieces of its own (comm_send_splits): "
                      "simulating every rank")
            self.context.request_restart(reason, Unfold(reason))
            return
        coll.done[rank] = done
        ctas, hbm, alone = self._footprint(coll)
        if node.has("comm_ctas"):   # run by Transformer Engine's userbuffers, on their own thread blocks
            ctas = node.int("comm_ctas")
        self.footprint.start(rank, node.id, ctas, hbm, self.context.scheduler.now + alone)
        self.open[rank][node.id] = coll
        if self.folded is not None:
            self.folded.issue(rank, coll)
        elif len(coll.nodes) == len(coll.members):
            self._ready(coll)

    def _ready(self, coll: _Pending) -> None:
        """Every member has issued it (folded: every member's representative its counterpart)."""
        self.matcher.close(coll)
        _, shape, look_up, record = self._group(coll.members)
        scheduler = self.context.scheduler
        now = scheduler.now
        on_network = self.internode is not None and shape.fabric == NIC   # the network shares the NICs
        others = 0 if on_network else self.load.others(shape.fabric, look_up, now)
        weight = 1 if self.folded is None else self.folded.weight(coll.members)
        cost = self._cost(coll, len(coll.members), shape, others, weight)
        time_ns, per_rank_bytes = cost.time_ns, cost.per_rank
        if not on_network:
            self.load.add(shape.fabric, record, now, now + time_ns)
        self.context.comm_released(coll.nodes.items())
        simulated = coll.members if self.folded is None else [m for m in coll.members if m in coll.nodes]
        for rank in simulated:    # folded: the representatives among the members
            sent, received = (per_rank_bytes, per_rank_bytes) if coll.splits is None \
                else moved_pieces(coll.members, coll.splits, rank)
            self.bytes_sent[rank] += sent
            self.bytes_received[rank] += received
        if on_network and cost.nbytes:
            assert self.internode is not None
            groups = [coll.members] if self.folded is None else self.folded.groups(coll.members)
            flows = [collective_flows(coll.comm_type, cost.algorithm, group,
                                      group[coll.members.index(coll.root)] if coll.root in coll.members else -1,
                                      cost.nbytes, per_rank_bytes, self.gpus_per_node, coll.splits) for group in groups]
            self.internode.run(flows, lambda finishes: self._crossed(coll, simulated, groups, now, cost, weight,
                                                                   finishes))
            return
        for rank in simulated:
            scheduler.schedule(time_ns, self._finished, (rank, coll))

    def _crossed(self, coll: _Pending, simulated: Sequence[int], groups: Sequence[tuple[int, ...]], start: int,
                 cost: "_Cost", weight: int, finishes: list[int]) -> None:
        """A collective's inter-node flows have all arrived: it ends when NCCL's time alone says,
        or its latency after the network delivered its last byte, whichever is later."""
        if _apart(self.context, lambda i: f"group {_shown(groups[i])}", start, finishes):
            return
        end = max(start + cost.time_ns, finishes[0] + cost.latency_ns)
        self.choice_ns[cost.key] += (end - start - cost.time_ns) * weight
        schedule_at = self.context.scheduler.schedule_at
        for rank in simulated:
            schedule_at(end, self._finished, (rank, coll))

    def _cost(self, coll: _Pending, n: int, shape: GroupShape, others: int, weight: int) -> "_Cost":
        """Its duration sharing its fabric with `others` operations in flight, the bytes each
        member sends and receives (by nccl-tests' bus convention), and NCCL's choice; counted
        in the choices `weight` times (the groups a folded collective stands for)."""
        if coll.splits is not None and len(coll.splits) == len(coll.members):   # pieces of its own (uneven.py)
            chosen = uneven_all_to_all(self.model, self.same_node, coll.members, coll.splits, coll.size)
        else:
            chosen = self._choose(coll.comm_type, coll.size, coll.members, coll.root, shape)
        if chosen is None:
            return _Cost(0, 0, 0, 0, "", ("", "", ""))
        choice, name, nbytes, moved = chosen
        key = (name, choice.algorithm, choice.protocol)
        time_ns = _ns(choice.time_us)
        if others:   # the bandwidth term, at its share of the fabric
            time_ns = _ns(choice.latency_us + (choice.time_us - choice.latency_us) * (1 + others))
        self.choices[key] += weight
        self.choice_ns[key] += time_ns * weight
        return _Cost(time_ns, moved, nbytes, _ns(choice.latency_us), choice.algorithm, key)

    def _choose(self, comm_type: int, size: int, members: Sequence[int], root: int,
                shape: GroupShape) -> tuple[nccl.Choice, str, int, int] | None:
        """NCCL's choice for a collective alone, the collective's name and the buffer NCCL counts,
        and what each member moves; None when nothing moves."""
        n = len(members)
        if n < 2:
            return None
        if comm_type in (pb.GATHER, pb.SCATTER):   # the root exchanges S with every other member
            root_node = root // self.gpus_per_node
            local = sum(1 for rank in members if rank // self.gpus_per_node == root_node) - 1
            choice = self.model.fan_time_us(size * local, size * (n - 1 - local), n - 1 - local)
            return choice, collective_name(comm_type).lower(), size, size * (n - 1) // n
        name = _NCCL_NAME[comm_type]
        nbytes = BARRIER_BYTES if comm_type == pb.BARRIER else size
        if comm_type == pb.ALL_GATHER:
            nbytes = size * n     # NCCL counts an all-gather by its output
        if nbytes == 0:
            return None
        choice = self.model.time_us(name, nbytes, n, shape.nodes, shape.nic_share)
        moved = {nccl.ALL_REDUCE: 2 * (n - 1) * nbytes // n, nccl.BROADCAST: nbytes,
                 nccl.REDUCE: nbytes}.get(name, (n - 1) * nbytes // n)
        return choice, name, nbytes, moved

    def idle_collective_ns(self, comm_type: int, size: int, members: Sequence[int]) -> int | None:
        """A collective's time with nothing else in flight and its last member already there: a
        lower bound on it in any run (the static share and the network only add to it)."""
        chosen = self._choose(comm_type, size, members, members[0] if members else 0,
                              group_shape(members, self.gpus_per_node))
        return 0 if chosen is None else _ns(chosen[0].time_us)

    def _footprint(self, coll: _Pending) -> tuple[int, float, int]:
        """What the collective's kernel takes from each member's GPU (footprint.py)."""
        return self.footprint.of_collective(coll.comm_type, coll.size, coll.members, lambda: self._choose(
            coll.comm_type, coll.size, coll.members, coll.root, self.shape(coll.members)))

    def issue_send(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        super().issue_send(rank, node, self.footprint.message(rank, node, self.context.scheduler.now, self._p2p_ns(rank, node), done))

    def issue_recv(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        super().issue_recv(rank, node, self.footprint.message(rank, node, self.context.scheduler.now, self._p2p_ns(rank, node), done))

    def _p2p_ns(self, rank: int, node: NodeView) -> int:
        """A message's time alone (the time its thread blocks are held)."""
        same = self.same_node(node.int("comm_src", rank), node.int("comm_dst", rank))
        return _ns(self.model.p2p_latency_us(same) + node.int("comm_size", 0) / (1000 * self.model.p2p_bandwidth_gbps(same)))

    def gpu_load(self, rank: int) -> GpuLoad:
        return self.footprint.load(rank)

    def _finished(self, arg: tuple[int, _Pending]) -> None:
        rank, coll = arg
        node_id = coll.nodes[rank]
        self.footprint.end(rank, node_id)
        del self.open[rank][node_id]
        self.collectives_done[rank] += 1
        coll.done[rank](node_id)

    # Reporting --------------------------------------------------------------------------------------
    def waits(self, rank: int) -> list[str]:
        out = []
        for node_id, coll in self.open[rank].items():
            if coll.needs is not None:   # folded: the representatives whose side is missing
                missing = sorted({fact[0] for fact in coll.needs})
            else:
                missing = [r for r in coll.members if r not in coll.nodes]
            out.append(collective_wait(node_id, f"{collective_name(coll.comm_type)} of {coll.size} B", missing))
        out.extend(self.p2p.waits(rank))
        return out

    # Time folding (chakra_core.contract.time_folding) ----------------------------------------------
    def time_fold_state(self, now: int, view: FoldView) -> Hashable:
        """The fabric load and thread blocks of the operations in flight, relative to `now`."""
        return self.load.in_flight(now), self.footprint.held(now, view.relabel)

    def statistics_snapshot(self) -> object:
        return super().statistics_snapshot(), Counter(self.choices), Counter(self.choice_ns)

    def advance_statistics(self, periods: int, before: object, after: object) -> None:
        assert isinstance(before, tuple) and isinstance(after, tuple)
        super().advance_statistics(periods, before[0], after[0])
        for counts, first, second in zip((self.choices, self.choice_ns), before[1:], after[1:]):
            for key, value in second.items():
                counts[key] += periods * (value - first.get(key, 0))

    def summary(self) -> JsonObject:
        return {"profile": self.profile.name, "gpus_per_node": self.gpus_per_node,
                "choices": [{"collective": c, "algorithm": a, "protocol": p, "count": self.choices[(c, a, p)],
                             "time_ns": self.choice_ns[(c, a, p)]} for c, a, p in sorted(self.choices)],
                "choices_counted": CHOICES_COUNTED,
                "unmatched_sends": self._unmatched()}

    def _unmatched(self) -> list[dict[str, int]]:
        """Sends nobody received; in folded runs each representative's stands for its class's."""
        unmatched = self.p2p.unmatched_sends()
        if self.folding is None:
            return unmatched
        members, representative = self.folding.members, self.folding.representative
        ranks = len(representative)
        return sorted(({**row, "rank": mate, "peer": (row["peer"] + mate - row["rank"]) % ranks}
                       for row in unmatched for mate in members[representative[row["rank"]]]),
                      key=lambda row: (row["rank"], row["peer"], row["tag"], row["node"]))

    def terminal_tables(self) -> list[tuple[str, list[str], list[list[str]]]]:
        if not self.choices:
            return []
        rows = [[c, a, p, str(self.choices[(c, a, p)]), f"{self.choice_ns[(c, a, p)] / 1e3:,.1f}"]
                for c, a, p in sorted(self.choices)]
        return [(f"NCCL algorithms chosen (profile {self.profile.name}); {CHOICES_COUNTED}",
                 ["collective", "algorithm", "protocol", "operations (per group)", "time µs (sum over groups)"],
                 rows)]
