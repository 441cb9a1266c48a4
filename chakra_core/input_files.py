"""Reading a user's input file: the one bounded, type-checked way every command reads one.

Only regular files are read. A directory, a device (/dev/zero never ends), a FIFO (opening one
blocks until a writer comes: forever when none does) or a socket is refused from its `os.stat`,
before it is opened; a FIFO is never opened (and the open is non-blocking, so a file swapped for
one in between cannot hang either). A missing file, a dangling symbolic link and a file larger
than its limit (chakra_core/limits.py: INPUT_BYTES, JSON_TRACE_BYTES) are refused with a message
naming the file, its size and the limit. Errors are `InputFileError`s: `path: reason`, one line.

.et traces are streamed, not read whole: they go through `open_input` (the type check) and the
frame readers bound each message (chakra_core/et/io.py).
"""

from __future__ import annotations

import os
import stat
import zlib
from typing import BinaryIO

from chakra_core.errors import InputFileError, TraceFormatError
from chakra_core.limits import GZIP_ALLOWANCE, GZIP_RATIO, INPUT_BYTES, Limit

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device: it would be read forever"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe: reading it waits for a writer"),
          (stat.S_ISSOCK, "a socket"))


def check_input(path: str | os.PathLike[str]) -> os.stat_result:
    """The file's stat when it is a regular file (through symbolic links); else an InputFileError."""
    name = os.fspath(path)
    try:
        info = os.stat(name)
    except FileNotFoundError:
        if os.path.islink(name):
            raise InputFileError(name, f"a dangling symbolic link (to {os.readlink(name)}, which does "
                                       "not exist)") from None
        raise InputFileError(name, "file not found") from None
    except OSError as exc:
        raise InputFileError(name, f"cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = next((what for test, what in _KINDS if test(info.st_mode)), "not a file")
        raise InputFileError(name, f"not a regular file ({kind})")
    return info


def open_input(path: str | os.PathLike[str]) -> BinaryIO:
    """A regular file opened for reading in binary (check_input's refusals, as InputFileErrors)."""
    check_input(path)
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputFileError(name, f"cannot read: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):   # replaced since the check
            raise InputFileError(name, "not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input_bytes(path: str | os.PathLike[str], limit: Limit, what: str = "file") -> bytes:
    """The whole file, refused before it is read when larger than `limit`."""
    name = os.fspath(path)
    size, most = check_input(path).st_size, limit.value()
    if size > most:
        raise InputFileError(name, f"the {what} is {size:,} bytes, too large to read; {limit.hint()}")
    with open_input(path) as handle:
        try:
            # read(n) allocates n bytes first: ask for the size, then for what a growing file adds
            blocks = [handle.read(size + 1)]
            total = len(blocks[0])
            while blocks[-1] and total <= most:
                blocks.append(handle.read(min(1 << 20, most + 1 - total)))
                total += len(blocks[-1])
        except OSError as exc:
            raise InputFileError(name, f"cannot read: {exc.strerror or exc}") from None
    data = b"".join(blocks)
    if len(data) > most:
        raise InputFileError(name, f"the {what} grew past {most:,} bytes while read; {limit.hint()}")
    return data


def read_input_text(path: str | os.PathLike[str], what: str = "file", *, limit: Limit = INPUT_BYTES,
                    errors: str = "strict", gunzip: bool = False) -> str:
    """The file as UTF-8 text (a file that is not: an InputFileError saying where); `gunzip`:
    the file is gzip-compressed, and `limit` bounds it decompressed."""
    if gunzip:
        try:
            with GuardedGunzip(path, limit) as stream:
                data = stream.read()
        except TraceFormatError as exc:
            raise InputFileError(exc.path, exc.reason) from None
        except (OSError, EOFError, zlib.error) as exc:
            raise InputFileError(os.fspath(path), f"corrupt or truncated gzip stream ({exc})") from None
    else:
        data = read_input_bytes(path, limit, what)
    try:
        return data.decode("utf-8", errors)
    except UnicodeDecodeError as exc:
        raise InputFileError(os.fspath(path), f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def open_trace_file(path: str | os.PathLike[str]) -> BinaryIO:
    """open_input for a .et file: its refusals as TraceFormatErrors, as every trace error is."""
    try:
        return open_input(path)
    except InputFileError as exc:
        raise TraceFormatError(exc.path, 0, exc.reason) from None


class GuardedGunzip:
    """A gzip file's decompressed stream that stops with a TraceFormatError once it expands
    beyond GZIP_RATIO times the compressed bytes read so far (a gzip bomb), early, instead of
    filling memory or disk or feeding millions of empty messages to the reader. Compressed
    input goes in small steps, so the count is exact (gzip.GzipFile reads ahead 128 KiB). Given a
    `limit`, it also stops (an InputFileError) once the total passes it."""

    _IN_STEP = 1 << 10
    _OUT_STEP = 64 << 10

    def __init__(self, path: str | os.PathLike[str], limit: Limit | None = None):
        self.path = str(path)
        self._ratio = GZIP_RATIO.value()
        self._limit = limit
        self._file = open_trace_file(path)
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
            if self._limit is not None and self._produced > self._limit.value():
                raise InputFileError(self.path, f"decompresses to more than {self._limit.value():,} bytes; "
                                                f"{self._limit.hint()}")
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
