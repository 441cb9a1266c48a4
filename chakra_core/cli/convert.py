"""`chakra-sim convert`: the converters to Chakra .et, each imported when used."""

from __future__ import annotations

import click

from chakra_core.cli.lazy import LazyGroup

CONVERTERS = {
    "pytorch": "chakra_core.tools.pytorch.cli:convert_pytorch",
    "text": "chakra_core.tools.text:convert_text",
}


@click.group(cls=LazyGroup, lazy=CONVERTERS)
def convert() -> None:
    """Convert traces to Chakra .et: PyTorch execution traces, ASTRA-sim text workloads."""
