"""NCCL's choice of algorithm and protocol for a collective, and the time it takes.

The choice follows the cost model NCCL runs on Volta to Blackwell GPUs, as published in its source
(`src/enqueue.cc` for channels):

- every (algorithm, protocol) pair gets NCCL's latency and bandwidth (chakra_sim_system_nccl.tuning,
  which cites NCCL's tables);
- NCCL estimates a collective of `nbytes` at `latency + nbytes / (1000 x bandwidth)` microseconds
  on each pair (tree bandwidths scaled by NCCL's `treeCorrectionFactor` for medium sizes) and
  runs it with the fastest, with the tables of the NCCL release that ran (`tuning.TUNERS`: what
  changed between releases; the newest modelled by default);
- at run time NCCL gives small messages fewer channels (`while (nBytes < nc*nt*threadThreshold)
  nc--` in `topoGetAlgoInfo`).

That estimate ranks algorithms; it is not the time. The time is what NCCL then executes
(chakra_sim_system_nccl.execution): the chunks, loops and steps of the chosen algorithm, each
step's hop latency and synchronisation, the NVLS pipeline, the proxy thread's network steps
across nodes, the host's launches, over the bandwidth of the channels that run.

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
from collections.abc import Collection
from dataclasses import dataclass
from functools import lru_cache

from chakra_core import Profile, SimulationError
from chakra_sim_system_nccl import execution, tuning
from chakra_sim_system_nccl.section import calibration_of, nccl_of
from chakra_sim_system_nccl.tuning import (
    ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BASE_LATENCY, BROADCAST, COLLECTIVES, HW_LATENCY, LL, MAX_THREADS,
    NET_OVERHEAD_US, NVLS, NVLS_TREE, PROTOCOLS, REDUCE, REDUCE_SCATTER, RING, SIMPLE, THREAD_THRESHOLD, TREE,
    TREE_CORRECTION, Pair, log2i,
)

__all__ = ["ALL_GATHER", "ALL_REDUCE", "ALL_TO_ALL", "BROADCAST", "COLLECTIVES", "HW_LATENCY", "PROTOCOLS",
           "REDUCE", "REDUCE_SCATTER", "RING", "SIMPLE", "TREE", "NVLS", "NVLS_TREE", "Choice", "NcclModel",
           "nvls_chunk_size"]

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


class NcclModel:
    """NCCL's algorithm and protocol choice and time for one hardware profile."""

    def __init__(self, profile: Profile, gpus_per_thread: int = 1, cuda_graph: bool = False,
                 nccl_version: tuple[int, int, int] | None = None, algorithms: Collection[str] | None = None,
                 protocols: Collection[str] | None = None) -> None:
        self.profile = profile
        self.allowed = (frozenset(algorithms) if algorithms else None, frozenset(protocols) if protocols else None)
        """NCCL_ALGO and NCCL_PROTO: the algorithms and protocols NCCL may choose among (None: all)."""
        self.tuner = tuning.tuner_for(nccl_version)
        """The tables NCCL chooses with (its release's; chakra_sim_system_nccl.tuning.TUNERS)."""
        calibration = self.calibration = calibration_of(profile)
        self.nccl = nccl_of(profile)
        launch = profile.node.kernel_launch_us.value if profile.node.kernel_launch_us else 0.0
        if calibration is not None and calibration.launch_us is not None:
            launch = calibration.launch_us
        self.host_issue_us = execution.host_issue_us(gpus_per_thread, cuda_graph, launch)
        """Host time to issue one collective (the launch mode): a floor on back-to-back collectives."""
        self._tables: dict[tuple[str, int, int, bool, float, tuning.Tuner], tuple[Pair, ...]] = {}
        self.time_us = lru_cache(maxsize=4096)(self._time_us)

    # -- the tuning table ------------------------------------------------------------------------
    def pairs(self, collective: str, nranks: int, nodes: int, priced: bool = False,
              nic_share: float = 1.0, tuner: tuning.Tuner | None = None) -> tuple[Pair, ...]:
        """Every (algorithm, protocol) NCCL considers, with its latency and bandwidth (uncalibrated):
        as NCCL estimates them to choose, or with `priced` as the hardware runs them (where the
        network plugin reports NCCL another latency than a step costs). `nic_share`: the
        fraction of each node's NICs the communicator's GPUs drive (1: the whole node). `tuner`:
        whose tables (default the model's NCCL release's)."""
        tuner = tuner or self.tuner
        key = (collective, nranks, nodes, priced, nic_share, tuner)
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = tuple(tuning.build(self.profile, collective, nranks, nodes, priced,
                                                           nic_share, tuner))
        return table

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
                              nranks, nodes, nic_share)

    def _chosen(self, collective: str, nbytes: int, nranks: int, nodes: int, nic_share: float,
                tuner: tuning.Tuner = tuning.NEWEST) -> Pair:
        """The pair NCCL's estimate (its release's tables) ranks fastest, as `tuner`'s tables price it
        with the network as the hardware runs it: the newest's for the execution (its per-hop
        figures are the latest NCCL publishes), the release's own for its estimate."""
        best: tuple[float, Pair] | None = None
        algorithms, protocols = self.allowed
        for pair in self.pairs(collective, nranks, nodes, nic_share=nic_share):
            if (algorithms is not None and pair.algorithm not in algorithms) or \
                    (protocols is not None and pair.protocol not in protocols):
                continue
            latency, bw = self._latency_bandwidth(pair, collective, nbytes, nranks, nodes)
            estimate = latency + nbytes / (1000 * bw)
            if best is None or estimate < best[0]:
                best = (estimate, pair)
        if best is None:   # NCCL fails the call: "no algorithm/protocol available"
            offered = sorted({f"{p.algorithm}/{p.protocol}" for p in self.pairs(collective, nranks, nodes,
                                                                              nic_share=nic_share)})
            forced = " and ".join(f"{name}={','.join(sorted(values))}" for name, values
                                  in (("NCCL_ALGO", algorithms), ("NCCL_PROTO", protocols)) if values is not None)
            raise SimulationError(f"{forced} leaves NCCL no algorithm for {collective} on {nranks} GPUs over "
                                  f"{nodes} node(s); it considers {', '.join(offered)} there")
        pair = best[1]
        priced = self.profile.network is not None and nodes > 1   # priced as the hardware runs it
        if priced or tuner != self.tuner:
            pair = next(p for p in self.pairs(collective, nranks, nodes, priced, nic_share, tuner)
                        if (p.algorithm, p.protocol) == (pair.algorithm, pair.protocol))
        return pair

    def tuner_estimate_us(self, collective: str, nbytes: int, nranks: int, nodes: int) -> float:
        """NCCL's own estimate of its choice (latency + bytes / bandwidth of the running channels):
        what this layer took as the time before it timed the execution; for comparisons."""
        if collective == ALL_TO_ALL or nranks <= 1 or nbytes <= 0:
            return self.time_us(collective, nbytes, nranks, nodes).time_us
        pair = self._chosen(collective, nbytes, nranks, nodes, 1.0, self.tuner)
        latency, bw = self._latency_bandwidth(pair, collective, nbytes, nranks, nodes)
        if pair.algorithm in (RING, TREE):   # each running channel at its own rate
            bw = min(bw, pair.channel_gbps * self._running_channels(pair, nbytes, nranks))
        return latency + nbytes / (1000 * bw)

    def _executed(self, pair: Pair, collective: str, nbytes: int, nranks: int, nodes: int,
                  nic_share: float = 1.0) -> Choice:
        """The time of NCCL's choice as its kernels execute it (chakra_sim_system_nccl.execution)."""
        profile, calibration = self.profile, self.calibration
        intra_hw = "nvlink" if profile.gpu.nvlink_links.value > 0 else "pci"
        hop_scale = calibration.hop_latency_scale if calibration is not None else 1.0
        nvlink_eff = calibration.nvlink_efficiency if calibration is not None else 1.0
        nic_eff = calibration.nic_efficiency if calibration is not None else 1.0
        hops = pair.intra_hops_us * hop_scale + pair.inter_hops * (pair.inter_hw_us
                                                                  + pair.net_latencies * self._network_latency_us())
        # NCCL's own corrections where this model does not count steps one by one: the tree's
        # pipeline at medium sizes (treeCorrectionFactor), the multi-node ring's latency plateau
        correction, plateau = self._corrections(pair, collective, nbytes, nranks, nodes)
        if pair.algorithm == TREE and pair.protocol == SIMPLE:
            correction = 1.0   # a Simple tree's pipeline is counted chunk by chunk (_tree_fill_us)
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
        if pair.algorithm == TREE and pair.protocol == SIMPLE:
            latency += self._tree_fill_us(plan.chunk_bytes, channels, nranks // nodes, nodes, nic_share)
        if nodes > 1 and profile.network is not None and plan.net_steps:
            # one proxy thread per GPU posts every network step of the channels it serves, one after
            # another (execution.proxy_us): small chunks across nodes wait for it, not for the NIC
            proxy = execution.proxy_us(plan.net_steps, channels, nranks // nodes, self.proxy_post_us())
            if proxy > 0:
                bw = min(bw, nbytes / (1000 * proxy))
        transfer = nbytes / (1000 * bw)
        # back-to-back collectives cannot go faster than the host issues them
        latency = max(latency, self.host_issue_us - transfer)
        return Choice(pair.algorithm, pair.protocol, latency + transfer, latency, bw, channels,
                      plan.chunk_bytes, plan.steps)

    def _tree_fill_us(self, chunk_bytes: int, channels: int, local: int, nodes: int, nic_share: float) -> float:
        """The first chunk's way through a Simple tree (execution.tree_fill_us): an NVLink hop at what
        NCCL allows one channel of a tree (perChMaxTreeBw; the channels' chains start at different
        GPUs, those nearest their NICs, so they do not all cross one GPU's NVLink at once), a
        network hop at the channel's share of the node's NICs, which every channel crosses at once."""
        network = self.profile.network
        nvlink = tuning.PER_CH_MAX_TREE_BW[tuning.ARCH_INDEX[self.profile.gpu.architecture]][min(nodes, 3) - 1]
        nic = math.inf
        if nodes > 1 and network is not None:
            nic = tuning.node_nic_gbps(self.profile) * nic_share / channels
        return execution.tree_fill_us(chunk_bytes, local, nodes, nvlink, nic)

    def _host_staging(self) -> tuple[float, float] | None:
        """For a host-staged network: (one GPU's PCIe bandwidth, GB/s; the node's PCIe bandwidth
        over its NICs' line rate); None for GPUDirect."""
        network, pcie = self.profile.network, self.profile.node.pcie_gbps
        if network is None or network.transport != "host_staged":
            return None
        assert pcie is not None   # the profile's own check (Profile._staging_needs_pcie)
        nic_total = tuning.node_nic_gbps(self.profile)
        return pcie.value, pcie.value * self.profile.gpus_per_node / nic_total

    def proxy_post_us(self) -> float:
        """What the proxy thread spends on one network step: calibrated, or NCCL's getNetOverhead
        (src/graph/tuning.cc: 1 us on Intel hosts, 2 on AMD)."""
        calibration = self.calibration
        if calibration is not None and calibration.proxy_post_us is not None:
            return calibration.proxy_post_us
        return NET_OVERHEAD_US.get(self.profile.node.cpu_vendor, 1.0)

    def _network_latency_us(self) -> float:
        """What one network step costs beyond NCCL's table: calibrated, or the profile's."""
        calibration, network = self.calibration, self.profile.network
        if calibration is not None and calibration.network_latency_us is not None:
            return calibration.network_latency_us
        return network.extra_latency_us.value if network is not None and network.extra_latency_us else 0.0

    def _latency_bandwidth(self, pair: Pair, collective: str, nbytes: int, nranks: int,
                           nodes: int) -> tuple[float, float]:
        """ncclTopoGetAlgoTime's latency and bandwidth for this size (all channels)."""
        correction, plateau = self._corrections(pair, collective, nbytes, nranks, nodes)
        return pair.latency_us * plateau, pair.bandwidth_gbps * correction

    def _corrections(self, pair: Pair, collective: str, nbytes: int, nranks: int,
                     nodes: int) -> tuple[float, float]:
        """(factor on the bandwidth, factor on the latency) ncclTopoGetAlgoTime applies at this size."""
        log_size = log2i(nbytes >> 6)
        correction = plateau = 1.0
        if pair.algorithm == TREE and log_size < 23:
            correction = TREE_CORRECTION[PROTOCOLS.index(pair.protocol)][log_size]
        if pair.algorithm == RING and pair.protocol == SIMPLE and nodes > 1 \
                and collective == ALL_REDUCE and nbytes / (pair.channels * nranks) >= 64:
            plateau = 1.9 if self.profile.gpu.architecture == "volta" else 1.4   # ring plateau
        return correction, plateau

    @staticmethod
    def _running_channels(pair: Pair, nbytes: int, nranks: int) -> int:
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
        profile, calibration = self.profile, self.calibration
        if same_node or profile.network is None:
            bw = self.nccl.graph_channels.value * self.nccl.channel_bw_gbps.value
            return bw * (calibration.nvlink_efficiency if calibration is not None else 1.0)
        bw = tuning.node_nic_gbps(profile) / profile.gpus_per_node
        return bw * (calibration.nic_efficiency if calibration is not None else 1.0)

    def p2p_latency_us(self, same_node: bool) -> float:
        """One Simple-protocol step: NCCL's ring base latency plus one hop over NVLink or the network."""
        remote = not same_node and self.profile.network is not None
        if remote:
            return BASE_LATENCY[RING][2] + HW_LATENCY["net"][RING][2] + self._network_latency_us()
        scale = self.calibration.hop_latency_scale if self.calibration is not None else 1.0
        return BASE_LATENCY[RING][2] + HW_LATENCY["nvlink"][RING][2] * scale

    def p2p_transfer_us(self, nbytes: float, same_node: bool, peers: int = 1,
                        posts_per_chunk: int = 1) -> float:
        """Moving `nbytes` to `peers` peers, split evenly (beyond the step's latency): the link's
        time, and across nodes at least the proxy's, which posts each network chunk
        (execution.p2p_chunk) of each peer `posts_per_chunk` times (2 when it also receives as
        much)."""
        time = nbytes / (1000 * self.p2p_bandwidth_gbps(same_node))
        if not same_node and self.profile.network is not None and nbytes > 0:
            per_peer = nbytes / max(1, peers)
            chunks = math.ceil(per_peer / execution.p2p_chunk(per_peer))
            time = max(time, chunks * max(1, peers) * posts_per_chunk * self.proxy_post_us())
        return time

    def p2p_time_us(self, nbytes: int, same_node: bool) -> float:
        """A send of `nbytes` to one peer (NCCL send/recv)."""
        return self.p2p_latency_us(same_node) + self.p2p_transfer_us(nbytes, same_node)

    def fan_time_us(self, local_bytes: float, remote_bytes: float, remote_peers: int = 1) -> Choice:
        """One GPU exchanging `local_bytes` with peers of its node and `remote_bytes` with
        `remote_peers` peers on other nodes at once, sending and receiving as much (all-to-all; a
        gather's or scatter's root): the slower side plus one step."""
        remote = remote_bytes > 0 and self.profile.network is not None
        time = local_bytes / (1000 * self.p2p_bandwidth_gbps(True))
        if remote:
            time = max(time, self.p2p_transfer_us(remote_bytes, False, remote_peers, posts_per_chunk=2))
        latency = self.p2p_latency_us(not remote)
        total = local_bytes + remote_bytes
        bw = total / (1000 * time) if time > 0 else math.inf
        return Choice("p2p", SIMPLE, latency + time, latency, bw, 0)

    def _all_to_all(self, nbytes: int, nranks: int, nodes: int) -> Choice:
        per_peer = nbytes / nranks
        local_peers = nranks // nodes - 1
        remote_peers = nranks - 1 - local_peers
        return self.fan_time_us(per_peer * local_peers, per_peer * remote_peers, remote_peers)
