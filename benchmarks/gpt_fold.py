#!/usr/bin/env python3
"""A generated GPT job of 16,384 ranks (DP x TP x PP), simulated with symmetry folding.

Generates (once; reused when the folder already holds it) a GPT-3 13B-like training
iteration with `chakra-sim generate transformer`: 40 layers, hidden 5,120, 40 heads,
sequence 2,048, global batch 512, DP 256 x TP 8 x PP 8 = 16,384 ranks, 2 micro-batches,
then runs it folded on one switch of all NPUs (roofline compute), in a fresh process, and
prints wall time, peak memory, simulated finish time and the classes of equivalent ranks.
Smaller jobs of the same model (--dp) are compared with their unfolded runs.

    python benchmarks/gpt_fold.py [--dp 256] [--folder /tmp/chakra-gpt] [--compare]

Generating 16,384 ranks takes a few minutes and about 3 GB of disk (ranks are written one
at a time). The folded run reads every trace once, to prove the ranks equivalent.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _measure import measure

MODEL = ["--layers", "40", "--hidden", "5120", "--heads", "40", "--seq", "2048", "--vocab", "51200",
         "--tp", "8", "--pp", "8", "--microbatches", "2"]


def generate(folder: Path, dp: int) -> tuple[str, int]:
    ranks = dp * 64
    prefix = folder / f"gpt_dp{dp}" / "gpt"
    if not Path(f"{prefix}.{ranks - 1}.et").exists():
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "chakra_core.cli", "generate", "transformer", *MODEL,
                        "--batch", str(2 * dp), "--dp", str(dp), "--output", str(prefix)],
                       check=True, stdout=subprocess.DEVNULL)
        print(f"generated {ranks:,} ranks in {time.perf_counter() - started:.0f} s", flush=True)
    return str(prefix), ranks


def manifest(prefix: str, ranks: int, fold: str) -> dict:
    return {"workload": {"trace": prefix, "fold": fold},
            "compute": {"plugin": "roofline", "peak_tflops": 989, "memory_bandwidth_gbps": 3350},
            "network": {"plugin": "analytical", "topology": ["Switch"], "npus_count": [ranks],
                        "bandwidth": [50.0], "latency": [1000.0]}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp", type=int, default=256, help="data-parallel replicas (ranks = 64 x dp)")
    parser.add_argument("--folder", type=Path, default=Path("/tmp/chakra-gpt"))
    parser.add_argument("--compare", action="store_true", help="also run unfolded and compare (small jobs)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    prefix, ranks = generate(args.folder, args.dp)
    folded = measure(manifest(prefix, ranks, "auto"))
    print(f"{ranks:,} ranks folded into {folded['folded_into']} simulated rank(s): {folded['wall_s']:.1f} s, "
          f"{folded['rss_mb']:,.0f} MB, finish {folded['finish_ns']:,} ns", flush=True)
    row = {"ranks": ranks, "folded": folded}
    if args.compare:
        full = measure(manifest(prefix, ranks, "off"))
        same = full["results_digest"] == folded["results_digest"]
        print(f"unfolded: {full['wall_s']:.1f} s, {full['rss_mb']:,.0f} MB; results "
              f"{'identical' if same else 'DIFFERENT'}")
        row["unfolded"] = full
    if args.json:
        args.json.write_text(json.dumps(row, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
