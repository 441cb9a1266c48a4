"""The error a conversion reports when its input cannot be converted."""

from __future__ import annotations

from chakra_core.errors import ChakraSimError


class ConversionError(ChakraSimError):
    """A host or Kineto trace is unreadable or lacks what conversion needs; the message names
    the file and, where there is one, the node id."""
