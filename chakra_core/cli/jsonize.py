"""`chakra-sim jsonize`: traces as JSON, one file per rank."""

from __future__ import annotations

from pathlib import Path

import click

from chakra_core.cli.output import CliError
from chakra_core.errors import ChakraSimError

@click.command()
@click.argument("trace")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="folder for the JSON files (default: next to the traces)")
@click.option("--compact", is_flag=True, help="no indentation")
def jsonize(trace: str, out_dir: str | None, compact: bool) -> None:
    """Convert a trace to JSON: TRACE is a file.et or a prefix (one JSON file per rank).

    \b
    Example:
      chakra-sim jsonize traces/all_reduce --out json/
    """
    from chakra_core.et.jsonize import check_one_file_per_rank, json_name, jsonize_file, trace_files

    path = Path(trace)
    if path.is_file():
        files = [path]
    else:
        ranks = trace_files(path)
        try:
            check_one_file_per_rank(ranks)
        except ChakraSimError as exc:
            raise CliError(str(exc)) from None
        files = [et_path for _, et_path in ranks]
    if not files:
        raise CliError(f"no trace file {trace} and no files {trace}.<rank>.et or .et.gz")
    from chakra_core._atomic import AtomicFiles
    from chakra_core.input_files import open_trace_file

    written = []
    target = Path(out_dir or ".")
    try:
        for et_path in files:   # every input is a file before anything is written
            open_trace_file(et_path).close()
        with AtomicFiles() as staged:   # all the JSON files, or none of them
            for et_path in files:
                target = (Path(out_dir) if out_dir else et_path.parent) / json_name(et_path)
                count = jsonize_file(et_path, target, None if compact else 1, staged)
                written.append(f"{et_path} -> {target} ({count} nodes)")
            staged.commit()
    except ChakraSimError as exc:
        raise CliError(str(exc)) from exc
    except OSError as exc:
        raise CliError(f"cannot write {exc.filename or target}: {exc.strerror or exc}") from exc
    for line in written:
        click.echo(line)
