"""How commands talk to the terminal: consoles, warnings, and one-line errors.

Every error a user can cause is printed as `error: <message>` on stderr with exit status 2,
no traceback (`--debug` shows it): `CliError` for a command's own checks, `tool_errors` and
`fail` for the `ChakraSimError`s the library raises.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import IO, Any, Iterable, Iterator, NoReturn

import click
from rich.console import Console
from rich.markup import escape

from chakra_core.errors import ChakraSimError

err_console = Console(stderr=True, highlight=False)


def out_console(stderr: bool = False) -> Console:
    """stdout console (stderr: for a command whose stdout carries JSON); wide enough for the tables
    when output is not a terminal (pipes, logs)."""
    console = Console(highlight=False, stderr=stderr)
    if not console.is_terminal:
        console.width = max(console.width, 140)
    return console


class CliError(click.ClickException):
    """A user error in a command: printed as `error: <message>`, exit status 2 (no traceback)."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        Console(stderr=True, highlight=False).print(f"[red]error:[/red] {escape(self.message)}",
                                                    soft_wrap=True)


def fail(exc: ChakraSimError, debug: bool) -> NoReturn:
    """Stop the command with `exc`'s message (its traceback too with --debug)."""
    if debug:
        raise exc
    raise CliError(str(exc)) from exc


@contextmanager
def tool_errors(writing: str, debug: bool = False) -> Iterator[None]:
    """Report a command's failures as one-line CliErrors: an input error as its message, an
    OSError as "cannot write <writing>: <reason>". With `debug`, input errors keep their traceback."""
    try:
        yield
    except ChakraSimError as exc:
        if debug:
            raise
        raise CliError(str(exc)) from exc
    except OSError as exc:
        raise CliError(f"cannot write {writing}: {exc.strerror or exc}") from exc


def note(messages: Iterable[str]) -> None:
    """Each message as a `note:` line on stderr."""
    for message in messages:
        err_console.print(f"note: {escape(message)}", soft_wrap=True, highlight=False)


def warn(messages: Iterable[str]) -> None:
    """Each message as a `warning:` line on stderr."""
    for message in messages:
        err_console.print(f"[yellow]warning:[/yellow] {escape(message)}", soft_wrap=True)
