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
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chakra_core.et.io import write_trace  # noqa: E402
from chakra_core.schema import pb  # noqa: E402

CHILD = r"""
import json, resource, sys, time
from chakra_core.engine.simulation import Simulation
from chakra_core.manifest import build_manifest
from chakra_core.plugins import make_plugin_host
from pathlib import Path
prefix, feeder, cache = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = time.perf_counter()
host = make_plugin_host()
data = {"workload": {"trace": prefix, "feeder": feeder, "cache_nodes": cache},
        "network": {"plugin": "analytical", "topology": ["Ring"], "npus_count": [2],
                    "bandwidth": [50], "latency": [500]}}
sim = Simulation(build_manifest(data, host, Path.cwd(), "bench").spec, host)
results = sim.run()
print(json.dumps({"wall_s": time.perf_counter() - t0, "finish_ns": results["finish_ns"],
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


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
            out = subprocess.run([sys.executable, "-c", CHILD, str(prefix), feeder, str(args.cache)],
                                 capture_output=True, text=True, check=True, cwd=ROOT)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{feeder:<10} {row['wall_s']:>8.1f} {row['rss_mb']:>12.0f} {row['finish_ns']:>16,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
