"""Sampling traces from a synthesis model (chakra_core.tools.synthesis.model).

Per role, one program is drawn, and every rank of the role runs it:
1. Length: `--length L` nodes per rank asks for f = L / (source nodes per rank) times the
   source. The anchors are repeated round(f) times (training steps; at least once) and each
   gap's counts are scaled by the rest, f / round(f).
2. Node classes of each gap: its counts (rounded at random, keeping the mean), in an order
   drawn one node at a time with weight remaining(class) x transitions(previous, class), or
   remaining(class) when no remaining class ever followed the previous one: the source's
   habits (a kernel after its launch, an unpack after a collective) while the gap's counts
   come out exact.
3. Values: the m nodes of a class get the class's bins in proportion to the bins' counts
   (stratified), a bin's durations rounded so that they sum to its mean times their number.
   The values go to windows largest first, each to the window whose open slots need the most
   on average (target left over slots left): a long operation lands where the source had one,
   and the time between two collectives stays close to the source's.
4. Dependencies: each node draws a parent pattern of its class, among those the source had
   after the same class, at the same position after the last anchor and after an anchor of
   the same class (else dropping the last, then the last two conditions; [lane, k]: the k-th latest
   node of that lane) and takes the nodes it names; an anchor keeps its own pattern, and the
   nodes at its consumer positions after it wait for it.
Ranks are then written from their role's program: group names, partner ranks and the
process-group METADATA node are the only per-rank parts.

Rank layout for N ranks from a source of R: with N a multiple of R, rank s plays source rank
s mod R in replica s // R; groups other than "every rank" are copied per replica and partners
stay in the replica (N/R data-parallel copies of the source job, sharing its world-wide
collectives). Otherwise every group the source uses must be the world, and partners wrap
around N (a ring stays a ring).
"""

from __future__ import annotations

import heapq
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, cast

from chakra_core.feeder.base import CPU_FLAG
from chakra_core.schema import pb
from chakra_core.et.build import (TRACE_VERSION, bool_attr, read_collective, micros_from_ns, p2p_attrs,
                                      process_group_json, uint_attr, write_rank_files)
from chakra_core.tools.synthesis.fit import MAX_SINCE_ANCHOR, class_lane
from chakra_core.tools.synthesis.model import Anchor, Bin, Role, SynthesisError, SynthesisModel, class_kind

@dataclass
class _Item:
    """One node of a role's program."""

    cls: str
    lane: str
    anchor: Optional[Anchor] = None
    gap: int = 0
    name: str = ""
    duration: int = 0
    num_ops: Optional[int] = None
    tensor_size: Optional[int] = None
    parents: list[int] = field(default_factory=list)


@dataclass
class Layout:
    """Which source rank and replica each synthetic rank plays."""

    ranks: int
    source_ranks: int
    replicated: bool

    def source_rank(self, rank: int) -> int:
        return rank % self.source_ranks

    def replica(self, rank: int) -> int:
        return rank // self.source_ranks if self.replicated else 0

    def partner(self, rank: int, offset: int) -> int:
        if self.replicated:
            base = self.replica(rank) * self.source_ranks
            return base + (self.source_rank(rank) + offset) % self.source_ranks
        signed = offset - self.source_ranks if offset > self.source_ranks // 2 else offset
        return (rank + signed) % self.ranks


def layout(model: SynthesisModel, ranks: int) -> Layout:
    if ranks < 1:
        raise SynthesisError(f"--ranks must be at least 1, got {ranks}")
    source = model.num_ranks
    if ranks % source == 0:
        return Layout(ranks, source, replicated=True)
    partial = sorted({index for entry in model.ranks for index in entry.groups
                      if model.groups[index] is not None})
    if partial:
        members = model.groups[partial[0]]
        raise SynthesisError(
            f"the source has {source} ranks and communicator groups of some of them (e.g. {members}); "
            f"{ranks} ranks is not a multiple of {source}, so those groups cannot be laid out: ask for "
            f"a multiple of {source}")
    return Layout(ranks, source, replicated=False)


def role_program(model: SynthesisModel, role_index: int, length: Optional[int], seed: int) -> list[_Item]:
    """The nodes every rank of a role runs (see module docstring)."""
    role = model.roles[role_index]
    rng = random.Random(f"chakra-sim synthesize|{seed}|role {role_index}")
    factor = 1.0 if length is None else length / max(model.source_nodes, 1)
    repeats = max(1, round(factor))
    scale = factor / repeats
    items: list[_Item] = []
    targets: list[dict[str, float]] = []      # per gap drawn: the class's total duration to aim at
    previous = "^"
    for _ in range(repeats):
        for index, gap in enumerate(role.gaps):
            for window, means in enumerate(gap):
                counts = {cls: _round_at_random(mean * scale, rng) for cls, mean in means.items()}
                uid = len(targets)
                targets.append({cls: ns * scale for cls, ns in role.gap_ns[index][window].items()})
                for cls in _ordered(counts, previous, role, rng):
                    items.append(_Item(cls=cls, lane=class_lane(cls), gap=uid))
                    previous = cls
            if index < len(role.anchors):
                anchor = role.anchors[index]
                items.append(_Item(cls=anchor.cls, lane=class_lane(anchor.cls), anchor=anchor,
                                   duration=anchor.duration_ns))
                previous = anchor.cls
    _assign_values(items, role, targets, rng)
    _assign_parents(items, role, rng)
    return items


def _round_at_random(value: float, rng: random.Random) -> int:
    whole = int(value)
    return whole + (1 if rng.random() < value - whole else 0)


def _ordered(counts: dict[str, int], previous: str, role: Role, rng: random.Random) -> list[str]:
    remaining = {cls: n for cls, n in sorted(counts.items()) if n > 0}
    out = []
    while remaining:
        row = role.transitions.get(previous, {})
        classes = list(remaining)
        weights = [remaining[cls] * row.get(cls, 0) for cls in classes]
        if not any(weights):     # no pair the source had is left: any remaining class
            weights = [remaining[cls] for cls in classes]
        cls = rng.choices(classes, weights)[0]
        out.append(cls)
        remaining[cls] -= 1
        if not remaining[cls]:
            del remaining[cls]
        previous = cls
    return out


def _assign_values(items: list[_Item], role: Role, targets: list[dict[str, float]], rng: random.Random) -> None:
    """Give a class's nodes the class's values (see module docstring), the largest first, each to
    the window whose open slots most need it (target left over slots left): a long operation
    lands where the source had one."""
    by_class: dict[str, list[_Item]] = {}
    for item in items:
        if item.anchor is None:
            by_class.setdefault(item.cls, []).append(item)
    for cls, members in by_class.items():
        spec = role.classes[cls]
        values = _stratified_values(spec.bins, len(members), rng)
        open_slots: dict[int, list[_Item]] = {}
        for item in members:
            open_slots.setdefault(item.gap, []).append(item)
        for slots in open_slots.values():
            rng.shuffle(slots)
        # Max-heap on what each open slot of a window still needs on average (a two-node gap of
        # short operations does not take a long one), ties by window: deterministic.
        need = {gap: targets[gap].get(cls, 0.0) for gap in open_slots}
        heap = [(-need[gap] / len(open_slots[gap]), gap) for gap in sorted(open_slots)]
        heapq.heapify(heap)
        for duration, num_ops, tensor_size, name in sorted(values, key=lambda v: -v[0]):
            _, gap = heapq.heappop(heap)
            item = open_slots[gap].pop()
            item.duration, item.num_ops, item.tensor_size, item.name = duration, num_ops, tensor_size, name
            need[gap] -= duration
            if open_slots[gap]:
                heapq.heappush(heap, (-need[gap] / len(open_slots[gap]), gap))


def _stratified_values(bins: list[Bin], count: int,
                       rng: random.Random) -> list[tuple[int, Optional[int], Optional[int], str]]:
    """`count` values from the bins, each bin in proportion to its count (largest remainder); a
    bin's durations are rounded so they sum to its mean times their number."""
    total = sum(b.count for b in bins)
    quotas = [count * b.count / total for b in bins]
    shares = [int(q) for q in quotas]
    order = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - shares[i]), i))
    for i in order[:count - sum(shares)]:
        shares[i] += 1
    values: list[tuple[int, Optional[int], Optional[int], str]] = []
    for b, share in zip(bins, shares):
        if not share:
            continue
        base, extra = divmod(round(b.duration_ns * share), share)
        num_ops = None if b.num_ops is None else round(b.num_ops)
        tensor_size = None if b.tensor_size is None else round(b.tensor_size)
        values.extend((base + (1 if i < extra else 0), num_ops, tensor_size, b.name or "") for i in range(share))
    return values


def _assign_parents(items: list[_Item], role: Role, rng: random.Random) -> None:
    history: dict[str, list[int]] = {}
    since_anchor, last_anchor = 0, "^"
    for position, item in enumerate(items):
        if item.anchor is not None:
            since_anchor, last_anchor = 0, item.cls
            for offset in item.anchor.consumers:
                if position + offset < len(items):
                    items[position + offset].parents.append(position)
            pattern = item.anchor.parents
        else:
            before = items[position - 1].cls if position else "^"
            since_anchor = min(since_anchor + 1, MAX_SINCE_ANCHOR)
            known = role.classes[item.cls].parents
            context = (before, since_anchor, last_anchor)
            choices = ([(p, n) for *key, p, n in known if tuple(key) == context]
                       or [(p, n) for *key, p, n in known if tuple(key[:2]) == context[:2]]
                       or [(p, n) for previous, _, _, p, n in known if previous == before]
                       or [(p, n) for *_, p, n in known])
            pattern = rng.choices([p for p, _ in choices], [n for _, n in choices])[0] if choices else []
        for lane, recency in pattern:
            lane_nodes = history.get(lane, ())
            if len(lane_nodes) >= recency:
                item.parents.append(lane_nodes[-recency])
        item.parents = sorted(set(item.parents))
        history.setdefault(item.lane, []).append(position)


def group_name(index: int, replica: int) -> str:
    return f"group{index}" if replica == 0 else f"group{index}.r{replica}"


def rank_nodes(model: SynthesisModel, place: Layout, rank: int, program: list[_Item]) -> list[pb.Node]:
    """One synthetic rank's nodes: its role's program with its own groups and partners."""
    entry = model.ranks[place.source_rank(rank)]
    replica = place.replica(rank)
    slots: list[tuple[str, Optional[list[int]]]] = []
    for index in entry.groups:
        members = model.groups[index]
        if members is None:
            slots.append(("", None))
        else:
            base = replica * place.source_ranks
            slots.append((group_name(index, replica), [base + m for m in members]))
    any_groups = any(members is not None for members in model.groups)
    role = model.roles[entry.role]
    exact_ns = {cls: spec.exact_ns for cls, spec in role.classes.items()}
    nodes: list[pb.Node] = []
    offset = 0
    if any_groups:
        meta = pb.Node(id=0, name="process_groups", type=pb.METADATA_NODE)
        meta.inputs.values = process_group_json([(n, m) for n, m in slots if m is not None])
        nodes.append(meta)
        offset = 1
    for position, item in enumerate(program):
        # a NodeType value (or one this schema does not name, kept as the source had it)
        node_type = cast("pb.NodeType", class_kind(item.cls) & ~CPU_FLAG)
        node = pb.Node(id=position + offset, name=item.name, type=node_type,
                       duration_micros=micros_from_ns(item.duration))
        if item.parents:
            node.data_deps.extend(p + offset for p in item.parents)
        elif offset:
            node.ctrl_deps.append(0)
        anchor = item.anchor
        if anchor is None:
            if node.type == pb.COMP_NODE:
                node.attr.append(bool_attr("is_cpu_op", item.lane == "cpu"))
            if exact_ns[item.cls]:
                node.attr.append(uint_attr("duration_ns", item.duration))
            if item.num_ops is not None:
                node.attr.append(uint_attr("num_ops", item.num_ops))
            if item.tensor_size is not None:
                node.attr.append(uint_attr("tensor_size", item.tensor_size))
        elif node.type == pb.COMM_COLL_NODE:
            name, _ = slots[anchor.slot] if anchor.slot is not None else ("", None)
            node.attr.extend(read_collective(anchor.comm_type if anchor.comm_type is not None else 0,
                                              anchor.size or 0, name or None))
            if anchor.involved_dim is not None:
                node.attr.append(pb.AttributeProto(name="involved_dim",
                                                   bool_list=pb.BoolList(values=anchor.involved_dim)))
        else:
            partner = place.partner(rank, anchor.peer or 0)
            src, dst = (rank, partner) if node.type == pb.COMM_SEND_NODE else (partner, rank)
            node.attr.extend(p2p_attrs(src, dst, anchor.tag or 0, anchor.size or 0))
        nodes.append(node)
    return nodes


def sample_traces(model: SynthesisModel, ranks: Optional[int] = None, length: Optional[int] = None,
                  seed: int = 0) -> Iterator[list[pb.Node]]:
    """Each synthetic rank's nodes, rank 0 first (programs are drawn once per role)."""
    place = layout(model, ranks if ranks is not None else model.num_ranks)
    if length is not None and length < 1:
        raise SynthesisError(f"--length must be at least 1 node, got {length}")
    programs: dict[int, list[_Item]] = {}
    for rank in range(place.ranks):
        role = model.ranks[place.source_rank(rank)].role
        if role not in programs:
            programs[role] = role_program(model, role, length, seed)
        yield rank_nodes(model, place, rank, programs[role])


def write_synthetic(model: SynthesisModel, out_prefix: str | os.PathLike[str], ranks: Optional[int] = None,
                    length: Optional[int] = None, seed: int = 0) -> list[Path]:
    """Write OUT.<rank>.et for every synthetic rank; return the paths."""
    count = model.num_ranks if ranks is None else ranks
    return write_rank_files(out_prefix, sample_traces(model, ranks, length, seed),
                            pb.GlobalMetadata(version=TRACE_VERSION), count=count, what="--ranks")
