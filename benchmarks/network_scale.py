#!/usr/bin/env python3
"""Congestion-aware backend at 1,024 NPUs: a fat-tree all-to-all and a ring all-reduce.

    python benchmarks/network_scale.py [--npus 1024] [--size-mib 1] [--mode fifo|fair] [--generator JSON] [--repeat N]
    python benchmarks/network_scale.py --growth [--mode fifo|fair] [--growth-npus 64 256 1024 4096]

Runs, each in a fresh process:
- all-to-all of SIZE per NPU, `direct` algorithm, on a k-ary fat-tree
  (k = 16 gives 1,024 NPUs; 50 GB/s links, 500 ns), or on the congestion
  backend's `--generator` (JSON, e.g. '{"kind": "rail_optimized", ...}') of
  --npus NPUs;
- ring all-reduce of SIZE on a 1-D ring of the same number of NPUs (50 GB/s, 500 ns),
  with the closed form (each NPU's ring links carry only its messages, so the whole
  collective is timed without events) and message by message (`closed_form: false`);

and prints wall time, peak RSS, simulated finish time, messages (network-level
flows, one per send), messages per second, how many of them the closed form timed,
and events. `--repeat N` runs each case N times, each in a fresh process, and prints the
median wall time with the range (a shared host's speed varies by a third from run to run),
the largest RSS, and checks that every repeat gives the same results.

`--growth` runs the all-to-all and the closed-form ring all-reduce at each of
--growth-npus NPUs instead, the all-to-all on a fat-tree of radix-32 switches
(3 tiers, D-mod-k, the same links) sized to the NPUs, and prints how wall time and
memory grow against the messages.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from _measure import ROOT, measure

sys.path.insert(0, str(ROOT))

from chakra_core.schema import pb  # noqa: E402
from tests.simhelpers import collective, manifest, write_ranks  # noqa: E402

MESSAGE_LEVEL = "message by message"
CASES = ["fat-tree all-to-all", "ring all-reduce", f"ring all-reduce, {MESSAGE_LEVEL}"]


def case_manifest(case: str, npus: int, size: int, mode: str, folder: Path, generator: dict | None = None) -> dict:
    """Write the case's trace (one collective per NPU) into `folder`; return its manifest."""
    if case == "fat-tree all-to-all" and generator is not None:
        network = {"plugin": "congestion", "mode": mode, "generator": generator}
        comm, system = pb.ALL_TO_ALL, {"all-to-all-implementation": ["direct"]}
    elif case == "fat-tree all-to-all":
        k = round((4 * npus) ** (1 / 3))
        if k ** 3 // 4 != npus:
            sys.exit(f"{npus} NPUs is not k^3/4 for an even k")
        network = {"plugin": "congestion", "mode": mode,
                   "generator": {"kind": "fat_tree", "k": k, "bandwidth_gbps": 50, "latency_ns": 500}}
        comm, system = pb.ALL_TO_ALL, {"all-to-all-implementation": ["direct"]}
    else:
        network = {"plugin": "congestion", "mode": mode, "topology": ["Ring"], "npus_count": [npus],
                   "bandwidth": [50], "latency": [500]}
        if case.endswith(MESSAGE_LEVEL):
            network["closed_form"] = False
        comm, system = pb.ALL_REDUCE, {"all-reduce-implementation": ["ring"]}
    prefix = write_ranks(folder, [[collective(1, comm, size)]] * npus)
    return manifest(prefix, network, system=system)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npus", type=int, default=1024)
    parser.add_argument("--size-mib", type=float, default=1.0)
    parser.add_argument("--mode", choices=["fifo", "fair"], default="fifo")
    parser.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    parser.add_argument("--generator", type=json.loads,
                        help="the all-to-all's network generator instead of the k-ary fat-tree (JSON; --npus NPUs)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--growth", action="store_true", help="cost growth over --growth-npus NPUs")
    parser.add_argument("--growth-npus", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--repeat", type=int, default=1, help="runs of each case (median wall time, range)")
    args = parser.parse_args()
    size = int(args.size_mib * (1 << 20))
    if args.growth:
        return growth(args.growth_npus, size, args.mode, args.json)
    rows = []
    for case in args.cases:
        runs = []
        for _ in range(max(1, args.repeat)):
            with tempfile.TemporaryDirectory(prefix="chakra-net-") as tmp:
                runs.append(measure(case_manifest(case, args.npus, size, args.mode, Path(tmp), args.generator)))
        if len({run["results_digest"] for run in runs}) > 1:
            sys.exit(f"{case}: repeats gave different results")
        walls = sorted(run["wall_s"] for run in runs)
        rows.append({"case": case, **runs[0], "wall_s": statistics.median(walls), "walls_s": walls,
                     "rss_mb": max(run["rss_mb"] for run in runs)})
    print(f"congestion backend, mode={args.mode}, {args.npus} NPUs, {args.size_mib} MiB per NPU"
          + (f", median of {args.repeat} runs" if args.repeat > 1 else ""))
    header = (f"{'case':<38} {'wall s':>8} {'range s':>10} {'RSS MB':>8} {'finish ns':>14} {'messages':>11} "
              f"{'msg/s':>11} {'closed form':>11} {'events':>11}")
    print(header)
    print("-" * len(header))
    for row in rows:
        spread = f"{row['walls_s'][0]:.1f}-{row['walls_s'][-1]:.1f}"
        print(f"{row['case']:<38} {row['wall_s']:>8.1f} {spread:>10} {row['rss_mb']:>8.0f} {row['finish_ns']:>14,} "
              f"{row['messages']:>11,} {row['messages'] / row['wall_s']:>11,.0f} "
              f"{row['closed_form_messages'] or 0:>11,} {row['events']:>11,}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


def growth(sizes: list[int], size: int, mode: str, json_out: Path | None) -> int:
    """The all-to-all and the ring all-reduce at each NPU count, and their growth from the first."""
    rows = []
    for npus in sizes:
        generator = {"kind": "fat_tree", "hosts": npus, "radix": 32, "tiers": 3, "ecmp": "dmodk",
                     "bandwidth_gbps": 50, "latency_ns": 500}
        for case in CASES[:2]:
            with tempfile.TemporaryDirectory(prefix="chakra-net-") as tmp:
                found = measure(case_manifest(case, npus, size, mode, Path(tmp), generator))
            rows.append({"case": case, "npus": npus, **found})
            print(f"  {case}, {npus} NPUs: {found['wall_s']:.1f} s", file=sys.stderr)
    print(f"congestion backend, mode={mode}, {size / (1 << 20)} MiB per NPU: cost growth")
    header = (f"{'case':<22} {'NPUs':>6} {'wall s':>8} {'RSS MB':>8} {'finish ns':>14} {'messages':>12} "
              f"{'wall x':>8} {'messages x':>11} {'us/message':>11}")
    print(header)
    print("-" * len(header))
    for row in rows:
        first = next(r for r in rows if r["case"] == row["case"])
        print(f"{row['case'][:22]:<22} {row['npus']:>6,} {row['wall_s']:>8.2f} {row['rss_mb']:>8.0f} "
              f"{row['finish_ns']:>14,} {row['messages']:>12,} {row['wall_s'] / first['wall_s']:>8.1f} "
              f"{row['messages'] / first['messages']:>11.0f} {1e6 * row['wall_s'] / row['messages']:>11.3f}")
    if json_out:
        json_out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
