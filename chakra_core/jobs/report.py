"""Where a training step's time went: the `training` section of a job's results.

Each rank's time is split exclusively (it sums to the rank's finish): compute by part of the
step (forward, backward, recompute, optimizer, other), communication exposed by communicator
role (tp, cp, dp, pp, other, and ep for a mixture of experts' token dispatch and combine: a collective or message in flight or waiting for peers while no
kernel runs), activation or optimizer offload's copies to and from host memory while no kernel runs
(`offload`, only when there are any), the host's optimizer steps while no kernel runs
(`host_optimizer`, only with optimizer offload) and the pipeline bubble (waiting for a pipeline neighbour's activations or
gradients, or nothing in flight at all). The step takes as long as its slowest rank; its
split is reported, and one per pipeline stage.
"""

from __future__ import annotations

from chakra_core.contract.layers import ComputeModel
from chakra_core.engine.simulation import FinishedRun, RankRecord
from chakra_core.errors import SimulationError
from chakra_core.jobs.bands import error_band, uncompared
from chakra_core.jobs.flops import DESCRIPTIONS, REPORTED
from chakra_core.jobs.imbalance import routing_cost
from chakra_core.jobs.step import TrainingStep

COMPUTE = ("forward", "backward", "recompute", "optimizer")
ROLES = ("tp", "cp", "dp", "pp", "other")


MOE_ROLES = ("tp", "cp", "ep", "dp", "pp", "other")
"""A mixture of experts' split adds the dispatcher's all-to-alls and expert-TP gathers (step_part ep)."""


def split(record: RankRecord, roles: tuple[str, ...] = ROLES) -> dict[str, int]:
    """A rank's finish time split into the categories of the module docstring (ns)."""
    out = {f"compute_{p}": 0 for p in (*COMPUTE, "other")}
    out.update({f"exposed_{r}": 0 for r in roles})
    out["bubble"] = record.breakdown["idle_ns"]
    parts = record.parts or {}
    for part, ns in parts.get("gpu_compute_ns", {}).items():
        out[f"compute_{part if part in COMPUTE else 'other'}"] += ns
    if record.breakdown["cpu_compute_ns"]:   # a job's CPU nodes are its offloaded optimizer steps
        out["host_optimizer"] = record.breakdown["cpu_compute_ns"]
    if record.breakdown["memory_ns"]:   # a job's memory nodes are its offloads' copies (jobs/offload.py,
        out["offload"] = record.breakdown["memory_ns"]   # jobs/optimizer_offload.py)
    for category in ("exposed_network_ns", "waiting_ns"):
        for part, ns in parts.get(category, {}).items():
            if category == "waiting_ns" and part == "pp":
                out["bubble"] += ns
            else:
                out[f"exposed_{part if part in roles else 'other'}"] += ns
    if sum(out.values()) != record.finish_ns:
        raise SimulationError(f"internal error: rank {record.rank}'s step parts {out} do not sum to its "
                              f"finish time {record.finish_ns} ns (please report this)")
    return out


def training_section(run: FinishedRun) -> TrainingStep:
    """The step of a generated job's finished run (its slowest rank), its rates and split."""
    info = run.spec.training
    assert info is not None   # run.py asks for the section of a generated job only
    job = info.job
    slowest = max(run.ranks, key=lambda r: (r.finish_ns, -r.rank))
    step_s = slowest.finish_ns / 1e9
    gpus = info.gpus
    by_formula = info.model_flops
    flops = by_formula[REPORTED]
    achieved = flops / step_s / gpus / 1e12 if step_s else 0.0
    peak = info.peak_tflops
    precision = job.training.precision
    compute = run.layers.get("compute")
    ceiling = compute.rate_ceiling_flops() if isinstance(compute, ComputeModel) else None
    if ceiling is not None and achieved * 1e12 > ceiling * (1 + 1e-9):
        raise SimulationError(f"internal error: the step achieves {achieved:.1f} model TFLOP/s per GPU, above "
                              f"{ceiling / 1e12:.1f}, the fastest rate the compute layer runs any kernel at "
                              "(please report this)")
    band = error_band(info.gpu_model, info.architecture, precision, gpus, moe=job.shape.moe,
                      not_covered=uncompared(job))
    # each stage's first rank (tp, cp and dp index 0): the representative of a folded run
    pp = job.parallel.pp
    records = {record.rank: record for record in run.ranks}
    roles = MOE_ROLES if job.shape.moe else ROLES
    stages = {str(stage): _seconds(split(records[stage * (gpus // pp)], roles)) for stage in range(pp)}
    return TrainingStep(
        model=info.model, gpus=gpus, profile=info.profile,
        layout={**job.parallel.model_dump(mode="json"), "dp": info.dp, "micro_batch": job.training.micro_batch,
                "global_batch": job.training.global_batch, "microbatches": info.microbatches},
        step_time_s=step_s,
        tokens_per_s_per_gpu=info.tokens_per_step / step_s / gpus if step_s else 0.0,
        model_tflops_per_step=flops / 1e12,
        tflops_per_gpu=achieved,
        mfu=achieved / peak if peak else 0.0,
        flops_formula=(f"{DESCRIPTIONS[REPORTED]}; MFU against the GPU's dense {precision} peak of "
                       f"{peak:g} TFLOP/s (chakra_core.jobs.flops)"),
        rate_ceiling_tflops=None if ceiling is None else ceiling / 1e12,
        tflops_per_gpu_by_formula={name: value / step_s / gpus / 1e12 if step_s else 0.0
                                   for name, value in by_formula.items()},
        error_band=band,
        breakdown_s=_seconds(split(slowest, roles)),
        breakdown_rank=slowest.rank,
        breakdown_by_stage_s=stages,
        placement=info.placement,
        routing=routing_cost(job, info.gpus_per_node, info.architecture, slowest.rank,
                             compute if isinstance(compute, ComputeModel) else None),
    )


def _seconds(parts: dict[str, int]) -> dict[str, float]:
    return {name: ns / 1e9 for name, ns in parts.items()}
