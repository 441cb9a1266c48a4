"""The built-in system layer's settings: the keys of ASTRA-sim's system JSON."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from chakra_core.comm.collectives import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER
from chakra_core.contract.layers import PluginConfig
from chakra_core.schema import pb


class NativeSystemConfig(PluginConfig):
    """Keys of ASTRA-sim's system JSON (hyphenated or with underscores), plus chakra-sim's rooted ones."""

    scheduling_policy: Literal["LIFO", "FIFO"] = Field(
        "LIFO", alias="scheduling-policy",
        description="order of waiting chunks of different collectives on a dimension")
    endpoint_delay: NonNegativeInt = Field(
        10, alias="endpoint-delay", description="ns added at each endpoint for every message step")
    active_chunks_per_dimension: PositiveInt = Field(
        1, alias="active-chunks-per-dimension", description="chunks in flight per rank and dimension")
    preferred_dataset_splits: PositiveInt = Field(
        1, alias="preferred-dataset-splits", le=1 << 20,
        description="chunks a collective is split into (at most 2^20: each chunk is planned and timed)")
    all_reduce_implementation: list[str] = Field(
        ["ring"], alias="all-reduce-implementation",
        description="algorithm per network dimension: ring, direct[<window>], halvingDoubling, "
                    "doubleBinaryTree, oneRing, oneDirect[<window>], oneHalvingDoubling")
    all_gather_implementation: list[str] = Field(
        ["ring"], alias="all-gather-implementation", description="algorithm per network dimension")
    reduce_scatter_implementation: list[str] = Field(
        ["ring"], alias="reduce-scatter-implementation", description="algorithm per network dimension")
    all_to_all_implementation: list[str] = Field(
        ["ring"], alias="all-to-all-implementation", description="algorithm per network dimension")
    broadcast_implementation: list[str] = Field(
        ["chain"], alias="broadcast-implementation",
        description="chain (pipelined along the ring) or star (root to every member); chakra-sim only")
    reduce_implementation: list[str] = Field(["chain"], alias="reduce-implementation",
                                             description="chain or star; chakra-sim only")
    gather_implementation: list[str] = Field(["chain"], alias="gather-implementation",
                                             description="chain or star; chakra-sim only")
    scatter_implementation: list[str] = Field(["chain"], alias="scatter-implementation",
                                              description="chain or star; chakra-sim only")
    local_mem_bw: PositiveFloat = Field(
        1600.0, alias="local-mem-bw",
        description="GB/s (10^9 B/s); a reducing step costs 3 x int(bytes / local-mem-bw) ns")
    collective_optimization: Literal["baseline", "localBWAware"] = Field(
        "baseline", alias="collective-optimization",
        description="localBWAware: multi-dimensional all-reduce as reduce-scatter, all-reduce, "
                    "all-gather; baseline: an all-reduce per dimension")
    local_reduction_delay: NonNegativeInt = Field(
        1, alias="local-reduction-delay",
        description="ASTRA-sim uses it only in its shared-bus (LogGP) model, which neither it by "
                    "default nor chakra-sim models; accepted for compatibility, no effect")
    rendezvous_protocol: bool = Field(
        False, alias="rendezvous-protocol",
        description="point-to-point sends wait for the receiver (an 8 KiB control message first), "
                    "as ASTRA-sim's --rendezvous-protocol")


IMPL_FIELD: dict[int, str] = {
    ALL_REDUCE: "all_reduce_implementation",
    ALL_GATHER: "all_gather_implementation",
    REDUCE_SCATTER: "reduce_scatter_implementation",
    ALL_TO_ALL: "all_to_all_implementation",
    pb.BROADCAST: "broadcast_implementation",
    pb.REDUCE: "reduce_implementation",
    pb.GATHER: "gather_implementation",
    pb.SCATTER: "scatter_implementation",
}
# Collective types that run as another one.
RUNS_AS: dict[int, int] = {pb.REDUCE_SCATTER_BLOCK: REDUCE_SCATTER, pb.BARRIER: ALL_REDUCE}
