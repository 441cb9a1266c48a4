"""Limits on what an input may ask of the reader, each with an environment variable to raise it.

A hostile or broken file must fail fast with a message, not exhaust memory or time: a length
prefix of 2^60, a gzip stream that expands a thousandfold, /dev/zero given as a trace, a node
with millions of parents, YAML aliases that expand exponentially, nesting deeper than Python's
recursion limit, times no hardware takes. The defaults sit far above any real trace or
configuration (docs/reliability.md, "Limits"); every message names the variable that raises it.
Values are read when a check starts (a file is opened, a configuration read), so a test or a
caller may change them between runs; the checks made per message or per node read theirs once
per file (one lookup per node and message was 1.97 million in a 657,000-node plan layout, about
4% of its profile).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from chakra_core.errors import ChakraSimError, TraceFormatError


@dataclass(frozen=True)
class Limit:
    env: str
    default: int
    what: str

    def value(self) -> int:
        raw = os.environ.get(self.env)
        if raw is None or raw == "":
            return self.default
        try:
            number = int(float(raw)) if "e" in raw.lower() else int(raw)
        except ValueError:
            raise ChakraSimError(f"{self.env}={raw!r}: expected a positive integer") from None
        if number < 1:
            raise ChakraSimError(f"{self.env}={raw!r}: expected a positive integer")
        return number

    def hint(self) -> str:
        return f"the limit is {self.value():,} {self.what} ({self.env}; set it higher if the input is genuine)"


MESSAGE_BYTES = Limit("CHAKRA_SIM_MAX_MESSAGE_BYTES", 64 << 20, "bytes per message")
"""One protobuf message (a node or the metadata) of a .et file; protobuf's historical default."""
GZIP_RATIO = Limit("CHAKRA_SIM_MAX_GZIP_RATIO", 200, "times the compressed bytes read")
"""How far a gzip stream may expand beyond its first GZIP_ALLOWANCE bytes (traces gzip 5-20x;
zeros, 1000x)."""
GZIP_ALLOWANCE = 64 << 10
NODE_PARENTS = Limit("CHAKRA_SIM_MAX_NODE_PARENTS", 1_000_000, "parents per node")
CONFIG_DEPTH = Limit("CHAKRA_SIM_MAX_CONFIG_DEPTH", 64, "levels of nesting")
CONFIG_NODES = Limit("CHAKRA_SIM_MAX_CONFIG_NODES", 1_000_000, "values (after YAML aliases are expanded)")
INPUT_BYTES = Limit("CHAKRA_SIM_MAX_INPUT_BYTES", 64 << 20, "bytes")
"""A configuration, job, sweep, text workload, nccl-tests log or synthesis model: the largest
shipped is under 1 MiB."""
JSON_TRACE_BYTES = Limit("CHAKRA_SIM_MAX_JSON_TRACE_BYTES", 8 << 30, "bytes")
"""A PyTorch execution trace or Kineto trace (decompressed): real ones reach a few GiB; Python's
JSON objects take 5-10x the text, so a larger one would not fit a machine's memory anyway."""
TIME_NS = Limit("CHAKRA_SIM_MAX_TIME_NS", 10**18, "ns (about 32 years)")
"""Any simulated time; below 2^63 so that every time fits a signed 64-bit column."""


def check_length(path: str, offset: int, length: int, most: int | None = None) -> None:
    """A TraceFormatError when a length prefix announces more than MESSAGE_BYTES (`most`: its
    value, read by the caller once per file rather than once per message)."""
    if length > (MESSAGE_BYTES.value() if most is None else most):
        raise TraceFormatError(path, offset, f"length prefix announces a message of {length:,} bytes; "
                                             f"{MESSAGE_BYTES.hint()}")


GENERATED_NODES = Limit("CHAKRA_SIM_MAX_GENERATED_NODES", 20_000_000, "nodes a generator holds in memory")
"""Nodes `generate microbenchmark` builds before writing (every rank's, at once: about 0.5 KB each):
--iterations 10**9 would fill memory before the first file."""

RANKS = Limit("CHAKRA_SIM_MAX_RANKS", 131_072, "ranks")
"""Rank files one command writes (generate, synthesize, convert text), and a job's GPUs: above
the largest clusters trained on (about 100,000 GPUs); a typo of 1,000,000 wrote files until
killed, and a job of 10,000,000 GPUs built communicator groups for minutes."""


def check_rank_count(count: int, what: str) -> None:
    """A ChakraSimError naming `what` (the option or key) when `count` ranks exceed RANKS."""
    if count > RANKS.value():
        raise ChakraSimError(f"{what} {count:,}: more rank files than one command writes; {RANKS.hint()}")
