"""chakra-sim synthesize: the model, sampling, rank layouts, determinism and errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from chakra_core.cli import main
from chakra_core.et.io import read_trace
from chakra_core.et.jsonize import trace_files
from chakra_core.schema import pb
from chakra_core.testing import (collective, comp, manifest, recv, send, simulate, uniform_network,
                                 write_ranks)
from chakra_core.tools.synthesis.fit import fit_model, value_bins
from chakra_core.tools.synthesis.model import SynthesisError, load_model, save_model
from chakra_core.tools.synthesis.sample import _stratified_values, sample_traces, write_synthetic


def cli(*args: str):
    return CliRunner().invoke(main, list(map(str, args)))


def gpt(tmp_path: Path, *extra: str) -> str:
    prefix = tmp_path / "gpt"
    result = cli("generate", "transformer", "--layers", "2", "--hidden", "512", "--heads", "8", "--seq", "512",
                 "--batch", "8", "--vocab", "1024", "--dp", "2", "--tp", "2", *extra, "--output", prefix)
    assert result.exit_code == 0, result.output
    return str(prefix)


def run(prefix: str) -> dict:
    ranks = len(trace_files(prefix))
    return simulate(manifest(prefix, uniform_network(ranks)))


def totals(prefix: str) -> tuple[int, int, dict]:
    nodes, micros, by_class = 0, 0, {}
    for _, path in trace_files(prefix):
        for node in read_trace(path).nodes:
            nodes += 1
            micros += node.duration_micros
            by_class[node.type] = by_class.get(node.type, 0) + 1
    return nodes, micros, by_class


def test_a_synthetic_transformer_runs_like_its_source(tmp_path):
    source = gpt(tmp_path)
    write_synthetic(fit_model([source]), tmp_path / "syn", seed=3)
    before, after = run(source), run(str(tmp_path / "syn"))
    assert abs(after["finish_ns"] / before["finish_ns"] - 1) < 0.05
    sent = lambda r: sum(row["bytes_sent"] for row in r["ranks"])  # noqa: E731
    assert sent(after) == sent(before)
    assert totals(str(tmp_path / "syn"))[2] == totals(source)[2]   # node counts by type


def test_same_seed_same_bytes_other_seed_other_trace(tmp_path):
    source = gpt(tmp_path)
    for out, seed in (("a", 1), ("b", 1), ("c", 2)):
        assert cli("synthesize", "--from", source, "--out", tmp_path / out, "--seed", seed).exit_code == 0
    a, b, c = ([p.read_bytes() for _, p in trace_files(tmp_path / name)] for name in "abc")
    assert a == b
    assert a != c


def test_a_saved_model_samples_the_same_traces(tmp_path):
    source = gpt(tmp_path)
    model_path = tmp_path / "model.json"
    result = cli("synthesize", "--from", source, "--model", model_path)
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and not trace_files(tmp_path / "direct")
    assert cli("synthesize", "--model", model_path, "--out", tmp_path / "loaded", "--seed", 4).exit_code == 0
    assert cli("synthesize", "--from", source, "--out", tmp_path / "direct", "--seed", 4).exit_code == 0
    loaded = [p.read_bytes() for _, p in trace_files(tmp_path / "loaded")]
    assert loaded == [p.read_bytes() for _, p in trace_files(tmp_path / "direct")]
    # Small next to the trace, and holding no node ids or shapes.
    assert model_path.stat().st_size < sum(p.stat().st_size for _, p in trace_files(source))


def test_more_ranks_copy_the_job_per_replica(tmp_path):
    source = gpt(tmp_path)                       # 4 ranks: TP groups {0,1},{2,3}, DP groups {0,2},{1,3}
    out = tmp_path / "wide"
    write_synthetic(fit_model([source]), out, ranks=12, seed=0)
    assert len(trace_files(out)) == 12
    results = run(str(out))                      # collectives match: the run finishes
    assert results["num_ranks"] == 12
    groups = json.loads(read_trace(f"{out}.9.et").nodes[0].inputs.values)
    assert sorted(sorted(g["ranks"]) for g in groups) == [[8, 9], [9, 11]]


def test_ranks_that_do_not_tile_the_groups_are_refused(tmp_path):
    source = gpt(tmp_path)
    with pytest.raises(SynthesisError, match="not a multiple of 4"):
        list(sample_traces(fit_model([source]), ranks=6))


def test_world_collectives_and_rings_scale_to_any_rank_count(tmp_path):
    ranks = [[comp(0, 10), collective(1, pb.ALL_REDUCE, 1 << 20, [0]), send(2, (r + 1) % 4, 4096, deps=[1]),
              recv(3, (r - 1) % 4, 4096, deps=[1]), comp(4, 5, [2, 3])] for r in range(4)]
    source = write_ranks(tmp_path, ranks)
    out = tmp_path / "five"
    write_synthetic(fit_model([source]), out, ranks=5)
    assert run(str(out))["num_ranks"] == 5
    nodes = read_trace(f"{out}.4.et").nodes
    peers = {n.type: [a.int64_val for a in n.attr if a.name in ("comm_src", "comm_dst")] for n in nodes}
    assert peers[pb.COMM_SEND_NODE] == [4, 0] and peers[pb.COMM_RECV_NODE] == [3, 4]


def test_length_repeats_steps_and_scales_gaps(tmp_path):
    source = gpt(tmp_path)
    model = fit_model([source])
    double = next(iter(sample_traces(model, length=2 * model.source_nodes)))
    assert abs(len(double) - 2 * model.source_nodes) <= 0.02 * model.source_nodes
    half = next(iter(sample_traces(model, length=model.source_nodes // 2)))
    collectives = lambda nodes: sum(n.type == pb.COMM_COLL_NODE for n in nodes)  # noqa: E731
    assert collectives(half) == collectives(next(iter(sample_traces(model))))   # anchors are kept
    assert len(half) < 0.75 * model.source_nodes


def test_slow_ranks_stay_slow(tmp_path):
    """Ranks are pooled only when their work agrees: a straggler keeps its own role."""
    ranks = [[comp(i, 100 if r == 3 and i < 8 else 10, [i - 1] if i else []) for i in range(8)]
             + [collective(8, pb.ALL_REDUCE, 1024, [7])] for r in range(4)]
    source = write_ranks(tmp_path, ranks)
    model = fit_model([source])
    assert [entry.role for entry in model.ranks] == [0, 0, 0, 1]
    write_synthetic(model, tmp_path / "syn")
    assert run(str(tmp_path / "syn"))["finish_ns"] == run(source)["finish_ns"]


def test_several_sources_are_consecutive_parts(tmp_path):
    first = write_ranks(tmp_path / "a", [[comp(0, 10), collective(1, pb.ALL_REDUCE, 64, [0])]] * 2)
    second = write_ranks(tmp_path / "b", [[comp(0, 30), collective(1, pb.ALL_GATHER, 64, [0])]] * 2)
    model = fit_model([first, second])
    assert [a.cls for a in model.roles[0].anchors] == ["COMM_COLL_NODE/ALL_REDUCE", "COMM_COLL_NODE/ALL_GATHER"]
    third = write_ranks(tmp_path / "c", [[comp(0, 10)]] * 3)
    with pytest.raises(SynthesisError, match="same number of ranks"):
        fit_model([first, third])


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(version=99), "version 99"),
    (lambda m: m["ranks"][0].update(role=7), "role 7 does not exist"),
    (lambda m: m["roles"][0].pop("anchors"), "roles.0.anchors: Field required"),
    (lambda m: m["roles"][0]["gaps"].pop(), "gaps"),
    (lambda m: m["roles"][0]["classes"].update(BOGUS_NODE=m["roles"][0]["classes"]["COMP_NODE"]),
     "'BOGUS_NODE' is not a node class"),
])
def test_a_bad_model_names_the_key(tmp_path, edit, message):
    source = gpt(tmp_path)
    path = tmp_path / "model.json"
    save_model(fit_model([source]), path)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(SynthesisError, match=message) as caught:
        load_model(path)
    assert str(path) in str(caught.value)


def test_bad_sources_give_one_clear_error(tmp_path):
    result = cli("synthesize", "--from", tmp_path / "nothing", "--out", tmp_path / "x")
    assert result.exit_code == 2 and "no trace files" in result.output
    cyclic = write_ranks(tmp_path / "cyc", [[comp(0, 1, [1]), comp(1, 1, [0])]])
    result = cli("synthesize", "--from", cyclic, "--out", tmp_path / "x")
    assert result.exit_code == 2 and "dependency cycle" in result.output and "--dependencies data" in result.output
    gap = write_ranks(tmp_path / "gap", [[comp(0, 1)]] * 3)
    Path(f"{gap}.1.et").unlink()
    result = cli("synthesize", "--from", gap, "--out", tmp_path / "x")
    assert result.exit_code == 2 and "missing trace file(s) for rank(s) 1" in result.output
    truncated = write_ranks(tmp_path / "cut", [[comp(0, 1, label="x" * 40)]])
    data = Path(f"{truncated}.0.et").read_bytes()
    Path(f"{truncated}.0.et").write_bytes(data[:-5])
    result = cli("synthesize", "--from", truncated, "--out", tmp_path / "x")
    assert result.exit_code == 2 and "error:" in result.output and "Traceback" not in result.output
    assert not trace_files(tmp_path / "x")
    assert cli("synthesize", "--out", tmp_path / "x").exit_code == 2
    assert cli("synthesize", "--from", gap).exit_code == 2


values_strategy = st.lists(st.tuples(st.integers(0, 10**7), st.none() | st.integers(0, 10**12),
                                     st.none() | st.integers(0, 10**9)), min_size=1, max_size=400)


@settings(max_examples=60, deadline=None)
@given(values=values_strategy, seed=st.integers(0, 1000))
def test_binned_values_keep_the_total_and_the_distribution(values, seed):
    import bisect
    import random

    bins = value_bins([(*v, "") for v in values])
    drawn = _stratified_values(bins, len(values), random.Random(seed))
    source = sorted(v[0] for v in values)
    sampled = sorted(v[0] for v in drawn)
    assert len(sampled) == len(source)
    # Bin means are kept: the total moves by rounding only (< 1 ns per bin).
    assert abs(sum(sampled) - sum(source)) <= len(bins)
    # Kolmogorov-Smirnov distance at most one bin's share.
    gap = max(abs(bisect.bisect_right(source, x) - bisect.bisect_right(sampled, x)) / len(source)
              for x in set(source) | set(sampled))
    assert gap <= max(b.count for b in bins) / len(source) + 1e-9


def test_bytes_do_not_depend_on_the_hash_seed(tmp_path):
    """Sets and dicts must not leak Python's per-process string hashing into the output."""
    source = gpt(tmp_path)
    outputs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"h{hash_seed}"
        code = ("import sys; from chakra_core.cli import main; "
                f"sys.argv = ['chakra-sim', 'synthesize', '--from', {source!r}, '--obfuscate', "
                f"'--model', {str(out) + '.json'!r}, '--out', {str(out)!r}, '--seed', '5']; main()")
        subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL,
                       env={**os.environ, "PYTHONHASHSEED": hash_seed})
        outputs.append([Path(f"{out}.json").read_bytes(), *(p.read_bytes() for _, p in trace_files(out))])
    assert outputs[0] == outputs[1]


def test_a_node_type_the_schema_does_not_name_is_kept(tmp_path):
    """Newer Chakra schemas may add node types; their nodes are sampled as TYPE_<n>."""
    from chakra_core.testing import make_node

    source = write_ranks(tmp_path, [[comp(0, 10), make_node(1, 11, data_deps=[0]), comp(2, 5, [1])]])
    model = fit_model([source])
    assert "TYPE_11" in model.roles[0].classes
    (nodes,) = sample_traces(model)
    assert sorted(node.type for node in nodes) == [pb.COMP_NODE, pb.COMP_NODE, 11]
