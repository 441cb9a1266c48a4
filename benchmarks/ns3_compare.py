#!/usr/bin/env python3
"""Packet level (ns-3, `network: ns3`) against flow level (`congestion`, `mode: fair`).

    python benchmarks/ns3_compare.py [--json FILE] [--scenarios NAME ...] [--scale 1.0]

Each scenario runs the same traces on the same network description (a generated fat-tree with
D-mod-k routes, 50 GB/s and 500 ns per link) through both backends, each run in a fresh
process. The ns-3 run's wall time includes loading ns-3 (about 2 s). Prints scenario, hosts,
bytes sent, finish times, their difference ((ns3 - fair) / fair) and wall times. Needs
`pip install ns3` and `pip install -e plugins/network_ns3`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

from chakra_core.schema import pb  # noqa: E402
from chakra_core.testing import collective, manifest, recv, send, write_ranks  # noqa: E402

MIB = 1 << 20
BW, LAT = 50, 500


def fat_tree(hosts: int, radix: int, oversubscription: float = 1.0) -> dict[str, Any]:
    return {"kind": "fat_tree", "hosts": hosts, "radix": radix, "tiers": 2, "oversubscription": oversubscription,
            "bandwidth_gbps": BW, "latency_ns": LAT, "ecmp": "dmodk"}


def scenario(name: str, folder: Path, scale: float) -> tuple[str, dict[str, Any], dict[str, Any], int]:
    """(description, the network description, the rest of the manifest, hosts)."""
    size = lambda mib: int(mib * scale * MIB)   # noqa: E731
    system: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    if name == "ring-allreduce":
        hosts, network = 64, {"generator": fat_tree(64, 16)}
        ranks = [[collective(1, pb.ALL_REDUCE, size(64))]] * hosts
        what = f"ring all-reduce of {size(64) / MIB:g} MiB, 64 hosts, 8 leaves x 8 spines"
        system = {"all-reduce-implementation": ["ring"]}
    elif name == "alltoall-oversub":
        hosts, network = 128, {"generator": fat_tree(128, 16, 3.0)}
        ranks = [[collective(1, pb.ALL_TO_ALL, size(16))]] * hosts
        what = f"direct all-to-all of {size(16) / MIB:g} MiB per host, 128 hosts, 12 per leaf, 4 spines (3:1)"
        system = {"all-to-all-implementation": ["direct"]}
    elif name == "two-groups-spine":
        hosts, network = 96, {"generator": fat_tree(96, 16, 3.0)}
        leaves, per_leaf = 8, 12
        # group a: the first 6 hosts of every leaf, b: the last 6; members ordered leaf by leaf so
        # every ring step crosses from one leaf to the next, through the 4 spines both groups share
        a = [leaf * per_leaf + j for j in range(6) for leaf in range(leaves)]
        b = [leaf * per_leaf + j for j in range(6, 12) for leaf in range(leaves)]
        ranks = [[collective(1, pb.ALL_REDUCE, size(32), pg_name="a" if h in a else "b")] for h in range(hosts)]
        extra = {"comm_groups": {"a": a, "b": b}}
        what = f"two concurrent ring all-reduces of {size(32) / MIB:g} MiB (48 hosts each), rings across 4 shared spines"
        system = {"all-reduce-implementation": ["ring"]}
    elif name == "incast":
        hosts, network = 64, {"generator": fat_tree(64, 16)}
        ranks = [[recv(s, src=s, size=size(4)) for s in range(1, hosts)]]
        ranks += [[send(1, dst=0, size=size(4))] for _ in range(1, hosts)]
        what = f"63 hosts send {size(4) / MIB:g} MiB each to host 0"
    elif name == "failed-links":
        hosts = 64
        network = {"generator": fat_tree(64, 16),
                   "failed_links": ["leaf0<->spine0", "leaf1<->spine0", "leaf2->spine3"]}
        ranks = [[collective(1, pb.ALL_TO_ALL, size(16))]] * hosts
        what = (f"direct all-to-all of {size(16) / MIB:g} MiB per host, 64 hosts, 8 spines, leaf0/leaf1<->spine0, "
                "leaf2->spine3 failed")
        system = {"all-to-all-implementation": ["direct"]}
    else:
        raise SystemExit(f"unknown scenario {name}")
    prefix = write_ranks(folder, ranks)
    return what, network, {"prefix": prefix, "system": system, "extra": extra}, hosts


_CHILD = r"""
import json, sys, time
from pathlib import Path
started = time.perf_counter()
from chakra_core.plugins import make_plugin_host
from chakra_core.run import load, simulate
data = json.loads(sys.argv[1])
host = make_plugin_host()
results = simulate(load(data, host, base_dir=Path.cwd(), name="ns3-compare"), host).document
summary = results["layers"]["network"]["summary"]
keep = ("messages", "message_bytes", "link_bytes", "drops", "late_sends", "max_late_ns", "connections",
        "window_bytes", "wire_bytes")
top = summary["hottest_links"][0]
print(json.dumps({"wall_s": time.perf_counter() - started, "finish_ns": results["finish_ns"],
                  **{k: summary[k] for k in keep if k in summary},
                  "hottest": {k: top[k] for k in ("link", "bytes", "peak_queue_packets") if k in top}}))
"""


def run(data: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONHASHSEED="0")
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(data)], capture_output=True, text=True,
                         cwd=ROOT, env=env)
    if out.returncode:
        raise SystemExit(f"run failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


SCENARIOS = ["ring-allreduce", "alltoall-oversub", "two-groups-spine", "incast", "failed-links"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", default=SCENARIOS, choices=SCENARIOS)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every message size")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for name in args.scenarios:
        with tempfile.TemporaryDirectory(prefix="chakra-ns3-") as tmp:
            what, network, rest, hosts = scenario(name, Path(tmp), args.scale)
            runs = {}
            for plugin, keys in (("ns3", {}), ("congestion", {"mode": "fair"})):
                data = manifest(rest["prefix"], {"plugin": plugin, **keys, **network}, system=rest["system"],
                                **rest["extra"])
                runs[plugin] = run(data)
            packet, flow = runs["ns3"], runs["congestion"]
            rows.append({"scenario": name, "description": what, "hosts": hosts,
                         "bytes": flow["message_bytes"], "ns3_ns": packet["finish_ns"], "fair_ns": flow["finish_ns"],
                         "difference_pct": round(100 * (packet["finish_ns"] - flow["finish_ns"]) / flow["finish_ns"], 2),
                         "ns3_wall_s": round(packet["wall_s"], 2), "fair_wall_s": round(flow["wall_s"], 2),
                         "ns3": packet, "fair": flow})
            row = rows[-1]
            print(f"{name}: ns3 {row['ns3_ns']:,} ns, fair {row['fair_ns']:,} ns ({row['difference_pct']:+.1f}%)",
                  file=sys.stderr, flush=True)
    header = (f"{'scenario':<18} {'hosts':>5} {'bytes':>15} {'ns-3 (ns)':>13} {'fair (ns)':>13} {'diff':>8} "
              f"{'ns-3 wall s':>11} {'fair wall s':>11}")
    print(header)
    print("-" * len(header))
    for row in rows:
        print(f"{row['scenario']:<18} {row['hosts']:>5} {row['bytes']:>15,} {row['ns3_ns']:>13,} "
              f"{row['fair_ns']:>13,} {row['difference_pct']:>+7.1f}% {row['ns3_wall_s']:>11.1f} "
              f"{row['fair_wall_s']:>11.1f}")
    print()
    for row in rows:
        p = row["ns3"]
        print(f"{row['scenario']}: {row['description']}; ns-3: {p['connections']:,} connections, "
              f"{p['drops']} drops, {p['late_sends']:,} of {p['messages']:,} sends late (max {p['max_late_ns']} ns), "
              f"hottest link {p['hottest']['link']} peak queue {p['hottest'].get('peak_queue_packets', 0):,} packets")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
