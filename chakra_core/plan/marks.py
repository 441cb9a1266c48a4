"""Layouts a plan is asked to rank (`chakra-sim plan --mark`): a published layout, or one's own,
simulated in the first round whatever its bound, and where it stands among the simulated ones.

A mark is `job` (the layout the job manifest itself gives: its `parallel` and `training` keys,
JobSpec's defaults for what it leaves out) or `KEY=VALUE,...` over that layout, KEY one of
tp, pp, vp, cp, ep, etp, mb (micro-batch), recompute, dist_opt (true / false). DP follows from
the GPUs, as in every layout. Its rank counts the simulated layouts only; a layout left
unsimulated ("pruned") has a bound at least the --top-th best step, and those whose bound is
below the marked layout's step are counted apart: they might be faster, or not.
"""

from __future__ import annotations

from typing import Any, Mapping

import yaml
from pydantic import ValidationError

from chakra_core.errors import ManifestError
from chakra_core.jobs.sharding import strategy
from chakra_core.jobs.spec import JobSpec
from chakra_core.json_types import JsonObject
from chakra_core.plan.layouts import Layout
from chakra_core.plan.search import GIB, PRUNED, SIMULATED, Plan

KEYS = {"tp": ("parallel", "tp"), "pp": ("parallel", "pp"), "vp": ("parallel", "vp"), "cp": ("parallel", "cp"),
        "ep": ("parallel", "ep"), "etp": ("parallel", "etp"), "mb": ("training", "micro_batch"),
        "recompute": ("training", "recompute"), "dist_opt": ("training", "distributed_optimizer")}
"""A mark's keys -> the job manifest's section and key they set."""


def job_layout(spec: JobSpec) -> Layout:
    """The layout of a validated job, as the plan enumerates it (a dense model's without expert sizes)."""
    p, t = spec.parallel, spec.training
    moe = spec.shape.moe
    return Layout(p.tp, p.pp, spec.vp, p.cp, spec.dp, t.micro_batch, t.recompute, t.distributed_optimizer,
                  p.ep if moe else 1, p.expert_tp if moe else None, strategy(spec))


def parse_mark(text: str, job: Mapping[str, Any]) -> Layout:
    """The layout a --mark gives for the job manifest's `job:` mapping (ManifestError if the mark
    or the layout it gives is not valid)."""
    where = f"--mark {text}"
    sections: dict[str, dict[str, Any]] = {name: dict(job.get(name) or {}) for name in ("parallel", "training")}
    if text.strip() != "job":
        for item in text.split(","):
            key, sep, value = item.partition("=")
            if not sep or key.strip() not in KEYS:
                raise ManifestError([(where, f"expected `job` or KEY=VALUE,... with KEY one of {', '.join(KEYS)}, "
                                             f"not {item.strip()!r}")])
            section, name = KEYS[key.strip()]
            sections[section][name] = yaml.safe_load(value)
    try:
        spec = JobSpec.model_validate({**job, **sections})
    except ValidationError as exc:
        reason = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise ManifestError([(where, f"not a valid layout of the job: {reason}")]) from None
    return job_layout(spec)


def mark_rows(plan: Plan) -> list[JsonObject]:
    """Per marked layout: its status, rank among the simulated layouts, step and how far it is from #1."""
    ranked = plan.ranked()
    versus = plan.versus_best(ranked)
    simulated = [c for c in ranked if c.status == SIMULATED]
    rows: list[JsonObject] = []
    for layout in plan.marked:
        candidate = next((c for c in plan.candidates if c.layout == layout), None)
        if candidate is None:
            rows.append({"layout": layout.label(), "status": "not searched"})
            continue
        step = candidate.step_s
        slower, tie = versus(candidate)
        rank = next((i + 1 for i, c in enumerate(simulated) if c is candidate), None)
        # unsimulated layouts that might still beat it: their bound is below its step
        unknown = None if step is None else sum(c.status == PRUNED and c.bound_s < step for c in plan.candidates)
        rows.append({"layout": layout.label(), "status": candidate.status.value, "rank": rank,
                     "simulated": len(simulated), "step_s": step, "vs_best": slower, "tie": tie,
                     "pruned_below_its_step": unknown, "memory_gib": candidate.memory.total / GIB,
                     "memory_reserve_gib": candidate.reserve.total / GIB, "overflow": candidate.overflow,
                     "error": candidate.error})
    return rows


def describe(row: JsonObject) -> str:
    """One line of the terminal's summary for a mark_rows row."""
    head = f"marked {row['layout']}: "
    if row["status"] == "not searched":
        return head + ("not among the layouts searched (outside --micro-batches, --ep, --etp, --sharding or the "
                       "recomputation and optimizer choices)")
    if row["status"] == "does not fit":
        return head + f"does not fit: {row['overflow']}"
    if row["rank"] is None:
        return head + f"{row['status']}: {row['error'] or 'not simulated'}"
    slower = row["vs_best"]
    versus = "" if not isinstance(slower, float) or row["rank"] == 1 else \
        f" ({100 * slower:+.1f}% vs #1{', a tie' if row['tie'] else ''})"
    step = row["step_s"]
    unknown = row["pruned_below_its_step"]
    more = f"; {unknown:,} unsimulated layout(s) have a bound below its step" if isinstance(unknown, int) and unknown \
        else ""
    return (f"{head}#{row['rank']} of {row['simulated']} simulated, "
            f"{step if not isinstance(step, float) else f'{step:.3f}'} s{versus}, "
            f"{row['memory_gib']:.1f} + {row['memory_reserve_gib']:.1f} GiB{more}")
