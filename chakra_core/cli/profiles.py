"""`chakra-sim profiles`: the hardware profiles, and where each of their numbers comes from.

    chakra-sim profiles [--json]                  the shipped profiles, one line each
    chakra-sim profiles NAME_OR_PATH [--json]     every value of one profile with its source

A profile is named by its file stem (`h100-sxm-hgx`) or given as a .yaml path
(relative to the current folder). `--json` prints the resolved profile (its
`extends` chain merged) as JSON; without a name, the list as JSON. An unknown
name or an invalid file prints `error: ...` and exits with status 2.
docs/hardware.md is the user guide; chakra_core.hardware.profiles the loader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import click
from pydantic import BaseModel
from rich.markup import escape
from rich.console import JustifyMethod
from rich.table import Table

from chakra_core.hardware.profiles import Profile, Sourced, builtin_profiles, load_profile
from chakra_core.cli.output import tool_errors
from chakra_core.json_types import JsonObject


def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.6g}"


def fabric(profile: Profile) -> str:
    return profile.network.fabric if profile.network else "single node"


@dataclass(frozen=True)
class ProfileLine:
    """One line of the listing: name, GPU, GPUs per node, fabric, bf16 peak, HBM bandwidth, GPU power."""

    name: str
    gpu: str
    gpus_per_node: int
    fabric: str
    bf16_tflops: float | None
    hbm_gbps: float
    power_w: float | None
    description: str

    def to_json(self) -> JsonObject:
        return {"name": self.name, "gpu": self.gpu, "gpus_per_node": self.gpus_per_node, "fabric": self.fabric,
                "bf16_tflops": self.bf16_tflops, "hbm_gbps": self.hbm_gbps, "power_w": self.power_w,
                "description": self.description}


def summary(profile: Profile) -> ProfileLine:
    bf16 = profile.gpu.peak_tflops.get("bf16")
    power = profile.gpu.power_w
    return ProfileLine(profile.name, profile.gpu.model, profile.gpus_per_node, fabric(profile),
                       bf16.value if bf16 else None, profile.gpu.memory_bandwidth_gbps.value,
                       None if power is None else power.value, profile.description)


def rows(model: BaseModel, prefix: str = "") -> Iterator[tuple[str, Any, Sourced | None]]:
    """(key path, value, Sourced or None) for every value of a profile (its plugins' sections
    where a file puts them) or of one of its parts, in field order."""
    parts = model.parts() if isinstance(model, Profile) else \
        [(name, getattr(model, name)) for name in type(model).model_fields]
    for name, value in parts:
        yield from _rows(value, f"{prefix}{name}")


def _rows(value: Any, path: str) -> Iterator[tuple[str, Any, Sourced | None]]:
    if value is None:
        return
    if isinstance(value, Sourced):
        yield path, value.value, value
    elif isinstance(value, BaseModel):
        yield from rows(value, f"{path}.")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _rows(item, f"{path}.{key}")
    else:
        yield path, value, None


def _listing_table() -> Table:
    table = Table(title="chakra-sim hardware profiles", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("name", "left"), ("GPU", "left"), ("GPUs/node", "right"), ("fabric", "left"),
        ("bf16 TFLOP/s", "right"), ("HBM GB/s", "right"), ("GPU W", "right"))
    for header, justify in columns:
        table.add_column(header, justify=justify)
    for name in builtin_profiles():
        line = summary(load_profile(name))
        table.add_row(escape(line.name), escape(line.gpu), str(line.gpus_per_node), escape(line.fabric),
                      "-" if line.bf16_tflops is None else _number(line.bf16_tflops), _number(line.hbm_gbps),
                      "-" if line.power_w is None else _number(line.power_w))
    return table


def _profile_table(profile: Profile) -> Table:
    table = Table(title=f"{escape(profile.name)}: {escape(profile.description)}", title_justify="left")
    table.add_column("key")
    table.add_column("value", justify="right")
    table.add_column("source", overflow="fold")
    for path, value, sourced in rows(profile):
        if path in ("name", "description"):
            continue
        shown = _number(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
        source = ""
        if sourced is not None:
            source = escape(sourced.source)
            if sourced.note:
                source += f"\n[dim]note: {escape(sourced.note)}[/dim]"
            if sourced.derived:
                source += f"\n[yellow]derived: {escape(sourced.derived)}[/yellow]"
        table.add_row(escape(path), escape(shown), source)
    return table


@click.command("profiles")
@click.argument("name_or_path", required=False, metavar="[NAME_OR_PATH]")
@click.option("--json", "as_json", is_flag=True, help="print the resolved profile (or the list) as JSON")
def profiles(name_or_path: str | None, as_json: bool) -> None:
    """List the shipped hardware profiles, or show one with the source of every value.

    NAME_OR_PATH is a shipped profile's name (`chakra-sim profiles` lists them) or
    a profile .yaml file. Profiles are spec-only: every number cites a vendor
    document or NCCL's public source (docs/hardware.md).

    \b
    Examples:
      chakra-sim profiles
      chakra-sim profiles h100-sxm-hgx
      chakra-sim profiles h100-aws-p5-efa --json
    """
    from chakra_core.cli.output import out_console

    with tool_errors("output"):
        if name_or_path is None:
            if as_json:
                click.echo(json.dumps([summary(load_profile(name)).to_json() for name in builtin_profiles()], indent=2))
            else:
                out_console().print(_listing_table())
            return
        profile = load_profile(name_or_path, Path.cwd())
        if as_json:
            click.echo(json.dumps(profile.as_data(), indent=2))
        else:
            out_console().print(_profile_table(profile))
            _print_inherited(profile)


def _print_inherited(profile: Profile) -> None:
    """The rates the profile keeps from its parent although what they depend on changed."""
    from chakra_core.cli.output import out_console

    if not profile.inherited_rates:
        return
    console = out_console()
    console.print(f"[bold yellow]{len(profile.inherited_rates)} rate(s) inherited although what they depend on "
                  "changed[/bold yellow] (runs that use them warn; restate each with a source, docs/hardware.md):")
    for rate in profile.inherited_rates:
        console.print(f"  {escape(rate.message())}", highlight=False)
