#!/usr/bin/env python3
"""How simulation time grows with ranks and with nodes, on the scale workload (congestion-unaware).

Runs ../shared/bench/gen_scale_trace.py's workload (identical data-parallel ranks: 24-layer
forward and backward passes, an all-reduce per layer; sys_ring_roofline.json; a ring of as
many NPUs as ranks, 50 GB/s, 500 ns), every rank simulated (`fold: off`), each case in a
fresh process:

- 1, 2, 4, ..., 1,024 ranks of 1,971 nodes;
- 64 ranks of about 500, 1,000, 2,000, 4,000 and 8,000 nodes;
- 1,024 ranks folded, checked identical to the unfolded run.

    python benchmarks/scale_ranks.py [--max-ranks 1024] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from _measure import measure
from scale import generate, scale_manifest


def ring(folder: Path, npus: int) -> str:
    path = folder / f"Ring_{npus}npus.yml"
    path.write_text(f"topology: [ Ring ]\nnpus_count: [ {npus} ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n")
    return str(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-ranks", type=int, default=1024)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="chakra-ranks-") as tmp:
        folder = Path(tmp)
        cases = [(2 ** k, 2000) for k in range(11) if 2 ** k <= args.max_ranks]
        cases += [(64, nodes) for nodes in (500, 1000, 4000, 8000)]
        for ranks, nodes in cases:
            prefix = generate(folder / f"r{ranks}n{nodes}", ranks, nodes)
            data = scale_manifest(prefix, ring(folder, ranks), "analytical", fold="off")
            result = measure(data)
            rows.append({"ranks": ranks, "nodes_per_rank": nodes, "fold": "off", **result})
            print(f"{ranks:>5} ranks x {result['nodes'] // ranks:>5} nodes: {result['wall_s']:7.2f} s, "
                  f"{result['rss_mb']:5.0f} MB, {result['nodes'] / result['wall_s']:>9,.0f} nodes/s, "
                  f"finish {result['finish_ns']:,} ns", flush=True)
        top = max(r for r, _ in cases)
        prefix = str(folder / f"r{top}n2000" / "scale")
        folded = measure(scale_manifest(prefix, ring(folder, top), "analytical", fold="auto"))
        unfolded = next(r for r in rows if r["ranks"] == top and r["nodes_per_rank"] == 2000)
        rows.append({"ranks": top, "nodes_per_rank": 2000, "fold": "auto", **folded})
        same = folded["results_digest"] == unfolded["results_digest"]
        print(f"{top} ranks folded into {folded['folded_into']} simulated rank(s): {folded['wall_s']:.2f} s, "
              f"{folded['rss_mb']:.0f} MB; results {'identical to' if same else 'DIFFERENT from'} the "
              f"unfolded run ({unfolded['wall_s']:.2f} s)")
    print(f"({os.cpu_count()} CPU(s))")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
