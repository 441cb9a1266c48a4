"""How long a training step takes to simulate: Llama 3 70B on 1,024 H100 and Llama 3.1 405B on
16,384 H100 (the layout Meta reports for Llama 3 405B pre-training: TP 8, CP 1, PP 16, DP 128,
16M tokens per step; "The Llama 3 Herd of Models", sec. 3.3, as quoted from Balaji's SC'24 talk
at https://glennklockwood.com/garden/llama-3.1).

    python benchmarks/training_speed.py            # both, folded (the default), fresh traces
    python benchmarks/training_speed.py --fold-off # also 1,024 GPUs with every rank simulated

Wall time counts everything `chakra-sim run` does for a job manifest: generating the traces of
one rank per pipeline stage, building the layers, simulating, building the results; peak memory
is the process's maximum resident set.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chakra_core import run as runner  # noqa: E402

JOBS: dict[str, dict[str, Any]] = {
    "llama3-70b on 1,024 H100 (TP 4, PP 8, VP 5, DP 32, GBS 2048, FP8)": {
        "model": "llama3-70b", "parallel": {"tp": 4, "pp": 8, "vp": 5},
        "training": {"seq": 8192, "global_batch": 2048, "precision": "fp8"},
        "cluster": {"gpus": 1024, "profile": "h100-hgx-ndr400"}},
    "llama3.1-405b on 16,384 H100 (TP 8, PP 16, DP 128, GBS 2048, BF16)": {
        "model": "llama3.1-405b", "parallel": {"tp": 8, "pp": 16, "account_for_embedding_and_loss": True},
        "training": {"seq": 8192, "global_batch": 2048},
        "cluster": {"gpus": 16384, "profile": "h100-hgx-roce400"}},
}


def measure(job: dict[str, Any], out: Path, fold: str) -> tuple[float, dict[str, Any]]:
    manifest = {"job": {"name": "step", **job}, "workload": {"fold": fold}, "output": {"dir": str(out)},
                "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
    started = time.perf_counter()
    result = runner.simulate(runner.load(manifest, base_dir=out))
    return time.perf_counter() - started, result.document


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fold-off", action="store_true", help="also simulate the 1,024-GPU job unfolded")
    args = parser.parse_args()
    print("| job | fold | simulated ranks | wall s | step s | TFLOP/s per GPU |")
    print("|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for index, (name, job) in enumerate(JOBS.items()):
            folds = ["auto", "off"] if args.fold_off and index == 0 else ["auto"]
            for fold in folds:
                wall, results = measure(job, Path(tmp) / f"{index}-{fold}", fold)
                training = results["training"]
                print(f"| {name} | {fold} | {results['folding']['simulated_ranks']:,} | {wall:.1f} | "
                      f"{training['step_time_s']:.3f} | {training['tflops_per_gpu']:.0f} |", flush=True)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak resident memory of the process: {peak_mb:,.0f} MB")


if __name__ == "__main__":
    main()
