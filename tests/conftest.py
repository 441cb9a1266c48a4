"""Fixtures shared by the test suite (builders live in tests/helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import REF_TRACES, SHARED_DIR, write_et


@pytest.fixture
def shared_dir() -> Path:
    """The shared folder (`../shared` next to the repository); skips the test when it is absent."""
    if not SHARED_DIR.is_dir():
        pytest.skip(f"shared folder {SHARED_DIR} not found")
    return SHARED_DIR


@pytest.fixture
def ref_traces(shared_dir: Path) -> Path:
    """The shared reference traces folder; skips the test when it is absent."""
    if not REF_TRACES.is_dir():
        pytest.skip(f"reference traces {REF_TRACES} not found")
    return REF_TRACES


@pytest.fixture
def et_file(tmp_path: Path):
    """Factory: `et_file(nodes, name="trace.et", metadata=None, compress=False)` writes a trace
    into the test's tmp_path and returns its path."""
    def write(nodes, name: str = "trace.et", metadata=None, compress: bool = False) -> Path:
        return write_et(tmp_path / name, nodes, metadata, compress)
    return write

