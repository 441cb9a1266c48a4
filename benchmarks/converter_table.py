#!/usr/bin/env python3
"""What `chakra-sim convert pytorch` makes of every PyTorch trace in ../shared/ref-traces/pytorch.

Converts each host execution trace on its own and each host + Kineto pair linked, and prints a
Markdown table (the one in docs/converter.md): nodes by type, edges, communication nodes,
linked / unlinked host operators and GPU events, the measured compute time the nodes carry, and
the time the host spent waiting for the GPU in blocking calls, taken out of the CPU nodes (the
simulation re-creates those waits).

    python benchmarks/converter_table.py [--timing] [--refs DIR]

`--timing` adds each conversion's wall time (not reproducible, so not in the docs table).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import sys

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chakra_core.tools.pytorch import convert  # noqa: E402
from chakra_core.tools.pytorch.jsonfile import load_json  # noqa: E402
from tests.helpers import REF_PYTORCH as REFS  # noqa: E402
from tests.helpers import REF_PYTORCH_PAIRS as PAIRS  # noqa: E402

UNRECORDED_RANK = {"selfgen-cpu/host.0.json.gz": 0, "selfgen-cpu/host.1.json.gz": 1}
"""Host traces that do not record their rank (the converter asks for --rank)."""
_SHORT = {"METADATA_NODE": "meta", "COMP_NODE (cpu)": "cpu", "COMP_NODE (gpu)": "gpu",
          "COMM_COLL_NODE": "coll", "COMM_SEND_NODE": "send", "COMM_RECV_NODE": "recv"}


def trace_kinds(refs: Path) -> tuple[list[Path], list[Path]]:
    """(host traces, Kineto traces) under `refs`, recognised by content."""
    hosts, kinetos = [], []
    for path in sorted(p for p in refs.rglob("*") if p.name.endswith((".json", ".json.gz"))):
        doc = load_json(path, "trace")
        if isinstance(doc, dict) and "nodes" in doc:
            hosts.append(path)
        elif isinstance(doc, dict) and "traceEvents" in doc:
            kinetos.append(path)
    return hosts, kinetos


def row(refs: Path, host: Path, kineto: Path | None, timing: bool) -> list[str]:
    start = time.perf_counter()
    rank = UNRECORDED_RANK.get(host.relative_to(refs).as_posix()) if kineto is None else None
    summary = convert(host, kineto, rank).summary
    wall = time.perf_counter() - start
    nodes = ", ".join(f"{n:,} {_SHORT.get(name, name)}" for name, n in summary.nodes.items())
    comm = ", ".join(f"{n} {name.lower()}" for name, n in summary.collectives.items()) or "-"
    linked = (f"{summary.linked:,}/{summary.unlinked:,}; {summary.gpu_linked:,}/"
              f"{summary.gpu_events - summary.gpu_linked:,}") if kineto else "-"
    compute = (f"{summary.gpu_micros:,} / {summary.cpu_micros:,} / {summary.comm_micros:,}"
               if kineto else "-")
    waits = f"{summary.wait_removed_micros:,} ({summary.waits_removed})" if kineto else "-"
    cells = [host.relative_to(refs).as_posix(), "linked" if kineto else "host only", str(summary.rank),
             nodes, f"{summary.edges:,} ({summary.ctrl_edges:,} ctrl)", comm, linked, compute, waits,
             f"{summary.num_ops:.3g}", str(len(summary.warnings))]
    if timing:
        cells.append(f"{wall:.2f}")
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refs", type=Path, default=REFS, help="folder of PyTorch reference traces")
    parser.add_argument("--timing", action="store_true", help="add each conversion's wall time")
    args = parser.parse_args()
    hosts, kinetos = trace_kinds(args.refs)
    paired = {args.refs / k for _, k in PAIRS}
    missing = [k for k in kinetos if k not in paired]
    if missing:
        raise SystemExit(f"Kineto traces without a pair in PAIRS: {', '.join(map(str, missing))}")
    header = ["input", "mode", "rank", "nodes", "edges", "communication nodes",
              "host ops linked/unlinked; GPU events linked/unlinked",
              "measured GPU / CPU / comm µs", "waits removed µs (calls)", "FLOPs", "warnings"]
    if args.timing:
        header.append("seconds")
    rows = [row(args.refs, host, None, args.timing) for host in hosts]
    rows += [row(args.refs, args.refs / h, args.refs / k, args.timing) for h, k in PAIRS]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
