"""Fitting a synthesis model (chakra_core.tools.synthesis.model) to Chakra traces.

Each rank is read whole, put in dependency order (Kahn's algorithm, file order among ready
nodes), and walked once: communication nodes become the rank's anchors; every other node adds
to its class's values (and names), dependency patterns, the current gap's counts and durations,
and the class transitions. A dependency on an anchor is recorded on the anchor instead (its
consumers). Ranks whose communication is alike and whose work is within 2% pool into roles.

Several sources (`--from A --from B`) are read as consecutive parts of one job (steps
captured separately, say): they must have the same number of ranks, and each rank's program
is the concatenation of its parts.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, cast

from chakra_core.errors import TraceGraphError
from chakra_core.et.attrs import NodeView
from chakra_core.et.io import read_trace
from chakra_core.et.jsonize import rank_files
from chakra_core.engine.driver import SLOT_NAMES, slot_table
from chakra_core.feeder.base import cycle_error, find_cycle, node_kind, parents_of, topological_positions
from chakra_core.schema import pb
from chakra_core.comm.groups import GroupRegistry
from chakra_core.tools.obfuscation import perturbed, perturbed_size
from chakra_core.tools.synthesis.model import (Anchor, Bin, NodeClass, RankEntry, Role, SynthesisError,
                                               SynthesisModel, class_kind)

MAX_BINS = 64
"""Equal-count bins per class: the sampled values' distribution is within 1/64 of the source's
(Kolmogorov-Smirnov distance), and each bin's mean is kept, so totals are too."""
MAX_RECENCY = 64
"""Parents further back than this in their lane are not modelled (rare; counted as dropped)."""
MAX_PATTERNS = 64
MAX_SINCE_ANCHOR = 16
"""Dependency patterns are told apart by the node's position after the last anchor up to this."""
WINDOW = 32
"""Nodes per window: a gap's counts and durations are kept per window of this many nodes, so the
mix follows the source through a long gap (forward, backward, optimizer) without its order."""
START = "^"
"""The transition source of a rank's first node."""

_SLOTS = slot_table(memory_shares_comm=False)
_TYPE_NAMES = {value: name for name, value in pb.NodeType.items()}
_COLL_NAMES = {value: name for name, value in pb.CollectiveCommType.items()}
_ANCHOR_TYPES = (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)


def node_class(view: NodeView, kind: int) -> str:
    """A node's class: its type, "/cpu" for CPU operations, the collective type of collectives."""
    name = _TYPE_NAMES.get(view.pb.type, f"TYPE_{view.pb.type}")
    if view.pb.type == pb.COMM_COLL_NODE and view.has("comm_type"):
        name += "/" + _COLL_NAMES.get(view.int("comm_type"), str(view.int("comm_type")))
    if kind != view.pb.type:     # CPU_FLAG set
        name += "/cpu"
    return name


def lane_of(kind: int) -> str:
    return SLOT_NAMES[_SLOTS.get(kind, len(SLOT_NAMES) - 1)]


def class_lane(cls: str) -> str:
    return lane_of(class_kind(cls))


def is_anchor(node: pb.Node, lane: str) -> bool:
    """Communication the simulator's system layer handles (a CPU-side collective is a CPU op)."""
    return node.type in _ANCHOR_TYPES and (node.type != pb.COMM_COLL_NODE or lane == "comm")


Value = tuple[int, Optional[int], Optional[int], str]
"""One source node's (duration ns, num_ops, tensor_size, name)."""
Pattern = tuple[str, int, str, tuple[tuple[str, int], ...]]
"""A node's dependency pattern: (class before, position after the last anchor, that anchor's class,
parents as (lane, recency))."""


@dataclass
class _RankFit:
    """What one source rank contributes."""

    anchors: list[Anchor] = field(default_factory=list)
    gaps: list[list[Counter[str]]] = field(default_factory=lambda: [[Counter()]])
    gap_ns: list[list[Counter[str]]] = field(default_factory=lambda: [[Counter()]])
    transitions: Counter[tuple[str, str]] = field(default_factory=Counter)
    values: dict[str, list[Value]] = field(default_factory=dict)
    exact_ns: set[str] = field(default_factory=set)
    patterns: dict[str, Counter[Pattern]] = field(default_factory=dict)
    slots: list[Optional[tuple[int, ...]]] = field(default_factory=list)
    nodes: int = 0
    dropped_parents: int = 0
    previous: str = START

    def signature(self) -> tuple[tuple[object, ...], ...]:
        return tuple((a.cls, a.comm_type, a.size, a.slot, a.peer, a.tag,
                      tuple(a.involved_dim) if a.involved_dim else None) for a in self.anchors)


def source_ranks(prefixes: list[str]) -> list[list[Path]]:
    """Per rank, its file in each source (sources must have the same ranks, 0..R-1)."""
    if not prefixes:
        raise SynthesisError("give at least one source trace (--from PREFIX)")
    per_source = [(prefix, rank_files(prefix)) for prefix in prefixes]
    counts = {len(paths) for _, paths in per_source}
    if len(counts) > 1:
        listing = ", ".join(f"{prefix} has {len(paths)}" for prefix, paths in per_source)
        raise SynthesisError(f"the sources must have the same number of ranks: {listing}")
    return [list(files) for files in zip(*(paths for _, paths in per_source))]


def dependency_order(path: str, nodes: list[pb.Node], use_ctrl: bool = True
                     ) -> tuple[list[pb.Node], dict[int, list[int]], int]:
    """Nodes in dependency order (file order among ready ones), each node's known parents, and
    how many parent references name no node of the trace. `use_ctrl=False` honours data
    dependencies only (`--dependencies data`, as `workload.dependencies: data`)."""
    position: dict[int, int] = {}
    for index, node in enumerate(nodes):
        if node.id in position:
            raise TraceGraphError(f"{path}: node id {node.id} appears twice")
        position[node.id] = index
    parents: dict[int, list[int]] = {}
    missing = 0
    for node in nodes:
        listed = parents_of(node, use_ctrl)
        known = [parent for parent in listed if parent in position and parent != node.id]
        missing += len(listed) - len(known)
        parents[node.id] = known
    order, unreached = topological_positions([tuple(position[p] for p in parents[node.id]) for node in nodes])
    if unreached:
        leftover = {nodes[i].id for i in unreached}
        cycle = find_cycle(leftover, lambda node_id: parents[node_id])
        error = cycle_error(path, cycle, len(leftover), use_ctrl=False)
        if use_ctrl:
            error.args = (error.args[0] + " (if the cycle goes through control dependencies, give "
                          "--dependencies data to honour data dependencies only, as Chakra's C++ "
                          "feeder does)",)
        raise error
    return [nodes[i] for i in order], parents, missing


def _fit_rank(rank: int, num_ranks: int, paths: list[Path], groups: GroupRegistry,
              group_index: dict[Optional[tuple[int, ...]], int], use_ctrl: bool) -> _RankFit:
    fit = _RankFit()
    for path in paths:
        spath = os.fspath(path)
        trace = read_trace(path)
        order, parents, missing = dependency_order(spath, trace.nodes, use_ctrl)
        fit.dropped_parents += missing
        fit.nodes += len(order)
        lane_count: Counter[str] = Counter()
        where: dict[int, tuple[str, int]] = {}      # node id -> (lane, position in the lane)
        anchor_at: dict[int, tuple[Anchor, int]] = {}   # anchor node id -> (anchor, position)
        position = 0
        since_anchor = 0
        last_anchor = START
        for node in order:
            view = NodeView(node)
            kind = node_kind(node)
            lane = lane_of(kind)
            if node.type == pb.METADATA_NODE and groups.define_from_metadata(rank, view):
                continue     # a process-group definition: the sampler writes its own
            anchor = is_anchor(node, lane)
            pattern: list[tuple[str, int]] = []
            for parent in parents[node.id]:
                if parent not in where:
                    continue
                if parent in anchor_at and not anchor:
                    source, at = anchor_at[parent]
                    source.consumers.append(position - at)
                    continue
                parent_lane, parent_at = where[parent]
                recency = lane_count[parent_lane] - parent_at
                if recency > MAX_RECENCY:
                    fit.dropped_parents += 1
                else:
                    pattern.append((parent_lane, recency))
            pattern.sort()
            where[node.id] = (lane, lane_count[lane])
            lane_count[lane] += 1
            cls = node_class(view, kind)
            previous = fit.previous
            fit.transitions[(previous, cls)] += 1
            fit.previous = cls
            duration = view.int("duration_ns") if view.has("duration_ns") else node.duration_micros * 1000
            if anchor:
                made = _anchor(rank, num_ranks, view, cls, duration, pattern, groups, group_index, fit)
                anchor_at[node.id] = (made, position)
                since_anchor = 0
                last_anchor = cls
                fit.anchors.append(made)
                fit.gaps.append([Counter()])
                fit.gap_ns.append([Counter()])
            else:
                if sum(fit.gaps[-1][-1].values()) == WINDOW:
                    fit.gaps[-1].append(Counter())
                    fit.gap_ns[-1].append(Counter())
                fit.gaps[-1][-1][cls] += 1
                fit.gap_ns[-1][-1][cls] += duration
                if view.has("duration_ns"):
                    fit.exact_ns.add(cls)
                fit.values.setdefault(cls, []).append(
                    (duration, view.int("num_ops") if view.has("num_ops") else None,
                     view.int("tensor_size") if view.has("tensor_size") else None, node.name))
                since_anchor = min(since_anchor + 1, MAX_SINCE_ANCHOR)
                fit.patterns.setdefault(cls, Counter())[(previous, since_anchor, last_anchor, tuple(pattern))] += 1
            position += 1
    return fit


def _anchor(rank: int, num_ranks: int, view: NodeView, cls: str, duration: int, pattern: list[tuple[str, int]],
            groups: GroupRegistry, group_index: dict[Optional[tuple[int, ...]], int], fit: _RankFit) -> Anchor:
    node = view.pb
    anchor = Anchor(cls=cls, duration_ns=duration, parents=pattern,
                    size=view.int("comm_size") if view.has("comm_size") else None,
                    tag=view.int("comm_tag") if view.has("comm_tag") else None)
    if node.type == pb.COMM_COLL_NODE:
        anchor.comm_type = view.int("comm_type") if view.has("comm_type") else None
        members = groups.members(view.str("pg_name", ""), view, rank)
        key = None if members == groups.world else members
        if key not in group_index:
            group_index[key] = len(group_index)
        if key not in fit.slots:
            fit.slots.append(key)
        anchor.slot = fit.slots.index(key)
        involved = view.bool_list("involved_dim")
        anchor.involved_dim = list(involved) if involved is not None else None
    else:
        peer_attr = "comm_dst" if node.type == pb.COMM_SEND_NODE else "comm_src"
        if not view.has(peer_attr):
            raise SynthesisError(f"rank {rank}, node {node.id}: a {_TYPE_NAMES[node.type]} without "
                                 f"{peer_attr}")
        # Relative to the rank and modulo the ranks: a ring of sends looks alike from every rank.
        anchor.peer = (view.int(peer_attr) - rank) % num_ranks
    return anchor


def fit_model(prefixes: list[str], comm_groups: dict[str, list[int]] | None = None, obfuscate: bool = False,
              tolerance: float = 0.0, seed: int = 0, use_ctrl: bool = True) -> SynthesisModel:
    """The synthesis model of the traces at `prefixes` (see module docstring)."""
    files = source_ranks([os.fspath(p) for p in prefixes])
    num_ranks = len(files)
    groups = GroupRegistry(num_ranks, comm_groups)
    group_index: dict[Optional[tuple[int, ...]], int] = {}
    fits = [_fit_rank(rank, num_ranks, paths, groups, group_index, use_ctrl)
            for rank, paths in enumerate(files)]
    roles_of: dict[tuple[tuple[object, ...], ...], list[int]] = {}
    members: list[list[_RankFit]] = []
    entries = []
    for fit in fits:
        candidates = roles_of.setdefault(fit.signature(), [])
        role = next((r for r in candidates if _alike(members[r][0], fit)), None)
        if role is None:
            role = len(members)
            candidates.append(role)
            members.append([])
        members[role].append(fit)
        entries.append(RankEntry(role=role, groups=[group_index[key] for key in fit.slots]))
    roles = [_pool(index, pooled, obfuscate, tolerance, seed) for index, pooled in enumerate(members)]
    table = [None if key is None else list(key) for key, _ in sorted(group_index.items(), key=lambda kv: kv[1])]
    return SynthesisModel(obfuscated=obfuscate, tolerance=tolerance if obfuscate else 0.0,
                          source_nodes=round(sum(f.nodes for f in fits) / num_ranks),
                          unmodelled_dependencies=sum(f.dropped_parents for f in fits),
                          groups=table, ranks=entries, roles=roles)


POOL_TOLERANCE = 0.02
"""Ranks with the same communication pool into one role only if each class's node count and
total duration are within 2% of each other's: pooling averages, and a slow rank must stay slow
(the others wait for it)."""


def _alike(a: _RankFit, b: _RankFit) -> bool:
    if set(a.values) != set(b.values):
        return False
    for cls, values in a.values.items():
        other = b.values[cls]
        for x, y in ((len(values), len(other)), (sum(v[0] for v in values), sum(v[0] for v in other))):
            if abs(x - y) > POOL_TOLERANCE * max(x, y, 1):
                return False
    return True


def _pool(role: int, fits: list[_RankFit], obfuscate: bool, tolerance: float, seed: int) -> Role:
    """One role from the ranks it pools: mean gaps, summed transitions and patterns, pooled values."""
    first = fits[0]
    anchors = []
    for index, anchor in enumerate(first.anchors):
        update = {"duration_ns": round(sum(f.anchors[index].duration_ns for f in fits) / len(fits))}
        if obfuscate:
            update["duration_ns"] = round(update["duration_ns"] * perturbed(seed, tolerance, "anchor", role, index))
            if anchor.size is not None:
                update["size"] = perturbed_size(seed, tolerance, anchor.size)
        anchors.append(anchor.model_copy(update=update))
    gaps = [_mean_windows([fit.gaps[index] for fit in fits]) for index in range(len(first.gaps))]
    gap_ns = [_mean_windows([fit.gap_ns[index] for fit in fits]) for index in range(len(first.gaps))]
    if obfuscate:
        gap_ns = [[{cls: value * perturbed(seed, tolerance, "gap", role, index, window, cls)
                    for cls, value in counts.items()} for window, counts in enumerate(gap)]
                  for index, gap in enumerate(gap_ns)]
    transitions: dict[str, dict[str, int]] = {}
    for fit in fits:
        for (before, after), count in fit.transitions.items():
            row = transitions.setdefault(before, {})
            row[after] = row.get(after, 0) + count
    transitions = {before: dict(sorted(row.items())) for before, row in sorted(transitions.items())}
    classes = {}
    for cls in sorted({cls for fit in fits for cls in fit.values}):
        values = [v for fit in fits for v in fit.values.get(cls, ())]
        patterns: Counter[Pattern] = Counter()
        for fit in fits:
            patterns.update(fit.patterns.get(cls, {}))
        bins = value_bins(values, keep_names=not obfuscate)
        if obfuscate:
            bins = [b.model_copy(update={
                field: getattr(b, field) * perturbed(seed, tolerance, "bin", role, cls, index, field)
                for field in ("duration_ns", "num_ops", "tensor_size") if getattr(b, field) is not None})
                for index, b in enumerate(bins)]
        classes[cls] = NodeClass(
            bins=bins,
            exact_ns=any(cls in f.exact_ns for f in fits),
            parents=[(before, since, anchor, list(p), n) for (before, since, anchor, p), n in
                     sorted(patterns.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_PATTERNS]])
    return Role(ranks=len(fits), anchors=anchors, gaps=gaps, gap_ns=gap_ns, transitions=transitions,
                classes=classes)


def _mean_windows(windows_of: list[list[Counter[str]]]) -> list[dict[str, float]]:
    """Window by window, the mean over the pooled ranks (a rank with fewer windows counts as empty)."""
    longest = max(len(windows) for windows in windows_of)
    return [_mean_counts([windows[i] if i < len(windows) else Counter() for windows in windows_of])
            for i in range(longest)]


def _mean_counts(counters: list[Counter[str]]) -> dict[str, float]:
    total: Counter[str] = Counter()
    for counter in counters:
        total.update(counter)
    return {cls: value / len(counters) for cls, value in sorted(total.items())}


def value_bins(values: list[Value], max_bins: int = MAX_BINS, keep_names: bool = True) -> list[Bin]:
    """The bins of a class's values: one per distinct (duration, num_ops, tensor_size) when there
    are at most `max_bins`, else `max_bins` equal-count bins (sizes differ by at most one) of the
    sorted values; each with its count, mean values (None where no node of the bin had the
    attribute) and most common name."""
    ordered = sorted(values, key=_value_key)
    distinct: dict[tuple[int, int, int], list[Value]] = {}
    for value in ordered:
        distinct.setdefault(_value_key(value), []).append(value)
    if len(distinct) <= max_bins:
        chunks = list(distinct.values())
    else:
        count = len(ordered)
        chunks, start = [], 0
        for index in range(max_bins):
            end = start + count // max_bins + (1 if index < count % max_bins else 0)
            chunks.append(ordered[start:end])
            start = end
    return [Bin(count=len(chunk), duration_ns=sum(v[0] for v in chunk) / len(chunk),
                num_ops=_mean(v[1] for v in chunk), tensor_size=_mean(v[2] for v in chunk),
                name=Counter(v[3] for v in chunk).most_common(1)[0][0] if keep_names else None)
            for chunk in chunks]


def _value_key(value: Value) -> tuple[int, int, int]:
    # value[:3] is (duration, num_ops, tensor_size): three ints once None is -1
    return cast("tuple[int, int, int]", tuple(-1 if v is None else v for v in value[:3]))


def _mean(values: Iterable[Optional[int]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None
