#!/usr/bin/env python3
"""How a job's cost grows with its GPUs (issue 33): Llama 3 70B laid out as
examples/llama3-70b-64gpu.yaml (TP 4, PP 4, VP 5, CP 2, FP8; 2 micro-batches per replica)
on 64 to 131,072 H100 (CHAKRA_SIM_MAX_RANKS), and 10,000,000 GPUs, which must be refused at once.

    python benchmarks/job_scale.py                  # 8,192, 32,768 and 131,072 GPUs, and 10,000,000
    python benchmarks/job_scale.py --gpus 131072    # one size

Each case is `chakra-sim run JOB --out DIR -q` in a fresh process and a fresh folder (the
traces of one rank per pipeline stage generated, the layers built, the step simulated, results
written: results.json's 131,072 rows included); wall s by the clock, peak memory the child's
maximum resident set.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

PER_REPLICA = 32      # TP 4 x PP 4 x CP 2 GPUs per data-parallel replica


def job(gpus: int, out: Path) -> dict[str, object]:
    dp = max(1, gpus // PER_REPLICA)
    return {"job": {"name": "llama3-70b", "model": "llama3-70b",
                    "parallel": {"tp": 4, "pp": 4, "vp": 5, "cp": 2, "tp_comm_overlap": True},
                    "training": {"seq": 8192, "global_batch": 4 * dp, "micro_batch": 1, "precision": "fp8"},
                    "cluster": {"gpus": gpus, "profile": "h100-hgx-ndr400"}},
            "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}, "output": {"dir": str(out)}}


_TIMED = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
          "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(done.returncode)")
"""Runs the command given and prints its peak RSS (KB) last on stderr: one child, so its own maximum."""


def run(gpus: int, folder: Path) -> tuple[float, float, int, str]:
    """(wall s, peak RSS in MB, exit code, its finish line or its error) of one run in a child process."""
    manifest = folder / f"job-{gpus}.yaml"
    manifest.write_text(yaml.safe_dump(job(gpus, folder / f"out-{gpus}")))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _TIMED, sys.executable, "-m", "chakra_core.cli", "run",
                           str(manifest), "--out", str(folder / f"out-{gpus}"), "-q"], capture_output=True, text=True)
    wall = time.perf_counter() - started
    *said, peak = done.stderr.strip().splitlines()
    shown = [line for line in done.stdout.splitlines() if line.startswith("finish:")] if done.returncode == 0 \
        else said[-1:]
    return wall, int(peak) / 1024, done.returncode, shown[0] if shown else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, action="append", help="GPUs (repeatable); default 8,192, 32,768, "
                                                                  "131,072 and 10,000,000")
    args = parser.parse_args()
    sizes = sorted(args.gpus or [8192, 32768, 131072, 10_000_000])
    print("| GPUs | wall s | peak RSS MB | outcome |")
    print("|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory(prefix="chakra-job-scale-") as tmp:
        for gpus in sizes:
            wall, rss, code, last = run(gpus, Path(tmp))
            outcome = f"simulated, {last}" if code == 0 else f"exit {code}: {last.strip()}"
            print(f"| {gpus:,} | {wall:.1f} | {rss:,.0f} | {outcome[:140]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
