"""The error of the trace generators."""

from __future__ import annotations

from chakra_core.errors import ChakraSimError


class GeneratorError(ChakraSimError):
    """Invalid generator arguments (the message says which and why)."""
