"""`chakra-sim plugins`: what is installed, by layer, and what failed to load."""

from __future__ import annotations

import json

import click
from rich.markup import escape
from rich.table import Table

from chakra_core.cli.output import out_console
from chakra_core.contract.layers import LAYERS


@click.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--layer", type=click.Choice([*LAYERS, "command"]), help="only this layer (or the commands plugins add)")
@click.option("--all", "show_all", is_flag=True, help="include built-in implementations in --json")
def plugins(as_json: bool, layer: str | None, show_all: bool) -> None:
    """List installed plugins by layer (name, distribution, version, fidelity, status), and the
    commands plugins add to chakra-sim."""
    from chakra_core.cli import COMMANDS
    from chakra_core.plugins import make_plugin_host

    host = make_plugin_host()
    rows = host.listing(include_builtins=show_all or not as_json, reserved_commands=frozenset(COMMANDS))
    if layer:
        rows = [r for r in rows if r.layer in (layer, "?")]
    if as_json:
        click.echo(json.dumps([row.to_json() for row in rows], indent=2))
        return
    table = Table(title="chakra-sim plugins", title_justify="left")
    for header in ("layer", "name", "distribution", "version", "status", "fidelity"):
        table.add_column(header)
    for row in rows:
        status = "[green]ok[/green]" if row.status == "ok" else f"[red]FAILED[/red]: {escape(row.error or '')}"
        table.add_row(row.layer, row.name, row.distribution, row.version, status, escape(row.fidelity))
    out_console().print(table)
