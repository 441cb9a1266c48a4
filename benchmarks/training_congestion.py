"""What a congestion-aware network costs in a folded training-step simulation.

    python benchmarks/training_congestion.py                       # both tables
    python benchmarks/training_congestion.py --sizes 64,256,1024   # growth table for these GPU counts
    python benchmarks/training_congestion.py --skip-headline       # (or --skip-growth) only one table
    python benchmarks/training_congestion.py --example             # the example job folded and not, alone

Headline: Llama 3.1 405B on 16,384 H100 (the layout Meta reports for Llama 3 405B pre-training:
TP 8, CP 1, PP 16, DP 128, 16M tokens per step; "The Llama 3 Herd of Models", sec. 3.3, as quoted
from Balaji's SC'24 talk at https://glennklockwood.com/garden/llama-3.1), `nccl` system layer,
simulated folded (one rank per pipeline stage) with the congestion backend in `fair` mode
(flow-level max-min sharing) on a rail-optimized fabric of 2,048 8-GPU nodes (400 Gb/s NICs),
and without a network section, for comparison.

Growth: weak scaling of Llama 3 70B (TP 8, PP 4, DP = N / 32, global batch 8 x DP: every
data-parallel replica does the same work) on N = 64 ... 16,384 H100, same fabric family with
N / 8 nodes. wall / (N log2 N) and wall / N are normalised to the smallest size, so a column
staying near 1.0 means wall time grows as that function of N.

Example (`--example`): examples/llama3-70b-64gpu.yaml's job (Llama 3 70B on 64 H100, 8 nodes) on
the same fabric family, folded (one rank per pipeline stage: its CP 2 rings stay in a node) and with every rank
simulated (`workload.fold: off`): the same finish both ways.

Each case runs in a fresh process (this script with --case JSON). Wall time counts load+simulate
(trace generation, building the layers, simulating, building the results); peak RSS is the
child's maximum resident set; messages are the network layer's flows (one per send).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _measure import case_in_child  # noqa: E402

HEADLINE_JOB: dict[str, Any] = {
    "model": "llama3.1-405b", "parallel": {"tp": 8, "pp": 16, "account_for_embedding_and_loss": True},
    "training": {"seq": 8192, "global_batch": 2048},
    "cluster": {"gpus": 16384, "profile": "h100-hgx-roce400"}}
LINKS: dict[str, Any] = {"gpus_per_node": 8, "radix": 64, "bandwidth_gbps": 50, "latency_ns": 700,
                         "nvlink_bandwidth_gbps": 450, "nvlink_latency_ns": 100, "ecmp": "dmodk"}
SIZES = [64, 256, 1024, 4096, 16384]


def rail_generator(gpus: int) -> dict[str, Any]:
    """A valid rail_optimized generator for `gpus` GPUs: the fewest spine planes that fit radix-64 spines."""
    from chakra_core.topology import rail_shape
    nodes = gpus // LINKS["gpus_per_node"]
    for planes in (p for p in range(1, LINKS["gpus_per_node"] + 1) if LINKS["gpus_per_node"] % p == 0):
        try:
            rail_shape(nodes, LINKS["gpus_per_node"], LINKS["radix"], spine_planes=planes)
        except ValueError:
            continue
        return {"kind": "rail_optimized", "nodes": nodes, **LINKS, "spine_planes": planes}
    raise ValueError(f"no spine_planes makes a rail-optimized fabric of {nodes} nodes with radix {LINKS['radix']}")


def growth_job(gpus: int) -> dict[str, Any]:
    return {"model": "llama3-70b", "parallel": {"tp": 8, "pp": 4},
            "training": {"seq": 8192, "global_batch": 8 * (gpus // 32)},
            "cluster": {"gpus": gpus, "profile": "h100-hgx-roce400"}}


def run_case(case: dict[str, Any]) -> None:
    """Child: simulate one job manifest, print one JSON line of measurements."""
    from chakra_core import run as runner
    out = Path(case["out"])
    manifest: dict[str, Any] = {"job": {"name": "step", **case["job"]}, "output": {"dir": str(out)},
                                "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
    if case.get("network"):
        manifest["network"] = case["network"]
    if case.get("fold"):
        manifest["workload"] = {"fold": case["fold"]}
    started = time.perf_counter()
    results = runner.simulate(runner.load(manifest, base_dir=out)).document
    wall = time.perf_counter() - started
    summary = results["layers"].get("network", {}).get("summary", {})
    print(json.dumps({"wall_s": wall, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "step_s": results["training"]["step_time_s"], "finish_ns": results["finish_ns"],
                      "messages": summary.get("messages"),
                      "simulated_ranks": results["folding"]["simulated_ranks"]}))


def measure(job: dict[str, Any], network: dict[str, Any] | None, out: Path, fold: str | None = None) -> dict[str, Any]:
    """Parent: run one case in a fresh process; its last stdout line is the measurement."""
    case = {"job": job, "network": network, "out": str(out), "fold": fold}
    return case_in_child(__file__, case, f"case ({job['model']}, {job['cluster']['gpus']} GPUs, "
                                         f"network={'yes' if network else 'no'})")


def messages(row: dict[str, Any]) -> str:
    return "-" if row["messages"] is None else f"{row['messages']:,}"


def headline(tmp: Path) -> None:
    network = {"plugin": "congestion", "mode": "fair", "generator": rail_generator(16384)}
    rows = [("congestion, fair", measure(HEADLINE_JOB, network, tmp / "h-net")),
            ("no network section", measure(HEADLINE_JOB, None, tmp / "h-none"))]
    base = rows[1][1]["step_s"]
    print("Llama 3.1 405B on 16,384 H100 (TP 8, PP 16, DP 128, GBS 2048, BF16), folded\n")
    print("| case | simulated ranks | wall s | peak RSS MB | step s | network messages | step vs. no network |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in rows:
        print(f"| {name} | {r['simulated_ranks']:,} | {r['wall_s']:.1f} | {r['rss_mb']:,.0f} | {r['step_s']:.3f} | "
              f"{messages(r)} | {(r['step_s'] / base - 1) * 100:+.2f}% |", flush=True)
    print()


def growth(tmp: Path, sizes: list[int]) -> None:
    print("Llama 3 70B, TP 8, PP 4, DP = N/32, GBS 8 x DP (weak scaling), congestion fair, rail-optimized\n")
    print("| GPUs | spine planes | simulated ranks | wall s | peak RSS MB | network messages | step s | "
          "wall / (N log2 N), norm. | wall / N, norm. |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    first: tuple[float, float] | None = None
    for n in sizes:
        generator = rail_generator(n)
        r = measure(growth_job(n), {"plugin": "congestion", "mode": "fair", "generator": generator}, tmp / f"g{n}")
        nlogn, per_n = r["wall_s"] / (n * math.log2(n)), r["wall_s"] / n
        first = first or (nlogn, per_n)
        print(f"| {n:,} | {generator['spine_planes']} | {r['simulated_ranks']:,} | {r['wall_s']:.1f} | "
              f"{r['rss_mb']:,.0f} | {messages(r)} | {r['step_s']:.3f} | {nlogn / first[0]:.3f} | "
              f"{per_n / first[1]:.3f} |", flush=True)


def example(tmp: Path) -> None:
    import yaml
    job = yaml.safe_load((ROOT / "examples" / "llama3-70b-64gpu.yaml").read_text())["job"]
    job.pop("name", None)
    network = {"plugin": "congestion", "mode": "fair", "generator": rail_generator(job["cluster"]["gpus"])}
    print("examples/llama3-70b-64gpu.yaml (Llama 3 70B on 64 H100, TP 4, PP 4, VP 5, CP 2), congestion fair\n")
    print("| fold | simulated ranks | wall s | peak RSS MB | finish ns | network messages |")
    print("|---|---:|---:|---:|---:|---:|")
    finishes = []
    for fold in ("auto", "off"):
        r = measure(job, network, tmp / f"example-{fold}", fold)
        finishes.append(r["finish_ns"])
        print(f"| {fold} | {r['simulated_ranks']:,} | {r['wall_s']:.1f} | {r['rss_mb']:,.0f} | {r['finish_ns']:,} | "
              f"{messages(r)} |", flush=True)
    print(f"\nsame finish folded and unfolded: {'yes' if finishes[0] == finishes[1] else 'NO'}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="GPU counts of the growth table")
    parser.add_argument("--skip-headline", action="store_true")
    parser.add_argument("--skip-growth", action="store_true")
    parser.add_argument("--example", action="store_true", help="only the example job, folded and unfolded")
    args = parser.parse_args()
    if args.case:
        run_case(json.loads(args.case))
        return
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="chakra-train-net-") as tmp:
        if args.example:
            example(Path(tmp))
            return
        if not args.skip_headline:
            headline(Path(tmp))
        if not args.skip_growth:
            growth(Path(tmp), [int(s) for s in args.sizes.split(",")])
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
