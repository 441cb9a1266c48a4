"""NCCL's cost model: which algorithm and protocol NCCL picks for a collective, and how long it takes.

This follows the cost model NCCL runs on Volta to Blackwell GPUs, as published in its source
(NVIDIA/nccl `src/tuning/ring.cc`, `tree.cc`, `nvls.cc` and the constants of
`src/tuning/cost_model.cc` at commits 1fc949c5 / 53947894; the same formulas as
`src/graph/tuning.cc` of NCCL 2.19 with newer constants; `src/enqueue.cc` for channels and chunks):

- every (algorithm, protocol) pair gets a latency (`baseLatencies` + per-hop `hwLatencies` over
  NVLink, PCI or the network) and a bandwidth (channels x per-channel bandwidth, then NCCL's
  per-protocol refinements: LL carries half the bus bandwidth up to `llMaxBws`, LL128 92%, tree
  92% capped per channel, NVLS `nvlsEfficiency` of twice its per-channel bandwidth), converted
  from bus to algorithm bandwidth;
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
from typing import Final, Iterator, Literal, cast

from chakra_core.hardware.profiles import Profile, Sourced

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE, ALL_TO_ALL = (
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")
COLLECTIVES = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE, ALL_TO_ALL)
ProtocolName = Literal["LL", "LL128", "Simple"]
"""NCCL's protocols (the keys of a calibration's latency_scale)."""
AlgorithmName = Literal["ring", "tree", "nvls", "nvls_tree"]
"""The algorithms modelled (the keys of a calibration's bandwidth_scale)."""
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
_ARCH = {"volta": 0, "ampere": 1, "hopper": 2}
# cost_model.cc tables, [architecture][1 node, 2 nodes, more]; llMaxBws' multi-node rows go by CPU vendor
LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0))
PER_CH_MAX_RING_LL128_BW = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7))
PER_CH_MAX_TREE_LL128_BW = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0))
PER_CH_MAX_TREE_BW = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0))
PER_CH_MAX_NVLS_TREE_BW = ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), (0.0, 57.7, 45.5))
NVLS_EFFICIENCY = (0.0, 0.0, 0.85)
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
    algorithm: AlgorithmName
    protocol: ProtocolName
    latency_us: float
    bandwidth_gbps: float   # algorithm bandwidth, all channels, NCCL's caps applied
    channels: int           # channels NCCL starts from (comm->nChannels, or NVLS channels)
    channel_gbps: float = math.inf   # algorithm bandwidth one channel (CTA) moves before the caps


def _log2i(n: int) -> int:
    return n.bit_length() - 1 if n > 0 else 0


class NcclModel:
    """NCCL's algorithm and protocol choice and time for one hardware profile."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self._tables: dict[tuple[str, int, int, bool, float], tuple[_Pair, ...]] = {}
        self.time_us = lru_cache(maxsize=4096)(self._time_us)

    # -- the tuning table ------------------------------------------------------------------------
    def _graph(self, algorithm: str, nodes: int, priced: bool, nic_share: float) -> tuple[int, float, float, float]:
        """(channels of the search graph, bwIntra, bwInter, inter-node latency) as NCCL's topology
        search finds them: within a node the NVLink rings; the NVLS graph with one channel (head)
        per GPU; across nodes one channel per NIC at the NIC's rate (capped by what NVLink gives
        that channel), NVLS heads sharing the node's NICs. A communicator reaches `nic_share` of
        a node's NICs (its GPUs' rails, chakra_sim_system_nccl.sharing): its channels share
        that bandwidth. The latency is what the network plugin reports to NCCL, or with `priced`
        what a network step really costs."""
        spec = self.profile.nccl
        network = self.profile.network
        if algorithm in (NVLS, NVLS_TREE):
            assert spec.nvls_bus_bw_gbps is not None   # NVLS only when the profile gives it (_algorithms)
            channels = self.profile.gpus_per_node
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
        nic_gbps = network.nic_gbits.value / 8
        if algorithm == NVLS_TREE:
            return channels, bw_intra, network.nics_per_node.value * nic_share * nic_gbps / channels, latency
        nics = int(network.nics_per_node.value)
        # one channel per NIC of the node; with part of the node, each gets its part of a NIC
        bw = min(nic_gbps * nic_share, channels * bw_intra / nics)
        return nics, bw, bw, latency

    def pairs(self, collective: str, nranks: int, nodes: int, priced: bool = False,
              nic_share: float = 1.0) -> tuple[_Pair, ...]:
        """Every (algorithm, protocol) NCCL considers, with its latency and bandwidth (uncalibrated):
        as NCCL estimates them to choose, or with `priced` as the hardware runs them (where the
        network plugin reports NCCL another latency than a step costs). `nic_share`: the
        fraction of each node's NICs the communicator's GPUs drive (1: the whole node)."""
        key = (collective, nranks, nodes, priced, nic_share)
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = tuple(self._build(collective, nranks, nodes, priced, nic_share))
        return table

    def _algorithms(self, collective: str, nodes: int, local: int) -> list[AlgorithmName]:
        spec = self.profile.nccl
        nvls = self.profile.node.nvls and spec.nvls_channels is not None and spec.nvls_bus_bw_gbps is not None
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

    def _build(self, collective: str, nranks: int, nodes: int, priced: bool, nic_share: float) -> Iterator[_Pair]:
        arch = _ARCH[self.profile.gpu.architecture]
        index2 = min(nodes, 3) - 1
        cpu = self.profile.node.cpu_vendor
        ll_max_bw = LL_MAX_BW[arch if nodes == 1 else (1 if cpu == "amd" else 0)][index2]
        local = nranks // nodes
        intra_hw = "nvlink" if self.profile.gpu.nvlink_links.value > 0 else "pci"
        nsteps = {ALL_REDUCE: 2 * (nranks - 1), ALL_GATHER: nranks - 1, REDUCE_SCATTER: nranks - 1}.get(
            collective, nranks)
        inter_steps = 0 if nodes == 1 else {ALL_REDUCE: 2 * (nodes - 1)}.get(collective, nodes - 1)
        network = self.profile.network
        allowed = PROTOCOLS if nodes == 1 or network is None or network.protocols is None else network.protocols
        flush = not priced or network is None or network.gdr_flush
        for algorithm in self._algorithms(collective, nodes, local):
            graph_channels, bw_intra, bw_inter, latency_inter = self._graph(algorithm, nodes, priced, nic_share)
            for p, protocol in enumerate(PROTOCOLS):
                if (algorithm in (NVLS, NVLS_TREE) and protocol != SIMPLE) or protocol not in allowed:
                    continue
                intra = HW_LATENCY[intra_hw][algorithm][p]
                inter = intra
                if nodes > 1:
                    hop = TREE if algorithm == RING and local == 1 else algorithm
                    inter = HW_LATENCY["net"][hop][p] + latency_inter
                    if protocol == SIMPLE and flush:
                        inter += latency_inter   # the GPUDirect flush NCCL counts on the network
                latency = BASE_LATENCY[algorithm][p]
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
                        latency += inter if nodes > 1 else intra
                    else:
                        overhead = 0.0
                        if nodes > 1:   # the proxy thread posts every network step
                            overhead = NET_OVERHEAD_US.get(cpu, 1.0) * (3 if protocol == SIMPLE else 1)
                        latency += (nsteps - inter_steps) * max(intra, overhead) + inter_steps * inter
                elif algorithm == TREE:
                    bw = min(bw_inter, bw_intra)
                    factor = {LL: 1 / 3.8, LL128: 7 / 9 if nodes == 1 else 120 / 128, SIMPLE: 1.0}[protocol]
                    bus = min(bw * graph_channels * .92, graph_channels * PER_CH_MAX_TREE_BW[arch][index2]) * factor
                    if protocol == LL:
                        bus = min(bus, ll_max_bw)
                    elif protocol == LL128:
                        bus = min(bus, graph_channels * PER_CH_MAX_TREE_LL128_BW[arch][index2])
                    algbw = bus * .5
                    per_channel = bw * .92 * factor * .5
                    latency += 2 * ((local - 1) * intra + _log2i(nodes) * inter)
                else:   # NVLS, NVLS-tree: the switch reduces; each channel's share, both ways for all-reduce
                    per_channel = bw_intra * NVLS_EFFICIENCY[arch] * (graph_channels - 1) / graph_channels
                    per_channel *= 2 if collective == ALL_REDUCE else (local - 1) / local
                    across = bw_inter * (2 if algorithm == NVLS_TREE and nodes <= 2 else 1)
                    cap = PER_CH_MAX_NVLS_TREE_BW[arch][index2] if algorithm == NVLS_TREE else math.inf
                    bus = min(per_channel, across, cap) * graph_channels
                    algbw = bus * nranks / nsteps if collective == ALL_REDUCE else bus
                    per_channel = math.inf   # NVLS always runs on all of its channels
                    if algorithm == NVLS:
                        latency = intra + (inter if nodes > 1 else 0.0)
                    else:
                        latency += intra + 2 * _log2i(nodes) * inter
                # NVLS only when the profile gives nvls_channels (_algorithms)
                channels = int(cast(Sourced, self.profile.nccl.nvls_channels).value) \
                    if algorithm in (NVLS, NVLS_TREE) else int(self.profile.nccl.channels.value)
                yield _Pair(algorithm, protocol, latency, algbw, channels, per_channel)

    # -- one collective ---------------------------------------------------------------------------
    def _time_us(self, collective: str, nbytes: int, nranks: int, nodes: int, nic_share: float = 1.0) -> Choice:
        """How NCCL runs a collective of `nbytes` among `nranks` GPUs on `nodes` nodes whose
        GPUs drive `nic_share` of each node's NICs, and how long it takes alone."""
        if collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
        if nranks <= 1 or nbytes <= 0:
            return Choice(RING, SIMPLE, 0.0, 0.0, math.inf, 0)
        if collective == ALL_TO_ALL:
            return self._all_to_all(nbytes, nranks, nodes)
        best: tuple[float, _Pair, float, float] | None = None
        for pair in self.pairs(collective, nranks, nodes, nic_share=nic_share):
            latency, bw = self._latency_bandwidth(pair, collective, nbytes, nranks, nodes)
            estimate = latency + nbytes / (1000 * bw)
            if best is None or estimate < best[0]:
                best = (estimate, pair, latency, bw)
        assert best is not None
        _, pair, latency, bw = best
        if self.profile.network is not None and nodes > 1:   # priced as the hardware runs it
            pair = next(p for p in self.pairs(collective, nranks, nodes, True, nic_share)
                        if (p.algorithm, p.protocol) == (pair.algorithm, pair.protocol))
            latency, bw = self._latency_bandwidth(pair, collective, nbytes, nranks, nodes)
        channels = self._running_channels(pair, nbytes, nranks)
        bw = min(bw, pair.channel_gbps * channels)   # each running channel at its own rate
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
    def _running_channels(pair: _Pair, nbytes: int, nranks: int) -> int:
        """Channels NCCL launches for this size (topoGetAlgoInfo): NVLS always uses all of its own."""
        if pair.algorithm in (NVLS, NVLS_TREE):
            return pair.channels
        threads, threshold = MAX_THREADS[pair.protocol], THREAD_THRESHOLD[pair.protocol]
        if pair.algorithm == RING and pair.protocol == LL:
            threshold *= nranks   # tuning.cc: ring LL's threshold scales with the ranks
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
        # remote: network is not None (not narrowed at run time: once per message)
        if remote and network.extra_latency_us is not None:  # type: ignore[union-attr]  # see above
            latency += network.extra_latency_us.value  # type: ignore[union-attr]  # see above
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
