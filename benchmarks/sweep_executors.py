#!/usr/bin/env python3
"""The same 24-point sweep on the local process pool and on a local Ray instance.

The sweep: examples/allreduce_8npu.yaml (ASTRA-sim's 8-NPU 1 MiB all-reduce)
over bandwidth (25, 50, 100 GB/s) x latency (100, 500 ns) x chunks (1, 4) x
network backend (analytical, congestion). Prints each executor's wall time,
from the first point submitted to the table written (Ray: once with starting
the local instance, once on an instance already running), and whether the
tables are identical but for the wall-time column.

    python benchmarks/sweep_executors.py [--workers 2] [--repeat 3] [--json out.json]

Needs Ray (pip install 'chakra-sim[ray]'; requirements-dev.txt installs it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
GRID = {"network.bandwidth[0]": [25, 50, 100], "network.latency[0]": [100, 500],
        "system.preferred-dataset-splits": [1, 4], "network.plugin": ["analytical", "congestion"]}


def timed(run) -> tuple[float, list[dict]]:
    started = time.perf_counter()
    result = run()
    wall = time.perf_counter() - started
    assert result.failed == 0 and result.ran == len(result.rows), "every point must run and succeed"
    return wall, [{k: v for k, v in row.items() if k != "wall_s"} for row in result.rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="points at once, on both executors")
    parser.add_argument("--repeat", type=int, default=3, help="runs per executor; the best wall time is kept")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    try:
        import ray
    except ImportError:
        sys.exit("this benchmark needs Ray: pip install 'chakra-sim[ray]'")
    from chakra_core.sweep import load_sweep, run_sweep

    figures: dict[str, list[float]] = {"local": [], "ray, starting a local instance": [],
                                       "ray, instance already running": []}
    tables = []
    with tempfile.TemporaryDirectory(prefix="chakra-sweep-bench-") as tmp:
        path = Path(tmp) / "sweep.yaml"
        path.write_text(yaml.safe_dump({"base": str(ROOT / "examples" / "allreduce_8npu.yaml"), "grid": GRID}))

        def sweep(name: str, executor: str):
            return lambda: run_sweep(load_sweep(path, Path(tmp) / name), executor=executor,
                                     workers=args.workers, force=True)

        for _ in range(args.repeat):
            for label, name, executor in (("local", "local", "local"),
                                          ("ray, starting a local instance", "ray", "ray")):
                wall, rows = timed(sweep(name, executor))
                figures[label].append(wall)
                tables.append(rows)
        ray.init(num_cpus=args.workers, include_dashboard=False, logging_level="WARNING")
        try:
            for _ in range(args.repeat):
                wall, rows = timed(sweep("ray-running", "ray"))
                figures["ray, instance already running"].append(wall)
                tables.append(rows)
        finally:
            ray.shutdown()

    identical = all(table == tables[0] for table in tables)
    print(f"24-point sweep of examples/allreduce_8npu.yaml, {args.workers} workers, best of {args.repeat}, "
          f"{os.cpu_count()} CPU(s)")
    print(f"{'executor':<32} {'wall s':>7} {'points/s':>9}")
    for label, walls in figures.items():
        print(f"{label:<32} {min(walls):>7.2f} {24 / min(walls):>9.1f}")
    print(f"tables identical (but for wall_s) across executors and runs: {'yes' if identical else 'NO'}")
    if args.json:
        best = {label: min(walls) for label, walls in figures.items()}
        args.json.write_text(json.dumps({"workers": args.workers, "best_wall_s": best, "identical": identical},
                                        indent=2) + "\n")
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
