"""The hbm layer's settings: local HBM, and the keys of an ASTRA-sim remote-memory JSON."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from chakra_core import PluginConfig

NO_EXPANSION: Final = "NO_MEMORY_EXPANSION"
PER_NODE: Final = "PER_NODE_MEMORY_EXPANSION"
PER_NPU: Final = "PER_NPU_MEMORY_EXPANSION"
POOL: Final = "MEMORY_POOL"
MemoryType = Literal["NO_MEMORY_EXPANSION", "PER_NODE_MEMORY_EXPANSION", "PER_NPU_MEMORY_EXPANSION",
                     "MEMORY_POOL"]

LOCATION_ATTR = "mem_location"
"""Node attribute ("local" or "remote") overriding memory-type for one node."""

GIB = 1 << 30


class HBMConfig(PluginConfig):
    """Local HBM keys, plus the keys of an ASTRA-sim remote-memory JSON (hyphenated aliases)."""

    bandwidth_gbps: PositiveFloat = Field(
        2000.0, allow_inf_nan=False,
        description="local HBM bandwidth per rank in GB/s (10^9 B/s); shared by the rank's concurrent "
                    "accesses; roofline compute reads it")
    latency_ns: NonNegativeFloat = Field(0.0, allow_inf_nan=False,
                                         description="fixed latency of a local access, ns")
    channels: PositiveInt = Field(
        1, description="local HBM channels: one access gets at most bandwidth/channels; n concurrent "
                       "accesses get bandwidth/max(n, channels) each")
    capacity_gib: PositiveFloat | None = Field(
        None, allow_inf_nan=False,
        description="HBM capacity per rank in GiB (2^30 B), checked against tracked tensors "
                    "(see oom); null = unlimited")
    memory_type: MemoryType = Field(
        NO_EXPANSION, alias="memory-type",
        description="where memory nodes go: NO_MEMORY_EXPANSION = local HBM; otherwise ASTRA-sim's "
                    "remote memory per node, per NPU, or one shared pool")
    remote_mem_latency: NonNegativeInt = Field(
        0, alias="remote-mem-latency",
        description="fixed latency of a remote access, ns (an integer, as ASTRA-sim reads it)")
    remote_mem_bw: PositiveFloat | None = Field(
        None, alias="remote-mem-bw", allow_inf_nan=False,
        description="remote memory bandwidth in bytes per ns (= GB/s, 10^9 B/s); required with an expansion")
    num_nodes: PositiveInt | None = Field(
        None, alias="num-nodes",
        description="nodes with one expansion memory each (PER_NODE_MEMORY_EXPANSION); "
                    "default: as many as the ranks need")
    num_npus_per_node: PositiveInt | None = Field(
        None, alias="num-npus-per-node",
        description="NPUs sharing one node's expansion memory (required by PER_NODE_MEMORY_EXPANSION)")
    pool_sharing: Literal["fifo", "fair"] = Field(
        "fifo", description="concurrent remote accesses: 'fifo' = ASTRA-sim (pool / per-node memory "
                            "serves one at a time, per-NPU memory all at once at full bandwidth); "
                            "'fair' = they share the pool's / node's / NPU's bandwidth")
    track_tensors: bool = Field(
        True, description="follow the tensors in nodes' inputs/outputs (IOInfo) to report peak memory, "
                          "a memory series and out-of-memory; cheap for traces without tensors")
    lifetime: Literal["trace", "issued"] = Field(
        "trace", description="when a storage is released: 'trace' = after the last node referencing it "
                             "(counted in a pre-pass over the rank's trace file); 'issued' = when no "
                             "issued, unfinished node references it (no pre-pass; a lower bound)")
    tensor_nodes: Literal["all", "cpu", "gpu"] = Field(
        "all", description="whose references make a storage live: 'all' nodes; 'cpu' = CPU operations "
                           "only (PyTorch's allocator: the host allocates and frees); 'gpu' = all but CPU "
                           "operations (kernels)")
    oom: Literal["warn", "fail"] = Field(
        "warn", description="when tracked tensors exceed capacity_gib: 'warn' once per rank and go on, "
                            "or 'fail' the run")
    count_host_tensors: bool = Field(
        False, description="also count tensors on device 'cpu' (host memory) towards HBM")
    series_points: int = Field(
        1000, ge=4, description="at most this many [time_ns, bytes] points per rank in memory_series "
                                "(max-preserving bucketing beyond it)")

    @model_validator(mode="after")
    def _remote_keys(self) -> "HBMConfig":
        if self.memory_type != NO_EXPANSION and self.remote_mem_bw is None:
            raise ValueError(f"memory-type {self.memory_type} needs remote-mem-bw (bytes per ns)")
        if self.memory_type == PER_NODE and self.num_npus_per_node is None:
            raise ValueError(f"memory-type {PER_NODE} needs num-npus-per-node")
        return self
