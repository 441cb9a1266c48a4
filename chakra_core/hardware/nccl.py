"""NCCL's cost model: which algorithm and protocol NCCL picks for a collective, and how long it takes.

This follows NCCL's own tuning model, as published in its source
(NVIDIA/nccl `src/graph/tuning.cc` and `src/enqueue.cc` at commit b6475625, NCCL 2.19-2.21):

- every (algorithm, protocol) pair gets a latency (`baseLat` + per-hop `hwLat` over NVLink, PCI
  or the network) and a bandwidth (channels x per-channel bandwidth, then NCCL's per-protocol
  refinements: LL carries 1/4 of the bus bandwidth, LL128 92%, tree 92% capped per channel,
  NVLS 5/6 of its bus bandwidth, ...), converted from bus to algorithm bandwidth;
- a collective of `nbytes` takes `latency + nbytes / (1000 x bandwidth)` microseconds on each
  pair (tree bandwidths scaled by NCCL's `treeCorrectionFactor` for medium sizes), and NCCL
  runs it with the fastest;
- at run time NCCL gives small messages fewer channels (`while (nBytes < nc*nt*threadThreshold)
  nc--` in `topoGetAlgoInfo`): the predicted time uses the bandwidth of the channels that run.

Algorithms: ring, tree, NVLS (NVLink SHARP, one node) and NVLS-tree (NVLS in each node, a tree
between nodes). CollNet (in-network reduction with SHARP switches) is not modelled: NCCL only
uses it with the SHARP plugin, which a profile cannot yet describe.

All-to-all is not an NCCL collective but grouped send/receive: each rank sends (n-1)/n of its
buffer, through NVLink to ranks of its node and through its NIC share to the others; it is
timed as the slower of the two plus one step's latency.

What the hardware contributes (channel counts, bandwidth per channel, NICs) comes from a
`Profile` (chakra_core.hardware.profiles); a calibrated profile adds scale factors that
`chakra-sim calibrate` fits to a user's nccl-tests logs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from chakra_core.hardware.profiles import Profile

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE, ALL_TO_ALL = (
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")
COLLECTIVES = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE, ALL_TO_ALL)
PROTOCOLS = ("LL", "LL128", "Simple")
LL, LL128, SIMPLE = PROTOCOLS
RING, TREE, NVLS, NVLS_TREE = "ring", "tree", "nvls", "nvls_tree"

# tuning.cc: latencies in microseconds, per protocol (LL, LL128, Simple)
BASE_LATENCY = {TREE: (6.8, 14.0, 0.0), RING: (6.6, 14.0, 8.4), NVLS: (0.0, 0.0, 0.0), NVLS_TREE: (0.0, 0.0, 0.0)}
HW_LATENCY = {
    "nvlink": {TREE: (.6, 1.25, 28), RING: (.6, 1.9, 3.4), NVLS: (0, 0, 23), NVLS_TREE: (0, 0, 23)},
    "pci": {TREE: (1.0, 1.9, 28), RING: (1.0, 2.5, 5.7), NVLS: (0, 0, 0), NVLS_TREE: (0, 0, 0)},
    "net": {TREE: (5.0, 8.5, 28), RING: (2.7, 4.0, 14.0), NVLS: (0, 0, 18), NVLS_TREE: (0, 0, 14)},
}
_ARCH = {"volta": 0, "ampere": 1, "hopper": 2}
# tuning.cc tables, [architecture][1 node, 2 nodes, more]; llMaxBws' multi-node rows go by CPU vendor
LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (87.7, 22.5, 19.0))
PER_CH_MAX_RING_LL128_BW = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7))
PER_CH_MAX_TREE_LL128_BW = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0))
PER_CH_MAX_TREE_BW = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0))
TREE_CORRECTION = (  # powers of two from 64 B, per protocol
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}   # getNetOverhead: proxy post cost per network step
# enqueue.h / device.h: bytes per thread before NCCL adds a channel, and threads per channel
THREAD_THRESHOLD = {LL: 8, LL128: 8, SIMPLE: 64}
MAX_THREADS = {LL: 512, LL128: 640, SIMPLE: 512}
NVLS_CHUNK_SIZES = (16384, 32768, 65536, 131072)
"""calcCollChunking (enqueue.cc): NVLS moves 128 KiB chunks, fewer bytes for smaller messages."""


def nvls_chunk_size(nbytes: int, channels: int, heads: int) -> int:
    """The chunk NCCL's NVLS all-reduce moves for a message of `nbytes` (calcCollChunking)."""
    chunk = 131072
    concurrent = channels * heads
    if nbytes < 64 * concurrent * chunk:
        chunk = 65536
    if nbytes < 8 * concurrent * chunk:
        chunk = 32768
    if nbytes < 2 * concurrent * chunk:
        chunk = 16384
    return chunk


@dataclass(frozen=True)
class Choice:
    """How NCCL runs one collective, and how long it takes."""

    algorithm: str
    protocol: str
    time_us: float
    latency_us: float
    bandwidth_gbps: float   # algorithm bandwidth of the channels that run, GB/s (10^9 B/s)
    channels: int


@dataclass(frozen=True)
class _Pair:
    algorithm: str
    protocol: str
    latency_us: float
    bandwidth_gbps: float
    channels: int           # channels NCCL starts from (comm->nChannels, or NVLS channels)


def _log2i(n: int) -> int:
    return n.bit_length() - 1 if n > 0 else 0


class NcclModel:
    """NCCL's algorithm and protocol choice and time for one hardware profile."""

    def __init__(self, profile: Profile):
        self.profile = profile
        self._tables: dict[tuple[str, int, int], tuple[_Pair, ...]] = {}
        self.time_us = lru_cache(maxsize=4096)(self._time_us)

    # -- the tuning table ------------------------------------------------------------------------
    def _graph(self, algorithm: str, nodes: int) -> tuple[int, float, float, float]:
        """(channels of the search graph, bwIntra, bwInter, inter-node latency) as NCCL's topology
        search would find them: within a node the NVLink rings; across nodes one channel per NIC,
        each at the NIC's rate (capped by what NVLink gives that channel)."""
        nccl = self.profile.nccl
        graph_channels = int(nccl.graph_channels.value)
        bw_intra = nccl.channel_bw_gbps.value
        if algorithm in (NVLS, NVLS_TREE):   # the NVLS graph: one channel (head) per GPU of the node
            graph_channels = self.profile.gpus_per_node
            bw_intra = nccl.nvls_bus_bw_gbps.value / graph_channels
        network = self.profile.network
        if nodes == 1 or network is None:
            return graph_channels, bw_intra, bw_intra, 0.0
        nic_gbps = network.nic_gbits.value / 8
        latency = network.extra_latency_us.value if network.extra_latency_us else 0.0
        if algorithm == NVLS_TREE:
            # NVLS heads share the node's NICs
            per_channel = network.nics_per_node.value * nic_gbps / graph_channels
            return graph_channels, bw_intra, per_channel, latency
        nics = int(network.nics_per_node.value)
        total_intra = graph_channels * bw_intra
        bw = min(nic_gbps, total_intra / nics)
        return nics, bw, bw, latency

    def pairs(self, collective: str, nranks: int, nodes: int) -> tuple[_Pair, ...]:
        """Every (algorithm, protocol) NCCL considers, with its latency and bandwidth (uncalibrated)."""
        key = (collective, nranks, nodes)
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = tuple(self._build(collective, nranks, nodes))
        return table

    def _algorithms(self, collective: str, nodes: int) -> list[str]:
        spec = self.profile.nccl
        nvls = self.profile.node.nvls and spec.nvls_channels is not None and spec.nvls_bus_bw_gbps is not None
        if collective == ALL_REDUCE:
            algorithms = [TREE, RING]
            if nvls:
                algorithms.append(NVLS if nodes == 1 else NVLS_TREE)
            return algorithms
        if collective in (ALL_GATHER, REDUCE_SCATTER) and nvls and nodes == 1:
            return [RING, NVLS]
        return [RING]

    def _build(self, collective: str, nranks: int, nodes: int):
        arch = _ARCH[self.profile.gpu.architecture]
        index2 = min(nodes, 3) - 1
        cpu = getattr(self.profile.node, "cpu_vendor", "intel")
        ll_max_bw = LL_MAX_BW[arch][index2] if nodes == 1 else LL_MAX_BW[1 if cpu == "amd" else 0][index2]
        per_ch_tree = PER_CH_MAX_TREE_BW[arch][index2]
        per_ch_ring_ll128 = PER_CH_MAX_RING_LL128_BW[arch][index2]
        per_ch_tree_ll128 = PER_CH_MAX_TREE_LL128_BW[arch][index2]
        ppn = nranks / nodes
        intra_hw = "nvlink" if self.profile.gpu.nvlink_links.value > 0 else "pci"
        nsteps = {ALL_REDUCE: 2 * (nranks - 1), ALL_GATHER: nranks - 1, REDUCE_SCATTER: nranks - 1}.get(
            collective, nranks)
        inter_steps = {ALL_REDUCE: 2 * nodes if nodes > 1 else 0, ALL_GATHER: nodes - 1,
                       REDUCE_SCATTER: nodes - 1}.get(collective, nodes)
        comm_channels = int(self.profile.nccl.channels.value)
        for algorithm in self._algorithms(collective, nodes):
            graph_channels, bw_intra, bw_inter, latency_inter = self._graph(algorithm, nodes)
            for p, protocol in enumerate(PROTOCOLS):
                if algorithm in (NVLS, NVLS_TREE) and protocol != SIMPLE:
                    continue
                if protocol == LL128 and nodes > 1 and self.profile.network is not None \
                        and "infiniband" not in self.profile.network.fabric.lower() and arch < 2:
                    continue   # LL128 only where NCCL enables it (NVLink, and a PXB/PXN path to the NIC)
                bw = bw_intra if nodes <= 2 else bw_inter
                if algorithm == NVLS:
                    bw = min(bw_intra, bw_inter)
                if algorithm == NVLS_TREE:
                    bw = min(bw_intra, bw_inter if nodes <= 2 else bw_inter / 2)
                bus = graph_channels * bw
                if algorithm == RING and protocol == LL:
                    factor = 1 / 4 if (nodes > 1 or collective in (ALL_REDUCE, REDUCE)) else 1 / 3
                    bus = min(ll_max_bw, bus * factor)
                if algorithm == RING and protocol == LL128:
                    bus = min(bus * (0.7 if ppn < 2 else 0.92), graph_channels * per_ch_ring_ll128)
                if algorithm == TREE:
                    bus = min(bus * .92, graph_channels * per_ch_tree)
                if algorithm == TREE and protocol == LL:
                    bus = min(bus / 3.8, ll_max_bw)
                if algorithm == TREE and protocol == LL128:
                    bus = min(bus * (7 / 9 if nodes == 1 else 120 / 128), graph_channels * per_ch_tree_ll128)
                if algorithm == RING:
                    bus *= nranks / nsteps
                elif algorithm in (NVLS, NVLS_TREE):
                    bus *= 5 / 6
                else:
                    bus *= .5
                latency = BASE_LATENCY[algorithm][p]
                intra = HW_LATENCY[intra_hw][algorithm][p]
                inter = HW_LATENCY["net"][algorithm][p] + latency_inter
                if protocol == SIMPLE:
                    inter += latency_inter   # the flush NCCL adds on the network
                local = nranks // nodes - 1
                if algorithm == RING:
                    if collective in (REDUCE, BROADCAST):
                        latency += HW_LATENCY["net" if nodes > 1 else intra_hw][RING][p]
                    else:
                        overhead = 0.0
                        if nodes > 1:
                            overhead = NET_OVERHEAD_US.get(cpu, 1.0) * (3 if protocol == SIMPLE else 1)
                        latency += (nsteps - inter_steps) * max(intra, overhead) + inter_steps * inter
                elif algorithm == TREE:
                    latency += 2 * (local * intra + _log2i(nodes) * inter)
                elif algorithm == NVLS:
                    latency = intra + (inter if nodes > 1 else 0)
                else:
                    latency += intra + 2 * _log2i(nodes) * inter
                channels = int(self.profile.nccl.nvls_channels.value) if algorithm in (NVLS, NVLS_TREE) \
                    else comm_channels
                yield _Pair(algorithm, protocol, latency, bus, channels)

    # -- one collective ---------------------------------------------------------------------------
    def _time_us(self, collective: str, nbytes: int, nranks: int, nodes: int) -> Choice:
        if collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
        if nranks <= 1 or nbytes <= 0:
            return Choice(RING, SIMPLE, 0.0, 0.0, math.inf, 0)
        if collective == ALL_TO_ALL:
            return self._all_to_all(nbytes, nranks, nodes)
        best: tuple[float, _Pair, float, float] | None = None
        for pair in self.pairs(collective, nranks, nodes):
            latency, bw = self._latency_bandwidth(pair, collective, nbytes, nranks, nodes)
            estimate = latency + nbytes / (1000 * bw)
            if best is None or estimate < best[0]:
                best = (estimate, pair, latency, bw)
        assert best is not None
        _, pair, latency, bw = best
        channels = self._running_channels(pair, nbytes)
        bw = bw * channels / pair.channels
        calibration = self.profile.calibration
        if calibration is not None:   # how fast NCCL's choice really runs; the choice stays NCCL's
            latency *= calibration.latency_scale.get(pair.protocol, 1.0)
            if pair.algorithm == NVLS and calibration.nvls_chunk_scale:
                bw *= calibration.nvls_chunk_scale.get(nvls_chunk_size(nbytes, pair.channels, nranks), 1.0)
            else:
                bw *= calibration.bandwidth_scale.get(pair.algorithm, 1.0)
        return Choice(pair.algorithm, pair.protocol, latency + nbytes / (1000 * bw), latency, bw, channels)

    def _latency_bandwidth(self, pair: _Pair, collective: str, nbytes: int, nranks: int,
                           nodes: int) -> tuple[float, float]:
        """ncclTopoGetAlgoTime's latency and bandwidth for this size (all channels)."""
        bw = pair.bandwidth_gbps
        log_size = _log2i(nbytes >> 6)
        if pair.algorithm == TREE and log_size < 23:
            bw *= TREE_CORRECTION[PROTOCOLS.index(pair.protocol)][log_size]
        latency = pair.latency_us
        if pair.algorithm == RING and pair.protocol == SIMPLE and nodes > 1 \
                and collective == ALL_REDUCE and nbytes / (pair.channels * nranks) >= 64:
            latency *= 1.9 if self.profile.gpu.architecture == "volta" else 1.4   # ring plateau
        return latency, bw

    @staticmethod
    def _running_channels(pair: _Pair, nbytes: int) -> int:
        """Channels NCCL launches for this size (topoGetAlgoInfo): NVLS always uses all of its own."""
        if pair.algorithm in (NVLS, NVLS_TREE):
            return pair.channels
        threads, threshold = MAX_THREADS[pair.protocol], THREAD_THRESHOLD[pair.protocol]
        channels = pair.channels
        while nbytes < channels * threads * threshold and channels >= 2:
            channels -= 1
        return channels

    # -- point to point ----------------------------------------------------------------------------
    def p2p_bandwidth_gbps(self, same_node: bool) -> float:
        """One GPU's send bandwidth: what NCCL's ring search finds on its NVLinks within a node, its
        share of the node's NICs across nodes."""
        profile = self.profile
        if same_node or profile.network is None:
            bw = profile.nccl.graph_channels.value * profile.nccl.channel_bw_gbps.value
        else:
            network = profile.network
            bw = network.nics_per_node.value * network.nic_gbits.value / 8 / profile.gpus_per_node
        if profile.calibration is not None:
            bw *= profile.calibration.bandwidth_scale.get(RING, 1.0)
        return bw

    def p2p_latency_us(self, same_node: bool) -> float:
        """One Simple-protocol step: NCCL's ring base latency plus one hop over NVLink or the network."""
        network = self.profile.network
        remote = not same_node and network is not None
        latency = BASE_LATENCY[RING][2] + HW_LATENCY["net" if remote else "nvlink"][RING][2]
        if remote and network.extra_latency_us is not None:
            latency += network.extra_latency_us.value
        if self.profile.calibration is not None:
            latency *= self.profile.calibration.latency_scale.get(SIMPLE, 1.0)
        return latency

    def p2p_time_us(self, nbytes: int, same_node: bool) -> float:
        """A send of `nbytes` to one peer (NCCL send/recv)."""
        return self.p2p_latency_us(same_node) + nbytes / (1000 * self.p2p_bandwidth_gbps(same_node))

    def fan_time_us(self, local_bytes: float, remote_bytes: float) -> Choice:
        """One GPU exchanging `local_bytes` with peers of its node and `remote_bytes` with other
        nodes' at once (all-to-all; a gather's or scatter's root): the slower side plus one step."""
        remote = remote_bytes > 0 and self.profile.network is not None
        time = local_bytes / (1000 * self.p2p_bandwidth_gbps(True))
        if remote:
            time = max(time, remote_bytes / (1000 * self.p2p_bandwidth_gbps(False)))
        latency = self.p2p_latency_us(not remote)
        total = local_bytes + remote_bytes
        bw = total / (1000 * time) if time > 0 else math.inf
        return Choice("p2p", SIMPLE, latency + time, latency, bw, 0)

    def _all_to_all(self, nbytes: int, nranks: int, nodes: int) -> Choice:
        per_peer = nbytes / nranks
        local_peers = nranks // nodes - 1
        return self.fan_time_us(per_peer * local_peers, per_peer * (nranks - 1 - local_peers))
