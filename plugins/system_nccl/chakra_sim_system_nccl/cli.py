"""The plugin's commands, added to `chakra-sim` through `chakra_sim_register_commands`:

- `chakra-sim calibrate LOG... --profile BASE --out PROFILE.yaml`: fit a hardware profile's
  physical NCCL parameters to your own nccl-tests output (chakra_sim_system_nccl.calibrate);
- `chakra-sim accuracy LOG... --profile P`: simulate the runs nccl-tests logs describe and compare
  with their measurements (chakra_sim_system_nccl.accuracy)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import get_args

import click
import yaml
from rich.table import Table

from chakra_core import (
    CliError, ManifestError, Profile, atomic_write_bytes, atomic_write_text, load_profile, out_console,
    print_warnings, tool_errors,
)
from chakra_sim_system_nccl import accuracy as acc
from chakra_sim_system_nccl import calibrate as cal
from chakra_sim_system_nccl.nccl_tests import load
from chakra_sim_system_nccl.tuning import PROTOCOLS, AlgorithmName


def _pct(error: float) -> str:
    return f"{100 * (math.exp(error) - 1):+.1f}%"


NCCL_ALGO = click.option(
    "--nccl-algo", "algorithms", multiple=True, type=click.Choice(get_args(AlgorithmName)),
    help="the algorithm the runs forced (NCCL_ALGO; repeat for several): NCCL chooses among these only")
NCCL_PROTO = click.option(
    "--nccl-proto", "protocols", multiple=True, type=click.Choice(PROTOCOLS),
    help="the protocol the runs forced (NCCL_PROTO; repeat for several)")
"""nccl-tests prints neither variable: the user says what the runs set."""


@click.command()
@click.argument("logs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--profile", "base", required=True, help="profile to start from: a shipped name "
              "(chakra-sim profiles) or a .yaml file; its calibration, if any, is replaced")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path),
              help="write the calibrated profile here (YAML, usable as a manifest's profile)")
@click.option("--name", help="the calibrated profile's name (default: the --out file's stem)")
@click.option("--in-place", is_flag=True, help="fit the in-place columns (default: out-of-place)")
@click.option("--min-bytes", type=click.IntRange(min=1), default=1, show_default=True,
              help="ignore smaller sizes")
@click.option("--max-bytes", type=click.IntRange(min=1), help="ignore larger sizes")
@click.option("--holdout", type=click.Choice(["none", "odd-powers"]), default="none", show_default=True,
              help="odd-powers: fit on sizes 4^k only and report the error on the other powers of two, "
                   "to see how well the fit predicts sizes it has not seen")
@NCCL_ALGO
@NCCL_PROTO
def calibrate(logs: tuple[Path, ...], base: str, out: Path | None, name: str | None, in_place: bool,
              min_bytes: int, max_bytes: int | None, holdout: str, algorithms: tuple[str, ...],
              protocols: tuple[str, ...]) -> None:
    """Fit a profile's physical NCCL parameters to nccl-tests output.

    LOG... are outputs of all_reduce_perf, all_gather_perf, reduce_scatter_perf or
    alltoall_perf, on the hardware the profile describes. The ranks come from each log;
    nodes from the profile's GPUs per node. Prints the fit error per size and how each
    parameter moved (with a warning when it leaves the range its sources allow), and writes a
    profile that `system: {plugin: nccl, profile: FILE.yaml}` can use.
    """
    with tool_errors(str(out) if out else "the profile"):
        profile = load_profile(base)
        parsed = [load(path) for path in logs]
        try:
            points = cal.observations(parsed, profile.gpus_per_node, in_place, min_bytes, max_bytes, algorithms,
                                      protocols)
        except ValueError as exc:
            raise CliError(str(exc)) from exc
        if holdout == "odd-powers":
            fit_on, held = cal.split_odd_powers(points)
        else:
            fit_on, held = points, []
        if not fit_on:
            raise CliError("no measurement to fit (check --min-bytes / --max-bytes / --holdout)")
        source = (f"chakra-sim calibrate on {', '.join(path.name for path in logs)} "
                  f"({'in' if in_place else 'out-of'}-place, {len(fit_on)} sizes) from profile {profile.name}")
        fitted = cal.fit(profile, fit_on, source)
        fitted = fitted.model_copy(update={"name": name or (out.stem if out else profile.name + "-calibrated")})
        _report(profile, fitted, fit_on, held)
        if out is not None:
            data = fitted.as_data()
            atomic_write_text(out, "# Written by chakra-sim calibrate: the base profile's values with a fitted "
                              "calibration.\n" + yaml.safe_dump(data, sort_keys=False))
            click.echo(f"wrote {out}")


def _report(spec: Profile, fitted: Profile, fit_on: list[cal.Observation], held: list[cal.Observation]) -> None:
    console = out_console()
    for title, points in (("fitted sizes", fit_on), ("held-out sizes", held)):
        if not points:
            continue
        spec_errors, fit_errors = cal.log_errors(spec, points), cal.log_errors(fitted, points)
        table = Table(title=f"{title}: measured vs predicted", show_lines=False)
        for column in ("log", "collective", "ranks", "size B", "measured µs", "spec µs", "spec err",
                       "calibrated µs", "error", "algorithm"):
            table.add_column(column, justify="left" if column in ("log", "collective", "algorithm") else "right")
        for point, choice, spec_error, fit_error in zip(points, cal.predict(fitted, points),
                                                        spec_errors, fit_errors):
            table.add_row(Path(point.log).name, point.collective, str(point.ranks), f"{point.nbytes:,}",
                          f"{point.time_us:,.2f}", f"{point.time_us * math.exp(spec_error):,.2f}",
                          _pct(spec_error), f"{choice.time_us:,.2f}", _pct(fit_error),
                          f"{choice.algorithm}/{choice.protocol}")
        console.print(table)
        console.print(f"{title}: geomean error {100 * cal.geomean_error(fit_errors):.1f}% calibrated, "
                      f"{100 * cal.geomean_error(spec_errors):.1f}% with the spec-only profile")
    moved = cal.movements(spec, fitted)
    if not moved:
        console.print("no parameter to fit: the sizes exercise none")
        return
    table = Table(title="fitted parameters", show_lines=False)
    for column in ("parameter", "spec-only", "fitted", "sources allow"):
        table.add_column(column, justify="left" if column in ("parameter", "sources allow") else "right")
    for m in moved:
        table.add_row(m.name, f"{m.spec:.3g}", f"{m.fitted:.3g}", f"{m.plausible[0]:g} – {m.plausible[1]:g}")
    console.print(table)
    for m in moved:
        if m.outside:
            print_warnings([f"{m.name} = {m.fitted:.3g} is outside {m.plausible[0]:g}–{m.plausible[1]:g}, the range "
                 f"its sources allow ({m.why}): the model misses something this parameter absorbs"])


# --------------------------------------------------------------------------- accuracy

def _one_line(exc: ManifestError) -> str:
    """A log's problems as one line: `path:line: reason` (the first few if several)."""
    shown = [f"{where}: {why}" for where, why in exc.problems[:3]]
    more = len(exc.problems) - len(shown)
    return "; ".join(shown) + (f" (and {more} more)" if more > 0 else "")


@click.command()
@click.argument("logs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--profile", "profile_name", required=True,
              help="hardware profile: a shipped name (chakra-sim profiles) or a .yaml file")
@click.option("--json", "as_json", is_flag=True, help="print JSON only (the table goes nowhere)")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
              help="write time and bus bandwidth vs size, measured and predicted (PNG; .svg/.pdf by suffix)")
@click.option("--in-place", is_flag=True, help="compare the in-place columns (default: out-of-place)")
@click.option("--min-bytes", type=click.IntRange(min=1), default=1024, show_default=True,
              help="ignore smaller sizes")
@click.option("--max-bytes", type=click.IntRange(min=1), help="ignore larger sizes")
@NCCL_ALGO
@NCCL_PROTO
def accuracy(logs: tuple[Path, ...], profile_name: str, as_json: bool, plot: Path | None, in_place: bool,
             min_bytes: int, max_bytes: int | None, algorithms: tuple[str, ...], protocols: tuple[str, ...]) -> None:
    """Simulate the runs nccl-tests logs describe and compare with what they measured.

    LOG... are outputs of all_reduce_perf, all_gather_perf, reduce_scatter_perf,
    alltoall_perf, broadcast_perf or reduce_perf as printed (header included). Each size is
    simulated through the `nccl` system layer on the profile, with the log's ranks, its nodes
    (the hosts of its device list, else ranks / the profile's GPUs per node) and the launch
    its header states (GPUs per thread, CUDA graph); nccl-tests does not print NCCL_ALGO or
    NCCL_PROTO, so give them when the run set them. Prints per log the measured and
    predicted times, NCCL's algorithm, protocol and channels, and the geometric-mean error
    exp(mean |ln(predicted / measured)|) - 1, also per size band.
    """
    from chakra_core import make_plugin_host

    with tool_errors(str(plot) if plot else "the plot"):
        try:
            profile = load_profile(profile_name)
        except ManifestError as exc:
            raise CliError(f"--profile {_one_line(exc)}") from exc
        try:
            plans = [acc.plan_log(load(path), profile, profile_name, in_place=in_place, min_bytes=min_bytes,
                                  max_bytes=max_bytes, algorithms=algorithms, protocols=protocols) for path in logs]
        except ManifestError as exc:
            raise CliError(_one_line(exc)) from exc
        notes = []
        for plan in plans:
            if plan.launch is None:
                notes.append(f"{plan.log}: no '# nThread' header line: simulated as one process per GPU "
                             "without CUDA graphs")
            elif plan.launch.cpu_time:
                notes.append(f"{plan.log}:{plan.launch.line}: the log reports host CPU time (-C 1), not "
                             "the collectives' duration: the comparison is of limited meaning")
        print_warnings(notes)
        host = make_plugin_host()
        results = [acc.evaluate(plan, profile, host) for plan in plans]
        if plot is not None:
            fmt = plot.suffix.lstrip(".").lower() if plot.suffix.lower() in (".svg", ".pdf") else "png"
            atomic_write_bytes(plot, acc.plot_png(results, fmt))
        if as_json:
            click.echo(json.dumps(acc.report_json(results), indent=2, allow_nan=False))
            if plot is not None:
                click.echo(f"wrote {plot}", err=True)
            return
        _accuracy_report(results)
        if plot is not None:
            click.echo(f"wrote {plot}")


def _launch_text(plan: acc.Plan) -> str:
    launch = plan.launch
    if launch is None:
        return "launch not stated (one process per GPU assumed)"
    parts = [f"nThread {launch.threads_per_process} x nGpus {launch.gpus_per_thread}"]
    if launch.processes is not None:
        parts.append(f"{launch.processes} process{'es' if launch.processes != 1 else ''}")
    parts.append(f"CUDA graph x{launch.cuda_graph_iters}" if launch.cuda_graph else "no CUDA graph")
    if launch.blocking:
        parts.append("blocking")
    return ", ".join(parts)


def _accuracy_report(results: list[acc.LogResult]) -> None:
    console = out_console()
    for result in results:
        plan = result.plan
        several_types = len({(r.size.dtype, r.size.redop) for r in result.sizes}) > 1
        table = Table(title=f"{plan.log}: {plan.test}, {plan.ranks} ranks on {plan.nodes} "
                            f"node{'s' if plan.nodes > 1 else ''}, profile {plan.profile}, "
                            f"{'in' if plan.in_place else 'out-of'}-place", caption=_launch_text(plan))
        columns = ["size", "bytes"] + (["type"] if several_types else []) + [
            "measured µs", "predicted µs", "error", "algorithm", "protocol", "channels"]
        for column in columns:
            table.add_column(column, justify="left" if column in ("size", "type", "algorithm", "protocol")
                             else "right")
        for r in result.sizes:
            cells = [acc.size_label(r.size.nbytes), f"{r.size.nbytes:,}"]
            if several_types:
                cells.append(f"{r.size.dtype} {r.size.redop}")
            cells += [f"{r.size.measured_us:,.2f}", f"{r.predicted_us:,.2f}", f"{100 * r.error:+.1f}%",
                      r.choice.algorithm, r.choice.protocol, str(r.choice.channels)]
            table.add_row(*cells)
        console.print(table)
        sizes = result.sizes
        console.print(f"geomean error {100 * result.geomean_error:.1f}% over {len(sizes)} sizes "
                      f"({acc.size_label(min(r.size.nbytes for r in sizes))} to "
                      f"{acc.size_label(max(r.size.nbytes for r in sizes))})")
        console.print("  by size: " + "; ".join(f"{name} {100 * error:.1f}% ({count})"
                                                for name, (error, count) in result.bands.items()))
    if len(results) > 1:
        errors = [r.log_error for result in results for r in result.sizes]
        console.print(f"all {len(results)} logs: geomean error {100 * acc.geomean_error(errors):.1f}% "
                      f"over {len(errors)} sizes")
