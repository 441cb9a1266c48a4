"""`chakra-sim analyze`: what a job's traces ask of the machine, found without simulating.

    chakra-sim analyze PREFIX [--out DIR] [--json] [--imbalance-threshold X]
                       [--compute-time duration|roofline --peak-tflops F --mem-bw-gbps F]
                       [--comm-group groups.json] [--dependencies all|data]
    chakra-sim analyze --results A/results.json --results B/results.json [--out DIR] [--json]

For every rank (`PREFIX.<rank>.et` or `.et.gz`) and across ranks `analyze_traces` reports:

- node counts by NodeType name, COMP nodes split into `COMP_NODE:GPU` and `COMP_NODE:CPU`
  (`is_cpu_op`);
- compute: the summed time of the COMP nodes, the critical path (the heaviest dependency
  chain, data and control dependencies, where a COMP node weighs its time and every other
  node 0) and the available parallelism (compute / critical path). A node's time is what the
  `replay` compute model gives (its traced duration), or with `roofline`
  max(num_ops / peak, tensor_size / memory bandwidth), as the `roofline` plugin times it
  (CPU ops and nodes without num_ops keep their traced duration there too);
- communication: node count and `comm_size` bytes per collective type and SEND/RECV, and
  messages per power-of-two size bucket;
- communicator groups: the METADATA process groups, `--comm-group`, and the `pg_name`s
  the collectives use (read by `chakra_core.system.groups.GroupRegistry`, as a run reads them);
- collective size imbalance: in each group, the k-th collective of each member rank (in
  node-id order, as `chakra-sim validate` pairs them), with the min / max / mean `comm_size`
  over the ranks; flagged when max / min exceeds the threshold (a min of 0 under a max above 0
  always is) or the ranks disagree on its type. Ranks issuing fewer collectives in a group
  than the others are listed too: a run would wait for them forever.

Identical rank files are read once (`chakra_core.feeder.library.IdenticalFiles`), each file
in one streaming pass. The report is a JSON-able dict; `--out` writes it as analysis.json
with the plots of `chakra_core.report.plots`. `--results` compares two runs instead
(`chakra_core.report.compare`). docs/analysis.md is the user guide.
"""

from __future__ import annotations

import json
import re
from array import array
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from statistics import median_low
from typing import Any, Iterable

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from chakra_core._atomic import AtomicFiles
from chakra_core.errors import AttributeTypeError, TraceGraphError
from chakra_core.et.attrs import NodeView
from chakra_core.et.io import iter_trace
from chakra_core.et.jsonize import rank_files
from chakra_core.feeder.base import (CPU_FLAG, DEPENDENCY_MODES, cycle_error, find_cycle,
                                     missing_parent_problem, node_kind, parents_of, topological_positions,
                                     use_control_deps)
from chakra_core.feeder.library import IdenticalFiles
from chakra_core.engine.replay import replay_time_ns
from chakra_core.report.plots import group_label, size_text
from chakra_core.report.summary import compact_ranks, format_bytes, format_time, time_unit
from chakra_core.schema import pb
from chakra_core.comm.groups import WORLD, GroupRegistry
from chakra_core.cli.output import out_console
from chakra_core.cli.output import CliError, tool_errors

DEFAULT_THRESHOLD = 1.1
MAX_RANK_ROWS = 16
"""Up to this many ranks the summary has one row per rank; above, min / median / max."""
MAX_FLAGGED_ROWS = 30
"""Rows of flagged collectives, ranks missing collectives and groups the terminal shows;
analysis.json / --json hold them all."""
ANALYSIS_JSON = "analysis.json"
COMPARISON_JSON = "comparison.json"

_NODE_TYPE_NAMES = {value: name for name, value in pb.NodeType.items()}
_COLLECTIVE_NAMES = {value: name for name, value in pb.CollectiveCommType.items()}
COMM_KINDS = (*pb.CollectiveCommType.keys(), "UNKNOWN", "SEND", "RECV")
"""Rows of the communication tables, in this order (collective types as in et_def.proto)."""


# How a compute node is timed --------------------------------------------------------------------
@dataclass(frozen=True)
class ComputeTiming:
    """`duration`: the traced duration, as the `replay` compute model plays it. `roofline`:
    max(num_ops / peak, tensor_size / bandwidth) for GPU nodes with num_ops (peak in TFLOP/s =
    10^12 FLOP/s, bandwidth in GB/s = 10^9 B/s, as the `roofline` plugin reads them); CPU ops and
    nodes without num_ops keep their traced duration, as in that plugin."""

    mode: str = "duration"
    peak_tflops: float | None = None
    mem_bw_gbps: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("duration", "roofline"):
            raise ValueError(f"compute timing must be duration or roofline, not {self.mode!r}")
        if self.mode == "roofline" and not (self.peak_tflops and self.mem_bw_gbps):
            raise ValueError("roofline timing needs peak_tflops and mem_bw_gbps above 0")

    def node_ns(self, node: NodeView) -> tuple[int, bool]:
        """(time in ns, whether the roofline timed it)."""
        if self.mode == "roofline" and not node.is_cpu_op and node.has("num_ops"):
            seconds = max(node.int("num_ops") / (self.peak_tflops * 1e12),
                          node.int("tensor_size", 0) / (self.mem_bw_gbps * 1e9))
            return int(seconds * 1e9), True
        return replay_time_ns(node), False

    def describe(self) -> dict[str, Any]:
        if self.mode == "duration":
            return {"mode": "duration"}
        return {"mode": "roofline", "peak_tflops": self.peak_tflops, "mem_bw_gbps": self.mem_bw_gbps}


# One trace file ----------------------------------------------------------------------------------
@dataclass
class Collective:
    """A collective as the imbalance check compares it (`id` and `name` to point at the node)."""

    id: int
    name: str
    comm_type: str
    size: int
    group: str


@dataclass
class TraceScan:
    """What one trace file holds, read in one pass; shared by every rank with the same bytes."""

    path: str
    node_counts: Counter = field(default_factory=Counter)
    gpu_compute_ns: int = 0
    cpu_compute_ns: int = 0
    roofline_nodes: int = 0
    critical_path_ns: int = 0
    comm: dict[str, list[int]] = field(default_factory=dict)
    """kind (collective type name, SEND, RECV) -> [nodes, bytes]"""
    message_sizes: Counter = field(default_factory=Counter)
    """size bucket (0, or the power of two at or below the size) -> messages"""
    collectives: list[Collective] = field(default_factory=list)
    """in node-id order"""
    group_nodes: list[NodeView] = field(default_factory=list)
    """METADATA nodes that define process groups"""
    warnings: list[str] = field(default_factory=list)

    @property
    def compute_ns(self) -> int:
        return self.gpu_compute_ns + self.cpu_compute_ns

    @cached_property
    def by_group(self) -> dict[str, list[Collective]]:
        """The collectives of each communicator group, in node-id order."""
        groups: dict[str, list[Collective]] = {}
        for coll in self.collectives:
            groups.setdefault(coll.group, []).append(coll)
        return groups


def size_bucket(size: int) -> int:
    """The power of two at or below `size` (0 for 0): the message-size bucket [b, 2b)."""
    return 1 << (size.bit_length() - 1) if size > 0 else 0


def node_type_key(kind: int) -> str:
    """The NodeType name of a node kind (`node_kind`), COMP nodes as COMP_NODE:GPU / COMP_NODE:CPU."""
    node_type = kind & ~CPU_FLAG
    name = _NODE_TYPE_NAMES.get(node_type, f"NODE_TYPE_{node_type}")
    if node_type == pb.COMP_NODE:
        return f"{name}:{'CPU' if kind & CPU_FLAG else 'GPU'}"
    return name


def scan_trace(path: str | Path, timing: ComputeTiming = ComputeTiming(),
               dependencies: str = "all") -> TraceScan:
    """Read one trace file in a single streaming pass (see the module docstring).

    Raises TraceFormatError (corrupt or truncated file), TraceGraphError (duplicate id,
    dependency on a missing node, cycle) or AttributeTypeError, each naming the file. A missing
    control parent is dropped with a warning, as a run does by default."""
    use_ctrl = use_control_deps(dependencies)
    spath = str(path)
    scan = TraceScan(spath)
    ids = array("Q")
    weights: list[int] = []
    parents: list[tuple[int, ...]] = []
    data_counts: list[int] = []          # the first data_counts[i] of parents[i] are data deps
    position: dict[int, int] = {}
    _, nodes = iter_trace(spath)
    try:
        with closing(nodes):     # an error mid-file closes the file at once
            for offset, node in nodes:
                node_id = node.id
                if node_id in position:
                    raise TraceGraphError(f"{spath}: duplicate node id {node_id} (the second, "
                                          f"{node.name!r}, at byte {offset})")
                position[node_id] = len(ids)
                ids.append(node_id)
                plist = [p for p in parents_of(node, use_ctrl) if p != node_id]
                parents.append(tuple(plist))
                data_counts.append(len(set(node.data_deps) - {node_id}) if use_ctrl and node.ctrl_deps
                                   else len(plist))
                weights.append(_count_node(scan, node, timing))
    except AttributeTypeError as exc:
        raise AttributeTypeError(f"{spath}: {exc}") from None
    scan.collectives.sort(key=lambda coll: coll.id)
    scan.critical_path_ns = _critical_path(spath, ids, weights, parents, data_counts, position,
                                           use_ctrl, scan.warnings)
    return scan


def _count_node(scan: TraceScan, node: pb.Node, timing: ComputeTiming) -> int:
    """Add a node to the scan's counts; return its weight on the critical path."""
    kind = node_kind(node)
    node_type = kind & ~CPU_FLAG
    scan.node_counts[node_type_key(kind)] += 1
    if node_type == pb.COMP_NODE:
        time_ns, by_roofline = timing.node_ns(NodeView(node))
        scan.roofline_nodes += by_roofline
        if kind & CPU_FLAG:
            scan.cpu_compute_ns += time_ns
        else:
            scan.gpu_compute_ns += time_ns
        return time_ns
    if node_type == pb.COMM_COLL_NODE:
        view = NodeView(node)
        comm_type = _COLLECTIVE_NAMES.get(view.int("comm_type", -1), "UNKNOWN")
        size = view.int("comm_size", 0)
        group = view.str("pg_name", WORLD)
        scan.collectives.append(Collective(node.id, node.name, comm_type, size,
                                           WORLD if group == "0" else group))
        _count_message(scan, comm_type, size)
    elif node_type == pb.COMM_SEND_NODE:
        _count_message(scan, "SEND", NodeView(node).int("comm_size", 0))
    elif node_type == pb.COMM_RECV_NODE:
        _count_message(scan, "RECV", NodeView(node).int("comm_size", 0))
    elif node_type == pb.METADATA_NODE and "pg_name" in node.inputs.values:
        scan.group_nodes.append(NodeView(node))
    return 0


def _count_message(scan: TraceScan, kind: str, size: int) -> None:
    counts = scan.comm.setdefault(kind, [0, 0])
    counts[0] += 1
    counts[1] += size
    scan.message_sizes[size_bucket(size)] += 1


def _critical_path(path: str, ids: array, weights: list[int], parents: list[tuple[int, ...]],
                   data_counts: list[int], position: dict[int, int], use_ctrl: bool,
                   warnings: list[str]) -> int:
    """The heaviest dependency chain's weight (Kahn's order); checks missing parents and cycles."""
    count = len(ids)
    parent_positions: list[tuple[int, ...]] = []
    missing_data: list[tuple[int, int]] = []
    missing_ctrl: list[tuple[int, int]] = []
    for i, plist in enumerate(parents):
        known = tuple(position[p] for p in plist if p in position)
        if len(known) != len(plist):
            for j, parent in enumerate(plist):
                if parent not in position:
                    (missing_data if j < data_counts[i] else missing_ctrl).append((ids[i], parent))
        parent_positions.append(known)
    if missing_data or missing_ctrl:
        names: dict[int, str] = {}

        def name_of(node_id: int) -> str:   # only an error names nodes: read them only then
            if not names:
                names.update(_node_names(path, {node for node, _ in missing_data}))
            return names[node_id]

        error, warning = missing_parent_problem(path, "ignore-control", missing_data, missing_ctrl, name_of)
        if error:
            raise error
        warnings.append(warning)

    order, unreached = topological_positions(parent_positions)
    if unreached:
        leftover = [ids[i] for i in unreached]
        cycle = find_cycle(leftover, lambda node_id: [ids[p] for p in parent_positions[position[node_id]]])
        error = cycle_error(path, cycle, len(leftover), use_ctrl=False)
        hint = (" (if the cycle goes through control dependencies, --dependencies data honours data "
                "dependencies only, as Chakra's C++ feeder does)") if use_ctrl else ""
        raise TraceGraphError(f"{error}{hint}")
    end = [0] * count              # each node's end: its weight after the latest end among its parents
    for i in order:
        end[i] = max((end[p] for p in parent_positions[i]), default=0) + weights[i]
    return max(end, default=0)


def _node_names(path: str, wanted: set[int]) -> dict[int, str]:
    """Names of some nodes (a second pass, only to word an error)."""
    _, nodes = iter_trace(path)
    return {node.id: node.name for _, node in nodes if node.id in wanted}


# The job: every rank -------------------------------------------------------------------------------
def analyze_traces(prefix: str | Path, timing: ComputeTiming = ComputeTiming(),
                   threshold: float = DEFAULT_THRESHOLD, comm_groups: dict[str, list[int]] | None = None,
                   dependencies: str = "all") -> dict[str, Any]:
    """The analysis report of a job's traces (JSON-able; see the module docstring)."""
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
    warnings = [w for scan in _distinct(scans) for w in scan.warnings]

    registry = GroupRegistry(len(paths), comm_groups)
    for rank, scan in enumerate(scans):
        for node in scan.group_nodes:
            registry.define_from_metadata(rank, node)
    groups, members_of = _groups(scans, registry, warnings)
    ranks = [_rank_row(rank, paths[rank], scan, first_rank[id(scan)]) for rank, scan in enumerate(scans)]
    return {
        "prefix": str(prefix),
        "num_ranks": len(paths),
        "distinct_traces": len(_distinct(scans)),
        "compute_time": timing.describe(),
        "dependencies": dependencies,
        "ranks": ranks,
        "totals": _totals(ranks),
        "groups": groups,
        "imbalance": imbalance(scans, members_of, threshold),
        "warnings": warnings,
    }


def _distinct(scans: list[TraceScan]) -> list[TraceScan]:
    return list({id(scan): scan for scan in scans}.values())


def _comm_entries(comm: dict[str, list[int]]) -> dict[str, dict[str, int]]:
    return {kind: {"count": comm[kind][0], "bytes": comm[kind][1]} for kind in COMM_KINDS if kind in comm}


def _size_entries(sizes: Counter) -> list[dict[str, int]]:
    return [{"from_bytes": bucket, "count": sizes[bucket]} for bucket in sorted(sizes)]


def _rank_row(rank: int, path: Path, scan: TraceScan, first: int) -> dict[str, Any]:
    return {
        "rank": rank,
        "file": str(path),
        "same_as_rank": None if first == rank else first,
        "nodes": sum(scan.node_counts.values()),
        "node_counts": dict(sorted(scan.node_counts.items())),
        "compute_ns": scan.compute_ns,
        "gpu_compute_ns": scan.gpu_compute_ns,
        "cpu_compute_ns": scan.cpu_compute_ns,
        "roofline_nodes": scan.roofline_nodes,
        "critical_path_ns": scan.critical_path_ns,
        "parallelism": scan.compute_ns / scan.critical_path_ns if scan.critical_path_ns else None,
        "comm_count": sum(count for count, _ in scan.comm.values()),
        "comm_bytes": sum(size for _, size in scan.comm.values()),
        "comm_by_type": _comm_entries(scan.comm),
        "message_sizes": _size_entries(scan.message_sizes),
    }


def _totals(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    node_counts: Counter = Counter()
    comm: dict[str, list[int]] = {}
    sizes: Counter = Counter()
    for row in ranks:
        node_counts.update(row["node_counts"])
        for kind, entry in row["comm_by_type"].items():
            counts = comm.setdefault(kind, [0, 0])
            counts[0] += entry["count"]
            counts[1] += entry["bytes"]
        for entry in row["message_sizes"]:
            sizes[entry["from_bytes"]] += entry["count"]
    return {
        "nodes": sum(node_counts.values()),
        "node_counts": dict(sorted(node_counts.items())),
        "compute_ns": sum(row["compute_ns"] for row in ranks),
        "comm_count": sum(count for count, _ in comm.values()),
        "comm_bytes": sum(size for _, size in comm.values()),
        "comm_by_type": _comm_entries(comm),
        "message_sizes": _size_entries(sizes),
    }


# Communicator groups and imbalance -------------------------------------------------------------
def natural_key(name: str) -> list:
    """Sort key putting tp2 before tp10 (and "", all ranks, first)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _groups(scans: list[TraceScan], registry: GroupRegistry,
            warnings: list[str]) -> tuple[list[dict[str, Any]], dict[str, tuple[int, ...]]]:
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
        entries.append({"name": name, "label": group_label(name), "members": list(members),
                        "source": sources[name], "collectives_min": min(issued, default=0),
                        "collectives_max": max(issued, default=0), "bytes": volume})
    return entries, members_of


def imbalance(scans: list[TraceScan], members_of: dict[str, tuple[int, ...]],
              threshold: float) -> dict[str, Any]:
    """Per group, the k-th collective of every member rank side by side (see the module docstring)."""
    groups, flagged, short = [], [], []
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
                short.append({"group": name, "rank": rank, "issued": issued, "expected": expected})
        entries = []
        for k in range(expected):
            entry = _kth_collective(k, [(rank, ranks_of[key], colls[k]) for key, (rank, colls) in shared.items()
                                        if k < len(colls)], threshold)
            entries.append(entry)
            if entry["flagged"]:
                flagged.append({"group": name, **entry})
        groups.append({"group": name, "members": len(members), "collectives": entries})
    return {"threshold": threshold, "flagged": flagged, "short_ranks": short, "groups": groups}


def _kth_collective(k: int, issued: list[tuple[int, int, Collective]], threshold: float) -> dict[str, Any]:
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
    return {
        "index": k + 1,
        "comm_type": "/".join(types),
        "ranks": ranks,
        "min_bytes": low[0], "max_bytes": high[0],
        "mean_bytes": sum(size * count for size, _, count, _ in sizes) / ranks,
        "ratio": ratio,
        "min_rank": low[1], "min_node": low[3].id,
        "max_rank": high[1], "max_node": high[3].id,
        "type_mismatch": len(types) > 1,
        "flagged": ratio is None or ratio > threshold or len(types) > 1,
    }


# Terminal tables ---------------------------------------------------------------------------------
def _ratio_text(ratio: float | None) -> str:
    return "inf" if ratio is None else f"{ratio:.3f}"


_SUMMARY_KEYS = ("nodes", "gpu", "cpu", "collectives", "send_recv", "compute_ns", "critical_path_ns",
                 "parallelism", "comm_bytes")


def _summary_values(row: dict[str, Any]) -> dict[str, Any]:
    counts = row["node_counts"]
    return {"nodes": row["nodes"], "gpu": counts.get("COMP_NODE:GPU", 0), "cpu": counts.get("COMP_NODE:CPU", 0),
            "collectives": counts.get("COMM_COLL_NODE", 0),
            "send_recv": counts.get("COMM_SEND_NODE", 0) + counts.get("COMM_RECV_NODE", 0),
            **{key: row[key] for key in ("compute_ns", "critical_path_ns", "parallelism", "comm_bytes")}}


def _summary_rows(ranks: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(label, values) rows: one per rank up to MAX_RANK_ROWS ranks, else min / median / max."""
    values = [_summary_values(row) for row in ranks]
    if len(ranks) <= MAX_RANK_ROWS:
        return [(str(row["rank"]), value) for row, value in zip(ranks, values)]
    rows = []
    for label, pick in (("min", min), ("median", median_low), ("max", max)):
        picked = {}
        for key in _SUMMARY_KEYS:
            present = [value[key] for value in values if value[key] is not None]
            picked[key] = pick(present) if present else None
        rows.append((label, picked))
    return rows


def summary_table(report: dict[str, Any]) -> Table:
    ranks = report["ranks"]
    unit = time_unit(max((row["compute_ns"] for row in ranks), default=0))
    many = len(ranks) > MAX_RANK_ROWS
    table = Table(title=f"{report['prefix']}: {report['num_ranks']} rank(s), "
                        f"{report['distinct_traces']} distinct trace file(s)",
                  title_justify="left", caption_justify="left",
                  caption="min / median / max over ranks of each column" if many else None)
    table.add_column("ranks" if many else "rank", justify="right")
    for header in ("nodes", "GPU comp", "CPU comp", "collectives", "send/recv", f"compute ({unit[0]})",
                   f"critical path ({unit[0]})", "parallelism", "comm volume"):
        table.add_column(header, justify="right")
    for label, values in _summary_rows(ranks):
        parallelism = values["parallelism"]
        table.add_row(label, *(f"{values[key]:,}" for key in _SUMMARY_KEYS[:5]),
                      format_time(values["compute_ns"], unit), format_time(values["critical_path_ns"], unit),
                      "-" if parallelism is None else f"{parallelism:.2f}", format_bytes(values["comm_bytes"]))
    return table


def node_table(report: dict[str, Any]) -> Table:
    ranks = report["ranks"]
    table = Table(title="nodes by type", title_justify="left")
    for header in ("type", "all ranks", "min per rank", "max per rank"):
        table.add_column(header, justify="left" if header == "type" else "right")
    for kind, total in report["totals"]["node_counts"].items():
        per_rank = [row["node_counts"].get(kind, 0) for row in ranks]
        table.add_row(kind, f"{total:,}", f"{min(per_rank):,}", f"{max(per_rank):,}")
    return table


def comm_table(report: dict[str, Any]) -> Table:
    ranks, totals = report["ranks"], report["totals"]
    table = Table(title="communication volume (comm_size)", title_justify="left",
                  caption="bytes as each node's comm_size says (see docs/collectives.md)", caption_justify="left")
    for header in ("type", "nodes", "bytes (all ranks)", "min per rank", "max per rank", "mean size"):
        table.add_column(header, justify="left" if header == "type" else "right")
    for kind, entry in totals["comm_by_type"].items():
        per_rank = [row["comm_by_type"].get(kind, {}).get("bytes", 0) for row in ranks]
        table.add_row(kind, f"{entry['count']:,}", format_bytes(entry["bytes"]), format_bytes(min(per_rank)),
                      format_bytes(max(per_rank)), format_bytes(round(entry["bytes"] / entry["count"])))
    return table


def size_table(report: dict[str, Any]) -> Table:
    table = Table(title="messages by size (all ranks)", title_justify="left")
    for header in ("size", "messages"):
        table.add_column(header, justify="right")
    for entry in report["totals"]["message_sizes"]:
        bucket = entry["from_bytes"]
        size = "0 B" if bucket == 0 else f"{size_text(bucket)} - <{size_text(2 * bucket)}"
        table.add_row(size, f"{entry['count']:,}")
    return table


def group_table(report: dict[str, Any]) -> Table:
    groups = report["groups"]
    table = Table(title="communicator groups", title_justify="left", caption_justify="left",
                  caption=(f"first {MAX_FLAGGED_ROWS} of {len(groups):,}; all in --json / analysis.json"
                           if len(groups) > MAX_FLAGGED_ROWS else None))
    for header in ("group", "ranks", "members", "defined by", "collectives per rank", "bytes"):
        table.add_column(header, justify="right" if header in ("ranks", "bytes") else "left")
    for group in groups[:MAX_FLAGGED_ROWS]:
        low, high = group["collectives_min"], group["collectives_max"]
        table.add_row(escape(group["label"]), str(len(group["members"])), compact_ranks(group["members"]),
                      escape(group["source"]), f"{low:,}" if low == high else f"{low:,} - {high:,}",
                      format_bytes(group["bytes"]))
    return table


def print_report(report: dict[str, Any], console: Console) -> None:
    for table in (summary_table(report), node_table(report)):
        console.print(table)
    timing = report["compute_time"]
    if timing["mode"] == "roofline":
        timed = sum(row["roofline_nodes"] for row in report["ranks"])
        compute_nodes = sum(n for kind, n in report["totals"]["node_counts"].items() if kind.startswith("COMP_NODE"))
        console.print(f"compute time: roofline at {timing['peak_tflops']:g} TFLOP/s and {timing['mem_bw_gbps']:g} "
                      f"GB/s for {timed:,} of {compute_nodes:,} compute node(s); the others (CPU ops, no num_ops) "
                      "at their traced duration", soft_wrap=True, highlight=False)
    if report["totals"]["comm_by_type"]:
        console.print(comm_table(report))
        console.print(size_table(report))
    if report["groups"]:
        console.print(group_table(report))
    _print_imbalance(report["imbalance"], console)
    for warning in report["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", soft_wrap=True, highlight=False)


def _print_imbalance(result: dict[str, Any], console: Console) -> None:
    flagged, threshold = result["flagged"], result["threshold"]
    if not result["groups"]:
        console.print("imbalance: no collectives", highlight=False)
    elif not flagged:
        console.print(f"imbalance: no collective has a max/min comm_size ratio above {threshold:g} across "
                      "its group's ranks", soft_wrap=True, highlight=False)
    else:
        table = Table(title=f"flagged collectives: max/min comm_size over the group's ranks above {threshold:g}, "
                            "or ranks disagreeing on the type",
                      title_justify="left", caption_justify="left",
                      caption=(f"first {MAX_FLAGGED_ROWS} of {len(flagged):,}; all in --json / analysis.json"
                               if len(flagged) > MAX_FLAGGED_ROWS else None))
        for header in ("group", "#", "type", "ranks", "min", "mean", "max", "max/min", "smallest", "largest"):
            table.add_column(header, justify="left" if header in ("group", "type", "smallest", "largest") else "right")
        for entry in flagged[:MAX_FLAGGED_ROWS]:
            table.add_row(escape(group_label(entry["group"])), str(entry["index"]), entry["comm_type"],
                          str(entry["ranks"]), format_bytes(entry["min_bytes"]),
                          format_bytes(round(entry["mean_bytes"])), format_bytes(entry["max_bytes"]),
                          _ratio_text(entry["ratio"]),
                          f"rank {entry['min_rank']} node {entry['min_node']}",
                          f"rank {entry['max_rank']} node {entry['max_node']}")
        console.print(table)
    short = result["short_ranks"]
    if short:
        table = Table(title="ranks missing collectives (would hang)", title_justify="left", caption_justify="left",
                      caption=f"first {MAX_FLAGGED_ROWS} of {len(short):,}" if len(short) > MAX_FLAGGED_ROWS else None)
        for header in ("group", "rank", "issues", "others issue"):
            table.add_column(header, justify="left" if header == "group" else "right")
        for entry in short[:MAX_FLAGGED_ROWS]:
            table.add_row(escape(group_label(entry["group"])), str(entry["rank"]), f"{entry['issued']:,}",
                          f"{entry['expected']:,}")
        console.print(table)


# Output folder -----------------------------------------------------------------------------------
def report_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=1) + "\n"


def write_outputs(out_dir: Path, files: dict[str, str | bytes]) -> list[Path]:
    """Write the files into `out_dir` together (all renamed at the end); return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with AtomicFiles() as staged:
        for name, contents in files.items():
            if isinstance(contents, bytes):
                staged.write_bytes(out_dir / name, contents)
            else:
                staged.write_text(out_dir / name, contents)
        written = staged.commit()
    return written


def analysis_files(report: dict[str, Any]) -> dict[str, str | bytes]:
    """analysis.json and the plots of `report`."""
    from chakra_core.report import plots

    return {
        ANALYSIS_JSON: report_json(report),
        plots.MESSAGE_SIZES_PNG: plots.message_sizes_png(report),
        plots.IMBALANCE_PNG: plots.imbalance_png(report),
        plots.COMPUTE_VS_COMM_PNG: plots.compute_vs_comm_png(report),
    }


# The command -------------------------------------------------------------------------------------
def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE


@click.command()
@click.argument("prefix", required=False)
@click.option("--results", "results_files", multiple=True, metavar="RESULTS.json",
              type=click.Path(exists=True, dir_okay=False),
              help="compare two runs instead: give --results twice (A, then B)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="write analysis.json and the plots (comparison.json and compare.png with --results) here")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON instead of tables")
@click.option("--imbalance-threshold", type=click.FloatRange(min=1.0), default=DEFAULT_THRESHOLD,
              show_default=True, help="flag a collective whose max/min comm_size over its group's ranks is above this")
@click.option("--compute-time", type=click.Choice(["duration", "roofline"]), default="duration", show_default=True,
              help="time of a compute node: its traced duration, or the roofline of --peak-tflops and --mem-bw-gbps")
@click.option("--peak-tflops", type=click.FloatRange(min=0, min_open=True),
              help="roofline peak compute, TFLOP/s (10^12 FLOP/s)")
@click.option("--mem-bw-gbps", type=click.FloatRange(min=0, min_open=True),
              help="roofline memory bandwidth, GB/s (10^9 B/s)")
@click.option("--comm-group", type=click.Path(exists=True, dir_okay=False),
              help="ASTRA-sim communicator-group JSON ({\"<pg_name>\": [ranks]}), as `run` takes it")
@click.option("--dependencies", type=click.Choice(DEPENDENCY_MODES), default="all", show_default=True,
              help="dependencies the critical path follows: data and control, or data only")
@click.option("--debug", is_flag=True, help="show tracebacks")
@click.pass_context
def analyze(ctx: click.Context, prefix: str | None, results_files: tuple[str, ...], out_dir: str | None,
            as_json: bool, imbalance_threshold: float, compute_time: str, peak_tflops: float | None,
            mem_bw_gbps: float | None, comm_group: str | None, dependencies: str, debug: bool) -> None:
    """Analyze a job's traces without simulating: node counts, compute time and critical path,
    communication volume and sizes, communicator groups, collective size imbalance across ranks.
    With --results, compare two runs' results.json instead.

    \b
    Examples:
      chakra-sim analyze traces/all_reduce
      chakra-sim analyze traces/scale --compute-time roofline --peak-tflops 100 --mem-bw-gbps 1600 --out analysis/
      chakra-sim analyze --results base/results.json --results faster/results.json --out compare/
    """
    if results_files:
        trace_options = [name for name in ("imbalance_threshold", "compute_time", "peak_tflops", "mem_bw_gbps",
                                           "comm_group", "dependencies") if _given(ctx, name)]
        if prefix or trace_options:
            what = f"--{trace_options[0].replace('_', '-')}" if trace_options else f"the trace prefix {prefix}"
            raise CliError(f"--results compares two runs; {what} applies to a trace analysis: give one or the other")
        _compare(results_files, out_dir, as_json, debug)
        return
    if not prefix:
        raise CliError("give a trace PREFIX (files PREFIX.<rank>.et), or --results twice")
    timing = _timing(compute_time, peak_tflops, mem_bw_gbps)
    console = out_console(stderr=as_json)
    with tool_errors(f"the analysis to {out_dir}", debug):
        try:
            groups = None
            if comm_group:
                from chakra_core.config.astra import read_comm_groups

                groups = read_comm_groups(Path(comm_group))
            report = analyze_traces(prefix, timing, imbalance_threshold, groups, dependencies)
        except OSError as exc:    # tool_errors words an OSError as a write failure
            raise CliError(f"cannot read {exc.filename or prefix}: {exc.strerror or exc}") from exc
        written = write_outputs(Path(out_dir), analysis_files(report)) if out_dir else []
    _show(report, print_report, written, console, as_json)


def _show(document: dict[str, Any], print_tables, written: list[Path], console: Console, as_json: bool) -> None:
    """The JSON document on stdout (--json) or its tables, then the files written."""
    if as_json:
        click.echo(report_json(document), nl=False)
    else:
        print_tables(document, console)
    for path in written:
        console.print(f"wrote {path}", highlight=False)


def _timing(mode: str, peak_tflops: float | None, mem_bw_gbps: float | None) -> ComputeTiming:
    if mode == "roofline":
        absent = [flag for flag, value in (("--peak-tflops", peak_tflops), ("--mem-bw-gbps", mem_bw_gbps))
                  if value is None]
        if absent:
            raise CliError(f"--compute-time roofline needs {' and '.join(absent)}")
        return ComputeTiming("roofline", peak_tflops, mem_bw_gbps)
    given = [flag for flag, value in (("--peak-tflops", peak_tflops), ("--mem-bw-gbps", mem_bw_gbps))
             if value is not None]
    if given:
        raise CliError(f"{given[0]} applies to --compute-time roofline only")
    return ComputeTiming()


def _compare(results_files: tuple[str, ...], out_dir: str | None, as_json: bool, debug: bool) -> None:
    from chakra_core.report.compare import compare_results, load_results, print_comparison

    if len(results_files) != 2:
        more = "; to compare more runs, make them one sweep (chakra-sim sweep) and read its sweep.csv"
        raise CliError(f"--results compares exactly two runs (A, then B); {len(results_files)} given"
                        + (more if len(results_files) > 2 else ""))
    console = out_console(stderr=as_json)
    with tool_errors(f"the comparison to {out_dir}", debug):
        first, second = (load_results(Path(path)) for path in results_files)
        diff = compare_results(first, second, *results_files)
        written = []
        if out_dir:
            from chakra_core.report.plots import COMPARE_PNG, compare_png

            written = write_outputs(Path(out_dir), {COMPARISON_JSON: report_json(diff), COMPARE_PNG: compare_png(diff)})
    _show(diff, print_comparison, written, console, as_json)
