"""The planner against published layouts: is its best layout at least as fast as the one the
source ran, does the source's layout fit in the predicted memory, and where does it rank?

    python benchmarks/plan_published.py              # the runs in RUNS below
    python benchmarks/plan_published.py --only sc21  # runs whose id contains "sc21"

Each run of benchmarks/data/training-runs.yaml named in RUNS is described as
benchmarks/training_accuracy.py describes it (model, GPUs, global batch, sequence, precision and
the settings its configuration notes give) and planned with `chakra_core.plan.search.plan`: every
valid layout, predicted memory against the GPU's, simulations in order of the bound until the
top `--top` are certain. The published layout is simulated too (`include`), so its step time and
rank among the simulated layouts are known. Spec-only, as every prediction: nothing is fitted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))   # training_accuracy imports its helpers by name

from benchmarks._plan_timing import plan_manifest, timed_plan  # noqa: E402
from benchmarks.training_accuracy import RUNS as RUNS_FILE, job_of  # noqa: E402
from chakra_core.jobs.spec import JobSpec  # noqa: E402
from chakra_core.plan.layouts import Layout  # noqa: E402
from chakra_core.plan.marks import job_layout  # noqa: E402
from chakra_core.plan.search import GIB, SIMULATED, TOO_BIG, PlanOptions  # noqa: E402

RUNS = ("nemo-24.07-llama2-7b-h100-8-fp8", "nemo-24.07-llama3-8b-h100-8-fp8", "nemo-24.07-llama2-13b-h100-16-fp8",
        "nemo-24.03-llama2-7b-seq16k-h100-16-fp8", "sc21-gpt-1.7b-a100-32", "sc21-gpt-3.6b-a100-64",
        "sc21-gpt-7.5b-a100-128")
"""Runs small enough to plan in minutes on 2 cores; the SC'21 ones are its Table 1's first rows."""


def published(job: dict[str, Any]) -> Layout:
    """The run's own layout, as the plan enumerates it (a mixture of experts' with its ep and etp)."""
    return job_layout(JobSpec.model_validate(job))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="only runs whose id contains this")
    parser.add_argument("--top", type=int, default=3, help="layouts the plan must be sure of")
    args = parser.parse_args()
    runs = {run["id"]: run for run in yaml.safe_load(RUNS_FILE.read_text())["runs"]}
    print("| run | published layout | its memory + reserve GiB (usable) | simulated GiB | fits | its step s | its rank "
          "| best layout | best step s | best / published | layouts valid / fit / simulated | largest memory gap "
          "| plan wall s |")
    print("|---|---|---:|---:|---|---:|---:|---|---:|---:|---|---:|---:|")
    for run_id in RUNS:
        if args.only not in run_id:
            continue
        job = job_of(runs[run_id])
        layout = published(job)
        # the published micro-batch searched too (SC'21's 16 is above the command's default 8)
        search = {"micro_batches": sorted({1, 2, 4, 8, layout.micro_batch})}
        found, wall = timed_plan(plan_manifest(job), PlanOptions(top=args.top, include=(layout,), search=search),
                                 2, run_id)
        ranked = [c for c in found.ranked() if c.status == SIMULATED]
        mine = next(c for c in found.candidates if c.layout == layout)
        rank = next((i + 1 for i, c in enumerate(ranked) if c.layout == layout), None)
        best = ranked[0]
        counts = found.counts()
        mine_step = f"{mine.step_s:.3f}" if mine.step_s is not None else "-"
        ratio = f"{best.step_s / mine.step_s:.3f}" if mine.step_s and best.step_s else "-"
        simulated = "-" if mine.simulated_memory is None else f"{mine.simulated_memory / GIB:.1f}"
        gaps = [abs(c.memory_check) for c in found.candidates if c.memory_check is not None]
        gap = f"{100 * max(gaps):.3f}%" if gaps else "-"
        print(f"| {run_id} | {layout.label()} | {mine.memory.total / GIB:.1f} + {mine.reserve.total / GIB:.1f} "
              f"({found.usable_bytes / GIB:.1f}) | "
              f"{simulated} | {'no: ' + str(mine.overflow) if mine.status == TOO_BIG else 'yes'} | {mine_step} | "
              f"{rank if rank is not None else '-'} of {len(ranked)} | {best.layout.label()} | {best.step_s:.3f} | "
              f"{ratio} | {counts['enumerated']:,} / {counts['fit']:,} / {counts['simulated'] + counts['failed']:,} "
              f"| {gap} | {wall:.0f} |", flush=True)


if __name__ == "__main__":
    main()
