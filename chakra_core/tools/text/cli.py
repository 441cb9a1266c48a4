"""The `chakra-sim convert text` command."""

from __future__ import annotations

import click

from chakra_core.cli.output import tool_errors
from chakra_core.tools.text.convert import convert_text_workload
from chakra_core.tools.text.parse import parse_text_workload


@click.command("text")
@click.argument("input_file", metavar="INPUT.txt", type=click.Path(dir_okay=False))
@click.option("--num-npus", required=True, type=click.IntRange(min=1), help="number of NPUs (ranks)")
@click.option("--num-passes", default=1, show_default=True, type=click.IntRange(min=1),
              help="training iterations to emit")
@click.option("--output", required=True, metavar="PREFIX", help="writes PREFIX.0.et ... PREFIX.<N-1>.et")
@click.option("--model-parallel-group", type=click.IntRange(min=1),
              help="transformer workloads: NPUs per model-parallel group (default: the file header's "
                   "model_parallel_NPU_group)")
@click.option("--first-dim-npus", type=click.IntRange(min=1),
              help="HYBRID_DATA_MODEL / HYBRID_MODEL_DATA / HYBRID_CUSTOMIZED: NPUs in ASTRA-sim's first "
                   "network dimension (default: the largest divisor of N not above sqrt(N))")
@click.option("--compute-scale", default=1.0, show_default=True, type=float,
              help="multiply compute times (ASTRA-sim 1.0's --compute-scale)")
@click.option("--comm-scale", default=1.0, show_default=True, type=float,
              help="multiply communication sizes (ASTRA-sim 1.0's --comm-scale)")
@click.option("--ignore-update-time", is_flag=True,
              help="drop the update-time column (as the official Chakra converter does)")
@click.option("--compress", is_flag=True, help="gzip the .et files")
def convert_text(input_file: str, num_npus: int, num_passes: int, output: str, model_parallel_group: int | None,
                 first_dim_npus: int | None, compute_scale: float, comm_scale: float, ignore_update_time: bool,
                 compress: bool) -> None:
    """Convert an ASTRA-sim 1.0 text workload into one Chakra trace per NPU.

    Every ASTRA-sim 1.0 parallelism type is supported (DATA, MODEL,
    HYBRID_DATA_MODEL, HYBRID_MODEL_DATA, HYBRID_DLRM[_ENHANCED], MICRO,
    HYBRID_TRANSFORMER[_FWD_IN_BCKWD], HYBRID_CUSTOMIZED,
    DISTRIBUTED_INFERENCE). Compute times are ns; they are rounded to whole
    µs in duration_micros and kept exactly in the duration_ns attribute.

    \b
    Example:
      chakra-sim convert text Resnet50_DataParallel.txt --num-npus 8 \\
                 --num-passes 2 --output traces/resnet50
      chakra-sim run --workload traces/resnet50 --astra-system sys.json \\
                 --astra-network net.yml
    """
    with tool_errors(f"{output}.<rank>.et"):
        workload = parse_text_workload(input_file)
        report = convert_text_workload(workload, num_npus, output, num_passes=num_passes,
                                       model_parallel_group=model_parallel_group,
                                       first_dim_npus=first_dim_npus, compute_scale=compute_scale,
                                       comm_scale=comm_scale, update_time=not ignore_update_time,
                                       compress=compress)
    echo = click.echo
    echo(f"{input_file}: {report.parallelism}, {len(workload.layers)} layer(s), {num_passes} pass(es), "
         f"{num_npus} NPU(s)")
    if report.layout is not None:
        layout = report.layout
        echo(f"groups: block<i> = NPUs {layout.block}i .. {layout.block}i+{layout.block - 1}; "
             f"stride<j> = NPUs j, j+{layout.block}, j+{2 * layout.block}, ... "
             f"({num_npus // layout.block} per group)")
    if report.compute_nodes:
        change = (report.compute_replay_ns - report.compute_ns) / report.compute_ns * 100
        echo(f"compute per NPU: {report.compute_ns:,} ns exact, {report.compute_replay_ns:,} ns replayed "
             f"from whole-µs durations ({change:+.3f}%); {report.sub_500ns_nodes} of "
             f"{report.compute_nodes} compute node(s) are shorter than 500 ns (exact ns in duration_ns)")
    for note in report.notes:
        echo(f"note: {note}")
    first, last = report.files[0], report.files[-1]
    shown = str(first) if len(report.files) == 1 else f"{first} ... {last}"
    echo(f"wrote {shown} ({report.nodes_per_rank[0]} nodes on rank 0)")
