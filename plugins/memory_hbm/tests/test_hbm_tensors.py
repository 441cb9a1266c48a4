"""Tensor tracking: IOInfo parsing, storage lifetimes, peak memory, memory series, out-of-memory."""

from __future__ import annotations

import json
import random
from bisect import bisect_left
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chakra_core import LayerContext, NodeView, RunInputs, SimulationError, pb
from chakra_core.testing import EventQueue, make_node, manifest, simulate, uniform_network, write_ranks
from chakra_sim_memory_hbm import HBMConfig, HBMMemory
from chakra_sim_memory_hbm.tensors import _TOKENS, MemorySeries, parse_tensors, reference_counts, storages_of
from hbm_helpers import MiB

REF_TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "ref-traces"
"""`../shared/ref-traces` next to the chakra-sim checkout (optional: the test using it skips)."""

ELEMS_PER_MIB = MiB // 4          # float32 elements in one MiB


def tensor(storage: int, mib: float, offset_mib: float = 0, device: str = "cuda:0", tensor_id: int = 1) -> str:
    """One tensor in Chakra converter format, float32, sizes in MiB."""
    return (f"[{tensor_id}, {storage}, {int(offset_mib * ELEMS_PER_MIB)}, {int(mib * ELEMS_PER_MIB)}, 4, "
            f"'{device}']")


def op(node_id: int, name: str, micros: int, deps=(), inputs=(), outputs=()) -> pb.Node:
    """A GPU compute node whose IOInfo values list the given tensor strings (and extras)."""
    node = make_node(node_id, pb.COMP_NODE, data_deps=deps, duration_micros=micros, name=name)
    node.inputs.values = "[" + ", ".join(inputs) + "]"
    node.outputs.values = "[" + ", ".join(outputs) + "]"
    return node


def model_trace() -> list[pb.Node]:
    """The hand-made trace with a known answer (storage ids: W 200, W2 201, A 100, B 101, C 102, D 103).

        1 embed  10 us  in: W (2 MiB, never produced), a host tensor, an undefined tensor, scalars
                        out: A (4 MiB)
        2 fc1    10 us  in: A, W2 (1 MiB)            out: B (6 MiB)
        3 relu   10 us  in: B                        out: C (a view at 2 MiB of 4 MiB -> 6 MiB storage)
        4 loss   10 us  in: C, A (A again!)          out: D (4 bytes)

    Rule `trace` (A lives until node 4 completes):
        t=0      +W +A                       6 MiB
        t=10000  -W (only node 1 uses it)    4 MiB,  +W2 +B   11 MiB
        t=20000  -W2                        10 MiB,  +C       16 MiB   <- peak
        t=30000  -B                         10 MiB,  +D       10 MiB + 4
        t=40000  -C -A -D                    0
    Rule `issued` (A is freed when node 1 completes, re-allocated for nodes 2 and 4):
        t=0 6 MiB; t=10000 0 then 11 MiB; t=20000 0 then B + C = 12 MiB <- peak; t=30000 0 then
        C + A + D = 10 MiB + 4; t=40000 0.
    """
    W, W2, A, B, D = tensor(200, 2), tensor(201, 1), tensor(100, 4), tensor(101, 6), "[9, 103, 0, 1, 4, 'cuda:0']"
    C = tensor(102, 4, offset_mib=2)
    extras = ["[7, 300, 0, 100, 4, 'cpu']", "[8, 0, 0, 0, 0, '']", "0", "1e-05", "True", "'<None>'",
              "\"[1, 2, 3, 4, 5, 'cuda:0'] is text\""]
    return [op(1, "embed", 10, inputs=[W, *extras], outputs=[A]),
            op(2, "fc1", 10, deps=[1], inputs=[A, W2], outputs=[B]),
            op(3, "relu", 10, deps=[2], inputs=[B], outputs=[C]),
            op(4, "loss", 10, deps=[3], inputs=[C, A], outputs=[D])]


TRACE_SERIES = [[0, 6 * MiB], [10_000, 11 * MiB], [20_000, 16 * MiB], [30_000, 10 * MiB + 4], [40_000, 0]]
ISSUED_SERIES = [[0, 6 * MiB], [10_000, 11 * MiB], [20_000, 12 * MiB], [30_000, 10 * MiB + 4], [40_000, 0]]


def run_trace(tmp_path: Path, ranks: int = 1, nodes=model_trace, fold: str = "auto", **memory) -> dict:
    """`ranks` ranks running `nodes()`; identical ranks fold unless `fold` is "off"."""
    prefix = write_ranks(tmp_path / "trace", [nodes() for _ in range(ranks)])
    data = manifest(prefix, uniform_network(ranks), compute={"plugin": "replay"},
                    memory={"plugin": "hbm", **memory}, fold=fold)
    return simulate(data, base_dir=tmp_path)


@pytest.fixture(autouse=True)
def _needs_installed_plugins(installed_plugins):
    """Every test here runs whole simulations with the bundled plugins."""


# Parsing IOInfo ------------------------------------------------------------------------------------
def test_parse_tensors_in_converter_values():
    text = "[[[430, 431, 0, 53120, 4, 'cuda:0']], '<Object>', 0, 0, -1]"
    assert parse_tensors(text) == [(430, 431, 0, 53120, 4, "cuda:0")]


@pytest.mark.parametrize("text, expected", [
    ("", []),
    ("[]", []),
    ("[ 1 ,2, 3,4 ,5 , \"cuda:1\" ]", [(1, 2, 3, 4, 5, "cuda:1")]),
    ("[1e-05, True, False, 3.5, None, [1, 2, 0, 4, 8, 'cuda:0']]", [(1, 2, 0, 4, 8, "cuda:0")]),
    ("['[1, 2, 3, 4, 5, \\'cuda:0\\']', [6, 7, 0, 8, 2, 'cuda:0']]", [(6, 7, 0, 8, 2, "cuda:0")]),
    ("[\"a ] b [1, 2, 3, 4, 5, 'x']\", [6, 7, 0, 8, 2, 'cuda:0']]", [(6, 7, 0, 8, 2, "cuda:0")]),
    ("[0, 1, 2, 3, 4, 5, 'cuda:0']", []),                      # seven elements: not a tensor
    ("[1, 2, 3, 4, 'cuda:0']", []),                            # five
    ("[-1, 2, 0, 4, 8, 'cuda:0']", []),                        # negative id
    ("[[1, 2, 3, 4, 5, 'cuda:0'", []),                         # unclosed
    ("[[1, 2, 0, 4, 8, 'cuda:0'], [[3, 4, 0, 1, 2, 'cpu']]]", [(1, 2, 0, 4, 8, "cuda:0"), (3, 4, 0, 1, 2, "cpu")]),
    ("'unterminated [1, 2, 0, 4, 8, 'cuda:0']", []),           # a stray quote hides the rest: no crash
])
def test_parse_tensors_robustly(text, expected):
    assert parse_tensors(text) == expected


@settings(max_examples=300, deadline=None)
@given(tensors=st.lists(st.tuples(*[st.integers(0, 1 << 40)] * 5,
                                  st.sampled_from(["cuda:0", "cpu", "", "meta", "cuda:1", "a], [b", "x'y", "١٢"])),
                        min_size=1, max_size=4),
       separator=st.sampled_from(["], [", "],[", "], [[", "] , ["]),
       digits=st.sampled_from(["", "²", "٣"]))
def test_a_list_of_tensors_reads_as_the_expression_reads_it(tensors, separator, digits):
    # The split path (lists written as the converter writes them) against the expression alone,
    # on such lists and on near misses: other separators, quotes and brackets in the device,
    # digits numbers that int() reads or refuses.
    pieces = [f"{a}{digits}, {b}, {c}, {d}, {e}, '{device}'" for a, b, c, d, e, device in tensors]
    text = "[[" + separator.join(pieces) + "]]"
    expected = [(int(a), int(b), int(c), int(d), int(e), quoted[1:-1])
                for a, b, c, d, e, quoted in _TOKENS.findall(text) if a]
    assert parse_tensors(text) == expected


def test_storages_of_dedupes_takes_the_furthest_byte_and_skips_host_and_empty():
    node = pb.Node(id=1, type=pb.COMP_NODE)
    node.inputs.values = "[[1, 5, 0, 10, 4, 'cuda:0'], [2, 5, 10, 10, 4, 'cuda:0']]"
    node.outputs.values = "[[3, 5, 0, 5, 4, 'cuda:0'], [4, 6, 0, 1, 2, 'cpu'], [5, 0, 0, 0, 0, ''], " \
                          "[6, 8, 0, 3, 2, 'meta'], [7, 9, 0, 3, 2, 'cuda:1']]"
    assert storages_of(NodeView(node)) == ((5, 80), (9, 6))
    assert storages_of(NodeView(node), count_host=True) == ((5, 80), (6, 2), (8, 6), (9, 6))
    assert storages_of(NodeView(pb.Node(id=2))) == ()


def test_reference_counts_pre_pass(tmp_path):
    prefix = write_ranks(tmp_path, [model_trace()])
    plan = reference_counts(prefix + ".0.et")
    # [nodes referencing it, largest size, the last of those nodes]
    assert plan == {200: [1, 2 * MiB, 1], 100: [3, 4 * MiB, 4], 201: [1, MiB, 2], 101: [2, 6 * MiB, 3],
                    102: [2, 6 * MiB, 4], 103: [1, 4, 4]}


# Memory series -------------------------------------------------------------------------------------
def test_series_is_exact_below_its_bound():
    series = MemorySeries(100)
    for time, value in [(0, 10), (5, 30), (5, 20), (9, 20), (12, 0)]:
        series.change(time, value)
    assert series.export() == [[0, 10], [5, 30], [6, 20], [12, 0]]


def test_series_keeps_a_change_that_cancels_within_one_ns():
    series = MemorySeries(100)
    series.change(7, 100)
    series.change(7, 0)
    assert series.export() == [[7, 100], [8, 0]]


def envelope_at(points, time):
    value = 0
    for t, v in points:
        if t > time:
            break
        value = v
    return value


def never_understates(points, changes) -> bool:
    """The series is >= the true bytes in use at every ns where either function changes.

    True value during ns t: the largest value set at t if something changed at t (a spike that
    cancels within the ns counts), else the value set last before t.
    """
    during: dict[int, int] = {}
    final: dict[int, int] = {}
    for t, v in changes:
        during[t] = max(during.get(t, v), v)
        final[t] = v
    times = sorted(final)

    def true_at(time):
        if time in during:
            return during[time]
        index = bisect_left(times, time)
        return final[times[index - 1]] if index else 0

    probes = set(times) | {t + 1 for t in times} | {t for t, _ in points}
    return all(envelope_at(points, t) >= true_at(t) for t in probes)


@pytest.mark.parametrize("max_points, seed", [(4, 1), (16, 2), (100, 3), (1000, 4)])
def test_series_bound_preserves_the_peak_and_never_understates(max_points, seed):
    rng = random.Random(seed)
    series = MemorySeries(max_points)
    time = level = peak = 0
    changes = []
    for _ in range(1500):
        time += rng.choice((0, 0, 1, 3, 50, 1000))
        level = max(0, level + rng.randint(-500, 600))
        peak = max(peak, level)
        changes.append((time, level))
        series.change(time, level)
    points = series.export()
    assert 2 <= len(points) <= max_points
    assert all(isinstance(t, int) and isinstance(v, int) for t, v in points)
    assert [t for t, _ in points] == sorted({t for t, _ in points})
    assert max(v for _, v in points) == peak
    assert points[-1][1] == level
    assert never_understates(points, changes)


# Lifetimes and peak on the hand-made trace ---------------------------------------------------------
def test_trace_rule_known_answer(tmp_path):
    results = run_trace(tmp_path)
    row = results["ranks"][0]
    assert (row["finish_ns"], row["hbm"]["peak_memory_bytes"], row["hbm"]["peak_memory_ns"]) == (
        40_000, 16 * MiB, 20_000)
    summary = results["layers"]["memory"]["summary"]
    assert summary["memory_series"] == {"0": TRACE_SERIES}
    assert (summary["lifetime"], summary["pre_pass_ranks"], summary["lifetime_fallback_ranks"]) == ("trace", 1, [])
    assert summary["storage_allocations"] == 6
    assert summary["peak_memory_bytes"] == 16 * MiB
    assert results["warnings"] == []


def test_terminal_table_lists_the_peaks(tmp_path):
    results = run_trace(tmp_path, ranks=2, capacity_gib=CAP_10_MIB, fold="off")
    assert results["layers"]["memory"]["highlights"] == [{"title": "peak memory (tracked tensors)",
                             "columns": ["rank", "peak (bytes)", "peak (GiB)", "at (µs)", "of capacity"],
                             "rows": [["0", "16,777,216", "0.016", "20.000", "160.0%"],
                                      ["1", "16,777,216", "0.016", "20.000", "160.0%"]]}]


def test_issued_rule_known_answer_is_a_lower_bound(tmp_path):
    results = run_trace(tmp_path, lifetime="issued")
    row = results["ranks"][0]
    assert (row["hbm"]["peak_memory_bytes"], row["hbm"]["peak_memory_ns"]) == (12 * MiB, 20_000)
    summary = results["layers"]["memory"]["summary"]
    assert summary["memory_series"] == {"0": ISSUED_SERIES}
    assert summary["pre_pass_ranks"] == 0
    assert summary["storage_allocations"] == 6 + 4       # A twice more, B and C once more


def cpu_ahead_trace() -> list[pb.Node]:
    """CPU operations run ahead of their kernels (separate CPU and GPU slots):

        1 aten::mm    CPU  1 us  out X (4 MiB)          0 -  1000
        2 gemm        GPU 10 us  out X      after 1      1000 - 11000
        3 aten::relu  CPU  1 us  in X, out Y (2 MiB)   1000 -  2000   after 1
        4 relu_k      GPU 10 us  in X, out Y  after 2,3 11000 - 21000
        5 aten::add   CPU  1 us  out Z (8 MiB)         2000 -  3000   after 3
        6 add_k       GPU 10 us  out Z      after 4,5   21000 - 31000

    all: X and Y live until kernel 4 ends, Z is added at 2000: 14 MiB at 2000.
         (issued rule: Y dies with node 3 at 2000, so X (kept by gemm) + Z: 12 MiB at 2000.)
    cpu: X and Y die with node 3 at 2000, just before Z: 8 MiB at 2000.
    gpu: X from 1000, Y from 11000, both die at 21000 just before Z: 8 MiB at 21000."""
    X, Y, Z = tensor(1, 4), tensor(2, 2), tensor(3, 8)

    def cpu(node_id, name, deps, inputs=(), outputs=()):
        node = op(node_id, name, 1, deps, inputs, outputs)
        node.attr.append(pb.AttributeProto(name="is_cpu_op", bool_val=True))
        return node
    return [cpu(1, "aten::mm", [], outputs=[X]), op(2, "gemm", 10, [1], outputs=[X]),
            cpu(3, "aten::relu", [1], [X], [Y]), op(4, "relu_k", 10, [2, 3], [X], [Y]),
            cpu(5, "aten::add", [3], outputs=[Z]), op(6, "add_k", 10, [4, 5], outputs=[Z])]


@pytest.mark.parametrize("kind, lifetime, peak, at", [
    ("all", "trace", 14 * MiB, 2000), ("cpu", "trace", 8 * MiB, 2000), ("gpu", "trace", 8 * MiB, 21_000),
    ("all", "issued", 12 * MiB, 2000), ("cpu", "issued", 8 * MiB, 2000), ("gpu", "issued", 8 * MiB, 21_000)])
def test_tensor_nodes_choose_whose_references_keep_storages(tmp_path, kind, lifetime, peak, at):
    results = run_trace(tmp_path, nodes=cpu_ahead_trace, tensor_nodes=kind, lifetime=lifetime)
    row = results["ranks"][0]
    assert (row["finish_ns"], row["hbm"]["peak_memory_bytes"], row["hbm"]["peak_memory_ns"]) == (
        31_000, peak, at)
    assert results["layers"]["memory"]["summary"]["memory_series"]["0"][-1] == [
        31_000 if kind != "cpu" else 3000, 0]


def test_tracking_does_not_change_timing(tmp_path):
    on = run_trace(tmp_path / "on")
    off = run_trace(tmp_path / "off", track_tensors=False)
    assert [r["finish_ns"] for r in on["ranks"]] == [r["finish_ns"] for r in off["ranks"]] == [40_000]
    assert off["ranks"][0]["hbm"]["peak_memory_bytes"] is None
    assert off["layers"]["memory"]["summary"]["memory_series"] == {}


def test_traces_without_tensors_skip_the_pre_pass_and_report_no_peak(tmp_path):
    """Nothing to track is not 0 B: the peak is null, the summary says why, and a warning too."""
    def plain():
        return [make_node(1, pb.COMP_NODE, duration_micros=5), make_node(2, pb.COMP_NODE, data_deps=[1],
                                                                         duration_micros=5)]
    results = run_trace(tmp_path, nodes=plain)
    summary = results["layers"]["memory"]["summary"]
    assert (summary["pre_pass_ranks"], summary["peak_memory_bytes"]) == (0, None)
    assert summary["ranks_without_tensors"] == [0]
    assert summary["peak_memory_note"].startswith("no node listed a device tensor")
    assert summary["memory_series"] == {"0": []}
    assert (results["ranks"][0]["hbm"]["peak_memory_bytes"], results["ranks"][0]["hbm"]["peak_memory_ns"]) \
        == (None, None)
    (warning,) = results["warnings"]
    assert warning.startswith("memory plugin 'hbm', every rank: no node listed a device tensor") \
        and "peak_memory_bytes is null" in warning


def test_only_the_ranks_without_tensors_have_no_peak(tmp_path):
    nodes = [[op(1, "a", 1, outputs=[tensor(1, 4)])], [make_node(1, pb.COMP_NODE, duration_micros=1)]]
    results = simulate(manifest(write_ranks(tmp_path, nodes), uniform_network(2), memory={"plugin": "hbm"}))
    assert [r["hbm"]["peak_memory_bytes"] for r in results["ranks"]] == [4 * MiB, None]
    summary = results["layers"]["memory"]["summary"]
    assert (summary["peak_memory_bytes"], summary["ranks_without_tensors"]) == (4 * MiB, [1])
    assert "peak_memory_note" not in summary
    (warning,) = results["warnings"]
    assert warning.startswith("memory plugin 'hbm', rank(s) 1: no node listed a device tensor")


def test_series_bound_through_the_engine(tmp_path):
    """A chain of 60 nodes, node i producing a 1 MiB storage consumed by node i+1."""
    def chain():
        return [op(i, f"op{i}", 1 + i % 3, deps=[i - 1] if i > 1 else [],
                   inputs=[tensor(1000 + i - 1, 1 + i % 4)] if i > 1 else [],
                   outputs=[tensor(1000 + i, 1 + (i + 1) % 4)]) for i in range(1, 61)]
    exact_run = run_trace(tmp_path / "exact", nodes=chain)
    bounded = run_trace(tmp_path / "bounded", nodes=chain, series_points=8)
    exact_points = exact_run["layers"]["memory"]["summary"]["memory_series"]["0"]
    points = bounded["layers"]["memory"]["summary"]["memory_series"]["0"]
    peak = bounded["ranks"][0]["hbm"]["peak_memory_bytes"]
    assert len(exact_points) > 60 and len(points) <= 8
    assert max(v for _, v in points) == max(v for _, v in exact_points) == peak == \
        exact_run["ranks"][0]["hbm"]["peak_memory_bytes"]
    assert points[-1] == exact_points[-1] == [exact_run["ranks"][0]["finish_ns"], 0]
    assert never_understates(points, exact_points)


def test_results_are_deterministic(tmp_path):
    first = run_trace(tmp_path / "a", ranks=2, capacity_gib=0.01)
    second = run_trace(tmp_path / "b", ranks=2, capacity_gib=0.01)
    for results in (first, second):
        results.pop("manifest")
        results["warnings"] = [w.replace(str(tmp_path), "") for w in results["warnings"]]
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)


# Out of memory -------------------------------------------------------------------------------------
CAP_15_MIB = 15 / 1024        # exactly 15 MiB in GiB
CAP_10_MIB = 10 / 1024


def test_oom_fail_names_rank_node_and_bytes_short(tmp_path):
    with pytest.raises(SimulationError,
                       match=r"rank 0 is out of memory at node 3 \('relu'\), t=20000 ns: its tensors need "
                             r"16777216 bytes.* 15728640 bytes, 1048576 bytes short"):
        run_trace(tmp_path, ranks=2, capacity_gib=CAP_15_MIB, oom="fail", fold="off")


def test_oom_warn_once_per_rank_and_go_on(tmp_path):
    # exceeded at t=10000, 20000, 30000; every rank simulated (folded: test_hbm_folding.py)
    results = run_trace(tmp_path, ranks=2, capacity_gib=CAP_10_MIB, fold="off")
    warnings = [w for w in results["warnings"] if "out of memory" in w]
    assert len(warnings) == 2
    for rank, warning in enumerate(warnings):
        assert f"rank {rank} is out of memory at node 2 ('fc1'), t=10000 ns" in warning
        assert "1048576 bytes short" in warning
    summary = results["layers"]["memory"]["summary"]
    assert (summary["oom_ranks"], summary["capacity_bytes"]) == ([0, 1], 10 * MiB)
    assert [r["hbm"]["peak_memory_bytes"] for r in results["ranks"]] == [16 * MiB, 16 * MiB]
    assert [r["finish_ns"] for r in results["ranks"]] == [40_000, 40_000]


def test_capacity_at_the_peak_is_not_out_of_memory(tmp_path):
    results = run_trace(tmp_path, capacity_gib=16 / 1024, oom="fail")
    assert results["ranks"][0]["hbm"]["peak_memory_bytes"] == 16 * MiB
    assert results["layers"]["memory"]["summary"]["oom_ranks"] == []


# The model on its own ------------------------------------------------------------------------------
def node_with(node_id: int, *tensors: str) -> NodeView:
    node = pb.Node(id=node_id, name=f"n{node_id}", type=pb.COMP_NODE)
    node.inputs.values = "[" + ", ".join(tensors) + "]"
    return NodeView(node)


def test_without_trace_files_the_issued_rule_applies_with_a_warning():
    context = LayerContext(num_ranks=1, scheduler=EventQueue())
    model = HBMMemory(HBMConfig(), context)
    assert model.tracks_tensors is True
    model.node_issued(0, node_with(1, tensor(5, 1)), 0)
    model.node_issued(0, node_with(2, tensor(5, 3)), 10)          # a larger view: the storage grows
    assert model.rank_summary(0)["peak_memory_bytes"] == 3 * MiB
    model.node_completed(0, node_with(1, tensor(5, 1)), 20)
    model.node_completed(0, node_with(2, tensor(5, 3)), 30)
    assert model.summary()["memory_series"] == {"0": [[0, MiB], [10, 3 * MiB], [30, 0]]}
    assert model.summary()["lifetime_fallback_ranks"] == [0]
    assert any("'issued' rule" in w for w in context.warnings)


def test_trace_files_from_the_run_inputs(tmp_path):
    """When the run inputs name the trace files (`LayerContext.inputs.trace_files`) the model uses them."""
    prefix = write_ranks(tmp_path, [model_trace()])
    context = LayerContext(num_ranks=1, scheduler=EventQueue(),
                           inputs=RunInputs(trace_files=(Path(prefix + ".0.et"),)))
    model = HBMMemory(HBMConfig(), context)
    nodes = [NodeView(n) for n in model_trace()]
    model.node_issued(0, nodes[0], 0)
    model.node_completed(0, nodes[0], 10)
    model.node_issued(0, nodes[1], 10)
    model.node_completed(0, nodes[1], 20)
    assert model.tensors.ranks[0].in_use == 4 * MiB + 6 * MiB      # A (used again by node 4) and B
    assert context.warnings == []


# The real converted trace --------------------------------------------------------------------------
REF = REF_TRACES / "chakra-et" / "chakra-tests" / "chakra.0.et"


@pytest.mark.skipif(not REF.exists(), reason="../shared/ref-traces not checked out")
def test_peak_memory_of_a_converted_pytorch_trace(tmp_path):
    data = manifest(str(REF)[: -len(".0.et")], uniform_network(1), memory={"plugin": "hbm"}, dependencies="data")
    results = simulate(data, base_dir=tmp_path)
    row = results["ranks"][0]
    all_storages = sum(size for _, size, _ in reference_counts(REF).values())
    assert all_storages == 3_499_664_344
    assert 0 < row["hbm"]["peak_memory_bytes"] <= all_storages
    series = results["layers"]["memory"]["summary"]["memory_series"]["0"]
    assert len(series) <= 1000 and max(v for _, v in series) == row["hbm"]["peak_memory_bytes"]
    assert series[-1] == [row["finish_ns"], 0]
