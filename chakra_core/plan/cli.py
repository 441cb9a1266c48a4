"""`chakra-sim plan JOB.yaml`: the command line of a plan (chakra_core.plan.search)."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import time
from pathlib import Path
from typing import Any

import click
import yaml
from pydantic import ValidationError
from rich.markup import escape
from rich.table import Table

from chakra_core.cli.output import err_console, fail, out_console, warn
from chakra_core.config.files import read_config_file
from chakra_core.config.manifest import validation_problems
from chakra_core.errors import ChakraSimError, ManifestError
from chakra_core.jobs.spec import Cluster
from chakra_core.json_types import JsonObject, JsonValue
from chakra_core.plan.compare import comparison_files, comparison_rows, price_for
from chakra_core.plan.compare_table import print_comparison, print_costs
from chakra_core.plan.layouts import SHARDINGS
from chakra_core.plan.marks import describe, mark_rows, parse_mark
from chakra_core.plan.report import plan_files
from chakra_core.plan.search import GIB, SIMULATED, Plan, PlanOptions, plan
from chakra_core.report.writers import prepare_output_dir, write_run_files
from chakra_core.sweep.paths import KeyPathError, parse_key_path, set_key_path
from chakra_core.sweep.run import EXECUTORS, Execution
from chakra_core.sweep.stop import Interrupted

_MULTIPLE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*x\s*$")


@click.command()
@click.argument("job_file", metavar="JOB.yaml", type=click.Path(dir_okay=False))
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False), metavar="CLUSTER.yaml",
              help="the cluster to plan for: a YAML file with `cluster:` (gpus, profile, gpus_per_node) and "
                   "optionally `network:`, replacing the job's")
@click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
              help="local: a process pool on this machine; ray: Ray tasks")
@click.option("--workers", "-j", type=click.IntRange(min=1),
              help="simulations at once  [default: the cores this process may use]")
@click.option("--address", metavar="HOST:PORT", help="Ray cluster to connect to (with --executor ray)")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="simulate until these many fastest layouts are known for sure")
@click.option("--batch", type=click.IntRange(min=1), default=4, show_default=True,
              help="layouts simulated per round before the bound is checked again")
@click.option("--micro-batches", default="1,2,4,8", show_default=True, metavar="N,N,...",
              help="micro-batch sizes to try")
@click.option("--ep", "eps", metavar="N,N,...",
              help="a mixture of experts: expert parallel sizes to try  [default: every divisor of num_experts]")
@click.option("--etp", "etps", default="tp,1", show_default=True, metavar="N|tp,...",
              help="a mixture of experts: expert tensor parallel sizes to try (tp: the layout's own)")
@click.option("--sharding", "shardings", metavar="S,S,...",
              help="data parallelism to try: megatron (Megatron's DDP and distributed optimizer), optim, optim_grads, "
                   "optim_grads_params (Megatron-FSDP's ZeRO-1/2/3; one pipeline stage)  [default: as the job says]")
@click.option("--mark", "marks", multiple=True, metavar="job|KEY=V,...",
              help="rank this layout too, simulated whatever its bound: `job` (the job manifest's own layout) or "
                   "keys over it, e.g. tp=2,pp=8,vp=4,ep=32,etp=1 (tp pp vp cp ep etp mb recompute dist_opt)")
@click.option("--vary", "vary", multiple=True, metavar="KEY=V1,V2,...",
              help="plan again for each value of a manifest key (e.g. job.cluster.profile=h100-hgx-ndr400,"
                   "h200-hgx-ndr400; network.generator.bandwidth_gbps=1x,2x,4x multiplies the job's value)")
@click.option("--price", "price_texts", multiple=True, metavar="[VALUE=]USD",
              help="what a GPU-hour costs, USD, for the cost per million tokens: one price for every --vary value, "
                   "or VALUE=USD per value (e.g. --price h100-hgx-ndr400=2.5 --price gb200-nvl72-ndr400=6)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="output folder  [default: the job's output.dir, else results/plan-<job name>]")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="fail a simulation that runs longer")
@click.option("--force", is_flag=True, help="simulate again the layouts an earlier plan finished")
@click.option("--headroom", "headroom_gib", type=click.FloatRange(min=0), metavar="GIB",
              help="memory each GPU keeps beside a layout's predicted peak (CUDA context, NCCL buffers, "
                   "fragmentation), GiB, for every layout  [default: worked out per layout; docs/plan.md]")
@click.option("--check-memory/--no-check-memory", default=True, show_default=True,
              help="list the traces' tensors so that the manifest's memory layer (e.g. memory: {plugin: hbm}) "
                   "sets each simulated layout's peak memory beside the prediction")
@click.option("--offload", is_flag=True,
              help="a layout that does not fit in memory is tried again with the fewest layers' activations "
                   "offloaded to host memory that make it fit (pp 1, no recomputation), and with the smallest "
                   "quarter of its optimizer offloaded that makes it fit (docs/plan.md)")
@click.option("--keep-traces", is_flag=True,
              help="keep each simulated layout's generated traces in OUT/simulations (gigabytes for a large "
                   "model's layout; by default they are removed once it is simulated, its results kept)")
@click.option("--quiet", "-q", is_flag=True, help="no progress, only the best layouts")
@click.option("--debug", is_flag=True, help="show tracebacks")
def plan_command(job_file: str, cluster_file: str | None, executor: str, workers: int | None, address: str | None,
                 top: int, batch: int, micro_batches: str, eps: str | None, etps: str, shardings: str | None,
                 marks: tuple[str, ...],
                 vary: tuple[str, ...], price_texts: tuple[str, ...], out_dir: str | None, timeout: float | None, force: bool,
                 headroom_gib: float | None, check_memory: bool, offload: bool, keep_traces: bool, quiet: bool,
                 debug: bool) -> None:
    """Find the fastest parallel layout of a training job that fits in memory.

    Enumerates every valid TP / PP / VP / CP / DP / micro-batch / recomputation / distributed-
    optimizer layout of JOB.yaml's `job:` (a job manifest, docs/training.md; a mixture of experts'
    EP and ETP too), predicts each one's
    peak memory per GPU and drops those that do not fit, with a reserve for the CUDA context, NCCL
    and fragmentation (--headroom sets it), in the memory a program can use; then simulates in
    order of a lower bound on the step time until no remaining layout can enter the --top
    fastest (--mark: where a given layout ranks among them). Writes plan.csv,
    plan.parquet, plan.json, pareto.png and breakdown.png to OUT, the simulations to
    OUT/simulations (a sweep: rerunning the command resumes it). See docs/plan.md.

    \b
    Examples:
      chakra-sim plan examples/plan-gpt-1.7b.yaml --top 1
      chakra-sim plan job.yaml --cluster h200-1024.yaml --executor ray
      chakra-sim plan job.yaml --vary job.cluster.profile=h100-hgx-ndr400,h200-hgx-ndr400
      chakra-sim plan examples/plan-qwen3-235b.yaml --mark job --top 3
    """
    try:
        path = Path(job_file)
        manifest = read_config_file(path)
        base_dir = path.resolve().parent
        if cluster_file is not None:
            manifest = with_cluster(manifest, Path(cluster_file))
        sizes = _sizes(micro_batches)
        job = manifest.get("job")
        name = str(job.get("name", path.stem)) if isinstance(job, dict) else path.stem
        output = manifest.get("output")
        folder = output.get("dir") if isinstance(output, dict) and isinstance(output.get("dir"), str) else None
        out = Path(out_dir) if out_dir else base_dir / (folder or f"results/plan-{name}")
        cases = varied(manifest, vary)
        prices = _prices(price_texts, [label for label, _ in cases])
        settings: JsonObject = {"top": top, "batch": batch, "micro_batches": sizes, "vary": list(vary),
                    "check_memory": check_memory, "headroom_gib": headroom_gib}
        search: dict[str, Any] = {"micro_batches": sizes}
        if eps is not None:   # the settings name what was given: a dense plan's stay as they were
            search["ep"] = settings["ep"] = _sizes(eps, "--ep")
        if etps != "tp,1":
            search["etp"] = _etps(etps)
            settings["etp"] = [size or "tp" for size in search["etp"]]
        if shardings is not None:
            search["sharding"] = settings["sharding"] = _shardings(shardings)
        if offload:
            search["offload"] = settings["offload"] = True
        if marks:
            settings["mark"] = list(marks)
        options = PlanOptions(top, batch, search, check_memory=check_memory,
                              headroom_gib=headroom_gib, source=job_file, progress=None if quiet else _progress)
        execution = Execution(executor, workers, address, force, timeout, job_traces="keep" if keep_traces else "drop")
        summary = []
        unfit = []
        for label, case in cases:
            where = out if label is None else out / _slug(label)
            started = time.perf_counter()
            job = case.get("job")
            if marks and isinstance(job, dict):   # per case: --vary may change the GPUs, and so dp
                job = {**job, "cluster": job.get("cluster", case.get("cluster"))}
                options = dataclasses.replace(options, include=tuple(parse_mark(mark, job) for mark in marks))
            found = plan(case, base_dir, where, options, execution)
            why = found.no_fit()
            if why is not None:   # nothing to rank: an error, and no table written for it
                unfit.append(why if label is None else f"{label}: {why}")
                continue
            prepare_output_dir(where)
            written, warnings = write_run_files(where, plan_files(found, {**settings, "case": label}))
            _print(found, label, top, quiet, time.perf_counter() - started)
            print_costs(found, price_for(prices, label))
            for row in mark_rows(found):
                out_console().print(describe(row), highlight=False, markup=False, soft_wrap=True)
            warn(found.warnings + warnings)
            for file in written:
                out_console().print(f"wrote {file}", highlight=False)
            summary.append((label, found))
        if len(summary) > 1:
            rows = comparison_rows(summary, prices)
            print_comparison(rows)
            for file in write_run_files(out, comparison_files(rows))[0]:
                out_console().print(f"wrote {file}", highlight=False)
        if unfit:
            raise ChakraSimError("; ".join(unfit))
    except ChakraSimError as exc:
        fail(exc, debug)
    except KeyboardInterrupt as exc:
        by = f" by {exc.args[0]}" if isinstance(exc, Interrupted) else " by SIGINT"   # Python's own handler's
        err_console.print(f"interrupted{by}: finished simulations are kept; run the same command again to resume",
                          highlight=False)
        raise SystemExit(exc.exit_status if isinstance(exc, Interrupted) else 130) from None


def with_cluster(manifest: JsonObject, cluster_file: Path) -> JsonObject:
    """The job manifest planned on the cluster a cluster file describes."""
    data = read_config_file(cluster_file)
    unknown = sorted(set(data) - {"cluster", "network"})
    if unknown or not isinstance(data.get("cluster"), dict):
        raise ManifestError([(f"{cluster_file}: {unknown[0] if unknown else 'cluster'}",
                              "a cluster file has `cluster:` (gpus, profile, gpus_per_node) and optionally "
                              "`network:`")])
    try:   # its own mistakes name the cluster file, not the job's
        Cluster.model_validate(data["cluster"])
    except ValidationError as exc:
        raise ManifestError(validation_problems(exc, ("cluster",), str(cluster_file), Cluster)) from None
    manifest = copy.deepcopy(manifest)
    job = manifest.get("job")
    if not isinstance(job, dict):
        raise ManifestError([("job", "required: plan searches the layouts of a training job (docs/plan.md)")])
    job["cluster"] = data["cluster"]
    manifest.pop("cluster", None)
    if "network" in data:
        manifest["network"] = data["network"]
    return manifest


def varied(manifest: JsonObject, vary: tuple[str, ...]) -> list[tuple[str | None, JsonObject]]:
    """One manifest per value of each --vary (the manifest itself without any)."""
    if not vary:
        return [(None, manifest)]
    cases: list[tuple[str | None, JsonObject]] = []
    for spec in vary:
        key, sep, values = spec.partition("=")
        if not sep or not key.strip() or not values.strip():
            raise ManifestError([(f"--vary {spec}", "expected KEY=V1,V2,... (e.g. job.cluster.gpus=512,1024)")])
        try:
            path = parse_key_path(key.strip())
        except KeyPathError as exc:
            raise ManifestError([(f"--vary {spec}", str(exc))]) from None
        for text in values.split(","):
            case = copy.deepcopy(manifest)
            value = _value(manifest, path, text, spec)
            try:
                set_key_path(case, path, value)
            except KeyPathError as exc:
                raise ManifestError([(f"--vary {spec}", str(exc))]) from None
            cases.append((f"{key.strip()}={text.strip()}", case))
    return cases


def _value(manifest: JsonObject, path: tuple[str | int, ...], text: str, spec: str) -> JsonValue:
    """A --vary value: `2x` multiplies the manifest's number (or each number of its list)."""
    multiple = _MULTIPLE.match(text)
    if multiple is None:
        value: JsonValue = yaml.safe_load(text)
        return value
    node: Any = manifest
    for part in path:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            raise ManifestError([(f"--vary {spec}", f"{text.strip()} multiplies the manifest's value, but it "
                                  "has none at that key")]) from None
    factor = float(multiple.group(1))
    if isinstance(node, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in node):
        return [v * factor for v in node]
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return node * factor
    raise ManifestError([(f"--vary {spec}", f"{text.strip()} multiplies a number, but the manifest has "
                          f"{node!r} there")])


def _prices(texts: tuple[str, ...], labels: list[str | None]) -> dict[str, float]:
    """--price: USD per GPU-hour by --vary value (the label or its value), "" for every value."""
    prices: dict[str, float] = {}
    known = {key for label in labels if label is not None for key in (label, label.partition("=")[2])}
    for text in texts:
        value, sep, amount = text.rpartition("=")
        if sep and value.strip() not in known:
            raise ManifestError([(f"--price {text}", f"{value.strip()!r} is not a --vary value"
                                  + (f"; the values are {', '.join(sorted(known))}" if known else
                                     " (no --vary given: --price USD prices the plan)"))])
        try:
            price = float(amount)
        except ValueError:
            price = math.nan
        if not math.isfinite(price) or price <= 0:
            raise ManifestError([(f"--price {text}", "expected [VALUE=]USD, a positive price per GPU-hour")])
        prices[value.strip()] = price
    return prices


def _sizes(text: str, option: str = "--micro-batches") -> list[int]:
    try:
        sizes = sorted({int(part) for part in text.split(",")})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 1:
        raise ManifestError([(option, f"expected positive whole numbers separated by commas, not {text!r}")])
    return sizes


def _shardings(text: str) -> list[str]:
    """--sharding's strategies, each one of layouts.SHARDINGS."""
    names = list(dict.fromkeys(part.strip() for part in text.split(",")))
    bad = [name for name in names if name not in SHARDINGS]
    if bad or not names:
        raise ManifestError([("--sharding", f"{bad[0] if bad else text!r}: expected some of {', '.join(SHARDINGS)}, "
                                            "separated by commas")])
    return names


def _etps(text: str) -> list[int | None]:
    """--etp's sizes: `tp` (None: the layout's tp) or positive whole numbers."""
    sizes: list[int | None] = []
    for part in text.split(","):
        sizes.extend([None] if part.strip() == "tp" else _sizes(part, "--etp"))
    return list(dict.fromkeys(sizes))


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", label)


def _progress(line: str) -> None:
    err_console.print(line, highlight=False, markup=False, soft_wrap=True)


def _print(found: Plan, label: str | None, top: int, quiet: bool, wall_s: float) -> None:
    console = out_console()
    counts = found.counts()
    title = (f"plan{'' if label is None else f' ({label})'}: {found.profile}, {found.usable_bytes / GIB:.2f} GiB "
             "usable per GPU")
    table = Table(title=title, title_justify="left")
    columns = [("#", "right"), ("layout", "left"), ("step s", "right"), ("vs #1", "right"), ("TFLOP/s/GPU", "right"),
               ("MFU", "right"),
               ("memory GiB", "right"), *([("simulated GiB", "right")] if found.memory_checked else []),
               ("reserve GiB", "right"), ("exposed comm s", "right"), ("bubble s", "right")]
    for column, justify in columns:   # the layout whole on one line: narrow terminals fold the numbers' headers
        table.add_column(column, justify=justify, no_wrap=column == "layout")   # type: ignore[arg-type]
    ranked = found.ranked()
    versus = found.versus_best(ranked)
    shown = ranked[:top]
    for rank, candidate in enumerate(shown, start=1):
        step = candidate.training
        if candidate.status != SIMULATED or step is None:
            break
        simulated = candidate.simulated_memory
        checked = [] if not found.memory_checked else ["-" if simulated is None else f"{simulated / GIB:.1f}"]
        slower, tie = versus(candidate)
        vs = "" if rank == 1 or slower is None else f"{100 * slower:+.1f}%" + (" tie" if tie else "")
        table.add_row(str(rank), escape(candidate.layout.label()), f"{step.step_time_s:.3f}", vs,
                      f"{step.tflops_per_gpu:.0f}", f"{100 * step.mfu:.1f}%", f"{candidate.memory.total / GIB:.1f}",
                      *checked, f"{candidate.reserve.total / GIB:.1f}", f"{step.exposed_comm_s:.3f}",
                      f"{step.breakdown_s.get('bubble', 0.0):.3f}")
    console.print(table)
    more = sum(c.status == SIMULATED for c in ranked[top:])
    if more:
        console.print(f"{more} more simulated layout(s) in plan.csv (--top {top} shows the {top} fastest)",
                      highlight=False)
    band = found.error_band()
    if band is not None:
        console.print(f"error band: ±{100 * band.geomean_error:.0f}%, the model's geomean error on {band.runs} "
                      f"published {band.scope} runs (docs/training-accuracy.md); a layout within it of #1 is a "
                      "tie: the model cannot tell the two apart", highlight=False, markup=False, soft_wrap=True)
    else:
        console.print("error band: none (no published run compared yet): steps are not ranked beyond the model's "
                      "own precision", highlight=False, markup=False, soft_wrap=True)
    console.print(f"memory: {found.headroom.describe()}", highlight=False, markup=False, soft_wrap=True)
    checks = [c for c in found.candidates if c.memory_check is not None]
    if checks:
        worst = max(checks, key=lambda c: abs(c.memory_check or 0.0))
        console.print(f"memory: the memory layer's simulated peaks of {len(checks):,} layout(s) are within "
                      f"{100 * abs(worst.memory_check or 0.0):.2f}% of the predictions (worst: "
                      f"{worst.layout.label()})", highlight=False, markup=False)
    console.print(f"layouts: {counts['tried']:,} tried, {counts['enumerated']:,} valid, {counts['fit']:,} fit in "
                  f"memory, {counts['simulated'] + counts['failed']:,} simulated ({found.simulated:,} now, "
                  f"{found.reused:,} from an earlier plan; {counts['failed']:,} failed), {counts['pruned']:,} "
                  f"pruned by their bound, {counts['does not fit']:,} too big; {found.rounds} round(s), "
                  f"{wall_s:.1f} s", highlight=False)
