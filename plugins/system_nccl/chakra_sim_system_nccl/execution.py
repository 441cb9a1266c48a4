"""How long a collective takes as NCCL executes it: the steps its kernels run, chunk by chunk.

NCCL's tuner (chakra_sim_system_nccl.model) exists to rank algorithms: it charges one pass of
hop latencies and a bandwidth, whatever the size. This module keeps the tuner's choice of
algorithm, protocol and channels and times what the kernels then do (NVIDIA/nccl at commit
5d3ab08b69754cb863ab1bf6e3fb6f7612bb725b unless said otherwise):

- **Chunks and loops** (`src/enqueue.cc` calcCollChunking, `src/include/coll_sizes.h`): each
  channel moves its share of the buffer in chunks of `buffSize / NCCL_STEPS x chunkSteps` bytes
  (Simple ring: 4 MiB / 8 x 4 = 2 MiB; LL: 32 KiB of data; LL128: 576,000 B), fewer for small
  messages; NVLS shrinks its 128 KiB chunk to 64/32/16 KiB below 64/8/2 x (channels x heads)
  chunks, NVLS-tree and tree/LL128 have their own rules. A ring runs `2(n-1)` steps (all-reduce)
  or `n-1` per loop of `n` chunks; every loop pays the steps' hop latencies again.
- **Per-step synchronisation**: a Simple step ends with a fence and a flag the peer polls
  (`src/device/prims_simple.h`), paid per slice (a ring chunk is 2 slices: ALLREDUCE_CHUNKSTEPS /
  ALLREDUCE_SLICESTEPS); its cost is one flag crossing NVLink, which is what NCCL's own table
  charges its flag-in-data LL protocol per NVLink hop (`hwLatencies[NVLINK][*][LL]` = 0.6 us;
  1.0 us over PCI). LL and LL128 carry their flags in the data: no separate sync.
- **Across nodes** every step is posted by the proxy thread (NCCL's `getNetOverhead`: 1 us on
  Intel hosts, 2 on AMD, three times for Simple; counted in the hops' latency as NCCL counts it)
  and crosses the network once more for the GPUDirect flush where the profile says so.
- **The proxy thread is one per GPU** (NCCL 2.24.3, tag v2.24.3-1: `src/proxy.cc`
  ncclProxyProgress, one "NCCL Progress" thread per device, loops `progressOps` over every
  active operation in turn), and every network step of every channel is a separate
  `ncclNet->isend` or `irecv` it posts and tests (`src/transport/net.cc` sendProxyProgress /
  recvProxyProgress: one request per `sliceSteps` of a channel's connection). So a GPU's network
  steps, over all the channels it serves, are posted one after another, each costing what
  NCCL's tuner calls the network post overhead (`getNetOverhead`, `src/graph/tuning.cc`: 1 us on
  Intel hosts, 2 on AMD): `proxy_us`. Small chunks across nodes are bound by it, not by the NIC.
- **NVLS** (`src/device/all_reduce.h`, NVLS single node): without registered buffers each
  chunk goes through four warp groups (scatter to the heads, multimem reduce, multimem
  store, gather), so the pipeline fills over 3 chunk times, after NCCL's NVLS latency
  (`hwLatencies[NVLINK][NVLS]`, 25 us) and the two copies' NVLink Simple hops; NVLS bandwidth is
  the NVLS graph's (`nvls_bus_bw_gbps`) without NCCL's `nvlsEfficiency`: that empirical factor
  stands for the per-chunk losses this model counts one by one.
- **Launch**: one thread driving several GPUs (nccl-tests `-g`) launches their kernels one
  after the other (`node.kernel_launch_us` each); back-to-back iterations then take the longer
  of the GPU time and the host's; CUDA graphs remove the per-collective launch.

The bandwidth term is the tuner's (the graph NCCL's search finds, its protocol factors and
per-channel caps) for the channels that run, split into what NVLink bounds and what the NICs
bound so that a calibration can correct each (chakra_sim_system_nccl.section.Calibration).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

NCCL_STEPS: Final = 8
"""src/include/device.h: FIFO slots per connection."""
BUFF_SIZES: Final = {"LL": 8 * 512 * NCCL_STEPS * 16, "LL128": 120 * 640 * NCCL_STEPS * 8, "Simple": 1 << 22}
"""src/include/device.h DEFAULT_LL_BUFFSIZE (lines/thread x threads x steps x 16-byte line),
DEFAULT_LL128_BUFFSIZE (elems/thread x threads x steps x 8 B), DEFAULT_BUFFSIZE (4 MiB)."""
RING_CHUNK_STEPS, RING_SLICE_STEPS = NCCL_STEPS // 2, NCCL_STEPS // 4
"""src/include/coll_sizes.h ALLREDUCE/ALLGATHER/REDUCESCATTER_CHUNKSTEPS and _SLICESTEPS."""
LL128_LINE_ELEMS, LL128_DATA_ELEMS = 16, 15
"""src/include/device.h NCCL_LL128_LINEELEMS / NCCL_LL128_DATAELEMS: 8 B of flag per 128 B line."""
NVLS_CHUNK: Final = 131072
"""src/init.cc comm->nvlsChunkSize default (NCCL_NVLS_CHUNKSIZE, 128 KiB)."""
NVLS_UNREGISTERED_STAGES: Final = {"all_reduce": 4, "all_gather": 3, "reduce_scatter": 3}
"""Warp groups a chunk passes through without registered buffers (src/device/all_reduce.h,
all_gather.h, reduce_scatter.h NVLS: scatter/reduce/broadcast/gather, the copies in and out)."""


@dataclass(frozen=True)
class Plan:
    """What each channel of a collective executes."""

    chunk_bytes: int      # the chunk one step moves
    slice_bytes: int      # what one synchronisation covers (a Simple ring chunk is two slices)
    steps: int            # steps each channel executes
    fill_chunks: int      # chunk times the pipeline takes to fill beyond the hops' latency
    copy_hops: int        # NVLink Simple hops of NVLS's copies in and out
    net_steps: float = 0.0   # network sends and receives per channel on each node (proxy posts)


def ring_chunk(protocol: str, channel_bytes: int, nranks: int) -> tuple[int, int]:
    """(chunk NCCL moves per ring step, loops) for one channel's share (calcCollChunking)."""
    step = BUFF_SIZES[protocol] // NCCL_STEPS
    chunk = step * (RING_CHUNK_STEPS if protocol == "Simple" else 1)
    if protocol == "LL":
        chunk //= 2
    elif protocol == "LL128":
        chunk = chunk // LL128_LINE_ELEMS * LL128_DATA_ELEMS
    loops = max(1, math.ceil(channel_bytes / (nranks * chunk)))
    per_rank = math.ceil(channel_bytes / (nranks * loops))
    return max(1, min(chunk, -(-per_rank // 16) * 16)), loops


def tree_chunk(protocol: str, nbytes: int, channels: int, nranks: int, nodes: int) -> int:
    """The chunk a tree moves per step (tree/LL128 halves it for small messages)."""
    step = BUFF_SIZES[protocol] // NCCL_STEPS
    chunk = step // 2 if protocol == "LL" else step
    if protocol == "LL128":
        chunk = chunk // LL128_LINE_ELEMS * LL128_DATA_ELEMS
        ppn = nranks / nodes
        steps = 1 + (nodes.bit_length() - 1) + 0.1 * ppn
        while nbytes // (channels * chunk) < steps * 64 / ppn and chunk > 131072:
            chunk //= 2
        while nbytes // (channels * chunk) < steps * 16 / ppn and chunk > 32768:
            chunk //= 2
    return max(1, min(chunk, math.ceil(nbytes / channels)))


def nvls_chunk(nbytes: int, channels: int, heads: int, nodes: int) -> int:
    """The chunk NVLS (single node) or NVLS-tree moves (calcCollChunking)."""
    concurrent = channels * heads
    if nodes == 1:
        chunk = NVLS_CHUNK
        for factor, smaller in ((64, 65536), (8, 32768), (2, 16384)):
            if nbytes < factor * concurrent * chunk and chunk > smaller:
                chunk = smaller
        return chunk
    chunk = 65536 if nodes >= 4 else NVLS_CHUNK
    for factor, smaller in ((16, 131072), (4, 65536), (1, 32768)):
        if nbytes < factor * concurrent * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def tree_net_steps(chunks: int, nodes: int) -> float:
    """Network sends and receives per channel and node of a tree's chunks: each chunk crosses every
    edge of the channel's tree over the nodes (N - 1 edges; NCCL's double binary tree,
    `src/graph/trees.cc` ncclGetDtree) up and down, a send at one end and a receive at the other."""
    return chunks * 4 * (nodes - 1) / nodes


def tree_fill_us(chunk_bytes: int, local: int, nodes: int, nvlink_gbps: float, nic_gbps: float) -> float:
    """Time before a Simple tree's pipeline is full: a step goes on only once it is written whole
    (`src/device/prims_simple.h`, one flag per step; a tree's chunk is one step), so the first
    chunk is stored and forwarded along the node's chain up and down (`src/graph/trees.cc`, local
    GPUs chained) and over the tree of nodes up and down (2 log2 N network hops, as the tuner's
    hops), one chunk time per hop at the channel's rate on that link."""
    fill = 2 * (local - 1) * chunk_bytes / (1000 * nvlink_gbps)
    if nodes > 1:
        fill += 2 * (nodes.bit_length() - 1) * chunk_bytes / (1000 * nic_gbps)
    return fill


def plan(algorithm: str, collective: str, protocol: str, nbytes: int, nranks: int, nodes: int,
         channels: int) -> Plan:
    """The chunks and steps of one channel (calcCollChunking and the device code's loops)."""
    channel_bytes = math.ceil(nbytes / channels)
    if algorithm in ("nvls", "nvls_tree"):
        chunk = nvls_chunk(nbytes, channels, nranks // nodes, nodes)
        chunks = max(1, math.ceil(channel_bytes / chunk))
        return Plan(chunk, chunk, chunks, NVLS_UNREGISTERED_STAGES.get(collective, 3) - 1, 2,
                    tree_net_steps(chunks, nodes) if algorithm == "nvls_tree" else 0.0)
    if algorithm == "tree":
        chunk = tree_chunk(protocol, nbytes, channels, nranks, nodes)
        chunks = max(1, math.ceil(channel_bytes / chunk))
        # every link carries each chunk up and down
        return Plan(chunk, chunk, 2 * chunks - 1, 0, 0, tree_net_steps(chunks, nodes))
    if collective in ("broadcast", "reduce"):   # a chain of chunks along the ring
        chunk, _ = ring_chunk(protocol, channel_bytes, 1)
        chunks = max(1, math.ceil(channel_bytes / chunk))
        # each chunk crosses the N - 1 node boundaries of the chain once: a send and a receive each
        return Plan(chunk, chunk, nranks - 1 + chunks - 1, 0, 0, chunks * 2 * (nodes - 1) / nodes)
    chunk, loops = ring_chunk(protocol, channel_bytes, nranks)
    nsteps = 2 * (nranks - 1) if collective == "all_reduce" else nranks - 1
    slices = RING_CHUNK_STEPS // RING_SLICE_STEPS if protocol == "Simple" else 1
    # every step of the ring crosses each node boundary, one request per slice (sliceSteps): a send
    # leaving each node, a receive entering it
    net_steps = 2.0 * nsteps * loops * slices if nodes > 1 else 0.0
    return Plan(chunk, max(1, math.ceil(chunk / slices)), nsteps * loops, 0, 0, net_steps)


P2P_NET_CHUNK: Final = 1 << 17
"""src/init.cc NCCL_P2P_NET_CHUNKSIZE (128 KiB): the step of a send/receive across nodes (v2.24.3-1,
computeBuffSizes: comm->p2pChunkSize when nNodes > 1)."""


def p2p_chunk(nbytes: float) -> int:
    """The chunk one network step of a send or receive carries (src/enqueue.cc at v2.24.3-1, the
    p2p chunking of each direction: a quarter of the step below one step, half below eight)."""
    if nbytes < P2P_NET_CHUNK:
        return P2P_NET_CHUNK // 4
    return P2P_NET_CHUNK // 2 if nbytes < 8 * P2P_NET_CHUNK else P2P_NET_CHUNK


def proxy_us(net_steps: float, channels: int, proxies: int, post_us: float) -> float:
    """Time a node's proxy threads need to post and complete their network steps: `net_steps` per
    channel over `channels` channels, shared by `proxies` threads (one per GPU of the
    communicator on the node), `post_us` each, one after another on each thread."""
    return net_steps * channels / max(1, proxies) * post_us


def effective_gbps(cap_gbps: float, channels: int, channel_gbps: float, slice_bytes: int, sync_us: float) -> float:
    """Algorithm bandwidth when every slice a channel moves also waits `sync_us` for its flag:
    each channel moves `slice / (slice / rate + sync)`, and all of them no more than `cap_gbps`."""
    if sync_us <= 0 or not math.isfinite(channel_gbps):
        return cap_gbps
    per_slice_us = slice_bytes / (1000 * channel_gbps) + sync_us
    return min(cap_gbps, channels * slice_bytes / (1000 * per_slice_us))


def host_issue_us(gpus_per_thread: int, cuda_graph: bool, launch_us: float) -> float:
    """Host time to issue one collective: one launch per GPU the thread drives (none replayed
    from a CUDA graph)."""
    return 0.0 if cuda_graph else gpus_per_thread * launch_us
