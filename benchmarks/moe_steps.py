#!/usr/bin/env python3
"""The mixture-of-experts steps docs/training.md quotes outside the accuracy table: Mixtral 8x7B's
routing table and dispatchers, Qwen3-30B-A3B's and Qwen3-235B-A22B's dispatchers and overlaps, and
three published runs the text describes (as benchmarks/training_accuracy.py describes them).

    python benchmarks/moe_steps.py                   # every case, a markdown table
    python benchmarks/moe_steps.py --only mixtral    # the cases whose name contains it

Each case is a job manifest (`achievable` compute, `nccl` system, `h100-hgx-ndr400`) simulated as
`chakra-sim run` does; the columns are the results' `training` section: step, tokens/s and model
TFLOP/s per GPU, exposed expert-parallel and pipeline communication, and for skewed routing the
hottest expert's tokens against balanced and its GEMMs' time, and the least and most compute
time of a rank (pipeline stages differ). The published runs these models
are compared with are in docs/training-accuracy.md (benchmarks/training_accuracy.py).
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import yaml  # noqa: E402

from chakra_core import run as runner  # noqa: E402
from training_accuracy import RUNS, job_of  # noqa: E402

PROFILE = "h100-hgx-ndr400"
FP8_CS = {"precision": "fp8", "fp8_recipe": "current"}
A2A_OVERLAP = {"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True}


def job(model: str, gpus: int, parallel: dict[str, Any], training: dict[str, Any]) -> dict[str, Any]:
    return {"name": model, "model": model, "parallel": parallel,
            "training": {"seq": 4096, "micro_batch": 1, **training}, "cluster": {"gpus": gpus, "profile": PROFILE}}


MIXTRAL_EP8 = {"tp": 1, "pp": 4, "vp": 8, "ep": 8}
MIXTRAL_TP4 = {"tp": 4, "ep": 2}
QWEN3_30B_2511 = {"tp": 1, "pp": 2, "vp": 24, "ep": 8}
QWEN3_30B_2602 = {"tp": 1, "pp": 2, "vp": 12, "ep": 8, "etp": 1}
QWEN3_235B = {"tp": 2, "pp": 8, "vp": 4, "ep": 32, "etp": 1, "account_for_embedding_and_loss": True}

CASES: dict[str, dict[str, Any] | str] = {
    **{f"mixtral-8x7b ep8 {name}": job("mixtral-8x7b", 64, MIXTRAL_EP8,
                                       {"global_batch": 256, "precision": "bf16", "routing": routing})
       for name, routing in [("balanced", "balanced"), *((f"zipf {s}", {"zipf": s}) for s in (0.1, 0.2, 0.3, 0.5, 1.0, 1.5))]},
    **{f"mixtral-8x7b tp4 ep2 {d}": job("mixtral-8x7b", 64, {**MIXTRAL_TP4, "moe_token_dispatcher": d},
                                        {"global_batch": 256, "precision": "bf16"}) for d in ("alltoall", "allgather")},
    "qwen3-30b-a3b 25.11 layout": job("qwen3-30b-a3b", 16, QWEN3_30B_2511,
                                      {"global_batch": 512, "micro_batch": 2, **FP8_CS}),
    "qwen3-30b-a3b 25.11 layout, a2a overlap": job("qwen3-30b-a3b", 16, {**QWEN3_30B_2511, **A2A_OVERLAP},
                                                   {"global_batch": 512, "micro_batch": 2, **FP8_CS}),
    "qwen3-30b-a3b 25.11 layout, a2a overlap without delayed wgrad": job(
        "qwen3-30b-a3b", 16, {**QWEN3_30B_2511, "overlap_moe_expert_parallel_comm": True},
        {"global_batch": 512, "micro_batch": 2, **FP8_CS}),
    **{f"qwen3-30b-a3b 26.02 layout, a2a overlap, {d}": job(
        "qwen3-30b-a3b", 16, {**QWEN3_30B_2602, **A2A_OVERLAP, **extra}, {"global_batch": 1024, **FP8_CS})
       for d, extra in [("alltoall", {}), ("flex", {"moe_token_dispatcher": "flex", "moe_flex_backend": "deepep"})]},
    **{f"qwen3-30b-a3b 26.02 layout, no overlap, {d}": job(
        "qwen3-30b-a3b", 16, {**QWEN3_30B_2602, "moe_token_dispatcher": d}, {"global_batch": 1024, **FP8_CS})
       for d in ("alltoall", "allgather")},
    "qwen3-235b-a22b 256": job("qwen3-235b-a22b", 256, QWEN3_235B, {"global_batch": 2048, **FP8_CS}),
    "qwen3-235b-a22b 256, a2a overlap": job("qwen3-235b-a22b", 256, {**QWEN3_235B, **A2A_OVERLAP},
                                            {"global_batch": 2048, **FP8_CS}),
    "qwen3-30b-a3b ep16 hybridep (published run)": "mbridge-26.04-qwen3-30b-a3b-h100-16-fp8",
    "qwen3-30b-a3b ep16 bf16 alltoall (published run)": "mbridge-docs-2026-05-qwen3-30b-a3b-h100-16-bf16",
    "gpt-oss-120b 64 (published run)": "mbridge-26.02-gpt-oss-120b-h100-64-bf16",
}
"""The jobs, by the name the table prints (their settings as docs/training.md states them)."""


@functools.cache
def published_runs() -> dict[str, dict[str, Any]]:
    """benchmarks/data/training-runs.yaml's runs by id, read once."""
    return {run["id"]: run for run in yaml.safe_load(RUNS.read_text())["runs"]}


def simulate(name: str) -> dict[str, Any]:
    case = CASES[name]
    spec = job_of(published_runs()[case]) if isinstance(case, str) else case
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        manifest = {"job": spec, "output": {"dir": out}, "compute": {"plugin": "achievable"},
                    "system": {"plugin": "nccl"}}
        document = runner.simulate(runner.load(manifest, base_dir=Path(out))).document
        training = document["training"]
        wall = time.perf_counter() - started
    step = training["step_time_s"]
    parts = training["breakdown_s"]
    routing = training.get("routing") or {}
    return {"name": name, "step": step, "tokens": training["tokens_per_s_per_gpu"],
            "tflops": training["tflops_per_gpu"], "ep": parts["exposed_ep"], "pp": parts["exposed_pp"],
            "imbalance": routing.get("imbalance"), "expert_gemm": routing.get("expert_gemm_s"), "wall": wall,
            "compute": [min(r["compute_ns"] for r in document["ranks"]) / 1e9,
                        max(r["compute_ns"] for r in document["ranks"]) / 1e9]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="only the cases whose name contains this")
    args = parser.parse_args()
    names = [name for name in CASES if args.only in name]
    if not names:
        parser.error(f"no case contains {args.only!r}; the cases: {', '.join(CASES)}")
    print("| job | step | tokens/s per GPU | model TFLOP/s per GPU | exposed EP | exposed PP "
          "| hottest expert / balanced | expert GEMMs | compute per rank | wall |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in names:
        r = simulate(name)
        skew = f"{r['imbalance']:.2f}" if r["imbalance"] is not None else "-"
        gemm = f"{r['expert_gemm']:.2f} s" if r["expert_gemm"] is not None else "-"
        print(f"| {name} | {r['step']:.3f} s | {r['tokens']:,.0f} | {r['tflops']:.0f} "
              f"| {r['ep']:.3f} s ({r['ep'] / r['step']:.1%}) | {r['pp']:.3f} s ({r['pp'] / r['step']:.1%}) "
              f"| {skew} | {gemm} | {r['compute'][0]:.1f}-{r['compute'][1]:.1f} s | {r['wall']:.1f} s |", flush=True)


if __name__ == "__main__":
    main()
