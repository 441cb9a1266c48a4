"""The network shapes a manifest may describe (a generator's settings, degraded links), checked
when the manifest is read; graph.py builds them."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, StrictInt, model_validator

from chakra_core.topology.fabric import check_hosts, fat_tree_shape, k_ary_shape, rail_shape

Latency = Annotated[float, Field(ge=0, le=1e12)]
"""ns; at most 1,000 s, far above any link: larger values are typos (or unit mix-ups)."""
Npus = Annotated[StrictInt, Field(gt=0)]
"""A count of NPUs: a whole number (YAML's `true` is not 1)."""


class FatTree(BaseModel):
    """A fat-tree: the k-ary one (`k`), or one of any size built from switches of a radix
    (`hosts`, `radix`); 2 or 3 tiers. See fabric.py for the shapes."""
    model_config = ConfigDict(extra="forbid")
    kind: Literal["fat_tree"]
    k: PositiveInt | None = Field(
        None, description="k-ary fat-tree: switch radix (even); 3 tiers: k^3/4 NPUs, 2 tiers: k^2/2")
    hosts: PositiveInt | None = Field(None, description="NPUs, any number (with radix, instead of k)")
    radix: PositiveInt | None = Field(None, description="ports per switch (with hosts)")
    tiers: Literal[2, 3] = Field(3, description="2: leaf-spine; 3: leaf (edge), aggregation and core switches in pods")
    bandwidth_gbps: PositiveFloat = Field(..., description="GB/s (10^9 B/s) per link")
    latency_ns: Latency = Field(..., description="ns per link")
    oversubscription: PositiveFloat = Field(
        1.0, description="leaf down:up ratio; k form: uplink bandwidth = bandwidth / this; hosts form: a leaf "
                         "has floor(radix * o / (o + 1)) host ports, the rest up")
    spine_oversubscription: PositiveFloat | None = Field(
        None, description="hosts form, 3 tiers: the aggregation switches' down:up port ratio (default 1)")
    spine_radix: PositiveInt | None = Field(None, description="hosts form, 2 tiers: ports per spine (default radix)")
    ecmp: Literal["hash", "dmodk"] | None = Field(
        None, description="how messages pick among equal-cost up-links: hash of (src, dst, n-th message), or "
                          "D-mod-k (dst + n); default dmodk for k with 3 tiers (as before), hash otherwise")

    @model_validator(mode="after")
    def _shape(self) -> "FatTree":
        if self.k is not None:
            if self.hosts is not None or self.radix is not None:
                raise ValueError("give k (a k-ary fat-tree) or hosts and radix (any size), not both")
            if self.spine_oversubscription is not None or self.spine_radix is not None:
                raise ValueError("spine_oversubscription and spine_radix go with hosts and radix; the k form "
                                 "oversubscribes by bandwidth (oversubscription)")
            k_ary_shape(self.k, self.tiers)
        elif self.hosts is None or self.radix is None:
            raise ValueError("give k (a k-ary fat-tree) or both hosts and radix (a fat-tree of any size)")
        else:
            fat_tree_shape(self.hosts, self.radix, self.tiers, self.oversubscription, self.spine_oversubscription,
                           self.spine_radix)
        return self


class RailOptimized(BaseModel):
    """A rail-optimized GPU cluster (NVIDIA DGX SuperPOD's compute fabric; see
    topology.rail_optimized): NVLink inside each node, NIC i of every node on rail i, spines."""
    model_config = ConfigDict(extra="forbid")
    kind: Literal["rail_optimized"]
    nodes: PositiveInt
    gpus_per_node: PositiveInt = Field(..., description="GPUs (NPUs) per node, one NIC each; NIC i goes to rail i")
    radix: PositiveInt = Field(..., description="ports per rail switch")
    oversubscription: PositiveFloat = Field(
        1.0, description="rail switch down:up ports: floor(radix * o / (o + 1)) nodes per rail switch, the rest up")
    spine_radix: PositiveInt | None = Field(
        None, description="ports per spine (default radix): bounds the rail switches of a spine plane")
    spine_planes: PositiveInt = Field(
        1, description="spine planes, each serving gpus_per_node / spine_planes consecutive rails")
    bandwidth_gbps: PositiveFloat = Field(..., description="GB/s (10^9 B/s) of a GPU's NIC link to its rail switch")
    latency_ns: Latency = Field(..., description="ns per NIC link")
    spine_bandwidth_gbps: PositiveFloat | None = Field(
        None, description="GB/s of rail switch-spine links (default bandwidth_gbps)")
    spine_latency_ns: Latency | None = Field(
        None, description="ns per rail switch-spine link (default latency_ns)")
    nvlink_bandwidth_gbps: PositiveFloat | None = Field(
        None, description="GB/s of each GPU's link to its node's NVSwitch, each way (needed for 2+ GPUs per node)")
    nvlink_latency_ns: Latency | None = Field(None, description="ns per NVLink hop")
    pxn: bool = Field(False, description="all cross-rail traffic between nodes first crosses NVLink to the GPU on "
                                         "the destination's rail (NCCL's PXN); else only across spine planes")
    ecmp: Literal["hash", "dmodk"] = Field(
        "hash", description="how messages pick a spine: hash of (src, dst, n-th message), or D-mod-k "
                            "(destination node + n)")

    @model_validator(mode="after")
    def _shape(self) -> "RailOptimized":
        if self.gpus_per_node > 1 and (self.nvlink_bandwidth_gbps is None or self.nvlink_latency_ns is None):
            raise ValueError("nvlink_bandwidth_gbps and nvlink_latency_ns are needed with 2 or more GPUs per node")
        rail_shape(self.nodes, self.gpus_per_node, self.radix, self.oversubscription, self.spine_radix,
                   self.spine_planes, self.pxn)
        return self


class Torus(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["torus"]
    dims: list[Npus] = Field(..., min_length=1, max_length=3, description="NPUs per dimension")
    bandwidth_gbps: PositiveFloat = Field(..., description="GB/s (10^9 B/s) per link")
    latency_ns: Latency = Field(..., description="ns per link")

    @model_validator(mode="after")
    def _size(self) -> "Torus":
        check_hosts(math.prod(self.dims), "the torus")
        return self


class Dragonfly(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["dragonfly"]
    groups: PositiveInt
    routers_per_group: PositiveInt
    hosts_per_router: PositiveInt
    global_links_per_router: PositiveInt
    bandwidth_gbps: PositiveFloat = Field(..., description="GB/s (10^9 B/s) of host and local links")
    latency_ns: Latency
    global_bandwidth_gbps: PositiveFloat | None = None
    global_latency_ns: Latency | None = None

    @model_validator(mode="after")
    def _size(self) -> "Dragonfly":
        check_hosts(self.groups * self.routers_per_group * self.hosts_per_router, "the dragonfly")
        return self


class DegradedLink(BaseModel):
    model_config = ConfigDict(extra="forbid")
    link: str = Field(..., description="a link's name as in the per-link statistics ('a->b'; 'a<->b': both ways)")
    bandwidth_factor: float = Field(..., gt=0, le=1, description="the fraction of its bandwidth the link keeps")


Generator = FatTree | RailOptimized | Torus | Dragonfly
