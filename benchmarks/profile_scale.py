#!/usr/bin/env python3
"""Where the time goes: the scale workload under cProfile, top functions by own time.

Runs the 64-rank x 1,971-node scale workload (see scale.py) once in this process under
cProfile, every rank simulated (`fold: off`), and prints the functions that spend the most
time themselves. docs/performance.md records the table before and after optimising.

    python benchmarks/profile_scale.py [--network Ring_64npus] [--backend analytical] [--top 10]

Profiling slows the run several times over; compare profiles with profiles, wall times with
scale.py.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
from pathlib import Path

from scale import CONFIGS, generate, scale_manifest

from chakra_core.plugins import make_plugin_host
from chakra_core.run import load, simulate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", default="Ring_64npus", choices=["Ring_64npus", "Switch_64npus"])
    parser.add_argument("--backend", default="analytical", choices=["analytical", "congestion"])
    parser.add_argument("--fold", default="off", choices=["off", "auto"])
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chakra-profile-") as tmp:
        prefix = generate(Path(tmp))
        data = scale_manifest(prefix, str(CONFIGS / f"{args.network}.yml"), args.backend, fold=args.fold)
        profiler = cProfile.Profile()
        profiler.enable()
        host = make_plugin_host()
        results = simulate(load(data, host, base_dir=Path.cwd(), name="profile"), host).document
        profiler.disable()
    stats = pstats.Stats(profiler)
    print(f"{args.network} {args.backend} fold={args.fold}: finish {results['finish_ns']:,} ns, "
          f"{stats.total_calls:,} calls, {stats.total_tt:.2f} s profiled")
    print(f"{'own s':>7} {'calls':>10}  function")
    rows = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)[:args.top]
    for (filename, line, name), (_, calls, own, _, _) in rows:
        where = Path(filename).name if filename != "~" else "builtin"
        print(f"{own:>7.2f} {calls:>10,}  {name} ({where}:{line})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
