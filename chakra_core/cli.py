"""The `chakra-sim` command line.

    chakra-sim run MANIFEST.yaml [--out DIR] [--quiet] [--plots]
    chakra-sim run --workload PREFIX --astra-system sys.json --astra-network net.yml
                   [--astra-memory mem.json] [--comm-group groups.json]
                   [--network NETWORK-PLUGIN] [--out DIR] [--quiet] [--plots]
    chakra-sim validate MANIFEST.yaml | --workload PREFIX --astra-system ... (as run)
    chakra-sim plugins [--json] [--layer LAYER] [--all]
    chakra-sim jsonize PREFIX|FILE.et [--out DIR]
    chakra-sim convert pytorch HOST.json[.gz] [--kineto KINETO.json[.gz]] --output PREFIX
    chakra-sim convert text INPUT.txt --num-npus N --num-passes P --output PREFIX
    chakra-sim generate microbenchmark|transformer ...
    chakra-sim visualize TRACE.et --format dot|graphml --output FILE
    chakra-sim timeline MANIFEST.yaml [--out FILE]
    chakra-sim sweep SWEEP.yaml [--executor local|ray] [--address HOST:PORT] [--workers N]
    chakra-sim analyze PREFIX [--out DIR] [--json] [--imbalance-threshold X]
                       [--compute-time duration|roofline --peak-tflops F --mem-bw-gbps F]
    chakra-sim analyze --results A.json --results B.json [--out DIR] [--json]
    chakra-sim synthesize --from PREFIX [--from ...] [--ranks N] [--out OUTPREFIX] [--seed S]
                          [--length NODES] [--obfuscate] [--model model.json]
    chakra-sim synthesize --model model.json [--ranks N] --out OUTPREFIX [--seed S] [--length NODES]
    chakra-sim obfuscate PREFIX --out OUTPREFIX [--seed S] [--tolerance T]
    chakra-sim profiles [NAME_OR_PATH] [--json]
    chakra-sim calibrate LOG... --profile BASE [--out PROFILE.yaml] [--holdout none|odd-powers]

Errors caused by inputs print one clear message and exit with status 2 (no
traceback); `--debug` shows the traceback too. Ctrl-C during `run` exits with
status 130.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from chakra_core import __version__
from chakra_core.errors import ChakraSimError
from chakra_core.tools import ToolError

err_console = Console(stderr=True, highlight=False)


def out_console(stderr: bool = False) -> Console:
    """stdout console (stderr: for a command whose stdout carries JSON); wide enough for the tables
    when output is not a terminal (pipes, logs)."""
    console = Console(highlight=False, stderr=stderr)
    if not console.is_terminal:
        console.width = max(console.width, 140)
    return console


# One error type for every command: "error: <message>" on stderr, exit status 2, no traceback.
CliError = ToolError


def _fail(exc: ChakraSimError, debug: bool) -> None:
    if debug:
        raise exc
    raise CliError(str(exc)) from exc


class LazyGroup(click.Group):
    """A command group whose listed subcommands are imported only when used.

    Keeps `chakra-sim run` from importing the converters and generators
    (a third of a second, 15 MB).
    """

    def __init__(self, *args, lazy: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = lazy or {}

    def list_commands(self, ctx) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx, name):
        if name in self.lazy and name not in self.commands:
            module, attribute = self.lazy[name].split(":")
            import importlib

            self.add_command(getattr(importlib.import_module(module), attribute), name)
        return super().get_command(ctx, name)


TOOLS = {
    "generate": "chakra_core.tools.generate:generate",
    "visualize": "chakra_core.tools.visualize:visualize",
    "timeline": "chakra_core.report.timeline:timeline",
    "sweep": "chakra_core.sweep:sweep",
    "analyze": "chakra_core.tools.analyze:analyze",
    "synthesize": "chakra_core.tools.synthesis.cli:synthesize",
    "obfuscate": "chakra_core.tools.obfuscation:obfuscate",
    "profiles": "chakra_core.tools.profiles_cli:profiles",
    "calibrate": "chakra_core.tools.calibrate_cli:calibrate",
}
CONVERTERS = {
    "pytorch": "chakra_core.tools.pytorch.cli:convert_pytorch",
    "text": "chakra_core.tools.text:convert_text",
}


@click.group(cls=LazyGroup, lazy=TOOLS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="chakra-sim")
def main() -> None:
    """chakra-sim: simulate distributed AI training from Chakra execution traces."""


# run and validate: the inputs of a run ---------------------------------------------------------
DEFAULT_NETWORK = "analytical"


class PluginChoice(click.Choice):
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
    def choices(self, _value) -> None:
        pass   # click.Choice.__init__ assigns the (empty) list it was given


def run_inputs(command):
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
                     help=f"network plugin with --astra-network  [default: {DEFAULT_NETWORK}]"),
        click.option("--out", "out_dir", type=click.Path(file_okay=False),
                     help="output folder (overrides the manifest's output.dir)"),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def astra_manifest(workload: str, system: str, network: str, memory: str | None,
                   comm_group: str | None, backend: str = DEFAULT_NETWORK) -> dict[str, Any]:
    """A manifest equivalent to an ASTRA-sim command line (paths relative to the cwd).

    What the system file says about compute (roofline) and memory bandwidth is
    read by the manifest loader, as for a manifest that loads the file itself.
    """
    from chakra_core.astra import read_config_file

    manifest: dict[str, Any] = {
        "workload": {"trace": workload},
        "system": {"plugin": "native", "astra_file": system},
        "network": {"plugin": backend, "astra_file": network},
    }
    if comm_group:
        manifest["workload"]["comm_groups"] = comm_group
    if memory:
        mem_data = read_config_file(Path(memory))
        # NO_MEMORY_EXPANSION gives ASTRA-sim no model for memory nodes; so here too
        # (a trace with MEM_LOAD/MEM_STORE nodes then stops with a clear error).
        if mem_data.get("memory-type", "NO_MEMORY_EXPANSION") != "NO_MEMORY_EXPANSION":
            manifest["memory"] = {"plugin": "hbm", "astra_file": memory}
    return manifest


def load_inputs(host, manifest, workload, astra_system, astra_network, astra_memory, comm_group,
                backend, out_dir):
    """The LoadedManifest of `run`'s / `validate`'s inputs (see run_inputs)."""
    from chakra_core.manifest import build_manifest, load_manifest

    astra_flags = [astra_system, astra_network, astra_memory, comm_group, backend]
    if manifest:
        if workload or any(astra_flags):
            raise CliError("give either a manifest or --workload/--astra-*/--network flags, not both")
        return load_manifest(manifest, host, out_dir)
    if not (workload and astra_system and astra_network):
        raise CliError("give a manifest, or --workload, --astra-system and --astra-network")
    data = astra_manifest(workload, astra_system, astra_network, astra_memory, comm_group,
                          backend or DEFAULT_NETWORK)
    if out_dir:
        data["output"] = {"dir": out_dir}
    return build_manifest(data, host, base_dir=Path.cwd(), source="command line")


def _warn(messages) -> None:
    for message in messages:
        err_console.print(f"[yellow]warning:[/yellow] {escape(message)}", soft_wrap=True)


@main.command()
@run_inputs
@click.option("--quiet", "-q", is_flag=True, help="no progress bar and no table (warnings still go to stderr)")
@click.option("--plots", is_flag=True, help="also write breakdown.png: each rank's time breakdown as a stacked bar")
@click.option("--debug", is_flag=True, help="show tracebacks")
def run(manifest, workload, astra_system, astra_network, astra_memory, comm_group, backend, out_dir,
        quiet, plots, debug) -> None:
    """Simulate a manifest, or ASTRA-sim inputs given directly.

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
    from chakra_core.engine.simulation import Simulation
    from chakra_core.plugins import make_plugin_host
    from chakra_core.report.writers import (InterruptedAfterWriting, prepare_output_dir, result_files,
                                            write_run_files)

    loaded = None
    try:
        try:
            host = make_plugin_host()
            loaded = load_inputs(host, manifest, workload, astra_system, astra_network, astra_memory,
                                 comm_group, backend, out_dir)
            sim = Simulation(loaded.spec, host, record_intervals=loaded.timeline)
            # After the layers accepted the inputs (no folder for a rejected run), before the run.
            prepare_output_dir(loaded.output_dir)
            results, wall_s, intervals = _simulate(sim, quiet)
        except ChakraSimError as exc:
            _fail(exc, debug)
            return
        files = result_files(results, loaded.formats, intervals, plots=plots)
        try:
            written, output_warnings = write_run_files(loaded.output_dir, files)
        except OSError as exc:
            raise CliError(f"cannot write results to {loaded.output_dir}: {exc.strerror or exc}") from exc
    except InterruptedAfterWriting:
        err_console.print(f"interrupted: the results were already written to {loaded.output_dir}",
                          soft_wrap=True, highlight=False)
        raise SystemExit(130) from None
    except KeyboardInterrupt:
        where = f" in {loaded.output_dir}" if loaded is not None else ""
        err_console.print(f"interrupted: nothing written; earlier results{where} are unchanged",
                          soft_wrap=True, highlight=False)
        raise SystemExit(130) from None
    console = out_console()
    if not quiet:
        from chakra_core.report.summary import print_summary

        print_summary(results, console, wall_s)
    else:
        console.print(f"finish: {results['finish_ns']} ns", highlight=False)
        _warn(results.get("warnings", []))
    _warn(output_warnings)
    for path in written:
        console.print(f"wrote {path}", highlight=False)


def _simulate(sim, quiet: bool):
    show_progress = not quiet and sys.stderr.isatty()
    if not show_progress:
        results = sim.run()
        return results, sim.wall_s, sim.intervals
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("simulating"), BarColumn(), TextColumn("{task.fields[status]}"),
                  TimeElapsedColumn(), console=err_console, transient=True) as progress:
        task = progress.add_task("run", total=None, status="")

        def update(now_ns: int) -> None:
            done, total = sim.node_progress()
            progress.update(task, completed=done, total=total,
                            status=f"{done:,}/{total:,} nodes, t={now_ns / 1e6:,.3f} ms")

        results = sim.run(progress=update)
    return results, sim.wall_s, sim.intervals


@main.command()
@run_inputs
@click.option("--debug", is_flag=True, help="show tracebacks")
def validate(manifest, workload, astra_system, astra_network, astra_memory, comm_group, backend,
             out_dir, debug) -> None:
    """Check a run's inputs without simulating; list every problem.

    Takes the same inputs as `run`. Besides the manifest (every problem with its
    key path) it checks that the network has one NPU per trace file, that every
    trace file reads to the end with a usable dependency graph, that each
    communicator group's k-th collectives agree in type and size across ranks
    (in node-id order), and that the output folder can be written. Exit status 2
    when anything is wrong.

    \b
    Examples:
      chakra-sim validate examples/allreduce_8npu.yaml
      chakra-sim validate --workload traces/all_reduce --astra-system sys.json \\
                          --astra-network net.yml
    """
    from chakra_core.checks import check_run
    from chakra_core.plugins import make_plugin_host

    try:
        host = make_plugin_host()
        loaded = load_inputs(host, manifest, workload, astra_system, astra_network, astra_memory,
                             comm_group, backend, out_dir)
        problems, warnings = check_run(loaded, host)
    except ChakraSimError as exc:
        _fail(exc, debug)
        return
    _warn(warnings)
    if problems:
        noun = "problem" if len(problems) == 1 else "problems"
        raise CliError(f"{loaded.source}: not valid ({len(problems)} {noun}):\n"
                       + "\n".join(f"  {problem}" for problem in problems))
    spec = loaded.spec
    layers = ", ".join(f"{layer}={choice.impl.name}" for layer, choice in spec.layers.items())
    out_console().print(f"{loaded.source}: valid ({len(spec.trace_files)} rank(s); {layers})",
                        soft_wrap=True, highlight=False)


# plugins ------------------------------------------------------------------------------------
@main.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--layer", type=click.Choice(["system", "compute", "memory", "network"]),
              help="only this layer")
@click.option("--all", "show_all", is_flag=True, help="include built-in implementations in --json")
def plugins(as_json, layer, show_all) -> None:
    """List installed plugins by layer (name, distribution, version, fidelity, status)."""
    from chakra_core.plugins import make_plugin_host

    host = make_plugin_host()
    rows = host.listing(include_builtins=show_all or not as_json)
    if layer:
        rows = [r for r in rows if r["layer"] in (layer, "?")]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="chakra-sim plugins", title_justify="left")
    for header in ("layer", "name", "distribution", "version", "status", "fidelity"):
        table.add_column(header)
    for row in rows:
        status = "[green]ok[/green]" if row["status"] == "ok" else f"[red]FAILED[/red]: {escape(row.get('error', ''))}"
        table.add_row(row["layer"], row["name"], row["distribution"], row["version"], status,
                      escape(row["fidelity"]))
    out_console().print(table)


# jsonize ------------------------------------------------------------------------------------
@main.command()
@click.argument("trace")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="folder for the JSON files (default: next to the traces)")
@click.option("--compact", is_flag=True, help="no indentation")
def jsonize(trace, out_dir, compact) -> None:
    """Convert a trace to JSON: TRACE is a file.et or a prefix (one JSON file per rank).

    \b
    Example:
      chakra-sim jsonize traces/all_reduce --out json/
    """
    from chakra_core.et.jsonize import check_one_file_per_rank, json_name, jsonize_file, trace_files

    path = Path(trace)
    files = [(None, path)] if path.is_file() else trace_files(path)
    if not files:
        raise CliError(f"no trace file {trace} and no files {trace}.<rank>.et or .et.gz")
    try:
        check_one_file_per_rank(files)
    except ChakraSimError as exc:
        raise CliError(str(exc)) from None
    try:
        for _, et_path in files:
            target_dir = Path(out_dir) if out_dir else et_path.parent
            target = target_dir / json_name(et_path)
            count = jsonize_file(et_path, target, indent=None if compact else 1)
            click.echo(f"{et_path} -> {target} ({count} nodes)")
    except ChakraSimError as exc:
        raise CliError(str(exc)) from exc


# toolchain ------------------------------------------------------------------------------------
@main.group(cls=LazyGroup, lazy=CONVERTERS)
def convert() -> None:
    """Convert traces to Chakra .et: PyTorch execution traces, ASTRA-sim text workloads."""


if __name__ == "__main__":  # pragma: no cover
    main()
