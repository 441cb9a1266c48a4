"""The planner on mixtures of experts: every layout with its expert parallel (EP) and expert tensor
parallel (ETP) sizes, and where a published layout ranks among the simulated ones.

    python benchmarks/plan_moe.py                         # every run in RUNS, --top 3
    python benchmarks/plan_moe.py --only qwen3 --top 1 --micro-batches 1 --ep 8,16,32

Each run is a job manifest's `job:` as its source describes it, with its published layout; the
plan searches every layout of the same model, GPUs, global batch, sequence and precision
(`chakra_core.plan.search.plan`, with the published layout marked: simulated in the first round
whatever its bound, chakra_core.plan.marks) and prints, as a Markdown row, the wall time, the
layouts tried / valid / fitting / bounded by the compute model / simulated / pruned, the
published layout's memory, step and rank, and the best layout found. Nothing is fitted;
nothing here is a measurement of the runs (the steps are simulated). A run is added by adding
its job to RUNS (`mark` names its published layout: `job`, the job's own, or keys over it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chakra_core.plan.marks import mark_rows, parse_mark  # noqa: E402
from chakra_core.plan.search import GIB, SIMULATED, PlanOptions, plan  # noqa: E402
from chakra_core.sweep.run import Execution  # noqa: E402

BRIDGE = "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/01b2977e518f0a58ec870daba2fb2c04d76a91b2"
RUNS: dict[str, dict[str, Any]] = {
    # Megatron-Bridge's H100 FP8 (current scaling) performance config of Qwen3-235B-A22B: 256 GPUs,
    # TP 2, PP 8, VP 4, EP 32, ETP 1 (BASE_QWEN3_235B_A22B_CONFIG), GBS 2048, MBS 1, CP 1 (the
    # WorkloadBaseConfig default), alltoall dispatcher, no recomputation, bf16 gradient reduction
    # and forced load balancing (set_qwen3_common_configs); the recipe it starts from counts the
    # embedding and the loss in the pipeline split (94 + 2 = 96 layers in 32 chunks) and uses the
    # distributed optimizer. moe_a2a_overlap (EP all-to-all overlap) is not modelled.
    "megatron-bridge-qwen3-235b-a22b-h100-256-fp8": {
        "source": f"{BRIDGE}/scripts/performance/configs/qwen/qwen3_workload_base_configs.py "
                  "(QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V1), "
                  f"{BRIDGE}/scripts/performance/configs/qwen/qwen3_llm_pretrain.py, "
                  "src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py (qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config)",
        "mark": "job",
        "job": {"name": "qwen3-235b-a22b", "model": "qwen3-235b-a22b",
                "parallel": {"tp": 2, "pp": 8, "vp": 4, "ep": 32, "etp": 1, "account_for_embedding_and_loss": True},
                "training": {"seq": 4096, "global_batch": 2048, "micro_batch": 1, "precision": "fp8",
                             "fp8_recipe": "current", "grad_reduce_dtype": "bf16", "recompute": "none",
                             "distributed_optimizer": True},
                "cluster": {"gpus": 256, "profile": "h100-hgx-ndr400"}},
    },
}


def _ints(text: str | None) -> list[int] | None:
    return None if text is None else [int(part) for part in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="only runs whose id contains this")
    parser.add_argument("--top", type=int, default=3, help="layouts the plan must be sure of")
    parser.add_argument("--micro-batches", default="1,2,4,8", help="micro-batch sizes searched")
    parser.add_argument("--ep", help="expert parallel sizes searched (default: every divisor of the experts)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--check-memory", action="store_true",
                        help="simulate with the traces' tensors and the hbm layer (about a quarter slower)")
    args = parser.parse_args()
    print("| run | layouts tried / valid / fit / bounded / simulated / pruned | published layout | its memory + "
          "reserve GiB | its step s | its rank | unsimulated below its step | best layout | best step s | "
          "best / published | plan wall s |")
    print("|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|")
    search: dict[str, Any] = {"micro_batches": _ints(args.micro_batches)}
    if args.ep is not None:
        search["ep"] = _ints(args.ep)
    for run_id, run in RUNS.items():
        if args.only not in run_id:
            continue
        job = run["job"]
        marked = parse_mark(run["mark"], job)
        manifest = {"job": job, "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"},
                    **({"memory": {"plugin": "hbm"}} if args.check_memory else {})}
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            found = plan(manifest, Path(tmp), Path(tmp) / run_id,
                         PlanOptions(top=args.top, search=search, include=(marked,), check_memory=args.check_memory,
                                     progress=lambda line: print(line, file=sys.stderr, flush=True)),
                         Execution(workers=args.workers))
            wall = time.perf_counter() - started
        counts = found.counts()
        mine = mark_rows(found)[0]
        best = next(c for c in found.ranked() if c.status == SIMULATED)
        step = mine.get("step_s")
        ratio = f"{best.step_s / step:.3f}" if isinstance(step, float) and best.step_s else "-"
        print(f"| {run_id} | {counts['tried']:,} / {counts['enumerated']:,} / {counts['fit']:,} / {found.tightened:,} "
              f"/ {counts['simulated'] + counts['failed']:,} / {counts['pruned']:,} | {marked.label()} | "
              f"{mine.get('memory_gib', 0.0):.1f} + {mine.get('memory_reserve_gib', 0.0):.1f} | "
              f"{'-' if not isinstance(step, float) else f'{step:.3f}'} | {mine.get('rank') or '-'} of "
              f"{mine.get('simulated', 0)} | {mine.get('pruned_below_its_step', '-')} | {best.layout.label()} | "
              f"{best.step_s:.3f} | {ratio} | {wall:.0f} |", flush=True)
        print(f"  ({run['source']}; usable {found.usable_bytes / GIB:.1f} GiB per GPU)", file=sys.stderr)


if __name__ == "__main__":
    main()
