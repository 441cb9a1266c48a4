#!/usr/bin/env python3
"""Speed and memory on ASTRA-sim's scale anchor: 64 ranks x 1,971 nodes, 648 all-reduces per rank.

Generates the workload with ../shared/bench/gen_scale_trace.py (64 ranks,
2,000 nodes per rank) and runs it with the settings of ../shared/ref-results
(system sys_ring_roofline.json: ring collectives, 4 splits, 1 active chunk,
roofline 100 TFLOP/s and 1600 GB/s; network Ring_64npus.yml or
Switch_64npus.yml), each case in a fresh process:

- congestion-unaware (`analytical`), every rank simulated (`fold: off`) and
  folded (the 64 ranks run the same trace: one class);
- congestion-aware (`congestion`, fifo), with the closed form (default) and,
  with --message-level, message by message (slow: about 80 s each);
- with --nccl PROFILE, also the `nccl` system layer on that hardware profile (its
  own times, not ASTRA-sim's: the speed of the layer on the same workload).

Prints wall time, peak memory (max RSS of the simulating process), simulated
finish time and nodes per second beside ASTRA-sim's figures, and whether
the runs of a network gave identical results.

    python benchmarks/scale.py [--repeat 3] [--message-level] [--nccl h100-hgx-ndr400] [--json out.json]
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
from chakra_core.config.astra import astra_manifest
from chakra_core.plugins import make_plugin_host

SHARED = ROOT.parent / "shared"
CONFIGS = SHARED / "ref-results" / "configs"

# ../shared/ref-results/README.md, "Speed and scale anchor" (ASTRA-sim 518bd513, 2-core machine).
ASTRA = {
    ("Ring_64npus", "analytical"): {"wall_s": 45.1, "rss_mb": 173, "finish_ns": 913_537_872},
    ("Ring_64npus", "congestion"): {"wall_s": 58.0, "rss_mb": 173, "finish_ns": 913_537_872},
    ("Switch_64npus", "analytical"): {"wall_s": 51.3, "rss_mb": 173, "finish_ns": 1_076_833_872},
    ("Switch_64npus", "congestion"): {"wall_s": 61.9, "rss_mb": 173, "finish_ns": 1_500_260_400},
}


def generate(out_dir: Path, ranks: int = 64, nodes: int = 2000) -> str:
    generator = SHARED / "bench" / "gen_scale_trace.py"
    if not generator.exists():
        sys.exit(f"{generator} not found: this benchmark needs ../shared beside the checkout")
    subprocess.run([sys.executable, str(generator), "--out", str(out_dir), "--ranks", str(ranks),
                    "--nodes-per-rank", str(nodes)], check=True, stdout=subprocess.DEVNULL)
    return str(out_dir / "scale")


def scale_manifest(prefix: str, network_file: str, backend: str, fold: str = "auto",
                   closed_form: bool = True, feeder: str = "streaming") -> dict:
    data = astra_manifest(make_plugin_host(), prefix, str(CONFIGS / "sys_ring_roofline.json"), network_file,
                          network_plugin=backend)
    data["workload"].update({"feeder": feeder, "fold": fold})
    if not closed_form:
        data["network"]["closed_form"] = False
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the best wall time is kept")
    parser.add_argument("--message-level", action="store_true",
                        help="also run the congestion-aware cases message by message (slow)")
    parser.add_argument("--feeder", choices=["streaming", "memory"], default="streaming")
    parser.add_argument("--nccl", metavar="PROFILE",
                        help="also run the nccl system layer with this hardware profile")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()

    cases = []
    for network in ("Ring_64npus", "Switch_64npus"):
        cases.append((network, "analytical", "every rank", {"fold": "off"}))
        cases.append((network, "analytical", "folded", {"fold": "auto"}))
        cases.append((network, "congestion", "closed form", {}))
        if args.message_level:
            cases.append((network, "congestion", "message by message", {"closed_form": False}))
    rows = []
    with tempfile.TemporaryDirectory(prefix="chakra-scale-") as tmp:
        prefix = generate(Path(tmp))
        for network, backend, how, options in cases:
            data = scale_manifest(prefix, str(CONFIGS / f"{network}.yml"), backend, feeder=args.feeder, **options)
            runs = [measure(data) for _ in range(1 if how == "message by message" else args.repeat)]
            best = min(runs, key=lambda r: r["wall_s"])
            rows.append({"network": network, "backend": backend, "how": how, **best,
                         "rss_mb": max(r["rss_mb"] for r in runs),
                         "deterministic": len({r["results_digest"] for r in runs}) == 1,
                         "nodes_per_s": best["nodes"] / best["wall_s"], "astra": ASTRA[(network, backend)]})

    print(f"scale workload: 64 ranks x 1,971 nodes, feeder={args.feeder}, best of {args.repeat}, "
          f"{os.cpu_count()} CPU(s)")
    header = (f"{'network':<14} {'backend':<11} {'how':<19} {'wall s':>7} {'ASTRA s':>8} {'speedup':>8} "
              f"{'RSS MB':>7} {'finish ns':>14} {'ASTRA finish':>14} {'nodes/s':>10}")
    print(header)
    print("-" * len(header))
    for row in rows:
        astra = row["astra"]
        print(f"{row['network']:<14} {row['backend']:<11} {row['how']:<19} {row['wall_s']:>7.2f} "
              f"{astra['wall_s']:>8.1f} {astra['wall_s'] / row['wall_s']:>7.1f}x {row['rss_mb']:>7.0f} "
              f"{row['finish_ns']:>14,} {astra['finish_ns']:>14,} {row['nodes_per_s']:>10,.0f}")
    for network in ("Ring_64npus", "Switch_64npus"):
        for backend in ("analytical", "congestion"):
            digests = {r["results_digest"] for r in rows if r["network"] == network and r["backend"] == backend}
            print(f"{network} {backend}: {'identical results' if len(digests) == 1 else 'RESULTS DIFFER'} "
                  f"across {sum(1 for r in rows if r['network'] == network and r['backend'] == backend)} case(s)")
    if args.nccl:
        with tempfile.TemporaryDirectory(prefix="chakra-scale-") as tmp:
            prefix = generate(Path(tmp))
            data = {"workload": {"trace": prefix, "feeder": args.feeder},
                    "system": {"plugin": "nccl", "profile": args.nccl}}
            runs = [measure(data) for _ in range(args.repeat)]
        best = min(runs, key=lambda r: r["wall_s"])
        print(f"nccl system layer ({args.nccl}): {best['wall_s']:.2f} s, {max(r['rss_mb'] for r in runs):.0f} MB, "
              f"finish {best['finish_ns']:,} ns, {best['nodes'] / best['wall_s']:,.0f} nodes/s, "
              f"{'deterministic' if len({r['results_digest'] for r in runs}) == 1 else 'RESULTS DIFFER'}")
    if not all(r["deterministic"] for r in rows):
        print("WARNING: repeated runs gave different results")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
