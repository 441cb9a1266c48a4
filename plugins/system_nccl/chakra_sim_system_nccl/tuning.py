"""NCCL's tuner: the latency and bandwidth its cost model gives every (algorithm, protocol) pair.

From NCCL's public source (NVIDIA/nccl `src/tuning/ring.cc`, `tree.cc`, `nvls.cc` and the constants
of `src/tuning/cost_model.cc` at commits 1fc949c5 / 53947894; the same formulas as
`src/graph/tuning.cc` of NCCL 2.19 with newer constants):

- every pair gets a latency (`baseLatencies` + per-hop `hwLatencies` over NVLink, PCI or the
  network) and a bandwidth (channels x per-channel bandwidth, then NCCL's per-protocol
  refinements: LL carries half the bus bandwidth up to `llMaxBws`, LL128 92%, tree 92% capped per
  channel, NVLS `nvlsEfficiency` of twice its per-channel bandwidth), converted from bus to
  algorithm bandwidth;
- the channels and per-channel bandwidths come from the graphs NCCL's topology search finds
  (`graph`): the intra-node rings, the NVLS graph, one channel per NIC across nodes.

chakra_sim_system_nccl.model chooses with these pairs as NCCL does and times what NCCL then
executes (chakra_sim_system_nccl.execution).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Iterator, Literal, cast

from chakra_core import Profile, Sourced
from chakra_sim_system_nccl.section import nccl_of

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE, ALL_TO_ALL = (
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")
COLLECTIVES = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE, ALL_TO_ALL)
ProtocolName = Literal["LL", "LL128", "Simple"]
"""NCCL's protocols."""
AlgorithmName = Literal["ring", "tree", "nvls", "nvls_tree"]
"""The algorithms modelled."""
PROTOCOLS: tuple[ProtocolName, ProtocolName, ProtocolName] = ("LL", "LL128", "Simple")
LL, LL128, SIMPLE = PROTOCOLS
RING: Final = "ring"
TREE: Final = "tree"
NVLS: Final = "nvls"
NVLS_TREE: Final = "nvls_tree"

# cost_model.cc: latencies in microseconds, per protocol (LL, LL128, Simple)
BASE_LATENCY = {TREE: (6.8, 14.0, 8.4), RING: (6.6, 14.0, 8.4), NVLS: (0.0, 0.0, 0.0), NVLS_TREE: (0.0, 0.0, 0.0)}
HW_LATENCY = {
    "nvlink": {TREE: (.6, 1.25, 4.0), RING: (.6, 1.9, 3.4), NVLS: (0, 0, 25), NVLS_TREE: (0, 0, 25)},
    "pci": {TREE: (1.0, 1.9, 4.0), RING: (1.0, 2.5, 5.7), NVLS: (0, 0, 0), NVLS_TREE: (0, 0, 0)},
    "net": {TREE: (5.0, 8.5, 14.0), RING: (2.7, 4.0, 14.0), NVLS: (0, 0, 18), NVLS_TREE: (0, 0, 20.9)},
}
ARCH_INDEX = {"volta": 0, "ampere": 1, "hopper": 2, "blackwell": 3}
CC = {"volta": 70, "ampere": 80, "hopper": 90, "blackwell": 100}
"""The compute capability NCCL compares against (ncclTuningGetCompCapIndex: >= 100 is Blackwell)."""
# cost_model.cc tables, [architecture][1 node, 2 nodes, more]; llMaxBws' multi-node rows go by CPU vendor.
# Blackwell's rows are v2.30.7-1's (= 1fc949c5); 2.25-2.27 had twice Hopper's, 2.28-2.29 other LL128 and
# NVLS-tree caps (perChMaxNVLSTreeBws N4 43.1 / 43.8): not modelled per release
LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
PER_CH_MAX_RING_LL128_BW = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7), (40.0, 40.0, 40.0))
PER_CH_MAX_TREE_LL128_BW = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
PER_CH_MAX_TREE_BW = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
PER_CH_MAX_NVLS_TREE_BW = ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), (0.0, 57.7, 45.5), (0.0, 96.0, 80.0))
NVLS_EFFICIENCY = (0.0, 0.0, 0.85, 0.74)   # src/tuning/nvls.cc nvlsEfficiency
TREE_CORRECTION = (  # powers of two from 64 B, per protocol
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}   # getNetOverhead: proxy post cost per network step
# enqueue.h / device.h: bytes per thread before NCCL adds a channel, and threads per channel
THREAD_THRESHOLD = {LL: 8, LL128: 8, SIMPLE: 64}
MAX_THREADS = {LL: 512, LL128: 640, SIMPLE: 512}
NVLS_MIN_LOCAL_GPUS = 2
"""ncclNvlsInit (src/transport/nvls.cc): `if (... gpuCount <= 2) return` leaves NVLS off."""
NCCL_MAX_NVLS_ARITY = 32
"""src/include/device.h: the NVLS graph has one head per GPU, at most this many (src/graph/search.cc
ncclTopoCompute: maxChannels = min(NCCL_MAX_NVLS_ARITY, GPUs)), e.g. 32 of a 72-GPU NVLink domain."""


@dataclass(frozen=True)
class Tuner:
    """What changed in NCCL's tuner between the releases modelled, for the algorithms the profiles
    run. Everything else in the tables above is the same from 2.23 to 2.30."""

    since: tuple[int, int, int]   # the first release with these tables
    nvls_nvlink_us: float         # hwLatencies[NVLINK][NVLS and NVLS_TREE][SIMPLE]
    nvls_tree_net_us: float       # hwLatencies[NET][NVLS_TREE][SIMPLE]
    nvls_efficiency: bool         # NVLS bandwidth from nvlsEfficiency (2.28+), else the graph's x 5/6

    @property
    def name(self) -> str:
        return ".".join(map(str, self.since))


TUNERS = (
    # src/graph/tuning.cc ncclTopoTuneModel at v2.23.4-1 .. v2.27.7-1: hwLat NVLink NVLS 25, NET NVLSTree 14;
    # NVLS bw = min(bwIntra, bwInter), NVLSTree min(bwIntra, bwInter / 2 beyond 2 nodes), x nChannels, x 5/6
    # for all-reduce ("Convert bus BW to algorithm BW"); the ring and tree formulas are the newest's
    Tuner((2, 23, 0), 25.0, 14.0, False),
    Tuner((2, 28, 0), 25.0, 14.0, True),    # v2.28.3-1: nvlsEfficiency, perChMaxNVLSTreeBws
    Tuner((2, 28, 9), 25.0, 20.9, True),    # v2.28.9-1 (dbc86fd0) and later: hwLat NET NVLSTree 20.9
)
NEWEST: Final = TUNERS[-1]


def tuner_for(version: tuple[int, int, int] | None) -> Tuner:
    """The tuner of NCCL `version` (the newest modelled for None). Releases before 2.23 get 2.23's:
    their ring LL and LL128 factors, tree caps and NVLS latencies differ again (v2.19.3-1 to
    v2.22.3-1), which is not modelled."""
    if version is None:
        return NEWEST
    return next((t for t in reversed(TUNERS) if t.since <= version), TUNERS[0])


@dataclass(frozen=True)
class Pair:
    """One (algorithm, protocol) NCCL considers: its tuner latency and bandwidth, and what the
    execution model needs to time it."""

    algorithm: AlgorithmName
    protocol: ProtocolName
    latency_us: float
    bandwidth_gbps: float   # algorithm bandwidth, all channels, NCCL's caps applied
    channels: int           # channels NCCL starts from (comm->nChannels, or NVLS channels)
    channel_gbps: float = math.inf   # algorithm bandwidth one channel (CTA) moves before the caps
    intra_gbps: float = math.inf     # executed algorithm bandwidth NVLink bounds (all channels)
    inter_gbps: float = math.inf     # executed algorithm bandwidth the NICs bound (all channels)
    base_us: float = 0.0             # NCCL's baseLatencies
    intra_hops_us: float = 0.0       # the pass's hop latencies inside nodes
    inter_hops: int = 0              # the pass's hops across nodes
    inter_hw_us: float = 0.0         # NCCL's per-hop network latency of each
    net_latencies: float = 0.0       # network latencies per hop across nodes (2 with the flush)
    graph_channels: int = 0          # channels of the search graph the running channels share


@dataclass(frozen=True)
class Hops:
    """The hops one pass of an algorithm takes: their latency inside nodes, their count across."""

    intra_us: float = 0.0
    inter_hops: int = 0


def log2i(n: int) -> int:
    return n.bit_length() - 1 if n > 0 else 0


def node_nic_gbps(profile: Profile) -> float:
    """What a node's NICs carry together each way, GB/s (0 without a network)."""
    network = profile.network
    return 0.0 if network is None else network.nics_per_node.value * network.nic_gbits.value / 8


def graph(profile: Profile, algorithm: str, nodes: int, priced: bool,
          nic_share: float) -> tuple[int, float, float, float]:
    """(channels of the search graph, bwIntra, bwInter, inter-node latency) as NCCL's topology
    search finds them: within a node the NVLink rings; the NVLS graph with one channel (head)
    per GPU; across nodes one channel per NIC at the NIC's rate (capped by what NVLink gives
    that channel), NVLS heads sharing the node's NICs. A communicator reaches `nic_share` of
    a node's NICs (its GPUs' rails, chakra_sim_system_nccl.sharing): its channels share
    that bandwidth. The latency is what the network plugin reports to NCCL, or with `priced`
    what a network step really costs."""
    spec = nccl_of(profile)
    network = profile.network
    if algorithm in (NVLS, NVLS_TREE):
        assert spec.nvls_bus_bw_gbps is not None   # NVLS only when the profile gives it (algorithms)
        channels = nvls_heads(profile)
        bw_intra = spec.nvls_bus_bw_gbps.value / channels
        bw_inter = spec.nvls_inter_bw_gbps.value if spec.nvls_inter_bw_gbps else bw_intra
    else:
        channels, bw_intra = int(spec.graph_channels.value), spec.channel_bw_gbps.value
        bw_inter = bw_intra
    if nodes == 1 or network is None:
        return channels, bw_intra, bw_inter, 0.0
    latency = network.extra_latency_us.value if network.extra_latency_us else 0.0
    if not priced and network.reported_latency_us is not None:
        latency = network.reported_latency_us.value
    if algorithm == NVLS_TREE:
        nic_gbps = network.nic_gbits.value / 8   # the share before the NICs' total: the recorded results' rounding
        return channels, bw_intra, network.nics_per_node.value * nic_share * nic_gbps / channels, latency
    # one channel per NIC the communicator's GPUs drive (at least one, sharing its NIC with the other
    # rails' GPUs when the group has fewer GPUs on a node than the node has NICs), at the NIC's rate
    # capped by what NVLink gives that channel; search.cc ncclTopoDupChannels doubles fast channels
    devices = network.nccl_devices_per_node.value if network.nccl_devices_per_node else network.nics_per_node.value
    device_gbps = node_nic_gbps(profile) / devices
    reach = devices * nic_share
    nics = min(MAX_SEARCH_CHANNELS, max(1, math.ceil(reach - 1e-9)))
    bw = min(device_gbps * reach / nics, channels * bw_intra / nics)
    nics, bw = dup_channels(profile, nics, bw)
    if algorithm == TREE:
        # search.cc (v2.24.3-1) pass 2, "increase bwIntra for trees (2 nodes or collnet)": a tree's
        # NVLink chain may run up to twice the NIC rate, which tuning.cc reads for 2 nodes
        return nics, min(2 * bw, channels * bw_intra / nics), bw, latency
    return nics, bw, bw, latency


MAXCHANNELS: Final = 32
"""src/include/device.h MAXCHANNELS."""
MAX_SEARCH_CHANNELS: Final = MAXCHANNELS // 2
"""src/init.cc: ringGraph->maxChannels = MAXCHANNELS/2 (the tree graph takes the ring's channels)."""


def nvls_heads(profile: Profile) -> int:
    """The NVLS graph's channels (heads): one per GPU of the NVLink domain, NCCL_MAX_NVLS_ARITY at most."""
    return min(NCCL_MAX_NVLS_ARITY, profile.gpus_per_node)


def dup_channels(profile: Profile, channels: int, bw: float) -> tuple[int, float]:
    """src/graph/search.cc ncclTopoDupChannels (v2.24.3-1): a graph whose channels run at 25 GB/s or
    more is duplicated at half the bandwidth each, except from Hopper on with more than 4 channels
    under 50 GB/s."""
    cc = CC[profile.gpu.architecture]
    if bw < 25.0 or (cc > 80 and bw < 50.0 and channels > 4):
        return channels, bw
    doubled = min(2 * channels, MAX_SEARCH_CHANNELS)
    return doubled, bw / math.ceil(doubled / channels)


def comm_channels(profile: Profile, graph_channels: int, bw: float) -> int:
    """comm->nChannels of a communicator across nodes (src/graph/connect.cc ncclTopoPostset,
    v2.24.3-1): the search's channels doubled ("Duplication should be complete now"), doubled
    again from Hopper on (minCompCap >= 90) when they run faster than 45 GB/s and are fewer than 16
    ("Use 4 compute channels per search channel to reach peak BW on <8 PPN"), at most MAXCHANNELS."""
    channels = min(MAXCHANNELS, 2 * graph_channels)
    if CC[profile.gpu.architecture] >= 90 and bw > 45.0 and channels < 16:
        channels = 2 * channels
    return channels


def algorithms(profile: Profile, collective: str, nodes: int, local: int) -> list[AlgorithmName]:
    """The algorithms NCCL considers for this collective on this hardware."""
    spec = nccl_of(profile)
    nvls = profile.node.nvls and spec.nvls_channels is not None and spec.nvls_bus_bw_gbps is not None
    # ncclNvlsInit (src/transport/nvls.cc): no NVLS for a communicator of 2 or fewer GPUs on a node
    nvls = nvls and local > NVLS_MIN_LOCAL_GPUS
    if collective == ALL_REDUCE:
        algorithms: list[AlgorithmName] = [TREE, RING]
        if nvls:
            algorithms.append(NVLS if nodes == 1 else NVLS_TREE)
        return algorithms
    if collective in (ALL_GATHER, REDUCE_SCATTER) and nvls and nodes == 1:
        return [RING, NVLS]
    return [RING]


def build(profile: Profile, collective: str, nranks: int, nodes: int, priced: bool, nic_share: float,
          tuner: Tuner | None = None) -> Iterator[Pair]:
    """Every (algorithm, protocol) NCCL considers, with `tuner`'s latency and bandwidth (default the
    newest modelled) and the fields the execution model reads."""
    tuner = tuner or NEWEST
    arch = ARCH_INDEX[profile.gpu.architecture]
    index2 = min(nodes, 3) - 1
    cpu = profile.node.cpu_vendor
    ll_max_bw = LL_MAX_BW[arch if nodes == 1 else (1 if cpu == "amd" else 0)][index2]
    local = nranks // nodes
    intra_hw = "nvlink" if profile.gpu.nvlink_links.value > 0 else "pci"
    nsteps = {ALL_REDUCE: 2 * (nranks - 1), ALL_GATHER: nranks - 1, REDUCE_SCATTER: nranks - 1}.get(
        collective, nranks)
    inter_steps = 0 if nodes == 1 else {ALL_REDUCE: 2 * (nodes - 1)}.get(collective, nodes - 1)
    network = profile.network
    allowed = PROTOCOLS if nodes == 1 or network is None or network.protocols is None else network.protocols
    flush = not priced or network is None or network.gdr_flush
    for algorithm in algorithms(profile, collective, nodes, local):
        graph_channels, bw_intra, bw_inter, latency_inter = graph(profile, algorithm, nodes, priced, nic_share)
        for p, protocol in enumerate(PROTOCOLS):
            if (algorithm in (NVLS, NVLS_TREE) and protocol != SIMPLE) or protocol not in allowed:
                continue
            intra = HW_LATENCY[intra_hw][algorithm][p]
            if algorithm in (NVLS, NVLS_TREE) and intra_hw == "nvlink":
                intra = tuner.nvls_nvlink_us
            inter_hw = 0.0
            net_hops = 0.0   # network latencies a pass pays (a Simple step twice with the flush)
            hops = Hops()
            if nodes > 1:
                hop = TREE if algorithm == RING and local == 1 else algorithm
                inter_hw = HW_LATENCY["net"][hop][p] if hop != NVLS_TREE else tuner.nvls_tree_net_us
                net_hops = 2.0 if protocol == SIMPLE and flush else 1.0
            base = BASE_LATENCY[algorithm][p]
            if algorithm == RING:
                bw = bw_intra if nodes <= 2 else bw_inter   # ring.cc (before Blackwell)
                factor = {LL: 0.5, LL128: 0.92, SIMPLE: 1.0}[protocol]
                bus = bw * graph_channels * factor
                if protocol == LL:
                    bus = min(ll_max_bw, bus)
                elif protocol == LL128:
                    bus = min(bus, graph_channels * PER_CH_MAX_RING_LL128_BW[arch][index2])
                algbw = bus * nranks / nsteps
                per_channel = bw * factor * nranks / nsteps
                if collective in (REDUCE, BROADCAST):
                    hops = Hops(0.0 if nodes > 1 else intra, 1 if nodes > 1 else 0)
                else:
                    overhead = 0.0
                    if nodes > 1:   # the proxy thread posts every network step
                        overhead = NET_OVERHEAD_US.get(cpu, 1.0) * (3 if protocol == SIMPLE else 1)
                    hops = Hops((nsteps - inter_steps) * max(intra, overhead), inter_steps)
            elif algorithm == TREE:
                bw = bw_intra if nodes <= 2 else bw_inter   # tuning.cc, as for rings
                factor = {LL: 1 / 3.8, LL128: 7 / 9 if nodes == 1 else 120 / 128, SIMPLE: 1.0}[protocol]
                bus = min(bw * graph_channels * .92, graph_channels * PER_CH_MAX_TREE_BW[arch][index2]) * factor
                if protocol == LL:
                    bus = min(bus, ll_max_bw)
                elif protocol == LL128:
                    bus = min(bus, graph_channels * PER_CH_MAX_TREE_LL128_BW[arch][index2])
                algbw = bus * .5
                per_channel = bw * .92 * factor * .5
                hops = Hops(2 * (local - 1) * intra, 2 * log2i(nodes))
            else:   # NVLS, NVLS-tree: the switch reduces; each channel's share, both ways for all-reduce
                raw = bw_intra * (graph_channels - 1) / graph_channels
                raw *= 2 if collective == ALL_REDUCE else (local - 1) / local
                per_channel = raw * NVLS_EFFICIENCY[arch]
                across = bw_inter * (2 if algorithm == NVLS_TREE and nodes <= 2 else 1)
                cap = PER_CH_MAX_NVLS_TREE_BW[arch][index2] if algorithm == NVLS_TREE else math.inf
                bus = min(per_channel, across, cap) * graph_channels
                conversion = nranks / nsteps if collective == ALL_REDUCE else 1.0
                algbw = bus * conversion
                if not tuner.nvls_efficiency:   # 2.19-2.27: the graph's bandwidth, 5/6 of it for all-reduce
                    legacy = min(bw_intra, bw_inter if algorithm == NVLS or nodes <= 2 else bw_inter / 2)
                    algbw = legacy * graph_channels * (5 / 6 if collective == ALL_REDUCE else 1.0)
                # executed: the graph's bandwidth without NCCL's empirical nvlsEfficiency (the
                # per-chunk syncs execution counts stand for it), under the same caps: in one
                # node bwInter is NVLink too; across nodes the NICs and NCCL's NVLS-tree cap
                if algorithm == NVLS:
                    intra_gbps, inter_gbps = min(raw, across, cap) * graph_channels * conversion, math.inf
                else:
                    intra_gbps = raw * graph_channels * conversion
                    inter_gbps = min(across, cap) * graph_channels * conversion
                per_channel = raw * graph_channels * conversion   # over its channels, below
                hops = Hops(intra, 1 if algorithm == NVLS and nodes > 1 else
                            2 * log2i(nodes) if nodes > 1 else 0)
                if algorithm == NVLS:
                    base = 0.0
            latency = base + hops.intra_us + hops.inter_hops * (inter_hw + net_hops * latency_inter)
            # NVLS only when the profile gives nvls_channels (algorithms)
            if algorithm in (NVLS, NVLS_TREE):
                channels = int(cast(Sourced, nccl_of(profile).nvls_channels).value)
            elif nodes > 1 and network is not None:   # across nodes: the channels the NICs' search found
                channels = comm_channels(profile, graph_channels, bw_inter)
            else:
                channels = int(nccl_of(profile).channels.value)
            if algorithm in (NVLS, NVLS_TREE):   # NVLS always runs on all of its channels
                per_channel /= channels
            elif nodes > 1:   # rings and trees across nodes: the NICs bound them
                intra_gbps, inter_gbps = math.inf, algbw
            else:
                intra_gbps, inter_gbps = algbw, math.inf
            yield Pair(algorithm, protocol, latency, algbw, channels, per_channel, intra_gbps, inter_gbps,
                        base, hops.intra_us, hops.inter_hops, inter_hw, net_hops,
                        channels if algorithm in (NVLS, NVLS_TREE) else graph_channels)
