"""Explicit network graphs: NPUs, switches and directed links, compiled to arrays.

Sources of a topology:

- ASTRA-sim's multi-dimensional spec (`topology`, `npus_count`, `bandwidth`,
  `latency` lists): each dimension's slices become rings (bidirectional links
  between neighbours), fully connected groups (a directed link per pair) or a
  switch (one switch device per slice, bidirectional NPU-switch links), as
  ASTRA-sim's congestion-aware backend builds them;
- generators: fat-trees (the k-ary one, or any size from a switch radix, 2 or
  3 tiers, with oversubscription), rail-optimized GPU clusters (NVLink inside
  a node, a rail network per GPU index, spines), torus (2D/3D: a
  multi-dimensional ring spec), dragonfly; the fat-trees and rail-optimized
  clusters also describe themselves arithmetically (`Topology.fabric`, see
  fabric.py) for routing without tables;
- a file (topology_files.py): an edge list (`src dst bandwidth_gbps latency_ns [uni]` per
  line) or GraphML (edge attributes `bandwidth_gbps`, `latency_ns`).

NPUs are devices 0..N-1; switches follow. Bandwidth is stored in bytes per ns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from chakra_core.topology.fabric import Clos, fat_tree_shape, k_ary_shape, rail_shape

GIB = 1 << 30


def gib_per_s_to_bpns(bandwidth: float) -> float:
    """ASTRA-sim network GB/s (GB = 2^30 bytes) to bytes per ns, rounded the way it does."""
    return bandwidth * GIB / 1_000_000_000


def gb_per_s_to_bpns(bandwidth: float) -> float:
    """GB/s with GB = 10^9 bytes (files and generators) to bytes per ns."""
    return float(bandwidth)


@dataclass
class Topology:
    """Devices and directed links; `dims` describes NPU coordinates for dimension-order routing."""

    npus: int
    names: list[str] = field(default_factory=list)                  # device names
    link_src: list[int] = field(default_factory=list)
    link_dst: list[int] = field(default_factory=list)
    link_bw: list[float] = field(default_factory=list)              # bytes per ns
    link_latency: list[float] = field(default_factory=list)         # ns
    out: list[dict[int, int]] = field(default_factory=list)         # device -> {neighbour: link}
    dims: list[tuple[str, int, float, float]] = field(default_factory=list)
    """(building block, size, bandwidth GB/s as given, latency) per dimension; empty for graphs."""
    switch_of: dict[tuple[int, int], int] = field(default_factory=dict)  # (dim, slice base) -> switch
    source: str = "spec"
    fabric: Clos | None = None
    """Generated fat-trees and rail-optimized clusters: their shape and link ids per switch port."""

    @property
    def devices(self) -> int:
        return len(self.names)

    def add_device(self, name: str) -> int:
        self.names.append(name)
        self.out.append({})
        return len(self.names) - 1

    def connect(self, src: int, dst: int, bw_bpns: float, latency: float) -> int:
        existing = self.out[src].get(dst)
        if existing is not None:
            return existing
        link = len(self.link_src)
        self.link_src.append(src)
        self.link_dst.append(dst)
        self.link_bw.append(bw_bpns)
        self.link_latency.append(latency)
        self.out[src][dst] = link
        return link

    def link_name(self, link: int) -> str:
        return f"{self.names[self.link_src[link]]}->{self.names[self.link_dst[link]]}"


def from_dims(topologies: Sequence[str], npus_count: Sequence[int], bandwidth: Sequence[float],
              latency: Sequence[float]) -> Topology:
    """Expand ASTRA-sim's multi-dimensional spec (bandwidth in GB/s, GB = 2^30)."""
    total = 1
    for size in npus_count:
        total *= size
    topo = Topology(npus=total, source="spec")
    for npu in range(total):
        topo.add_device(f"npu{npu}")
    stride = 1
    for dim, (kind, size, bw, lat) in enumerate(zip(topologies, npus_count, bandwidth, latency)):
        topo.dims.append((kind, size, bw, lat))
        bpns = gib_per_s_to_bpns(bw)
        for base in range(total):
            if (base // stride) % size:
                continue   # not the first NPU of its slice in this dimension
            members = [base + i * stride for i in range(size)]
            if size == 1:
                continue
            if kind == "Ring":
                for i in range(size):
                    a, b = members[i], members[(i + 1) % size]
                    topo.connect(a, b, bpns, lat)
                    topo.connect(b, a, bpns, lat)
            elif kind == "FullyConnected":
                for a in members:
                    for b in members:
                        if a != b:
                            topo.connect(a, b, bpns, lat)
            elif kind == "Switch":
                switch = topo.add_device(f"sw{dim}.{base}")
                topo.switch_of[(dim, base)] = switch
                for a in members:
                    topo.connect(a, switch, bpns, lat)
                    topo.connect(switch, a, bpns, lat)
            else:
                raise ValueError(f"unknown building block {kind!r}")
        stride *= size
    return topo


# Generators -------------------------------------------------------------------------------------
def fat_tree(k: int, bandwidth_gbps: float, latency_ns: float, oversubscription: float = 1.0, tiers: int = 3,
             ecmp: str | None = None) -> Topology:
    """k-ary fat-tree (k even). 3 tiers: k pods of k/2 edge and k/2 aggregation switches, (k/2)^2
    cores, k^3/4 hosts; 2 tiers: k leaves of k/2 hosts and k/2 spines, k^2/2 hosts. Links above
    the hosts' switches get bandwidth / oversubscription. ECMP: D-mod-k for 3 tiers (as
    ShortestPathRouter routes it), hash for 2, unless `ecmp` says."""
    shape = k_ary_shape(k, tiers)
    shape.ecmp = ecmp or ("dmodk" if tiers == 3 else "hash")
    down = gb_per_s_to_bpns(bandwidth_gbps)
    return _fat_tree(shape, down, down / oversubscription, latency_ns,
                     f"fat-tree k={k}" if tiers == 3 else f"fat-tree k={k}, 2 tiers")


def clos_fat_tree(hosts: int, radix: int, bandwidth_gbps: float, latency_ns: float, tiers: int = 3,
                  oversubscription: float = 1.0, spine_oversubscription: float | None = None,
                  spine_radix: int | None = None, ecmp: str = "hash") -> Topology:
    """A fat-tree of `hosts` hosts (any count) built from radix-port switches, oversubscribed by
    port count (fabric.fat_tree_shape); every link has the same bandwidth."""
    shape = fat_tree_shape(hosts, radix, tiers, oversubscription, spine_oversubscription, spine_radix)
    shape.ecmp = ecmp
    bw = gb_per_s_to_bpns(bandwidth_gbps)
    return _fat_tree(shape, bw, bw, latency_ns, f"fat-tree {hosts} hosts, radix {radix}, {tiers} tiers")


def _fat_tree(shape: Clos, down: float, up: float, latency_ns: float, source: str) -> Topology:
    """Devices and links of a fat-tree shape, recording every link id in `shape`'s arrays.

    NPUs first. 2 tiers: then leaf0.., spine0..; per leaf, its hosts' links (up, down) then
    its links to each spine. 3 tiers (the order of the k-ary fat-tree since the first
    version): cores core0.. (core j * u' + c is the c-th of aggregation switch j's cores),
    then per pod its edges edge{pod}.{e} and aggregation switches agg{pod}.{j}; per edge,
    its hosts' links then its links to each agg of the pod; then per agg, its core links."""
    f = shape
    f.allocate()
    topo = Topology(npus=f.hosts, source=source, fabric=f)
    for host in range(f.hosts):
        topo.add_device(f"npu{host}")
    connect, u, d = topo.connect, f.up, f.leaf_hosts
    host_up, host_down, up2, down2 = f.host_up, f.host_down, f.up2, f.down2
    host = 0

    def leaf_links(leaf: int, device: int, above: list[int]) -> None:
        nonlocal host
        for _ in range(min(d, f.hosts - host)):
            host_up[host] = connect(host, device, down, latency_ns)
            host_down[host] = connect(device, host, down, latency_ns)
            host += 1
        for j, switch in enumerate(above):
            up2[leaf * u + j] = connect(device, switch, up, latency_ns)
            down2[leaf * u + j] = connect(switch, device, up, latency_ns)

    if f.tiers == 2:
        leaves = [topo.add_device(f"leaf{leaf}") for leaf in range(f.leaves)]
        spines = [topo.add_device(f"spine{j}") for j in range(u)]
        for leaf, device in enumerate(leaves):
            leaf_links(leaf, device, spines)
        return topo
    ua = f.agg_up
    cores = [topo.add_device(f"core{c}") for c in range(u * ua)]
    for pod in range(f.pods):
        first = pod * f.pod_leaves
        edges = [topo.add_device(f"edge{pod}.{e}") for e in range(min(f.pod_leaves, f.leaves - first))]
        aggs = [topo.add_device(f"agg{pod}.{j}") for j in range(u)]
        for e, edge in enumerate(edges):
            leaf_links(first + e, edge, aggs)
        for j, agg in enumerate(aggs):
            for c in range(ua):
                index = (pod * u + j) * ua + c
                f.up3[index] = connect(agg, cores[j * ua + c], up, latency_ns)
                f.down3[index] = connect(cores[j * ua + c], agg, up, latency_ns)
    return topo


def rail_optimized(nodes: int, gpus_per_node: int, radix: int, bandwidth_gbps: float, latency_ns: float,
                   nvlink_bandwidth_gbps: float, nvlink_latency_ns: float, oversubscription: float = 1.0,
                   spine_radix: int | None = None, spine_planes: int = 1,
                   spine_bandwidth_gbps: float | None = None, spine_latency_ns: float | None = None,
                   pxn: bool = False, ecmp: str = "hash") -> Topology:
    """A rail-optimized GPU cluster, after the compute fabric of NVIDIA's DGX SuperPOD reference
    architecture ("NVIDIA DGX SuperPOD: Next Generation Scalable Infrastructure for AI Leadership",
    reference architecture featuring DGX H100 systems, RA-11333-001, section Network Fabrics; the
    DGX B200/B300 editions alike): every node's NIC i on rail i; the nodes of a scalable unit under
    one leaf switch per rail, so that traffic per rail is one hop away within the unit, and traffic
    between units or rails through the spine layer. Meta's two 24,576-GPU clusters ("Building
    Meta's GenAI Infrastructure", Engineering at Meta, March 2024; Gangidi et al., "RDMA over
    Ethernet for Distributed AI Training at Meta Scale", SIGCOMM 2024) put 8-NIC nodes under
    rack switches and large modular cluster switches (up to 576 ports) above them: here a one-plane
    spine layer with spine_radix 576.

    - each node's GPUs are linked to the node's NVSwitch (`nvsw{node}`) both ways at the NVLink
      bandwidth and latency (not built for one GPU per node);
    - GPU i of node n (NPU n * gpus_per_node + i) is linked to rail switch `rail{i}.{n // d}`, d
      being a rail switch's host ports (fabric.split_ports of radix and oversubscription);
    - rails are grouped into `spine_planes` planes of consecutive rails; a plane has u spines
      `spine{plane}.{j}` (u: a rail switch's up-links), each linked to every rail switch of its
      rails; spine_radix (default radix) bounds the rail switches per plane. One plane is the
      SuperPOD layout; large-radix spines let one plane reach tens of thousands of GPUs; one
      plane per rail makes separate rail networks, bridged by NVLink inside the nodes.

    Devices: NPUs, NVSwitches, rail switches (rail-major), spines (plane-major). Links: per node
    its NVLinks; per rail switch its GPUs' links (up, down), then its spine links (up, down).
    """
    f = rail_shape(nodes, gpus_per_node, radix, oversubscription, spine_radix, spine_planes, pxn)
    f.ecmp = ecmp
    f.allocate()
    g, d, u, rail_leaves = gpus_per_node, f.leaf_hosts, f.up, f.rail_leaves
    topo = Topology(npus=f.hosts, source=f"rail-optimized {nodes} nodes x {g} GPUs", fabric=f)
    for host in range(f.hosts):
        topo.add_device(f"npu{host}")
    connect = topo.connect
    nic = gb_per_s_to_bpns(bandwidth_gbps)
    spine_bw = gb_per_s_to_bpns(spine_bandwidth_gbps or bandwidth_gbps)
    spine_lat = latency_ns if spine_latency_ns is None else spine_latency_ns
    if g > 1:
        nvlink = gb_per_s_to_bpns(nvlink_bandwidth_gbps)
        for node in range(nodes):
            switch = topo.add_device(f"nvsw{node}")
            for host in range(node * g, node * g + g):
                f.nv_up[host] = connect(host, switch, nvlink, nvlink_latency_ns)
                f.nv_down[host] = connect(switch, host, nvlink, nvlink_latency_ns)
    rails = [topo.add_device(f"rail{rail}.{s}") for rail in range(g) for s in range(rail_leaves)]
    rails_per_plane = g // spine_planes
    spines = [topo.add_device(f"spine{plane}.{j}") for plane in range(spine_planes) for j in range(u)]
    for leaf, switch in enumerate(rails):
        rail, s = divmod(leaf, rail_leaves)
        for node in range(s * d, min(s * d + d, nodes)):
            host = node * g + rail
            f.host_up[host] = connect(host, switch, nic, latency_ns)
            f.host_down[host] = connect(switch, host, nic, latency_ns)
        plane = rail // rails_per_plane
        for j in range(u):
            f.up2[leaf * u + j] = connect(switch, spines[plane * u + j], spine_bw, spine_lat)
            f.down2[leaf * u + j] = connect(spines[plane * u + j], switch, spine_bw, spine_lat)
    return topo


def dragonfly(groups: int, routers_per_group: int, hosts_per_router: int, global_links_per_router: int,
              bandwidth_gbps: float, latency_ns: float, global_bandwidth_gbps: float | None = None,
              global_latency_ns: float | None = None) -> Topology:
    """Dragonfly: routers fully connected within a group; each router has `global_links_per_router`
    links to other groups, assigned round-robin so every pair of groups is connected when
    groups <= routers_per_group * global_links_per_router + 1."""
    if groups < 2 or routers_per_group < 1 or hosts_per_router < 1 or global_links_per_router < 1:
        raise ValueError("dragonfly needs groups >= 2 and at least one router, host and global link")
    if groups - 1 > routers_per_group * global_links_per_router:
        raise ValueError(f"dragonfly: {groups} groups need at least {groups - 1} global links per group; "
                         f"{routers_per_group} routers x {global_links_per_router} give "
                         f"{routers_per_group * global_links_per_router}")
    hosts = groups * routers_per_group * hosts_per_router
    topo = Topology(npus=hosts, source=f"dragonfly g={groups} a={routers_per_group}")
    for host in range(hosts):
        topo.add_device(f"npu{host}")
    local = gb_per_s_to_bpns(bandwidth_gbps)
    remote = gb_per_s_to_bpns(global_bandwidth_gbps or bandwidth_gbps)
    remote_latency = latency_ns if global_latency_ns is None else global_latency_ns
    routers = [[topo.add_device(f"r{g}.{r}") for r in range(routers_per_group)] for g in range(groups)]
    host = 0
    for g in range(groups):
        for router in routers[g]:
            for _ in range(hosts_per_router):
                topo.connect(host, router, local, latency_ns)
                topo.connect(router, host, local, latency_ns)
                host += 1
        for a in routers[g]:
            for b in routers[g]:
                if a != b:
                    topo.connect(a, b, local, latency_ns)
    # Global links: group g's j-th global port goes to group (g + 1 + j) mod groups.
    for g in range(groups):
        for j in range(groups - 1):
            other = (g + 1 + j) % groups
            if other < g:
                continue
            a = routers[g][j % routers_per_group]
            b = routers[other][(groups - 2 - j) % routers_per_group]
            topo.connect(a, b, remote, remote_latency)
            topo.connect(b, a, remote, remote_latency)
    return topo
