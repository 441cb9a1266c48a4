#!/usr/bin/env python3
"""Peak memory of every converted PyTorch reference trace (../shared/ref-traces/pytorch).

Converts each host trace (and each host + Kineto pair, linked), simulates it
with the `hbm` memory plugin tracking tensor lifetimes (replayed durations,
analytical network: 1 NPU, or 2 for the two-rank DLRM and selfgen pairs), and
prints a Markdown table: per trace, the peak bytes of live tensor storage per
rank and when it happens, with `tensor_nodes: all` (every node's references)
and `cpu` (host operators only, PyTorch's allocator view). Device tensors
are counted; for the CPU-only runs (selfgen, gloo) host tensors are, with
`count_host_tensors: true`.

    python benchmarks/memory_peaks.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chakra_core.tools.pytorch import convert  # noqa: E402
from tests.helpers import REF_PYTORCH as REFS  # noqa: E402
from tests.simhelpers import manifest, ring_network, simulate  # noqa: E402

# (label, [(host, kineto or None) per rank])
CASES = [
    ("chakra-tests 1.0.2 (host)", [("chakra-tests/1.0.2-chakra.0.0.4.json", None)]),
    ("HTA simple add (host)", [("hta/benchmark_simple_add_et.json.gz", None)]),
    ("HTA simple add (linked)", [("hta/benchmark_simple_add_et.json.gz", "hta/benchmark_simple_add_trace.json.gz")]),
    ("linear (host)", [("param/linear_et.json.gz", None)]),
    ("linear (linked)", [("param/linear_et.json.gz", "param/linear_kineto.json.gz")]),
    ("pt2 Triton (host)", [("param/pt2_et.json", None)]),
    ("ResNet 1 GPU (host)", [("param/1.0.3-chakra.0.0.4/resnet_1gpu_et.json.gz", None)]),
    ("GPT-2 (host)", [("param/hf_GPT2_et.json.gz", None)]),
    ("DLRM 2 ranks (linked)", [("param/dlrm/dlrm_eg_0.json", "param/dlrm/worker0_step_12.1694128201545.pt.trace.json"),
                               ("param/dlrm/dlrm_eg_1.json", "param/dlrm/worker1_step_12.1694128201556.pt.trace.json")]),
    ("selfgen CPU 2 ranks (linked)", [("selfgen-cpu/host.0.json.gz", "selfgen-cpu/device.0.json.gz"),
                                      ("selfgen-cpu/host.1.json.gz", "selfgen-cpu/device.1.json.gz")]),
]
HOST_MEMORY = {"selfgen CPU 2 ranks (linked)", "chakra-tests 1.0.2 (host)"}
"""Runs whose tensors live in host memory (CPU training): count host tensors."""


def human(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,} B" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return str(size)


def simulate_peaks(prefix: str, ranks: int, tensor_nodes: str, count_host: bool) -> dict:
    return simulate(manifest(prefix, ring_network(ranks),
                             memory={"plugin": "hbm", "bandwidth_gbps": 2000, "tensor_nodes": tensor_nodes,
                                     "count_host_tensors": count_host}))


def main() -> None:
    rows = ["| trace | ranks | nodes per rank | peak, all nodes (per rank) | at | peak, CPU ops only | at |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, ranks in CASES:
        with tempfile.TemporaryDirectory(prefix="chakra-mem-") as tmp:
            prefix = Path(tmp) / "t"
            for rank, (host_trace, kineto) in enumerate(ranks):
                conversion = convert(REFS / host_trace, REFS / kineto if kineto else None, rank=rank)
                conversion.rank = rank
                conversion.write(prefix)
            cells = []
            for mode in ("all", "cpu"):
                results = simulate_peaks(str(prefix), len(ranks), mode, label in HOST_MEMORY)
                stats = [r["hbm"] for r in results["ranks"]]
                peaks = [r["peak_memory_bytes"] for r in stats]
                times = [r.get("peak_memory_ns") for r in stats]
                # null: no node the mode counts lists a tensor (the model cannot tell, so it does not say 0 B)
                cells.append(" / ".join("no tensors" if p is None else human(p) for p in peaks))
                cells.append(" / ".join("-" if t is None else f"{t / 1e6:,.3f} ms" for t in times))
            nodes = sum(sum(r["node_counts"].values()) for r in results["ranks"]) // len(ranks)
        label += " [host memory]" if label in HOST_MEMORY else ""
        rows.append(f"| {label} | {len(ranks)} | {nodes:,} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
