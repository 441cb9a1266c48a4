"""Cluster networks any network layer may build and route on, so backends never import each other.

- `graph`: `Topology` (devices, switches, directed links as arrays) and its generators: ASTRA-sim's
  multi-dimensional lists (`from_dims`), fat-trees (`fat_tree`, `clos_fat_tree`), rail-optimized
  clusters (`rail_optimized`), dragonflies (`dragonfly`); `files`: edge lists and GraphML;
- `fabric`: fat-trees and rail-optimized clusters described arithmetically (`Clos`) and routed
  without tables (`FabricRouter`); `ecmp`: the ECMP hash and per-pair message counters;
  `routing`: dimension-order and shortest-path routers for the other shapes;
- `shapes`: the generators' settings as a manifest gives them (pydantic, validated on reading);
- `build`: a layer's `NetworkSource` built into a topology with its faults and router.

Network plugins import these names from `chakra_core.topology` (docs/api.md).
"""

from chakra_core.topology.build import (
    BuiltNetwork, NetworkSource, Router, build_network, build_topology, source_problems,
)
from chakra_core.topology.ecmp import PairCounter, ecmp_hash
from chakra_core.topology.fabric import Clos, FabricRouter, check_hosts, fat_tree_shape, k_ary_shape, rail_shape
from chakra_core.topology.files import from_file
from chakra_core.topology.graph import (
    Topology, clos_fat_tree, dragonfly, fat_tree, from_dims, gb_per_s_to_bpns, gib_per_s_to_bpns, rail_optimized,
)
from chakra_core.topology.routing import DimensionOrderRouter, ShortestPathRouter
from chakra_core.topology.shapes import DegradedLink, Dragonfly, FatTree, Generator, Latency, Npus, RailOptimized, Torus

__all__ = [
    "BuiltNetwork", "Clos", "DegradedLink", "DimensionOrderRouter", "Dragonfly", "FabricRouter", "FatTree", "Generator",
    "Latency", "NetworkSource", "Npus", "PairCounter", "RailOptimized", "Router", "ShortestPathRouter", "Topology",
    "Torus", "build_network", "build_topology", "check_hosts", "clos_fat_tree", "dragonfly", "ecmp_hash", "fat_tree",
    "fat_tree_shape", "from_dims", "from_file", "gb_per_s_to_bpns", "gib_per_s_to_bpns", "k_ary_shape", "rail_optimized",
    "rail_shape", "source_problems",
]
