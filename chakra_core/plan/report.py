"""What `chakra-sim plan` writes: the ranked table (CSV, Parquet, JSON) and two plots.

- `plan.csv`, `plan.parquet`: one row per layout, simulated ones ranked by step time first, then
  those left unsimulated (failed, pruned by their bound, too big for the GPU's memory); a mixture
  of experts' plan adds the ep, etp and edp columns;
- `plan.json`: the counts, the GPU memory, the usable memory and the reserve rule, the rows, the
  search's settings and, with --mark, where each marked layout stands (`marked`);
- `pareto.png`: step time against predicted peak memory per GPU of the simulated layouts, the
  Pareto front (no other layout both faster and smaller) drawn through them;
- `breakdown.png`: the step of the top layouts side by side, split as `results.json`'s
  `training.breakdown_s` splits it (compute, exposed communication per parallelism, bubble).
"""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING

from chakra_core.json_types import JsonObject
from chakra_core.plan.marks import mark_rows
from chakra_core.plan.search import GIB, SIMULATED, Candidate, Plan
from chakra_core.sweep.table import table_csv, table_parquet

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLUMNS = ["rank", "layout", "tp", "pp", "vp", "cp", "dp", "micro_batch", "recompute", "distributed_optimizer",
           "status", "step_s", "vs_best", "tie", "bound_s", "across_domains", "tflops_per_gpu", "mfu", "memory_gib", "memory_reserve_gib",
           "memory_usable_gib", "memory_simulated_gib", "memory_check", "memory_stage",
           "memory_weights_gib", "memory_gradients_gib", "memory_optimizer_gib", "memory_activations_gib",
           "memory_buffers_gib", "exposed_comm_s", "bubble_s", "overflow", "error", "point"]
EXPERT_COLUMNS = ["ep", "etp", "edp"]
"""A mixture of experts' plan's columns after dp: expert parallel, expert tensor and expert data parallel sizes."""
KINDS = {"rank": "int", "layout": "str", "tp": "int", "pp": "int", "vp": "int", "cp": "int", "dp": "int",
         **{c: "int" for c in EXPERT_COLUMNS},
         "micro_batch": "int", "recompute": "str", "offload": "int", "optimizer_offload": "float", "distributed_optimizer": "bool", "sharding": "str",
         "status": "str", "across_domains": "str",
         "step_s": "float", "vs_best": "float", "tie": "bool", "bound_s": "float", "tflops_per_gpu": "float", "mfu": "float", "memory_gib": "float",
         "memory_stage": "int", "memory_check": "float", "exposed_comm_s": "float", "bubble_s": "float", "overflow": "str", "error": "str",
         "point": "str", **{c: "float" for c in COLUMNS if c.startswith("memory_") and c.endswith("_gib")}}
BREAKDOWN_SHOWN = 8
"""Layouts drawn side by side in breakdown.png."""


def plan_files(plan: Plan, settings: JsonObject) -> dict[str, str | bytes]:
    """File name -> content of everything the plan writes (see the module docstring)."""
    rows = plan.rows()
    moe = any(c.layout.moe for c in plan.candidates)
    columns = COLUMNS if not moe else COLUMNS[:COLUMNS.index("dp") + 1] + EXPERT_COLUMNS + COLUMNS[COLUMNS.index("dp") + 1:]
    if any(c.layout.sharding is not None for c in plan.candidates):   # a plan that searched Megatron-FSDP
        after = columns.index("distributed_optimizer") + 1
        columns = columns[:after] + ["sharding"] + columns[after:]
    for key in ("optimizer_offload", "offload"):   # plan --offload found layouts that fit with it
        if any(getattr(c.layout, key) for c in plan.candidates):
            after = columns.index("recompute") + 1
            columns = columns[:after] + [key] + columns[after:]
    marked = {"marked": mark_rows(plan)} if plan.marked else {}
    files: dict[str, str | bytes] = {
        "plan.csv": table_csv(columns, rows, KINDS),
        "plan.parquet": table_parquet(columns, rows, KINDS),
        "plan.json": json.dumps({"counts": plan.counts(), **plan.headroom.summary(), "error_band": _band_json(plan),
                                 "profile": plan.profile, "rejected": plan.enumeration.rejected,
                                 "settings": settings, **marked, "rows": rows}, indent=1, allow_nan=False) + "\n"}
    simulated = [c for c in plan.ranked() if c.status == SIMULATED]
    if simulated:
        files["pareto.png"] = _png(pareto_figure(simulated, plan.usable_bytes))
        files["breakdown.png"] = _png(breakdown_figure(simulated[:BREAKDOWN_SHOWN]))
    return files


def pareto_front(candidates: list[Candidate]) -> list[Candidate]:
    """The simulated layouts no other one beats on both step time and memory, by memory."""
    front: list[Candidate] = []
    for c in sorted(candidates, key=lambda c: (c.memory.total, c.step_s)):
        if not front or (c.step_s or 0.0) < (front[-1].step_s or 0.0):
            front.append(c)
    return front


def pareto_figure(candidates: list[Candidate], usable_bytes: int) -> Figure:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10.5, 4.8), dpi=110, layout="constrained")
    axes, side = figure.subplots(1, 2, width_ratios=[3, 1])
    axes.scatter([c.memory.total / GIB for c in candidates], [c.step_s or 0.0 for c in candidates], s=18,
                 color="tab:blue", alpha=0.6, label="simulated layouts")
    front = pareto_front(candidates)
    axes.plot([c.memory.total / GIB for c in front], [c.step_s or 0.0 for c in front], "-o", color="tab:red",
              markersize=5, label="Pareto front")
    # Numbers on the points, the layouts listed beside the axes: labels on close points would overlap.
    shown = front[:12]
    for number, c in enumerate(shown, start=1):
        axes.annotate(str(number), (c.memory.total / GIB, c.step_s or 0.0), fontsize=7, color="tab:red",
                      xytext=(3, 3), textcoords="offset points")
    axes.axvline(usable_bytes / GIB, color="gray", linestyle="--", label="usable GPU memory (before the reserve)")
    axes.set_xlabel("predicted peak memory per GPU (GiB)")
    axes.set_ylabel("simulated step time (s)")
    axes.set_title("step time vs memory of the simulated layouts")
    axes.legend(fontsize=8, loc="upper right")
    axes.grid(alpha=0.3)
    listing = "\n".join(f"{number}  {c.layout.label()}" for number, c in enumerate(shown, start=1))
    more = f"\n... {len(front) - len(shown)} more" if len(front) > len(shown) else ""
    side.axis("off")
    side.text(0.0, 1.0, "the Pareto front\n\n" + listing + more, fontsize=7, family="monospace", va="top",
              ha="left", transform=side.transAxes)
    return figure


def breakdown_figure(candidates: list[Candidate]) -> Figure:
    from matplotlib.figure import Figure

    steps = [c.training for c in candidates if c.training is not None]
    parts = list(dict.fromkeys(part for step in steps for part in step.breakdown_s))
    parts = [p for p in parts if any(step.breakdown_s.get(p, 0.0) > 0 for step in steps)]
    figure = Figure(figsize=(8, 0.5 * len(candidates) + 1.8), dpi=110)
    axes = figure.add_subplot()
    colours = [f"C{i % 10}" for i in range(len(parts))]
    hatches = ["", "//", "..", "xx"]
    labels = [f"#{i + 1} {c.layout.label()}" for i, c in enumerate(candidates)]
    left = [0.0] * len(candidates)
    for index, part in enumerate(parts):
        widths = [0.0 if c.training is None else c.training.breakdown_s.get(part, 0.0) for c in candidates]
        axes.barh(labels, widths, left=left, color=colours[index], hatch=hatches[index // 10 % len(hatches)],
                  label=part.replace("_", " "), edgecolor="white", linewidth=0.4)
        left = [a + b for a, b in zip(left, widths)]
    axes.invert_yaxis()
    axes.set_xlabel("the step by part (s)")
    axes.set_title("where the step goes, fastest layouts first")
    axes.tick_params(axis="y", labelsize=7)
    axes.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    figure.tight_layout()
    return figure


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def _band_json(plan: Plan) -> JsonObject | None:
    band = plan.error_band()
    return None if band is None else band.to_json()
