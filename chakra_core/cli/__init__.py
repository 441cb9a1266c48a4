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
    chakra-sim plan JOB.yaml [--cluster CLUSTER.yaml] [--executor local|ray] [--top K] [--out DIR]
                    [--vary KEY=V1,V2,...]
    chakra-sim analyze PREFIX [--out DIR] [--json] [--imbalance-threshold X]
                       [--compute-time duration|roofline --peak-tflops F --mem-bw-gbps F]
    chakra-sim analyze --results A.json --results B.json [--out DIR] [--json]
    chakra-sim synthesize --from PREFIX [--from ...] [--ranks N] [--out OUTPREFIX] [--seed S]
                          [--length NODES] [--obfuscate] [--model model.json]
    chakra-sim synthesize --model model.json [--ranks N] --out OUTPREFIX [--seed S] [--length NODES]
    chakra-sim obfuscate PREFIX --out OUTPREFIX [--seed S] [--tolerance T]
    chakra-sim profiles [NAME_OR_PATH] [--json]
    chakra-sim <command of an installed plugin> ...

Commands live in their own modules and are imported only when used (`LazyGroup`),
so `chakra-sim run` does not import the converters and generators. Plugins add
commands through the `chakra_sim_register_commands` hook; they are looked up
only for a name that is not one of chakra-sim's own, or to list them in --help.

Errors caused by inputs print one clear message and exit with status 2 (no
traceback); `--debug` shows the traceback too. Ctrl-C during `run` exits with
status 130.
"""

from __future__ import annotations

import click

from chakra_core._version import __version__
from chakra_core.cli.lazy import LazyGroup
from chakra_core.cli.output import CliError, err_console, fail, out_console, warn

__all__ = ["CliError", "LazyGroup", "err_console", "fail", "main", "out_console", "warn"]


COMMANDS = {
    "run": "chakra_core.cli.simulate:run",
    "validate": "chakra_core.cli.simulate:validate",
    "plugins": "chakra_core.cli.plugins:plugins",
    "jsonize": "chakra_core.cli.jsonize:jsonize",
    "convert": "chakra_core.cli.convert:convert",
    "generate": "chakra_core.tools.generate:generate",
    "visualize": "chakra_core.tools.visualize:visualize",
    "timeline": "chakra_core.cli.timeline:timeline",
    "sweep": "chakra_core.sweep:sweep",
    "plan": "chakra_core.plan.cli:plan_command",
    "analyze": "chakra_core.tools.analyze:analyze",
    "synthesize": "chakra_core.tools.synthesis.cli:synthesize",
    "obfuscate": "chakra_core.tools.obfuscation:obfuscate",
    "profiles": "chakra_core.cli.profiles:profiles",
}
"""Command name -> "module:attribute" of its click command."""


@click.group(cls=LazyGroup, lazy=COMMANDS, plugin_commands=True,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="chakra-sim")
def main() -> None:
    """chakra-sim: simulate distributed AI training from Chakra execution traces."""
