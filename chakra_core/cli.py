"""The `chakra-sim` command line.

    chakra-sim run MANIFEST.yaml [--out DIR] [--quiet]
    chakra-sim run --workload PREFIX --astra-system sys.json --astra-network net.yml
                   [--astra-memory mem.json] [--comm-group groups.json]
                   [--network analytical|congestion] [--out DIR] [--quiet]
    chakra-sim validate MANIFEST.yaml
    chakra-sim plugins [--json] [--layer LAYER] [--all]
    chakra-sim jsonize PREFIX|FILE.et [--out DIR]
    chakra-sim convert pytorch HOST.json[.gz] [--kineto KINETO.json[.gz]] --output PREFIX
    chakra-sim convert text INPUT.txt --num-npus N --num-passes P --output PREFIX
    chakra-sim generate microbenchmark|transformer ...
    chakra-sim visualize TRACE.et --format dot|graphml --output FILE
    chakra-sim timeline MANIFEST.yaml [--out FILE]

Errors caused by inputs print one clear message and exit with status 2 (no
traceback); `--debug` shows the traceback too.
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


def out_console() -> Console:
    """stdout console; wide enough for the tables when output is not a terminal (pipes, logs)."""
    console = Console(highlight=False)
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
}
CONVERTERS = {
    "pytorch": "chakra_core.tools.pytorch.cli:convert_pytorch",
    "text": "chakra_core.tools.text:convert_text",
}


@click.group(cls=LazyGroup, lazy=TOOLS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="chakra-sim")
def main() -> None:
    """chakra-sim: simulate distributed AI training from Chakra execution traces."""


# run ----------------------------------------------------------------------------------------
def astra_manifest(workload: str, system: str, network: str, memory: str | None,
                   comm_group: str | None, backend: str) -> dict[str, Any]:
    """A manifest equivalent to an ASTRA-sim command line (paths relative to the cwd)."""
    from chakra_core.astra import read_config_file

    manifest: dict[str, Any] = {
        "workload": {"trace": workload},
        "system": {"plugin": "native", "astra_file": system},
        "network": {"plugin": backend, "astra_file": network},
    }
    if comm_group:
        manifest["workload"]["comm_groups"] = comm_group
    sys_data = read_config_file(Path(system))
    if sys_data.get("roofline-enabled"):
        compute: dict[str, Any] = {"plugin": "roofline"}
        if "peak-perf" in sys_data:
            compute["peak_tflops"] = sys_data["peak-perf"]
        if "local-mem-bw" in sys_data:
            compute["memory_bandwidth_gbps"] = sys_data["local-mem-bw"]
        manifest["compute"] = compute
    else:
        manifest["compute"] = {"plugin": "replay"}
    if memory:
        mem_data = read_config_file(Path(memory))
        # NO_MEMORY_EXPANSION gives ASTRA-sim no model for memory nodes; so here too
        # (a trace with MEM_LOAD/MEM_STORE nodes then stops with a clear error).
        if mem_data.get("memory-type", "NO_MEMORY_EXPANSION") != "NO_MEMORY_EXPANSION":
            manifest["memory"] = {"plugin": "hbm", "astra_file": memory}
            if "local-mem-bw" in sys_data:
                manifest["memory"]["bandwidth_gbps"] = sys_data["local-mem-bw"]
    return manifest


@main.command()
@click.argument("manifest", required=False, type=click.Path(dir_okay=False))
@click.option("--workload", "workload", metavar="PREFIX", help="trace prefix (files PREFIX.<rank>.et)")
@click.option("--astra-system", type=click.Path(exists=True, dir_okay=False),
              help="ASTRA-sim system JSON")
@click.option("--astra-network", type=click.Path(exists=True, dir_okay=False),
              help="ASTRA-sim network YAML")
@click.option("--astra-memory", type=click.Path(exists=True, dir_okay=False),
              help="ASTRA-sim remote-memory JSON")
@click.option("--comm-group", type=click.Path(exists=True, dir_okay=False),
              help="ASTRA-sim communicator-group JSON")
@click.option("--network", "backend", type=click.Choice(["analytical", "congestion"]),
              default="analytical", show_default=True, help="network backend with --astra-network")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="output folder (overrides the manifest's output.dir)")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar and no table")
@click.option("--debug", is_flag=True, help="show tracebacks")
def run(manifest, workload, astra_system, astra_network, astra_memory, comm_group, backend, out_dir,
        quiet, debug) -> None:
    """Simulate a manifest, or ASTRA-sim inputs given directly.

    \b
    Examples:
      chakra-sim run examples/allreduce_8npu.yaml
      chakra-sim run --workload traces/all_reduce --astra-system sys.json \\
                     --astra-network net.yml --out results/
    """
    from chakra_core.manifest import build_manifest, load_manifest
    from chakra_core.plugins import make_plugin_host

    astra_flags = [astra_system, astra_network, astra_memory, comm_group]
    try:
        host = make_plugin_host()
        if manifest:
            if workload or any(astra_flags):
                raise CliError("give either a manifest or --workload/--astra-* flags, not both")
            loaded = load_manifest(manifest, host, out_dir)
        else:
            if not (workload and astra_system and astra_network):
                raise CliError("give a manifest, or --workload, --astra-system and --astra-network")
            data = astra_manifest(workload, astra_system, astra_network, astra_memory, comm_group, backend)
            if out_dir:
                data["output"] = {"dir": out_dir}
            loaded = build_manifest(data, host, base_dir=Path.cwd(), source="command line")
        results, wall_s, intervals = _simulate(loaded, host, quiet)
    except ChakraSimError as exc:
        _fail(exc, debug)
        return
    from chakra_core.report.summary import print_summary
    from chakra_core.report.writers import write_results

    try:
        written = write_results(results, loaded.output_dir, loaded.formats)
        if loaded.timeline:
            from chakra_core.report.timeline import write_timeline

            path = loaded.output_dir / "timeline.json"
            write_timeline(intervals, results, path)
            written.append(path)
    except OSError as exc:
        raise CliError(f"cannot write results to {loaded.output_dir}: {exc.strerror or exc}") from exc
    console = out_console()
    if not quiet:
        print_summary(results, console, wall_s)
    else:
        console.print(f"finish: {results['finish_ns']} ns", highlight=False)
    for path in written:
        console.print(f"wrote {path}", highlight=False)


def _simulate(loaded, host, quiet: bool):
    from chakra_core.engine.simulation import Simulation

    sim = Simulation(loaded.spec, host, record_intervals=loaded.timeline)
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


# validate -----------------------------------------------------------------------------------
@main.command()
@click.argument("manifest", type=click.Path(dir_okay=False))
@click.option("--debug", is_flag=True, help="show tracebacks")
def validate(manifest, debug) -> None:
    """Check a manifest without running it; list every problem with its key path."""
    from chakra_core.manifest import load_manifest
    from chakra_core.plugins import make_plugin_host

    try:
        loaded = load_manifest(manifest, make_plugin_host())
    except ChakraSimError as exc:
        _fail(exc, debug)
        return
    console = out_console()
    spec = loaded.spec
    layers = ", ".join(f"{layer}={choice.impl.name}" for layer, choice in spec.layers.items())
    console.print(f"{manifest}: valid ({len(spec.trace_files)} rank(s); {layers})", soft_wrap=True)
    for warning in spec.warnings:
        console.print(f"  warning: {escape(warning)}", soft_wrap=True)


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
    from chakra_core.et.jsonize import jsonize_file, trace_files

    path = Path(trace)
    files = [(None, path)] if path.is_file() else trace_files(path)
    if not files:
        raise CliError(f"no trace file {trace} and no files {trace}.<rank>.et")
    try:
        for _, et_path in files:
            target_dir = Path(out_dir) if out_dir else et_path.parent
            target = target_dir / (et_path.name[:-3] + ".json" if et_path.name.endswith(".et")
                                   else et_path.name + ".json")
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
