"""Chakra ET files: reading, writing, typed attributes, JSON conversion."""

from chakra_core.et.attrs import NodeView, attr_value
from chakra_core.et.io import Trace, iter_trace, read_trace, write_trace
from chakra_core.et.jsonize import trace_files

__all__ = ["NodeView", "Trace", "attr_value", "iter_trace", "read_trace", "trace_files", "write_trace"]
