#!/usr/bin/env python3
"""`chakra-sim analyze` on ASTRA-sim's scale anchor: 64 ranks x 1,971 nodes (target: under 30 s).

Generates the workload with ../shared/bench/gen_scale_trace.py (64 ranks, 2,000 nodes per
rank), or takes --trace PREFIX, and times `chakra-sim analyze` in a fresh process per run,
as a user runs it (interpreter start and imports included):

- the generator's files as they are: the 64 ranks are byte-identical, so one file is read;
- every rank distinct: a copy where each rank's file ends with one extra METADATA node of
  its own, so that all 64 files are read and analysed;
- each of those again with --out (analysis.json and the three PNG plots).

Prints the wall time and the peak RSS (max resident set of the analysing process).

    python benchmarks/analyze_scale.py [--repeat 3] [--trace PREFIX]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _measure import ROOT
from scale import generate

from chakra_core.et.io import encode_message
from chakra_core.et.jsonize import trace_files
from chakra_core.schema import pb


def distinct_copy(prefix: str, out_dir: Path) -> str:
    """Copy the rank files of `prefix`, each with one extra METADATA node naming its rank."""
    for rank, path in trace_files(prefix):
        marker = pb.Node(id=10**12 + rank, name=f"rank {rank}", type=pb.METADATA_NODE)
        (out_dir / f"distinct.{rank}.et").write_bytes(path.read_bytes() + encode_message(marker))
    return str(out_dir / "distinct")


def timed_analyze(args: list[str]) -> tuple[float, float]:
    """(wall s, peak RSS MB) of `chakra-sim analyze ARGS` in a fresh process."""
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "chakra_core.cli", "analyze", *args], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        sys.exit(f"chakra-sim analyze {' '.join(args)} failed:\n{child.stderr.read().decode()}")
    child.stderr.close()
    return wall, usage.ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the best wall time is kept")
    parser.add_argument("--trace", help="analyse this trace prefix instead of generating the scale workload")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="chakra-analyze-") as tmp:
        work = Path(tmp)
        prefix = args.trace or generate(work / "scale")
        (work / "distinct").mkdir()
        cases = [("identical ranks (1 file read)", prefix),
                 ("every rank distinct", distinct_copy(prefix, work / "distinct"))]
        ranks = len(trace_files(prefix))
        print(f"chakra-sim analyze on {prefix} ({ranks} ranks); best of {args.repeat}")
        print(f"{'case':<32} {'output':<18} {'wall':>8} {'peak RSS':>10}")
        for label, trace in cases:
            for output, extra in (("tables", []), ("--out (+ plots)", ["--out", str(work / "out")])):
                runs = [timed_analyze([trace, *extra]) for _ in range(args.repeat)]
                wall = min(w for w, _ in runs)
                rss = max(r for _, r in runs)
                print(f"{label:<32} {output:<18} {wall:>7.2f}s {rss:>7.0f} MB")
                shutil.rmtree(work / "out", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
