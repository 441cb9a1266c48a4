#!/usr/bin/env python3
"""Byte comparison of what chakra-sim writes, before and after a change that must not change results.

Runs every example, every ASTRA-sim reference case of ../shared/ref-results and the workloads of
the other benchmarks (scale, network scale, generated GPT, converted PyTorch, nccl-tests sizes,
a sweep, a timeline) through the command line, exactly as a user would, and records a digest of
each file it writes (results.json; timeline.json; the sweep's table without its wall-time
column), or of the error message when a run is refused. Paths are written relative to
placeholders (<repo>, <shared>, <out>) so that two checkouts in different folders compare.

    python benchmarks/results_identity.py --record benchmarks/data/results-identity.json
    python benchmarks/results_identity.py --check benchmarks/data/results-identity.json [--keep DIR]

`--check` exits 1 and names every case whose bytes differ; `--keep DIR` leaves the normalised
files in DIR to diff them. `--only SUBSTRING` runs the cases whose name contains it.
The digests committed in benchmarks/data/results-identity.json were recorded before the
redesign of issue 18 (commit 209b5b0), checked after it, and recorded again with issue 19,
whose `nccl` system layer folds equivalent ranks, gives each group its share of the NICs and
lets operations in flight share NVLink and NICs: 52 `nccl` outputs changed then (their
folding section, event count and fidelity text; and the 2-GPU data-parallel all-reduce of
"gpt dp2 tp2 pp2 roofline-profile nccl", which NCCL's NVLS rule for two GPUs per node now sends
over a ring: +0.5%), every other output stayed byte-identical. Recorded again with issue 20,
whose `nccl` layer times what NCCL executes instead of NCCL's tuner estimate: the 52 `nccl`
outputs, the llama3-70b example (an `nccl` job) and the accuracy tables changed (54 of 370),
every other output stayed byte-identical. Recorded again (issue 21, first part): the 116
`congestion` outputs gained the new `failed_links: []` and `degraded_links: []` keys in their
echoed configuration; their times and link statistics are unchanged. Recorded again (issue 21,
forwarding): the 116 `congestion` outputs gained `forwarding` in their echoed configuration and
network summary. On ASTRA-sim's lists (every reference case, the scale runs, the restart and
ring cases) times and link statistics are unchanged (store and forward stays their default);
the generated fat-trees (k=8 all-to-all, the GPT job's network) now default to cut-through,
which changes their times; fair ring all-reduces are now timed in closed form (their
`closed_form_messages` count changed, times unchanged). The fair k=8 all-to-all is now timed as
one step of flows: the same finish, link bytes, busy times and peaks; its `closed_form_messages`
count changed. Recorded again (issue 22, frictions): the 54 `nccl` outputs and the accuracy tables
say what the NCCL choice table counts (a `choices_counted` key, column names) and write µs, not
us; their times are unchanged. Recorded again (issue 21, NCCL on the network): the 53 `nccl`
results.json (52 cases and the llama3-70b example) changed only in the layer's `fidelity` text,
which now says that a network layer carries what crosses nodes; none of them has a network.
Recorded again (issue 23, memory checked): the local-HBM `hbm` layer folds, so the
hbm_vs_pool example now simulates one rank for four (its rank rows, finish and weighted totals
unchanged; its folding section, event count, pre_pass_ranks and memory_series name the
representative only) and the DLRM hbm run's folding reason no longer names hbm; the
llama3-70b example's echoed job gained `tensors: false`; the plan-gpt-1.7b example (a job
manifest, now with an `hbm` memory layer) is recorded for the first time. 366 outputs stayed
byte-identical. Recorded again (issue 31, part 7, NCCL across nodes): 55 of 371 outputs changed,
all of the `nccl` layer. Every `nccl` results.json echoes the layer's new `nccl_version` setting
(null); those across nodes (the p5 and p4de nccl-tests sizes, the two `scale ... nccl` runs)
also changed times, from the proxy thread's network steps and the channels NCCL's search finds
on the NICs (p5 all-reduce of 64 MiB 625 -> 407 us: 16 channels on its 8 plugin devices make
NCCL's tuner pick NVLS-tree; the scale runs +0.03% and +0.09%); the llama3-70b and plan-gpt-1.7b
examples moved by +0.004% and -0.005%; the accuracy tables changed. The other 316 outputs
stayed byte-identical. Recorded again (issue 31, the step model): the two job examples changed,
every other output (369 of 371) stayed byte-identical. The llama3-70b example's step went from
8.023 s to 10.879 s (NeMo 24.07 measured 10.751 s for this job) from what a real step adds to
kernels benchmarked alone (compute.effects: communication's SMs and HBM, the sustained clock,
GEMM epilogues, causal backward, host launch, GPU variation), the Megatron-Core rules at
d98e8a64 (bucketing, parameter all-gather dispatch, step overheads, Adam's traffic) and
Transformer Engine's fp8 work; its results carry the error band and the rate ceiling. The
plan-gpt-1.7b example changed the same way and gained the `vs_best` and `tie` columns and the
memory reserve. Recorded again (issue 39, fifo steps): the fifo k=8 all-to-all is now timed as
one step of messages (fifosteps.py); its times and every link statistic are unchanged, its
`closed_form_messages` (0 -> 16,256) and event count changed, and its folding reason no longer
names the native system layer (which solves collectives whole now that the network reserves
links). The other 370 outputs stayed byte-identical. Recorded again (issue 33, output): the two
job examples' compute table is titled "kernels by kind, every rank's summed" (it sums a folded
run's class mates too), and their error band's `worst_error` is taken as the geomean takes a
run, exp(max |ln(predicted/measured)|) - 1 (0.204 -> 0.256 for the llama3-70b example: its
worst run is 20.4% too fast); nothing else in them changed, and the other 369 outputs stayed
byte-identical. Recorded again (issue 32, one generator): `generate transformer` is now a front
over the training-job generator (chakra_core.jobs), so the GPT it writes for the five `gpt dp2 tp2
pp2` outputs is the job's Megatron-LM step (flash attention, bucketed and overlapped gradient
reduce-scatter, parameter all-gathers, step overheads, Adam's traffic, vocabulary padded to
128 x tp) instead of the old generator's; only those five changed, by their traces, and the
other 366 outputs stayed byte-identical. Recorded again (issue 36, context parallelism): jobs
echo the new `parallel.cp_comm_type` (the plan-gpt-1.7b example changed only there), and CP now
runs as ring attention by default (Transformer Engine's p2p: cp steps beside the exchanges of
key/value blocks), which folds to one rank per pipeline stage and CP index: the llama3-70b
example (CP 2) went from 10.879 s to 10.927 s (NeMo 24.07 measured 10.751 s), simulating 8
ranks instead of 4, and its error band follows the accuracy table simulated again with it
(geomean 7.0% -> 6.9%, worst 25.6% -> 27.5%). The other 369 outputs stayed byte-identical.
Recorded again (issue 37, folding in time): the two job examples' `folding` section gained `time`
(the llama3-70b example simulates 32 of its 64 micro-batches and adds the other 8 periods of 4,
repeating every period: `cycle_periods` 1, `cycle_ns`;
plan-gpt-1.7b says why it simulates every micro-batch: its `hbm` layer); every other byte of both,
the event counts and the compute layer's summed FLOPs included, is unchanged (compared with the
code before, field by field), and the other 369 outputs stayed byte-identical.
Recorded again (issues 31 and 36, fp8 parameters): the llama3-70b example's error band follows the
accuracy table simulated again (its Megatron-Bridge fp8 runs with fp8 parameters, a run counted
twice removed): geomean 6.88% -> 6.85%, mean signed -2.62% -> -2.65%; nothing else in it changed
(the example does not set fp8_param_gather), and the other 370 outputs stayed byte-identical.
Recorded again (fp8 copies on Blackwell, attention kernels by library): the llama3-70b example's
error band follows the accuracy table simulated again (8 Blackwell fp8 runs without transposes, 21
NeMo 24.03/24.07 runs with FlashAttention-2): geomean 6.85% -> 6.24%, mean signed -2.65% ->
+5.17%, worst 27.5% -> 19.0%; nothing else in it changed (compared field by field with the code
before; the example is an H100 job with attention_kernel auto), and the other 370 outputs stayed
byte-identical.
Recorded again (issue 37, the hbm layer folds in time): the plan-gpt-1.7b example, whose `hbm`
layer had it simulate every micro-batch, now simulates 6 of its 16 and carries 10 periods of 1
forward (`folding.time`: folded, cycle_periods 1, cycle_ns 113,066,562); every other field,
the memory layer's peaks, allocations and bytes-in-use series included, is unchanged (compared
with the code before, field by field), and the other 370 outputs stayed byte-identical.
Recorded again (issues 31 and 34, the host's waits in MoE layers, HybridEP): the llama3-70b
example's error band follows the accuracy table simulated again (current scaling's amax is two
kernels: the class's current-scaling runs 0.01-0.05% slower): geomean 6.2412% -> 6.2486%, mean signed +5.1706% -> +5.1779%;
nothing else in it changed (compared field by field with the code before), and the other 370
outputs stayed byte-identical.
Recorded again (issue 31, NCCL trees on 2 nodes): the four AWS p4de all-reduces (1 KiB, 1 MiB, 64 MiB,
1 GiB on 2 x 8 A100) and the accuracy tables changed: on 2 nodes NCCL's tree reads twice the NIC
rate inside the node, so 64 MiB and 1 GiB now run as a tree (1 GiB: 40,635 -> 24,147 us against
26,217 measured), and a Simple tree pays its pipeline's fill instead of NCCL's treeCorrectionFactor
(1 KiB +0.6 us, 1 MiB +52 us). The other 366 outputs stayed byte-identical (every training job:
the 170 runs of the accuracy table predict the same steps).
Recorded again (issue 36, optimizer offload): three generated jobs that offload (activations; a
quarter of the optimizer, with and without overlap) added; the other 371 outputs byte-identical.
Recorded again (issue 31, one data-parallel group's collectives one after another, as NCCL runs a
process group's on one stream): six outputs changed. The llama3-70b example's step went from
10.926524 s to 10.910207 s, and its error band follows the accuracy table simulated again (geomean
6.2486% -> 6.2975%, mean signed +5.1779% -> +5.1073%); the plan-gpt-1.7b example's step from
1.836503 s to 1.835472 s (exposed DP 7.2 ms -> 6.2 ms); "gpt dp2 tp2 pp2 hbm congestion
timeline" changed only in its timeline, whose gradient reductions now start one after another
(its results.json is byte-identical); the three offload jobs changed only in their error band
(its class's runs simulated again: geomean 4.1829% -> 4.3273%, mean signed -3.5865% -> -3.7123%,
worst 24.19% -> 25.01%). The other 368 outputs stayed byte-identical.
Recorded again (issue 37, ring attention folded): the llama3-70b example (TP 4, CP 2: each ring
within a node) folds its two CP ranks into one, so its `folding` section lists 4 representatives
of 16 ranks instead of 8 of 8, and its event count halves (580,002 -> 290,001); every other byte,
its step of 10.910206933 s and every rank's row included, is unchanged. The other 373 outputs
stayed byte-identical.
Recorded again (issue 34, uneven all-to-alls): the converted DLRM traces now keep their
all_to_allv's 8 pieces (comm_send_splits / comm_recv_splits), recorded in an 8-rank job and
simulated here on 2 ranks, so the three "pytorch dlrm" runs gain one warning ("all-to-alls among
all ranks carry 8 pieces ... split evenly"); their times and every other byte are unchanged. The
other 371 outputs stayed byte-identical.
Recorded again (issues 31 and 37, kernels re-timed when communication starts beside them): four
outputs changed, all runs of the `achievable` compute layer beside the `nccl` system layer: the
llama3-70b example and the `job offload activations k=2`, `job offload optimizer 0.25` and its
overlapped variant results, by kernels re-timed when a collective or message starts while they run
and by the error bands that follow the accuracy table simulated again (the two not separated); the
other 370 outputs stayed byte-identical.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import yaml
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
REF_RESULTS = SHARED / "ref-results"
ASTRA_BACKENDS = {"congestion_unaware": "analytical", "congestion_aware": "congestion"}

sys.path.insert(0, str(ROOT))

from chakra_core.cli import main as cli  # noqa: E402
from chakra_core.schema import pb  # noqa: E402
from chakra_core.testing import collective, write_ranks  # noqa: E402


class Runner:
    """Runs cases in a scratch folder and collects their normalised outputs."""

    def __init__(self, scratch: Path, only: str | None):
        self.scratch, self.only = scratch, only
        self.outputs: dict[str, str] = {}
        self.cli = CliRunner()

    def normalise(self, text: str, out: Path | None = None) -> str:
        replacements = [(str(ROOT), "<repo>"), (str(SHARED.resolve()), "<shared>"), (str(SHARED), "<shared>"),
                        (str(self.scratch), "<scratch>")]
        if out is not None:
            replacements.insert(0, (str(out), "<out>"))
        for old, new in replacements:
            text = text.replace(old, new)
        return text

    def wanted(self, name: str) -> bool:
        return self.only is None or self.only in name

    def invoke(self, args: list[str]) -> tuple[int, str]:
        result = self.cli.invoke(cli, args, catch_exceptions=False)
        return result.exit_code, result.output

    def run(self, name: str, args: list[str], files: tuple[str, ...] = ("results.json",)) -> None:
        """`chakra-sim run ARGS --out <fresh folder> --quiet`; record `files` or the error."""
        if not self.wanted(name):
            return
        out = self.scratch / "out" / name.replace("/", "_")
        shutil.rmtree(out, ignore_errors=True)
        code, output = self.invoke(["run", *args, "--out", str(out), "--quiet"])
        if code != 0:
            self.outputs[name + ": error"] = self.normalise(f"exit {code}\n{output}", out)
            return
        for file in files:
            self.outputs[f"{name}: {file}"] = self.normalise((out / file).read_text(), out)

    def manifest(self, name: str, data: dict, files: tuple[str, ...] = ("results.json",)) -> None:
        if not self.wanted(name):
            return
        path = self.scratch / "manifests" / (name.replace("/", "_") + ".yaml")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=True))
        self.run(name, [str(path)], files)


# Cases -----------------------------------------------------------------------------------------
def examples(r: Runner) -> None:
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        if path.name.startswith("sweep"):
            continue
        r.run(f"example {path.name}", [str(path)])
    name = "example timeline allreduce_8npu.yaml"
    if r.wanted(name):
        out = r.scratch / "timeline.json"
        code, output = r.invoke(["timeline", str(ROOT / "examples" / "allreduce_8npu.yaml"), "--out", str(out)])
        r.outputs[name] = r.normalise(out.read_text() if code == 0 else f"exit {code}\n{output}")
    name = "example sweep_bandwidth.yaml"
    if r.wanted(name):
        out = r.scratch / "sweep"
        code, output = r.invoke(["sweep", str(ROOT / "examples" / "sweep_bandwidth.yaml"), "--out", str(out),
                                 "--quiet", "--workers", "2"])
        if code != 0:
            r.outputs[name + ": error"] = r.normalise(output, out)
            return
        for results in sorted(out.glob("points/*/results.json")):
            r.outputs[f"{name}: {results.parent.name}/results.json"] = r.normalise(results.read_text(), out)
        rows = list(csv.reader(io.StringIO((out / "sweep.csv").read_text())))
        keep = [i for i, column in enumerate(rows[0]) if column != "wall_s"]
        r.outputs[f"{name}: sweep.csv"] = r.normalise(
            "\n".join(",".join(row[i] for i in keep) for row in rows), out)


def reference_runs(r: Runner) -> None:
    cases = json.loads((REF_RESULTS / "astra-sim.json").read_text())["runs"]
    for case in cases:
        args = ["--workload", str(SHARED / "ref-traces" / case["workload"]),
                "--astra-system", str(REF_RESULTS / case["system"]),
                "--astra-network", str(REF_RESULTS / case["network"]),
                "--network", ASTRA_BACKENDS[case["backend"]]]
        name = f"reference {case['workload']} {case['system']} {case['network']} {case['backend']}"
        r.run(name, args)


def scale_trace(r: Runner, ranks: int, nodes: int) -> str:
    folder = r.scratch / f"scale-{ranks}x{nodes}"
    if not folder.exists():
        subprocess.run([sys.executable, str(SHARED / "bench" / "gen_scale_trace.py"), "--out", str(folder),
                        "--ranks", str(ranks), "--nodes-per-rank", str(nodes)], check=True,
                       stdout=subprocess.DEVNULL)
    return str(folder / "scale")


def scale(r: Runner) -> None:
    configs = REF_RESULTS / "configs"
    for ranks, nodes, message_level in ((64, 2000, False), (16, 500, True)):
        cases = []
        for network in (f"Ring_{ranks}npus", f"Switch_{ranks}npus"):
            for backend in ("analytical", "congestion"):
                for fold in ("off", "auto"):
                    for closed_form in ((True, False) if backend == "congestion" and message_level else (True,)):
                        cases.append((f"scale {ranks}x{nodes} {network} {backend} fold={fold} "
                                      f"closed_form={closed_form}", network, backend, fold, closed_form))
        nccl = f"scale {ranks}x{nodes} nccl h100-hgx-ndr400"
        if not any(r.wanted(case[0]) for case in cases) and not r.wanted(nccl):
            continue
        prefix = scale_trace(r, ranks, nodes)
        for name, network, backend, fold, closed_form in cases:
            data = {"workload": {"trace": prefix, "fold": fold},
                    "system": {"plugin": "native", "astra_file": str(configs / "sys_ring_roofline.json")},
                    "network": {"plugin": backend, "astra_file": str(configs / f"{network}.yml")}}
            if not closed_form:
                data["network"]["closed_form"] = False
            r.manifest(name, data)
        r.manifest(nccl, {"workload": {"trace": prefix}, "system": {"plugin": "nccl", "profile": "h100-hgx-ndr400"}})


def network_scale(r: Runner) -> None:
    npus, size = 128, 1 << 20
    folder = r.scratch / "network"
    for mode in ("fifo", "fair"):
        prefix = write_ranks(folder / "a2a", [[collective(1, pb.ALL_TO_ALL, size)]] * npus)
        r.manifest(f"network fat-tree k=8 all-to-all {mode}", {
            "workload": {"trace": prefix},
            "system": {"plugin": "native", "all-to-all-implementation": ["direct"]},
            "network": {"plugin": "congestion", "mode": mode,
                        "generator": {"kind": "fat_tree", "k": 8, "bandwidth_gbps": 50, "latency_ns": 500}}})
        prefix = write_ranks(folder / "ar", [[collective(1, pb.ALL_REDUCE, size)]] * npus)
        for closed_form in (True, False):
            r.manifest(f"network ring all-reduce {npus} {mode} closed_form={closed_form}", {
                "workload": {"trace": prefix},
                "system": {"plugin": "native", "all-reduce-implementation": ["ring"]},
                "network": {"plugin": "congestion", "mode": mode, "topology": ["Ring"], "npus_count": [npus],
                            "bandwidth": [50], "latency": [500], "closed_form": closed_form}})


def generated_gpt(r: Runner) -> None:
    if not r.wanted("gpt"):
        return
    prefix = r.scratch / "gpt" / "gpt"
    if not prefix.parent.exists():
        code, output = r.invoke(["generate", "transformer", "--layers", "4", "--hidden", "512", "--heads", "8",
                                 "--seq", "512", "--vocab", "51200", "--batch", "8", "--tp", "2", "--pp", "2",
                                 "--dp", "2", "--sp", "--dp-reduce", "rs-ag", "--output", str(prefix)])
        assert code == 0, output
    for fold in ("auto", "off"):
        r.manifest(f"gpt dp2 tp2 pp2 roofline switch fold={fold}", {
            "workload": {"trace": str(prefix), "fold": fold},
            "compute": {"plugin": "roofline", "peak_tflops": 989, "memory_bandwidth_gbps": 3350},
            "network": {"plugin": "analytical", "topology": ["Switch"], "npus_count": [8],
                        "bandwidth": [50.0], "latency": [1000.0]}})
    r.manifest("gpt dp2 tp2 pp2 roofline-profile nccl", {
        "workload": {"trace": str(prefix)},
        "compute": {"plugin": "roofline", "profile": "h100-sxm-hgx"},
        "system": {"plugin": "nccl", "profile": "h100-sxm-hgx"}})
    r.manifest("gpt dp2 tp2 pp2 hbm congestion timeline", {
        "workload": {"trace": str(prefix)},
        "memory": {"plugin": "hbm", "bandwidth_gbps": 3350},
        "compute": {"plugin": "roofline", "peak_tflops": 989},
        "network": {"plugin": "congestion", "topology": ["Ring", "Switch"], "npus_count": [2, 4],
                    "bandwidth": [200, 50], "latency": [100, 1000]},
        "output": {"timeline": True}}, files=("results.json", "timeline.json"))


def pytorch(r: Runner) -> None:
    if not r.wanted("pytorch"):
        return
    dlrm = ROOT / "examples" / "pytorch" / "dlrm"
    prefix = r.scratch / "dlrm" / "dlrm"
    if not prefix.parent.exists():
        for rank in (0, 1):
            kineto = sorted(dlrm.glob(f"worker{rank}_*.json.gz"))[0]
            code, output = r.invoke(["convert", "pytorch", str(dlrm / f"dlrm_eg_{rank}.json.gz"),
                                     "--kineto", str(kineto), "--output", str(prefix)])
            assert code == 0, output
    network = {"plugin": "analytical", "topology": ["Switch"], "npus_count": [2], "bandwidth": [50], "latency": [500]}
    r.manifest("pytorch dlrm replay", {"workload": {"trace": str(prefix)}, "network": network})
    r.manifest("pytorch dlrm hbm tensors", {"workload": {"trace": str(prefix)}, "network": network,
                                            "memory": {"plugin": "hbm", "bandwidth_gbps": 2000}})
    r.manifest("pytorch dlrm roofline a100 nccl", {
        "workload": {"trace": str(prefix)}, "compute": {"plugin": "roofline", "profile": "a100-sxm-hgx"},
        "system": {"plugin": "nccl", "profile": "a100-sxm-hgx"}})


def nccl_sizes(r: Runner) -> None:
    folder = r.scratch / "nccl"
    for profile, ranks in (("h100-sxm-hgx", 8), ("h100-aws-p5-efa", 16), ("a100-aws-p4de-efa", 16)):
        for comm in (pb.ALL_REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.ALL_TO_ALL):
            for size in (1 << 10, 1 << 20, 64 << 20, 1 << 30):
                name = f"nccl {profile} {pb.CollectiveCommType.Name(comm)} {size}"
                if not r.wanted(name):
                    continue
                prefix = write_ranks(folder / f"{comm}-{size}-{ranks}", [[collective(1, comm, size)]] * ranks)
                r.manifest(name, {"workload": {"trace": prefix}, "system": {"plugin": "nccl", "profile": profile}})


def restarts(r: Runner) -> None:
    """Runs that start over: closed-form links found shared, folding proved wrong, a folded deadlock."""
    from chakra_core.testing import comp, recv, send

    folder = r.scratch / "restarts"
    ring = {"plugin": "congestion", "topology": ["Ring"], "npus_count": [8], "bandwidth": [50.0], "latency": [500.0]}
    ranks = [[collective(3, pb.ALL_REDUCE, 1 << 20)] for _ in range(8)]
    ranks[0] = [comp(1, 1), send(2, 1, 1 << 20, deps=[1]), collective(3, pb.ALL_REDUCE, 1 << 20, deps=[2])]
    ranks[1].append(recv(2, 0, 1 << 20))
    prefix = write_ranks(folder / "p2p-first-hop", ranks)
    r.manifest("restart p2p on claimed links (first hop)", {"workload": {"trace": prefix}, "network": ring})
    # rank 0's message reaches the claimed link 2 -> 3 on its third hop, while the group's
    # all-reduce still runs there
    ranks = [[comp(1, 1)] for _ in range(8)]
    ranks[0] = [send(1, 3, 1024)]
    ranks[2] = [collective(1, pb.ALL_REDUCE, 16 << 20, pg_name="g")]
    ranks[3] = [collective(1, pb.ALL_REDUCE, 16 << 20, pg_name="g"), recv(2, 0, 1024)]
    prefix = write_ranks(folder / "p2p-later-hop", ranks)
    r.manifest("restart p2p on claimed links (later hop)", {
        "workload": {"trace": prefix, "comm_groups": {"g": [2, 3]}}, "network": ring})
    prefix = write_ranks(folder / "fold", [[collective(1, pb.ALL_REDUCE, 1 << 20)]] * 8)
    for algorithm in ("halvingDoubling", "doubleBinaryTree", "ring"):
        r.manifest(f"restart folded {algorithm}", {
            "workload": {"trace": prefix},
            "system": {"plugin": "native", "all-reduce-implementation": [algorithm]},
            "network": {"plugin": "analytical", "topology": ["Ring"], "npus_count": [8], "bandwidth": [50],
                        "latency": [500]}})
    prefix = write_ranks(folder / "deadlock", [[recv(1, (rank - 1) % 4, 64)] for rank in range(4)])
    r.manifest("restart folded deadlock", {
        "workload": {"trace": prefix},
        "network": {"plugin": "analytical", "topology": ["Ring"], "npus_count": [4], "bandwidth": [50],
                    "latency": [500]}})


def benchmark_docs(r: Runner) -> None:
    """The rows of the tables the accuracy benchmark generates (docs/accuracy.md): its numbers, not the
    prose around them (the data's folder is named in a header)."""
    name = "benchmark accuracy.py"
    if not r.wanted(name):
        return
    out = r.scratch / "accuracy.md"
    shutil.copy(ROOT / "docs" / "accuracy.md", out)
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "accuracy.py"), "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL, cwd=ROOT)
    lines = [line for line in out.read_text().splitlines()
             if line.startswith("|") and "source in" not in line and not line.startswith("| ---")]
    r.outputs[name] = r.normalise("\n".join(lines))


EXPLAINED: dict[str, str] = {}
"""Outputs that differ from the recorded digests for a reason stated here (timing identical)."""

def offloaded_jobs(r: Runner) -> None:
    """Generated training jobs that offload to host memory: activations, and a quarter of the optimizer
    with and without its copies overlapped."""
    model = {"layers": 4, "hidden": 1024, "ffn_hidden": 2816, "heads": 8, "kv_heads": 4, "vocab": 8000}
    for name, training in (("activations k=2", {"cpu_offloading_num_layers": 2}),
                           ("optimizer 0.25", {"optimizer_offload_fraction": 0.25}),
                           ("optimizer 0.25 overlapped", {"optimizer_offload_fraction": 0.25,
                                                          "overlap_cpu_optimizer_d2h_h2d": True})):
        r.manifest(f"job offload {name}", {
            "job": {"name": "offload", "model": model, "training": {"seq": 2048, "global_batch": 8, **training},
                    "cluster": {"gpus": 4, "profile": "h100-hgx-ndr400"}},
            "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"},
            "memory": {"plugin": "hbm", "track_tensors": False}})


CASES: list[Callable[[Runner], None]] = [examples, reference_runs, scale, network_scale, generated_gpt,
                                         offloaded_jobs, pytorch, nccl_sizes, restarts, benchmark_docs]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--record", type=Path, help="write the digests to this file")
    action.add_argument("--check", type=Path, help="compare with the digests in this file")
    parser.add_argument("--keep", type=Path, help="also write the normalised outputs to this folder")
    parser.add_argument("--only", help="only the cases whose name contains this")
    args = parser.parse_args()
    if not REF_RESULTS.exists():
        sys.exit(f"{REF_RESULTS} not found: this script needs ../shared beside the checkout")
    started = time.perf_counter()
    os.environ.setdefault("PYTHONHASHSEED", "0")
    with tempfile.TemporaryDirectory(prefix="chakra-identity-") as tmp:
        runner = Runner(Path(tmp).resolve(), args.only)
        for case in CASES:
            case(runner)
    digests = {name: hashlib.sha256(text.encode()).hexdigest() for name, text in sorted(runner.outputs.items())}
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        for name, text in runner.outputs.items():
            (args.keep / (hashlib.sha1(name.encode()).hexdigest()[:12] + ".txt")).write_text(f"{name}\n{text}")
    wall = time.perf_counter() - started
    if args.record:
        args.record.write_text(json.dumps({"cases": len(digests), "digests": digests}, indent=1) + "\n")
        print(f"recorded {len(digests)} outputs in {wall:.0f} s -> {args.record}")
        return 0
    expected = json.loads(args.check.read_text())["digests"]
    if args.only:
        expected = {name: digest for name, digest in expected.items() if args.only in name}
    differ = sorted(name for name in expected if name in digests and digests[name] != expected[name])
    missing = sorted(set(expected) - set(digests))
    new = sorted(set(digests) - set(expected))
    explained = [name for name in differ if name in EXPLAINED]
    differ = [name for name in differ if name not in EXPLAINED]
    for label, names in (("DIFFERENT", differ), ("MISSING (not produced now)", missing),
                         ("NEW (not recorded)", new)):
        for name in names:
            print(f"{label}: {name}")
    for name in explained:
        print(f"differs, explained: {name}: {EXPLAINED[name]}")
    same = len(expected) - len(differ) - len(missing) - len(explained)
    print(f"{same} of {len(expected)} outputs byte-identical, {len(explained)} explained ({wall:.0f} s)")
    return 1 if differ or missing or new else 0


if __name__ == "__main__":
    raise SystemExit(main())
