#!/usr/bin/env python3
"""Predicted vs measured collective times on public nccl-tests results (docs/accuracy.md).

For every log in plugins/system_nccl/tests/data/nccl-tests (sources and licences in its README), every
size is simulated as `chakra-sim accuracy` does (chakra_sim_system_nccl.accuracy): a one-collective
trace on every rank, the launch mode read from the log's header, run as `chakra-sim run` would:

- `nccl`: the NCCL-aware system layer with a spec-only shipped profile (never fitted to
  these measurements), timing what NCCL executes; beside it NCCL's own tuner estimate of the
  same choice, which the layer took as the time before;
- `native`: the built-in layer with ASTRA-sim's "HGX-H100-validated" system and network
  files (benchmarks/data/astra-sim), congestion-unaware (analytical) and congestion-aware
  (congestion backend); only for one node of 8 GPUs, which is what those files describe.

Errors are geometric means over the sizes from 1 KiB, overall and per size band. Then
calibration (`chakra-sim calibrate`'s fit of physical parameters): fitted on the sizes 4^k of
each log and judged on the other powers of two; and fitted on one log and judged on another
collective or node count of the same machine type (the transfer).

    python benchmarks/accuracy.py [--out docs/accuracy.md] [--detail TEXT] [--extra-logs DIR]

The tables replace the part of docs/accuracy.md between its `accuracy:begin` and
`accuracy:end` markers; with --extra-logs, the public logs that cannot be redistributed
(their URLs are in the data README) are evaluated too and their tables replace the part
between `accuracy-extra:begin` and `accuracy-extra:end` (left as it is otherwise).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chakra_sim_system_nccl import accuracy as acc  # noqa: E402
from chakra_sim_system_nccl import calibrate as cal  # noqa: E402
from chakra_sim_system_nccl.launch import LaunchInfo  # noqa: E402
from chakra_sim_system_nccl.nccl_tests import NcclTestsLog, load, parse_busbw_table  # noqa: E402
from chakra_sim_system_nccl.section import calibration_of  # noqa: E402
from chakra_core.hardware.profiles import Profile, load_profile  # noqa: E402
from chakra_core.plugins import PluginHost, make_plugin_host  # noqa: E402
from chakra_core.schema import pb  # noqa: E402
from chakra_core.testing import collective, simulate, write_ranks  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
LOGS = ROOT / "plugins" / "system_nccl" / "tests" / "data" / "nccl-tests"
ASTRA = DATA / "astra-sim"
MARKERS = {"core": ("<!-- accuracy:begin -->", "<!-- accuracy:end -->"),
           "extra": ("<!-- accuracy-extra:begin -->", "<!-- accuracy-extra:end -->")}
COMM_TYPE = {"all_reduce": pb.ALL_REDUCE, "all_gather": pb.ALL_GATHER, "reduce_scatter": pb.REDUCE_SCATTER,
             "alltoall": pb.ALL_TO_ALL}
BAND_NAMES = ("1 KiB-1 MiB", "1 MiB-256 MiB", "from 256 MiB")
BAND_GOAL = 0.20


@dataclass(frozen=True)
class Dataset:
    label: str
    file: str
    profile: str
    goal: float | None = None          # the geomean target, where it sets one
    min_bytes: int = 1024
    max_bytes: int = 8 * 2**30
    note: str = ""
    table: tuple[str, int] | None = None   # a bus-bandwidth table: (collective, ranks)
    launch: LaunchInfo | None = None       # how a table was run, from the script that made it (no header)
    algorithms: tuple[str, ...] = ()       # NCCL_ALGO as the run forced it (empty: NCCL's choice)

    def log(self, folder: Path = LOGS) -> NcclTestsLog:
        if self.table is not None:   # a results page: its "NCCL Bandwidth" section's table
            path = folder / self.file
            text = path.read_text()
            section = text.split("## NCCL Bandwidth", 1)[-1].split("\n## ", 1)[0]
            table = "\n".join(line for line in section.splitlines() if line.lstrip().startswith("|"))
            return replace(parse_busbw_table(table, *self.table, path=str(path)), launch=self.launch)
        return load(folder / self.file)


# Azure/AI-benchmarking-guide Benchmarks/NCCLBandwidth.py at 5751982 (the version of 25 Sep 2024, when
# the ND A100 v4 page was written; the H100 and H200 pages of 24 Sep come from 1923741, the same command):
# `NCCL_ALGO=<Tree|Ring|NVLS|NVLSTree> ./build/all_reduce_perf -b 8 -e 8G -f 2 -g 8 -n 40`, one process
# and one thread driving the node's 8 GPUs, once per forced algorithm; the page keeps one column.
AZURE_LAUNCH = LaunchInfo(threads_per_process=1, gpus_per_thread=8, processes=1)


DATASETS = (
    Dataset("8 x H100, all-reduce (NVIDIA DGX H100)", "h100_dgx_1node_8gpu_allreduce_nvidia-dgxc.txt",
            "h100-sxm-hgx", goal=0.10),
    Dataset("8 x H100, all-reduce (xxrjun)", "h100_xxrjun_1node_8gpu_allreduce.txt", "h100-sxm-hgx"),
    Dataset("8 x H100, all-gather (xxrjun)", "h100_xxrjun_1node_8gpu_allgather.txt", "h100-sxm-hgx"),
    Dataset("8 x H100, reduce-scatter (xxrjun)", "h100_xxrjun_1node_8gpu_reducescatter.txt", "h100-sxm-hgx"),
    Dataset("8 x H100, all-to-all (xxrjun)", "h100_xxrjun_1node_8gpu_alltoall.txt", "h100-sxm-hgx"),
    Dataset("2 x 8 H100, all-reduce, AWS p5 EFA", "h100_aws-p5_2node_16gpu_allreduce_efa.txt",
            "h100-aws-p5-efa", goal=0.15),
    Dataset("2 x 8 A100, all-reduce, AWS p4de EFA", "a100_aws-p4de_2node_16gpu_allreduce_efa.txt",
            "a100-aws-p4de-efa"),
)

# Public logs whose repositories carry no licence, so they are not redistributed (see the data
# README for their URLs at a commit); --extra-logs DIR evaluates those found in DIR.
EXTRA = (
    Dataset("4 x 8 H100, all-reduce, InfiniBand (Voltage Park)", "h100_voltagepark_4node_32gpu_allreduce_ib.txt",
            "h100-hgx-ndr400", goal=0.15, note="NIC count per node uncertain in the source"),
    Dataset("4 x 8 H100, all-gather, InfiniBand (Voltage Park)", "h100_voltagepark_4node_32gpu_allgather_ib.txt",
            "h100-hgx-ndr400", goal=0.15, note="NIC count per node uncertain in the source"),
    Dataset("8 x H100, all-reduce (Voltage Park, one process)", "h100_voltagepark_1node_8gpu_allreduce.txt",
            "h100-sxm-hgx", note="one process drives 8 GPUs (-g 8)"),
    Dataset("8 x H100, all-reduce (Azure ND H100 v5, busbw table)",
            "h100_azure-ndv5_1node_8gpu_allreduce_busbw-table.txt", "azure-nd-h100-v5", table=("all_reduce", 8),
            launch=AZURE_LAUNCH, algorithms=("nvls",),
            note="NVLS forced (the page says; simulated with NCCL_ALGO=nvls), one process drives 8 GPUs (-g 8)"),
    Dataset("8 x H200, all-reduce (Azure ND H200 v5, busbw table)",
            "h200_azure-ndv5_1node_8gpu_allreduce_busbw-table.txt", "h200-sxm-hgx", table=("all_reduce", 8),
            launch=AZURE_LAUNCH, algorithms=("nvls",),
            note="NVLS forced (the page says; simulated with NCCL_ALGO=nvls), one process drives 8 GPUs (-g 8)"),
    *(Dataset(f"8 x A100, all-reduce (Azure ND A100 v4, busbw table), if {name} was forced",
              "a100_azure-ndv4_1node_8gpu_allreduce_busbw-table.txt", "a100-sxm-hgx", goal=0.15,
              table=("all_reduce", 8), launch=AZURE_LAUNCH, algorithms=(algorithm,),
              note="the page's script forces Tree, Ring, NVLS and NVLSTree in turn and keeps one column without "
                   "saying which (it names NVLS, which A100 cannot run): both readings shown; one process drives "
                   "8 GPUs (-g 8)")
      for name, algorithm in (("Ring", "ring"), ("Tree", "tree"))),
    Dataset("72 x GB200, all-reduce, one NVL72 rack (CoreWeave)", "gb200_coreweave_nvl72_72gpu_allreduce.txt",
            "gb200-nvl72", max_bytes=16 * 2**30,
            note="512 MiB - 8 GiB only; launch not stated (one process per GPU assumed)"),
)

# Calibration transfer: fit on one log (one collective, one scale), judge on another collective or
# node count of the same GPU and node (the target's own profile gets the fitted parameters).
TRANSFERS = (
    ("8 x H100, all-gather (xxrjun)", "8 x H100, all-reduce (xxrjun)"),
    ("8 x H100, reduce-scatter (xxrjun)", "8 x H100, all-reduce (NVIDIA DGX H100)"),
    ("8 x H100, all-reduce (xxrjun)", "8 x H100, all-gather (xxrjun)"),
    ("8 x H100, all-reduce (NVIDIA DGX H100)", "8 x H100, reduce-scatter (xxrjun)"),
    ("8 x H100, all-gather (xxrjun)", "2 x 8 H100, all-reduce, AWS p5 EFA"),
    ("8 x H100, all-reduce (NVIDIA DGX H100)", "2 x 8 H100, all-reduce, AWS p5 EFA"),
    ("8 x H100, all-reduce (Voltage Park, one process)", "4 x 8 H100, all-reduce, InfiniBand (Voltage Park)"),
    ("8 x H100, all-reduce (Voltage Park, one process)", "4 x 8 H100, all-gather, InfiniBand (Voltage Park)"),
    ("4 x 8 H100, all-reduce, InfiniBand (Voltage Park)", "4 x 8 H100, all-gather, InfiniBand (Voltage Park)"),
)


@dataclass
class Evaluated:
    dataset: Dataset
    profile: Profile
    result: acc.LogResult
    points: list[cal.Observation]
    tuner_us: list[float]
    native: dict[str, list[float]]


def native_times(host: PluginHost, plan: acc.Plan, work: Path) -> dict[str, list[float]]:
    """The built-in layer with ASTRA-sim's HGX-H100-validated files, for one node of 8 GPUs."""
    if plan.ranks != 8 or plan.nodes != 1:
        return {}
    system = {"plugin": "native", "astra_file": str(ASTRA / "HGX-H100-validated.json")}
    out = {}
    for backend, label in (("analytical", "native unaware"), ("congestion", "native aware")):
        network = {"plugin": backend, "astra_file": str(ASTRA / "HGX-H100-validated.yml")}
        times = []
        for i, size in enumerate(plan.sizes):
            prefix = write_ranks(work / f"{backend}{i}",
                                 [[collective(0, COMM_TYPE[plan.test], plan.comm_size(size))]] * plan.ranks)
            data = {"workload": {"trace": prefix}, "system": system, "network": network}
            times.append(simulate(data, host=host)["finish_ns"] / 1000)
        out[label] = times
    return out


def evaluate(host: PluginHost, dataset: Dataset, folder: Path, work: Path, native: bool) -> Evaluated:
    log = dataset.log(folder)
    profile = load_profile(dataset.profile)
    in_place = dataset.table is not None   # busbw tables give the in-place column only
    plan = acc.plan_log(log, profile, dataset.profile, in_place=in_place, min_bytes=dataset.min_bytes,
                        max_bytes=dataset.max_bytes, algorithms=dataset.algorithms)
    result = acc.evaluate(plan, profile, host)
    model = acc.nccl_model(plan, profile)   # the forcing whole: NCCL_PROTO too
    tuner = [model.tuner_estimate_us(plan.collective, plan.model_bytes(s), plan.ranks, plan.nodes)
             for s in plan.sizes]
    points = cal.observations([log], plan.gpus_per_node, in_place, dataset.min_bytes, dataset.max_bytes,
                              dataset.algorithms)
    return Evaluated(dataset, profile, result, points, tuner, native_times(host, plan, work) if native else {})


def pct(error: float) -> str:
    return f"{100 * error:.1f}%"


def fmt_err(predicted: float, measured: float) -> str:
    return f"{100 * (predicted / measured - 1):+.1f}%"


def log_errors(times: list[float], sizes: tuple[acc.Size, ...]) -> list[float]:
    return [math.log(t / s.measured_us) for t, s in zip(times, sizes)]


def summary_table(rows: list[Evaluated], natives: bool) -> list[str]:
    head = "| data | sizes | profile | launch | nccl | " + " | ".join(BAND_NAMES) + " | NCCL's tuner estimate |"
    head += " native unaware | native aware |" if natives else ""
    head += " goal |"
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for ev in rows:
        result, plan = ev.result, ev.result.plan
        bands = result.bands
        band_cells = " | ".join(f"{pct(bands[name][0])}{' ⚠' if bands[name][0] > BAND_GOAL else ''}"
                                if name in bands else "–" for name in BAND_NAMES)
        launch = plan.launch
        mode = ("not printed: 1 GPU per process" if launch is None else
                f"{launch.gpus_per_thread} GPU{'s' if launch.gpus_per_thread > 1 else ''} per thread"
                + (", CUDA graph" if launch.cuda_graph_iters else "")
                + (" (the table's script)" if ev.dataset.launch is not None else ""))
        sizes = f"{acc.size_label(plan.sizes[0].nbytes)} – {acc.size_label(plan.sizes[-1].nbytes)} ({len(plan.sizes)})"
        goal = f"≤ {100 * ev.dataset.goal:.0f}%" if ev.dataset.goal else ""
        line = (f"| {ev.dataset.label}{' — ' + ev.dataset.note if ev.dataset.note else ''} | {sizes} | "
                f"`{ev.dataset.profile}` | {mode} | **{pct(result.geomean_error)}** | {band_cells} | "
                f"{pct(cal.geomean_error(log_errors(ev.tuner_us, plan.sizes)))} |")
        if natives:
            for name in ("native unaware", "native aware"):
                line += f" {pct(cal.geomean_error(log_errors(ev.native[name], plan.sizes)))} |" \
                    if name in ev.native else " – |"
        lines.append(line + f" {goal} |")
    return lines


def detail_table(ev: Evaluated) -> list[str]:
    names = ["nccl", "tuner", *ev.native]
    times = {"nccl": [r.predicted_us for r in ev.result.sizes], "tuner": ev.tuner_us, **ev.native}
    lines = [f"#### {ev.dataset.label}", "",
             "| size | measured µs | " + " | ".join(f"{n} µs | {n} err" for n in names) + " | NCCL choice |",
             "| --- | --- | " + " | ".join("--- | ---" for _ in names) + " | --- |"]
    for i, r in enumerate(ev.result.sizes):
        cells = " | ".join(f"{times[n][i]:,.2f} | {fmt_err(times[n][i], r.size.measured_us)}" for n in names)
        c = r.choice
        lines.append(f"| {acc.size_label(r.size.nbytes)} | {r.size.measured_us:,.2f} | {cells} | "
                     f"{c.algorithm}/{c.protocol}, {c.channels} ch" + (f", {c.chunk_bytes // 1024} KiB chunks"
                                                                       if c.chunk_bytes >= 1024 else "") + " |")
    sizes = ev.result.plan.sizes
    lines.append("| geomean | | " + " | ".join(f" | {pct(cal.geomean_error(log_errors(times[n], sizes)))}"
                                               for n in names) + " | |")
    return lines + [""]


def moved_text(spec: Profile, fitted: Profile) -> str:
    parts = []
    for m in cal.movements(spec, fitted):
        parts.append(f"{m.name} {m.spec:.3g}→{m.fitted:.3g}{' (outside ' + f'{m.plausible[0]:g}–{m.plausible[1]:g})' if m.outside else ''}")
    return "; ".join(parts) or "–"


def holdout_table(rows: list[Evaluated]) -> list[str]:
    lines = ["| data | fitted sizes (4^k) | error on them | held-out sizes | error on held-out | "
             "spec-only error on held-out | parameters (spec → fitted) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for ev in rows:
        even, odd = cal.split_odd_powers(ev.points)
        if len(even) < 3 or not odd:
            continue
        fitted = cal.fit(ev.profile, even, f"benchmarks/accuracy.py on {ev.dataset.file}")
        lines.append(f"| {ev.dataset.label} | {len(even)} | {pct(cal.geomean_error(cal.log_errors(fitted, even)))} | "
                     f"{len(odd)} | **{pct(cal.geomean_error(cal.log_errors(fitted, odd)))}** | "
                     f"{pct(cal.geomean_error(cal.log_errors(ev.profile, odd)))} | {moved_text(ev.profile, fitted)} |")
    return lines


def transfer_table(rows: list[Evaluated]) -> list[str]:
    by_label = {ev.dataset.label: ev for ev in rows}
    lines = ["| fitted on | judged on | parameters (spec → fitted) | spec-only error | after the transfer | |",
             "| --- | --- | --- | --- | --- | --- |"]
    for source_label, target_label in TRANSFERS:
        source, target = by_label.get(source_label), by_label.get(target_label)
        if source is None or target is None:
            continue
        fitted = cal.fit(source.profile, source.points, f"benchmarks/accuracy.py on {source.dataset.file}")
        calibration = calibration_of(fitted)
        assert calibration is not None
        moved = cal.transfer(calibration, target.profile)
        before = cal.geomean_error(cal.log_errors(target.profile, target.points))
        after = cal.geomean_error(cal.log_errors(moved, target.points))
        verdict = "better" if after < before - 5e-4 else "same" if after <= before + 5e-4 else "**worse**"
        lines.append(f"| {source_label} | {target_label} | {moved_text(source.profile, fitted)} | {pct(before)} | "
                     f"{pct(after)} | {verdict} |")
    return lines


def replace_between(text: str, markers: tuple[str, str], body: str, path: Path) -> str:
    begin, end = markers
    if begin not in text or end not in text:
        sys.exit(f"{path} lacks the {begin} / {end} markers")
    head, rest = text.split(begin, 1)
    return head + begin + "\n" + body + "\n" + end + rest.split(end, 1)[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "accuracy.md")
    parser.add_argument("--extra-logs", type=Path,
                        help="also evaluate the non-redistributed public logs found in this folder")
    parser.add_argument("--detail", action="append", default=[],
                        help="print the per-size table of datasets whose label contains this text "
                             "(default: the goal datasets)")
    args = parser.parse_args()
    host = make_plugin_host()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        core = [evaluate(host, d, LOGS, Path(tmp) / str(i), True) for i, d in enumerate(DATASETS)]
        extra = []
        if args.extra_logs is not None:
            extra = [evaluate(host, d, args.extra_logs, Path(tmp) / f"x{i}", False) for i, d in enumerate(EXTRA)
                     if (args.extra_logs / d.file).is_file()]
    wanted = args.detail or ["NVIDIA DGX", "AWS"]
    details = [line for ev in core if any(text in ev.dataset.label for text in wanted) for line in detail_table(ev)]
    core_elapsed = time.perf_counter() - started
    body = "\n".join(["### Spec-only profiles, geomean error per log and per size band", "",
                      *summary_table(core, natives=True), "",
                      "### Per size", "", *details,
                      "### Calibration: fit on 4^k, predict the other powers of two", "", *holdout_table(core), "",
                      "### Calibration transfer: fit on one log, predict another collective or node count", "",
                      *transfer_table(core), "",
                      f"_Generated by `python benchmarks/accuracy.py` in {core_elapsed:.0f} s._"])
    text = args.out.read_text()
    text = replace_between(text, MARKERS["core"], body, args.out)
    print(body)
    if extra:
        extra_body = "\n".join(["### Spec-only profiles (logs not redistributed)", "",
                                *summary_table(extra, natives=False), "",
                                "### Calibration transfer on those logs", "", *transfer_table(core + extra), "",
                                f"_Generated by `python benchmarks/accuracy.py --extra-logs DIR` on "
                                f"{time.strftime('%Y-%m-%d')}._"])
        text = replace_between(text, MARKERS["extra"], extra_body, args.out)
        print(extra_body)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
