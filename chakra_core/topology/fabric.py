"""Up-down fabrics (fat-trees, rail-optimized clusters) described arithmetically, and their router.

A generated fat-tree or rail-optimized cluster is a `Clos`: its shape (hosts
per leaf, up-links per leaf, pods ...) and, per tier, the link ids of every
(switch, port) in flat lists filled as the generator connects the links
(topology.py; the lists hold the topology's own link-id objects, so a route
allocates nothing but its tuple). Routes are computed from device numbers,
not searched: no per-destination table, no route cache, memory O(links).

Shapes (R = radix, o = oversubscription; see `split_ports`):

- leaf: floor(R o / (o + 1)) host ports, the other ports up. Hosts are dealt
  to leaves in order: host h on leaf h // d (d host ports per leaf).
- 2 tiers (leaf-spine): one spine per leaf up-link (u spines); every leaf has
  one link to every spine. The leaves must fit on a spine's ports.
- 3 tiers: pods of d' leaves and u aggregation switches, d' being an
  aggregation switch's down ports (its own split, `spine_oversubscription`);
  every leaf of a pod links to every aggregation switch of the pod. The j-th
  aggregation switch of every pod links to the cores of core group j, one link
  to each of its u' cores: u x u' cores, each with one link per pod (so there
  are at most R pods). The k-ary fat-tree is d = u = d' = u' = k/2, k pods.
- rail-optimized: GPU i of every node on rail i; rail i has ceil(nodes / d)
  rail switches (leaves), node n on rail switch n // d; rails are split into
  spine planes of consecutive rails, each plane with u spines and every rail
  switch of the plane linked to each of them. All GPUs of a node are linked
  to the node's NVSwitch.

Routes (up-down, shortest in hops but for `pxn`'s detour through NVLink):
host -> leaf -> host under one leaf;
host -> leaf -> spine -> leaf -> host (2 tiers, or 3 tiers within a pod,
through the pod's aggregation switch j); host -> leaf -> agg j -> core (j, c)
-> agg j -> leaf -> host across pods. Rail-optimized: GPU -> NVSwitch -> GPU
within a node; otherwise the rail network, between rails through a spine of
their plane; traffic to another rail that is in another plane (or any
cross-rail traffic with `pxn`) first crosses NVLink to the source node's GPU
on the destination's rail, as NCCL's PXN does, then rides that rail.

ECMP: a message's key x picks the up-links: j = x mod u at the leaf,
c = (x div u) mod u' at the aggregation switch. `hash` (RoCE-like, the
default of the new kinds): x = fmix32(src * 0x9E3779B1 + dst * 0x85EBCA77 +
seq * 0xC2B2AE3D mod 2^32), fmix32 being MurmurHash3's 32-bit finaliser and
seq the number of earlier messages from src to dst. `dmodk` (InfiniBand's
destination-mod-k): x = D + seq, D being the destination's position under
its leaf: its NPU number on a fat-tree (what `ShortestPathRouter` gives on a
k-ary fat-tree, which the k form keeps byte for byte), its node number on a
rail-optimized cluster (the GPUs under one rail switch are one per node).

Failed links: the up-links a message may take are those whose whole up-down
path is alive (leaf up-link and the matching down-link, and for 3 tiers a
core with both its links alive); x picks among them as above, by rank among
the live choices. A failed host link or NVLink (no alternative) makes the
pair unreachable: the message raises an error naming both ends and the failed
links in the way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Collection

from chakra_core.errors import SimulationError
from chakra_core.topology.ecmp import PairCounter, ecmp_hash

if TYPE_CHECKING:
    from chakra_core.topology.graph import Topology


def split_ports(radix: int, oversubscription: float, what: str = "switch") -> tuple[int, int]:
    """(down, up) ports of a radix-port switch whose down:up ratio is `oversubscription`:
    down = floor(radix * o / (o + 1)), the rest up."""
    down = int(radix * oversubscription / (oversubscription + 1) + 1e-9)
    up = radix - down
    if down < 1 or up < 1:
        raise ValueError(f"a {what} of radix {radix} with oversubscription {oversubscription:g} gets {down} "
                         f"down and {up} up ports; it needs at least one of each")
    return down, up


def _ints(count: int) -> list[int]:
    return [0] * count


@dataclass
class Clos:
    """An up-down fabric: its shape and the link ids of every (switch, port) per tier."""

    hosts: int
    tiers: int                  # 2: leaf-spine (and rail-optimized); 3: leaf (edge)-agg-core, in pods
    leaf_hosts: int             # d: host ports per leaf (nodes per rail switch)
    leaves: int                 # L
    up: int                     # u: up-links per leaf (spines of its plane; aggs of its pod)
    pod_leaves: int = 0         # 3 tiers: leaves per pod (an agg's down-links)
    pods: int = 1
    agg_up: int = 0             # 3 tiers: up-links per agg (cores per core group)
    gpus_per_node: int = 1      # rail-optimized: host = node * G + gpu, GPU i on rail i
    rail_leaves: int = 0        # rail switches per rail (fat-tree: all leaves)
    plane_leaves: int = 0       # leaves per spine plane (fat-tree: all leaves)
    pxn: bool = False
    ecmp: str = "hash"
    host_up: list[int] = field(default_factory=list)     # [host]: host -> leaf
    host_down: list[int] = field(default_factory=list)   # [host]: leaf -> host
    up2: list[int] = field(default_factory=list)         # [leaf * u + j]: leaf -> spine/agg j
    down2: list[int] = field(default_factory=list)       # [leaf * u + j]: spine/agg j -> leaf
    up3: list[int] = field(default_factory=list)         # [(pod * u + j) * u' + c]: agg -> core
    down3: list[int] = field(default_factory=list)       # [(pod * u + j) * u' + c]: core -> agg
    nv_up: list[int] = field(default_factory=list)       # [gpu]: gpu -> NVSwitch
    nv_down: list[int] = field(default_factory=list)     # [gpu]: NVSwitch -> gpu

    def __post_init__(self) -> None:
        self.rail_leaves = self.rail_leaves or self.leaves
        self.plane_leaves = self.plane_leaves or self.leaves

    @property
    def paths(self) -> int:
        """Equal-cost paths between two hosts farthest apart (ECMP choices, all tiers)."""
        return self.up * self.agg_up if self.tiers == 3 else self.up

    def allocate(self) -> None:
        """Zeroed link-id arrays of this shape, for a generator to fill."""
        hosts, ups = self.hosts, self.leaves * self.up
        self.host_up, self.host_down = _ints(hosts), _ints(hosts)
        self.up2, self.down2 = _ints(ups), _ints(ups)
        if self.tiers == 3:
            aggs_up = self.pods * self.up * self.agg_up
            self.up3, self.down3 = _ints(aggs_up), _ints(aggs_up)
        if self.gpus_per_node > 1:
            self.nv_up, self.nv_down = _ints(hosts), _ints(hosts)

    def leaf_of(self, host: int) -> int:
        g = self.gpus_per_node
        return (host % g) * self.rail_leaves + (host // g) // self.leaf_hosts


# Shapes (validated: the manifest models call these) -----------------------------------------------
MAX_HOSTS_ENV = "CHAKRA_SIM_MAX_NETWORK_HOSTS"
MAX_HOSTS_DEFAULT = 1 << 21
"""NPUs a generated network may have (2,097,152: far above any cluster built; a typo such as
k: 1000000 would otherwise build links until memory runs out). Raise it with the variable."""


def check_hosts(hosts: int, what: str) -> None:
    """A ValueError when a generated network would have more NPUs than the limit."""
    raw = os.environ.get(MAX_HOSTS_ENV, "")
    try:
        limit = int(raw) if raw else MAX_HOSTS_DEFAULT
    except ValueError:
        raise ValueError(f"{MAX_HOSTS_ENV}={raw!r}: expected a whole number of NPUs") from None
    if hosts > limit:
        raise ValueError(f"{what} has {hosts:,} NPUs, more than the limit of {limit:,} ({MAX_HOSTS_ENV}; "
                         "set it higher if the network is genuine)")


def k_ary_shape(k: int, tiers: int = 3) -> Clos:
    """The k-ary fat-tree: 3 tiers, k pods of k/2 edges and k/2 aggs, (k/2)^2 cores, k^3/4 hosts;
    2 tiers: k leaves of k/2 hosts, k/2 spines, k^2/2 hosts."""
    if k < 2 or k % 2:
        raise ValueError("fat-tree k must be an even number >= 2")
    half = k // 2
    check_hosts(k * half * half if tiers == 3 else k * half, f"a {tiers}-tier k={k} fat-tree")
    if tiers == 3:
        return Clos(hosts=k * half * half, tiers=3, leaf_hosts=half, leaves=k * half, up=half,
                    pod_leaves=half, pods=k, agg_up=half, ecmp="dmodk")
    return Clos(hosts=k * half, tiers=2, leaf_hosts=half, leaves=k, up=half)


def fat_tree_shape(hosts: int, radix: int, tiers: int = 3, oversubscription: float = 1.0,
                   spine_oversubscription: float | None = None, spine_radix: int | None = None) -> Clos:
    """A fat-tree of any size from its switches' radix (see the module docstring)."""
    if hosts < 1:
        raise ValueError("fat-tree hosts must be >= 1")
    check_hosts(hosts, "the fat-tree")
    d, u = split_ports(radix, oversubscription, "leaf")
    leaves = -(-hosts // d)
    if tiers == 2:
        if spine_oversubscription is not None:
            raise ValueError("spine_oversubscription applies to 3 tiers (the aggregation switches' "
                             "down:up ports); 2 tiers have oversubscription at the leaves only")
        top = spine_radix or radix
        if leaves > top:
            raise ValueError(f"2 tiers: {hosts:,} hosts at {d} per leaf need {leaves:,} leaves, more than a "
                             f"spine's {top} ports (2 tiers reach {top * d:,} hosts); use tiers: 3, a larger "
                             f"radix, or spine_radix >= {leaves}")
        return Clos(hosts=hosts, tiers=2, leaf_hosts=d, leaves=leaves, up=u)
    if tiers != 3:
        raise ValueError(f"fat-tree tiers must be 2 or 3, got {tiers}")
    if spine_radix is not None:
        raise ValueError("spine_radix applies to 2 tiers (the spines' ports); 3 tiers use radix for "
                         "every switch")
    pod_leaves, agg_up = split_ports(radix, spine_oversubscription or 1.0, "aggregation switch")
    pods = -(-leaves // pod_leaves)
    if pods > radix:
        raise ValueError(f"3 tiers: {hosts:,} hosts need {pods:,} pods of {pod_leaves} leaves "
                         f"({pod_leaves * d:,} hosts each), more than a core's {radix} ports (3 tiers of "
                         f"radix {radix} reach {radix * pod_leaves * d:,} hosts); use a larger radix")
    return Clos(hosts=hosts, tiers=3, leaf_hosts=d, leaves=leaves, up=u, pod_leaves=pod_leaves, pods=pods,
                agg_up=agg_up)


def rail_shape(nodes: int, gpus_per_node: int, radix: int, oversubscription: float = 1.0,
               spine_radix: int | None = None, spine_planes: int = 1, pxn: bool = False) -> Clos:
    """A rail-optimized cluster (see the module docstring and topology.rail_optimized)."""
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError("rail_optimized needs nodes >= 1 and gpus_per_node >= 1")
    check_hosts(nodes * gpus_per_node, "the rail-optimized cluster")
    d, u = split_ports(radix, oversubscription, "rail switch")
    if spine_planes < 1 or gpus_per_node % spine_planes:
        raise ValueError(f"spine_planes ({spine_planes}) must divide gpus_per_node ({gpus_per_node}): "
                         "every plane serves as many rails")
    rail_leaves = -(-nodes // d)
    plane_leaves = gpus_per_node // spine_planes * rail_leaves
    top = spine_radix or radix
    if plane_leaves > top:
        raise ValueError(f"{gpus_per_node // spine_planes} rail(s) per spine plane x {rail_leaves} rail "
                         f"switches per rail = {plane_leaves} rail switches per plane, more than a spine's "
                         f"{top} ports; use more spine_planes, a larger spine_radix or a larger radix")
    return Clos(hosts=nodes * gpus_per_node, tiers=2, leaf_hosts=d, leaves=gpus_per_node * rail_leaves, up=u,
                gpus_per_node=gpus_per_node, rail_leaves=rail_leaves, plane_leaves=plane_leaves, pxn=pxn)


def _nth_bit(mask: int, rank: int) -> int:
    """The index of the rank-th (from 0) set bit of mask."""
    for _ in range(rank):
        mask &= mask - 1
    return (mask & -mask).bit_length() - 1


class FabricRouter:
    """Up-down routes of a generated fabric (`topo.fabric`), computed from device numbers.

    route(src, dst, seq) is the route of the seq-th message (from 0) from src to dst;
    route_next counts a pair's messages (PairCounter) and returns the next one's route.
    """

    def __init__(self, topo: Topology, failed: Collection[int] = ()) -> None:
        fabric = topo.fabric
        if fabric is None:
            raise ValueError("FabricRouter needs a generated fabric (topo.fabric)")
        self.topo, self.fabric = topo, fabric
        self.hashed = fabric.ecmp == "hash"
        # the shape and link lists at hand (routes are computed per message)
        self._g, self._d, self._u, self._ua = fabric.gpus_per_node, fabric.leaf_hosts, fabric.up, fabric.agg_up
        self._rail_leaves = fabric.rail_leaves
        self._pod = fabric.pod_leaves if fabric.tiers == 3 else fabric.leaves   # 2 tiers: one "pod"
        self._host_up, self._host_down = fabric.host_up, fabric.host_down
        self._up2, self._down2, self._up3, self._down3 = fabric.up2, fabric.down2, fabric.up3, fabric.down3
        self._sent = PairCounter(topo.npus, 1 << 32 if self.hashed else fabric.paths)
        self._dead = frozenset(failed)
        if self._dead:
            self._masks()

    # Failures -------------------------------------------------------------------------------------
    def _masks(self) -> None:
        """Per leaf and per aggregation switch, a bit mask of the up-links (and matching down-links)
        still alive."""
        f, dead = self.fabric, self._dead

        def alive(links: list[int], width: int) -> list[int]:
            full = (1 << width) - 1
            masks = [full] * (len(links) // width) if width else []
            for index, link in enumerate(links):
                if link in dead:
                    masks[index // width] &= ~(1 << (index % width))
            return masks

        self._leaf_up, self._leaf_down = alive(f.up2, f.up), alive(f.down2, f.up)
        self._agg_up, self._agg_down = alive(f.up3, f.agg_up), alive(f.down3, f.agg_up)

    def _unreachable(self, src: int, dst: int, candidates: list[int]) -> SimulationError:
        names = [self.topo.link_name(link) for link in sorted(set(candidates)) if link in self._dead]
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        return SimulationError(f"network ({self.topo.source}): NPU {src} cannot reach NPU {dst}: failed links "
                               f"{shown or '(none on its paths)'} leave no up-down path between them")

    # Routes ---------------------------------------------------------------------------------------
    def route_next(self, src: int, dst: int) -> tuple[int, ...]:
        """The route of the next message from src to dst (counts it)."""
        return self.route(src, dst, self._sent.next(src, dst))

    def route(self, src: int, dst: int, seq: int = 0) -> tuple[int, ...]:
        """The links of the seq-th message (from 0) from src to dst."""
        if src == dst:
            return ()
        g = self._g
        if g == 1:
            return self._up_down(src, dst, ecmp_hash(src, dst, seq) if self.hashed else dst + seq, src, dst)
        f = self.fabric
        x = ecmp_hash(src, dst, seq) if self.hashed else dst // g + seq
        node, gpu = divmod(src, g)
        dst_node, dst_gpu = divmod(dst, g)
        if node == dst_node:
            hops = (f.nv_up[src], f.nv_down[dst])
            if self._dead and (hops[0] in self._dead or hops[1] in self._dead):
                raise self._unreachable(src, dst, list(hops))
            return hops
        if gpu != dst_gpu and (f.pxn or gpu * f.rail_leaves // f.plane_leaves
                               != dst_gpu * f.rail_leaves // f.plane_leaves):
            via = node * g + dst_gpu       # PXN: over NVLink to the GPU on dst's rail
            hops = (f.nv_up[src], f.nv_down[via])
            if self._dead and (hops[0] in self._dead or hops[1] in self._dead):
                raise self._unreachable(src, dst, list(hops))
            return hops + self._up_down(via, dst, x, src, dst)
        return self._up_down(src, dst, x, src, dst)

    def _up_down(self, s: int, t: int, x: int, src: int, dst: int) -> tuple[int, ...]:
        """Host s to host t through the leaves and above (src, dst: the message's ends, for errors)."""
        g, d = self._g, self._d
        if g == 1:
            ls, lt = s // d, t // d
        else:
            ls = (s % g) * self._rail_leaves + s // g // d
            lt = (t % g) * self._rail_leaves + t // g // d
        if self._dead:
            return self._up_down_alive(s, t, ls, lt, x, src, dst)
        if ls == lt:
            return self._host_up[s], self._host_down[t]
        u = self._u
        j = x % u
        pod = self._pod
        pa, pb = ls // pod, lt // pod
        if pa == pb:
            return self._host_up[s], self._up2[ls * u + j], self._down2[lt * u + j], self._host_down[t]
        ua = self._ua
        c = (x // u) % ua
        return (self._host_up[s], self._up2[ls * u + j], self._up3[(pa * u + j) * ua + c],
                self._down3[(pb * u + j) * ua + c], self._down2[lt * u + j], self._host_down[t])

    def _up_down_alive(self, s: int, t: int, ls: int, lt: int, x: int, src: int, dst: int) -> tuple[int, ...]:
        """`_up_down` with failed links: x picks among the live choices, by rank."""
        f, dead = self.fabric, self._dead
        first, last = f.host_up[s], f.host_down[t]
        if first in dead or last in dead:
            raise self._unreachable(src, dst, [first, last])
        if ls == lt:
            return first, last
        u = f.up
        mask = self._leaf_up[ls] & self._leaf_down[lt]
        if f.tiers == 2 or ls // f.pod_leaves == lt // f.pod_leaves:
            if not mask:
                raise self._unreachable(src, dst, [*f.up2[ls * u:ls * u + u], *f.down2[lt * u:lt * u + u]])
            j = _nth_bit(mask, x % mask.bit_count())
            return first, f.up2[ls * u + j], f.down2[lt * u + j], last
        ua, pa, pb = f.agg_up, ls // f.pod_leaves, lt // f.pod_leaves
        agg_up, agg_down = self._agg_up, self._agg_down
        usable, rest = 0, mask
        while rest:
            low = rest & -rest
            j = low.bit_length() - 1
            if agg_up[pa * u + j] & agg_down[pb * u + j]:
                usable |= low
            rest ^= low
        if not usable:
            raise self._unreachable(src, dst, [*f.up2[ls * u:ls * u + u], *f.down2[lt * u:lt * u + u],
                                               *f.up3[pa * u * ua:(pa + 1) * u * ua],
                                               *f.down3[pb * u * ua:(pb + 1) * u * ua]])
        width = usable.bit_count()
        j = _nth_bit(usable, x % width)
        cores = agg_up[pa * u + j] & agg_down[pb * u + j]
        c = _nth_bit(cores, (x // width) % cores.bit_count())
        a, b = (pa * u + j) * ua + c, (pb * u + j) * ua + c
        return first, f.up2[ls * u + j], f.up3[a], f.down3[b], f.down2[lt * u + j], last
