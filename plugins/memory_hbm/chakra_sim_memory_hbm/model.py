"""Memory loads and stores: local HBM, or ASTRA-sim's analytical remote memory.

Local access:   int(latency_ns + size / bandwidth_gbps) ns      (GB/s = 10^9 B/s = B/ns)
Remote access:  remote-mem-latency + int(size / (remote-mem-bw * 1e9) * 1e9) ns, in
                ASTRA-sim's arithmetic so its remote-memory files give identical numbers.

Remote queueing follows ASTRA-sim's AnalyticalRemoteMemory: a per-NPU expansion
serves every access at once; a per-node expansion (one queue per node) and a
memory pool (one queue) serve one access at a time, first come first served.
"""

from __future__ import annotations

from typing import Callable, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from chakra_core.errors import AttributeTypeError, SimulationError
from chakra_core.et.attrs import NodeView
from chakra_core.layers import LayerContext, MemoryModel, PluginConfig
from chakra_core.schema import pb

NO_EXPANSION = "NO_MEMORY_EXPANSION"
PER_NODE = "PER_NODE_MEMORY_EXPANSION"
POOL = "MEMORY_POOL"
MemoryType = Literal["NO_MEMORY_EXPANSION", "PER_NODE_MEMORY_EXPANSION", "PER_NPU_MEMORY_EXPANSION",
                     "MEMORY_POOL"]

LOCATION_ATTR = "mem_location"
"""Node attribute ("local" or "remote") overriding memory-type for one node."""


class HBMConfig(PluginConfig):
    """Local HBM keys, plus the keys of an ASTRA-sim remote-memory JSON (hyphenated aliases)."""

    bandwidth_gbps: PositiveFloat = Field(
        2000.0, description="local HBM bandwidth per rank in GB/s (10^9 B/s); roofline compute reads it")
    latency_ns: NonNegativeFloat = Field(0.0, description="fixed latency of a local access, ns")
    capacity_gib: PositiveFloat | None = Field(
        None, description="HBM capacity per rank in GiB (2^30 B); reported only, not tracked yet; "
                          "null = unlimited")
    memory_type: MemoryType = Field(
        NO_EXPANSION, alias="memory-type",
        description="where memory nodes go: NO_MEMORY_EXPANSION = local HBM; otherwise ASTRA-sim's "
                    "remote memory per node, per NPU, or one shared pool")
    remote_mem_latency: NonNegativeInt = Field(
        0, alias="remote-mem-latency",
        description="fixed latency of a remote access, ns (an integer, as ASTRA-sim reads it)")
    remote_mem_bw: PositiveFloat | None = Field(
        None, alias="remote-mem-bw",
        description="remote memory bandwidth in bytes per ns (= GB/s, 10^9 B/s); required with an expansion")
    num_nodes: PositiveInt | None = Field(
        None, alias="num-nodes",
        description="nodes with one expansion memory each (PER_NODE_MEMORY_EXPANSION); "
                    "default: as many as the ranks need")
    num_npus_per_node: PositiveInt | None = Field(
        None, alias="num-npus-per-node",
        description="NPUs sharing one node's expansion memory (required by PER_NODE_MEMORY_EXPANSION)")

    @model_validator(mode="after")
    def _remote_keys(self):
        if self.memory_type != NO_EXPANSION and self.remote_mem_bw is None:
            raise ValueError(f"memory-type {self.memory_type} needs remote-mem-bw (bytes per ns)")
        if self.memory_type == PER_NODE and self.num_npus_per_node is None:
            raise ValueError(f"memory-type {PER_NODE} needs num-npus-per-node")
        return self


class HBMMemory(MemoryModel):
    name = "hbm"
    fidelity = ("latency + size / bandwidth per access, local HBM or ASTRA-sim remote memory "
                "(per-NPU, per-node FIFO, pool FIFO); no bandwidth sharing, no capacity tracking")
    Config = HBMConfig

    def __init__(self, config: HBMConfig, context: LayerContext):
        super().__init__(config, context)
        self._scheduler = context.scheduler
        self._bw = config.bandwidth_gbps                    # bytes per ns
        self._latency = config.latency_ns
        self._remote_default = config.memory_type != NO_EXPANSION
        self._remote_latency = config.remote_mem_latency
        # bytes per second, as ASTRA-sim scales remote-mem-bw, for identical rounding
        self._remote_bps = None if config.remote_mem_bw is None else config.remote_mem_bw * 1e9
        self._npus_per_node = config.num_npus_per_node or 1
        if config.memory_type == PER_NODE and config.num_nodes is not None:
            capacity = config.num_nodes * self._npus_per_node
            if context.num_ranks > capacity:
                raise SimulationError(
                    f"memory plugin 'hbm': num-nodes {config.num_nodes} x num-npus-per-node "
                    f"{self._npus_per_node} = {capacity} NPUs, but the run has {context.num_ranks} ranks")
        self._free_at: dict[int, int] = {}     # remote queue -> time its last queued access ends
        self._loaded = [0] * context.num_ranks
        self._stored = [0] * context.num_ranks
        self.local_accesses = self.remote_accesses = 0
        self.queueing_delay_ns = self.queued_accesses = 0
        if config.capacity_gib is not None:
            context.warn("memory plugin 'hbm': capacity_gib is reported but not enforced "
                         "(capacity tracking is not implemented yet)")

    def bandwidth_gbps(self, rank: int) -> float:
        return self._bw

    def local_time_ns(self, size: int) -> int:
        """Duration of one local HBM access of `size` bytes."""
        return int(self._latency + size / self._bw)

    def remote_time_ns(self, size: int) -> int:
        """Duration of one remote access once served, as ASTRA-sim computes it."""
        if self._remote_bps is None:
            raise SimulationError("memory plugin 'hbm': remote access without remote-mem-bw")
        return self._remote_latency + int(size / self._remote_bps * 1e9)

    def _queue_of(self, rank: int) -> int | None:
        """The FIFO serving `rank`'s remote accesses, or None when they never wait."""
        memory_type = self.config.memory_type
        if memory_type == PER_NODE:
            return rank // self._npus_per_node
        if memory_type == POOL:
            return 0
        return None

    def access(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        size = self._size(rank, node)
        remote = self._remote_default
        if node.has(LOCATION_ATTR):
            remote = self._is_remote(rank, node)
        if node.type == pb.MEM_STORE_NODE:
            self._stored[rank] += size
        else:
            self._loaded[rank] += size
        if not remote:
            self.local_accesses += 1
            delay = self.local_time_ns(size)
        else:
            self.remote_accesses += 1
            delay = self.remote_time_ns(size)
            queue = self._queue_of(rank)
            if queue is not None:
                now = self._scheduler.now
                start = max(now, self._free_at.get(queue, 0))
                self._free_at[queue] = start + delay
                if start > now:
                    self.queueing_delay_ns += start - now
                    self.queued_accesses += 1
                    delay += start - now
        self._scheduler.schedule(delay, done, node.id)

    def _size(self, rank: int, node: NodeView) -> int:
        if not node.has("tensor_size"):
            raise SimulationError(f"rank {rank}, node {node.id} ({node.name!r}): {node.type_name} has no "
                                  "'tensor_size' attribute; memory plugin 'hbm' needs the bytes it moves")
        try:
            size = node.int("tensor_size")
        except AttributeTypeError as exc:
            raise SimulationError(f"rank {rank}: {exc}") from None
        if size < 0:
            raise SimulationError(f"rank {rank}, node {node.id} ({node.name!r}): tensor_size is {size}")
        return size

    def _is_remote(self, rank: int, node: NodeView) -> bool:
        try:
            location = node.str(LOCATION_ATTR).strip().lower()
        except AttributeTypeError as exc:
            raise SimulationError(f"rank {rank}: {exc}") from None
        if location == "local":
            return False
        if location != "remote":
            raise SimulationError(f"rank {rank}, node {node.id} ({node.name!r}): {LOCATION_ATTR} is "
                                  f"{location!r}; expected 'local' or 'remote'")
        if not self._remote_default:
            raise SimulationError(f"rank {rank}, node {node.id} ({node.name!r}) asks for remote memory, "
                                  f"but memory-type is {NO_EXPANSION}: set memory-type and remote-mem-bw")
        return True

    def summary(self) -> dict:
        return {
            "memory_type": self.config.memory_type,
            "bandwidth_gbps": self._bw,
            "capacity_gib": self.config.capacity_gib,
            "accesses": self.local_accesses + self.remote_accesses,
            "local_accesses": self.local_accesses,
            "remote_accesses": self.remote_accesses,
            "bytes_loaded": sum(self._loaded),
            "bytes_stored": sum(self._stored),
            "remote_queueing_delay_ns": self.queueing_delay_ns,
            "remote_queued_accesses": self.queued_accesses,
        }

    def rank_summary(self, rank: int) -> dict:
        return {"memory_bytes_loaded": self._loaded[rank], "memory_bytes_stored": self._stored[rank]}
