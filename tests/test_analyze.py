"""`chakra-sim analyze`: trace statistics, critical path, groups, imbalance, errors; and --results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import chakra_core.tools.analyze.job as analyze_module
from chakra_core.cli import main
from chakra_core.errors import TraceFormatError, TraceGraphError
from chakra_core.report.compare import ResultsFileError, compare_results, load_results
from chakra_core.schema import pb
from chakra_core.testing import (collective, comp, make_node, manifest, recv, send, simulate, uniform_network,
                                 write_ranks)
from chakra_core.tools.analyze import ComputeTiming, scan_trace, size_bucket
from chakra_core.tools.analyze import analyze_traces as analyze_job
from tests.simhelpers import MICRO


def analyze_traces(*args, **kwargs) -> dict:
    """The analysis as analysis.json holds it (what these tests check)."""
    return analyze_job(*args, **kwargs).to_json()


MIB = 1 << 20


def invoke(*args):
    return CliRunner().invoke(main, ["analyze", *map(str, args)], catch_exceptions=False)


def _all_reduce_ranks(sizes: list[int]) -> list[list[pb.Node]]:
    """One rank per size: a compute node, then an all-reduce of that size."""
    return [[comp(0, 10), collective(1, pb.ALL_REDUCE, size, deps=[0])] for size in sizes]


def _process_groups(groups: dict[str, list[int]]) -> pb.Node:
    """A METADATA node defining process groups, as the PyTorch converter writes it."""
    node = make_node(100, pb.METADATA_NODE, name="process_groups")
    node.inputs.values = json.dumps([{"pg_name": name, "ranks": ranks} for name, ranks in groups.items()])
    return node


# Imbalance ---------------------------------------------------------------------------------------
def test_an_all_reduce_twice_as_large_on_one_rank_is_flagged(tmp_path):
    prefix = write_ranks(tmp_path, _all_reduce_ranks([MIB, MIB, 2 * MIB, MIB]))
    result = analyze_traces(prefix)["imbalance"]
    assert len(result["flagged"]) == 1
    entry = result["flagged"][0]
    assert (entry["group"], entry["index"], entry["comm_type"]) == ("", 1, "ALL_REDUCE")
    assert (entry["min_bytes"], entry["max_bytes"], entry["mean_bytes"]) == (MIB, 2 * MIB, 1.25 * MIB)
    assert entry["ratio"] == 2.0
    assert (entry["min_rank"], entry["max_rank"], entry["max_node"]) == (0, 2, 1)
    assert result["short_ranks"] == []


def test_an_all_to_all_whose_pieces_pile_up_on_one_rank_is_flagged(tmp_path):
    """Every rank sends 4 MiB (comm_size equal) but rank 3 receives 6 MiB, the others 3 or 4: the
    larger of sent and received compares the ranks (a mixture of experts' hot expert rank)."""
    matrix = [[MIB, MIB, MIB, MIB], [0, MIB, MIB, 2 * MIB], [0, MIB, MIB, 2 * MIB], [3 * MIB, 0, 0, MIB]]
    ranks = [[collective(1, pb.ALL_TO_ALL, sum(matrix[r]), comm_send_splits=matrix[r],
                         comm_recv_splits=[row[r] for row in matrix])] for r in range(4)]
    (entry,) = analyze_traces(write_ranks(tmp_path, ranks))["imbalance"]["flagged"]
    assert (entry["min_bytes"], entry["max_bytes"], entry["max_rank"], entry["ratio"]) == (4 * MIB, 6 * MIB, 3, 1.5)


def test_a_balanced_trace_is_not_flagged_and_the_threshold_is_the_users(tmp_path):
    balanced = write_ranks(tmp_path / "balanced", _all_reduce_ranks([MIB] * 4))
    result = analyze_traces(balanced)["imbalance"]
    assert result["flagged"] == []
    assert [entry["ratio"] for entry in result["groups"][0]["collectives"]] == [1.0]
    # 5% apart: under the default 1.1, over a threshold of 1.01.
    close = write_ranks(tmp_path / "close", _all_reduce_ranks([100_000, 105_000, 100_000, 100_000]))
    assert analyze_traces(close)["imbalance"]["flagged"] == []
    assert len(analyze_traces(close, threshold=1.01)["imbalance"]["flagged"]) == 1


def test_a_zero_size_against_a_nonzero_one_is_flagged_and_barrier_sizes_are_ignored(tmp_path):
    ranks = [[collective(1, pb.ALL_GATHER, size), collective(2, pb.BARRIER, barrier_size)]
             for size, barrier_size in ((0, 0), (4096, 8), (4096, 16))]
    result = analyze_traces(write_ranks(tmp_path, ranks))["imbalance"]
    first, barrier = result["groups"][0]["collectives"]
    assert first["ratio"] is None and first["flagged"] and first["min_rank"] == 0
    assert barrier["ratio"] == 1.0 and not barrier["flagged"]
    assert [entry["index"] for entry in result["flagged"]] == [1]


def test_ranks_disagreeing_on_the_type_are_flagged(tmp_path):
    ranks = [[collective(1, pb.ALL_REDUCE, MIB)], [collective(1, pb.ALL_GATHER, MIB)]]
    entry = analyze_traces(write_ranks(tmp_path, ranks))["imbalance"]["flagged"][0]
    assert entry["type_mismatch"] and entry["comm_type"] == "ALL_GATHER/ALL_REDUCE" and entry["ratio"] == 1.0


def test_groups_are_compared_separately_in_node_id_order_and_missing_collectives_are_reported(tmp_path):
    groups = _process_groups({"tp0": [0, 1], "tp1": [2, 3]})
    ranks = []
    for rank in range(4):
        group = "tp0" if rank < 2 else "tp1"
        scale = 2 if rank == 3 else 1
        # Written in reverse id order: the k-th collective is the k-th by node id.
        nodes = [collective(3, pb.ALL_REDUCE, 3 * MIB * scale, pg_name=group),
                 collective(2, pb.ALL_REDUCE, 2 * MIB, pg_name=group),
                 collective(1, pb.ALL_REDUCE, MIB, pg_name=group), groups]
        if rank == 1:
            nodes = nodes[1:]       # rank 1 issues two collectives in tp0, rank 0 three
        ranks.append(nodes)
    report = analyze_traces(write_ranks(tmp_path, ranks))
    by_name = {group["name"]: group for group in report["groups"]}
    assert by_name["tp0"]["members"] == [0, 1] and by_name["tp1"]["members"] == [2, 3]
    assert by_name["tp0"]["source"] == "METADATA node 100 of rank 0"
    assert (by_name["tp0"]["collectives_min"], by_name["tp0"]["collectives_max"]) == (2, 3)
    result = report["imbalance"]
    assert [(e["group"], e["index"], e["ratio"]) for e in result["flagged"]] == [("tp1", 3, 2.0)]
    assert result["short_ranks"] == [{"group": "tp0", "rank": 1, "issued": 2, "expected": 3}]
    tp0 = next(group for group in result["groups"] if group["group"] == "tp0")
    assert [entry["ranks"] for entry in tp0["collectives"]] == [2, 2, 1]


def test_an_undefined_group_is_a_warning_and_its_users_are_its_members(tmp_path):
    ranks = [[collective(1, pb.ALL_REDUCE, MIB, pg_name="dp")] for _ in range(3)]
    prefix = write_ranks(tmp_path, ranks)
    report = analyze_traces(prefix)
    assert report["groups"][0]["members"] == [0, 1, 2]
    assert any("communicator group 'dp' is not defined" in w for w in report["warnings"])
    # Given as a communicator-group file, as `run` takes it:
    groups = tmp_path / "groups.json"
    groups.write_text(json.dumps({"dp": [0, 1, 2]}))
    result = invoke(prefix, "--comm-group", groups, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["warnings"] == [] and report["groups"][0]["source"] == "the communicator-group file"


# Compute and critical path -----------------------------------------------------------------------
def _diamond() -> list[pb.Node]:
    """0 -> {1, 2} -> 3, plus node 5 after node 2 by a control dependency; written out of order."""
    return [
        comp(3, 7, deps=[1, 2]),
        make_node(5, pb.COMP_NODE, ctrl_deps=[2], duration_micros=50),
        comp(1, 20, deps=[0]),
        collective(4, pb.ALL_REDUCE, MIB, deps=[1]),      # communication weighs nothing
        comp(2, 5, deps=[0]),
        comp(0, 10),
    ]


def test_the_critical_path_of_a_diamond_is_its_heaviest_chain(tmp_path):
    prefix = write_ranks(tmp_path, [_diamond()])
    row = analyze_traces(prefix)["ranks"][0]
    assert row["compute_ns"] == (10 + 20 + 5 + 7 + 50) * 1000
    # 0 -> 2 -> 5 (control dependency) = 65 us beats 0 -> 1 -> 3 = 37 us.
    assert row["critical_path_ns"] == 65_000
    assert row["parallelism"] == pytest.approx(92 / 65)
    # Data dependencies only: node 5 starts at once, so 0 -> 1 -> 3 (37 us) vs 5 alone (50 us).
    assert analyze_traces(prefix, dependencies="data")["ranks"][0]["critical_path_ns"] == 50_000


def test_node_counts_split_compute_into_cpu_and_gpu(tmp_path):
    nodes = [comp(0, 1), comp(1, 2, is_cpu_op=True), comp(2, 3, is_cpu_op=("uint32_val", 1)),
             send(3, dst=1, size=8), recv(4, src=1, size=8), make_node(5, pb.MEM_LOAD_NODE)]
    row = analyze_traces(write_ranks(tmp_path, [nodes, []]))["ranks"][0]
    assert row["node_counts"] == {"COMM_RECV_NODE": 1, "COMM_SEND_NODE": 1, "COMP_NODE:CPU": 2,
                                  "COMP_NODE:GPU": 1, "MEM_LOAD_NODE": 1}
    assert (row["gpu_compute_ns"], row["cpu_compute_ns"]) == (1000, 5000)


def test_roofline_time_is_the_larger_of_the_compute_and_the_memory_time(tmp_path):
    nodes = [
        comp(0, 1, num_ops=("uint64_val", 2 * 10**12), tensor_size=("uint64_val", 16 * 10**8)),  # 20 ms compute
        comp(1, 1, deps=[0], num_ops=10**9, tensor_size=32 * 10**8),                             # 2 ms memory
        comp(2, 7, deps=[1], num_ops=10**12, is_cpu_op=True),         # CPU op: traced duration
        comp(3, 9, deps=[2]),                                          # no num_ops: traced duration
    ]
    prefix = write_ranks(tmp_path, [nodes])
    timing = ComputeTiming("roofline", peak_tflops=100, mem_bw_gbps=1600)
    row = analyze_traces(prefix, timing)["ranks"][0]
    assert row["gpu_compute_ns"] == 20_000_000 + 2_000_000 + 9_000
    assert row["cpu_compute_ns"] == 7_000
    assert row["roofline_nodes"] == 2
    assert row["critical_path_ns"] == row["compute_ns"]
    # The roofline compute plugin times them the same.
    results = simulate(manifest(prefix, uniform_network(1), compute={
        "plugin": "roofline", "peak_tflops": 100, "memory_bandwidth_gbps": 1600}))
    assert results["ranks"][0]["compute_ns"] == row["gpu_compute_ns"]


def test_roofline_options_are_checked(tmp_path):
    prefix = write_ranks(tmp_path, [[comp(0, 1, num_ops=10**12, tensor_size=10**6)]])
    result = invoke(prefix, "--compute-time", "roofline", "--peak-tflops", 100, "--mem-bw-gbps", 1000, "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["ranks"][0]["compute_ns"] == 10_000_000
    assert "needs --peak-tflops" in invoke(prefix, "--compute-time", "roofline", "--mem-bw-gbps", 1).output
    assert "applies to --compute-time roofline only" in invoke(prefix, "--peak-tflops", 1).output


# Communication ----------------------------------------------------------------------------------
def test_size_buckets_are_powers_of_two():
    assert [size_bucket(size) for size in (0, 1, 2, 3, 1000, 1024, 1500, 4096)] == [0, 1, 2, 2, 512, 1024, 1024, 4096]


def test_communication_volume_by_type_and_size_bucket(tmp_path):
    nodes = [collective(1, pb.ALL_REDUCE, 1024), collective(2, pb.ALL_REDUCE, 1500),
             collective(3, pb.ALL_GATHER, 1000), collective(4, pb.BARRIER, 0),
             send(5, dst=1, size=4096), recv(6, src=1, size=4096)]
    peer = [collective(1, pb.ALL_REDUCE, 1024), collective(2, pb.ALL_REDUCE, 1500),
            collective(3, pb.ALL_GATHER, 1000), collective(4, pb.BARRIER, 0),
            recv(5, src=0, size=4096), send(6, dst=0, size=4096)]
    report = analyze_traces(write_ranks(tmp_path, [nodes, peer]))
    row = report["ranks"][0]
    assert row["comm_by_type"] == {"ALL_REDUCE": {"count": 2, "bytes": 2524}, "ALL_GATHER": {"count": 1, "bytes": 1000},
                                   "BARRIER": {"count": 1, "bytes": 0}, "SEND": {"count": 1, "bytes": 4096},
                                   "RECV": {"count": 1, "bytes": 4096}}
    assert (row["comm_count"], row["comm_bytes"]) == (6, 2524 + 1000 + 8192)
    assert row["message_sizes"] == [{"from_bytes": 0, "count": 1}, {"from_bytes": 512, "count": 1},
                                    {"from_bytes": 1024, "count": 2}, {"from_bytes": 4096, "count": 2}]
    totals = report["totals"]
    assert totals["comm_by_type"]["SEND"] == {"count": 2, "bytes": 8192}
    assert totals["message_sizes"][-1] == {"from_bytes": 4096, "count": 4}


def test_identical_rank_files_are_read_once(tmp_path, monkeypatch):
    calls = []
    real_scan = analyze_module.scan_trace
    monkeypatch.setattr(analyze_module, "scan_trace", lambda path, *args: calls.append(path) or real_scan(path, *args))
    ranks = _all_reduce_ranks([MIB] * 5 + [2 * MIB])
    report = analyze_traces(write_ranks(tmp_path, ranks))
    assert len(calls) == 2 and report["distinct_traces"] == 2
    assert [row["same_as_rank"] for row in report["ranks"]] == [None, 0, 0, 0, 0, None]
    assert report["totals"]["comm_bytes"] == 7 * MIB
    # The five identical ranks are compared as one list that stands for all five.
    entry = report["imbalance"]["flagged"][0]
    assert (entry["ranks"], entry["mean_bytes"], entry["min_rank"], entry["max_rank"]) == (6, 7 * MIB / 6, 0, 5)


# Errors -------------------------------------------------------------------------------------------
def _one_error_line(result, expected: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.output


def test_bad_inputs_give_one_clear_error_line(tmp_path):
    _one_error_line(invoke(tmp_path / "nothing"), "no trace files")
    cycle = write_ranks(tmp_path, [[comp(0, 1, deps=[2]), comp(1, 1, deps=[0]), comp(2, 1, deps=[1])]], "cycle")
    _one_error_line(invoke(cycle), "dependency cycle among node ids 1 -> 2 -> 0 -> 1")
    missing = write_ranks(tmp_path, [[comp(0, 1), comp(1, 1, deps=[7])]], "missing")
    _one_error_line(invoke(missing), "node 1 ('node1') depends on node 7")
    duplicate = write_ranks(tmp_path, [[comp(0, 1), comp(0, 2)]], "duplicate")
    _one_error_line(invoke(duplicate), "duplicate node id 0")
    truncated = write_ranks(tmp_path, [[comp(0, 1), comp(1, 2, deps=[0])]] * 2, "truncated")
    path = Path(f"{truncated}.1.et")
    path.write_bytes(path.read_bytes()[:-3])
    _one_error_line(invoke(truncated), "truncated.1.et: at byte")
    (tmp_path / "corrupt.0.et").write_bytes(b"\xff" * 12)
    _one_error_line(invoke(tmp_path / "corrupt"), "not a Chakra .et file?")
    gap = write_ranks(tmp_path, [[comp(0, 1)]] * 3, "gap")
    Path(f"{gap}.1.et").unlink()
    _one_error_line(invoke(gap), "missing trace file(s) for rank(s) 1")
    bad_attr = write_ranks(tmp_path, [[collective(1, pb.ALL_REDUCE, 0, comm_size="lots")]], "attr")
    _one_error_line(invoke(bad_attr), "attr.0.et: node 1: attribute 'comm_size' must be an integer")


def test_a_missing_control_parent_is_dropped_with_a_warning_a_missing_data_parent_is_an_error(tmp_path):
    node = make_node(1, pb.COMP_NODE, ctrl_deps=[9], duration_micros=3)
    report = analyze_traces(write_ranks(tmp_path, [[comp(0, 1), node]]))
    assert any("ignored 1 control dependencies" in w for w in report["warnings"])
    with pytest.raises(TraceGraphError, match="depends on node 9"):
        scan_trace(write_ranks(tmp_path, [[make_node(1, pb.COMP_NODE, data_deps=[9])]], "data") + ".0.et")


def test_a_cycle_through_control_dependencies_runs_with_data_dependencies_only(tmp_path):
    nodes = [comp(0, 1, deps=[1]), make_node(1, pb.COMP_NODE, ctrl_deps=[0], duration_micros=2)]
    prefix = write_ranks(tmp_path, [nodes])
    with pytest.raises(TraceGraphError, match="--dependencies data"):
        analyze_traces(prefix)
    assert analyze_traces(prefix, dependencies="data")["ranks"][0]["critical_path_ns"] == 3000


def test_an_empty_file_is_a_format_error(tmp_path):
    (tmp_path / "empty.0.et").write_bytes(b"")
    with pytest.raises(TraceFormatError, match="empty file"):
        analyze_traces(tmp_path / "empty")


# The command ----------------------------------------------------------------------------------------
def test_tables_json_and_out_folder(tmp_path):
    prefix = write_ranks(tmp_path / "traces", _all_reduce_ranks([MIB, MIB, 2 * MIB, MIB]))
    shown = invoke(prefix)
    assert shown.exit_code == 0, shown.output
    for title in ("nodes by type", "communication volume", "communicator groups", "flagged collectives"):
        assert title in shown.stdout
    assert "rank 2 node 1" in shown.stdout and "2.000" in shown.stdout

    printed = invoke(prefix, "--json")
    report = json.loads(printed.stdout)
    assert report["num_ranks"] == 4 and len(report["imbalance"]["flagged"]) == 1

    out = tmp_path / "out"
    written = invoke(prefix, "--out", out, "--json")
    assert written.exit_code == 0
    assert json.loads(written.stdout) == report                  # "wrote" lines go to stderr with --json
    assert sorted(p.name for p in out.iterdir()) == ["analysis.json", "compute_vs_comm.png", "imbalance.png",
                                                     "message_sizes.png"]
    assert json.loads((out / "analysis.json").read_text()) == report


def test_many_ranks_are_summarised_as_min_median_max(tmp_path):
    prefix = write_ranks(tmp_path, _all_reduce_ranks([MIB] * 17))
    result = invoke(prefix)
    assert result.exit_code == 0
    assert all(label in result.stdout for label in ("min", "median", "max", "17 rank(s), 1 distinct"))
    assert "no collective has a max/min comm_size ratio above 1.1" in result.stdout


def test_the_real_chakra_test_trace(ref_traces):
    prefix = ref_traces / "chakra-et" / "chakra-tests" / "chakra"
    _one_error_line(invoke(prefix), "dependency cycle")
    row = analyze_traces(prefix, dependencies="data")["ranks"][0]
    assert row["nodes"] == 3664 and row["node_counts"]["COMP_NODE:CPU"] == 2434
    assert 0 < row["critical_path_ns"] < row["compute_ns"]


# --results: comparing two runs ------------------------------------------------------------------------
def _results_pair(tmp_path, ranks: int = 4) -> tuple[Path, Path]:
    prefix = write_ranks(tmp_path / "traces", [[comp(0, 5), collective(1, pb.ALL_REDUCE, MIB, deps=[0])]] * ranks)
    paths = []
    for name, bandwidth in (("a", 50.0), ("b", 25.0)):
        results = simulate(manifest(prefix, uniform_network(ranks, bandwidth_gbps=bandwidth)))
        path = tmp_path / name / "results.json"
        path.parent.mkdir()
        path.write_text(json.dumps(results))
        paths.append(path)
    return paths[0], paths[1]


def test_compare_two_runs_per_rank_and_category(tmp_path):
    a, b = _results_pair(tmp_path)
    diff = compare_results(load_results(a), load_results(b), str(a), str(b)).to_json()
    finish = diff["finish_ns"]
    assert finish["b"] > finish["a"] and finish["delta"] == finish["b"] - finish["a"]
    assert finish["percent"] == pytest.approx(finish["delta"] / finish["a"] * 100)
    assert diff["mean_per_rank"]["gpu_compute_ns"]["delta"] == 0        # only the network changed
    rank = diff["ranks"][0]
    assert rank["exposed_network_ns"]["delta"] + rank["waiting_ns"]["delta"] == rank["finish_ns"]["delta"]

    result = invoke("--results", a, "--results", b, "--out", tmp_path / "cmp")
    assert result.exit_code == 0, result.output
    assert "B against A (4 rank(s))" in result.stdout and "exposed network" in result.stdout
    assert {p.name for p in (tmp_path / "cmp").iterdir()} == {"comparison.json", "compare.png"}
    assert json.loads((tmp_path / "cmp" / "comparison.json").read_text()) == diff
    assert json.loads(invoke("--results", a, "--results", b, "--json").stdout) == diff


def test_compare_errors(tmp_path):
    a, b = _results_pair(tmp_path)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"ranks": [{"rank": 0, "finish_ns": 5}]}))
    _one_error_line(invoke("--results", a, "--results", other), "has no integer gpu_compute_ns")
    (tmp_path / "text.json").write_text("not json")
    _one_error_line(invoke("--results", a, "--results", tmp_path / "text.json"), "not JSON")
    single = json.loads(a.read_text())
    single["ranks"] = single["ranks"][:1]
    (tmp_path / "one.json").write_text(json.dumps(single))
    _one_error_line(invoke("--results", a, "--results", tmp_path / "one.json"),
                    "has 4 rank(s) and")
    _one_error_line(invoke("--results", a, "--results", b, "--results", a), "exactly two runs (A, then B); 3 given")
    _one_error_line(invoke("--results", a), "1 given")
    _one_error_line(invoke("some/prefix", "--results", a, "--results", b), "give one or the other")
    _one_error_line(invoke("--results", a, "--results", b, "--imbalance-threshold", 2), "--imbalance-threshold")
    with pytest.raises(ResultsFileError, match="ranks are not 0..N-1"):
        bad = json.loads(a.read_text())
        bad["ranks"][0]["rank"] = 7
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        load_results(tmp_path / "bad.json")


def test_generated_traces_without_durations_are_warned_of(tmp_path):
    prefix = write_ranks(tmp_path, [[comp(0, 0), comp(1, 0, deps=[0])], [comp(0, 0)]])   # no duration
    report = analyze_traces(prefix)
    assert any("3 of 3 compute nodes carry no duration" in w and "--compute-time roofline" in w
               for w in report["warnings"])
    timed = analyze_traces(write_ranks(tmp_path / "timed", [[comp(0, 5)]]))
    assert not any("carry no duration" in w for w in timed["warnings"])


def test_progress_hears_every_rank():
    from chakra_core.tools.analyze import analyze_traces as analyze

    heard = []
    analyze(MICRO / "all_reduce" / "4npus_1MB" / "all_reduce", progress=lambda done, total: heard.append((done, total)))
    assert heard == [(1, 4), (2, 4), (3, 4), (4, 4)]
