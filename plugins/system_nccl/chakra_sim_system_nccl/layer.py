"""The `nccl` system layer: each collective takes the time NCCL's own cost model gives it.

Collectives match as in the built-in layer (the k-th collective a rank issues in a group
matches the k-th of every other member; type and size must agree). Once the last member has
issued it, the collective runs with the algorithm and protocol NCCL would pick for its size,
rank count and node count (chakra_sim_system_nccl.model), and every member finishes that long
after the last one joined. Ranks are numbered node by node, `gpus-per-node` to a node.

Sends and receives match by (src, dst, tag) as in the built-in layer; a message takes one NCCL
step's latency plus its size over the sender's NVLinks (same node) or NIC share (other node).

Not modelled: contention between collectives that overlap, or with point-to-point traffic
(each runs as if alone, as NCCL's own model assumes), and the network layer, which this layer
does not use.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from pydantic import Field, PositiveInt

from chakra_core import (
    LayerContext, MatchingSystem, NodeView, PluginConfig, SimulationError, ValidationInputs,
    collective_name, pb,
)
from chakra_core.comm.collectives import collective_wait
from chakra_core.comm.matcher import OpenCollective
from chakra_core.hardware.profiles import load_profile, profile_problems
from chakra_sim_system_nccl import model as nccl

_NCCL_NAME: dict[int, str] = {
    pb.ALL_REDUCE: nccl.ALL_REDUCE, pb.ALL_GATHER: nccl.ALL_GATHER, pb.REDUCE_SCATTER: nccl.REDUCE_SCATTER,
    pb.REDUCE_SCATTER_BLOCK: nccl.REDUCE_SCATTER, pb.ALL_TO_ALL: nccl.ALL_TO_ALL,
    pb.BROADCAST: nccl.BROADCAST, pb.REDUCE: nccl.REDUCE, pb.BARRIER: nccl.ALL_REDUCE,
}
BARRIER_BYTES = 4
"""PyTorch's NCCL barrier is an all-reduce of one float."""


class NcclSystemConfig(PluginConfig):
    profile: str = Field(..., description="hardware profile: a shipped name (chakra-sim profiles) or a "
                                          ".yaml file, relative to the manifest")
    gpus_per_node: PositiveInt | None = Field(
        None, alias="gpus-per-node", description="ranks per node; default: the profile's GPUs per node")


class _Pending(OpenCollective):
    """One collective, from its first member's issue until its last member's."""

    __slots__ = ()


class _P2PTiming:
    """What PointToPoint needs of a network (`npus_count`, `send`), timed by NCCL's point-to-point cost."""

    def __init__(self, system: "NcclSystem"):
        self.system = system
        self.npus_count = system.context.num_ranks

    def send(self, src: int, dst: int, size: int, on_arrival: Callable[[Any], None], arg: Any = None) -> None:
        system = self.system
        same_node = src // system.gpus_per_node == dst // system.gpus_per_node
        system.context.scheduler.schedule(_ns(system.model.p2p_time_us(size, same_node)), on_arrival, arg)


def _ns(time_us: float) -> int:
    return int(round(time_us * 1000))


class NcclSystem(MatchingSystem[_Pending]):
    name = "nccl"
    fidelity = ("NCCL's own cost model per collective (algorithm ring/tree/NVLS/NVLS-tree, protocol "
                "LL/LL128/Simple, channels) from a hardware profile; overlapping collectives and "
                "point-to-point traffic do not slow each other down; the network layer is not used")
    Config = NcclSystemConfig
    collectives_start_waiting = True
    needs_network = False

    def __init__(self, config: NcclSystemConfig, context: LayerContext):
        super().__init__(config, context)
        self.profile = load_profile(config.profile, context.base_dir)
        self.model = nccl.NcclModel(self.profile)
        self.gpus_per_node = config.gpus_per_node or self.profile.gpus_per_node
        n = context.num_ranks
        if n > self.gpus_per_node and self.profile.network is None:
            raise SimulationError(
                f"the run has {n} ranks but profile '{self.profile.name}' describes one node of "
                f"{self.gpus_per_node} GPUs and no network between nodes: choose a scale-out profile "
                "(chakra-sim profiles lists them) or set gpus-per-node")
        self.choices: Counter[tuple[str, str, str]] = Counter()
        self.choice_ns: Counter[tuple[str, str, str]] = Counter()
        self._setup_matching(context, _P2PTiming(self), _Pending)

    @classmethod
    def config_problems(cls, config: NcclSystemConfig, inputs: ValidationInputs) -> list[tuple[tuple[str | int, ...], str]]:
        return profile_problems(config.profile, inputs.base_dir)

    # Collectives ------------------------------------------------------------------------------------
    def issue_collective(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        coll = self._join(rank, node)
        coll.done[rank] = done
        self.open[rank][node.id] = coll
        if len(coll.nodes) == len(coll.members):
            self.matcher.close(coll)
            self._run(coll)

    def _run(self, coll: _Pending) -> None:
        n = len(coll.members)
        time_ns, per_rank_bytes = self._cost(coll, n)
        self.context.comm_released(coll.nodes.items())
        scheduler = self.context.scheduler
        for rank in coll.members:
            self.bytes_sent[rank] += per_rank_bytes
            self.bytes_received[rank] += per_rank_bytes
            scheduler.schedule(time_ns, self._finished, (rank, coll))

    def _cost(self, coll: _Pending, n: int) -> tuple[int, int]:
        """(duration in ns, bytes each member sends and receives, by nccl-tests' bus convention)."""
        if n < 2:
            return 0, 0
        nodes = len({rank // self.gpus_per_node for rank in coll.members})
        comm_type, size = coll.comm_type, coll.size
        if comm_type in (pb.GATHER, pb.SCATTER):   # the root exchanges S with every other member
            root_node = coll.root // self.gpus_per_node
            local = sum(1 for rank in coll.members if rank // self.gpus_per_node == root_node) - 1
            choice = self.model.fan_time_us(size * local, size * (n - 1 - local))
            name, moved = collective_name(comm_type).lower(), size * (n - 1) // n
        else:
            name = _NCCL_NAME[comm_type]
            nbytes = BARRIER_BYTES if comm_type == pb.BARRIER else size
            if comm_type == pb.ALL_GATHER:
                nbytes = size * n     # NCCL counts an all-gather by its output
            if nbytes == 0:
                return 0, 0
            choice = self.model.time_us(name, nbytes, n, nodes)
            moved = {nccl.ALL_REDUCE: 2 * (n - 1) * nbytes // n, nccl.BROADCAST: nbytes,
                     nccl.REDUCE: nbytes}.get(name, (n - 1) * nbytes // n)
        key = (name, choice.algorithm, choice.protocol)
        time_ns = _ns(choice.time_us)
        self.choices[key] += 1
        self.choice_ns[key] += time_ns
        return time_ns, moved

    def _finished(self, arg: tuple[int, _Pending]) -> None:
        rank, coll = arg
        node_id = coll.nodes[rank]
        del self.open[rank][node_id]
        self.collectives_done[rank] += 1
        coll.done[rank](node_id)

    # Reporting --------------------------------------------------------------------------------------
    def waits(self, rank: int) -> list[str]:
        out = []
        for node_id, coll in self.open[rank].items():
            missing = [r for r in coll.members if r not in coll.nodes]
            out.append(collective_wait(node_id, f"{collective_name(coll.comm_type)} of {coll.size} B", missing))
        out.extend(self.p2p.waits(rank))
        return out

    def summary(self) -> dict[str, Any]:
        return {"profile": self.profile.name, "gpus_per_node": self.gpus_per_node,
                "choices": [{"collective": c, "algorithm": a, "protocol": p, "count": self.choices[(c, a, p)],
                             "time_ns": self.choice_ns[(c, a, p)]} for c, a, p in sorted(self.choices)],
                "unmatched_sends": self.p2p.unmatched_sends()}

    def terminal_tables(self) -> list[tuple[str, list[str], list[list[str]]]]:
        if not self.choices:
            return []
        rows = [[c, a, p, str(self.choices[(c, a, p)]), f"{self.choice_ns[(c, a, p)] / 1e3:,.1f}"]
                for c, a, p in sorted(self.choices)]
        return [(f"NCCL algorithms chosen (profile {self.profile.name})",
                 ["collective", "algorithm", "protocol", "count", "time us (sum)"], rows)]
