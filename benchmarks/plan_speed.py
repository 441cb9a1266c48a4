"""How long `chakra-sim plan` takes: Llama 3 70B on 1,024 H100, every layout.

    python benchmarks/plan_speed.py            # --top 10 (the command's default)
    python benchmarks/plan_speed.py --top 1

The job is Llama 3 70B (the preset), sequence 8,192, global batch 2,048, BF16, on 1,024 H100
(profile h100-hgx-ndr400), `achievable` compute, the `nccl` system layer and the `hbm` memory
layer following the traces' tensors (memory checked; `--no-check-memory` leaves it out); the
search is the
command's default (TP within the node, PP, VP, CP up to 8, micro-batches 1, 2, 4, 8,
recomputation none or full, distributed optimizer on or off), two local workers. Printed: wall
time, the layouts tried, valid, fitting in memory, bounded with the compute model, simulated
and pruned, and the best few (predicted memory and the reserve beside it: docs/plan.md). Each
run starts from an empty output folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._plan_timing import plan_manifest, timed_plan  # noqa: E402
from chakra_core.plan.search import SIMULATED, PlanOptions  # noqa: E402

JOB = {"name": "llama3-70b", "model": "llama3-70b", "training": {"seq": 8192, "global_batch": 2048},
       "cluster": {"gpus": 1024, "profile": "h100-hgx-ndr400"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-check-memory", dest="check_memory", action="store_false")
    args = parser.parse_args()
    found, wall = timed_plan(plan_manifest(JOB), PlanOptions(top=args.top, check_memory=args.check_memory),
                             args.workers)
    counts = found.counts()
    print(f"| top | wall s | tried | valid | fit | bounded by the compute model | simulated | pruned | rounds |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.top} | {wall:.1f} | {counts['tried']:,} | {counts['enumerated']:,} | {counts['fit']:,} | "
          f"{found.tightened:,} | {counts['simulated'] + counts['failed']:,} | {counts['pruned']:,} | {found.rounds} |")
    print()
    print("| rank | layout | step s | TFLOP/s per GPU | MFU | memory GiB | reserve GiB | simulated GiB |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    simulated = [c for c in found.ranked() if c.status == SIMULATED]
    for i, c in enumerate(simulated[:5]):
        assert c.training is not None
        checked = "-" if c.simulated_memory is None else f"{c.simulated_memory / 2**30:.1f}"
        print(f"| {i + 1} | {c.layout.label()} | {c.step_s:.3f} | {c.training.tflops_per_gpu:.0f} | {100 * c.training.mfu:.1f}% | "
              f"{c.memory.total / 2**30:.1f} | {c.reserve.total / 2**30:.1f} | {checked} |")
    gaps = [abs(c.memory_check) for c in simulated if c.memory_check is not None]
    if gaps:
        print(f"\nsimulated peaks within {100 * max(gaps):.3f}% of the predictions ({len(gaps)} layouts)")


if __name__ == "__main__":
    main()
