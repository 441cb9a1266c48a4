"""`chakra-sim convert pytorch`: the command line of the PyTorch converter.

    chakra-sim convert pytorch HOST.json[.gz] [--kineto KINETO.json[.gz]] --output PREFIX [--rank R]

Writes PREFIX.<rank>.et and prints what was converted. The rank comes from the traces; a trace
of a multi-rank job that does not record it needs --rank. Input errors print one line and exit
with status 2.
"""

from __future__ import annotations

import click

from chakra_core.cli.output import tool_errors
from chakra_core.tools.pytorch.convert import convert
from chakra_core.tools.pytorch.result import Summary

MAX_WARNINGS_SHOWN = 20


@click.command("pytorch")
@click.argument("host", type=click.Path(dir_okay=False))
@click.option("--kineto", type=click.Path(dir_okay=False),
              help="Kineto (PyTorch profiler) trace of the same run, to link measured durations and GPU kernels")
@click.option("--output", "-o", "prefix", required=True, metavar="PREFIX",
              help="output prefix: writes PREFIX.<rank>.et")
@click.option("--rank", type=click.IntRange(min=0),
              help="this trace's rank: required when the traces do not record it (unless it has no "
                   "communication: rank 0); an error when it contradicts them")
@click.option("--debug", is_flag=True, hidden=True, help="show tracebacks")
def convert_pytorch(host: str, kineto: str | None, prefix: str, rank: int | None, debug: bool) -> None:
    """Convert a PyTorch execution trace (and its Kineto trace) to a Chakra .et file.

    \b
    Examples:
      chakra-sim convert pytorch rank0_et.json.gz --output traces/model
      chakra-sim convert pytorch host.1.json --kineto kineto.1.json --output traces/model
    """
    with tool_errors(f"{prefix}.<rank>.et", debug):
        result = convert(host, kineto, rank)
        path = result.write(prefix)
    for line in summary_lines(result.summary):
        click.echo(line)
    click.echo(f"wrote {path}")


def summary_lines(summary: Summary) -> list[str]:
    """The short report printed after a conversion."""
    lines = [f"rank {summary.rank}: {sum(summary.nodes.values())} nodes "
             f"({', '.join(f'{n} {name}' for name, n in summary.nodes.items())}), "
             f"{summary.edges} edges ({summary.ctrl_edges} control, {summary.data_edges} data)"]
    collectives = ", ".join(f"{n} {name}" for name, n in summary.collectives.items()) or "none"
    lines.append(f"communication: {collectives}")
    if summary.kineto:
        lines.append(f"linked: {summary.linked} of {summary.units} host ops "
                     f"({summary.linked_by_rf_id} by record-function id), {summary.unlinked} unlinked; "
                     f"{summary.gpu_linked} of {summary.gpu_events} GPU events")
    lines.append(f"compute: {summary.gpu_micros} µs GPU, {summary.cpu_micros} µs CPU, "
                 f"{summary.comm_micros} µs communication; {summary.num_ops:.3e} FLOPs estimated")
    if summary.waits_removed:
        lines.append(f"waits removed: {summary.wait_removed_micros} µs in {summary.waits_removed} blocking "
                     "call(s) (the host waited for the GPU; the simulation re-creates the wait)")
    for note in summary.notes:
        lines.append(f"note: {note}")
    for warning in summary.warnings[:MAX_WARNINGS_SHOWN]:
        lines.append(f"warning: {warning}")
    if len(summary.warnings) > MAX_WARNINGS_SHOWN:
        lines.append(f"... and {len(summary.warnings) - MAX_WARNINGS_SHOWN} more warnings")
    return lines
