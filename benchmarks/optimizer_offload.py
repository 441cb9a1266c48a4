#!/usr/bin/env python3
"""Optimizer offload: what keeping part of the optimizer on the host costs and saves.

    python benchmarks/optimizer_offload.py

1. The measurement the H100 profile's host rates come from (NVIDIA-NeMo/RL pull request #3628:
   Megatron-Core's HybridDeviceOptimizer, Qwen3-0.6B on one H100): for each of its four runs, the
   simulated step and what offload adds to it, beside the published step and what it added. The
   two half-offload runs set the two rates (h100-sxm-hgx.yaml, node.host_adam_ns_per_param and
   node.host_optimizer_call_us); the full-offload run checks them. The sequence and batch of the
   published runs are not stated: the step without offload is not compared, only what offload adds.
2. Qwen3-30B-A3B on 16 H100 (TP 2, PP 2, EP 4, as Megatron-Bridge's docs/training/cpu-offloading.md
   measured it; global batch 8): the step and the predicted memory per GPU for each fraction, and
   the step over the step without offload (the docs: 1.9x at 25% to 4.2x at 100%, "scales linearly";
   3.8 GB saved per 25%). Their global batch and sequence are not stated; 8 and 4,096 are taken.

`--plan`: `chakra-sim plan --offload --top 3 --micro-batches 1` of Llama 3 70B on 16 H100 (sequence
4,096, global batch 16, memory not checked): how many layouts do not fit, how many of those come back
with a quarter of the optimizer offloaded and with how much, and the fastest of them against the
fastest layout that fits as it is (docs/plan.md, "Offload").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chakra_core import run  # noqa: E402
from chakra_core.jobs.spec import JobSpec  # noqa: E402
from chakra_core.plan.memory import predict_memory  # noqa: E402

QWEN3_06B = {"layers": 28, "hidden": 1024, "ffn_hidden": 3072, "heads": 16, "kv_heads": 8, "kv_channels": 128,
             "vocab": 151936, "qk_layernorm": True, "tied_embeddings": True}
"""https://huggingface.co/Qwen/Qwen3-0.6B config.json: 596.0M parameters."""
PUBLISHED = [(0.0, False, 0.752), (0.5, False, 1.187), (0.5, True, 1.216), (1.0, True, 1.678)]
"""(fraction, overlap_cpu_optimizer_d2h_h2d, mean step s) of NVIDIA-NeMo/RL PR #3628's table."""


def simulate(job: dict, folder: Path) -> dict:
    manifest = {"job": job, "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"},
                "memory": {"plugin": "hbm", "track_tensors": False}, "output": {"dir": str(folder)}}
    return run.simulate(run.load(manifest, base_dir=ROOT)).document["training"]


def job(name: str, model: object, gpus: int, fraction: float, overlap: bool, parallel: dict | None = None,
        global_batch: int = 8) -> dict:
    return {"name": name, "model": model, "parallel": parallel or {},
            "training": {"seq": 4096, "global_batch": global_batch, "optimizer_offload_fraction": fraction,
                         "overlap_cpu_optimizer_d2h_h2d": overlap},
            "cluster": {"gpus": gpus, "profile": "h100-sxm-hgx" if gpus <= 8 else "h100-hgx-ndr400"}}


def plan_figures() -> None:
    from chakra_core.plan.search import SIMULATED, TOO_BIG, PlanOptions, plan
    from chakra_core.sweep.run import Execution
    manifest = {"job": {"name": "optimizer-offload-plan", "model": "llama3-70b",
                        "training": {"seq": 4096, "global_batch": 16},
                        "cluster": {"gpus": 16, "profile": "h100-hgx-ndr400"}},
                "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"},
                "memory": {"plugin": "hbm", "track_tensors": False}}
    options = PlanOptions(top=3, batch=4, check_memory=False, search={"micro_batches": (1,), "offload": True})
    with tempfile.TemporaryDirectory(prefix="chakra-optimizer-offload-plan-") as tmp:
        found = plan(manifest, ROOT, Path(tmp), options, Execution(workers=2))
    plain = [c for c in found.candidates if not c.layout.offload and not c.layout.optimizer_offload]
    variants = [c for c in found.candidates if c.layout.optimizer_offload]
    too_big = [c for c in plain if c.status == TOO_BIG]
    fractions = sorted({c.layout.optimizer_offload for c in variants})
    print(f"{len(plain)} layouts, {len(too_big)} do not fit; {len(variants)} fit with a share of the optimizer "
          f"offloaded ({', '.join(f'{f:g}' for f in fractions)}); "
          f"{sum(c.layout.offload > 0 for c in found.candidates)} with activations offloaded")
    for label, group in (("fastest offloading its optimizer", variants), ("fastest fitting as it is", plain)):
        best = min((c for c in group if c.status == SIMULATED), key=lambda c: c.step_s or 0.0)
        assert best.training is not None
        print(f"{label}: {best.layout.label()}, {best.step_s:.3f} s, "
              f"{best.training.breakdown_s.get('host_optimizer', 0.0):.3f} s of host steps with no kernel running, "
              f"{best.memory.total / 2**30:.1f} GiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", action="store_true", help="the docs/plan.md --offload example's optimizer figures")
    if parser.parse_args().plan:
        plan_figures()
        return
    with tempfile.TemporaryDirectory() as tmp:
        print("Qwen3-0.6B on 1 H100 (NVIDIA-NeMo/RL #3628)")
        print(f"{'fraction':>8} {'overlap':>7} {'step s':>8} {'added s':>8} {'published':>9} {'added':>7} "
              f"{'host opt s':>10} {'copies s':>8}")
        base = published_base = None
        for fraction, overlap, published in PUBLISHED:
            t = simulate(job("qwen3-0.6b", QWEN3_06B, 1, fraction, overlap, global_batch=1),
                         Path(tmp) / f"small-{fraction}-{overlap}")
            step = t["step_time_s"]
            base, published_base = base or step, published_base or published
            split = t["breakdown_s"]
            print(f"{fraction:>8.2f} {str(overlap):>7} {step:>8.3f} {step - base:>8.3f} {published:>9.3f} "
                  f"{published - published_base:>7.3f} {split.get('host_optimizer', 0):>10.3f} "
                  f"{split.get('offload', 0):>8.3f}")
        print("\nQwen3-30B-A3B on 16 H100, TP 2 PP 2 EP 4 (Megatron-Bridge docs/training/cpu-offloading.md)")
        print(f"{'fraction':>8} {'step s':>8} {'x step':>7} {'memory GiB':>10} {'optimizer GiB':>13}")
        base = None
        for fraction in (0.0, 0.25, 0.5, 0.75, 1.0):
            data = job("qwen3-30b-a3b", "qwen3-30b-a3b", 16, fraction, True, {"tp": 2, "pp": 2, "ep": 4})
            step = simulate(data, Path(tmp) / f"moe-{fraction}")["step_time_s"]
            base = base or step
            memory = predict_memory(JobSpec.model_validate(data))
            print(f"{fraction:>8.2f} {step:>8.3f} {step / base:>7.2f} {memory.total / 2**30:>10.1f} "
                  f"{memory.optimizer / 2**30:>13.1f}")


if __name__ == "__main__":
    main()
