"""What NCCL's kernels in flight take from the GPU they run on: thread blocks and HBM bandwidth
(`SystemLayer.gpu_load`), so that a compute model can time kernels that run beside them.

- Thread blocks: NCCL launches one per channel (NVIDIA/nccl src/enqueue.cc at
  5067397c2676d5aed50042fc39e5c8ee96eb0027: `dim3 grid = {(unsigned)nChannels, 1, 1}`), from the
  moment the rank issues the collective, its peers there or not; the channels are those NCCL's
  choice runs (fewer for small messages). A collective Transformer Engine's userbuffers run says
  its own (`comm_ctas`). A send or receive takes NCCL's minimum of 2 channels per peer
  (src/graph/paths.cc ncclTopoGetNchannels: 2 per PCIe or network peer, more over NVLink: a
  lower bound).
- HBM: a reducing collective reads its input and the incoming chunk and writes the result (3
  bytes of HBM traffic per byte it moves), a copying one reads and writes (2): NCCL's ring
  primitives (src/device/all_reduce.h runRing: recvReduceSend, recvCopySend). Derived from the
  source, not measured; sends and receives are not counted. Together they make at most 3 bytes
  per byte the GPU's links carry (NVLink and its NICs), whatever static shares they were given.
- Both are counted from the issue (each start reported, `LayerContext.comm_started`, so that a
  compute model re-times the kernels already running beside it) for as long as the operation
  takes alone: what a rank's own kernels see depends on that rank's issues only, not on when its
  peers arrive nor on the order in which their issues reach the simulator at one instant (so a
  folded run sees what an unfolded one does, and a pipeline's stages are not coupled through it).
"""

from __future__ import annotations

from typing import Any, Callable

from chakra_core import NO_LOAD, GpuLoad, NodeView, Profile, pb
from chakra_sim_system_nccl.tuning import node_nic_gbps

P2P_CTAS = 2
REDUCING = frozenset({pb.ALL_REDUCE, pb.REDUCE_SCATTER, pb.REDUCE_SCATTER_BLOCK, pb.REDUCE, pb.BARRIER})


def hbm_bytes_per_byte(comm_type: int) -> int:
    return 3 if comm_type in REDUCING else 2


def link_gbps(profile: Profile, gpus_per_node: int) -> float:
    """What one GPU's links carry each way, GB/s: its NVLink and its share of the node's NICs."""
    return profile.gpu.nvlink_gbps.value + node_nic_gbps(profile) / gpus_per_node


class GpuFootprint:
    """Per rank: thread blocks and HBM traffic of the communication in flight."""

    def __init__(self, ranks: int, hbm_cap_gbps: float, started: Callable[[int], None] = lambda rank: None):
        self.started = started
        """Called with the rank an operation has just started on (LayerContext.comm_started)."""
        self.ctas = [0] * ranks
        self.hbm_gbps = [0.0] * ranks
        self.hbm_cap = hbm_cap_gbps
        # per rank: node id -> (ctas, GB/s, expected end in ns)
        self._held: list[dict[int, tuple[int, float, int]]] = [{} for _ in range(ranks)]
        # (type, size, id(members)) -> (members, (channels, GB/s, time alone)); members kept to check the id
        self._collectives: dict[tuple[int, int, int], tuple[tuple[int, ...], tuple[int, float, int]]] = {}

    def of_collective(self, comm_type: int, size: int, members: tuple[int, ...],
                      choose: Callable[[], Any]) -> tuple[int, float, int]:
        """NCCL's channels for a collective, its HBM traffic and its time alone in ns, from
        `choose()` (the layer's (Choice, name, bytes, moved) or None), once per group and size."""
        key = (comm_type, size, id(members))
        hit = self._collectives.get(key)
        if hit is None or hit[0] is not members:
            chosen = choose()
            value = (0, 0.0, 0)
            if chosen is not None:
                time_ns = max(1, int(round(chosen[0].time_us * 1000)))
                value = (chosen[0].channels, hbm_bytes_per_byte(comm_type) * chosen[3] / time_ns, time_ns)
            hit = self._collectives[key] = (members, value)
        return hit[1]

    def held(self, now: int, relabel: Callable[[int, int], int]) -> tuple[tuple[tuple[int, int, float, int], ...], ...]:
        """Per rank, what its operations in flight hold: (node through `relabel`, thread blocks,
        HBM GB/s, expected end relative to `now`)."""
        return tuple(tuple(sorted((relabel(rank, node_id), ctas, gbps, end - now)
                                  for node_id, (ctas, gbps, end) in held.items()))
                     for rank, held in enumerate(self._held))

    def message(self, rank: int, node: NodeView, now: int, alone_ns: int,
                done: Callable[[int], None]) -> Callable[[int], None]:
        """A send or receive holds P2P_CTAS for as long as it takes alone; returns its completion
        callback, which releases them first."""
        self.start(rank, node.id, P2P_CTAS, 0.0, now + alone_ns)

        def release(node_id: int) -> None:
            self.end(rank, node_id)
            done(node_id)
        return release

    def start(self, rank: int, node_id: int, ctas: int, gbps: float, end_ns: int) -> None:
        """An operation holds `ctas` thread blocks and makes `gbps` of HBM traffic until about
        `end_ns` (its issue plus its time alone)."""
        self._held[rank][node_id] = (ctas, gbps, end_ns)
        self.ctas[rank] += ctas
        self.hbm_gbps[rank] += gbps
        if ctas or gbps:
            self.started(rank)

    def end(self, rank: int, node_id: int) -> None:
        held = self._held[rank].pop(node_id, None)
        if held is not None:
            self.ctas[rank] -= held[0]
            self.hbm_gbps[rank] = max(0.0, self.hbm_gbps[rank] - held[1])

    def load(self, rank: int) -> GpuLoad:
        """Thread blocks and HBM traffic now (the traffic at most what the GPU's links can feed:
        operations in flight together share them), and when the first of them is expected to end."""
        held = self._held[rank]
        if not held:
            return NO_LOAD
        until = min(end for _, _, end in held.values())
        return GpuLoad(self.ctas[rank], min(self.hbm_gbps[rank], self.hbm_cap), until)
