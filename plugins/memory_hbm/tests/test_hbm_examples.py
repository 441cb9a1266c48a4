"""The HBM vs pool example runs and gives the figures docs/memory.md quotes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from chakra_core.testing import simulate

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
MiB = 1 << 20
pytestmark = pytest.mark.skipif(not (EXAMPLES / "hbm_vs_pool.yaml").exists(),
                                reason="needs the chakra-sim checkout's examples/")


@pytest.fixture(autouse=True)
def _needs_installed_plugins(installed_plugins):
    """Every test here runs whole simulations with the bundled plugins."""


def run_example(name: str, **memory) -> dict:
    data = yaml.safe_load((EXAMPLES / name).read_text())
    data["memory"].update(memory)
    return simulate(data, base_dir=EXAMPLES)


def test_committed_trace_is_what_the_script_writes(tmp_path):
    subprocess.run([sys.executable, str(EXAMPLES / "make_memory_trace.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    for rank in range(4):
        name = f"offload.{rank}.et"
        assert (tmp_path / name).read_bytes() == (EXAMPLES / "traces" / "memory" / name).read_bytes()


def test_hbm_hides_the_loads_behind_compute():
    results = run_example("hbm_vs_pool.yaml")
    # first load 500 + int(256 MiB / 2000) = 134,717; six layers of 300 us; last store 500 + int(64 MiB / 2000)
    assert [r["finish_ns"] for r in results["ranks"]] == [134_717 + 6 * 300_000 + 34_054] * 4 == [1_968_771] * 4
    assert [r["hbm"]["peak_memory_bytes"] for r in results["ranks"]] == [2 * 256 * MiB + 2 * 64 * MiB] * 4
    assert results["warnings"] == []


@pytest.mark.parametrize("sharing, finish", [
    ("fifo", [19_674_324, 19_843_096, 20_011_868, 20_180_640]),
    ("fair", [20_439_657] * 4),
])
def test_the_pool_is_the_bottleneck(sharing, finish):
    results = run_example("hbm_vs_pool_remote.yaml", pool_sharing=sharing)
    assert [r["finish_ns"] for r in results["ranks"]] == finish
    # the pool moves 4 ranks x 6 layers x 320 MiB at 400 B/ns: a lower bound for the last rank
    assert max(r["finish_ns"] for r in results["ranks"]) >= 4 * 6 * 320 * MiB // 400
    assert [r["hbm"]["peak_memory_bytes"] for r in results["ranks"]] == [640 * MiB] * 4
