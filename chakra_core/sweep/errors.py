"""What makes a sweep unable to run at all."""

from __future__ import annotations

from chakra_core.errors import ChakraSimError

RAY_INSTALL = "pip install 'chakra-sim[ray]'"


class SweepError(ChakraSimError):
    """The sweep cannot run at all (an executor missing or unreachable)."""


def first_line(text: str) -> str:
    """The first non-empty line of an error message, for a table cell."""
    return text.strip().splitlines()[0] if text.strip() else ""
