"""The analysis of a job: every rank's trace file, its communicator groups and the collective size
imbalance across ranks (`analyze_traces`).

For every rank (`PREFIX.<rank>.et` or `.et.gz`) and across ranks `analyze_traces` reports what
`scan` finds in each file (node counts, compute and critical path, communication) and:

- communicator groups: the METADATA process groups, `--comm-group`, and the `pg_name`s
  the collectives use (read by `chakra_core.comm.groups.GroupRegistry`, as a run reads them);
- collective size imbalance: in each group, the k-th collective of each member rank (in
  node-id order, as `chakra-sim validate` pairs them), with the min / max / mean `comm_size`
  over the ranks; flagged when max / min exceeds the threshold (a min of 0 under a max above 0
  always is) or the ranks disagree on its type. Ranks issuing fewer collectives in a group
  than the others are listed too: a run would wait for them forever.

Identical rank files are read once (`chakra_core.feeder.library.IdenticalFiles`), each file
in one streaming pass. The report is a `JobAnalysis` (`output` writes it, `tables` prints it).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Callable
from chakra_core.et.jsonize import rank_files
from chakra_core.feeder.library import IdenticalFiles
from chakra_core.report.plots import group_label
from chakra_core.report.summary import compact_ranks
from chakra_core.schema import pb
from chakra_core.comm.groups import WORLD, GroupRegistry
from chakra_core.tools.analyze.report import (CommVolume, GroupImbalance, GroupSummary, Imbalance, JobAnalysis,
                                              KthCollective, RankAnalysis, ShortRank, SizeBucket, TraceVolume)
from chakra_core.tools.analyze.scan import Collective, ComputeTiming, TraceScan, scan_trace

DEFAULT_THRESHOLD = 1.1
COMM_KINDS = (*pb.CollectiveCommType.keys(), "UNKNOWN", "SEND", "RECV")
"""Rows of the communication tables, in this order (collective types as in et_def.proto)."""


def analyze_traces(prefix: str | Path, timing: ComputeTiming = ComputeTiming(),
                   threshold: float = DEFAULT_THRESHOLD, comm_groups: dict[str, list[int]] | None = None,
                   dependencies: str = "all", progress: Callable[[int, int], None] | None = None) -> JobAnalysis:
    """The analysis of a job's traces (see the module docstring); `progress(ranks read, ranks)`
    after each rank's file."""
    if threshold < 1:
        raise ValueError("the imbalance threshold is a max/min ratio: 1 or more")
    paths = rank_files(prefix)
    scans_by_content: IdenticalFiles[TraceScan] = IdenticalFiles()
    scans: list[TraceScan] = []
    first_rank: dict[int, int] = {}      # id(scan) -> the first rank that reads it
    for rank, path in enumerate(paths):
        scan = scans_by_content.get_or_make(path, lambda: scan_trace(path, timing, dependencies))
        first_rank.setdefault(id(scan), rank)
        scans.append(scan)
        if progress is not None:
            progress(rank + 1, len(paths))
    warnings = [w for scan in _distinct(scans) for w in scan.warnings]
    untimed = sum(scan.untimed_nodes for scan in scans)
    if untimed:
        compute = sum(n for scan in scans for kind, n in scan.node_counts.items() if kind.startswith("COMP_NODE"))
        warnings.append(f"{untimed:,} of {compute:,} compute nodes carry no duration (traces generated for a "
                        "compute model, such as a training job's, leave it to the model): each counts as 1 ns, "
                        "so compute time and the critical path are far too short; --compute-time roofline "
                        "times the nodes that carry num_ops")

    registry = GroupRegistry(len(paths), comm_groups)
    for rank, scan in enumerate(scans):
        for node in scan.group_nodes:
            registry.define_from_metadata(rank, node)
    groups, members_of = _groups(scans, registry, warnings)
    ranks = tuple(_rank_row(rank, paths[rank], scan, first_rank[id(scan)]) for rank, scan in enumerate(scans))
    return JobAnalysis(str(prefix), len(_distinct(scans)), timing.describe(), dependencies, ranks, _totals(ranks),
                       groups, imbalance(scans, members_of, threshold), tuple(warnings))


def _distinct(scans: list[TraceScan]) -> list[TraceScan]:
    return list({id(scan): scan for scan in scans}.values())


def _comm_entries(comm: dict[str, list[int]]) -> dict[str, CommVolume]:
    return {kind: CommVolume(comm[kind][0], comm[kind][1]) for kind in COMM_KINDS if kind in comm}


def _size_entries(sizes: Counter[int]) -> tuple[SizeBucket, ...]:
    return tuple(SizeBucket(bucket, sizes[bucket]) for bucket in sorted(sizes))


def _rank_row(rank: int, path: Path, scan: TraceScan, first: int) -> RankAnalysis:
    return RankAnalysis(
        node_counts=dict(sorted(scan.node_counts.items())), compute_ns=scan.compute_ns,
        comm_by_type=_comm_entries(scan.comm), message_sizes=_size_entries(scan.message_sizes),
        rank=rank, file=str(path), same_as_rank=None if first == rank else first,
        gpu_compute_ns=scan.gpu_compute_ns, cpu_compute_ns=scan.cpu_compute_ns,
        roofline_nodes=scan.roofline_nodes, critical_path_ns=scan.critical_path_ns,
    )


def _totals(ranks: tuple[RankAnalysis, ...]) -> TraceVolume:
    node_counts: Counter[str] = Counter()
    comm: dict[str, list[int]] = {}
    sizes: Counter[int] = Counter()
    for row in ranks:
        node_counts.update(row.node_counts)
        for kind, entry in row.comm_by_type.items():
            counts = comm.setdefault(kind, [0, 0])
            counts[0] += entry.count
            counts[1] += entry.bytes
        for bucket in row.message_sizes:
            sizes[bucket.from_bytes] += bucket.count
    return TraceVolume(dict(sorted(node_counts.items())), sum(row.compute_ns for row in ranks),
                       _comm_entries(comm), _size_entries(sizes))


# Communicator groups and imbalance -------------------------------------------------------------
def natural_key(name: str) -> list[int | str]:
    """Sort key putting tp2 before tp10 (and "", all ranks, first)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _groups(scans: list[TraceScan], registry: GroupRegistry,
            warnings: list[str]) -> tuple[tuple[GroupSummary, ...], dict[str, tuple[int, ...]]]:
    """(the groups' report entries, group -> members) for every group defined or used.

    A group a collective names but nothing defines, or a rank using a group it is not in, would
    stop a run; here it is a warning, and an undefined group's members are the ranks using it."""
    users: dict[str, dict[int, Collective]] = {}   # group -> rank -> its first collective there
    for rank, scan in enumerate(scans):
        for group, colls in scan.by_group.items():
            users.setdefault(group, {})[rank] = colls[0]
    defined = registry.defined()
    members_of: dict[str, tuple[int, ...]] = {}
    sources: dict[str, str] = {}
    for name in sorted(set(defined) | set(users), key=natural_key):
        if name in defined:
            members_of[name], sources[name] = defined[name]
        elif name in (WORLD, "0"):
            members_of[name], sources[name] = registry.world, "all ranks (no pg_name, or \"\" / \"0\")"
        else:
            members_of[name] = tuple(sorted(users[name]))
            sources[name] = "not defined: the ranks using it"
            warnings.append(f"communicator group '{name}' is not defined (no METADATA node or "
                            f"--comm-group defines it): a run would stop; taken to be the ranks "
                            f"using it, {compact_ranks(members_of[name])}")
        outsiders = sorted(set(users.get(name, {})) - set(members_of[name]))
        for rank in outsiders[:5]:
            coll = users[name][rank]
            warnings.append(f"rank {rank}, node {coll.id} ({coll.name!r}): rank {rank} is not a member "
                            f"of communicator group '{name}' {compact_ranks(members_of[name])}; a run "
                            "would stop (its collectives there are left out of the imbalance check)")
    entries = []
    volumes: dict[tuple[int, str], int] = {}     # identical ranks share their scan: sum it once
    for name, members in members_of.items():
        issued = [len(scans[rank].by_group.get(name, ())) for rank in members]
        volume = 0
        for rank in members:
            key = (id(scans[rank]), name)
            if key not in volumes:
                volumes[key] = sum(coll.size for coll in scans[rank].by_group.get(name, ()))
            volume += volumes[key]
        entries.append(GroupSummary(name, group_label(name), members, sources[name], min(issued, default=0),
                                    max(issued, default=0), volume))
    return tuple(entries), members_of


def imbalance(scans: list[TraceScan], members_of: dict[str, tuple[int, ...]],
              threshold: float) -> Imbalance:
    """Per group, the k-th collective of every member rank side by side (see the module docstring)."""
    groups: list[GroupImbalance] = []
    short: list[ShortRank] = []
    for name, members in members_of.items():
        # Ranks with identical files issue identical collectives: each distinct list is compared
        # once, standing for its ranks (the lowest of them names it; members are sorted).
        shared: dict[int, tuple[int, list[Collective]]] = {}
        ranks_of: dict[int, int] = {}
        for rank in members:
            key = id(scans[rank])
            if key not in shared:
                shared[key] = (rank, scans[rank].by_group.get(name, []))
            ranks_of[key] = ranks_of.get(key, 0) + 1
        expected = max(len(colls) for _, colls in shared.values())
        if not expected:
            continue
        for rank in members:
            issued = len(scans[rank].by_group.get(name, ()))
            if issued < expected:
                short.append(ShortRank(name, rank, issued, expected))
        entries = tuple(_kth_collective(name, k, [(rank, ranks_of[key], colls[k]) for key, (rank, colls) in shared.items()
                                                  if k < len(colls)], threshold) for k in range(expected))
        groups.append(GroupImbalance(name, len(members), entries))
    return Imbalance(threshold, tuple(groups), tuple(short))


def _kth_collective(group: str, k: int, issued: list[tuple[int, int, Collective]], threshold: float) -> KthCollective:
    """One collective index of a group from (lowest rank, number of ranks, collective) per distinct
    trace: its sizes over the ranks that issue it."""
    # BARRIER sizes mean nothing (a run ignores them, as `validate` does).
    sizes = [(0 if coll.comm_type == "BARRIER" else coll.size, rank, count, coll) for rank, count, coll in issued]
    low = min(sizes, key=lambda item: (item[0], item[1]))
    high = max(sizes, key=lambda item: (item[0], -item[1]))
    types = sorted({coll.comm_type for _, _, coll in issued})
    if high[0] == 0:
        ratio: float | None = 1.0
    else:
        ratio = high[0] / low[0] if low[0] else None     # None: infinite (min 0, max above 0)
    ranks = sum(count for _, _, count, _ in sizes)
    return KthCollective(
        group=group, index=k + 1, comm_type="/".join(types), ranks=ranks,
        min_bytes=low[0], max_bytes=high[0], mean_bytes=sum(size * count for size, _, count, _ in sizes) / ranks,
        ratio=ratio, min_rank=low[1], min_node=low[3].id, max_rank=high[1], max_node=high[3].id,
        type_mismatch=len(types) > 1, flagged=ratio is None or ratio > threshold or len(types) > 1,
    )
