"""The chakra-sim version (one place, imported by every module that writes it)."""

__version__ = "0.1.0"
