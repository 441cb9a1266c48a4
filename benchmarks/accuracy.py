#!/usr/bin/env python3
"""Predicted vs measured collective times on public nccl-tests results (docs/accuracy.md).

For every log in plugins/system_nccl/tests/data/nccl-tests (sources and licences in its README), every
size is simulated as a one-collective trace, exactly as `chakra-sim run` would:

- `nccl`: the NCCL-aware system layer with a spec-only shipped profile (never fitted to
  these measurements);
- `native`: the built-in layer with ASTRA-sim's "HGX-H100-validated" system and network
  files (benchmarks/data/astra-sim), congestion-unaware (analytical) and congestion-aware
  (congestion backend); only for one node of 8 GPUs, which is what those files describe.

Then, for calibration: `chakra-sim calibrate`'s fit on the sizes 4^k (even powers of two)
of each log, and its error on the other powers of two.

    python benchmarks/accuracy.py [--out docs/accuracy.md] [--detail DATASET]

The tables replace the part of docs/accuracy.md between its `accuracy:begin` and
`accuracy:end` markers; the text around them is kept.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chakra_sim_system_nccl import calibrate as cal  # noqa: E402
from chakra_sim_system_nccl.nccl_tests import load, parse_busbw_table  # noqa: E402
from chakra_core.hardware.profiles import load_profile  # noqa: E402
from chakra_core.plugins import make_plugin_host  # noqa: E402
from chakra_core.schema import pb  # noqa: E402
from chakra_core.testing import collective, simulate, write_ranks  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
LOGS = ROOT / "plugins" / "system_nccl" / "tests" / "data" / "nccl-tests"
ASTRA = DATA / "astra-sim"
BEGIN, END = "<!-- accuracy:begin -->", "<!-- accuracy:end -->"
COMM_TYPE = {"all_reduce": pb.ALL_REDUCE, "all_gather": pb.ALL_GATHER, "reduce_scatter": pb.REDUCE_SCATTER,
             "alltoall": pb.ALL_TO_ALL}


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

    def log(self, folder: Path = LOGS):
        if self.table is not None:
            path = folder / self.file
            return parse_busbw_table(path.read_text(), *self.table, path=str(path))
        return load(folder / self.file)


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
            "a100-aws-p4de-efa", goal=0.15),
)


# Public logs whose repositories carry no licence, so they are not redistributed (see the data
# README for their URLs at a commit); --extra-logs DIR evaluates those found in DIR, stdout only.
EXTRA = (
    Dataset("4 x 8 H100, all-reduce, InfiniBand (Voltage Park)", "h100_voltagepark_4node_32gpu_allreduce_ib.txt",
            "h100-hgx-ndr400", goal=0.15, note="NIC count per node uncertain in the source"),
    Dataset("4 x 8 H100, all-gather, InfiniBand (Voltage Park)", "h100_voltagepark_4node_32gpu_allgather_ib.txt",
            "h100-hgx-ndr400", note="NIC count per node uncertain in the source"),
    Dataset("8 x H100, all-reduce (Voltage Park, one process)", "h100_voltagepark_1node_8gpu_allreduce.txt",
            "h100-sxm-hgx", note="one process drives 8 GPUs (-g 8)"),
    Dataset("8 x H100, all-reduce (Azure ND H100 v5, busbw table)",
            "h100_azure-ndv5_1node_8gpu_allreduce_busbw-table.txt", "h100-sxm-hgx", table=("all_reduce", 8)),
    Dataset("8 x H200, all-reduce (Azure ND H200 v5, busbw table)",
            "h200_azure-ndv5_1node_8gpu_allreduce_busbw-table.txt", "h200-sxm-hgx", table=("all_reduce", 8)),
    Dataset("8 x A100, all-reduce (Azure ND A100 v4, busbw table)",
            "a100_azure-ndv4_1node_8gpu_allreduce_busbw-table.txt", "a100-sxm-hgx", goal=0.15,
            table=("all_reduce", 8)),
)


def run_one(host, folder: Path, system: dict, network: dict | None, collective_name: str, size: int,
            ranks: int) -> float:
    """Finish time in microseconds of one collective of nccl-tests `size` on every rank."""
    comm_size = size // ranks if collective_name == "all_gather" else size   # nccl-tests counts the output
    prefix = write_ranks(folder, [[collective(0, COMM_TYPE[collective_name], comm_size)]] * ranks)
    data = {"workload": {"trace": prefix}, "system": system}
    if network is not None:
        data["network"] = network
    return simulate(data, host=host)["finish_ns"] / 1000


def predictions(host, dataset: Dataset, log, points, work: Path, native: bool = True) -> dict[str, list[float]]:
    out = {"nccl": [run_one(host, work / f"n{i}", {"plugin": "nccl", "profile": dataset.profile}, None,
                            log.collective, p.nbytes, p.ranks) for i, p in enumerate(points)]}
    if native and points and points[0].ranks == 8 and points[0].nodes == 1:
        system = {"plugin": "native", "astra_file": str(ASTRA / "HGX-H100-validated.json")}
        for backend, label in (("analytical", "native unaware"), ("congestion", "native aware")):
            network = {"plugin": backend, "astra_file": str(ASTRA / "HGX-H100-validated.yml")}
            out[label] = [run_one(host, work / f"{backend}{i}", system, network, log.collective, p.nbytes, 8)
                          for i, p in enumerate(points)]
    return out


def geomean(errors: list[float]) -> str:
    return f"{100 * cal.geomean_error(errors):.1f}%"


def fmt_err(predicted: float, measured: float) -> str:
    return f"{100 * (predicted / measured - 1):+.1f}%"


def size_label(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "accuracy.md")
    parser.add_argument("--extra-logs", type=Path,
                        help="also evaluate the non-redistributed public logs found in this folder "
                             "(printed, not written to --out)")
    parser.add_argument("--detail", action="append", default=[],
                        help="print the per-size table of datasets whose label contains this text "
                             "(default: the goal datasets)")
    args = parser.parse_args()
    host = make_plugin_host()
    started = time.perf_counter()
    summary = ["| data (source in plugins/system_nccl/tests/data/nccl-tests) | sizes | profile | nccl (spec-only) | "
               "native unaware | native aware | goal |", "| --- | --- | --- | --- | --- | --- | --- |"]
    details, calibration = [], ["| data | fitted sizes (4^k) | error on them | held-out sizes | "
                                "error on held-out | spec-only error on held-out |",
                                "| --- | --- | --- | --- | --- | --- |"]
    with tempfile.TemporaryDirectory() as tmp:
        for number, dataset in enumerate(DATASETS):
            log = dataset.log()
            profile = load_profile(dataset.profile)
            points = cal.observations([log], profile.gpus_per_node, False, dataset.min_bytes, dataset.max_bytes)
            predicted = predictions(host, dataset, log, points, Path(tmp) / str(number))
            errors = {name: [math.log(t / p.time_us) for t, p in zip(times, points)]
                      for name, times in predicted.items()}
            sizes = f"{size_label(points[0].nbytes)} – {size_label(points[-1].nbytes)} ({len(points)})"
            goal = f"≤ {100 * dataset.goal:.0f}%" if dataset.goal else ""
            summary.append(f"| {dataset.label}{' — ' + dataset.note if dataset.note else ''} | {sizes} | "
                           f"`{dataset.profile}` | {geomean(errors['nccl'])} | "
                           f"{geomean(errors['native unaware']) if 'native unaware' in errors else '–'} | "
                           f"{geomean(errors['native aware']) if 'native aware' in errors else '–'} | {goal} |")
            wanted = args.detail or ["NVIDIA DGX", "AWS"]
            if any(text in dataset.label for text in wanted):
                model_choices = cal.predict(profile, points)
                names = list(predicted)
                rows = [f"#### {dataset.label}", "",
                        "| size | measured us | " + " | ".join(f"{n} us | {n} err" for n in names) + " | NCCL choice |",
                        "| --- | --- | " + " | ".join("--- | ---" for _ in names) + " | --- |"]
                for i, p in enumerate(points):
                    cells = " | ".join(f"{predicted[n][i]:,.2f} | {fmt_err(predicted[n][i], p.time_us)}" for n in names)
                    choice = model_choices[i]
                    rows.append(f"| {size_label(p.nbytes)} | {p.time_us:,.2f} | {cells} | "
                                f"{choice.algorithm}/{choice.protocol}, {choice.channels} ch |")
                rows.append("| geomean | | " + " | ".join(f" | {geomean(errors[n])}" for n in names) + " | |")
                details.extend(rows + [""])
            even, odd = cal.split_odd_powers(points)
            if len(even) >= 3 and odd:
                fitted = cal.fit(profile, even, f"benchmarks/accuracy.py on {dataset.file}")
                calibration.append(
                    f"| {dataset.label} | {len(even)} | {geomean(cal.log_errors(fitted, even))} | {len(odd)} | "
                    f"**{geomean(cal.log_errors(fitted, odd))}** | {geomean(cal.log_errors(profile, odd))} |")
    elapsed = time.perf_counter() - started
    body = "\n".join(["### Spec-only profiles, geomean error per log", "", *summary, "",
                      "### Per size", "", *details,
                      "### Calibration: fit on 4^k, predict the other powers of two", "", *calibration, "",
                      f"_Generated by `python benchmarks/accuracy.py` in {elapsed:.0f} s._"])
    text = args.out.read_text() if args.out.exists() else f"{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        sys.exit(f"{args.out} lacks the {BEGIN} / {END} markers")
    head, rest = text.split(BEGIN, 1)
    args.out.write_text(head + BEGIN + "\n" + body + "\n" + END + rest.split(END, 1)[1])
    print(body)
    if args.extra_logs is not None:
        print(extra_table(host, args.extra_logs))
    return 0


def extra_table(host, folder: Path) -> str:
    """Spec-only nccl geomean errors for the EXTRA logs present in `folder` (busbw tables: in-place)."""
    rows = ["| data (not redistributed) | sizes | profile | nccl (spec-only) | goal |", "| --- | --- | --- | --- | --- |"]
    with tempfile.TemporaryDirectory() as tmp:
        for number, dataset in enumerate(EXTRA):
            if not (folder / dataset.file).is_file():
                continue
            profile = load_profile(dataset.profile)
            log = dataset.log(folder)
            points = cal.observations([log], profile.gpus_per_node, dataset.table is not None,
                                      dataset.min_bytes, dataset.max_bytes)
            times = predictions(host, dataset, log, points, Path(tmp) / str(number), native=False)["nccl"]
            errors = [math.log(t / p.time_us) for t, p in zip(times, points)]
            goal = f"≤ {100 * dataset.goal:.0f}%" if dataset.goal else ""
            rows.append(f"| {dataset.label}{' — ' + dataset.note if dataset.note else ''} | "
                        f"{size_label(points[0].nbytes)} – {size_label(points[-1].nbytes)} ({len(points)}) | "
                        f"`{dataset.profile}` | {geomean(errors)} | {goal} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
