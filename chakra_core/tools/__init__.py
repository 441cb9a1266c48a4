"""Trace tools behind `chakra-sim convert text`, `generate`, `visualize`, `analyze`,
`synthesize`, `obfuscate` (and `timeline`).

Each tool is a module holding the logic as plain functions (usable from Python
and tests) and one click command object that `chakra_core.cli` wires in:

    chakra_core.tools.text:convert_text        chakra-sim convert text ...
    chakra_core.tools.generate:generate        chakra-sim generate microbenchmark|transformer ...
    chakra_core.tools.visualize:visualize      chakra-sim visualize ...
    chakra_core.report.timeline:timeline       chakra-sim timeline ...
    chakra_core.tools.analyze:analyze          chakra-sim analyze ...
    chakra_core.tools.synthesis.cli:synthesize chakra-sim synthesize ...
    chakra_core.tools.obfuscation:obfuscate    chakra-sim obfuscate ...

docs/tools.md is the user guide. Errors a user can cause are `ChakraSimError`s
(or `ToolError` for bad option combinations); the commands print them as one
line and exit with status 2, like the rest of the command line.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import click
from rich.console import Console
from rich.markup import escape

from chakra_core.errors import ChakraSimError


class ToolError(click.ClickException):
    """A user error in a tool command: printed as `error: <message>`, exit status 2 (no traceback)."""

    exit_code = 2

    def show(self, file=None) -> None:
        Console(stderr=True, highlight=False).print(f"[red]error:[/red] {escape(self.message)}",
                                                    soft_wrap=True)


@contextmanager
def tool_errors(writing: str, debug: bool = False) -> Iterator[None]:
    """Report a command's failures as one-line ToolErrors: an input error as its message, an
    OSError as "cannot write <writing>: <reason>". With `debug`, input errors keep their traceback."""
    try:
        yield
    except ChakraSimError as exc:
        if debug:
            raise
        raise ToolError(str(exc)) from exc
    except OSError as exc:
        raise ToolError(f"cannot write {writing}: {exc.strerror or exc}") from exc
