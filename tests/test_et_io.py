"""Reading and writing .et files: exact round trips, gzip, framing errors, atomic writes."""

from __future__ import annotations

import gzip
import io

import pytest

from chakra_core.errors import TraceFormatError
import chakra_core.et.io as io_module
from chakra_core.et.io import (FrameReader, encode_message, encode_varint, iter_frames, iter_trace,
                               read_trace, write_trace)
from chakra_core.feeder import StreamingFeeder
from chakra_core.schema import pb
from tests.helpers import frame_offsets, make_metadata, make_node, ref_et_params, write_et

META = make_metadata(attrs={"schema": "test"})
# node 2's body is over 127 bytes, so its length prefix takes two bytes
NODES = [make_node(1, attrs={"comm_size": ("uint64_val", 2**40)}),
         make_node(2, data_deps=[1], name="x" * 200, duration_micros=7),
         make_node(3, ctrl_deps=[1, 2], attrs={"is_cpu_op": True})]


def plain_bytes(metadata=META, nodes=NODES) -> bytes:
    return b"".join(encode_message(m) for m in [metadata, *nodes])


def drain_iter_trace(path):
    meta, nodes = iter_trace(path)
    return meta, [node for _, node in nodes]


def drain_streaming(path):
    feeder = StreamingFeeder(path)
    try:
        return feeder.metadata, [feeder.lookup_node(i).pb for i in sorted(feeder.pending_nodes())]
    finally:
        feeder.close()


def drain_read_trace(path):
    trace = read_trace(path)
    return trace.metadata, trace.nodes


READERS = {"read_trace": drain_read_trace, "iter_trace": drain_iter_trace, "streaming": drain_streaming}
"""Every way to read a trace: name -> function(path) returning (metadata, nodes)."""


# Round trips ------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ref_et_params())
def test_ref_trace_round_trip_is_byte_identical(path, tmp_path):
    trace = read_trace(path)
    out = tmp_path / "copy.et"
    write_trace(out, trace.metadata, trace.nodes)
    assert out.read_bytes() == path.read_bytes()


def test_write_encoding_is_varint_length_delimited(tmp_path):
    path = write_et(tmp_path / "t.et", NODES, META)
    data = path.read_bytes()
    assert data == plain_bytes()
    body = NODES[1].SerializeToString()
    assert len(body) > 127 and encode_varint(len(body)) == bytes([len(body) & 0x7F | 0x80, len(body) >> 7])
    trace = read_trace(path)
    assert trace.metadata == META and trace.nodes == NODES


@pytest.mark.parametrize("value, encoded", [(0, b"\x00"), (1, b"\x01"), (127, b"\x7f"),
                                            (128, b"\x80\x01"), (300, b"\xac\x02"),
                                            (16383, b"\xff\x7f"), (16384, b"\x80\x80\x01"),
                                            (2**64 - 1, b"\xff" * 9 + b"\x01")])
def test_encode_varint(value, encoded):
    assert encode_varint(value) == encoded


@pytest.mark.parametrize("size", [0, 1, 126, 127, 128, 129, 0x3FFF - 3, 0x3FFF, 0x4000, 0x4001, 3 << 14, 1 << 21])
def test_encode_message_prefixes_its_body_with_its_varint_length(size):
    """The one- and two-byte prefixes written without the loop are encode_varint's."""
    message = pb.Node(name="x" * size)
    body = message.SerializeToString()
    assert encode_message(message) == encode_varint(len(body)) + body


def test_write_trace_writes_every_node_across_blocks(tmp_path, monkeypatch):
    """Nodes are encoded and written in blocks: a trace of several blocks and a partial one is the
    frames of its nodes in order."""
    monkeypatch.setattr(io_module, "WRITE_BLOCK_NODES", 3)
    nodes = [pb.Node(id=i, name=f"n{i}") for i in range(8)]
    path = write_et(tmp_path / "blocks.et", nodes, META)
    assert path.read_bytes() == b"".join(encode_message(m) for m in [META, *nodes])


def test_metadata_only_trace(tmp_path):
    path = write_et(tmp_path / "t.et", [], META)
    for read in READERS.values():
        assert read(path) == (META, [])


# Gzip --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("how", ["write_trace", "gzip-module"])
def test_gzip_is_read_transparently(tmp_path, reader, how):
    path = tmp_path / "t.et.gz"
    if how == "write_trace":
        write_et(path, NODES, META, compress=True)
    else:
        path.write_bytes(gzip.compress(plain_bytes(), compresslevel=9))
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    assert READERS[reader](path) == (META, NODES)


def test_gzip_output_is_deterministic(tmp_path):
    first = write_et(tmp_path / "a.et", NODES, META, compress=True).read_bytes()
    second = write_et(tmp_path / "other-name.et", NODES, META, compress=True).read_bytes()
    assert first == second
    assert first[4:8] == b"\0\0\0\0"      # mtime 0
    assert not first[3] & 0x08            # no file name in the header
    assert gzip.decompress(first) == plain_bytes()


# Offsets ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("compress", [False, True])
def test_iter_trace_yields_frame_offsets(tmp_path, compress):
    path = write_et(tmp_path / "t.et", NODES, META, compress=compress)
    meta, nodes = iter_trace(path)
    assert meta == META
    got = list(nodes)
    assert [offset for offset, _ in got] == frame_offsets(META, NODES)[1:]
    assert [node for _, node in got] == NODES


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 7, 1 << 20])
def test_frame_reader_matches_iter_frames_for_any_chunk_size(chunk_size):
    data = plain_bytes()
    expected = [(frame, data[start:end]) for frame, start, end in iter_frames(data)]
    assert list(FrameReader(io.BytesIO(data), "<mem>", chunk_size=chunk_size)) == expected
    assert [frame for frame, _ in expected] == frame_offsets(META, NODES)


@pytest.mark.parametrize("chunk_size", [1, 3, 1 << 20])
def test_frame_reader_reads_prefixes_of_every_length(chunk_size):
    """Bodies of 1- to 3-byte length prefixes (127, 128, 16,383 and 16,384 bytes are the edges) and
    a non-minimal 2-byte prefix (protobuf reads it: et/io.py): the bytes as iter_frames finds them."""
    nodes = [make_node(i, name="n" * size) for i, size in enumerate([1, 121, 122, 16_376, 16_377], 1)]
    data = b"".join(encode_message(m) for m in [META, *nodes])
    body = nodes[0].SerializeToString()
    data += bytes([len(body) | 0x80, 0x00]) + body      # the same length, written in two bytes
    found = list(FrameReader(io.BytesIO(data), "<mem>", chunk_size=chunk_size))
    assert found == [(frame, data[start:end]) for frame, start, end in iter_frames(data)]
    assert {len(encode_varint(len(b))) for _, b in found} == {1, 2, 3}
    assert found[-1][1] == body


# Broken files -----------------------------------------------------------------------------------
def assert_format_error(excinfo, path, offset, *words):
    err = excinfo.value
    assert (err.path, err.offset) == (str(path), offset)
    message = str(err)
    assert str(path) in message and f"at byte {offset}" in message
    for word in words:
        assert word in message


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("where", ["message", "length-prefix"])
def test_truncated_file_names_path_and_frame_offset(tmp_path, reader, compress, where):
    data = plain_bytes()
    frame = frame_offsets(META, NODES)[2]        # NODES[1], whose length prefix has two bytes
    cut = frame + (1 if where == "length-prefix" else 20)
    path = tmp_path / "t.et"
    path.write_bytes(gzip.compress(data[:cut]) if compress else data[:cut])
    with pytest.raises(TraceFormatError) as excinfo:
        READERS[reader](path)
    assert_format_error(excinfo, path, frame, "truncated",
                        "length prefix" if where == "length-prefix" else "runs past the end")


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("data, offset, words", [
    (b"\x03\xff\xff\xff", 0, ("GlobalMetadata does not decode",)),
    (b"\xff" * 12, 0, ("longer than 10 bytes",)),
    (encode_message(META) + b"\x02\x08\xff", len(encode_message(META)), ("Node does not decode",)),
    (encode_message(META) + b"\x03\x12\x01\xff", len(encode_message(META)), ("Node does not decode",)),
    (b"This is a text file, not a trace\n" * 8, 0, ()),
], ids=["bad-metadata", "endless-varint", "bad-node", "bad-utf8", "text"])
def test_garbage_gives_trace_format_error(tmp_path, reader, data, offset, words):
    path = tmp_path / "garbage.et"
    path.write_bytes(data)
    with pytest.raises(TraceFormatError) as excinfo:
        READERS[reader](path)
    assert_format_error(excinfo, path, offset, *words)


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("data", [b"", gzip.compress(b"")], ids=["plain", "gzip"])
def test_empty_file(tmp_path, reader, data):
    path = tmp_path / "empty.et"
    path.write_bytes(data)
    with pytest.raises(TraceFormatError) as excinfo:
        READERS[reader](path)
    assert_format_error(excinfo, path, 0, "empty file")


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("damage", ["truncated", "garbage", "bad-crc"])
def test_corrupt_gzip(tmp_path, reader, damage):
    good = gzip.compress(plain_bytes())
    data = {"truncated": good[:len(good) // 2],
            "garbage": b"\x1f\x8b" + b"not a deflate stream at all",
            "bad-crc": good[:-8] + bytes([good[-8] ^ 0xFF]) + good[-7:]}[damage]
    path = tmp_path / "t.et.gz"
    path.write_bytes(data)
    with pytest.raises(TraceFormatError) as excinfo:
        READERS[reader](path)
    assert str(path) in str(excinfo.value)
    assert "corrupt" in excinfo.value.reason or "truncated" in excinfo.value.reason


# Atomic writes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("compress", [False, True])
def test_write_is_atomic_when_nodes_raise(tmp_path, compress):
    path = write_et(tmp_path / "t.et", NODES, META)
    before = path.read_bytes()

    def nodes():
        yield NODES[0]
        yield NODES[1]
        raise RuntimeError("converter crashed")

    with pytest.raises(RuntimeError, match="converter crashed"):
        write_trace(path, META, nodes(), compress=compress)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.et"]   # no temporary file left behind


def test_write_creates_missing_folders(tmp_path):
    path = write_et(tmp_path / "a" / "b" / "t.et", NODES, META)
    assert read_trace(path).nodes == NODES


@pytest.mark.parametrize("data", [b"", b"\xff" * 12, b"\x03\xff\xff\xff", gzip.compress(b"\x05ab")],
                         ids=["empty", "endless-varint", "bad-metadata", "gzip-truncated"])
def test_iter_trace_closes_the_file_when_the_first_frame_is_broken(tmp_path, monkeypatch, data):
    from chakra_core.et import io as et_io
    opened = []

    def tracking_open(path):
        opened.append(stream := real_open(path))
        return stream

    real_open = et_io.open_stream
    monkeypatch.setattr(et_io, "open_stream", tracking_open)
    path = tmp_path / "t.et"
    path.write_bytes(data)
    with pytest.raises(TraceFormatError):
        iter_trace(path)
    assert len(opened) == 1 and opened[0].closed


def test_iter_trace_closes_the_file_once_drained(tmp_path, monkeypatch):
    from chakra_core.et import io as et_io
    opened = []
    real_open = et_io.open_stream
    monkeypatch.setattr(et_io, "open_stream", lambda p: opened.append(real_open(p)) or opened[-1])
    _, nodes = iter_trace(write_et(tmp_path / "t.et", NODES, META))
    assert not opened[0].closed
    assert len(list(nodes)) == len(NODES)
    assert opened[0].closed
