"""`chakra-sim sweep SWEEP.yaml`: the command line of a sweep."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click
from rich.markup import escape
from rich.table import Table

from chakra_core.cli.output import CliError, err_console, fail, out_console, warn
from chakra_core.errors import ChakraSimError
from chakra_core.sweep.run import EXECUTORS, WALL_COLUMN, PointReport, SweepResult, run_sweep
from chakra_core.sweep.spec import Sweep, load_sweep
from chakra_core.sweep.stop import Interrupted
from chakra_core.sweep.task import Status

if TYPE_CHECKING:
    from rich.console import Console

SHOWN_ROWS = 40
"""Rows printed after the sweep; the table file has them all."""


@click.command()
@click.argument("sweep_file", metavar="SWEEP.yaml", type=click.Path(dir_okay=False))
@click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
              help="local: a process pool on this machine; ray: Ray tasks (pip install 'chakra-sim[ray]')")
@click.option("--workers", "-j", type=click.IntRange(min=1),
              help="points run at once  [default: the cores this process may use; on a Ray cluster: as many as "
                   "it runs]")
@click.option("--address", metavar="HOST:PORT",
              help="Ray cluster to connect to (default: $RAY_ADDRESS, else start a local Ray instance)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="output folder (overrides the sweep file's output.dir)")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True, max=float("inf"), max_open=True),
              metavar="SECONDS",
              help="stop a point that runs longer and record it as failed (overrides the sweep file's "
                   "timeout)  [default: no limit]")
@click.option("--force", is_flag=True, help="rerun every point, finished ones included")
@click.option("--quiet", "-q", is_flag=True, help="no progress and no table (warnings still go to stderr)")
@click.option("--debug", is_flag=True, help="show tracebacks")
def sweep(sweep_file: str, executor: str, workers: int | None, address: str | None, out_dir: str | None,
          timeout: float | None, force: bool, quiet: bool, debug: bool) -> None:
    """Run a manifest over a grid or list of overrides; write one table and a plot.

    SWEEP.yaml names a base manifest and the values to set on key paths
    (network.bandwidth[0], network.plugin, workload.trace ...): see
    docs/sweeps.md. Each point's results go to OUT/points/<id>/; the table
    (sweep.csv, sweep.parquet) and sweep.png to OUT. Points finished by an
    earlier run with the same manifest are not run again (--force runs them);
    failed ones are. Exit status 0 when every point succeeds, 1 when some
    failed (the table says which and why), 2 for a bad sweep file or point
    (every point is validated before any runs) or an output folder another
    run is writing, 130 / 143 when stopped by SIGINT / SIGTERM.

    \b
    Examples:
      chakra-sim sweep examples/sweep_bandwidth.yaml
      chakra-sim sweep big.yaml --timeout 600
      chakra-sim sweep big.yaml --executor ray --address head-node:6379
    """
    spec = None
    try:
        spec = load_sweep(sweep_file, out_dir)
        progress = _Progress(len(spec.points), quiet)
        with progress:
            result = run_sweep(spec, executor, workers, address, force, on_point=progress.update,
                               timeout=timeout)
    except ChakraSimError as exc:
        fail(exc, debug)
        return
    except KeyboardInterrupt as exc:   # Interrupted for SIGINT and SIGTERM (chakra_core.sweep.stop)
        # a plain KeyboardInterrupt is Python's own SIGINT handler's (a signal outside the sweep's handlers)
        by = f" by {exc.args[0]}" if isinstance(exc, Interrupted) else " by SIGINT"
        if spec is not None:
            err_console.print(f"interrupted{by}: finished points are kept in {spec.output_dir / 'points'}; "
                              "run the same command again to resume", soft_wrap=True, highlight=False)
        raise SystemExit(exc.exit_status if isinstance(exc, Interrupted) else 130) from None
    except OSError as exc:   # writing the table or the plot (a point's folder fails only its point)
        if debug or spec is None:
            raise
        raise CliError(f"cannot write the sweep's table to {spec.output_dir}: {exc.strerror or exc}") from exc

    console = out_console()
    if not quiet:
        _print_table(console, spec, result)
    ok = len(result.rows) - result.failed
    skipped = f", {result.skipped} already done" if result.skipped else ""
    console.print(f"{len(result.rows)} points: {ok} ok, {result.failed} failed{skipped}", highlight=False)
    if quiet:
        for row in result.rows:
            if row["status"] != "ok":
                console.print(f"point {row['point']} ({row['id']}) failed: {row['error']}",
                              soft_wrap=True, highlight=False)
    warn(result.warnings)
    for path in result.files:
        console.print(f"wrote {path}", highlight=False)
    if result.failed:
        raise SystemExit(1)


def _print_table(console: Console, spec: Sweep, result: SweepResult) -> None:
    table = Table(title=f"sweep {spec.name}", title_justify="left")
    shown = ["point", *spec.keys, "status", spec.metric.text, WALL_COLUMN]
    for column in shown:
        table.add_column(column, justify="right" if column in ("point", WALL_COLUMN) else "left",
                         overflow="fold")
    rows = result.rows
    if len(rows) > SHOWN_ROWS:   # failures first: they are what needs reading
        rows = sorted(rows, key=lambda r: r["status"] == "ok")[:SHOWN_ROWS]
    for row in rows:
        cells = []
        for column in shown:
            value = row.get(column)
            if column == "status" and value != "ok":
                cells.append(f"[red]failed[/red]: {escape(str(row['error']))}")
            elif column == WALL_COLUMN:
                cells.append("" if value is None else f"{value:.3f} s")
            elif isinstance(value, int) and not isinstance(value, bool):
                cells.append(f"{value:,}")
            else:
                cells.append(escape("" if value is None else str(value)))
        table.add_row(*cells)
    console.print(table)
    if len(rows) < len(result.rows):
        console.print(f"({len(result.rows) - len(rows)} more rows in sweep.csv)", highlight=False)


class _Progress:
    """A progress bar on a terminal; one line per point on stderr otherwise (logs); nothing if quiet."""

    def __init__(self, total: int, quiet: bool):
        self.total, self.quiet = total, quiet
        self.done = self.failed = self.skipped = 0
        self.said_skipped = False
        self.bar = None
        if not quiet and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
                TimeRemainingColumn

            self.bar = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TextColumn("eta"),
                                TimeRemainingColumn(), console=err_console, transient=True)
            self.task = self.bar.add_task("sweep", total=total, status=self._status())

    def _status(self) -> str:
        return f"ok {self.done - self.failed}, failed {self.failed}, skipped {self.skipped}"

    def update(self, report: PointReport) -> None:
        self.done += 1
        self.failed += report.status is not Status.OK
        self.skipped += report.skipped
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, status=self._status())
        elif not self.quiet and not report.skipped:
            self._say_skipped()
            what = f"ok ({report.wall_s:.3f} s)" if report.status is Status.OK else f"failed: {report.error}"
            self._say(f"[{self.done}/{self.total}] point {report.point.index} {what}")

    def _say_skipped(self) -> None:
        # Finished points come first: one line for them all, not one each.
        if self.skipped and not self.said_skipped:
            self._say(f"[{self.skipped}/{self.total}] {self.skipped} point(s) already done")
            self.said_skipped = True

    @staticmethod
    def _say(text: str) -> None:
        err_console.print(text, soft_wrap=True, highlight=False, markup=False)

    def __enter__(self) -> "_Progress":
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.bar is not None:
            self.bar.stop()
        elif not self.quiet:
            self._say_skipped()
