"""A training step as the results report it (the `training` section of results.json): its time,
rates, where the time went, and where each communicator group landed.

`TrainingStep.to_json` writes the section, `TrainingStep.from_json` reads one back (plan and
sweeps read results.json files other processes wrote); the field order is the section's key order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from chakra_core.jobs.bands import ErrorBand
from chakra_core.json_types import JsonObject

LayoutValue = int | bool | str | None
"""A layout setting's value (tp, pp, ..., sequence_parallel, schedule names)."""


@dataclass(frozen=True)
class PlacedGroup:
    """Where the groups of one communicator role land (every group of a role has the same shape)."""

    group: str
    """The role: tp, cp, dp, pp, ..."""
    ranks: int
    """GPUs in one group."""
    nodes: int
    """Nodes one group spans."""
    gpus_per_node: int
    """The most GPUs of one group on one node."""
    fabric: str
    """'NVLink' when a group sits on one node, else 'network'."""

    def to_json(self) -> JsonObject:
        return {"group": self.group, "ranks": self.ranks, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "fabric": self.fabric}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> PlacedGroup:
        return cls(str(row["group"]), int(row["ranks"]), int(row["nodes"]), int(row["gpus_per_node"]),
                   str(row["fabric"]))


@dataclass(frozen=True)
class RoutingCost:
    """What skewed routing costs (chakra_core.jobs.imbalance): absent for balanced routing."""

    routing: str
    """The setting, in words (zipf s=1.2, histogram from FILE)."""
    hottest_ep_rank: int
    """The EP rank whose experts receive the most tokens (every EP rank runs at its pace)."""
    expert_tokens: tuple[int, ...]
    """Tokens each of its local experts computes per MoE layer and micro-batch."""
    balanced_tokens: int
    """What each local expert computes with balanced routing."""
    imbalance: float
    """The hottest rank's expert tokens over the balanced count."""
    dropped: float
    """Share of the routed token copies a capacity factor drops (0: dropless)."""
    expert_gemm_s: float | None
    """The step's expert GEMMs on the reported rank, each timed alone by the compute layer (None:
    not a compute model)."""
    expert_gemm_balanced_s: float | None
    """The same GEMMs with balanced routing."""

    def to_json(self) -> JsonObject:
        return {"routing": self.routing, "hottest_ep_rank": self.hottest_ep_rank,
                "expert_tokens": list(self.expert_tokens), "balanced_tokens": self.balanced_tokens,
                "imbalance": self.imbalance, "dropped": self.dropped, "expert_gemm_s": self.expert_gemm_s,
                "expert_gemm_balanced_s": self.expert_gemm_balanced_s}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RoutingCost:
        def seconds(key: str) -> float | None:
            return None if data[key] is None else float(data[key])
        return cls(str(data["routing"]), int(data["hottest_ep_rank"]), tuple(int(t) for t in data["expert_tokens"]),
                   int(data["balanced_tokens"]), float(data["imbalance"]), float(data["dropped"]),
                   seconds("expert_gemm_s"), seconds("expert_gemm_balanced_s"))


@dataclass(frozen=True)
class TrainingStep:
    """One step of a generated training job: the slowest rank sets its time (chakra_core.jobs.report)."""

    model: str
    gpus: int
    profile: str
    layout: Mapping[str, LayoutValue]
    """The parallel settings as the job gives them, with dp, micro_batch, global_batch, microbatches."""
    step_time_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_step: float
    tflops_per_gpu: float
    """Model FLOP/s per GPU (the reported formula, chakra_core.jobs.flops.REPORTED)."""
    mfu: float
    """tflops_per_gpu over the GPU's dense peak at the job's precision."""
    flops_formula: str
    rate_ceiling_tflops: float | None
    """The fastest rate the compute layer runs any kernel at (None: it does not say)."""
    tflops_per_gpu_by_formula: Mapping[str, float]
    error_band: ErrorBand | None
    """The model's error on published runs like this one (None: none compared)."""
    breakdown_s: Mapping[str, float]
    """The slowest rank's step, split exclusively (chakra_core.jobs.report.split); sums to the step."""
    breakdown_rank: int
    breakdown_by_stage_s: Mapping[str, Mapping[str, float]]
    """The same split for each pipeline stage's first rank, by stage number."""
    placement: tuple[PlacedGroup, ...]
    routing: RoutingCost | None = None
    """Skewed routing's cost (None, and no key, for balanced routing and dense models)."""

    @property
    def across_domains(self) -> str:
        """The communicator roles whose groups span NVLink domains (nodes), and so the network:
        "dp pp", say; empty when every group sits in one domain."""
        return " ".join(group.group for group in self.placement if group.nodes > 1)

    @property
    def exposed_comm_s(self) -> float:
        """Communication no kernel hid, every role's."""
        return sum(seconds for part, seconds in self.breakdown_s.items() if part.startswith("exposed_"))

    def to_json(self) -> JsonObject:
        return {
            "model": self.model, "gpus": self.gpus, "profile": self.profile, "layout": dict(self.layout),
            "step_time_s": self.step_time_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "model_tflops_per_step": self.model_tflops_per_step, "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu, "flops_formula": self.flops_formula, "rate_ceiling_tflops": self.rate_ceiling_tflops,
            "tflops_per_gpu_by_formula": dict(self.tflops_per_gpu_by_formula),
            "error_band": None if self.error_band is None else self.error_band.to_json(),
            "breakdown_s": dict(self.breakdown_s), "breakdown_rank": self.breakdown_rank,
            "breakdown_by_stage_s": {stage: dict(parts) for stage, parts in self.breakdown_by_stage_s.items()},
            "placement": [group.to_json() for group in self.placement],
            **({} if self.routing is None else {"routing": self.routing.to_json()}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainingStep:
        """The section as results.json holds it (KeyError or TypeError when it is not one)."""
        band = data["error_band"]
        return cls(
            model=str(data["model"]), gpus=int(data["gpus"]), profile=str(data["profile"]),
            layout=dict(data["layout"]), step_time_s=float(data["step_time_s"]),
            tokens_per_s_per_gpu=float(data["tokens_per_s_per_gpu"]),
            model_tflops_per_step=float(data["model_tflops_per_step"]),
            tflops_per_gpu=float(data["tflops_per_gpu"]), mfu=float(data["mfu"]),
            flops_formula=str(data["flops_formula"]),
            rate_ceiling_tflops=None if data["rate_ceiling_tflops"] is None else float(data["rate_ceiling_tflops"]),
            tflops_per_gpu_by_formula={str(k): float(v) for k, v in data["tflops_per_gpu_by_formula"].items()},
            error_band=None if band is None else ErrorBand(str(band["scope"]), int(band["runs"]),
                                                           float(band["geomean_error"]),
                                                           float(band["mean_signed_error"]),
                                                           float(band["worst_error"]),
                                                           tuple(str(s) for s in band.get("not_covered", ()))),
            breakdown_s={str(k): float(v) for k, v in data["breakdown_s"].items()},
            breakdown_rank=int(data["breakdown_rank"]),
            breakdown_by_stage_s={str(stage): {str(k): float(v) for k, v in parts.items()}
                                  for stage, parts in data["breakdown_by_stage_s"].items()},
            placement=tuple(PlacedGroup.from_json(row) for row in data["placement"]),
            routing=RoutingCost.from_json(data["routing"]) if data.get("routing") is not None else None,
        )
