"""Routes of many messages at once on a generated fabric, with numpy.

`FabricRouter.route` computes one message's links from device numbers; a
flow-level step of a collective (an all-to-all: 1,047,552 messages on 1,024
NPUs) needs them all at once. `fabric_routes` computes the same links for
arrays of (source, destination, message number), as a flow-link incidence
(`flow_start`, `flow_links`: flow f crosses flow_links[flow_start[f]:
flow_start[f + 1]]), and `reachable_links` the links any of a set of pairs'
equal-cost routes may take (what a collective claims). Both cover fabrics
without failed links; the router's scalar path handles those.
"""

from __future__ import annotations

import numpy as np

from chakra_core.topology import Clos, PairCounter

_MASK32 = np.uint64(0xFFFFFFFF)


def ecmp_hash_many(src: np.ndarray, dst: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """`fabric.ecmp_hash` of arrays (uint64 arithmetic, reduced mod 2^32 as it goes)."""
    h = (src.astype(np.uint64) * np.uint64(0x9E3779B1) + dst.astype(np.uint64) * np.uint64(0x85EBCA77)
         + seq.astype(np.uint64) * np.uint64(0xC2B2AE3D)) & _MASK32
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & _MASK32
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & _MASK32
    hashes: np.ndarray = (h ^ (h >> np.uint64(16))).astype(np.int64)   # numpy's operators type as Any
    return hashes


def next_seqs(counter: PairCounter, src: np.ndarray, dst: np.ndarray, back: bool = False) -> np.ndarray:
    """`counter.next(s, d)` for each pair in order (a pair may repeat), counted as one by one;
    `back`: uncount them (undo an earlier call with the same pairs)."""
    order = np.lexsort((np.arange(len(src)), dst, src))    # by pair, then in order
    s_sorted, d_sorted = src[order], dst[order]
    new_pair = np.ones(len(order), dtype=bool)
    new_pair[1:] = (s_sorted[1:] != s_sorted[:-1]) | (d_sorted[1:] != d_sorted[:-1])
    starts = np.flatnonzero(new_pair)
    counts = np.diff(np.append(starts, len(order)))
    pair_src, pair_dst = s_sorted[starts], d_sorted[starts]
    base = np.empty(len(starts), dtype=np.int64)
    source_starts = np.flatnonzero(np.r_[True, pair_src[1:] != pair_src[:-1]])
    for first, last in zip(source_starts, np.append(source_starts[1:], len(starts))):
        step = -counts[first:last] if back else counts[first:last]
        base[first:last] = counter.advance_many(int(pair_src[first]), pair_dst[first:last], step)
    rank = np.arange(len(order)) - np.repeat(starts, counts)   # a pair's k-th message: its count + k
    seqs = np.empty(len(src), dtype=np.int64)
    seqs[order] = (np.repeat(base, counts) + rank) % counter.modulus
    return seqs


def next_seqs_by_source(counter: PairCounter, src: np.ndarray, dst: np.ndarray, group: int) -> np.ndarray:
    """`next_seqs` of pairs in runs of `group`, each run from one source to distinct destinations
    (a step of a collective: a member to each of its peers): no sort needed."""
    seqs = np.empty(len(src), dtype=np.int64)
    once = np.ones(group, dtype=np.int64)
    for lo in range(0, len(src), group):
        seqs[lo:lo + group] = counter.advance_many(int(src[lo]), dst[lo:lo + group], once)
    return seqs


def fabric_routes(fabric: Clos, src: np.ndarray, dst: np.ndarray, seq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The flow-link incidence of messages src[i] -> dst[i] (src != dst), the seq[i]-th of their
    pair, exactly as `FabricRouter.route` gives them on a fabric without failed links."""
    hops = fabric_hops(fabric, src, dst, seq)
    used = hops >= 0
    flow_start = np.zeros(len(src) + 1, dtype=np.intp)
    np.cumsum(used.sum(axis=1), out=flow_start[1:])
    return flow_start, hops[used]


def fabric_hops(fabric: Clos, src: np.ndarray, dst: np.ndarray, seq: np.ndarray, spare: int = 0,
                dtype: type = np.int64) -> np.ndarray:
    """The same routes as a matrix: row i holds message i's links, then -1s (at least `spare`)."""
    g = fabric.gpus_per_node
    hashed = fabric.ecmp == "hash"
    width = (8 if g > 1 else 6) + spare
    hops: np.ndarray = np.full((len(src), width), -1, dtype=dtype)
    if g == 1:
        x = ecmp_hash_many(src, dst, seq) if hashed else dst + seq
        _up_down(fabric, hops, 0, src, dst, x, None)
    else:
        nv_up, nv_down = np.asarray(fabric.nv_up), np.asarray(fabric.nv_down)
        x = ecmp_hash_many(src, dst, seq) if hashed else dst // g + seq
        node, gpu = np.divmod(src, g)
        dst_node, dst_gpu = np.divmod(dst, g)
        same = node == dst_node
        hops[same, 0], hops[same, 1] = nv_up[src[same]], nv_down[dst[same]]
        plane, dst_plane = gpu * fabric.rail_leaves // fabric.plane_leaves, dst_gpu * fabric.rail_leaves // fabric.plane_leaves
        detour = ~same & (gpu != dst_gpu) & (fabric.pxn | (plane != dst_plane))
        via = node * g + dst_gpu
        hops[detour, 0], hops[detour, 1] = nv_up[src[detour]], nv_down[via[detour]]
        start = np.where(detour, via, src)
        _up_down(fabric, hops, 2, start, dst, x, np.flatnonzero(~same & detour))
        _up_down(fabric, hops, 0, start, dst, x, np.flatnonzero(~same & ~detour))
    return hops


def _up_down(f: Clos, hops: np.ndarray, col: int, s: np.ndarray, t: np.ndarray, x: np.ndarray,
             rows: np.ndarray | None) -> None:
    """`FabricRouter._up_down` for the `rows` given (None: all), written from column `col` on:
    each column computed for all of them, the route's kind (same leaf, same pod, across pods)
    choosing among the candidates."""
    if rows is not None:
        s, t, x = s[rows], t[rows], x[rows]
    g, d, u = f.gpus_per_node, f.leaf_hosts, f.up
    # 32-bit arithmetic moves half the bytes where every host, table index and link id fits
    links = 2 * (len(f.host_up) + len(f.up2) + len(f.up3) + len(f.nv_up))
    narrow = np.int32 if links < 1 << 31 else np.int64
    if narrow is np.int32 and int(x.max(initial=0)) < 1 << 31:    # D-mod-k's choices do; a hash's may not
        x = x.astype(np.int32)
    j = (x % u).astype(narrow, copy=False)
    s, t = s.astype(narrow), t.astype(narrow)
    if g == 1:
        ls, lt = s // d, t // d
    else:
        ls = (s % g) * f.rail_leaves + s // g // d
        lt = (t % g) * f.rail_leaves + t // g // d
    leaf = ls == lt

    def table(links: list[int]) -> np.ndarray:     # the fabric's link tables are lists
        return np.asarray(links, dtype=narrow)

    def put(k: int, column: np.ndarray) -> None:
        if rows is None:
            hops[:, col + k] = column
        else:
            hops[rows, col + k] = column

    put(0, table(f.host_up)[s])
    down = table(f.host_down)[t]
    up2 = table(f.up2)[ls * u + j]
    put(1, np.where(leaf, down, up2))
    down2 = table(f.down2)[lt * u + j]
    if f.tiers != 3:
        put(2, np.where(leaf, -1, down2))
        put(3, np.where(leaf, -1, down))
        return
    pa, pb = ls // f.pod_leaves, lt // f.pod_leaves
    del ls, lt, up2
    inpod = pa == pb
    ua = f.agg_up
    c = ((x // u) % ua).astype(narrow, copy=False)
    put(2, np.where(leaf, -1, np.where(inpod, down2, table(f.up3)[(pa * u + j) * ua + c])))
    put(3, np.where(leaf, -1, np.where(inpod, down, table(f.down3)[(pb * u + j) * ua + c])))
    cross = ~leaf & ~inpod
    put(4, np.where(cross, down2, -1))
    put(5, np.where(cross, down, -1))


def reachable_links(fabric: Clos, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Every link some equal-cost route of a pair (src[i], dst[i]) may take, whatever its ECMP
    choice: the ends' host links (and NVLink), all up-links of the source leaves and down-links
    of the destination leaves, and across pods all of the pods' core links. Sorted, unique."""
    g, d, u = fabric.gpus_per_node, fabric.leaf_hosts, fabric.up
    if fabric.hosts < 1 << 31:      # half the bytes to move, and faster division
        src, dst = src.astype(np.int32), dst.astype(np.int32)
    parts: list[np.ndarray] = []
    start = src
    if g > 1:
        node, gpu = np.divmod(src, g)
        dst_node, dst_gpu = np.divmod(dst, g)
        nv_up, nv_down = np.asarray(fabric.nv_up), np.asarray(fabric.nv_down)
        same = node == dst_node
        plane = gpu * fabric.rail_leaves // fabric.plane_leaves
        dst_plane = dst_gpu * fabric.rail_leaves // fabric.plane_leaves
        detour = ~same & (gpu != dst_gpu) & (fabric.pxn | (plane != dst_plane))
        via = node * g + dst_gpu
        parts += [nv_up[_distinct(src[same | detour], fabric.hosts)], nv_down[_distinct(dst[same], fabric.hosts)],
                  nv_down[_distinct(via[detour], fabric.hosts)]]
        keep = ~same
        start, dst = np.where(detour, via, src)[keep], dst[keep]
        ls = (start % g) * fabric.rail_leaves + start // g // d
        lt = (dst % g) * fabric.rail_leaves + dst // g // d
    else:
        ls, lt = start // d, dst // d
    parts += [np.asarray(fabric.host_up)[_distinct(start, fabric.hosts)],
              np.asarray(fabric.host_down)[_distinct(dst, fabric.hosts)]]
    apart = ls != lt
    cols = np.arange(u)
    parts.append(np.asarray(fabric.up2)[(_marked(ls, apart, fabric.leaves)[:, None] * u + cols).ravel()])
    parts.append(np.asarray(fabric.down2)[(_marked(lt, apart, fabric.leaves)[:, None] * u + cols).ravel()])
    if fabric.tiers == 3:
        pa, pb = ls // fabric.pod_leaves, lt // fabric.pod_leaves
        across = apart & (pa != pb)
        width = u * fabric.agg_up
        cores = np.arange(width)
        parts.append(np.asarray(fabric.up3)[(_marked(pa, across, fabric.pods)[:, None] * width + cores).ravel()])
        parts.append(np.asarray(fabric.down3)[(_marked(pb, across, fabric.pods)[:, None] * width + cores).ravel()])
    links = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
    return _distinct(links, int(links.max()) + 1) if len(links) else links


def _marked(values: np.ndarray, where: np.ndarray, bound: int) -> np.ndarray:
    """_distinct(values[where]) without picking by the mask (several times slower)."""
    seen = np.zeros(bound + 1, dtype=bool)
    seen[np.where(where, values, bound)] = True      # the others: one past the end
    return np.flatnonzero(seen[:-1])


def _distinct(values: np.ndarray, bound: int) -> np.ndarray:
    """The distinct values (each in 0..bound-1), ascending: np.unique without sorting."""
    seen = np.zeros(bound, dtype=bool)
    seen[values] = True
    return np.flatnonzero(seen)
