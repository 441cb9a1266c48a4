#!/usr/bin/env python3
"""Speed and memory on ASTRA-sim's scale anchor: 64 ranks x 1,971 nodes, 648 all-reduces per rank.

Generates the workload with ../shared/bench/gen_scale_trace.py (64 ranks,
2,000 nodes per rank), runs it with the settings of ../shared/ref-results
(system sys_ring_roofline.json: ring collectives, 4 splits, 1 active chunk,
roofline 100 TFLOP/s and 1600 GB/s; network Ring_64npus.yml or
Switch_64npus.yml, congestion-unaware) and prints, per network: wall time,
peak memory (max RSS of the simulating process), simulated finish time and
nodes simulated per second, beside ASTRA-sim's figures.

    python benchmarks/scale.py [--repeat 3] [--feeder streaming|memory] [--json out.json]

Each run is a fresh Python process (benchmarks/_measure.py), so its RSS is
that of a user's run (interpreter included).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _measure import ROOT, measure
from chakra_core.cli import astra_manifest

SHARED = ROOT.parent / "shared"
CONFIGS = SHARED / "ref-results" / "configs"

# ../shared/ref-results/README.md, "Speed and scale anchor" (ASTRA-sim 518bd513, 2-core machine).
ASTRA = {
    "Ring_64npus": {"wall_s": 45.1, "rss_mb": 173, "finish_ns": 913_537_872},
    "Switch_64npus": {"wall_s": 51.3, "rss_mb": 173, "finish_ns": 1_076_833_872},
}


def generate(out_dir: Path) -> str:
    generator = SHARED / "bench" / "gen_scale_trace.py"
    if not generator.exists():
        sys.exit(f"{generator} not found: this benchmark needs ../shared beside the checkout")
    subprocess.run([sys.executable, str(generator), "--out", str(out_dir), "--ranks", "64",
                    "--nodes-per-rank", "2000"], check=True, stdout=subprocess.DEVNULL)
    return str(out_dir / "scale")


def run_once(prefix: str, network: str, feeder: str) -> dict:
    data = astra_manifest(prefix, str(CONFIGS / "sys_ring_roofline.json"), str(CONFIGS / f"{network}.yml"),
                          None, None, "analytical")
    data["workload"]["feeder"] = feeder
    return measure(data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per network; the best wall time is kept")
    parser.add_argument("--feeder", choices=["streaming", "memory"], default="streaming")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="chakra-scale-") as tmp:
        prefix = generate(Path(tmp))
        for network in ASTRA:
            runs = [run_once(prefix, network, args.feeder) for _ in range(args.repeat)]
            best = min(runs, key=lambda r: r["wall_s"])
            finishes = {r["finish_ns"] for r in runs}
            rows.append({"network": network, "feeder": args.feeder, **best,
                         "rss_mb": max(r["rss_mb"] for r in runs),
                         "deterministic": len(finishes) == 1,
                         "nodes_per_s": best["nodes"] / best["wall_s"],
                         "astra": ASTRA[network]})

    print(f"scale workload: 64 ranks x 1,971 nodes, congestion-unaware, feeder={args.feeder}, "
          f"best of {args.repeat}, {os.cpu_count()} CPU(s)")
    header = (f"{'network':<14} {'wall s':>7} {'ASTRA s':>8} {'speedup':>8} {'RSS MB':>7} {'ASTRA MB':>9} "
              f"{'finish ns':>14} {'ASTRA finish':>14} {'diff %':>7} {'nodes/s':>9}")
    print(header)
    print("-" * len(header))
    for row in rows:
        astra = row["astra"]
        diff = 100.0 * (row["finish_ns"] - astra["finish_ns"]) / astra["finish_ns"]
        print(f"{row['network']:<14} {row['wall_s']:>7.2f} {astra['wall_s']:>8.1f} "
              f"{astra['wall_s'] / row['wall_s']:>7.1f}x {row['rss_mb']:>7.0f} {astra['rss_mb']:>9} "
              f"{row['finish_ns']:>14,} {astra['finish_ns']:>14,} {diff:>7.3f} {row['nodes_per_s']:>9,.0f}")
    if not all(r["deterministic"] for r in rows):
        print("WARNING: repeated runs gave different finish times")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
