"""DeepSeek-V3 on 1,024 H100 in the layout Megatron-Bridge published for its 25.09 container: step,
TFLOP/s per GPU, where the step goes, and the wall time of the simulation.

The job (NVIDIA-NeMo/Megatron-Bridge at tag v0.2.0, scripts/performance/configs/deepseek/:
workload_base_configs.py DEEPSEEK_V3_H100_BASE_CONFIG and deepseek_llm_pretrain.py
deepseek_v3_h100_config; utils/helpers.py): TP 2, PP 8, VP 4 through the layout "Et|(tt|)*30mL",
EP 64, ETP 1, GBS 8192, MBS 1, seq 4096, sequence parallel, fp8 with current scaling (the table's
main figure; its parenthesised one is blockwise fp8), gradients reduced in bf16
(grad_reduce_in_fp32 False) without overlap (overlap_grad_reduce False), balanced routing
(moe_router_force_load_balancing), the flex dispatcher with DeepEP (moe_flex_dispatcher_backend
"deepep"), the dispatcher's communication overlapped with another micro-batch's compute
(moe_a2a_overlap: overlap_moe_expert_parallel_comm and delay_wgrad_compute,
set_moe_a2a_overlap_overrides). Published (docs/performance-summary.md at v0.2.0, DGX-H100 table):
1,297 tokens/s/GPU, 338 model TFLOP/s/GPU.

What the published run did that this job does not: selective recomputation of the MLA
up-projections and the dense MLPs (recompute_modules mla_up_proj, mlp), not modelled (about 1% of
the step each by their FLOPs); DeepSeek-V3's group-limited routing sends a token to at most 4 of
the 8 nodes of an EP group, the flex dispatcher's bytes assume a uniform top-8 (5.3 nodes).

    python benchmarks/deepseek_v3.py [--precision bf16] [--no-overlap] [--alltoall] [--fold-time off]
                                     [--profile FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chakra_core import run as runner  # noqa: E402
from chakra_core.jobs.rank_writer import default_workers  # noqa: E402

PUBLISHED = {"tokens_per_s_per_gpu": 1297, "tflops_per_gpu": 338}


def job(precision: str, overlap: bool = True, dispatcher: str = "flex") -> dict[str, Any]:
    training: dict[str, Any] = {"seq": 4096, "global_batch": 8192, "micro_batch": 1, "precision": precision,
                                "grad_reduce_dtype": "bf16", "overlap_grad_reduce": False}
    if precision == "fp8":
        training["fp8_recipe"] = "current"
    return {"name": "deepseek-v3", "model": "deepseek-v3",
            "parallel": {"tp": 2, "pp": 8, "ep": 64, "etp": 1, "pipeline_layout": "Et|(tt|)*30mL",
                         "overlap_moe_expert_parallel_comm": overlap, "delay_wgrad_compute": overlap,
                         "moe_token_dispatcher": dispatcher},
            "training": training, "cluster": {"gpus": 1024, "profile": "h100-hgx-ndr400"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", default="fp8", choices=["fp8", "bf16"])
    parser.add_argument("--no-overlap", action="store_true", help="every EP all-to-all exposed (no moe_a2a_overlap)")
    parser.add_argument("--alltoall", action="store_true", help="Megatron's alltoall dispatcher instead of DeepEP")
    parser.add_argument("--fold-time", default="auto", choices=["auto", "off"],
                        help="workload.fold_time: off simulates every micro-batch (the same step to the ns)")
    parser.add_argument("--profile", type=Path, help="write cProfile statistics of the run to FILE (of this "
                        "process: the workers writing the traces are not in it)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        manifest = {"job": job(args.precision, not args.no_overlap, "alltoall" if args.alltoall else "flex"),
                    "output": {"dir": tmp}, "workload": {"fold_time": args.fold_time},
                    "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
        profiler = cProfile.Profile() if args.profile else None
        started, cpu = time.perf_counter(), time.process_time()
        if profiler:
            profiler.enable()
        # the traces written in a process per usable core, as `chakra-sim run` writes them
        result = runner.simulate(runner.load(manifest, base_dir=Path(tmp), workers=default_workers()))
        if profiler:
            profiler.disable()
            profiler.dump_stats(args.profile)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    training = result.results.training
    assert training is not None
    print(f"wall {wall:.1f} s (process CPU {cpu:.1f} s), {result.document['folding']['simulated_ranks']} "
          "simulated ranks")
    folded = result.document["folding"].get("time", {})
    print("folded in time: " + (f"{folded['microbatches_simulated']} of {folded['microbatches']} micro-batches "
                                f"simulated" if folded.get("folded") else folded.get("reason", "off")))
    print(f"step {result.document['finish_ns']:,} ns = {training.step_time_s:.2f} s, "
          f"{training.tokens_per_s_per_gpu:.0f} tokens/s/GPU, "
          f"{training.tflops_per_gpu:.0f} TFLOP/s/GPU (published {PUBLISHED['tokens_per_s_per_gpu']:,}, "
          f"{PUBLISHED['tflops_per_gpu']})")
    for part, seconds in training.breakdown_s.items():
        if seconds:
            print(f"  {part:20s} {seconds:8.3f} s")


if __name__ == "__main__":
    main()
