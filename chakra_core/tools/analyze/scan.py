"""One trace file of a job, read in a single streaming pass (`scan_trace`).

A scan records:

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
- the collectives (for the imbalance check of `job`: their `comm_size`; for an all-to-all with
  pieces of its own, `comm_recv_splits`, the larger of what it sends and receives, so that the
  rank a skewed routing sends the most tokens to stands out) and the METADATA nodes defining
  process groups.
"""

from __future__ import annotations

from array import array
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Generator, cast

from chakra_core.errors import AttributeTypeError, TraceGraphError
from chakra_core.et.attrs import NodeView
from chakra_core.et.io import iter_trace
from chakra_core.limits import NODE_PARENTS
from chakra_core.feeder.base import (CPU_FLAG, cycle_error, find_cycle, missing_parent_problem, node_kind,
                                     parents_of, topological_positions, use_control_deps)
from chakra_core.et.duration import replay_time_ns
from chakra_core.schema import pb
from chakra_core.tools.analyze.report import ComputeTimingInfo
from chakra_core.comm.collectives import RECV_SPLITS
from chakra_core.comm.groups import WORLD

_NODE_TYPE_NAMES: dict[int, str] = {value: name for name, value in pb.NodeType.items()}
_COLLECTIVE_NAMES: dict[int, str] = {value: name for name, value in pb.CollectiveCommType.items()}


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
            assert self.peak_tflops is not None and self.mem_bw_gbps is not None   # checked in __post_init__
            seconds = max(node.int("num_ops") / (self.peak_tflops * 1e12),
                          node.int("tensor_size", 0) / (self.mem_bw_gbps * 1e9))
            return int(seconds * 1e9), True
        return replay_time_ns(node), False

    def describe(self) -> ComputeTimingInfo:
        return ComputeTimingInfo(self.mode, self.peak_tflops, self.mem_bw_gbps)


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
    node_counts: Counter[str] = field(default_factory=Counter)
    gpu_compute_ns: int = 0
    cpu_compute_ns: int = 0
    roofline_nodes: int = 0
    untimed_nodes: int = 0
    """Compute nodes timed by duration that carry none (generated traces leave it to a compute model)."""
    critical_path_ns: int = 0
    comm: dict[str, list[int]] = field(default_factory=dict)
    """kind (collective type name, SEND, RECV) -> [nodes, bytes]"""
    message_sizes: Counter[int] = field(default_factory=Counter)
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
        # an error mid-file closes the file at once (iter_trace's iterator is a generator)
        most_parents = NODE_PARENTS.value()
        with closing(cast("Generator[tuple[int, pb.Node], None, None]", nodes)):
            for offset, node in nodes:
                node_id = node.id
                if node_id in position:
                    raise TraceGraphError(f"{spath}: duplicate node id {node_id} (the second, "
                                          f"{node.name!r}, at byte {offset})")
                position[node_id] = len(ids)
                ids.append(node_id)
                plist = [p for p in parents_of(node, use_ctrl, spath, most_parents) if p != node_id]
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
        scan.untimed_nodes += not by_roofline and not node.duration_micros and not _has_duration_ns(node)
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
        received = view.raw(RECV_SPLITS) if comm_type == "ALL_TO_ALL" else None
        volume = max(size, sum(received)) if isinstance(received, list) else size
        scan.collectives.append(Collective(node.id, node.name, comm_type, volume,
                                           WORLD if group == "0" else group))
        _count_message(scan, comm_type, size)
    elif node_type == pb.COMM_SEND_NODE:
        _count_message(scan, "SEND", NodeView(node).int("comm_size", 0))
    elif node_type == pb.COMM_RECV_NODE:
        _count_message(scan, "RECV", NodeView(node).int("comm_size", 0))
    elif node_type == pb.METADATA_NODE and "pg_name" in node.inputs.values:
        scan.group_nodes.append(NodeView(node))
    return 0


def _has_duration_ns(node: pb.Node) -> bool:
    return any(attr.name == "duration_ns" for attr in node.attr)


def _count_message(scan: TraceScan, kind: str, size: int) -> None:
    counts = scan.comm.setdefault(kind, [0, 0])
    counts[0] += 1
    counts[1] += size
    scan.message_sizes[size_bucket(size)] += 1


def _critical_path(path: str, ids: array[int], weights: list[int], parents: list[tuple[int, ...]],
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
        assert warning is not None      # no error: only control parents are missing, which warns
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
