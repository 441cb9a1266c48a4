"""ET -> JSON: jsonize_file and the `chakra-sim jsonize` command."""

from __future__ import annotations

import json
import re

from click.testing import CliRunner

from chakra_core.cli import main
from chakra_core.et.jsonize import jsonize_file, trace_files
from tests.helpers import make_metadata, make_node, write_et

NODES = [make_node(1, type="COMM_COLL_NODE", attrs={"comm_size": ("uint64_val", 1 << 20)}),
         make_node(2, data_deps=[1], ctrl_deps=[1], duration_micros=30),
         make_node(3, data_deps=[1, 2], attrs={"is_cpu_op": True})]


def flat(text: str) -> str:
    """Text without whitespace: rich wraps long error lines (and paths) at the terminal width."""
    return re.sub(r"\s+", "", text)


def test_jsonize_file(tmp_path):
    et = write_et(tmp_path / "t.et", NODES, make_metadata("0.0.4", {"schema": "x"}))
    out = tmp_path / "json" / "t.json"
    assert jsonize_file(et, out) == len(NODES)
    doc = json.loads(out.read_text())
    assert set(doc) == {"global_metadata", "nodes"}
    assert doc["global_metadata"] == {"version": "0.0.4", "attr": [{"name": "schema", "string_val": "x"}]}
    assert len(doc["nodes"]) == len(NODES)
    second, third = doc["nodes"][1], doc["nodes"][2]
    assert second["id"] == "2" and second["duration_micros"] == "30"    # uint64 -> JSON string
    assert second["data_deps"] == ["1"] and second["ctrl_deps"] == ["1"]
    assert third["data_deps"] == ["1", "2"] and third["attr"] == [{"name": "is_cpu_op", "bool_val": True}]
    assert doc["nodes"][0]["type"] == "COMM_COLL_NODE"
    assert doc["nodes"][0]["attr"][0]["uint64_val"] == str(1 << 20)
    assert "dataDeps" not in second and "durationMicros" not in second


def test_jsonize_compact_and_empty(tmp_path):
    et = write_et(tmp_path / "t.et", [])
    assert jsonize_file(et, tmp_path / "t.json", indent=None) == 0
    assert json.loads((tmp_path / "t.json").read_text()) == {"global_metadata": {"version": "0.0.4"},
                                                              "nodes": []}


def test_trace_files_sorts_by_rank_and_ignores_other_names(tmp_path):
    for name in ["w.10.et", "w.2.et", "w.0.et", "w.x.et", "w.1.et.gz", "wx.3.et", "w.json",
                 "w.4.gz", "w.5.et.gz.bak"]:
        (tmp_path / name).write_bytes(b"")
    assert [(rank, p.name) for rank, p in trace_files(tmp_path / "w")] == \
        [(0, "w.0.et"), (1, "w.1.et.gz"), (2, "w.2.et"), (10, "w.10.et")]
    assert trace_files(tmp_path / "missing" / "w") == []


def test_cli_jsonizes_every_rank_of_a_prefix(ref_traces, tmp_path):
    prefix = ref_traces / "astra-microbenchmarks" / "all_reduce" / "4npus_1MB" / "all_reduce"
    out = tmp_path / "json"
    result = CliRunner().invoke(main, ["jsonize", str(prefix), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [f"all_reduce.{rank}.json" for rank in range(4)]
    for rank in range(4):
        doc = json.loads((out / f"all_reduce.{rank}.json").read_text())
        assert doc["global_metadata"]["version"] == "0.0.4"
        [node] = doc["nodes"]
        assert node["type"] == "COMM_COLL_NODE" and node.get("id", "0") == str(rank)
        assert f"all_reduce.{rank}.et -> " in result.output
    assert result.output.count("(1 nodes)") == 4


def test_cli_jsonizes_a_single_file_next_to_it(tmp_path):
    et = write_et(tmp_path / "one.et", NODES)
    result = CliRunner().invoke(main, ["jsonize", str(et), "--compact"])
    assert result.exit_code == 0, result.output
    assert len(json.loads((tmp_path / "one.json").read_text())["nodes"]) == 3


def test_cli_reports_a_prefix_without_files(tmp_path):
    prefix = tmp_path / "nothing"
    result = CliRunner().invoke(main, ["jsonize", str(prefix), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "notracefile" in flat(result.output) and flat(f"{prefix}.<rank>.et") in flat(result.output)
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_cli_reports_a_broken_trace(tmp_path):
    (tmp_path / "bad.0.et").write_bytes(b"\x05ab")
    result = CliRunner().invoke(main, ["jsonize", str(tmp_path / "bad"), "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert flat(f"{tmp_path / 'bad.0.et'}: at byte 0") in flat(result.output)
    assert not (tmp_path / "bad.0.json").exists()
