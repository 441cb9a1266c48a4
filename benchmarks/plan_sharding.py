"""`chakra-sim plan --sharding`: Megatron and Megatron-FSDP layouts of Llama 3 70B on 256 H100
ranked together, memory checked (docs/plan.md, "Sharded data parallelism").

    python benchmarks/plan_sharding.py             # --top 3, as docs/plan.md runs it
    python benchmarks/plan_sharding.py --top 1

The job is Llama 3 70B (the preset), sequence 8,192, global batch 512, BF16, on 256 H100
(profile h100-hgx-ndr400), `achievable` compute, the `nccl` system layer and the `hbm` memory layer
following the traces' tensors; the search is the command's default plus `--sharding
megatron,optim_grads,optim_grads_params` (Megatron's data parallelism with and without the
distributed optimizer, ZeRO-2 and ZeRO-3 over dp x cp), two local workers, an empty output folder.
Printed: wall time, the layouts tried, valid, fitting and simulated, the best few (step, predicted
memory, exposed communication, and whether each is a tie with the first within the error band), the
fastest layout of each sharding strategy, and how far the simulated peaks lie from the predictions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._plan_timing import plan_manifest, timed_plan  # noqa: E402
from chakra_core.plan.search import SIMULATED, PlanOptions  # noqa: E402

JOB = {"name": "llama3-70b", "model": "llama3-70b", "training": {"seq": 8192, "global_batch": 512},
       "cluster": {"gpus": 256, "profile": "h100-hgx-ndr400"}}
SHARDINGS = ["megatron", "optim_grads", "optim_grads_params"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    found, wall = timed_plan(plan_manifest(JOB), PlanOptions(top=args.top, search={"sharding": SHARDINGS}),
                             args.workers)
    counts = found.counts()
    print(f"{wall:.0f} s: {counts['tried']:,} layouts tried, {counts['enumerated']:,} valid, {counts['fit']:,} fit, "
          f"{counts['simulated'] + counts['failed']:,} simulated ({counts['failed']} failed), {counts['pruned']:,} pruned\n")
    ranked = found.ranked()
    simulated = [c for c in ranked if c.status == SIMULATED]
    behind = found.versus_best(ranked)
    band = found.error_band()
    print("| # | layout | step | memory | exposed comm. |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for i, c in enumerate(simulated[:args.top]):
        assert c.training is not None
        gap, tied = behind(c)
        tie = "" if i == 0 or gap is None else f" ({100 * gap:+.1f}%{', a tie' if tied else ''})"
        print(f"| {i + 1} | {c.layout.label()} | {c.step_s:.3f} s{tie} | {c.memory.total / 2**30:.1f} GiB | "
              f"{c.training.exposed_comm_s:.2f} s |")
    print()
    for sharding in SHARDINGS:
        best = next((c for c in simulated if c.layout.sharding == sharding), None)
        print(f"fastest {sharding}: " + ("none simulated" if best is None else
                                          f"{best.layout.label()} {best.step_s:.3f} s, {best.memory.total / 2**30:.1f} GiB"))
    gaps = [abs(c.memory_check) for c in simulated if c.memory_check is not None]
    if gaps:
        print(f"\nsimulated peaks within {100 * max(gaps):.3f}% of the predictions ({len(gaps)} layouts)")
    if band is not None:
        print(f"error band: ±{100 * band.geomean_error:.1f}% ({band.scope})")


if __name__ == "__main__":
    main()
