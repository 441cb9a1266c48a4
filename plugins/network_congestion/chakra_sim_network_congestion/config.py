"""The congestion-aware network layer's configuration (`plugin: congestion`): the network as
ASTRA-sim's lists, a generator (fat_tree, rail_optimized, torus, dragonfly) or a file, the link
model, and faults."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from chakra_core import PluginConfig
from chakra_core.topology import (
    DegradedLink, Dragonfly, FatTree, Latency, NetworkSource, Npus, RailOptimized, Torus, check_hosts,
)

class CongestionConfig(PluginConfig):
    """Give the network as ASTRA-sim's lists, a `generator`, or a `topology_file`."""

    mode: Literal["fifo", "fair"] = Field(
        "fifo", description="fifo: per-link FIFO queues (ASTRA-sim congestion-aware); "
                            "fair: flow-level max-min fair sharing")
    forwarding: Literal["cut_through", "store_and_forward"] | None = Field(
        None, description="fifo: how a message crosses a switch: cut_through (pipelined: one latency per "
                          "hop, one serialisation at the slowest link) or store_and_forward (every hop "
                          "serialises the whole message, as ASTRA-sim's congestion-aware backend does); "
                          "default store_and_forward for ASTRA-sim's topology lists, cut_through otherwise. "
                          "fair is a fluid model and always cut-through")
    topology: list[Literal["Ring", "FullyConnected", "Switch"]] | None = Field(
        None, description="ASTRA-sim network YAML: building block per dimension")
    npus_count: list[Npus] | None = Field(None, description="NPUs per dimension")
    bandwidth: list[PositiveFloat] | None = Field(
        None, description="GB/s per dimension, GB = 2^30 bytes (ASTRA-sim convention)")
    latency: list[Latency] | None = Field(None, description="ns per link, per dimension")
    generator: FatTree | RailOptimized | Torus | Dragonfly | None = Field(
        None, discriminator="kind",
        description="fat_tree, rail_optimized, torus or dragonfly (bandwidth in GB/s, 10^9 B/s)")
    topology_file: str | None = Field(
        None, description="edge list (src dst bandwidth_gbps latency_ns [uni|bi] per line) or .graphml; "
                          "NPUs are the nodes named 0..N-1, other nodes are switches")
    failed_links: list[str] = Field(
        [], description="links no message takes, named as in the per-link statistics ('a->b'; 'a<->b': both "
                        "ways); routes avoid them (not on ASTRA-sim dimensions or torus, which route by "
                        "dimension order)")
    degraded_links: list[DegradedLink] = Field(
        [], description="links with less bandwidth: [{link: 'a->b', bandwidth_factor: 0.5}]")
    top_links: PositiveInt = Field(10, description="hottest links shown in the terminal summary")
    trace_messages: int = Field(
        0, ge=0, description="record the first N messages (endpoints, size, route, send and arrival "
                             "times) in results.json, for debugging routes (turns closed_form off)")
    closed_form: bool = Field(
        True, description="dimension-order routes (ASTRA-sim's lists, torus): time the collectives whose "
                          "links carry no other traffic (fair: and whose messages never share a link) in "
                          "closed form instead of message by message (same results, much faster); false "
                          "forces message by message")

    @model_validator(mode="after")
    def _one_source(self) -> "CongestionConfig":
        lists = [self.topology, self.npus_count, self.bandwidth, self.latency]
        given = sum(1 for x in (self.topology, self.generator, self.topology_file) if x is not None)
        if given != 1:
            raise ValueError("give exactly one of: topology/npus_count/bandwidth/latency lists, "
                             "generator, topology_file")
        if self.topology is not None:
            if any(x is None for x in lists):
                raise ValueError("topology, npus_count, bandwidth and latency go together")
            lengths = {len(x) for x in lists if x is not None}   # (none is None: checked above)
            if len(lengths) != 1:
                raise ValueError("topology, npus_count, bandwidth and latency need one entry per dimension")
            check_hosts(math.prod(self.npus_count or ()), "the network")
        if self.mode == "fair" and self.forwarding == "store_and_forward":
            raise ValueError("forwarding: store_and_forward applies to mode fifo; fair is a fluid model, "
                             "always cut-through")
        return self

    def source(self) -> NetworkSource:
        """The network these settings describe, for chakra_core.topology.build_network."""
        return NetworkSource(self.topology, self.npus_count, self.bandwidth, self.latency, self.generator,
                             self.topology_file, self.failed_links, self.degraded_links)

    @property
    def cut_through(self) -> bool:
        """Whether messages are pipelined through switches (see `forwarding`)."""
        if self.forwarding is None:
            return self.mode == "fair" or self.topology is None
        return self.forwarding == "cut_through"
