"""The results of a run as types: `Results` holds a `RankResult` per rank, a `LayerResult` per
layer and, for a generated training job, its `TrainingStep`.

Only the writers turn them into results.json (`Results.to_json`, whose key order is the file's);
readers of files other processes wrote (plan, sweeps, `analyze --results`) go through
`Results.from_json` / `RankResult.from_json`. What each key means: chakra_core.report.results.

Three things stay JSON by design, raw at the edge: a layer's own statistics (each plugin owns
their shape), the resolved manifest, and what observer plugins returned.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from chakra_core.contract.time_folding import TimeFoldResult
from chakra_core.engine.driver import BREAKDOWN
from chakra_core.jobs.step import TrainingStep
from chakra_core.json_types import JsonObject

SCHEMA_VERSION = 2
"""2: the exclusive time breakdown; layer statistics under the plugin's name."""

LayerStats = Mapping[str, Any]
"""A layer's own statistics (the plugin decides their keys; JSON values)."""


@dataclass(frozen=True)
class RankResult:
    """One rank: its finish time, where the time went, what it sent."""

    rank: int
    finish_ns: int
    breakdown: Mapping[str, int]
    """The exclusive time categories (engine.driver.BREAKDOWN, in that order); they sum to finish_ns."""
    compute_ns: int
    comm_ns: int
    bytes_sent: int
    bytes_received: int
    comm_bytes_by_type: Mapping[str, int]
    node_counts: Mapping[str, int]
    layer_stats: Mapping[str, LayerStats]
    """Each layer's per-rank statistics, by plugin name (LayerModel.rank_summary)."""

    @property
    def exposed_comm_ns(self) -> int:
        """Communication no computation hid: exposed network time and waiting for peers."""
        return self.breakdown["exposed_network_ns"] + self.breakdown["waiting_ns"]

    def for_rank(self, rank: int) -> RankResult:
        """The same figures for another rank (a folded run's class mate of this one)."""
        return replace(self, rank=rank)

    def to_json(self) -> JsonObject:
        row: JsonObject = {"rank": self.rank, "finish_ns": self.finish_ns, **self.breakdown,
                               "compute_ns": self.compute_ns, "exposed_comm_ns": self.exposed_comm_ns,
                               "comm_ns": self.comm_ns, "bytes_sent": self.bytes_sent,
                               "bytes_received": self.bytes_received,
                               "comm_bytes_by_type": dict(self.comm_bytes_by_type),
                               "node_counts": dict(self.node_counts)}
        row.update(self.layer_stats)
        return row

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> RankResult:
        """A rank's row of results.json; the keys before schema 2 a missing time category reads 0
        of (callers check the stable keys first: chakra_core.report.compare.load_results)."""
        core = {"rank", "finish_ns", *BREAKDOWN, "compute_ns", "exposed_comm_ns", "comm_ns", "bytes_sent",
                "bytes_received", "comm_bytes_by_type", "node_counts"}
        return cls(int(row["rank"]), int(row["finish_ns"]), {key: int(row.get(key, 0)) for key in BREAKDOWN},
                   int(row.get("compute_ns", 0)), int(row.get("comm_ns", 0)), int(row.get("bytes_sent", 0)),
                   int(row.get("bytes_received", 0)), dict(row.get("comm_bytes_by_type", {})),
                   dict(row.get("node_counts", {})),
                   {key: value for key, value in row.items() if key not in core and isinstance(value, Mapping)})


@dataclass(frozen=True)
class Highlight:
    """A table a layer wants shown in the terminal (LayerModel.terminal_tables)."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def to_json(self) -> JsonObject:
        return {"title": self.title, "columns": list(self.columns), "rows": [list(row) for row in self.rows]}


@dataclass(frozen=True)
class LayerResult:
    """One layer of the run: which plugin, how faithful, its run statistics."""

    layer: str
    plugin: str
    fidelity: str
    summary: LayerStats
    """LayerModel.summary(): the plugin's statistics of the whole run."""
    highlights: tuple[Highlight, ...] = ()
    peak_memory_bytes: int | None = None
    """A memory layer that follows tensors: the most bytes any rank held (MemoryModel.peak_memory_bytes).
    results.json carries it as the summary's `peak_memory_bytes`, which the core writes."""

    def to_json(self) -> JsonObject:
        entry: JsonObject = {"plugin": self.plugin, "fidelity": self.fidelity, "summary": dict(self.summary)}
        if self.highlights:
            entry["highlights"] = [block.to_json() for block in self.highlights]
        return entry

    @classmethod
    def from_json(cls, layer: str, entry: Mapping[str, Any]) -> LayerResult:
        summary = dict(entry.get("summary") or {})
        peak = summary.get("peak_memory_bytes") if layer == "memory" else None
        return cls(layer, str(entry["plugin"]), str(entry.get("fidelity", "")), summary,
                   tuple(Highlight(str(b["title"]), tuple(b["columns"]), tuple(tuple(r) for r in b["rows"]))
                         for b in entry.get("highlights", [])),
                   peak if isinstance(peak, int) else None)


@dataclass(frozen=True)
class FoldingResult:
    """Whether one rank stood for others (chakra_core.engine.folding), and which."""

    folded: bool
    simulated_ranks: int
    reason: str = ""
    """Unfolded: why every rank was simulated."""
    representatives: Mapping[str, int] | None = None
    """Folded: each representative rank and how many ranks its class holds."""
    time: TimeFoldResult | None = None
    """A generated job's folding in time (chakra_core.contract.time_folding): the periods left out
    and how long the step takes to repeat, or why every micro-batch was simulated; None when the
    traces had no periods."""

    def to_json(self) -> JsonObject:
        if not self.folded:
            document: JsonObject = {"folded": False, "simulated_ranks": self.simulated_ranks, "reason": self.reason}
        else:
            document = {"folded": True, "simulated_ranks": self.simulated_ranks,
                        "classes": len(self.representatives or {}), "representatives": dict(self.representatives or {})}
        if self.time is not None:
            document["time"] = self.time.to_json()
        return document


@dataclass(frozen=True)
class Results:
    """A finished run's results (what results.json holds)."""

    version: str
    """The chakra-sim release that simulated it."""
    events: int
    folding: FoldingResult
    ranks: tuple[RankResult, ...]
    """Every rank, in rank order (a folded run's class mates carry their representative's figures)."""
    layers: Mapping[str, LayerResult]
    warnings: tuple[str, ...]
    manifest: Mapping[str, Any]
    """The resolved configuration."""
    training: TrainingStep | None = None
    plugins: Mapping[str, Any] | None = None
    """What observer plugins returned (chakra_sim_simulation_end), by plugin name."""
    schema_version: int = SCHEMA_VERSION

    @property
    def finish_ns(self) -> int:
        """The slowest rank's finish."""
        return max((r.finish_ns for r in self.ranks), default=0)

    @property
    def num_ranks(self) -> int:
        return len(self.ranks)

    @property
    def peak_memory_bytes(self) -> int | None:
        """The memory layer's peak, when it follows tensors."""
        memory = self.layers.get("memory")
        return None if memory is None else memory.peak_memory_bytes

    def to_json(self) -> JsonObject:
        document: JsonObject = {
            "schema_version": self.schema_version, "chakra_sim_version": self.version,
            "finish_ns": self.finish_ns, "num_ranks": self.num_ranks, "events": self.events,
            "folding": self.folding.to_json(), "ranks": [rank.to_json() for rank in self.ranks],
            "layers": {name: layer.to_json() for name, layer in self.layers.items()},
            "warnings": list(self.warnings), "manifest": dict(self.manifest),
        }
        if self.training is not None:
            document["training"] = self.training.to_json()
        if self.plugins is not None:
            document["plugins"] = dict(self.plugins)
        return document

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Results:
        """A results.json document of this schema (KeyError or TypeError when it is not one)."""
        folding = data["folding"]
        training = data.get("training")
        return cls(
            version=str(data["chakra_sim_version"]), events=int(data["events"]),
            folding=FoldingResult(bool(folding["folded"]), int(folding["simulated_ranks"]),
                                  str(folding.get("reason", "")), folding.get("representatives"),
                                  None if folding.get("time") is None else TimeFoldResult.from_json(folding["time"])),
            ranks=tuple(RankResult.from_json(row) for row in data["ranks"]),
            layers={name: LayerResult.from_json(name, entry) for name, entry in data["layers"].items()},
            warnings=tuple(data.get("warnings", ())), manifest=data.get("manifest", {}),
            training=None if training is None else TrainingStep.from_json(training),
            plugins=data.get("plugins"), schema_version=int(data["schema_version"]),
        )
