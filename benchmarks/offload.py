#!/usr/bin/env python3
"""Activation offload: what copying k layers' activations to host memory costs and saves.

    python benchmarks/offload.py [--layers 0 8 16 24 31]
    python benchmarks/offload.py --plan

Llama 3 8B on 8 GPUs (Megatron-FSDP ZeRO-3, sequence 8,192, global batch 16), for each k of
`training.cpu_offloading_num_layers`, on 8 H100 (copies over PCIe at the profile's 64 GB/s) and
8 GB200 (NVLink-C2C at 450 GB/s): the simulated step, the part of it with copies in flight and no
kernel running (the step split's `offload`), and the predicted peak memory per GPU.

`--plan`: `chakra-sim plan --offload --top 3 --micro-batches 1` of Llama 3 8B on 8 H100 at
sequence 16,384 (global batch 8): how many layouts do not fit, how many of those come back with
layers offloaded and with how many, the fastest of them against the fastest layout that fits as
it is (docs/plan.md, "Activation offload").
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

PROFILES = {"h100-hgx-ndr400": "8 H100 (PCIe)", "gb200-nvl72": "8 GB200 (C2C)"}
GIB = 1 << 30


def step(job: dict, folder: Path) -> tuple[float, float]:
    manifest = {"job": job, "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"},
                "memory": {"plugin": "hbm", "track_tensors": False}, "output": {"dir": str(folder)}}
    training = run.simulate(run.load(manifest, base_dir=ROOT)).document["training"]
    return training["step_time_s"], training["breakdown_s"].get("offload", 0.0)


def plan_figures() -> int:
    from chakra_core.plan.search import SIMULATED, TOO_BIG, PlanOptions, plan
    from chakra_core.sweep.run import Execution
    manifest = {"job": {"name": "offload-plan", "model": "llama3-8b", "training": {"seq": 16384, "global_batch": 8},
                        "cluster": {"gpus": 8, "profile": "h100-hgx-ndr400"}},
                "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"},
                "memory": {"plugin": "hbm", "track_tensors": False}}
    options = PlanOptions(top=3, batch=4, search={"micro_batches": (1,), "offload": True})
    with tempfile.TemporaryDirectory(prefix="chakra-offload-plan-") as tmp:
        found = plan(manifest, ROOT, Path(tmp), options, Execution(workers=2))
    plain = [c for c in found.candidates if not c.layout.offload and not c.layout.optimizer_offload]
    variants = [c for c in found.candidates if c.layout.offload]
    too_big = [c for c in plain if c.status == TOO_BIG]
    tried = [c for c in too_big if c.layout.pp == 1 and c.layout.recompute == "none"]
    print(f"{len(plain)} layouts, {len(too_big)} do not fit; {len(tried)} of those have one stage and no "
          f"recomputation; {len(variants)} fit with {min(c.layout.offload for c in variants)} to "
          f"{max(c.layout.offload for c in variants)} layers offloaded")
    for label, group in (("fastest offloading", variants), ("fastest fitting as it is", plain)):
        best = min((c for c in group if c.status == SIMULATED), key=lambda c: c.step_s or 0.0)
        assert best.training is not None
        print(f"{label}: {best.layout.label()}, {best.step_s:.3f} s, "
              f"{best.training.breakdown_s.get('offload', 0.0):.3f} s of copies with no kernel running")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[0, 8, 16, 24, 31])
    parser.add_argument("--plan", action="store_true", help="the docs/plan.md --offload example's figures")
    args = parser.parse_args()
    if args.plan:
        return plan_figures()
    header = f"{'k':>3} " + " ".join(f"{label + ' step, offload s':>34}" for label in PROFILES.values()) + \
        f" {'memory GiB':>11}"
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory(prefix="chakra-offload-") as tmp:
        for k in args.layers:
            cells, memory = [], 0.0
            for profile in PROFILES:
                job = {"name": "offload", "model": "llama3-8b", "cluster": {"gpus": 8, "profile": profile},
                       "training": {"seq": 8192, "global_batch": 16, "use_megatron_fsdp": True,
                                    "cpu_offloading_num_layers": k}}
                seconds, exposed = step(job, Path(tmp) / f"{profile}-{k}")
                cells.append(f"{seconds:>25.3f}, {exposed:>6.3f}")
                memory = predict_memory(JobSpec.model_validate(job)).total / GIB
            print(f"{k:>3} " + " ".join(f"{cell:>34}" for cell in cells) + f" {memory:>11.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
