"""The analysis of a job's traces as types (`JobAnalysis`), what `analyze_traces` returns and the
tables and plots read; `JobAnalysis.to_json` is analysis.json (its key order the file's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

Json = dict[str, object]
"""A JSON object as analysis.json writes it (output only: nothing reads it back)."""


@dataclass(frozen=True)
class CommVolume:
    """Nodes of one communication kind and the bytes their comm_size says."""

    count: int
    bytes: int


@dataclass(frozen=True)
class SizeBucket:
    """Messages of a size from `from_bytes` (0, or a power of two) to under twice it."""

    from_bytes: int
    count: int


@dataclass(frozen=True)
class TraceVolume:
    """Nodes and communication of one rank's trace, or of all ranks together."""

    node_counts: Mapping[str, int]
    """By node type (COMP_NODE:GPU, COMM_COLL_NODE, ...)."""
    compute_ns: int
    comm_by_type: Mapping[str, CommVolume]
    """By collective type, SEND and RECV (COMM_KINDS order)."""
    message_sizes: tuple[SizeBucket, ...]

    @property
    def nodes(self) -> int:
        return sum(self.node_counts.values())

    @property
    def comm_count(self) -> int:
        return sum(entry.count for entry in self.comm_by_type.values())

    @property
    def comm_bytes(self) -> int:
        return sum(entry.bytes for entry in self.comm_by_type.values())

    def _volume_json(self) -> Json:
        return {"comm_count": self.comm_count, "comm_bytes": self.comm_bytes,
                "comm_by_type": {kind: {"count": e.count, "bytes": e.bytes} for kind, e in self.comm_by_type.items()},
                "message_sizes": [{"from_bytes": b.from_bytes, "count": b.count} for b in self.message_sizes]}

    def to_json(self) -> Json:
        return {"nodes": self.nodes, "node_counts": dict(self.node_counts), "compute_ns": self.compute_ns,
                **self._volume_json()}


@dataclass(frozen=True)
class RankAnalysis(TraceVolume):
    """One rank's trace file."""

    rank: int = 0
    file: str = ""
    same_as_rank: int | None = None
    """The first rank whose file has the same bytes (read once), when not this one."""
    gpu_compute_ns: int = 0
    cpu_compute_ns: int = 0
    roofline_nodes: int = 0
    """Compute nodes the roofline timed (the others at their traced duration)."""
    critical_path_ns: int = 0

    @property
    def parallelism(self) -> float | None:
        """Compute time over the critical path (None when the path is empty)."""
        return self.compute_ns / self.critical_path_ns if self.critical_path_ns else None

    def to_json(self) -> Json:
        return {"rank": self.rank, "file": self.file, "same_as_rank": self.same_as_rank, "nodes": self.nodes,
                "node_counts": dict(self.node_counts), "compute_ns": self.compute_ns,
                "gpu_compute_ns": self.gpu_compute_ns, "cpu_compute_ns": self.cpu_compute_ns,
                "roofline_nodes": self.roofline_nodes, "critical_path_ns": self.critical_path_ns,
                "parallelism": self.parallelism, **self._volume_json()}


@dataclass(frozen=True)
class GroupSummary:
    """A communicator group: who is in it, what defines it, what it carries."""

    name: str
    label: str
    members: tuple[int, ...]
    source: str
    collectives_min: int
    """The fewest collectives a member issues in it (fewer than the most: a run would hang)."""
    collectives_max: int
    bytes: int

    def to_json(self) -> Json:
        return {"name": self.name, "label": self.label, "members": list(self.members), "source": self.source,
                "collectives_min": self.collectives_min, "collectives_max": self.collectives_max,
                "bytes": self.bytes}


@dataclass(frozen=True)
class KthCollective:
    """The k-th collective of a group (from 1) over the ranks that issue it."""

    group: str
    index: int
    comm_type: str
    """The type, or the types the ranks disagree on joined by '/'."""
    ranks: int
    min_bytes: int
    max_bytes: int
    mean_bytes: float
    ratio: float | None
    """max / min; None: infinite (a min of 0 under a max above 0)."""
    min_rank: int
    min_node: int
    max_rank: int
    max_node: int
    type_mismatch: bool
    flagged: bool

    def to_json(self, with_group: bool = False) -> Json:
        entry: Json = {"group": self.group} if with_group else {}
        entry.update({"index": self.index, "comm_type": self.comm_type, "ranks": self.ranks,
                      "min_bytes": self.min_bytes, "max_bytes": self.max_bytes, "mean_bytes": self.mean_bytes,
                      "ratio": self.ratio, "min_rank": self.min_rank, "min_node": self.min_node,
                      "max_rank": self.max_rank, "max_node": self.max_node, "type_mismatch": self.type_mismatch,
                      "flagged": self.flagged})
        return entry


@dataclass(frozen=True)
class ShortRank:
    """A rank issuing fewer collectives in a group than another member: a run would wait for it."""

    group: str
    rank: int
    issued: int
    expected: int

    def to_json(self) -> Json:
        return {"group": self.group, "rank": self.rank, "issued": self.issued, "expected": self.expected}


@dataclass(frozen=True)
class GroupImbalance:
    group: str
    members: int
    collectives: tuple[KthCollective, ...]


@dataclass(frozen=True)
class Imbalance:
    """Collective sizes compared across each group's ranks (chakra_core.tools.analyze.job)."""

    threshold: float
    groups: tuple[GroupImbalance, ...]
    short_ranks: tuple[ShortRank, ...]

    @property
    def flagged(self) -> list[KthCollective]:
        return [entry for group in self.groups for entry in group.collectives if entry.flagged]

    def to_json(self) -> Json:
        return {"threshold": self.threshold, "flagged": [entry.to_json(with_group=True) for entry in self.flagged],
                "short_ranks": [entry.to_json() for entry in self.short_ranks],
                "groups": [{"group": g.group, "members": g.members, "collectives": [e.to_json() for e in g.collectives]}
                           for g in self.groups]}


@dataclass(frozen=True)
class ComputeTimingInfo:
    """How compute nodes were timed: 'duration' (traced) or 'roofline' at these rates."""

    mode: str
    peak_tflops: float | None = None
    mem_bw_gbps: float | None = None

    def to_json(self) -> Json:
        if self.mode == "duration":
            return {"mode": "duration"}
        return {"mode": self.mode, "peak_tflops": self.peak_tflops, "mem_bw_gbps": self.mem_bw_gbps}


@dataclass(frozen=True)
class JobAnalysis:
    """What a job's traces ask of the machine, found without simulating."""

    prefix: str
    distinct_traces: int
    compute_time: ComputeTimingInfo
    dependencies: str
    ranks: tuple[RankAnalysis, ...]
    totals: TraceVolume
    groups: tuple[GroupSummary, ...]
    imbalance: Imbalance
    warnings: tuple[str, ...]

    @property
    def num_ranks(self) -> int:
        return len(self.ranks)

    def to_json(self) -> Json:
        return {"prefix": self.prefix, "num_ranks": self.num_ranks, "distinct_traces": self.distinct_traces,
                "compute_time": self.compute_time.to_json(), "dependencies": self.dependencies,
                "ranks": [rank.to_json() for rank in self.ranks], "totals": self.totals.to_json(),
                "groups": [group.to_json() for group in self.groups], "imbalance": self.imbalance.to_json(),
                "warnings": list(self.warnings)}
