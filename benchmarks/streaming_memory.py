#!/usr/bin/env python3
"""Memory of the two feeders on a long trace: the streaming feeder's stays bounded.

Writes a 2-rank trace of N compute nodes per rank (each depends on the
previous two, carries a name, a duration and num_ops/tensor_size/op_type
attributes, like converted traces), then simulates it once per feeder in a
fresh process and prints wall time, peak RSS and the trace size.

    python benchmarks/streaming_memory.py [--nodes 1000000] [--cache 4096]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _measure import measure
from chakra_core.et.io import write_trace
from chakra_core.schema import pb

def nodes(count: int):
    for i in range(count):
        node = pb.Node(id=i, name=f"aten::linear_{i}", type=pb.COMP_NODE, duration_micros=1 + i % 7)
        node.data_deps.extend(d for d in (i - 1, i - 2) if d >= 0)
        node.attr.add(name="num_ops", uint64_val=1_000_000 + i)
        node.attr.add(name="tensor_size", uint64_val=4096)
        node.attr.add(name="op_type", string_val="linear")
        yield node


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1_000_000, help="nodes per rank")
    parser.add_argument("--cache", type=int, default=4096, help="streaming feeder cache (nodes)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chakra-stream-") as tmp:
        prefix = Path(tmp) / "long"
        for rank in range(2):
            write_trace(f"{prefix}.{rank}.et", pb.GlobalMetadata(version="0.0.4"), nodes(args.nodes))
        size_mb = sum(p.stat().st_size for p in Path(tmp).glob("*.et")) / 2**20
        print(f"trace: 2 ranks x {args.nodes:,} nodes, {size_mb:,.0f} MB on disk")
        print(f"{'feeder':<10} {'wall s':>8} {'peak RSS MB':>12} {'finish ns':>16}")
        for feeder in ("streaming", "memory"):
            row = measure({"workload": {"trace": str(prefix), "feeder": feeder, "cache_nodes": args.cache},
                           "network": {"plugin": "analytical", "topology": ["Ring"], "npus_count": [2],
                                       "bandwidth": [50], "latency": [500]}})
            print(f"{feeder:<10} {row['wall_s']:>8.1f} {row['rss_mb']:>12.0f} {row['finish_ns']:>16,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
