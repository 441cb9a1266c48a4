#!/usr/bin/env python3
"""SIGTERM halfway through a 1,000-point local sweep, then resume: what is left, and the table.

The sweep: examples/allreduce_8npu.yaml (ASTRA-sim's 8-NPU 1 MiB all-reduce) at 1,000 link
bandwidths, its traces gzip-compressed so that every point's worker decompresses them into a
temporary folder. The script

1. runs the sweep uninterrupted (the reference table);
2. runs it again into another folder and sends SIGTERM once half the points are finished;
3. checks: exit status 143, no process the sweep started still running, no temporary file
   left in the system temp folder (entries named chakra-sim*, new since the start) or in the
   output folder (*.tmp, the lock file);
4. resumes the interrupted sweep and compares its sweep.csv, byte for byte but for the
   wall_s column (each point's own wall time, which no two runs share), and its sweep.png
   with the reference.

    python benchmarks/sweep_interrupt.py [--points 1000] [--workers 2]

Prints each check and the timings; exit status 0 when every check passes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.sweep_processes import descendants, finished_points, gzip_traces, running, table_without_wall  # noqa: E402

CHAKRA_SIM = [sys.executable, "-m", "chakra_core.cli", "sweep"]
TEMP_PREFIX = "chakra-sim"
"""What the sweep's temporary files in the system temp folder are named (its workers' folder,
the streaming feeder's decompressed traces)."""


def sweep(path: Path, out: Path, workers: int) -> subprocess.Popen[str]:
    return subprocess.Popen([*CHAKRA_SIM, str(path), "--out", str(out), "--workers", str(workers), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    system_temp = Path(tempfile.gettempdir())
    ours_before = {p.name for p in system_temp.iterdir() if p.name.startswith(TEMP_PREFIX)}
    checks: list[tuple[str, bool, str]] = []
    work = Path(tempfile.mkdtemp(prefix="sweep-interrupt-bench-"))
    try:
        path = work / "sweep.yaml"
        path.write_text(yaml.safe_dump({
            "base": str(ROOT / "examples" / "allreduce_8npu.yaml"),
            "grid": {"workload.trace": [gzip_traces(work / "traces")],
                     "network.bandwidth[0]": [10 + i for i in range(args.points)]}}))
        whole, out = work / "whole", work / "interrupted"

        started = time.perf_counter()
        reference = sweep(path, whole, args.workers)
        reference.communicate()
        uninterrupted_s = time.perf_counter() - started
        if reference.returncode != 0:
            print(f"the uninterrupted sweep failed (exit status {reference.returncode})")
            return 1

        started = time.perf_counter()
        interrupted = sweep(path, out, args.workers)
        while finished_points(out) < args.points // 2 and interrupted.poll() is None:
            time.sleep(0.05)
        processes = descendants(interrupted.pid)
        done_at_signal = finished_points(out)
        signalled = time.perf_counter()
        interrupted.send_signal(signal.SIGTERM)
        _, stderr = interrupted.communicate()
        stop_s = time.perf_counter() - signalled
        before_signal_s = signalled - started
        time.sleep(0.5)   # the last children reaped by init
        left = sorted(pid for pid in processes if running(pid))
        checks.append(("exit status 143", interrupted.returncode == 143, f"exit status {interrupted.returncode}"))
        checks.append(("no process of the sweep left", not left and bool(processes),
                       f"{len(processes)} child process(es) before SIGTERM, {len(left)} running after"))
        temp_left = sorted(p.name for p in system_temp.iterdir()
                           if p.name.startswith(TEMP_PREFIX) and p.name not in ours_before)
        checks.append(("no temp file left in the system temp folder", not temp_left,
                       f"{system_temp}: {', '.join(temp_left) or 'nothing new named chakra-sim*'}"))
        out_left = sorted(str(p.relative_to(out)) for p in out.rglob("*")
                          if p.name.endswith(".tmp") or p.name == ".chakra-sim.lock")
        checks.append(("no temp file left in the output folder", not out_left,
                       ", ".join(out_left) or "no *.tmp, no lock file"))

        started = time.perf_counter()
        resumed = sweep(path, out, args.workers)
        stdout, _ = resumed.communicate()
        resume_s = time.perf_counter() - started
        summary = next((line for line in stdout.splitlines() if " points: " in line), stdout.strip())
        checks.append(("resumed sweep succeeds", resumed.returncode == 0, summary))
        same_table = table_without_wall(out) == table_without_wall(whole)
        checks.append(("sweep.csv identical to the uninterrupted run's (but for wall_s)", same_table,
                       f"{len(table_without_wall(out))} bytes"))
        same_plot = (out / "sweep.png").read_bytes() == (whole / "sweep.png").read_bytes()
        checks.append(("sweep.png identical", same_plot, ""))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"{args.points}-point local sweep (8-NPU all-reduce, gzip traces), {args.workers} workers, "
          f"{os.cpu_count()} CPU(s)")
    print(f"uninterrupted run                 {uninterrupted_s:7.2f} s")
    print(f"interrupted run until SIGTERM     {before_signal_s:7.2f} s  ({done_at_signal} points finished)")
    print(f"SIGTERM to exit                   {stop_s:7.2f} s")
    print(f"resumed run                       {resume_s:7.2f} s")
    for name, ok, detail in checks:
        print(f"[{'ok' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else ""))
    if "interrupted by SIGTERM" not in stderr:
        print(f"(the interrupted sweep said: {stderr.strip()})")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
