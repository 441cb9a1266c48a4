"""Perfetto / Chrome-trace timelines: `build_timeline`, `write_timeline` and `chakra-sim timeline`."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from chakra_core.errors import ChakraSimError
from chakra_core.run import load, simulate
from chakra_core.plugins import make_plugin_host
from chakra_core.cli.timeline import timeline
from chakra_core.report.timeline import COUNTER_NAME, build_timeline, timeline_json, write_timeline

from chakra_core.schema import pb
from tests.helpers import make_node
from tests.simhelpers import collective, comp, manifest, results_of, ring_network, write_ranks


def two_rank_program() -> list[list[pb.Node]]:
    """Per rank: metadata, two kernels, an all-reduce overlapping the second one, a p2p exchange."""
    ranks = []
    for rank in range(2):
        peer = 1 - rank
        ranks.append([
            make_node(0, pb.METADATA_NODE, name="meta"),
            comp(1, 3, deps=[0]),
            collective(2, pb.ALL_REDUCE, 1 << 20, deps=[1]),
            comp(3, 5, deps=[1]),
            make_node(4, pb.COMM_SEND_NODE, data_deps=[2, 3], name="send",
                      attrs={"comm_src": rank, "comm_dst": peer, "comm_size": 4096, "comm_tag": 0}),
            make_node(5, pb.COMM_RECV_NODE, data_deps=[3], name="recv",
                      attrs={"comm_src": peer, "comm_dst": rank, "comm_size": 4096, "comm_tag": 0}),
            comp(6, 1 + rank, deps=[4, 5]),
        ])
    return ranks


def run(tmp_path: Path, ranks=None, **manifest_extra):
    prefix = write_ranks(tmp_path / "trace", ranks or two_rank_program())
    host = make_plugin_host()
    data = manifest(prefix, ring_network(len(ranks or two_rank_program())), system={}, **manifest_extra)
    result = simulate(load(data, host, base_dir=tmp_path, name="test"), host, timeline=True)
    return result.intervals, result.results


def by_phase(doc):
    out = defaultdict(list)
    for event in doc["traceEvents"]:
        out[event["ph"]].append(event)
    return out


def test_timeline_structure_matches_the_simulation(tmp_path):
    intervals, results = run(tmp_path)
    doc = json.loads(timeline_json(build_timeline(intervals, results)))
    events = by_phase(doc)
    names = {(e["pid"], e["name"]): e["args"] for e in events["M"]}
    assert names[(0, "process_name")] == {"name": "rank 0"} and names[(1, "process_name")] == {"name": "rank 1"}
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in events["M"] if e["name"] == "thread_name"}
    assert sorted(set(lanes.values())) == ["communication", "compute (gpu)", "other"]
    slices = events["X"]
    assert Counter(e["pid"] for e in slices) == {0: 7, 1: 7}
    recorded = {(row[0], row[1]): row for row in intervals}
    assert len(recorded) == len(slices) == 14
    for event in slices:
        row = recorded[(event["pid"], event["args"]["node_id"])]
        rank, node_id, name, type_name, slot, start, end, _ = row
        assert (event["args"]["start_ns"], event["args"]["end_ns"]) == (start, end)
        assert event["ts"] == start / 1000 and event["dur"] == (end - start) / 1000
        assert event["name"] == name and event["cat"] == type_name == event["args"]["type"]
        expected_lane = {"gpu": "compute (gpu)", "comm": "communication", "unlimited": "other"}[slot]
        assert lanes[(event["pid"], event["tid"])] == expected_lane
    kernel = [e for e in slices if e["pid"] == 1 and e["args"]["node_id"] == 6][0]
    assert kernel["dur"] == 2.0                     # 2 µs replayed
    assert doc["metadata"]["finish_ns"] == results.finish_ns
    assert max(e["ts"] + e["dur"] for e in slices) * 1000 == pytest.approx(results.finish_ns, abs=1e-6)


def test_flow_arrows_join_existing_slices(tmp_path):
    intervals, results = run(tmp_path)
    doc = build_timeline(intervals, results)
    events = by_phase(doc)
    starts = {e["id"]: e for e in events["s"]}
    finishes = {e["id"]: e for e in events["f"]}
    assert starts.keys() == finishes.keys()
    # every dependency between recorded nodes: per rank 1<-0, 2<-1, 3<-1, 4<-2, 4<-3, 5<-3, 6<-4, 6<-5
    assert len(starts) == 2 * 8 == doc["metadata"]["flows"]["total"] == doc["metadata"]["flows"]["shown"]

    def enclosing(event):
        hits = [x for x in events["X"] if x["pid"] == event["pid"] and x["tid"] == event["tid"]
                and x["ts"] <= event["ts"] <= x["ts"] + x["dur"]]
        assert len(hits) == 1, (event, hits)
        return hits[0]

    pairs = set()
    for flow_id, start in starts.items():
        finish = finishes[flow_id]
        assert finish["bp"] == "e" and finish["pid"] == start["pid"]
        parent, child = enclosing(start), enclosing(finish)
        pairs.add((start["pid"], parent["args"]["node_id"], child["args"]["node_id"]))
    expected = {(r, p, c) for r in range(2)
                for p, c in ((0, 1), (1, 2), (1, 3), (2, 4), (3, 4), (3, 5), (4, 6), (5, 6))}
    assert pairs == expected


def test_flow_cap_is_reported(tmp_path):
    intervals, results = run(tmp_path)
    doc = build_timeline(intervals, results, max_flows=3)
    assert len(by_phase(doc)["s"]) == 3
    assert doc["metadata"]["flows"] == {"total": 16, "shown": 3, "cap": 3, "dropped": 13}
    # the earliest children are kept: node 1 of both ranks (t=0), then node 2 of rank 0 (t=3 µs,
    # ties broken by rank)
    slices = by_phase(doc)["X"]
    kept = set()
    for event in by_phase(doc)["f"]:
        (child,) = [x for x in slices if x["pid"] == event["pid"] and x["tid"] == event["tid"]
                    and x["ts"] <= event["ts"] <= x["ts"] + x["dur"]]
        kept.add((event["pid"], child["args"]["node_id"], child["ts"]))
    assert kept == {(0, 1, 0.0), (1, 1, 0.0), (0, 2, 3.0)}


def test_overlapping_nodes_of_a_slot_get_their_own_lanes():
    intervals = [
        (0, 1, "a", "COMM_RECV_NODE", "unlimited", 0, 100, ()),
        (0, 2, "b", "COMM_RECV_NODE", "unlimited", 50, 150, ()),
        (0, 3, "c", "COMM_RECV_NODE", "unlimited", 100, 200, (1,)),
        (0, 4, "d", "COMM_RECV_NODE", "unlimited", 60, 70, ()),
        (0, 5, "e", "COMP_NODE", "gpu", 0, 1000, ()),
    ]
    doc = build_timeline(intervals, results_of([{"rank": 0}, {"rank": 1}]))
    slices = by_phase(doc)["X"]
    per_tid = defaultdict(list)
    for event in slices:
        per_tid[event["tid"]].append((event["ts"], event["ts"] + event["dur"]))
    for spans in per_tid.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    lanes = {e["tid"]: e["args"]["name"] for e in by_phase(doc)["M"] if e["name"] == "thread_name"}
    assert sorted(lanes.values()) == ["compute (gpu)", "other", "other #2", "other #3"]
    tid = {e["args"]["node_id"]: e["tid"] for e in slices}
    assert tid[1] == tid[3] != tid[2]                # c reuses a's lane once a has ended
    # rank 1 ran nothing but still gets its process
    assert {e["pid"] for e in by_phase(doc)["M"] if e["name"] == "process_name"} == {0, 1}


def test_memory_series_becomes_counter_events():
    results = results_of([{"rank": 0}, {"rank": 1}], {"memory": {"memory_series": {
        "1": [[0, 0], [1500, 4096], [2000, 1024]], "0": [[10, 64]]}}})
    doc = build_timeline([], results)
    counters = by_phase(doc)["C"]
    assert [(e["pid"], e["ts"], e["args"]["bytes"]) for e in counters] == [
        (0, 0.01, 64), (1, 0.0, 0), (1, 1.5, 4096), (1, 2.0, 1024)]
    assert {e["name"] for e in counters} == {COUNTER_NAME}
    assert doc["metadata"]["memory_counters"] == 4
    assert by_phase(build_timeline([], results_of([])))["C"] == []
    bad = results_of([], {"memory": {"memory_series": {"0": [[1, 2, 3]]}}})
    with pytest.raises(ChakraSimError, match=r"memory_series\['0'\] holds \[1, 2, 3\]"):
        build_timeline([], bad)


def test_hbm_memory_series_end_to_end(tmp_path):
    mib = 1 << 20
    nodes = [comp(1, 2), comp(2, 3, deps=[1]), comp(3, 1, deps=[2])]
    nodes[0].outputs.values = f"[[1, 1, 0, {mib}, 4, 'cuda:0']]"
    nodes[1].inputs.values = f"[[1, 1, 0, {mib}, 4, 'cuda:0']]"
    nodes[1].outputs.values = f"[[2, 2, 0, {mib}, 4, 'cuda:0']]"
    nodes[2].inputs.values = f"[[2, 2, 0, {mib}, 4, 'cuda:0']]"
    intervals, results = run(tmp_path, ranks=[nodes, [comp(1, 1)]], memory={"plugin": "hbm"})
    series = results.layers["memory"].summary["memory_series"]
    doc = build_timeline(intervals, results)
    counters = [e for e in by_phase(doc)["C"] if e["pid"] == 0]
    assert counters, "the memory series of rank 0 produced no counter events"
    assert [(e["ts"] * 1000, e["args"]["bytes"]) for e in counters] == \
        [(pytest.approx(t), v) for t, v in series["0"]]
    assert max(e["args"]["bytes"] for e in counters) == 8 * mib      # both 4 MiB tensors alive at once


def test_write_timeline_is_atomic_and_deterministic(tmp_path):
    outputs = []
    for name in ("a", "b"):
        intervals, results = run(tmp_path / name)
        path = tmp_path / f"{name}.json"
        meta = write_timeline(intervals, results, path)
        assert meta.slices == 14
        outputs.append(path.read_bytes())
    assert outputs[0] == outputs[1]
    assert json.loads(outputs[0])["displayTimeUnit"] == "ns"
    assert not list(tmp_path.glob(".*.tmp"))


def test_timeline_command(tmp_path):
    prefix = write_ranks(tmp_path / "traces", two_rank_program())
    data = {"workload": {"trace": prefix}, "network": ring_network(2), "output": {"dir": "out"}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(timeline, [str(path)])
    assert result.exit_code == 0, result.output
    default = tmp_path / "out" / "timeline.json"
    doc = json.loads(default.read_text())
    assert len(by_phase(doc)["X"]) == 14
    assert f"wrote {default} (14 slices, 16 dependency arrows)" in result.output
    result = CliRunner().invoke(timeline, [str(path), "--out", str(tmp_path / "t.json"), "--max-flows", "2"])
    assert result.exit_code == 0 and "14 more left out (--max-flows)" in result.output
    assert (tmp_path / "t.json").read_text() != default.read_text()
    path.write_text(yaml.safe_dump({"workload": {"trace": prefix}}))
    result = CliRunner().invoke(timeline, [str(path)])
    assert result.exit_code == 2 and "network" in result.output and "Traceback" not in result.output


def test_the_timeline_command_writes_into_the_folders_record_so_a_later_run_clears_it(tmp_path):
    from chakra_core.cli import main

    prefix = write_ranks(tmp_path / "traces", two_rank_program())
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"workload": {"trace": prefix}, "network": ring_network(2),
                                    "output": {"dir": "out"}}))
    assert CliRunner().invoke(timeline, [str(path)]).exit_code == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [".chakra-sim-outputs.json", "results.csv",
                                                     "results.json", "timeline.json"]
    assert CliRunner().invoke(main, ["run", str(path), "--quiet"]).exit_code == 0
    assert not (out / "timeline.json").exists()     # the run wrote no timeline: the old one is gone
