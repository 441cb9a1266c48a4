"""`chakra-sim run` and `chakra-sim validate`: a manifest, or ASTRA-sim files given directly."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar

import click

from chakra_core.cli.output import CliError, err_console, fail, note, out_console, warn
from chakra_core.config.spec import RunConfig
from chakra_core.output_lock import OutputLock
from chakra_core.plugins import PluginHost
from chakra_core.errors import ChakraSimError

if TYPE_CHECKING:   # the run path loads when a command runs, not when the command line starts
    from chakra_core.jobs.info import JobInfo
    from chakra_core.run import PreparedRun, RunResult

F = TypeVar("F", bound=Callable[..., Any])


class PluginChoice(click.Choice):  # type: ignore[type-arg]  # generic in newer click, not at runtime in 8.1
    """The installed implementations of a layer, looked up only when needed (help, a given value),
    so that commands not using it do not load the plugins."""

    def __init__(self, layer: str):
        self.layer = layer
        self._names: tuple[str, ...] | None = None
        super().__init__((), case_sensitive=True)

    @property
    def choices(self) -> tuple[str, ...]:
        if self._names is None:
            from chakra_core.plugins import make_plugin_host

            self._names = tuple(impl.name for impl in make_plugin_host().implementations(self.layer))
        return self._names

    @choices.setter
    def choices(self, _value: Any) -> None:
        pass   # click.Choice.__init__ assigns the (empty) list it was given


def run_inputs(command: F) -> F:
    """The options naming a run's inputs, shared by `run` and `validate`: a manifest, or
    ASTRA-sim files given directly, and the output folder."""
    options = [
        click.argument("manifest", required=False, type=click.Path(dir_okay=False)),
        click.option("--workload", "workload", metavar="PREFIX",
                     help="trace prefix (files PREFIX.<rank>.et or PREFIX.<rank>.et.gz)"),
        click.option("--astra-system", type=click.Path(exists=True, dir_okay=False),
                     help="ASTRA-sim system JSON"),
        click.option("--astra-network", type=click.Path(exists=True, dir_okay=False),
                     help="ASTRA-sim network YAML"),
        click.option("--astra-memory", type=click.Path(exists=True, dir_okay=False),
                     help="ASTRA-sim remote-memory JSON"),
        click.option("--comm-group", type=click.Path(exists=True, dir_okay=False),
                     help="ASTRA-sim communicator-group JSON"),
        # No click default: it would be checked against the installed plugins on every run.
        click.option("--network", "backend", type=PluginChoice("network"),
                     help="network plugin with --astra-network  [default: the one standing for "
                          "ASTRA-sim's congestion-unaware backend]"),
        click.option("--out", "out_dir", type=click.Path(file_okay=False),
                     help="output folder (overrides the manifest's output.dir)"),
        click.option("--workers", type=click.IntRange(min=1), metavar="N",
                     help="processes writing a training job's traces (Linux)  [default: every usable core, "
                          "at most 8]"),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def load_inputs(host: PluginHost, manifest: str | None, workload: str | None, astra_system: str | None,
                astra_network: str | None, astra_memory: str | None, comm_group: str | None,
                backend: str | None, out_dir: str | None, workers: int | None = None) -> RunConfig:
    """The RunConfig of `run`'s / `validate`'s inputs (see run_inputs). With a manifest, the
    ASTRA-style flags replace its settings, each with a note on stderr saying what it replaced."""
    from pathlib import Path

    from chakra_core.config.astra import override_manifest
    from chakra_core.config.files import read_config_file
    from chakra_core.jobs.expand import is_job
    from chakra_core.jobs.rank_writer import default_workers
    from chakra_core.run import load, load_astra

    astra_flags = [astra_system, astra_network, astra_memory, comm_group, backend]
    if manifest:
        if not (workload or any(astra_flags)):
            with generation_progress() as progress:
                return load(manifest, host, out_dir=out_dir, progress=progress,
                            workers=workers if workers is not None else default_workers())
        data = read_config_file(Path(manifest))
        if is_job(data):
            raise CliError(f"{manifest} is a training job, which makes its own traces and layers from `job:`: "
                           "--workload/--astra-*/--comm-group/--network do not apply (edit the manifest)")
        data, notes = override_manifest(host, data, workload, astra_system, astra_network, astra_memory,
                                        comm_group, backend)
        note(notes)
        return load(data, host, base_dir=Path(manifest).resolve().parent, name=manifest, out_dir=out_dir)
    if not (workload and astra_system and astra_network):
        raise CliError("give a manifest, or --workload, --astra-system and --astra-network")
    return load_astra(workload, astra_system, astra_network, astra_memory, comm_group, backend,
                          host=host, out_dir=out_dir)


@click.command()
@run_inputs
@click.option("--quiet", "-q", is_flag=True, help="no progress bar and no table (warnings still go to stderr)")
@click.option("--plots", is_flag=True, help="also write breakdown.png (each rank's time as a stacked bar) and, for a "
                                           "training job, step.png (the step split per pipeline stage)")
@click.option("--ranks", "all_ranks", is_flag=True,
              help="a row per rank in the table (default: ranks with identical figures share a row; past 16 "
                   "rows, min / median / max and the slowest)")
@click.option("--debug", is_flag=True, help="show tracebacks")
def run(manifest: str | None, workload: str | None, astra_system: str | None, astra_network: str | None,
        astra_memory: str | None, comm_group: str | None, backend: str | None, out_dir: str | None,
        workers: int | None, quiet: bool, plots: bool, all_ranks: bool, debug: bool) -> None:
    """Simulate a manifest, or ASTRA-sim inputs given directly.

    With a manifest, --workload, --astra-*, --comm-group and --network replace
    its settings (a note on stderr says what each replaced), so one manifest
    serves other traces.

    The output folder is created and checked before simulating. A rerun
    replaces the files the previous run wrote there (and removes those it
    does not write again, e.g. an old timeline.json); other files are left
    alone. Ctrl-C stops the run (exit status 130) and leaves earlier results
    as they were.

    \b
    Examples:
      chakra-sim run examples/allreduce_8npu.yaml --plots
      chakra-sim run --workload traces/all_reduce --astra-system sys.json \\
                     --astra-network net.yml --out results/
    """
    from chakra_core.plugins import make_plugin_host
    from chakra_core.report.writers import InterruptedAfterWriting, prepare_output_dir, write_run_files
    from chakra_core.run import prepare

    config = None
    created: Path | None = None
    try:
        try:
            host = make_plugin_host()
            config = load_inputs(host, manifest, workload, astra_system, astra_network, astra_memory,
                                 comm_group, backend, out_dir, workers)
            note(config.notes)
            prepared = prepare(config, host)
            # After the layers accepted the inputs (no folder for a rejected run), before the run;
            # one writer per folder, as a sweep (a job took the lock before writing its traces).
            created = None if config.output_dir.exists() else config.output_dir
            prepare_output_dir(config.output_dir)
            if config.output_lock is None:
                config.output_lock = OutputLock(config.output_dir)
                config.output_lock.acquire()
            result = _simulate(prepared, quiet)
        except ChakraSimError as exc:
            _give_up(config, created)
            fail(exc, debug)
        files = result.files(config.formats, plots=plots)
        try:
            written, output_warnings = write_run_files(config.output_dir, files)
        except OSError as exc:
            raise CliError(f"cannot write results to {config.output_dir}: {exc.strerror or exc}") from exc
    except InterruptedAfterWriting:
        assert config is not None
        err_console.print(f"interrupted: the results were already written to {config.output_dir}",
                          soft_wrap=True, highlight=False)
        raise SystemExit(130) from None
    except KeyboardInterrupt:
        _give_up(config, created)
        where = f" in {config.output_dir}" if config is not None else ""
        traces = (f"; the job's traces in {config.traces_written} were written"
                  if config is not None and config.traces_written is not None else "")
        err_console.print(f"interrupted: no results written; earlier results{where} are unchanged{traces}",
                          soft_wrap=True, highlight=False)
        raise SystemExit(130) from None
    finally:
        if config is not None and config.output_lock is not None:
            config.output_lock.release()
    console = out_console()
    results = result.results
    if not quiet:
        from chakra_core.report.summary import print_summary

        print_summary(results, console, result.wall_s, all_ranks)
    else:
        console.print(f"finish: {results.finish_ns} ns", highlight=False)
        warn(results.warnings)
    warn(output_warnings)
    for path in written:
        console.print(f"wrote {path}", highlight=False)


@contextlib.contextmanager
def generation_progress() -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr (a terminal only) while a training job writes its traces."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    # drawn as each rank is written, without rich's refresh thread: the traces are written by
    # processes forked from this one (jobs/rank_writer.py), which should not copy a thread's locks
    with Progress(TextColumn("generating the job's traces"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("ranks"), TimeRemainingColumn(), console=err_console, transient=True,
                  auto_refresh=False) as bar:
        task = bar.add_task("ranks", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total, refresh=True)


def _give_up(config: RunConfig | None, created: Path | None) -> None:
    """Let the output folder go; one this run created and left empty goes too."""
    if config is not None and config.output_lock is not None:
        config.output_lock.release()   # removes the lock file
    if created is not None:
        with contextlib.suppress(OSError):
            created.rmdir()   # only if empty


def _simulate(prepared: PreparedRun, quiet: bool) -> RunResult:
    """Simulate with a progress bar on a terminal (unless quiet)."""
    show_progress = not quiet and sys.stderr.isatty()
    if not show_progress:
        return prepared.simulate()
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("simulating"), BarColumn(), TextColumn("{task.fields[status]}"),
                  TimeElapsedColumn(), console=err_console, transient=True) as progress:
        task = progress.add_task("run", total=None, status="")

        def update(now_ns: int) -> None:
            done, total = prepared.node_progress()
            progress.update(task, completed=done, total=total,
                            status=f"{done:,}/{total:,} nodes, t={now_ns / 1e6:,.3f} ms")

        return prepared.simulate(progress=update)


@click.command()
@run_inputs
@click.option("--debug", is_flag=True, help="show tracebacks")
def validate(manifest: str | None, workload: str | None, astra_system: str | None, astra_network: str | None,
             astra_memory: str | None, comm_group: str | None, backend: str | None, out_dir: str | None,
             workers: int | None, debug: bool) -> None:
    """Check a run's inputs without simulating; list every problem.

    Takes the same inputs as `run`. Besides the manifest (every problem with its
    key path) it checks that the network has one NPU per trace file, that every
    trace file reads to the end with a usable dependency graph, that each
    communicator group's k-th collectives agree in type and size across ranks
    (in node-id order), and that the output folder can be written. Exit status 2
    when anything is wrong; what a run would warn of before simulating (the layers'
    warnings, e.g. rates a hardware profile inherits) is shown, exit status 0.

    \b
    Examples:
      chakra-sim validate examples/allreduce_8npu.yaml
      chakra-sim validate --workload traces/all_reduce --astra-system sys.json \\
                          --astra-network net.yml
    """
    from chakra_core.plugins import make_plugin_host
    from chakra_core.run import validate as find_problems

    try:
        host = make_plugin_host()
        config = load_inputs(host, manifest, workload, astra_system, astra_network, astra_memory,
                             comm_group, backend, out_dir, workers)
        found = find_problems(config, host)
    except ChakraSimError as exc:
        fail(exc, debug)
    warn(found.warnings)
    if found.problems:
        noun = "problem" if len(found.problems) == 1 else "problems"
        raise CliError(f"{config.source}: not valid ({len(found.problems)} {noun}):\n"
                       + "\n".join(f"  {problem}" for problem in found.problems))
    spec = config.spec
    layers = ", ".join(f"{layer}={choice.impl.name}" for layer, choice in spec.layers.items())
    out_console().print(f"{config.source}: valid ({len(spec.trace_files)} rank(s); {layers})",
                        soft_wrap=True, highlight=False)
    if spec.training is not None:
        _print_placement(spec.training)


def _print_placement(training: JobInfo) -> None:
    """Where a job's communicator groups land (GPUs per node, fabric)."""
    from rich.table import Table

    table = Table(title=f"{training.model} on {training.gpus:,} GPUs ({training.gpus_per_node} per node, "
                        f"profile {training.profile}): where each group lands", title_justify="left")
    for column in ("group", "ranks", "nodes", "GPUs per node", "fabric"):
        table.add_column(column, justify="left" if column in ("group", "fabric") else "right")
    for row in training.placement:
        table.add_row(row.group, str(row.ranks), str(row.nodes), str(row.gpus_per_node), row.fabric)
    out_console().print(table)
    if training.domain_note:
        out_console().print(f"nodes: {training.domain_note}")
