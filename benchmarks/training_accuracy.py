"""Predicted vs published training steps: regenerates docs/training-accuracy.md.

    python benchmarks/training_accuracy.py                 # every run of benchmarks/data/training-runs.yaml
    python benchmarks/training_accuracy.py --only sc21     # runs whose id contains "sc21"
    python benchmarks/training_accuracy.py --fold-check 64 # also run fold: off for runs up to 64 GPUs

Each run is described as the source describes it (model preset, GPUs, batch sizes, TP/PP/CP/VP,
precision) plus the settings its configuration notes give (JOB_SETTINGS below, each with why);
where a source is silent the job's defaults apply. Predictions are spec-only: the hardware
profiles' public constants, nothing fitted to these step times. Error = |predicted / measured - 1|;
geomean error = exp(mean |ln(predicted / measured)|) - 1.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chakra_core import run as runner  # noqa: E402
from chakra_core._atomic import atomic_write_text  # noqa: E402
from chakra_core.hardware.profiles import load_profile  # noqa: E402
from chakra_core.jobs.bands import RUNS_FILE  # noqa: E402
from chakra_core.jobs.flops import model_flops  # noqa: E402
from chakra_core.jobs.spec import JobSpec  # noqa: E402

RUNS = ROOT / "benchmarks" / "data" / "training-runs.yaml"
DOC = ROOT / "docs" / "training-accuracy.md"
PROFILES = {"h100-sxm": "h100-hgx-ndr400", "a100-sxm-80gb": "a100-hgx-hdr200"}
"""DGX H100 (8 x ConnectX-7 NDR 400) and Selene's DGX A100 (8 x HDR 200 for compute traffic)."""

SC21 = {"recompute": "full", "distributed_optimizer": False, "overlap_grad_reduce": False,
        "overlap_param_gather": False, "attention": "unfused", "dropout": 0.1}
"""SC'21 (sec. 5.1): full activation recomputation, counted by eq. 3. The Megatron-LM of 2021
(v2.x, megatron/arguments.py) had no distributed optimizer and all-reduced gradients after the
backward pass, no FlashAttention (which appeared in 2022: explicit score GEMMs around its fused
scale-mask-softmax kernel), and --attention-dropout / --hidden-dropout defaulting to 0.1."""
JOB_SETTINGS: dict[str, dict[str, Any]] = {
    "nemo-24.07-llama3-70b": {"parallel": {"tp_comm_overlap": True}},       # launcher conf: ub_tp_comm_overlap true
    "nemo-24.07-gpt3-175b": {"parallel": {"tp_comm_overlap": True},          # launcher conf gpt3/175b.yaml
                             "training": {"recompute": "selective"}},
    "mbridge": {"training": {"grad_reduce_dtype": "bf16"}},                   # perf scripts: grad_reduce_in_fp32=False
    # NeMo-Framework-Launcher's Llama examples (examples/training/llama/h100/llama*_{bf16,fp8}.sh)
    # all pass +training.model.optim.grad_sync_dtype=bf16
    "nemo-24.07-llama": {"training": {"grad_reduce_dtype": "bf16"}},
    "llama3.1-405b": {"parallel": {"account_for_embedding_and_loss": True}},  # 126 layers in 8 x 8 x 2 slots
}


def job_of(run: dict[str, Any]) -> dict[str, Any]:
    parallel: dict[str, Any] = {"tp": run["tp"], "pp": run["pp"], "cp": run["cp"] or 1}
    if run.get("vp"):
        parallel["vp"] = run["vp"]
    precision = {"fp16": "fp16", "bf16": "bf16", "fp8": "fp8"}[run["precision"]]
    training: dict[str, Any] = {"seq": run["seq"], "global_batch": run["gbs"], "micro_batch": run["mbs"] or 1,
                                "precision": precision}
    if run["id"].startswith("sc21"):
        training.update(SC21)
    for key, extra in JOB_SETTINGS.items():
        if key in run["id"]:
            parallel.update(extra.get("parallel", {}))
            training.update(extra.get("training", {}))
    return {"name": "step", "model": run["model"], "parallel": parallel, "training": training,
            "cluster": {"gpus": run["gpus"], "profile": PROFILES[run["gpu"]]}}


def simulate(job: dict[str, Any], out: Path, fold: str = "auto") -> tuple[dict[str, Any], float]:
    manifest = {"job": job, "workload": {"fold": fold}, "output": {"dir": str(out)},
                "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
    started = time.perf_counter()
    result = runner.simulate(runner.load(manifest, base_dir=out, name=job["name"]))
    return result.results, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="only runs whose id contains this")
    parser.add_argument("--fold-check", type=int, default=0, help="also simulate fold: off up to this many GPUs")
    parser.add_argument("--doc", type=Path, default=DOC)
    args = parser.parse_args()
    data = yaml.safe_load(RUNS.read_text())
    rows, breakdowns, logs = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for run in data["runs"]:
            if args.only not in run["id"] or not run.get("verified", True):
                continue
            job = job_of(run)
            results, wall = simulate(job, Path(tmp) / run["id"])
            training = results["training"]
            step = training["step_time_s"]
            flops = model_flops(JobSpec.model_validate(job), run["flops_formula"])
            measured = run["measured"]["step_time_s"]
            rows.append((run, job, step, flops / step / run["gpus"] / 1e12, wall))
            breakdowns.append((run["id"], training["breakdown_s"], step))
            line = f"{run['id']}: measured {measured:.3f} s, predicted {step:.3f} s ({step / measured - 1:+.1%}), {wall:.1f} s"
            if run["gpus"] <= args.fold_check:
                unfolded, _ = simulate(job, Path(tmp) / (run["id"] + "-off"), "off")
                same = unfolded["ranks"] == results["ranks"] and unfolded["training"] == training
                line += f"; fold off identical: {same}"
                logs.append((run["id"], same))
            print(line, flush=True)
    args.doc.write_text(render(data, rows, breakdowns, logs))
    print(f"wrote {args.doc}")
    if not args.only and args.doc == DOC:   # the error bands come from the whole table only
        write_bands(rows)


def write_bands(rows: list[Any]) -> None:
    """Every run's predicted / measured step, for the error band of a job's results (chakra_core.jobs.bands)."""
    out = []
    for run, job, step, _, _ in rows:
        gpu = load_profile(job["cluster"]["profile"]).gpu
        out.append({"id": run["id"], "gpu_model": gpu.model, "architecture": gpu.architecture,
                    "precision": run["precision"], "gpus": run["gpus"],
                    "ratio": round(step / run["measured"]["step_time_s"], 6)})
    atomic_write_text(RUNS_FILE, json.dumps({"generator": "benchmarks/training_accuracy.py", "runs": out}, indent=1) + "\n")
    print(f"wrote {RUNS_FILE}")


def _summary(errors: list[float]) -> tuple[float, float]:
    if not errors:
        return float("nan"), float("nan")
    return math.exp(sum(abs(e) for e in errors) / len(errors)) - 1, max(abs(math.exp(e) - 1) for e in errors)


def _group(run: dict[str, Any]) -> str:
    release = run["source"].get("release") or run["source"]["title"]
    return f"{release} ({run['gpu']}, {run['precision']})"


def render(data: dict[str, Any], rows: list[Any], breakdowns: list[Any], logs: list[Any]) -> str:
    errors = [math.log(step / run["measured"]["step_time_s"]) for run, _, step, _, _ in rows]
    geo, worst = _summary(errors)
    groups: dict[str, list[float]] = {}
    for (run, _, _, _, _), error in zip(rows, errors):
        groups.setdefault(_group(run), []).append(error)
    out = ["# Training steps: predicted vs published", "",
           "Generated by `python benchmarks/training_accuracy.py` from `benchmarks/data/training-runs.yaml`",
           "(each run's source, table and configuration notes are there). Spec-only: the jobs are described",
           "as the sources describe them, timed by the `achievable` compute layer and the `nccl` system layer",
           "with the shipped hardware profiles; nothing is fitted to these step times. TFLOP/s per GPU use the",
           "formula the source uses (chakra_core/jobs/flops.py), so their error equals the step time's.", "",
           f"**{len(rows)} runs: geomean error {geo:.1%}, worst {worst:.1%}** "
           "(geomean error = exp(mean |ln(predicted/measured)|) - 1; worst = the largest "
           "|predicted/measured - 1|). By source:", "",
           "| source | runs | geomean error | worst | mean signed error |", "|---|---:|---:|---:|---:|"]
    for name, group in groups.items():
        g, w = _summary(group)
        mean = math.exp(sum(group) / len(group)) - 1
        out.append(f"| {name} | {len(group)} | {g:.1%} | {w:.1%} | {mean:+.1%} |")
    out += ["",
           "| run | GPUs | layout (TP/PP/VP/CP/DP, MBS, GBS) | precision | measured step s | predicted step s "
           "| error | measured TFLOP/s/GPU | predicted TFLOP/s/GPU | simulated in s |",
           "|---|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for run, job, step, tflops, wall in rows:
        spec = JobSpec.model_validate(job)
        p = spec.parallel
        layout = f"{p.tp}/{p.pp}/{p.vp or 1}/{p.cp}/{spec.dp}, {spec.training.micro_batch}, {spec.training.global_batch}"
        measured = run["measured"]["step_time_s"]
        out.append(f"| [{run['id']}]({run['source']['url']}) | {run['gpus']:,} | {layout} | {run['precision']} | "
                   f"{measured:.3f} | {step:.3f} | {step / measured - 1:+.1%} | {run['measured']['tflops_per_gpu']:g} | "
                   f"{tflops:.0f} | {wall:.1f} |")
    out += ["", "## Where the time goes", "",
            "The slowest rank's step, split exclusively (sums to the step): compute by part, communication "
            "exposed (nothing computing) by communicator, and the pipeline bubble (waiting for a pipeline "
            "neighbour, or nothing in flight). Seconds.", "",
            "| run | forward | backward | recompute | optimizer | other compute | TP | CP | DP | PP | bubble | step |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run_id, b, step in breakdowns:
        cells = [b["compute_forward"], b["compute_backward"], b["compute_recompute"], b["compute_optimizer"],
                 b["compute_other"], b["exposed_tp"], b["exposed_cp"], b["exposed_dp"], b["exposed_pp"] + b["exposed_other"],
                 b["bubble"], step]
        out.append(f"| {run_id} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    if logs:
        out += ["", "## Folding", "", "`workload.fold: auto` (one rank per pipeline stage) against `off` (every rank):", ""]
        out += [f"- {run_id}: {'identical results' if same else 'DIFFERENT results'}" for run_id, same in logs]
    out += ["", "## Assumptions where the sources are silent", "",
            "- SC'21 Table 1 gives no micro-batch size or interleaving degree: micro-batch 1, no interleaving.",
            "- SC'21 says 'mixed precision' on A100: fp16 GEMMs (same peak as bf16).",
            "- NeMo 24.07 Llama runs reduce gradients in bf16: the launcher's example scripts "
            "(NeMo-Framework-Launcher examples/training/llama/h100) pass optim.grad_sync_dtype=bf16.",
            "- Runs whose configuration notes were not readable use the job defaults (no recomputation, distributed "
            "optimizer with overlapped gradient reduce-scatter and parameter all-gather, sequence parallelism with TP).",
            ""]
    return "\n".join(out)


if __name__ == "__main__":
    main()
