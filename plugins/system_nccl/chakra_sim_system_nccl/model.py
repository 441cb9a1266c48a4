"""NCCL's choice of algorithm and protocol for a collective, and the time it takes.

The choice follows the cost model NCCL runs on Volta to Blackwell GPUs, as published in its source
(NVIDIA/nccl `src/tuning/ring.cc`, `tree.cc`, `nvls.cc` and the constants of
`src/tuning/cost_model.cc` at commits 1fc949c5 / 53947894; the same formulas as
`src/graph/tuning.cc` of NCCL 2.19 with newer constants; `src/enqueue.cc` for channels):

- every (algorithm, protocol) pair gets a latency (`baseLatencies` + per-hop `hwLatencies` over
  NVLink, PCI or the network) and a bandwidth (channels x per-channel bandwidth, then NCCL's
  per-protocol refinements: LL carries half the bus bandwidth up to `llMaxBws`, LL128 92%, tree
  92% capped per channel, NVLS `nvlsEfficiency` of twice its per-channel bandwidth), converted
  from bus to algorithm bandwidth;
- NCCL estimates a collective of `nbytes` at `latency + nbytes / (1000 x bandwidth)` microseconds
  on each pair (tree bandwidths scaled by NCCL's `treeCorrectionFactor` for medium sizes) and
  runs it with the fastest;
- at run time NCCL gives small messages fewer channels (`while (nBytes < nc*nt*threadThreshold)
  nc--` in `topoGetAlgoInfo`).

That estimate ranks algorithms; it is not the time. The time is what NCCL then executes
(chakra_sim_system_nccl.execution): the chunks, loops and steps of the chosen algorithm, each
step's hop latency and synchronisation, the NVLS pipeline, the host's launches, over the
bandwidth of the channels that run.

Algorithms: ring, tree, NVLS (NVLink SHARP, one node) and NVLS-tree (NVLS in each node, a tree
between nodes). CollNet (in-network reduction with SHARP switches) and PAT are not modelled: NCCL
only uses CollNet with the SHARP plugin, which a profile cannot yet describe.

All-to-all is not an NCCL collective but grouped send/receive: each rank sends (n-1)/n of its
buffer, through NVLink to ranks of its node and through its NIC share to the others; it is
timed as the slower of the two plus one step's latency.

What the hardware contributes (channel counts, bandwidth per channel, NICs, launch cost) comes
from a `Profile` (chakra_core.hardware.profiles); a calibrated profile replaces physical
parameters (per-step sync, hop latency, NVLink and NIC efficiency, network latency, launch
cost) with values `chakra-sim calibrate` fitted to a user's nccl-tests logs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Final, Iterator, Literal, cast

from chakra_core.hardware.profiles import Profile, Sourced
from chakra_sim_system_nccl import execution

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
    """The chunk NCCL's NVLS all-reduce moves for a message of `nbytes` in one node (calcCollChunking)."""
    return execution.nvls_chunk(nbytes, channels, heads, 1)


@dataclass(frozen=True)
class Choice:
    """How NCCL runs one collective, and how long it takes."""

    algorithm: str
    protocol: str
    time_us: float
    latency_us: float       # what does not scale with the size: launch, hops, syncs, pipeline fill
    bandwidth_gbps: float   # algorithm bandwidth of the channels that run, GB/s (10^9 B/s)
    channels: int
    chunk_bytes: int = 0    # the chunk each channel moves per step
    steps: int = 0          # steps each channel executes


@dataclass(frozen=True)
class _Pair:
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


def _log2i(n: int) -> int:
    return n.bit_length() - 1 if n > 0 else 0


class NcclModel:
    """NCCL's algorithm and protocol choice and time for one hardware profile."""

    def __init__(self, profile: Profile, gpus_per_thread: int = 1, cuda_graph: bool = False) -> None:
        self.profile = profile
        calibration = profile.calibration
        launch = profile.node.kernel_launch_us.value if profile.node.kernel_launch_us else 0.0
        if calibration is not None and calibration.launch_us is not None:
            launch = calibration.launch_us
        self.host_issue_us = execution.host_issue_us(gpus_per_thread, cuda_graph, launch)
        """Host time to issue one collective (the launch mode): a floor on back-to-back collectives."""
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
                inter_hw = 0.0
                net_hops = 0.0   # network latencies a pass pays (a Simple step twice with the flush)
                hops = Hops()
                if nodes > 1:
                    hop = TREE if algorithm == RING and local == 1 else algorithm
                    inter_hw = HW_LATENCY["net"][hop][p]
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
                    bw = min(bw_inter, bw_intra)
                    factor = {LL: 1 / 3.8, LL128: 7 / 9 if nodes == 1 else 120 / 128, SIMPLE: 1.0}[protocol]
                    bus = min(bw * graph_channels * .92, graph_channels * PER_CH_MAX_TREE_BW[arch][index2]) * factor
                    if protocol == LL:
                        bus = min(bus, ll_max_bw)
                    elif protocol == LL128:
                        bus = min(bus, graph_channels * PER_CH_MAX_TREE_LL128_BW[arch][index2])
                    algbw = bus * .5
                    per_channel = bw * .92 * factor * .5
                    hops = Hops(2 * (local - 1) * intra, 2 * _log2i(nodes))
                else:   # NVLS, NVLS-tree: the switch reduces; each channel's share, both ways for all-reduce
                    raw = bw_intra * (graph_channels - 1) / graph_channels
                    raw *= 2 if collective == ALL_REDUCE else (local - 1) / local
                    per_channel = raw * NVLS_EFFICIENCY[arch]
                    across = bw_inter * (2 if algorithm == NVLS_TREE and nodes <= 2 else 1)
                    cap = PER_CH_MAX_NVLS_TREE_BW[arch][index2] if algorithm == NVLS_TREE else math.inf
                    bus = min(per_channel, across, cap) * graph_channels
                    conversion = nranks / nsteps if collective == ALL_REDUCE else 1.0
                    algbw = bus * conversion
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
                                2 * _log2i(nodes) if nodes > 1 else 0)
                    if algorithm == NVLS:
                        base = 0.0
                latency = base + hops.intra_us + hops.inter_hops * (inter_hw + net_hops * latency_inter)
                # NVLS only when the profile gives nvls_channels (_algorithms)
                channels = int(cast(Sourced, self.profile.nccl.nvls_channels).value) \
                    if algorithm in (NVLS, NVLS_TREE) else int(self.profile.nccl.channels.value)
                if algorithm in (NVLS, NVLS_TREE):   # NVLS always runs on all of its channels
                    per_channel /= channels
                elif nodes > 1:   # rings and trees across nodes: the NICs bound them
                    intra_gbps, inter_gbps = math.inf, algbw
                else:
                    intra_gbps, inter_gbps = algbw, math.inf
                yield _Pair(algorithm, protocol, latency, algbw, channels, per_channel, intra_gbps, inter_gbps,
                            base, hops.intra_us, hops.inter_hops, inter_hw, net_hops,
                            channels if algorithm in (NVLS, NVLS_TREE) else graph_channels)

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
        return self._executed(self._chosen(collective, nbytes, nranks, nodes, nic_share), collective, nbytes,
                              nranks, nodes)

    def _chosen(self, collective: str, nbytes: int, nranks: int, nodes: int, nic_share: float) -> _Pair:
        """The pair NCCL's estimate ranks fastest, with the network priced as the hardware runs it."""
        best: tuple[float, _Pair] | None = None
        for pair in self.pairs(collective, nranks, nodes, nic_share=nic_share):
            latency, bw = self._latency_bandwidth(pair, collective, nbytes, nranks, nodes)
            estimate = latency + nbytes / (1000 * bw)
            if best is None or estimate < best[0]:
                best = (estimate, pair)
        assert best is not None
        pair = best[1]
        if self.profile.network is not None and nodes > 1:   # priced as the hardware runs it
            pair = next(p for p in self.pairs(collective, nranks, nodes, True, nic_share)
                        if (p.algorithm, p.protocol) == (pair.algorithm, pair.protocol))
        return pair

    def tuner_estimate_us(self, collective: str, nbytes: int, nranks: int, nodes: int) -> float:
        """NCCL's own estimate of its choice (latency + bytes / bandwidth of the running channels):
        what this layer took as the time before it timed the execution; for comparisons."""
        if collective == ALL_TO_ALL or nranks <= 1 or nbytes <= 0:
            return self.time_us(collective, nbytes, nranks, nodes).time_us
        pair = self._chosen(collective, nbytes, nranks, nodes, 1.0)
        latency, bw = self._latency_bandwidth(pair, collective, nbytes, nranks, nodes)
        if pair.algorithm in (RING, TREE):   # each running channel at its own rate
            bw = min(bw, pair.channel_gbps * self._running_channels(pair, nbytes, nranks))
        return latency + nbytes / (1000 * bw)

    def _executed(self, pair: _Pair, collective: str, nbytes: int, nranks: int, nodes: int) -> Choice:
        """The time of NCCL's choice as its kernels execute it (chakra_sim_system_nccl.execution)."""
        profile, calibration = self.profile, self.profile.calibration
        intra_hw = "nvlink" if profile.gpu.nvlink_links.value > 0 else "pci"
        hop_scale = calibration.hop_latency_scale if calibration is not None else 1.0
        nvlink_eff = calibration.nvlink_efficiency if calibration is not None else 1.0
        nic_eff = calibration.nic_efficiency if calibration is not None else 1.0
        hops = pair.intra_hops_us * hop_scale + pair.inter_hops * (pair.inter_hw_us
                                                                  + pair.net_latencies * self._network_latency_us())
        # NCCL's own corrections where this model does not count steps one by one: the tree's
        # pipeline at medium sizes (treeCorrectionFactor), the multi-node ring's latency plateau
        correction, plateau = self._corrections(pair, collective, nbytes, nranks, nodes)
        latency = pair.base_us + hops * plateau
        channels = self._running_channels(pair, nbytes, nranks)
        plan = execution.plan(pair.algorithm, collective, pair.protocol, nbytes, nranks, nodes, channels)
        efficiency = nic_eff if nodes > 1 and pair.algorithm in (RING, TREE) else nvlink_eff
        cap = correction * min(pair.intra_gbps * nvlink_eff, pair.inter_gbps * nic_eff,
                               pair.channel_gbps * channels * efficiency)
        # a graph channel's bandwidth is shared by the running channels (CTAs) that use it
        channel_gbps = pair.channel_gbps * efficiency * min(1.0, pair.graph_channels / channels)
        sync = 0.0   # LL and LL128 carry their flags in the data
        if pair.protocol == SIMPLE:   # a fence and a flag across NVLink: NCCL's LL hop over it
            sync = HW_LATENCY[intra_hw][RING][0]
            if calibration is not None and calibration.step_overhead_us is not None:
                sync = calibration.step_overhead_us
        # (the proxy's post of each network step is in the hops' latency, as NCCL counts it)
        bw = execution.effective_gbps(cap, channels, channel_gbps, plan.slice_bytes, sync)
        staging = self._host_staging()
        if staging is not None and math.isfinite(pair.inter_gbps) and nodes > 1:
            # each network step is copied through host memory: the GPU's PCIe link bounds the NICs,
            # and each hop stores and forwards a chunk over it on both sides
            bw *= min(1.0, staging[1])
            latency += pair.inter_hops * 2 * plan.chunk_bytes / (1000 * staging[0])
        if plan.copy_hops:   # NVLS: the copies' hops, then the pipeline's fill
            latency += plan.copy_hops * HW_LATENCY[intra_hw][RING][2] * hop_scale
        if plan.fill_chunks and math.isfinite(channel_gbps):
            latency += plan.fill_chunks * plan.chunk_bytes / (1000 * channel_gbps)
        transfer = nbytes / (1000 * bw)
        # back-to-back collectives cannot go faster than the host issues them
        latency = max(latency, self.host_issue_us - transfer)
        return Choice(pair.algorithm, pair.protocol, latency + transfer, latency, bw, channels,
                      plan.chunk_bytes, plan.steps)

    def _host_staging(self) -> tuple[float, float] | None:
        """For a host-staged network: (one GPU's PCIe bandwidth, GB/s; the node's PCIe bandwidth
        over its NICs' line rate); None for GPUDirect."""
        network, pcie = self.profile.network, self.profile.node.pcie_gbps
        if network is None or network.transport != "host_staged":
            return None
        assert pcie is not None   # the profile's own check (Profile._staging_needs_pcie)
        nic_total = network.nics_per_node.value * network.nic_gbits.value / 8
        return pcie.value, pcie.value * self.profile.gpus_per_node / nic_total

    def _network_latency_us(self) -> float:
        """What one network step costs beyond NCCL's table: calibrated, or the profile's."""
        calibration, network = self.profile.calibration, self.profile.network
        if calibration is not None and calibration.network_latency_us is not None:
            return calibration.network_latency_us
        return network.extra_latency_us.value if network is not None and network.extra_latency_us else 0.0

    def _latency_bandwidth(self, pair: _Pair, collective: str, nbytes: int, nranks: int,
                           nodes: int) -> tuple[float, float]:
        """ncclTopoGetAlgoTime's latency and bandwidth for this size (all channels)."""
        correction, plateau = self._corrections(pair, collective, nbytes, nranks, nodes)
        return pair.latency_us * plateau, pair.bandwidth_gbps * correction

    def _corrections(self, pair: _Pair, collective: str, nbytes: int, nranks: int,
                     nodes: int) -> tuple[float, float]:
        """(factor on the bandwidth, factor on the latency) ncclTopoGetAlgoTime applies at this size."""
        log_size = _log2i(nbytes >> 6)
        correction = plateau = 1.0
        if pair.algorithm == TREE and log_size < 23:
            correction = TREE_CORRECTION[PROTOCOLS.index(pair.protocol)][log_size]
        if pair.algorithm == RING and pair.protocol == SIMPLE and nodes > 1 \
                and collective == ALL_REDUCE and nbytes / (pair.channels * nranks) >= 64:
            plateau = 1.9 if self.profile.gpu.architecture == "volta" else 1.4   # ring plateau
        return correction, plateau

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
        share of the node's NICs across nodes (each at its calibrated efficiency)."""
        profile, calibration = self.profile, self.profile.calibration
        if same_node or profile.network is None:
            bw = profile.nccl.graph_channels.value * profile.nccl.channel_bw_gbps.value
            return bw * (calibration.nvlink_efficiency if calibration is not None else 1.0)
        network = profile.network
        bw = network.nics_per_node.value * network.nic_gbits.value / 8 / profile.gpus_per_node
        return bw * (calibration.nic_efficiency if calibration is not None else 1.0)

    def p2p_latency_us(self, same_node: bool) -> float:
        """One Simple-protocol step: NCCL's ring base latency plus one hop over NVLink or the network."""
        remote = not same_node and self.profile.network is not None
        if remote:
            return BASE_LATENCY[RING][2] + HW_LATENCY["net"][RING][2] + self._network_latency_us()
        scale = self.profile.calibration.hop_latency_scale if self.profile.calibration is not None else 1.0
        return BASE_LATENCY[RING][2] + HW_LATENCY["nvlink"][RING][2] * scale

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
