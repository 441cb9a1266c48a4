#!/usr/bin/env python3
"""ECMP on a fat-tree: a direct all-to-all's finish time against the injection bound, link loads per tier.

    python benchmarks/ecmp_fat_tree.py [--k 16] [--size-mib 1] [--mode fifo|fair] [--json out.json]

Runs, in this process, the all-to-all of benchmarks/network_scale.py
("fat-tree all-to-all": k-ary fat-tree, k^3/4 NPUs, 50 GB/s and 500 ns per
link, `direct` algorithm, SIZE per NPU) and prints:

- the simulated finish time and the wall time of the run;
- the injection bound, a lower bound no routing can beat: each NPU's one
  link into the fabric carries every byte it sends, so its messages
  serialise back to back there (sum of int(size / bandwidth), the
  simulator's whole-ns rounding); the last of them then still needs that
  link's latency and at least one more link (int(latency + size /
  bandwidth)) to reach any other NPU. The bound is the largest over NPUs;
- per link tier (host->edge, edge->agg, agg->core, core->agg, agg->edge,
  edge->host): the min, mean and max bytes a link carried and how many
  links carried none. On a non-blocking fat-tree with balanced routing
  every tier is flat and the finish time is near the bound.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chakra_core.schema import pb  # noqa: E402
from chakra_core.testing import collective, manifest, simulate, write_ranks  # noqa: E402

BANDWIDTH_GBPS, LATENCY_NS = 50, 500
TIERS = [("npu", "edge"), ("edge", "agg"), ("agg", "core"), ("core", "agg"), ("agg", "edge"), ("edge", "npu")]
TIER_NAMES = {("npu", "edge"): "host->edge", ("edge", "npu"): "edge->host"}


def tier_of(link: str) -> tuple[str, str]:
    """('edge', 'agg') for 'edge3.1->agg3.0': the device kinds at both ends (names from topology.fat_tree)."""
    src, dst = link.split("->")
    return src.rstrip("0123456789."), dst.rstrip("0123456789.")


def injection_bound(rows: list[dict], bandwidth_bpns: float, latency_ns: float) -> int:
    """The lower bound described in the module docstring, from the NPUs' host->edge link rows."""
    bound = 0
    for row in rows:
        if tier_of(row["link"]) != ("npu", "edge") or not row["messages"]:
            continue
        size = row["bytes"] // row["messages"]
        if size * row["messages"] != row["bytes"]:
            raise SystemExit(f"{row['link']}: messages of unequal size; the bound assumes equal ones")
        serialise = row["messages"] * int(size / bandwidth_bpns)
        bound = max(bound, serialise + int(latency_ns) + int(latency_ns + size / bandwidth_bpns))
    return bound


def tier_table(rows: list[dict]) -> list[dict]:
    table = []
    for tier in TIERS:
        loads = [r["bytes"] for r in rows if tier_of(r["link"]) == tier]
        table.append({"tier": TIER_NAMES.get(tier, "->".join(tier)), "links": len(loads), "min": min(loads),
                      "mean": sum(loads) / len(loads), "max": max(loads),
                      "zero": sum(1 for load in loads if load == 0)})
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=16, help="fat-tree radix (k^3/4 NPUs); default 16")
    parser.add_argument("--size-mib", type=float, default=1.0, help="all-to-all bytes per NPU, MiB")
    parser.add_argument("--mode", choices=["fifo", "fair"], default="fifo")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    npus, size = args.k ** 3 // 4, int(args.size_mib * (1 << 20))
    network = {"plugin": "congestion", "mode": args.mode,
               "generator": {"kind": "fat_tree", "k": args.k, "bandwidth_gbps": BANDWIDTH_GBPS,
                             "latency_ns": LATENCY_NS}}
    with tempfile.TemporaryDirectory(prefix="chakra-ecmp-") as tmp:
        prefix = write_ranks(Path(tmp), [[collective(1, pb.ALL_TO_ALL, size)]] * npus)
        started = time.perf_counter()
        results = simulate(manifest(prefix, network, system={"all-to-all-implementation": ["direct"]}))
        wall = time.perf_counter() - started
    summary = results["layers"]["network"]["summary"]
    rows = summary["hottest_links"]
    bound = injection_bound(rows, BANDWIDTH_GBPS, LATENCY_NS)   # generator GB = 10^9 B: 50 GB/s = 50 B/ns
    finish = results["finish_ns"]
    tiers = tier_table(rows)
    print(f"fat-tree k={args.k} ({npus:,} NPUs), direct all-to-all of {args.size_mib:g} MiB per NPU, "
          f"{BANDWIDTH_GBPS} GB/s, {LATENCY_NS} ns, mode={args.mode}")
    print(f"finish          {finish:>12,} ns   {finish / bound:.2f} x the injection bound")
    print(f"injection bound {bound:>12,} ns")
    print(f"wall time       {wall:>12.1f} s    ({summary['messages']:,} messages)")
    header = (f"{'tier':<11} {'links':>6} {'min B':>11} {'mean B':>11} {'max B':>11} {'max/min':>8} "
              f"{'0 B links':>9}")
    print(header)
    print("-" * len(header))
    for t in tiers:
        spread = f"{t['max'] / t['min']:.2f}" if t["min"] else "inf"
        print(f"{t['tier']:<11} {t['links']:>6} {t['min']:>11,} {t['mean']:>11,.0f} {t['max']:>11,} "
              f"{spread:>8} {t['zero']:>9}")
    if args.json:
        args.json.write_text(json.dumps({"k": args.k, "npus": npus, "mode": args.mode, "finish_ns": finish,
                                         "injection_bound_ns": bound, "wall_s": wall,
                                         "messages": summary["messages"], "tiers": tiers}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
