"""End-to-end: the `chakra-sim` command line on the example and the reference traces."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from chakra_core.cli import main
from tests.helpers import SHARED_DIR
from tests.simhelpers import MICRO

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "allreduce_8npu.yaml"
REF_RESULTS = SHARED_DIR / "ref-results"


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_run_the_example_prints_the_table_and_writes_results(tmp_path):
    result = invoke("run", EXAMPLE, "--out", tmp_path)
    assert result.exit_code == 0, result.output
    for header in ("finish (ns)", "finish (µs)", "compute (µs)", "exposed comm (µs)", "bytes sent"):
        assert header in result.output
    assert "64,440" in result.output
    data = json.loads((tmp_path / "results.json").read_text())
    # The keys scripts rely on:
    assert data["finish_ns"] == 64440
    assert [r["rank"] for r in data["ranks"]] == list(range(8))
    assert all({"finish_ns", "compute_ns", "exposed_comm_ns"} <= set(r) for r in data["ranks"])
    assert data["manifest"]["network"]["plugin"] == "analytical"
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert len(rows) == 8 and rows[0]["finish_ns"] == "64440" and rows[0]["bytes_ALL_REDUCE"] == "1048576"


def test_run_writes_to_the_manifest_output_dir_and_is_reproducible(tmp_path):
    manifest = tmp_path / "m.yaml"
    manifest.write_text(EXAMPLE.read_text().replace("traces/", f"{EXAMPLE.parent}/traces/")
                        .replace("results/allreduce_8npu", "out"))
    assert invoke("run", manifest, "--quiet").exit_code == 0
    first = (tmp_path / "out" / "results.json").read_bytes()
    assert invoke("run", manifest, "--quiet").exit_code == 0
    assert (tmp_path / "out" / "results.json").read_bytes() == first


def test_run_with_astra_sim_files(tmp_path):
    configs = ROOT / "examples" / "configs"
    result = invoke("run", "--workload", MICRO / "all_reduce" / "8npus_1MB" / "all_reduce",
                    "--astra-system", configs / "Ring_4chunks.json", "--astra-network", configs / "Ring_8npus.yml",
                    "--out", tmp_path, "--quiet")
    assert result.exit_code == 0, result.output
    assert "finish: 64440 ns" in result.output
    data = json.loads((tmp_path / "results.json").read_text())
    assert any("boost-mode" in w for w in data["warnings"])


def test_run_argument_errors():
    result = CliRunner().invoke(main, ["run"])
    assert result.exit_code == 2 and "give a manifest" in result.output
    result = CliRunner().invoke(main, ["run", str(EXAMPLE), "--workload", "x"])
    assert result.exit_code == 2 and "not both" in result.output


def test_a_failed_run_leaves_previous_results_intact(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("previous")
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"""
workload: {{trace: {MICRO / 'all_reduce' / '4npus_1MB' / 'all_reduce'}}}
network: {{plugin: analytical, topology: [Ring], npus_count: [8], bandwidth: [50], latency: [1]}}
output: {{dir: {out}}}
""")
    result = CliRunner().invoke(main, ["run", str(bad)])
    assert result.exit_code == 2
    assert "4 rank(s) but the network has 8 NPUs" in result.output
    assert "Traceback" not in result.output
    assert (out / "results.json").read_text() == "previous"
    assert [p.name for p in out.iterdir()] == ["results.json"]


def test_validate(tmp_path):
    ok = invoke("validate", EXAMPLE)
    assert ok.exit_code == 0 and "valid (8 rank(s)" in ok.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: {trace: nowhere}\nnetwork: {plugin: analytical, topology: [Ring]}\n")
    result = CliRunner().invoke(main, ["validate", str(bad)])
    assert result.exit_code == 2
    assert "network.npus_count: Field required" in result.output
    assert "workload.trace: no trace files" in result.output


def test_plugins_listing():
    result = invoke("plugins", "--json", "--all")
    names = {(r["layer"], r["name"]) for r in json.loads(result.output)}
    assert {("system", "native"), ("compute", "replay"), ("network", "analytical"),
            ("compute", "roofline"), ("memory", "hbm")} <= names
    third_party_only = {r["name"] for r in json.loads(invoke("plugins", "--json").output)}
    assert "native" not in third_party_only and "analytical" in third_party_only
    table = invoke("plugins", "--layer", "network")
    assert "analytical" in table.output and "roofline" not in table.output


# The reference traces with ASTRA-sim's own numbers (needs ../shared) -------------------------------
def _astra_runs():
    path = REF_RESULTS / "astra-sim.json"
    if not path.exists():
        return []
    runs = json.loads(path.read_text())["runs"]
    return [r for r in runs if r["ok"] and r["backend"] == "congestion_unaware"
            and (r["system"].endswith(("Ring_4chunks.json", "HGX-H100-validated.json")))]


@pytest.mark.parametrize("case", _astra_runs(), ids=lambda c: f"{Path(c['workload']).parent.name}-"
                         f"{Path(c['workload']).name}-{Path(c['network']).stem}")
def test_reference_microbenchmarks_agree_with_astra_sim(case, tmp_path):
    result = invoke("run", "--workload", SHARED_DIR / "ref-traces" / case["workload"],
                    "--astra-system", REF_RESULTS / case["system"],
                    "--astra-network", REF_RESULTS / case["network"], "--out", tmp_path, "--quiet")
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "results.json").read_text())
    assert [r["finish_ns"] for r in data["ranks"]] == case["finish_ns_per_rank"]
    assert [r["exposed_comm_ns"] for r in data["ranks"]] == case["exposed_comm_ns_per_rank"]


@pytest.mark.skipif(not REF_RESULTS.exists(), reason="../shared is not available")
def test_reference_cases_are_present_when_shared_is():
    assert len(_astra_runs()) == 16


def test_run_writes_a_timeline_when_the_manifest_asks(tmp_path):
    manifest = tmp_path / "m.yaml"
    manifest.write_text(EXAMPLE.read_text().replace("traces/", f"{EXAMPLE.parent}/traces/")
                        .replace("dir: results/allreduce_8npu", f"dir: {tmp_path / 'out'}\n  timeline: true"))
    result = invoke("run", manifest, "--quiet")
    assert result.exit_code == 0, result.output
    timeline = json.loads((tmp_path / "out" / "timeline.json").read_text())
    slices = [e for e in timeline["traceEvents"] if e.get("ph") == "X"]
    assert len(slices) == 8 and {e["dur"] for e in slices} == {64.44}   # µs


def test_toolchain_commands_are_wired():
    for command in (["convert", "pytorch", "--help"], ["convert", "text", "--help"],
                    ["generate", "transformer", "--help"], ["visualize", "--help"], ["timeline", "--help"]):
        result = invoke(*command)
        assert result.exit_code == 0 and "Usage:" in result.output, command
