"""The `chakra-sim analyze` command: a job's traces analysed, or two runs compared.

    chakra-sim analyze PREFIX [--out DIR] [--json] [--imbalance-threshold X]
                       [--compute-time duration|roofline --peak-tflops F --mem-bw-gbps F]
                       [--comm-group groups.json] [--dependencies all|data]
    chakra-sim analyze --results A/results.json --results B/results.json [--out DIR] [--json]

`--out` writes analysis.json with the plots of `chakra_core.report.plots`. `--results` compares
two runs instead (`chakra_core.report.compare`).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Callable, Iterator, Mapping

import click
from rich.console import Console

from chakra_core.feeder.base import DEPENDENCY_MODES
from chakra_core.cli.output import out_console
from chakra_core.cli.output import CliError, err_console, tool_errors
from chakra_core.tools.analyze.job import DEFAULT_THRESHOLD, analyze_traces
from chakra_core.tools.analyze.output import COMPARISON_JSON, analysis_files, report_json, write_outputs
from chakra_core.tools.analyze.scan import ComputeTiming
from chakra_core.tools.analyze.tables import print_report


def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE


@click.command()
@click.argument("prefix", required=False)
@click.option("--results", "results_files", multiple=True, metavar="RESULTS.json",
              type=click.Path(exists=True, dir_okay=False),
              help="compare two runs instead: give --results twice (A, then B)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="write analysis.json and the plots (comparison.json and compare.png with --results) here")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON instead of tables")
@click.option("--imbalance-threshold", type=click.FloatRange(min=1.0), default=DEFAULT_THRESHOLD,
              show_default=True, help="flag a collective whose max/min comm_size over its group's ranks is above this")
@click.option("--compute-time", type=click.Choice(["duration", "roofline"]), default="duration", show_default=True,
              help="time of a compute node: its traced duration, or the roofline of --peak-tflops and --mem-bw-gbps")
@click.option("--peak-tflops", type=click.FloatRange(min=0, min_open=True),
              help="roofline peak compute, TFLOP/s (10^12 FLOP/s)")
@click.option("--mem-bw-gbps", type=click.FloatRange(min=0, min_open=True),
              help="roofline memory bandwidth, GB/s (10^9 B/s)")
@click.option("--comm-group", type=click.Path(exists=True, dir_okay=False),
              help="ASTRA-sim communicator-group JSON ({\"<pg_name>\": [ranks]}), as `run` takes it")
@click.option("--dependencies", type=click.Choice(DEPENDENCY_MODES), default="all", show_default=True,
              help="dependencies the critical path follows: data and control, or data only")
@click.option("--debug", is_flag=True, help="show tracebacks")
@click.pass_context
def analyze(ctx: click.Context, prefix: str | None, results_files: tuple[str, ...], out_dir: str | None,
            as_json: bool, imbalance_threshold: float, compute_time: str, peak_tflops: float | None,
            mem_bw_gbps: float | None, comm_group: str | None, dependencies: str, debug: bool) -> None:
    """Analyze a job's traces without simulating: node counts, compute time and critical path,
    communication volume and sizes, communicator groups, collective size imbalance across ranks.
    With --results, compare two runs' results.json instead.

    \b
    Examples:
      chakra-sim analyze traces/all_reduce
      chakra-sim analyze traces/scale --compute-time roofline --peak-tflops 100 --mem-bw-gbps 1600 --out analysis/
      chakra-sim analyze --results base/results.json --results faster/results.json --out compare/
    """
    if results_files:
        trace_options = [name for name in ("imbalance_threshold", "compute_time", "peak_tflops", "mem_bw_gbps",
                                           "comm_group", "dependencies") if _given(ctx, name)]
        if prefix or trace_options:
            what = f"--{trace_options[0].replace('_', '-')}" if trace_options else f"the trace prefix {prefix}"
            raise CliError(f"--results compares two runs; {what} applies to a trace analysis: give one or the other")
        _compare(results_files, out_dir, as_json, debug)
        return
    if not prefix:
        raise CliError("give a trace PREFIX (files PREFIX.<rank>.et), or --results twice")
    timing = _timing(compute_time, peak_tflops, mem_bw_gbps)
    console = out_console(stderr=as_json)
    with tool_errors(f"the analysis to {out_dir}", debug):
        try:
            groups = None
            if comm_group:
                from chakra_core.config.astra import read_comm_groups

                groups = read_comm_groups(Path(comm_group))
            with _progress() as progress:
                report = analyze_traces(prefix, timing, imbalance_threshold, groups, dependencies, progress)
        except OSError as exc:    # tool_errors words an OSError as a write failure
            raise CliError(f"cannot read {exc.filename or prefix}: {exc.strerror or exc}") from exc
        written = write_outputs(Path(out_dir), analysis_files(report)) if out_dir else []
    _show(report.to_json(), lambda: print_report(report, console), written, console, as_json)


def _show(document: Mapping[str, object], print_tables: Callable[[], None], written: list[Path],
          console: Console, as_json: bool) -> None:
    """The JSON document on stdout (--json) or its tables, then the files written."""
    if as_json:
        click.echo(report_json(document), nl=False)
    else:
        print_tables()
    for path in written:
        console.print(f"wrote {path}", highlight=False)


@contextlib.contextmanager
def _progress() -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr (a terminal only): ranks read, of how many, time left."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("reading the traces"), BarColumn(), MofNCompleteColumn(), TextColumn("ranks"),
                  TimeRemainingColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task("ranks", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def _timing(mode: str, peak_tflops: float | None, mem_bw_gbps: float | None) -> ComputeTiming:
    if mode == "roofline":
        absent = [flag for flag, value in (("--peak-tflops", peak_tflops), ("--mem-bw-gbps", mem_bw_gbps))
                  if value is None]
        if absent:
            raise CliError(f"--compute-time roofline needs {' and '.join(absent)}")
        return ComputeTiming("roofline", peak_tflops, mem_bw_gbps)
    given = [flag for flag, value in (("--peak-tflops", peak_tflops), ("--mem-bw-gbps", mem_bw_gbps))
             if value is not None]
    if given:
        raise CliError(f"{given[0]} applies to --compute-time roofline only")
    return ComputeTiming()


def _compare(results_files: tuple[str, ...], out_dir: str | None, as_json: bool, debug: bool) -> None:
    from chakra_core.report.compare import compare_results, load_results, print_comparison

    if len(results_files) != 2:
        more = "; to compare more runs, make them one sweep (chakra-sim sweep) and read its sweep.csv"
        raise CliError(f"--results compares exactly two runs (A, then B); {len(results_files)} given"
                        + (more if len(results_files) > 2 else ""))
    console = out_console(stderr=as_json)
    with tool_errors(f"the comparison to {out_dir}", debug):
        first, second = (load_results(Path(path)) for path in results_files)
        diff = compare_results(first, second, *results_files)
        written = []
        if out_dir:
            from chakra_core.report.plots import COMPARE_PNG, compare_png

            written = write_outputs(Path(out_dir), {COMPARISON_JSON: report_json(diff.to_json()),
                                                     COMPARE_PNG: compare_png(diff)})
    _show(diff.to_json(), lambda: print_comparison(diff, console), written, console, as_json)
