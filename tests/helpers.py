"""Builders shared by the test suite: nodes with typed attributes, small .et files, feeder drains.

Import them as `from tests.helpers import make_node, write_et, ...`. The node and trace builders
live in `chakra_core.testing` (public, for plugin authors) and are re-exported here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pytest

from chakra_core.et.io import encode_message
from chakra_core.schema import pb
from chakra_core.testing import make_attr, make_metadata, make_node, write_et

__all__ = ["SHARED_DIR", "REF_TRACES", "REF_PYTORCH", "REF_PYTORCH_PAIRS", "CYCLIC_REF_TRACE", "make_attr",
           "make_node", "make_metadata", "write_et", "frame_offsets", "ref_et_files", "ref_et_params", "drain"]

SHARED_DIR = Path(__file__).resolve().parents[1].parent / "shared"
"""`../shared` next to the repository root (CI checks it out there); may be absent."""
REF_TRACES = SHARED_DIR / "ref-traces"
REF_PYTORCH = REF_TRACES / "pytorch"
REF_PYTORCH_PAIRS = [
    ("hta/benchmark_simple_add_et.json.gz", "hta/benchmark_simple_add_trace.json.gz"),
    ("param/linear_et.json.gz", "param/linear_kineto.json.gz"),
    ("param/dlrm/dlrm_eg_0.json", "param/dlrm/worker0_step_12.1694128201545.pt.trace.json"),
    ("param/dlrm/dlrm_eg_1.json", "param/dlrm/worker1_step_12.1694128201556.pt.trace.json"),
    ("selfgen-cpu/host.0.json.gz", "selfgen-cpu/device.0.json.gz"),
    ("selfgen-cpu/host.1.json.gz", "selfgen-cpu/device.1.json.gz"),
]
"""PyTorch host trace -> the Kineto trace of the same run (paths relative to REF_PYTORCH)."""
CYCLIC_REF_TRACE = "chakra-et/chakra-tests/chakra.0.et"
"""The reference trace whose control dependencies form cycles (run it with dependencies="data")."""


def frame_offsets(metadata: pb.GlobalMetadata, nodes: Iterable[pb.Node]) -> list[int]:
    """Byte offset of every frame (metadata first) in the uncompressed encoding of a trace."""
    offsets, pos = [], 0
    for message in [metadata, *nodes]:
        offsets.append(pos)
        pos += len(encode_message(message))
    return offsets


def ref_et_files() -> list[Path]:
    """Every .et file under the shared reference traces, sorted (empty when they are absent)."""
    return sorted(REF_TRACES.rglob("*.et")) if REF_TRACES.is_dir() else []


def ref_et_params() -> list:
    """pytest.parametrize values over `ref_et_files()`: ids relative to ref-traces, one skipped
    placeholder when the shared folder is missing."""
    files = ref_et_files()
    if not files:
        return [pytest.param(None, id="no-ref-traces",
                             marks=pytest.mark.skip(reason=f"{REF_TRACES} not found"))]
    return [pytest.param(f, id=f.relative_to(REF_TRACES).as_posix()) for f in files]


def drain(feeder) -> list[int]:
    """Run a feeder to completion in waves (pop every issuable id, then free them all)."""
    order: list[int] = []
    while feeder.has_nodes_to_issue():
        wave = []
        while (node_id := feeder.next_issuable_node()) is not None:
            wave.append(node_id)
        order += wave
        for node_id in wave:
            feeder.free_children(node_id)
            feeder.remove_node(node_id)
    return order
