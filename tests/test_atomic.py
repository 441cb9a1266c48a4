"""Atomic output: files appear whole or not at all, with the permissions of any new file."""

from __future__ import annotations

import os
import stat

import pytest

from chakra_core._atomic import AtomicFiles, atomic_write_bytes, atomic_write_text
from chakra_core.et.io import write_trace
from chakra_core.et.jsonize import jsonize_file
from tests.helpers import make_metadata, make_node


@pytest.fixture(params=[0o022, 0o027, 0o002])
def umask(request):
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_every_atomic_writer_honours_the_umask(tmp_path, umask):
    expected = 0o666 & ~umask
    atomic_write_text(tmp_path / "a.txt", "text")
    atomic_write_bytes(tmp_path / "b.bin", b"bytes")
    write_trace(tmp_path / "t.0.et", make_metadata(), [make_node(1)])            # converters, generators
    write_trace(tmp_path / "t.1.et.gz", make_metadata(), [make_node(1)], compress=True)
    jsonize_file(tmp_path / "t.0.et", tmp_path / "t.0.json")
    with AtomicFiles() as files:
        files.write_text(tmp_path / "results.json", "{}")
        files.commit()
    for name in ("a.txt", "b.bin", "t.0.et", "t.1.et.gz", "t.0.json", "results.json"):
        assert mode(tmp_path / name) == expected, name


def test_replacing_a_file_gives_it_the_umask_mode_too(tmp_path, umask):
    target = tmp_path / "r.txt"
    target.write_text("old")
    target.chmod(0o600)
    atomic_write_text(target, "new")
    assert target.read_text() == "new" and mode(target) == 0o666 & ~umask


def test_files_left_uncommitted_are_removed_and_targets_untouched(tmp_path):
    (tmp_path / "a").write_text("old a")
    with pytest.raises(RuntimeError):
        with AtomicFiles() as files:
            files.write_text(tmp_path / "a", "new a")
            files.write_text(tmp_path / "b", "new b")
            raise RuntimeError("the run failed after writing")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    assert (tmp_path / "a").read_text() == "old a"
