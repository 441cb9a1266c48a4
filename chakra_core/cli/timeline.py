"""`chakra-sim timeline`: simulate a manifest and write its Perfetto / Chrome-trace timeline."""

from __future__ import annotations

from pathlib import Path

import click

from chakra_core.cli.output import tool_errors
from chakra_core.report.timeline import DEFAULT_MAX_FLOWS, timeline_json, write_timeline
from chakra_core.report.timeline import timeline as timeline_of


@click.command("timeline")
@click.argument("manifest", metavar="MANIFEST.yaml", type=click.Path(dir_okay=False))
@click.option("--out", "out_file", type=click.Path(dir_okay=False),
              help="timeline file [default: <output dir>/timeline.json, with the results files]")
@click.option("--max-flows", default=DEFAULT_MAX_FLOWS, show_default=True, type=click.IntRange(min=0),
              help="dependency arrows to draw at most (earliest first)")
@click.option("--debug", is_flag=True, help="show tracebacks")
def timeline(manifest: str, out_file: str | None, max_flows: int, debug: bool) -> None:
    """Simulate a manifest and write a Perfetto / Chrome-trace timeline.

    One process per rank, one lane per resource (compute cpu/gpu,
    communication, memory, other), a slice per node with its simulated start
    and duration, dependency arrows, and memory-in-use counters when the
    memory model reports them. Open the file in https://ui.perfetto.dev or
    chrome://tracing.

    \b
    Example:
      chakra-sim timeline examples/allreduce_8npu.yaml --out allreduce.json
    """
    from chakra_core.plugins import make_plugin_host
    from chakra_core.report.writers import prepare_output_dir, result_files, write_run_files
    from chakra_core.jobs.rank_writer import default_workers
    from chakra_core.run import load, prepare

    with tool_errors("the timeline", debug):
        host = make_plugin_host()
        config = load(manifest, host, workers=default_workers())
        prepared = prepare(config, host, timeline=True)
        if out_file:
            result = prepared.simulate()
            path = Path(out_file)
            counts = write_timeline(result.intervals or [], result.results, path, max_flows)
        else:
            # Into the output folder, as `run` with `timeline: true` writes it: with the results,
            # in the folder's record of what the last run wrote.
            prepare_output_dir(config.output_dir)
            result = prepared.simulate()
            built = timeline_of(result.intervals or [], result.results, max_flows)
            files = {**result_files(result.results, config.formats), "timeline.json": timeline_json(built.to_json())}
            write_run_files(config.output_dir, files)
            path, counts = config.output_dir / "timeline.json", built.counts
        results = result.results
    dropped = f", {counts.flows_dropped:,} more left out (--max-flows)" if counts.flows_dropped else ""
    click.echo(f"finish: {results.finish_ns} ns")
    click.echo(f"wrote {path} ({counts.slices:,} slices, {counts.flows_shown:,} dependency arrows{dropped})")
