"""How long a training step takes to simulate: Llama 3 70B on 1,024 H100, Llama 3.1 405B on
16,384 H100 (the layout Meta reports for Llama 3 405B pre-training: TP 8, CP 1, PP 16, DP 128,
16M tokens per step; "The Llama 3 Herd of Models", sec. 3.3, as quoted from Balaji's SC'24 talk
at https://glennklockwood.com/garden/llama-3.1), the same with interleaving (VP 8), Llama 3.1
405B on 256 H100 in a layout of docs/plan.md's plan without interleaving (768 micro-batches
that repeat every 6: time folding's retry), and SC'21's 1T GPT on 3,072 A100 exactly as the
training accuracy table describes it (64 stages, 512 micro-batches).

    python benchmarks/training_speed.py              # every job, folded in time and not: both steps
    python benchmarks/training_speed.py --fold-time auto   # folded in time only
    python benchmarks/training_speed.py --fold-off   # also 1,024 GPUs with every rank simulated

Each measurement runs in a fresh process (this script with --case JSON). Wall time counts
everything `chakra-sim run` does for a job manifest: generating (and indexing) the traces of one
rank per pipeline stage in a process per usable core, as `chakra-sim run` does (rank_writer.py),
building the layers, simulating, building the results; peak memory is that process's maximum
resident set, and the largest of the trace-writing workers' forked from it.
Beside the wall time, the seconds spent generating the traces before the simulation starts
(loading the manifest; a time-folded run that tries again writes its next traces inside the
simulation, counted in the rest).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _measure import case_in_child  # noqa: E402
from chakra_core import run as runner  # noqa: E402
from chakra_core.jobs.rank_writer import default_workers  # noqa: E402

JOBS: dict[str, dict[str, Any]] = {
    "llama3-70b on 1,024 H100 (TP 4, PP 8, VP 5, DP 32, GBS 2048, FP8)": {
        "model": "llama3-70b", "parallel": {"tp": 4, "pp": 8, "vp": 5},
        "training": {"seq": 8192, "global_batch": 2048, "precision": "fp8"},
        "cluster": {"gpus": 1024, "profile": "h100-hgx-ndr400"}},
    "llama3.1-405b on 16,384 H100 (TP 8, PP 16, DP 128, GBS 2048, BF16)": {
        "model": "llama3.1-405b", "parallel": {"tp": 8, "pp": 16, "account_for_embedding_and_loss": True},
        "training": {"seq": 8192, "global_batch": 2048},
        "cluster": {"gpus": 16384, "profile": "h100-hgx-roce400"}},
    "llama3.1-405b on 16,384 H100 (TP 8, PP 16, VP 8, DP 128, GBS 2048, BF16)": {
        "model": "llama3.1-405b", "parallel": {"tp": 8, "pp": 16, "vp": 8, "account_for_embedding_and_loss": True},
        "training": {"seq": 8192, "global_batch": 2048},
        "cluster": {"gpus": 16384, "profile": "h100-hgx-roce400"}},
    # docs/plan.md's 405B H100 plan, a layout without interleaving: it repeats only every 6 micro-batches
    "llama3.1-405b on 256 H100 (TP 8, PP 8, CP 2, DP 2, GBS 1536, FP8 current; a plan layout)": {
        "model": "llama3.1-405b",
        "parallel": {"tp": 8, "pp": 8, "cp": 2, "tp_comm_overlap": True, "account_for_embedding_and_loss": True},
        "training": {"seq": 8192, "global_batch": 1536, "precision": "fp8", "fp8_recipe": "current",
                     "fp8_param_gather": True, "grad_reduce_dtype": "bf16"},
        "cluster": {"gpus": 256, "profile": "h100-hgx-ndr400"}},
}
SC21_1T = "SC'21 1T GPT on 3,072 A100 (TP 8, PP 64, DP 6, GBS 3072; accuracy table row)"


def jobs() -> dict[str, dict[str, Any]]:
    import yaml
    from training_accuracy import RUNS, job_of

    run = next(r for r in yaml.safe_load(RUNS.read_text())["runs"] if r["id"] == "sc21-gpt-1t-a100-3072")
    sc21 = job_of(run)
    sc21.pop("name", None)
    return {**JOBS, SC21_1T: sc21}


def measure(job: dict[str, Any], out: Path, fold: str, fold_time: str = "auto") -> tuple[float, float, dict[str, Any]]:
    """Wall seconds in all, of them generating the traces (loading the manifest), and the results."""
    manifest = {"job": {"name": "step", **job}, "workload": {"fold": fold, "fold_time": fold_time},
                "output": {"dir": str(out)}, "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
    started = time.perf_counter()
    prepared = runner.load(manifest, base_dir=out, workers=default_workers())   # as `chakra-sim run` writes them
    generated = time.perf_counter()
    result = runner.simulate(prepared)
    return time.perf_counter() - started, generated - started, result.document


def run_case(case: dict[str, Any]) -> None:
    """Child: one measurement; prints one JSON line (the results' ranks and training section as a digest)."""
    wall, generating, results = measure(case["job"], Path(case["out"]), case["fold"], case["fold_time"])
    training, folded = results["training"], results["folding"].get("time") or {}
    print(json.dumps({
        "wall": wall, "generating": generating, "finish_ns": results["finish_ns"],
        "tflops": training["tflops_per_gpu"], "simulated_ranks": results["folding"]["simulated_ranks"],
        "time": {k: folded.get(k) for k in ("folded", "microbatches_simulated", "microbatches", "reason")},
        "digest": hashlib.sha256(json.dumps([results["ranks"], training], sort_keys=True).encode()).hexdigest(),
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))


def measure_apart(job: dict[str, Any], out: Path, fold: str, fold_time: str) -> dict[str, Any]:
    """Parent: one measurement in a fresh process."""
    case = {"job": job, "out": str(out), "fold": fold, "fold_time": fold_time}
    return case_in_child(__file__, case, f"measurement (fold {fold}, fold_time {fold_time})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--fold-off", action="store_true", help="also simulate the 1,024-GPU job unfolded")
    parser.add_argument("--fold-time", choices=["both", "auto", "off"], default="both",
                        help="fold in time (auto), not (off), or both and compare the steps (default)")
    parser.add_argument("--only", default="", help="only jobs whose name contains this")
    args = parser.parse_args()
    if args.case:
        run_case(json.loads(args.case))
        return
    print("| job | fold | fold in time | simulated ranks | micro-batches simulated | wall s | of which generating "
          "traces s | peak RSS MB (largest writing worker) | step ns | TFLOP/s per GPU | same step |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for index, (name, job) in enumerate(jobs().items()):
            if args.only not in name:
                continue
            folds = ["auto", "off"] if args.fold_off and index == 0 else ["auto"]
            in_time = ["auto", "off"] if args.fold_time == "both" else [args.fold_time]
            for fold in folds:
                digests = []
                for fold_time in in_time:
                    r = measure_apart(job, Path(tmp) / f"{index}-{fold}-{fold_time}", fold, fold_time)
                    digests.append(r["digest"])
                    folded = r["time"]
                    kept = (f"{folded['microbatches_simulated']} of {folded['microbatches']}" if folded.get("folded")
                            else f"all ({(folded.get('reason') or fold_time)[:60]})" if fold_time == "auto" else "all")
                    same = "" if len(digests) < 2 else ("identical" if digests[0] == digests[1] else "DIFFERENT")
                    print(f"| {name} | {fold} | {fold_time} | {r['simulated_ranks']:,} | {kept} | {r['wall']:.1f} | "
                          f"{r['generating']:.1f} | {r['rss_mb']:,.0f} ({r['worker_mb']:,.0f}) | {r['finish_ns']:,} | "
                          f"{r['tflops']:.0f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
