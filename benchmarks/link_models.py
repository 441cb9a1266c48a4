#!/usr/bin/env python3
"""Which link model to believe: analytical, fifo (both forwardings) and fair on the same runs.

    python benchmarks/link_models.py [--size-mib 256] [--json FILE]

Every scenario runs on ASTRA-sim's network lists, which both the `analytical`
and the `congestion` backends read, so the links, bandwidths and latencies are
the same; only the link model changes:

- analytical: hops x latency + bytes / bandwidth per message, links never shared;
- fifo, store and forward (the default for these lists, as ASTRA-sim's
  congestion-aware backend): every hop serialises the whole message;
- fifo, cut-through (the default for generated and file topologies): one
  serialisation at the slowest link, queues where messages meet;
- fair: max-min fair flows.

The first three scenarios are uncongested (no two messages share a link at
once): analytical, cut-through fifo and fair must agree within 1%. The last
two share links inside one collective; the table shows by how much the models
part and the docs explain why.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chakra_core import pb  # noqa: E402
from chakra_core.testing import collective, manifest, recv, send, simulate, write_ranks  # noqa: E402

MODELS = {
    "analytical": {"plugin": "analytical"},
    "fifo, store and forward": {"plugin": "congestion", "mode": "fifo", "forwarding": "store_and_forward"},
    "fifo, cut-through": {"plugin": "congestion", "mode": "fifo", "forwarding": "cut_through"},
    "fair": {"plugin": "congestion", "mode": "fair"},
}
AGREEING = ("analytical", "fifo, cut-through", "fair")


def scenarios(size: int) -> list[dict[str, Any]]:
    """(name, congested, network lists, system, trace per rank) of each scenario."""
    def lists(kinds: list[str], npus: list[int]) -> dict[str, Any]:
        return {"topology": kinds, "npus_count": npus, "bandwidth": [50.0] * len(kinds),
                "latency": [500.0] * len(kinds)}

    def every(n: int, comm: int) -> list[list[pb.Node]]:
        return [[collective(1, comm, size)] for _ in range(n)]

    p2p: list[list[pb.Node]] = [[] for _ in range(16)]
    p2p[0].append(send(1, 15, size, tag=1))
    p2p[15].append(recv(1, 0, size, tag=1))
    incast: list[list[pb.Node]] = [[] for _ in range(8)]
    for src in range(1, 5):
        incast[src].append(send(1, 0, size, tag=src))
        incast[0].append(recv(src, src, size, tag=src))
    ring = {"all-reduce-implementation": ["ring"]}
    return [
        {"name": "ring all-reduce, 1-D ring of 16", "congested": False, "network": lists(["Ring"], [16]),
         "system": ring, "ranks": every(16, pb.ALL_REDUCE)},
        {"name": "ring all-reduce, switch of 16 (2 hops)", "congested": False,
         "network": lists(["Switch"], [16]), "system": ring, "ranks": every(16, pb.ALL_REDUCE)},
        {"name": "one message across ring 4 x switch 4 (3 hops)", "congested": False,
         "network": lists(["Ring", "Switch"], [4, 4]), "system": {}, "ranks": p2p},
        {"name": "direct all-to-all, switch of 16", "congested": True, "network": lists(["Switch"], [16]),
         "system": {"all-to-all-implementation": ["direct"]}, "ranks": every(16, pb.ALL_TO_ALL)},
        {"name": "incast, 4 senders to 1, switch of 8", "congested": True, "network": lists(["Switch"], [8]),
         "system": {}, "ranks": incast},
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=float, default=256.0, help="bytes per collective or message")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    size = int(args.size_mib * (1 << 20))
    rows = []
    for case in scenarios(size):
        row: dict[str, Any] = {"scenario": case["name"], "congested": case["congested"]}
        with tempfile.TemporaryDirectory(prefix="chakra-links-") as tmp:
            prefix = write_ranks(tmp, case["ranks"])
            for model, network in MODELS.items():
                results = simulate(manifest(prefix, {**network, **case["network"]}, system=case["system"]))
                row[model] = results["finish_ns"]
        times = [row[model] for model in AGREEING]
        row["spread_pct"] = round(100 * (max(times) - min(times)) / min(times), 3)
        rows.append(row)
    names = list(MODELS)
    print(f"finish time (ns) of each scenario, {args.size_mib:g} MiB per collective or message, 50 GB/s "
          f"(2^30 B) and 500 ns per link")
    print(f"{'scenario':<48} " + " ".join(f"{name:>24}" for name in names) + f" {'spread':>8}")
    for row in rows:
        label = row["scenario"] + (" *" if row["congested"] else "")
        print(f"{label:<48} " + " ".join(f"{row[name]:>24,}" for name in names) + f" {row['spread_pct']:>7.2f}%")
    print("spread: (max - min) / min of analytical, fifo cut-through and fair; * links shared inside the run")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    uncongested = [row for row in rows if not row["congested"]]
    return 0 if all(row["spread_pct"] <= 1.0 for row in uncongested) else 1


if __name__ == "__main__":
    raise SystemExit(main())
