"""`chakra-sim calibrate LOG... --profile BASE --out PROFILE.yaml`: fit a hardware profile's NCCL
latency and bandwidth factors to your own nccl-tests output (chakra_sim_system_nccl.calibrate).

The plugin adds the command to `chakra-sim` through `chakra_sim_register_commands`."""

from __future__ import annotations

import math
from pathlib import Path

import click
import yaml
from rich.table import Table

from chakra_core._atomic import atomic_write_text
from chakra_core.cli.output import CliError, out_console, tool_errors
from chakra_core.hardware.profiles import Profile, load_profile
from chakra_sim_system_nccl import calibrate as cal
from chakra_sim_system_nccl.nccl_tests import load


def _pct(error: float) -> str:
    return f"{100 * (math.exp(error) - 1):+.1f}%"


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
def calibrate(logs: tuple[Path, ...], base: str, out: Path | None, name: str | None, in_place: bool,
              min_bytes: int, max_bytes: int | None, holdout: str) -> None:
    """Fit a profile's NCCL latency and bandwidth factors to nccl-tests output.

    LOG... are outputs of all_reduce_perf, all_gather_perf, reduce_scatter_perf or
    alltoall_perf, on the hardware the profile describes. The ranks come from each log;
    nodes from the profile's GPUs per node. Prints the fit error per size and writes a
    profile that `system: {plugin: nccl, profile: FILE.yaml}` can use.
    """
    with tool_errors(str(out) if out else "the profile"):
        profile = load_profile(base)
        parsed = [load(path) for path in logs]
        try:
            points = cal.observations(parsed, profile.gpus_per_node, in_place, min_bytes, max_bytes)
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
            data = fitted.model_dump(mode="json", exclude_none=True)
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
        for column in ("log", "collective", "ranks", "size B", "measured us", "spec us", "spec err",
                       "calibrated us", "error", "algorithm"):
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
    calibration = fitted.calibration
    assert calibration is not None   # cal.fit always sets one
    console.print("factors: latency " + ", ".join(f"{k} x{v:.3f}" for k, v in calibration.latency_scale.items())
                  + "; bandwidth " + ", ".join(f"{k} x{v:.3f}" for k, v in calibration.bandwidth_scale.items())
                  + "".join(f", NVLS {k // 1024} KiB chunks x{v:.3f}"
                            for k, v in sorted(calibration.nvls_chunk_scale.items())))
