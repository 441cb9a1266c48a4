"""The `chakra-sim generate` command group: `microbenchmark`, `job` and its front `transformer`."""

from __future__ import annotations

import click

from chakra_core.cli.output import tool_errors
from chakra_core.tools.generate.job import job
from chakra_core.tools.generate.microbenchmark import COLLECTIVES, P2P_PATTERNS, write_microbenchmark
from chakra_core.tools.generate.transformer import transformer


@click.group("generate")
def generate() -> None:
    """Generate synthetic Chakra traces (collective microbenchmarks, transformer training, training jobs)."""


generate.add_command(job)
generate.add_command(transformer)


@generate.command("microbenchmark")
@click.option("--collective", required=True, type=click.Choice([*COLLECTIVES, "send_recv"]),
              help="the operation every rank runs")
@click.option("--size", type=click.IntRange(min=0), metavar="BYTES",
              help="comm_size in bytes, as docs/collectives.md defines it per type (each rank's input; "
                   "scatter: the piece each rank receives); not for barrier")
@click.option("--npus", required=True, type=click.IntRange(min=1), help="number of ranks")
@click.option("--iterations", default=1, show_default=True, type=click.IntRange(min=1),
              help="back-to-back repetitions on every rank")
@click.option("--root", default=0, show_default=True, type=click.IntRange(min=0),
              help="root rank of broadcast/reduce/gather/scatter")
@click.option("--pattern", default="ring", show_default=True, type=click.Choice(P2P_PATTERNS),
              help="send_recv: ring shift, pairwise exchange (2i <-> 2i+1), or all-pairs (N-1 rounds)")
@click.option("--shift", default=1, show_default=True, type=int, help="send_recv ring: send to rank + SHIFT")
@click.option("--output", required=True, metavar="PREFIX", help="writes PREFIX.<rank>.et")
@click.option("--compress", is_flag=True, help="gzip the .et files")
def microbenchmark(collective: str, size: int | None, npus: int, iterations: int, root: int, pattern: str, shift: int,
                   output: str, compress: bool) -> None:
    """A collective (or point-to-point) microbenchmark, one trace per rank.

    With one iteration the collective files are identical to ASTRA-sim's
    examples/workload/microbenchmarks.

    \b
    Examples:
      chakra-sim generate microbenchmark --collective all_reduce --size 1048576 \\
                 --npus 8 --output traces/all_reduce
      chakra-sim generate microbenchmark --collective send_recv --pattern pairwise \\
                 --size 65536 --npus 8 --iterations 4 --output traces/p2p
    """
    with tool_errors(f"{output}.<rank>.et"):
        files = write_microbenchmark(output, collective, size, npus, iterations, root, pattern, shift,
                                     compress)
    click.echo(f"wrote {files[0]} ... {files[-1]}" if len(files) > 1 else f"wrote {files[0]}")
