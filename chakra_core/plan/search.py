"""The search of `chakra-sim plan`: every layout, cheap filters first, simulations only where they can win.

1. Every valid layout of the job (`layouts.enumerate_layouts`).
2. Its predicted peak memory per GPU (`memory.predict_memory`) and a reserve for the CUDA context,
   NCCL's buffers and fragmentation against the memory a program can use (`headroom.Headroom`): a
   layout that does not fit is kept in the table with what overflows and by how much.
3. A lower bound on its step time: the FLOPs of its busiest stage at the fastest rate any
   kernel reaches (`layouts.lower_bound_s`) for every layout, tightened for those that reach
   the front of the queue by timing their kernels with the manifest's own compute model
   (`compute_bound.ComputeBound`). Layouts that fit are simulated in order of their bound, in
   rounds of `batch` (`rounds`: a round's layouts start as soon as what earlier rounds can still
   give no longer decides them), all one sweep (`chakra_core.sweep`) of the job manifest with
   each layout's keys set: resumable, locked, on local processes or Ray.
4. A layout whose bound is not below the K-th best simulated step time cannot enter the top K:
   it and every layout after it are left unsimulated ("pruned").
5. Memory is checked (`check_memory`, when the manifest names a memory layer): the simulated layouts'
   traces list their tensors (`job.tensors`) and the memory layer follows them (the `hbm` plugin
   does): each has its simulated peak beside the prediction (`memory_check`: simulated / predicted - 1).

Which layouts get simulated depends on `batch`, never on the executor or the number of workers, and
the top K does not depend on either: a pruned layout's step time is at least its bound.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from pydantic import ValidationError

from chakra_core.config.manifest import validation_problems
from chakra_core.errors import ManifestError
from chakra_core.jobs.bands import ErrorBand
from chakra_core.json_types import JsonObject
from chakra_core.jobs.domains import job_gpus_per_node
from chakra_core.jobs.expand import job_profile
from chakra_core.jobs.optimizer_offload import host_optimizer
from chakra_core.jobs.routing import histogram_anchored
from chakra_core.jobs.spec import Cluster, JobSpec
from chakra_core.jobs.overflow import overflow as trace_overflow
from chakra_core.jobs.step import TrainingStep
from chakra_core.plan.compute_bound import ComputeBound
from chakra_core.plan.headroom import Headroom, Reserve, communicator_bytes
from chakra_core.plan.layouts import Enumeration, Layout, enumerate_layouts, lower_bound_s, sharding_searched
from chakra_core.plan.memory import MemoryEstimate, overflow, predict_memory
from chakra_core.plan.offload import add_offload_variants
from chakra_core.plan.rounds import Rounds, simulate_rounds
from chakra_core.plan.status import FAILED as FAILED, PRUNED as PRUNED, SIMULATED as SIMULATED  # the plan's names
from chakra_core.plan.status import TOO_BIG as TOO_BIG, LayoutStatus as LayoutStatus
from chakra_core.sweep.run import Execution

GIB = 1 << 30
SIMULATIONS = "simulations"
"""The sweep of simulated layouts, in the plan's folder: its points, table and plot."""


@dataclass(frozen=True)
class PlanOptions:
    """What the search looks for."""

    top: int = 10
    """The fastest layouts to find: simulation stops when no other can enter them."""
    batch: int = 4
    """Layouts simulated per round."""
    search: Mapping[str, Any] = field(default_factory=dict)
    """What varies (layouts.enumerate_layouts' options: micro_batches, recompute, ...)."""
    include: tuple[Layout, ...] = ()
    """Layouts simulated in the first round whatever their bound (to rank a given one)."""
    check_memory: bool = True
    """Simulate with the traces' tensors listed, for the manifest's memory layer to follow."""
    headroom_gib: float | None = None
    """The reserve of every layout beside its predicted peak (default: worked out per layout)."""
    progress: Callable[[str], None] | None = None
    """Told what the search is doing (a line each: the layouts found, each round, each simulation)."""
    source: str = "plan"
    """Names the job in messages."""


@dataclass
class Candidate:
    """One layout and what the plan found out about it."""

    layout: Layout
    memory: MemoryEstimate
    bound_s: float
    reserve: Reserve = field(default_factory=Reserve)
    """What the GPU holds beside the predicted peak (CUDA context, NCCL, fragmentation)."""
    status: LayoutStatus = PRUNED
    overflow: str | None = None
    training: TrainingStep | None = None      # its simulated step (results.json's `training`)
    simulated_memory: int | None = None       # the memory layer's peak bytes per GPU, when memory is checked
    error: str | None = None
    point: str | None = None                  # its sweep point's folder

    @property
    def step_s(self) -> float | None:
        return None if self.training is None else self.training.step_time_s

    @property
    def memory_check(self) -> float | None:
        """The memory layer's simulated peak over the predicted one, minus 1."""
        return None if self.simulated_memory is None else self.simulated_memory / self.memory.total - 1

    def row(self, rank: int | None, usable_bytes: int) -> JsonObject:
        """Its line of the plan's table (`usable_bytes`: the memory a program can use per GPU)."""
        step, lay = self.training, self.layout
        return {
            "rank": rank, "layout": lay.label(), "tp": lay.tp, "pp": lay.pp, "vp": lay.vp, "cp": lay.cp,
            "dp": lay.dp, **({"ep": lay.ep, "etp": lay.etp, "edp": lay.edp} if lay.moe else {}),
            "micro_batch": lay.micro_batch, "recompute": lay.recompute, **({"offload": lay.offload} if lay.offload else {}),
            **({"optimizer_offload": lay.optimizer_offload} if lay.optimizer_offload else {}),
            "distributed_optimizer": lay.distributed_optimizer,
            **({"sharding": lay.sharding} if lay.sharding is not None else {}), "status": self.status.value,
            "step_s": self.step_s, "bound_s": self.bound_s, "across_domains": None if step is None else step.across_domains,
            "tflops_per_gpu": None if step is None else step.tflops_per_gpu, "mfu": None if step is None else step.mfu,
            "memory_gib": self.memory.total / GIB, "memory_reserve_gib": self.reserve.total / GIB,
            "memory_usable_gib": usable_bytes / GIB, "memory_stage": self.memory.stage,
            "memory_simulated_gib": None if self.simulated_memory is None else self.simulated_memory / GIB,
            "memory_check": self.memory_check,
            **{f"memory_{name}_gib": value / GIB for name, value in self.memory.parts().items()},
            "exposed_comm_s": None if step is None else step.exposed_comm_s,
            "bubble_s": None if step is None else step.breakdown_s.get("bubble"),
            "overflow": self.overflow, "error": self.error, "point": self.point,
        }


@dataclass
class Plan:
    """What `plan` found: every layout, ranked (simulated ones by step time first)."""

    candidates: list[Candidate]
    enumeration: Enumeration
    headroom: Headroom
    """The memory a program can use per GPU, and how each layout's reserve is worked out."""
    profile: str
    simulated: int = 0
    reused: int = 0
    rounds: int = 0
    tightened: int = 0
    """Layouts whose compute-model bound was computed (the others kept the FLOP bound)."""
    memory_checked: bool = False
    warnings: list[str] = field(default_factory=list)
    marked: tuple[Layout, ...] = ()
    """Layouts the plan was asked to rank whatever their bound (PlanOptions.include; chakra_core.plan.marks)."""
    power_w: float | None = None
    """The GPU's maximum power (the profile's gpu.power_w; None: it gives none)."""

    def ranked(self) -> list[Candidate]:
        order = {SIMULATED: 0, FAILED: 1, PRUNED: 2, TOO_BIG: 3}
        return sorted(self.candidates, key=lambda c: (order[c.status], c.step_s if c.step_s is not None else math.inf,
                                                      c.bound_s, c.memory.total, c.layout))

    @property
    def usable_bytes(self) -> int:
        return self.headroom.usable

    def error_band(self) -> ErrorBand | None:
        """The model's error on published runs like this job (every layout's results carry the
        same: one GPU, precision and job size), None before a simulation or without one."""
        best = next((c for c in self.ranked() if c.status == SIMULATED), None)
        return None if best is None or best.training is None else best.training.error_band

    def no_fit(self) -> str | None:
        """Why no layout was simulated when none fits in memory (None when some fit)."""
        if any(c.status != TOO_BIG for c in self.candidates) or not self.candidates:
            return None
        smallest = min(self.candidates, key=lambda c: c.memory.total + c.reserve.total)
        return (f"no layout fits in memory: the smallest, {smallest.layout.label()}, needs "
                f"{(smallest.memory.total + smallest.reserve.total) / GIB:.1f} GiB per GPU with its reserve, "
                f"{self.usable_bytes / GIB:.1f} GiB usable (more GPUs, GPUs with more memory, or more "
                "micro-batch sizes and recomputation in the search)")

    def versus_best(self, ranked: list[Candidate]) -> Callable[[Candidate], tuple[float | None, bool | None]]:
        """For the layouts `ranked` (self.ranked()): how much slower than the best a simulated one is,
        and whether that is within the error band (a tie: the model cannot tell the two apart);
        (None, None) for a layout not simulated."""
        best = ranked[0].step_s if ranked and ranked[0].status == SIMULATED else None
        band = self.error_band()

        def versus(candidate: Candidate) -> tuple[float | None, bool | None]:
            step = candidate.step_s
            slower = None if best is None or step is None else step / best - 1
            return slower, None if slower is None or band is None else slower < band.geomean_error
        return versus

    def rows(self) -> list[JsonObject]:
        """Every layout's line of plan.csv, ranked, with `vs_best` and `tie` (versus_best)."""
        ranked = self.ranked()
        versus = self.versus_best(ranked)
        rows = []
        for i, candidate in enumerate(ranked):
            row = candidate.row(i + 1 if candidate.status == SIMULATED else None, self.usable_bytes)
            row["vs_best"], row["tie"] = versus(candidate)
            rows.append(row)
        return rows

    def counts(self) -> dict[str, int]:
        found = {status: 0 for status in LayoutStatus}
        for c in self.candidates:
            found[c.status] += 1
        return {"enumerated": len(self.candidates), "tried": self.enumeration.tried,
                "fit": len(self.candidates) - found[TOO_BIG], **{s.value: n for s, n in found.items()}}


def plan(manifest: Mapping[str, Any], base_dir: Path, out_dir: Path, options: PlanOptions = PlanOptions(),
         execution: Execution = Execution()) -> Plan:
    """Search the layouts of the job manifest `manifest` (its `job:` section's parallel and
    micro-batch / recomputation / optimizer settings are what varies) and simulate those that
    can still be among the `options.top` fastest, as sweeps run by `execution` (its `force`
    reruns the first round); their runs go to `out_dir`/simulations."""
    top, batch, include, source = options.top, options.batch, options.include, options.source
    job = manifest.get("job")
    if not isinstance(job, Mapping):
        raise ManifestError([(f"{source}: job", "required: plan searches the layouts of a training job "
                                                 "(docs/plan.md)")])
    if "cluster" not in job and isinstance(manifest.get("cluster"), Mapping):   # as a job manifest may say it
        job = {**job, "cluster": manifest["cluster"]}
        manifest = {**{k: v for k, v in manifest.items() if k != "cluster"}, "job": job}
    if (anchored := histogram_anchored(job, base_dir)) is not job:
        job = anchored
        manifest = {**manifest, "job": job}
    _check_job(job, source)
    cluster = Cluster.model_validate(job["cluster"])
    training = job.get("training")
    precision = training.get("precision", "bf16") if isinstance(training, Mapping) else "bf16"
    recipe = training.get("fp8_recipe") if isinstance(training, Mapping) else None
    profile = job_profile(cluster.profile, str(precision), base_dir, source, None if recipe is None else str(recipe))
    gpus_per_node = job_gpus_per_node(cluster, profile)
    search = dict(options.search)
    include, offload = sharding_searched(job, search, include), search.pop("offload", False)
    if not isinstance(training, Mapping) or training.get("attention", "flash") == "flash":
        # FlashAttention recomputes the scores anyway: selective recomputation is none's layout
        search.setdefault("recompute", ("none", "full"))
    try:
        enumeration = enumerate_layouts(job, gpus_per_node, **search)
    except ValueError as exc:
        raise ManifestError([(f"{source}: job", str(exc))]) from None
    if not enumeration.layouts:
        reasons = "; ".join(f"{why} ({count})" for why, count in sorted(enumeration.rejected.items()))
        raise ManifestError([(f"{source}: job", f"no valid layout among {enumeration.tried} tried: {reasons}")])
    from chakra_core.plugins import make_plugin_host

    host = make_plugin_host()
    # the profile as the job names it: a file's path, not the name it loads under
    tight = ComputeBound(manifest, base_dir, host, cluster.profile, gpus_per_node, cluster.gpus, profile.gpu.architecture,
                         host_optimizer(enumeration.specs[enumeration.layouts[0]], profile, source))
    headroom = Headroom.of(profile, options.headroom_gib,
                           communicator_bytes(manifest, base_dir, host, cluster.profile, gpus_per_node),
                           moe=enumeration.layouts[0].moe)
    candidates = []
    for index, layout in enumerate(enumeration.layouts):   # (--offload inserts variants as it goes)
        spec = enumeration.specs[layout]
        estimate = predict_memory(spec, profile.gpu.architecture)
        reserve = headroom.reserve(layout, estimate.total)
        candidate = Candidate(layout, estimate, lower_bound_s(spec, profile, tight.model), reserve)
        candidate.overflow = overflow(estimate, headroom.usable, reserve.total)
        if candidate.overflow is not None:
            candidate.status = TOO_BIG
            if offload:   # again with the fewest layers offloaded that make it fit, right after it
                add_offload_variants(enumeration, index, dict(job), headroom, profile)
        candidates.append(candidate)
    result = Plan(candidates, enumeration, headroom, profile.name, marked=include,
                  power_w=None if profile.gpu.power_w is None else profile.gpu.power_w.value)
    result.warnings.extend([*headroom.warnings, *(r.message() for r in profile.inherited("gpu.power_w"))])
    say = options.progress or (lambda line: None)
    fit = sum(c.status != TOO_BIG for c in candidates)
    say(f"{len(candidates):,} layouts, {fit:,} fit in {headroom.usable / GIB:.1f} GiB per GPU; "
        "timing their kernels for the step bound")
    if options.check_memory:
        manifest, why_not = memory_checked(manifest)
        result.memory_checked = why_not is None
        if why_not is not None:
            result.warnings.append(f"memory is not checked: {why_not}")
    # what the compute model warns of when built (e.g. rates its profile inherited), a run would too
    result.warnings.extend(w for w in tight.model.context.warnings if w not in result.warnings)
    queue = _Queue([c for c in candidates if c.status != TOO_BIG], lambda c: tight.bound_s(enumeration.specs[c.layout]))
    chosen = [c for c in candidates if c.layout in include and c.status != TOO_BIG]
    queue.remove(chosen)
    for c in chosen:   # their bounds as tight as the queue's would be
        c.bound_s = max(c.bound_s, tight.bound_s(enumeration.specs[c.layout]))
    rounds = Rounds(chosen, queue, top, batch, result, say)
    simulate_rounds(manifest, base_dir, out_dir / SIMULATIONS, rounds, result, execution)
    result.tightened = queue.tightened
    blind = [c for c in candidates if c.status == SIMULATED and c.simulated_memory is None]
    if result.memory_checked and blind:
        result.warnings.append(f"memory is not checked for {len(blind)} simulated layout(s): their memory layer "
                               "reported no peak_memory_bytes (it follows no tensors)")
    for c in candidates:
        if c.simulated_memory is not None and c.simulated_memory + c.reserve.total > headroom.usable:
            result.warnings.append(f"{c.layout.label()}: its simulated peak, {c.simulated_memory / GIB:.1f} GiB, and "
                                   f"its {c.reserve.total / GIB:.1f} GiB reserve exceed the GPU's "
                                   f"{headroom.usable / GIB:.1f} GiB usable (predicted {c.memory.total / GIB:.1f} GiB)")
    result.reused = sum(c.status in (SIMULATED, FAILED) for c in candidates) - result.simulated
    return result


class _Queue:
    """Layouts by bound: the cheap bound first; a layout's tight bound is computed when it reaches
    the front, and it goes back in its place; one at the front with its tight bound is next."""

    def __init__(self, candidates: list[Candidate], tighten: Callable[[Candidate], float]):
        self.heap = [(c.bound_s, False, i, c) for i, c in enumerate(candidates)]
        heapq.heapify(self.heap)
        self.tighten = tighten
        self.tightened = 0
        self.removed: set[int] = set()

    def remove(self, candidates: list[Candidate]) -> None:
        self.removed |= {id(c) for c in candidates}

    def exhausted(self) -> bool:
        """No layout is left in the queue."""
        return all(id(entry[3]) in self.removed for entry in self.heap)

    def pop(self, limit: float) -> Candidate | None:
        """The layout with the lowest bound, if that is below `limit` (None: no layout can be)."""
        while self.heap and self.heap[0][0] < limit:
            key, tight, index, candidate = heapq.heappop(self.heap)
            if id(candidate) in self.removed:
                continue
            if tight:
                return candidate
            candidate.bound_s = max(key, self.tighten(candidate))
            self.tightened += 1
            heapq.heappush(self.heap, (candidate.bound_s, True, index, candidate))
        return None


def memory_checked(manifest: Mapping[str, Any]) -> tuple[JsonObject, str | None]:
    """The job manifest whose traces list their tensors (`job.tensors`), for its memory layer to
    follow; or the manifest and why memory cannot be checked (it names no memory layer)."""
    if not isinstance(manifest.get("memory"), Mapping):
        return dict(manifest), ("the job manifest has no memory layer; add one that follows tensors "
                                "(memory: {plugin: hbm}) to set each simulated layout's peak beside the "
                                "prediction")
    return {**manifest, "job": {**manifest["job"], "tensors": True}}, None


def _check_job(job: Mapping[str, Any], source: str) -> None:
    """The job as written, its layout aside: a wrong type, an unknown key or model is an error
    naming the key; the layout's own divisibility is the search's business."""
    neutral = {**job, "parallel": {k: v for k, v in dict(job.get("parallel") or {}).items()
                                   if k not in ("tp", "pp", "vp", "cp", "ep", "etp")}}
    try:
        spec = JobSpec.model_validate(neutral)
    except ValidationError as exc:   # errors at the top (loc ()) are the layout's: the search decides
        problems = [problem for problem, error in zip(validation_problems(exc, ("job",), source, JobSpec), exc.errors())
                    if error["loc"]]
        if problems:
            raise ManifestError(problems) from None
        return
    too_large = trace_overflow(spec)   # no layout makes a layer fit a trace's 64-bit fields
    if too_large is not None:
        raise ManifestError([(f"{source}: {too_large[0]}", too_large[1])])
