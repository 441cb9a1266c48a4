"""Limits on what an input may ask of the reader, each with an environment variable to raise it.

A hostile or broken file must fail fast with a message, not exhaust memory or time: a length
prefix of 2^60, a gzip stream that expands a thousandfold, /dev/zero given as a trace, a node
with millions of parents, YAML aliases that expand exponentially, nesting deeper than Python's
recursion limit, times no hardware takes. The defaults sit far above any real trace or
configuration (docs/reliability.md, "Limits"); every message names the variable that raises it.
Values are read when checked, so a test or a caller may change them at any time.
"""

from __future__ import annotations

import os
import stat
import zlib
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
TIME_NS = Limit("CHAKRA_SIM_MAX_TIME_NS", 10**18, "ns (about 32 years)")
"""Any simulated time; below 2^63 so that every time fits a signed 64-bit column."""


def check_length(path: str, offset: int, length: int) -> None:
    """A TraceFormatError when a length prefix announces more than MESSAGE_BYTES."""
    if length > MESSAGE_BYTES.value():
        raise TraceFormatError(path, offset, f"length prefix announces a message of {length:,} bytes; "
                                             f"{MESSAGE_BYTES.hint()}")


def check_regular(path: str | os.PathLike[str]) -> None:
    """Refuse devices (/dev/zero, /dev/urandom): they never end. Regular files and pipes pass."""
    mode = os.stat(path).st_mode
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        raise TraceFormatError(str(path), 0, "not a regular file (a device: it would be read forever)")


class GuardedGunzip:
    """A gzip file's decompressed stream that stops with a TraceFormatError once it expands
    beyond GZIP_RATIO times the compressed bytes read so far (a gzip bomb), early, instead of
    filling memory or disk or feeding millions of empty messages to the reader. Compressed
    input goes in small steps, so the count is exact (gzip.GzipFile reads ahead 128 KiB)."""

    _IN_STEP = 1 << 10
    _OUT_STEP = 64 << 10

    def __init__(self, path: str | os.PathLike[str]):
        self.path = str(path)
        self._ratio = GZIP_RATIO.value()
        self._file = open(path, "rb")
        self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)   # gzip framing
        self._consumed = 0
        self._produced = 0
        self._left = b""     # decompressed, not handed out yet

    def _next_block(self) -> bytes:
        """Up to _OUT_STEP decompressed bytes; b"" at the end of the last member."""
        while True:
            data = self._inflate.unconsumed_tail
            if not data:
                if self._inflate.eof:        # a member ended: another may follow
                    data = self._inflate.unused_data or self._file.read(self._IN_STEP)
                    if not data.strip(b"\x00"):
                        return b""
                    self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
                else:
                    data = self._file.read(self._IN_STEP)
                    if not data:
                        raise EOFError("compressed file ended before the end-of-stream marker was reached")
                self._consumed += len(data)
            block = self._inflate.decompress(data, self._OUT_STEP)
            if block:
                return block

    def read(self, size: int = -1) -> bytes:
        parts: list[bytes] = []
        wanted = size if size >= 0 else -1
        while wanted != 0:
            block = self._take_left() if self._left else self._next_block()
            if not block:
                break
            if wanted > 0 and len(block) > wanted:
                block, self._left = block[:wanted], block[wanted:]
            self._produced += len(block)
            if self._produced > GZIP_ALLOWANCE + self._ratio * self._consumed:
                raise TraceFormatError(
                    self.path, self._produced,
                    f"gzip stream expands to {self._produced:,} bytes from {self._consumed:,} compressed "
                    f"bytes (a gzip bomb?); {GZIP_RATIO.hint()}")
            parts.append(block)
            if wanted > 0:
                wanted -= len(block)
        return b"".join(parts)

    def _take_left(self) -> bytes:
        block, self._left = self._left, b""
        return block

    def close(self) -> None:
        self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.closed

    def __enter__(self) -> "GuardedGunzip":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
