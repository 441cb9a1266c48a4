#!/usr/bin/env python3
"""How closely `chakra-sim synthesize` traces behave like their sources (docs/synthesis.md).

For every source set (converted PyTorch traces, generated transformers, ASTRA-sim's reference
microbenchmarks, ASTRA-sim 1.0 text workloads), fits a model, samples a synthetic trace at the
source's rank count and length, simulates both under the same configuration (analytical
switch, 50 GB/s, 500 ns; native system layer; replayed durations) and compares:

- finish: the simulated finish time;
- compute: GPU + CPU compute time summed over ranks (the breakdown's two compute categories);
- bytes: bytes sent summed over ranks (the communication total);
- KS: two-sample Kolmogorov-Smirnov statistic of the compute nodes' durations (all ranks);
- exposed comm: exposed network + waiting time summed over ranks, shown but not judged: where
  it is mostly one rank waiting for another, it is a small difference of two large arrival
  times, and a 0.5% shift of either moves it by tens of percent.

A row passes when finish, compute and bytes are within 5% and KS < 0.1. Each
set runs with seeds 0..N-1 (`--seeds`); the table shows seed 0 and the worst seed. With
`--obfuscate` the synthetic traces are fitted with `--obfuscate --tolerance 0.05` (values
perturbed by up to 5%, so up to 5% differences are expected by design).

    python benchmarks/synthesis.py [--seeds N] [--obfuscate] [--work DIR] [--check]

Needs ../shared/ref-traces (CI has it beside the checkout).
"""

from __future__ import annotations

import argparse
import bisect
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chakra_core.et.attrs import NodeView  # noqa: E402
from chakra_core.et.io import read_trace  # noqa: E402
from chakra_core.et.jsonize import trace_files  # noqa: E402
from chakra_core.schema import pb  # noqa: E402
from chakra_core.testing import manifest, simulate  # noqa: E402
from tests.simhelpers import ring_network  # noqa: E402
from chakra_core.tools.synthesis.fit import fit_model  # noqa: E402
from chakra_core.tools.synthesis.sample import write_synthetic  # noqa: E402
from tests.helpers import REF_TRACES  # noqa: E402

LIMIT = 0.05
KS_LIMIT = 0.1
DLRM = ROOT / "examples" / "pytorch" / "dlrm"


@dataclass
class Source:
    group: str
    name: str
    prefix: str
    dependencies: str = "all"
    """As workload.dependencies; kept for sources whose control edges form cycles."""


def build_sources(work: Path) -> list[Source]:
    """Write (or find) every source trace under `work`."""
    from click.testing import CliRunner

    from chakra_core.cli import main

    def cli(*args: str) -> None:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
        if result.exit_code:
            raise SystemExit(f"chakra-sim {' '.join(args)} failed:\n{result.output}")

    sources = []
    # Converted PyTorch traces: host + Kineto pairs, and an .et from the official converter.
    kineto = {0: "worker0_step_12.1694128201545.pt.trace.json.gz", 1: "worker1_step_12.1694128201556.pt.trace.json.gz"}
    for rank in (0, 1):
        cli("convert", "pytorch", str(DLRM / f"dlrm_eg_{rank}.json.gz"), "--kineto", str(DLRM / kineto[rank]),
            "--rank", str(rank), "--output", str(work / "dlrm"))
    sources.append(Source("converted PyTorch", "DLRM, 2 ranks (host + Kineto)", str(work / "dlrm")))
    selfgen = REF_TRACES / "pytorch" / "selfgen-cpu"
    for rank in (0, 1):
        cli("convert", "pytorch", str(selfgen / f"host.{rank}.json.gz"), "--kineto",
            str(selfgen / f"device.{rank}.json.gz"), "--rank", str(rank), "--output", str(work / "selfgen"))
    sources.append(Source("converted PyTorch", "CPU model, 2 ranks (host + Kineto)", str(work / "selfgen")))
    param = REF_TRACES / "pytorch" / "param"
    cli("convert", "pytorch", str(param / "linear_et.json.gz"), "--kineto", str(param / "linear_kineto.json.gz"),
        "--rank", "0", "--output", str(work / "linear"))
    sources.append(Source("converted PyTorch", "linear model, 1 GPU (host + Kineto)", str(work / "linear")))
    # Generated transformers.
    cli("generate", "transformer", "--layers", "4", "--hidden", "1024", "--heads", "16", "--seq", "1024",
        "--batch", "16", "--vocab", "50304", "--dp", "2", "--tp", "2", "--pp", "2", "--microbatches", "4",
        "--output", str(work / "gpt_pp"))
    sources.append(Source("generated transformer", "GPT DP2 TP2 PP2, 1F1B", str(work / "gpt_pp")))
    cli("generate", "transformer", "--layers", "8", "--hidden", "2048", "--heads", "16", "--seq", "2048",
        "--batch", "32", "--vocab", "50304", "--dp", "4", "--tp", "4", "--sp", "--dp-reduce", "rs-ag",
        "--output", str(work / "gpt_sp"))
    sources.append(Source("generated transformer", "GPT DP4 TP4 SP, RS+AG", str(work / "gpt_sp")))
    # ASTRA-sim's reference microbenchmarks and custom collective.
    micro = REF_TRACES / "astra-microbenchmarks"
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        sources.append(Source("reference microbenchmarks", f"{coll}, 8 NPUs, 1 MB",
                              str(micro / coll / "8npus_1MB" / coll)))
    sources.append(Source("reference microbenchmarks", "custom ring all-reduce (send/recv), 8 NPUs",
                          str(REF_TRACES / "astra-custom-collectives" / "custom_ring_allreduce_8npus_1MB" /
                              "custom_allreduce")))
    # ASTRA-sim 1.0 text workloads.
    for text in ("Resnet50_DataParallel", "DLRM_HybridParallel", "MLP_HybridParallel_Data_Model", "microAllReduce"):
        cli("convert", "text", str(REF_TRACES / "astra-text" / f"{text}.txt"), "--num-npus", "8",
            "--num-passes", "2", "--output", str(work / text))
        sources.append(Source("ASTRA-sim text workloads", f"{text}, 8 NPUs, 2 passes", str(work / text)))
    return sources


def measure(prefix: str, ranks: int, dependencies: str) -> dict[str, float]:
    results = simulate(manifest(os.path.abspath(prefix), ring_network(ranks, topology="Switch"),
                                dependencies=dependencies))
    rows = results["ranks"]
    return {"finish": results["finish_ns"],
            "compute": sum(r["gpu_compute_ns"] + r["cpu_compute_ns"] for r in rows),
            "exposed comm": sum(r["exposed_comm_ns"] for r in rows),
            "bytes": sum(r["bytes_sent"] for r in rows)}


def compute_durations(prefix: str) -> list[int]:
    out = []
    for _, path in trace_files(prefix):
        for node in read_trace(path).nodes:
            if node.type == pb.COMP_NODE:
                view = NodeView(node)
                out.append(view.int("duration_ns") if view.has("duration_ns") else node.duration_micros * 1000)
    return out


def ks_statistic(a: list[int], b: list[int]) -> float | None:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    if not a or not b:
        return None
    a, b = sorted(a), sorted(b)
    return max(abs(bisect.bisect_right(a, v) / len(a) - bisect.bisect_right(b, v) / len(b))
               for v in set(a) | set(b))


def relative(source: float, synthetic: float) -> float:
    if source == synthetic:
        return 0.0
    return (synthetic - source) / source if source else float("inf")


def compare(source: Source, work: Path, seed: int, obfuscate: bool) -> dict:
    ranks = len(trace_files(source.prefix))
    started = time.perf_counter()
    model = fit_model([source.prefix], obfuscate=obfuscate, tolerance=LIMIT if obfuscate else 0.0, seed=seed,
                      use_ctrl=source.dependencies == "all")
    out = work / f"synthetic-{Path(source.prefix).name}-{seed}"
    write_synthetic(model, out, seed=seed)
    wall = time.perf_counter() - started
    before, after = measure(source.prefix, ranks, source.dependencies), measure(str(out), ranks, "all")
    row = {key: relative(before[key], after[key]) for key in before}
    row["ks"] = ks_statistic(compute_durations(source.prefix), compute_durations(str(out)))
    row.update(ranks=ranks, nodes=round(sum(len(read_trace(p).nodes) for _, p in trace_files(source.prefix)) / ranks),
               source_finish=before["finish"], synthetic_finish=after["finish"], wall=wall)
    row["pass"] = (all(abs(row[k]) <= LIMIT for k in ("finish", "compute", "bytes"))
                   and (row["ks"] is None or row["ks"] < KS_LIMIT))
    return row


def _pct(value: float) -> str:
    return f"{100 * value:+.2f}%"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds per source set (default 5)")
    parser.add_argument("--obfuscate", action="store_true", help="fit with --obfuscate --tolerance 0.05")
    parser.add_argument("--work", type=Path, help="folder for the traces (default: a temporary one)")
    parser.add_argument("--check", action="store_true", help="exit 1 unless every row passes")
    args = parser.parse_args()
    if not REF_TRACES.is_dir():
        parser.error(f"{REF_TRACES} not found")
    with tempfile.TemporaryDirectory() as temp:
        work = args.work or Path(temp)
        work.mkdir(parents=True, exist_ok=True)
        sources = build_sources(work)
        print("| source set | trace | ranks | nodes/rank | finish: source → synthetic (ns) | finish | compute "
              "| bytes | KS | worst of seeds: finish / compute / bytes / KS | pass | exposed comm (worst) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        failed = 0
        for source in sources:
            rows = [compare(source, work, seed, args.obfuscate) for seed in range(args.seeds)]
            first = rows[0]
            worst = {key: max((r[key] for r in rows), key=abs) for key in ("finish", "compute", "bytes", "exposed comm")}
            ks_values = [r["ks"] for r in rows if r["ks"] is not None]
            worst_ks = f"{max(ks_values):.3f}" if ks_values else "—"
            ks = "—" if first["ks"] is None else f"{first['ks']:.3f}"
            ok = all(r["pass"] for r in rows)
            failed += not ok
            print(f"| {source.group} | {source.name} | {first['ranks']} | {first['nodes']:,} | "
                  f"{first['source_finish']:,} → {first['synthetic_finish']:,} | {_pct(first['finish'])} | "
                  f"{_pct(first['compute'])} | {_pct(first['bytes'])} | {ks} | "
                  f"{_pct(worst['finish'])} / {_pct(worst['compute'])} / {_pct(worst['bytes'])} / {worst_ks} | "
                  f"{'yes' if ok else '**no**'} | {_pct(first['exposed comm'])} ({_pct(worst['exposed comm'])}) |",
                  flush=True)
        print(f"\n{len(sources) - failed} of {len(sources)} source sets pass on all {args.seeds} seed(s)")
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
