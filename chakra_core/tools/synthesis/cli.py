"""The `chakra-sim synthesize` command."""

from __future__ import annotations

import click

from chakra_core.cli.output import CliError, tool_errors
from chakra_core.tools.obfuscation import DEFAULT_TOLERANCE, read_comm_groups


@click.command("synthesize")
@click.option("--from", "sources", multiple=True, metavar="PREFIX",
              help="source trace (PREFIX.<rank>.et); repeat for several parts of one job")
@click.option("--ranks", type=int, metavar="N", help="ranks to write  [default: the source's]")
@click.option("--out", "out_prefix", metavar="OUTPREFIX", help="prefix of the synthetic files (OUTPREFIX.<rank>.et)")
@click.option("--seed", type=int, default=0, show_default=True, metavar="S", help="same seed, same files")
@click.option("--length", type=int, metavar="NODES", help="nodes per rank, about  [default: the source's]")
@click.option("--obfuscate", is_flag=True,
              help="keep no name in the model or traces, and perturb durations and sizes")
@click.option("--tolerance", type=float, default=DEFAULT_TOLERANCE, show_default=True, metavar="T",
              help="with --obfuscate: values move by at most this fraction")
@click.option("--model", "model_path", type=click.Path(dir_okay=False),
              help="with --from: write the fitted model here; without: sample from this model")
@click.option("--comm-group", "comm_group", type=click.Path(dir_okay=False),
              help="communicator-group JSON the source needs (as for chakra-sim run)")
@click.option("--dependencies", type=click.Choice(["all", "data"]), default="all", show_default=True,
              help="dependencies of the source to honour (data: as Chakra's C++ feeder)")
@click.option("--debug", is_flag=True, help="show tracebacks")
def synthesize(sources: tuple[str, ...], ranks: int | None, out_prefix: str | None, seed: int, length: int | None,
               obfuscate: bool, tolerance: float, model_path: str | None, comm_group: str | None, dependencies: str,
               debug: bool) -> None:
    """Fit a statistical model of traces and sample new traces from it.

    \b
    Examples:
      chakra-sim synthesize --from traces/gpt --ranks 64 --out synth/gpt --seed 1
      chakra-sim synthesize --from traces/gpt --model gpt-model.json --obfuscate
      chakra-sim synthesize --model gpt-model.json --ranks 128 --out synth/gpt128
    """
    from chakra_core.tools.synthesis.fit import fit_model
    from chakra_core.tools.synthesis.model import load_model, save_model
    from chakra_core.tools.synthesis.sample import write_synthetic

    if not sources and not model_path:
        raise CliError("give source traces (--from PREFIX) or a model (--model FILE)")
    if not sources and (obfuscate or comm_group):
        raise CliError("--obfuscate and --comm-group apply when fitting (--from); a saved model "
                        "is used as it is")
    if sources and not out_prefix and not model_path:
        raise CliError("give --out PREFIX for the synthetic traces, --model FILE for the model, or both")
    if not sources and not out_prefix:
        raise CliError("give --out PREFIX for the synthetic traces")
    if not 0 <= tolerance < 1:
        raise CliError(f"--tolerance must be in [0, 1), got {tolerance}")
    with tool_errors(model_path or f"{out_prefix}.<rank>.et", debug):
        if sources:
            model = fit_model(list(sources), read_comm_groups(comm_group), obfuscate=obfuscate,
                              tolerance=tolerance, seed=seed, use_ctrl=dependencies == "all")
            if model_path:
                save_model(model, model_path)
                click.echo(f"wrote {model_path} ({len(model.roles)} role(s) over {model.num_ranks} "
                           f"source rank(s), {model.source_nodes:,} nodes per rank)")
            if model.unmodelled_dependencies:
                click.echo(f"note: {model.unmodelled_dependencies:,} dependencies of the source are not "
                           "modelled (parents missing from the trace, or more than 64 back in their lane)")
        else:
            assert model_path is not None       # without --from, --model is required (checked above)
            model = load_model(model_path)
    if out_prefix:
        with tool_errors(f"{out_prefix}.<rank>.et", debug):
            paths = write_synthetic(model, out_prefix, ranks, length, seed)
        click.echo(f"wrote {len(paths)} synthetic rank(s) to {out_prefix}.<rank>.et")
