"""Reading and writing Chakra .et files.

The format (MLCommons Chakra `et_def.proto` + `protolib` framing): a stream of
protobuf messages, each preceded by its byte length as a base-128 varint. The
first message is a `GlobalMetadata`, every following one a `Node`, until EOF.
There is no header, count or trailer. Files may be gzip-compressed; readers
detect the gzip magic and decompress transparently.

One rule for length prefixes, shared by every reader (the in-memory one, the
streaming index, the jsonizer, folding): protobuf's own. A prefix is a varint
of at most 10 bytes; non-minimal encodings (0x85 0x00 for 5) are accepted, as
protobuf's parsers accept them, and the value is taken modulo 2^64. A message
longer than `chakra_core.limits.MESSAGE_BYTES` is refused before it is read.

Errors name the file and the byte offset of the frame that is broken, so a
truncated download or a file of the wrong kind is obvious.
"""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass, field
from typing import BinaryIO, Iterable, Iterator

from google.protobuf.message import DecodeError, Message

from chakra_core._atomic import atomic_output
from chakra_core.errors import TraceFormatError
from chakra_core.input_files import GuardedGunzip, open_trace_file
from chakra_core.limits import MESSAGE_BYTES, check_length
from chakra_core.schema import pb

GZIP_MAGIC = b"\x1f\x8b"
WRITE_BLOCK_NODES = 4096
"""Nodes encoded before each write of write_trace."""
_MAX_VARINT_BYTES = 10
_UINT64 = (1 << 64) - 1


def encode_varint(value: int) -> bytes:
    """Base-128 varint, as protobuf's `_VarintBytes` writes a length prefix."""
    if value < 0x80:          # a node's prefix is nearly always 1 or 2 bytes: no loop for those
        return bytes((value,))
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_varint(buf: bytes | bytearray | memoryview, pos: int, path: str = "<buffer>",
                  most: int | None = None) -> tuple[int, int]:
    """Decode the length prefix at `pos` (module docstring: protobuf's rule, then the message
    size limit, `most` when the caller read it for the whole file); return (value, position
    after it)."""
    result = shift = 0
    start = pos
    end = len(buf)
    while True:
        if pos >= end:
            raise TraceFormatError(path, start, "file ends inside a length prefix (truncated file)")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            result &= _UINT64
            check_length(path, start, result, most)
            return result, pos
        shift += 7
        if pos - start >= _MAX_VARINT_BYTES:
            raise TraceFormatError(path, start, "length prefix longer than 10 bytes (not a Chakra .et file?)")


def iter_frames(buf: bytes | memoryview, path: str = "<buffer>") -> Iterator[tuple[int, int, int]]:
    """Yield (frame offset, message start, message end) for every message in `buf`."""
    pos, end = 0, len(buf)
    most = MESSAGE_BYTES.value()
    while pos < end:
        frame = pos
        length, pos = decode_varint(buf, pos, path, most)
        if pos + length > end:
            raise TraceFormatError(
                path, frame,
                f"message of {length} bytes runs past the end of the file "
                f"({end - pos} bytes left; truncated file)")
        yield frame, pos, pos + length
        pos += length


def is_gzip(path: str | os.PathLike[str]) -> bool:
    with open_trace_file(path) as handle:
        return handle.read(2) == GZIP_MAGIC


def read_file_bytes(path: str | os.PathLike[str]) -> bytes:
    """The decompressed contents of a .et file (plain or gzip)."""
    if not is_gzip(path):
        with open_trace_file(path) as handle:   # a regular file: its size bounds the read
            return handle.read()
    try:
        with GuardedGunzip(path) as stream:
            return stream.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceFormatError(str(path), 0, f"corrupt gzip stream: {exc}") from exc


def parse_metadata(data: bytes | memoryview, path: str, offset: int) -> pb.GlobalMetadata:
    meta = pb.GlobalMetadata()
    try:
        meta.ParseFromString(bytes(data))
    except DecodeError as exc:
        raise TraceFormatError(path, offset, f"GlobalMetadata does not decode: {exc}") from exc
    return meta


def parse_node(data: bytes | memoryview, path: str, offset: int) -> pb.Node:
    node = pb.Node()
    try:
        node.ParseFromString(bytes(data))
    except DecodeError as exc:
        raise TraceFormatError(path, offset, f"Node does not decode: {exc}") from exc
    return node


@dataclass
class Trace:
    """One rank's trace held in memory."""

    metadata: pb.GlobalMetadata
    nodes: list[pb.Node] = field(default_factory=list)


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a whole .et file (plain or gzip) into memory."""
    spath = str(path)
    data = read_file_bytes(path)
    view = memoryview(data)
    frames = iter_frames(view, spath)
    first = next(frames, None)
    if first is None:
        raise TraceFormatError(spath, 0, "empty file: a Chakra trace starts with a GlobalMetadata message")
    offset, start, end = first
    trace = Trace(parse_metadata(view[start:end], spath, offset))
    nodes = trace.nodes
    for offset, start, end in frames:
        nodes.append(parse_node(view[start:end], spath, offset))
    return trace


class FrameReader:
    """Sequential reader of length-delimited messages from a binary stream.

    Used for traces too large to hold in memory: it keeps one read buffer and
    reports each message with its byte offset in the (decompressed) stream.
    """

    def __init__(self, stream: BinaryIO, path: str, chunk_size: int = 1 << 20):
        self._stream, self._path, self._chunk = stream, path, chunk_size
        self._buf = bytearray()
        self._pos = 0           # position of _buf[0] in the stream
        self._eof = False
        self._most = MESSAGE_BYTES.value()
        self.body_offset = 0
        """Stream offset of the body last yielded (after its prefix, however long)."""

    def _fill(self, needed: int) -> None:
        while len(self._buf) < needed and not self._eof:
            try:
                # bounded reads: a claimed length is only believed as far as the file goes
                block = self._stream.read(min(max(self._chunk, needed - len(self._buf)), 16 << 20))
            except (OSError, EOFError, zlib.error) as exc:
                raise TraceFormatError(self._path, self._pos + len(self._buf),
                                       f"corrupt compressed stream: {exc}") from exc
            if not block:
                self._eof = True
            else:
                self._buf += block

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        """Yield (frame offset, message bytes)."""
        buf = self._buf
        at = 0        # the next frame's index in buf; what precedes it is dropped only to read more
        most = self._most
        while True:
            if len(buf) - at < _MAX_VARINT_BYTES and not self._eof:
                del buf[:at]
                self._pos += at
                at = 0
                self._fill(_MAX_VARINT_BYTES)
            if at >= len(buf):
                return
            frame = self._pos + at
            first = buf[at]
            second = buf[at + 1] if len(buf) - at > 1 else 0x80
            if first < 0x80 and first <= most:     # one- and two-byte prefixes: nearly every node's
                length, body_start = first, at + 1
            elif second < 0x80 and (first & 0x7F) | second << 7 <= most:
                length, body_start = (first & 0x7F) | second << 7, at + 2
            else:
                try:
                    length, body_start = decode_varint(buf, at, self._path, most)
                except TraceFormatError as exc:
                    raise TraceFormatError(self._path, frame, exc.reason) from None
            body_end = body_start + length
            if len(buf) < body_end:
                del buf[:at]
                self._pos += at
                body_start, body_end, at = body_start - at, body_end - at, 0
                self._fill(body_end)
                if len(buf) < body_end:
                    raise TraceFormatError(
                        self._path, frame,
                        f"message of {length} bytes runs past the end of the file "
                        f"({len(buf) - body_start} bytes left; truncated file)")
            body = bytes(buf[body_start:body_end])
            self.body_offset = self._pos + body_start
            at = body_end
            yield frame, body


def open_stream(path: str | os.PathLike[str]) -> BinaryIO:
    """A binary stream of the decompressed file contents."""
    if is_gzip(path):
        return GuardedGunzip(path)  # type: ignore[return-value]  # read() and close() suffice
    return open_trace_file(path)


def iter_trace(path: str | os.PathLike[str]) -> tuple[pb.GlobalMetadata, Iterator[tuple[int, pb.Node]]]:
    """Stream a trace: return its metadata and an iterator of (byte offset, Node)."""
    spath = str(path)
    stream = open_stream(path)
    frames = iter(FrameReader(stream, spath))
    try:
        first = next(frames, None)
        if first is None:
            raise TraceFormatError(spath, 0, "empty file: a Chakra trace starts with a GlobalMetadata message")
        meta = parse_metadata(first[1], spath, first[0])
    except BaseException:
        stream.close()  # a broken first frame must not leak the open file
        raise

    def nodes() -> Iterator[tuple[int, pb.Node]]:
        with stream:
            for offset, body in frames:
                yield offset, parse_node(body, spath, offset)

    return meta, nodes()


def encode_message(message: Message) -> bytes:
    body = message.SerializeToString()
    return encode_varint(len(body)) + body


def write_trace(path: str | os.PathLike[str], metadata: pb.GlobalMetadata, nodes: Iterable[pb.Node],
                compress: bool = False) -> None:
    """Write a .et file atomically (optionally gzip-compressed)."""
    with atomic_output(path, "wb") as handle:
        # mtime=0 keeps compressed output deterministic.
        sink = gzip.GzipFile(fileobj=handle, mode="wb", mtime=0) if compress else handle
        sink.write(encode_message(metadata))
        pending: list[bytes] = []
        for node in nodes:    # written in blocks: a write call per node cost more than encoding it
            pending.append(encode_message(node))
            if len(pending) == WRITE_BLOCK_NODES:
                sink.write(b"".join(pending))
                pending.clear()
        sink.write(b"".join(pending))
        if compress:
            sink.close()
