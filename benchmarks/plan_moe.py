"""The planner on mixtures of experts: every layout with its expert parallel (EP) and expert tensor
parallel (ETP) sizes, and where a published layout ranks among the simulated ones.

    python benchmarks/plan_moe.py                                    # the runs in RUNS, --top 1
    python benchmarks/plan_moe.py --run mbridge-25.11-qwen3-30b-a3b-h100-16-fp8cs --top 3
    python benchmarks/plan_moe.py --micro-batches 1 --ep 8,16,32      # a smaller search

Each run of benchmarks/data/training-runs.yaml is described as benchmarks/training_accuracy.py
describes it (model, GPUs, global batch, sequence, precision and the settings its configuration
notes give, overlaps and dispatcher included) and planned with `chakra_core.plan.search.plan`:
every valid layout of the same job, its published layout marked (simulated in the first round
whatever its bound; chakra_core.plan.marks). One Markdown row per run: the wall time, the
layouts tried / valid / fitting / bounded by the compute model / simulated / pruned, the
published layout's memory, simulated step, rank and the unsimulated layouts whose bound is below
its step, the best layout found, and the published measurement beside them. Nothing is fitted;
the steps are simulated.
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
from chakra_core.plan.marks import mark_rows, parse_mark  # noqa: E402
from chakra_core.plan.search import SIMULATED, PlanOptions  # noqa: E402

RUNS = ("mbridge-25.11-qwen3-235b-a22b-h100-256-fp8cs",)
"""Megatron-Bridge 25.11's Qwen3-235B-A22B on 256 H100 in FP8 (TP2 PP8 VP4 EP32 ETP1, the EP
all-to-all overlap). DeepSeek-V3 (mbridge-25.09-deepseek-v3-h100-1024-fp8) is not plannable yet:
its published layout is a custom pipeline layout, which plan does not search."""


def _ints(text: str | None) -> list[int] | None:
    return None if text is None else [int(part) for part in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", help="a run id of training-runs.yaml (repeatable; default RUNS)")
    parser.add_argument("--top", type=int, default=1, help="layouts the plan must be sure of")
    parser.add_argument("--micro-batches", default="1,2,4,8", help="micro-batch sizes searched")
    parser.add_argument("--ep", help="expert parallel sizes searched (default: every divisor of the experts)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--check-memory", action="store_true",
                        help="simulate with the traces' tensors and the hbm layer (about a quarter slower)")
    args = parser.parse_args()
    runs = {run["id"]: run for run in yaml.safe_load(RUNS_FILE.read_text())["runs"]}
    print("| run | layouts tried / valid / fit / bounded / simulated / pruned | published layout | its memory + "
          "reserve GiB | its step s (measured) | its rank | unsimulated below its step | best layout | best step s | "
          "best / published | plan wall s |")
    print("|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|")
    search: dict[str, Any] = {"micro_batches": _ints(args.micro_batches)}
    if args.ep is not None:
        search["ep"] = _ints(args.ep)
    for run_id in args.run or RUNS:
        job = job_of(runs[run_id])
        marked = parse_mark("job", job)
        found, wall = timed_plan(plan_manifest(job, args.check_memory),
                                 PlanOptions(top=args.top, search=search, include=(marked,), check_memory=args.check_memory,
                                             progress=lambda line: print(line, file=sys.stderr, flush=True)),
                                 args.workers, run_id)
        counts = found.counts()
        mine = mark_rows(found)[0]
        best = next(c for c in found.ranked() if c.status == SIMULATED)
        step, measured = mine.get("step_s"), runs[run_id]["measured"]["step_time_s"]
        ratio = f"{best.step_s / step:.3f}" if isinstance(step, float) and best.step_s else "-"
        print(f"| {run_id} | {counts['tried']:,} / {counts['enumerated']:,} / {counts['fit']:,} / {found.tightened:,} "
              f"/ {counts['simulated'] + counts['failed']:,} / {counts['pruned']:,} | {marked.label()} | "
              f"{mine.get('memory_gib', 0.0):.1f} + {mine.get('memory_reserve_gib', 0.0):.1f} | "
              f"{'-' if not isinstance(step, float) else f'{step:.3f}'} ({measured:.3f}) | {mine.get('rank') or '-'} "
              f"of {mine.get('simulated', 0)} | {mine.get('pruned_below_its_step', '-')} | {best.layout.label()} | "
              f"{best.step_s:.3f} | {ratio} | {wall:.0f} |", flush=True)
        print(f"  ({mine['status']}; rank among the simulated layouts)", file=sys.stderr)


if __name__ == "__main__":
    main()
