"""`chakra-sim convert text`: ASTRA-sim 1.0 text workloads to Chakra traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from chakra_core.et.attrs import NodeView
from chakra_core.et.io import read_trace
from chakra_core.run import load as load_config
from chakra_core.run import simulate as simulate_run
from chakra_core.plugins import make_plugin_host
from chakra_core.schema import pb
from chakra_core.tools.generate import write_microbenchmark
from chakra_core.tools.text import (TextWorkloadError, convert_text, convert_text_workload,
                                    default_first_dim, parse_text_workload)
from tests.helpers import REF_TRACES
from tests.simhelpers import manifest, ring_network, simulate

ASTRA_TEXT = REF_TRACES / "astra-text"


def workload_file(tmp_path: Path, text: str, name: str = "w.txt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def layer(name: str, fwd=0, fwd_comm="NONE", fwd_size=0, ig=0, ig_comm="NONE", ig_size=0, wg=0,
          wg_comm="NONE", wg_size=0, update=0, policy: str = "") -> str:
    return (f"{name}\t-1\t{fwd}\t{fwd_comm}\t{fwd_size}\t{ig}\t{ig_comm}\t{ig_size}\t{wg}\t{wg_comm}\t"
            f"{wg_size}\t{update}\t{policy}\n")


def convert(tmp_path: Path, text: str, npus: int, passes: int = 1, **options):
    workload = parse_text_workload(workload_file(tmp_path, text))
    report = convert_text_workload(workload, npus, tmp_path / "out" / "t", num_passes=passes, **options)
    return report, [read_trace(path).nodes for path in report.files]


def by_name(nodes: list[pb.Node]) -> dict[str, pb.Node]:
    return {node.name: node for node in nodes}


def parents(nodes: list[pb.Node], name: str) -> set[str]:
    ids = {node.id: node.name for node in nodes}
    node = by_name(nodes)[name]
    return {ids[p] for p in (*node.data_deps, *node.ctrl_deps)}


def groups_of(nodes: list[pb.Node]) -> dict[str, list[int]]:
    meta = [n for n in nodes if n.type == pb.METADATA_NODE]
    if not meta:
        return {}
    return {g["pg_name"]: g["ranks"] for g in json.loads(meta[0].inputs.values)}


def intervals_of(prefix: str, npus: int, system: dict | None = None) -> tuple[dict, dict]:
    """Simulate with replay compute on a ring; return results and {(rank, name): (start, end)}."""
    host = make_plugin_host()
    data = manifest(prefix, ring_network(npus), system=system or {})
    result = simulate_run(load_config(data, host, name="test"), host, timeline=True)
    return result.document, {(row[0], row[2]): (row[5], row[6]) for row in result.intervals or []}


def allreduce_ns(tmp_path: Path, size: int, npus: int) -> int:
    prefix = tmp_path / "ar" / "ar"
    write_microbenchmark(prefix, "all_reduce", size, npus)
    return simulate(manifest(str(prefix), ring_network(npus), system={}))["finish_ns"]


# Parsing ----------------------------------------------------------------------------------------------
def test_parse_reads_every_column(tmp_path):
    path = workload_file(tmp_path, "DATA\n2\n" + layer("conv1", 13003, "NONE", 0, 12864, "NONE", 0, 32291,
                                                       "ALLREDUCE", 37632, 3229)
                         + "conv2\t7\t1\tALLGATHER\t5\t2\tREDUCESCATTER\t6\t3\tALLTOALL\t7\t4\r\n")
    workload = parse_text_workload(path)
    assert workload.parallelism == "DATA"
    first, second = workload.layers
    assert (first.name, first.line, first.reserved) == ("conv1", 3, -1)
    assert first.compute == {"fwd": 13003, "ig": 12864, "wg": 32291}
    assert first.comm_type == {"fwd": "NONE", "ig": "NONE", "wg": "ALLREDUCE"}
    assert first.comm_size["wg"] == 37632 and first.update == 3229
    assert second.reserved == 7 and second.comm_type == {"fwd": "ALLGATHER", "ig": "REDUCESCATTER",
                                                         "wg": "ALLTOALL"}
    assert second.comm_size == {"fwd": 5, "ig": 6, "wg": 7} and second.update == 4


def test_parse_headers_of_dlrm_and_transformers(tmp_path):
    dlrm = parse_text_workload(workload_file(tmp_path, "HYBRID_DLRM\t1\n2\n" + layer("a") + layer("b")))
    assert dlrm.last_bottom_layer == 1
    text = ("HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 2 checkpoints: 2 0 2 "
            "checkpoint_initiates: 2 3 1\n4\n" + "".join(layer(f"l{i}") for i in range(4)))
    fib = parse_text_workload(workload_file(tmp_path, text))
    assert (fib.model_parallel_group, fib.checkpoints, fib.initiators) == (2, [0, 2], [3, 1])


@pytest.mark.parametrize("text, message", [
    ("DATA\n1\nconv1 -1 5 NONE 0 5 NONE 0 5 ALLREDUCE 100\n", r"w\.txt:3: expected 12 columns"),
    ("DATA\n2\n" + layer("a") + "b -1 5 NONE 0 5 NONE 0 5 ALLREDUCE 1k 5\n",
     r"w\.txt:4: the weight-gradient comm size must be an integer, found '1k'"),
    ("DATA\n1\nconv1 -1 5 NONE 0 5 BROADCAST 0 5 ALLREDUCE 100 5\n",
     r"w\.txt:3: unknown input-gradient communication type 'BROADCAST'"),
    ("DATA\n1\nconv1 -1 -5 NONE 0 5 NONE 0 5 ALLREDUCE 100 5\n", r"w\.txt:3: the forward compute time must be >= 0"),
    ("PIPELINE\n1\n" + layer("a"), r"w\.txt:1: unknown parallelism type 'PIPELINE'"),
    ("DATA 7\n1\n" + layer("a"), r"w\.txt:1: unexpected '7' after DATA"),
    ("DATA\nmany\n" + layer("a"), r"w\.txt:2: the number of layers must be an integer"),
    ("DATA\n3\n" + layer("a") + layer("b"), r"announces 3 layer\(s\) on line 2 but has 2"),
    ("HYBRID_DLRM\n1\n" + layer("a"), r"w\.txt:1: HYBRID_DLRM takes one header value"),
    ("HYBRID_DLRM 5\n1\n" + layer("a"), r"last bottom layer 5 is not a layer index"),
    ("HYBRID_TRANSFORMER\n1\n" + layer("a"), r"needs 'model_parallel_NPU_group: <NPUs>'"),
    ("HYBRID_CUSTOMIZED\n1\n" + layer("a", policy="PIPE"), r"w\.txt:3: unknown layer policy 'PIPE'"),
    ("HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 2 checkpoints: 1 2 "
     "checkpoint_initiates: 1 1\n3\n" + layer("a") + layer("b") + layer("c"),
     r"layer 1 initiates a forward-in-backward recomputation but no checkpoint layer lies below it"),
    ("", r"empty file"),
])
def test_malformed_workloads_name_the_line(tmp_path, text, message):
    with pytest.raises(TextWorkloadError, match=message):
        parse_text_workload(workload_file(tmp_path, text))


def test_cli_error_has_line_number_and_no_traceback(tmp_path):
    path = workload_file(tmp_path, "DATA\n2\n" + layer("a", 5, wg=5, wg_comm="ALLREDUCE", wg_size=8)
                         + "b -1 5 NONE\n")
    result = CliRunner().invoke(convert_text, [str(path), "--num-npus", "2", "--output",
                                               str(tmp_path / "t")])
    assert result.exit_code == 2
    assert "w.txt:4: expected 12 columns" in result.output
    assert "Traceback" not in result.output
    assert not list(tmp_path.glob("t.*.et"))


def test_cli_rejects_groups_that_do_not_divide(tmp_path):
    path = workload_file(tmp_path, "HYBRID_TRANSFORMER model_parallel_NPU_group: 3\n1\n" + layer("a", 1000))
    result = CliRunner().invoke(convert_text, [str(path), "--num-npus", "8", "--output", str(tmp_path / "t")])
    assert result.exit_code == 2
    assert "model-parallel group of 3 NPUs does not divide 8 NPUs" in result.output


@pytest.mark.parametrize("header, options, message", [
    ("DATA", ["--first-dim-npus", "2"], "DATA runs its collectives among all NPUs"),
    ("HYBRID_TRANSFORMER model_parallel_NPU_group: 2", ["--first-dim-npus", "2"], "not --first-dim-npus"),
    ("HYBRID_DATA_MODEL", ["--model-parallel-group", "2"], "groups NPUs by --first-dim-npus"),
    ("HYBRID_DATA_MODEL", ["--first-dim-npus", "3"], "--first-dim-npus 3 does not divide 8 NPUs"),
])
def test_cli_rejects_options_that_do_not_apply(tmp_path, header, options, message):
    path = workload_file(tmp_path, f"{header}\n1\n" + layer("a", 1000, wg=1000, wg_comm="ALLREDUCE", wg_size=8))
    result = CliRunner().invoke(convert_text, [str(path), "--num-npus", "8", "--output", str(tmp_path / "t"),
                                               *options])
    assert result.exit_code == 2 and message in result.output


def test_cli_missing_input_and_compressed_output(tmp_path):
    result = CliRunner().invoke(convert_text, [str(tmp_path / "nope.txt"), "--num-npus", "2", "--output",
                                               str(tmp_path / "t")])
    assert result.exit_code == 2 and "nope.txt: file not found" in result.output
    path = workload_file(tmp_path, "DATA\n1\n" + layer("a", 1000, wg=1000, wg_comm="ALLREDUCE", wg_size=8))
    result = CliRunner().invoke(convert_text, [str(path), "--num-npus", "2", "--output", str(tmp_path / "z"),
                                               "--compress"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "z.1.et").read_bytes()[:2] == b"\x1f\x8b"
    assert [n.name for n in read_trace(tmp_path / "z.1.et").nodes] == ["p0.a.fwd", "p0.a.wg",
                                                                       "p0.a.wg.ALLREDUCE"]


# Graph structure ----------------------------------------------------------------------------------------
DATA2 = ("DATA\n2\n"
         + layer("l0", fwd=1000, ig=1000, wg=1000, wg_comm="ALLREDUCE", wg_size=4096, update=2000)
         + layer("l1", fwd=2000, ig=3000, wg=4000, wg_comm="ALLREDUCE", wg_size=8192, update=2000))


def test_data_parallel_graph_follows_astra_sim_loop(tmp_path):
    report, ranks = convert(tmp_path, DATA2, npus=2, passes=2)
    nodes = ranks[0]
    names = [n.name for n in nodes]
    # ASTRA-sim's iterate_data_parallel: forward in layer order, then per layer from the last:
    # weight gradient, its all-reduce (in the background), input gradient (never for layer 0)
    assert names[:10] == ["p0.l0.fwd", "p0.l1.fwd", "p0.l1.wg", "p0.l1.wg.ALLREDUCE",
                          "p0.l1.wg.ALLREDUCE.update", "p0.l1.ig", "p0.l0.wg", "p0.l0.wg.ALLREDUCE",
                          "p0.l0.wg.ALLREDUCE.update", "p1.l0.fwd"]
    assert "p0.l0.ig" not in names
    assert parents(nodes, "p0.l1.wg.ALLREDUCE") == {"p0.l1.wg"}
    assert parents(nodes, "p0.l1.ig") == {"p0.l1.wg"}            # the all-reduce overlaps it
    # the next pass's forward of a layer waits for that layer's all-reduce plus the update time
    assert parents(nodes, "p1.l0.fwd") == {"p0.l0.wg", "p0.l0.wg.ALLREDUCE.update"}
    assert parents(nodes, "p1.l1.fwd") == {"p1.l0.fwd", "p0.l1.wg.ALLREDUCE.update"}
    view = NodeView(by_name(nodes)["p0.l1.wg.ALLREDUCE"])
    assert (view.int("comm_type"), view.int("comm_size"), view.has("pg_name")) == (pb.ALL_REDUCE, 8192, False)
    assert not view.is_cpu_op
    update = NodeView(by_name(nodes)["p0.l1.wg.ALLREDUCE.update"])
    assert update.is_cpu_op and update.int("duration_ns") == 2000 and update.duration_micros == 2
    assert all(n.SerializeToString() == m.SerializeToString() for n, m in zip(ranks[0], ranks[1]))
    assert report.nodes_per_rank == [len(nodes)] * 2


def test_data_parallel_timing_overlaps_gradient_all_reduce(tmp_path):
    text = ("DATA\n2\n"
            + layer("l0", fwd=1000, ig=1000, wg=1000, wg_comm="ALLREDUCE", wg_size=1 << 20)
            + layer("l1", fwd=1000, ig=1000, wg=1000, wg_comm="ALLREDUCE", wg_size=1 << 20))
    t = allreduce_ns(tmp_path, 1 << 20, 4)
    assert t > 2000
    report, _ = convert(tmp_path, text, npus=4)
    results, spans = intervals_of(str(tmp_path / "out" / "t"), 4)
    # compute: fwd l0 [0,1000], fwd l1 [1000,2000], wg l1 [2000,3000]; its all-reduce runs
    # [3000, 3000+t] under ig l1 [3000,4000] and wg l0 [4000,5000]; l0's all-reduce then follows it.
    assert spans[(0, "p0.l1.ig")] == (3000, 4000)
    assert spans[(0, "p0.l0.wg")] == (4000, 5000)
    assert spans[(0, "p0.l1.wg.ALLREDUCE")] == (3000, 3000 + t)
    assert spans[(0, "p0.l0.wg.ALLREDUCE")] == (3000 + t, 3000 + 2 * t)
    assert results["finish_ns"] == 3000 + 2 * t


def test_hybrid_forward_collectives_block_and_use_groups(tmp_path):
    text = ("HYBRID_DATA_MODEL\n2\n"
            + layer("l0", 1000, "ALLGATHER", 4096, 1000, "ALLREDUCE", 4096, 1000, "ALLREDUCE", 8192, 1000)
            + layer("l1", 1000, "ALLGATHER", 4096, 1000, "ALLREDUCE", 4096, 1000, "ALLREDUCE", 8192, 1000))
    report, ranks = convert(tmp_path, text, npus=8, first_dim_npus=2)
    nodes = ranks[3]
    assert groups_of(nodes) == {"block1": [2, 3], "stride1": [1, 3, 5, 7]}
    pg = {n.name: NodeView(n).str("pg_name", "") for n in nodes if n.type == pb.COMM_COLL_NODE}
    # model-parallel (forward, input gradient) on the first dimension, data-parallel on the rest
    assert pg == {"p0.l0.fwd.ALLGATHER": "block1", "p0.l1.fwd.ALLGATHER": "block1",
                  "p0.l1.ig.ALLREDUCE": "block1", "p0.l1.wg.ALLREDUCE": "stride1",
                  "p0.l0.wg.ALLREDUCE": "stride1"}
    # forward collectives block the next layer (after the update time); the input-gradient one is
    # waited for by the next input-gradient step, the weight-gradient one by nobody in this pass
    assert parents(nodes, "p0.l1.fwd") == {"p0.l0.fwd", "p0.l0.fwd.ALLGATHER.update"}
    assert parents(nodes, "p0.l0.ig") == {"p0.l1.wg", "p0.l1.ig.ALLREDUCE.update"}
    assert any("layer 'l0' input-gradient ALLREDUCE not run" in n for n in report.notes)
    _, spans = intervals_of(str(tmp_path / "out" / "t"), 8)
    gather_end = spans[(3, "p0.l0.fwd.ALLGATHER.update")][1]
    assert spans[(3, "p0.l1.fwd")][0] == gather_end > spans[(3, "p0.l0.fwd.ALLGATHER")][1]


def test_model_data_puts_data_parallel_on_the_first_dimension(tmp_path):
    text = "HYBRID_MODEL_DATA\n1\n" + layer("l0", 1000, "ALLGATHER", 64, 1000, "NONE", 0, 1000, "ALLREDUCE", 64)
    _, ranks = convert(tmp_path, text, npus=8, first_dim_npus=4)
    nodes = ranks[5]
    assert groups_of(nodes) == {"block1": [4, 5, 6, 7], "stride1": [1, 5]}
    pg = {n.name: NodeView(n).str("pg_name") for n in nodes if n.type == pb.COMM_COLL_NODE}
    assert pg == {"p0.l0.fwd.ALLGATHER": "stride1", "p0.l0.wg.ALLREDUCE": "block1"}


def test_default_first_dimension_and_single_npu_groups(tmp_path):
    assert [default_first_dim(n) for n in (1, 2, 8, 12, 16, 64, 7)] == [1, 1, 2, 3, 4, 8, 1]
    text = "HYBRID_DATA_MODEL\n1\n" + layer("l0", 1000, "ALLGATHER", 64, 1000, "NONE", 0, 1000, "ALLREDUCE", 64)
    report, ranks = convert(tmp_path, text, npus=4, first_dim_npus=1)
    colls = [n.name for n in ranks[0] if n.type == pb.COMM_COLL_NODE]
    assert colls == ["p0.l0.wg.ALLREDUCE"]
    assert groups_of(ranks[0]) == {"stride0": [0, 1, 2, 3]}
    assert any("model-parallel group is a single NPU" in n for n in report.notes)


def test_transformer_groups_come_from_the_header(tmp_path):
    text = ("HYBRID_TRANSFORMER model_parallel_NPU_group: 4\n1\n"
            + layer("l0", 1000, "ALLREDUCE", 64, 1000, "ALLREDUCE", 32, 1000, "ALLREDUCE", 128))
    _, ranks = convert(tmp_path, text, npus=8)
    assert groups_of(ranks[6]) == {"block1": [4, 5, 6, 7], "stride2": [2, 6]}
    pg = {n.name: NodeView(n).str("pg_name") for n in ranks[6] if n.type == pb.COMM_COLL_NODE}
    # the transformer loop issues the input-gradient collective even for layer 0
    assert pg == {"p0.l0.fwd.ALLREDUCE": "block1", "p0.l0.ig.ALLREDUCE": "block1",
                  "p0.l0.wg.ALLREDUCE": "stride2"}
    _, ranks = convert(tmp_path, text, npus=8, model_parallel_group=2)
    assert groups_of(ranks[6]) == {"block3": [6, 7], "stride0": [0, 2, 4, 6]}


def test_forward_in_backward_recomputes_from_the_checkpoint(tmp_path):
    text = ("HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 2 checkpoints: 1 1 "
            "checkpoint_initiates: 1 4\n5\n"
            + "".join(layer(f"l{i}", 1000, "ALLREDUCE" if i == 2 else "NONE", 64, 1000, "NONE", 0, 1000,
                            "ALLREDUCE", 64) for i in range(5)))
    _, ranks = convert(tmp_path, text, npus=4, passes=2)
    names = [n.name for n in ranks[0] if n.type != pb.METADATA_NODE]
    start = names.index("p0.l4.wg.ALLREDUCE") - 1
    # at layer 4 the backward pass first recomputes layers 1..3 (with their forward collectives)
    assert names[start - 5:start + 1] == ["p0.l1.fwd.recompute", "p0.l2.fwd.recompute",
                                          "p0.l2.fwd.ALLREDUCE", "p0.l3.fwd.recompute", "p0.l4.ig",
                                          "p0.l4.wg"]
    assert sum(n.endswith(".recompute") for n in names) == 6     # 3 layers x 2 passes
    assert parents(ranks[0], "p0.l3.fwd.recompute") == {"p0.l2.fwd.recompute", "p0.l2.fwd.ALLREDUCE"}


def test_dlrm_embedding_all_to_all_dependencies(tmp_path):
    text = ("HYBRID_DLRM 1\n4\n"
            + layer("emb", 1000, "ALLTOALL", 4096, 1000, "ALLTOALL", 4096, 1000, "NONE", 0, 1000)
            + "".join(layer(f"mlp{i}", 1000, "NONE", 0, 1000, "NONE", 0, 1000, "ALLREDUCE", 1024, 1000)
                      for i in range(1, 4)))
    _, ranks = convert(tmp_path, text, npus=4, passes=2)
    nodes = ranks[0]
    # the forward all-to-all runs in the background until the layer after the last bottom layer
    assert parents(nodes, "p0.emb.fwd.ALLTOALL") == {"p0.emb.fwd"}
    assert parents(nodes, "p0.mlp2.fwd") == {"p0.mlp1.fwd", "p0.emb.fwd.ALLTOALL.update"}
    # the backward all-to-all starts after the input gradient of the first top layer...
    assert parents(nodes, "p0.emb.ig.ALLTOALL") == {"p0.mlp2.ig"}
    # ...and the pass ends only once it (and its update time) finished
    assert parents(nodes, "p1.emb.fwd") == {"p0.emb.wg", "p0.emb.ig.ALLTOALL.update"}
    assert "p0.emb.ig" not in by_name(nodes)
    _, enhanced = convert(tmp_path, text.replace("HYBRID_DLRM", "HYBRID_DLRM_ENHANCED"), npus=4, passes=2)
    assert parents(enhanced[0], "p1.emb.fwd") == {"p0.emb.wg"}


def test_model_parallel_loop(tmp_path):
    text = "MODEL\n2\n" + "".join(layer(f"l{i}", 1000, "ALLGATHER", 64, 1000, "ALLREDUCE", 64, 1000, "NONE", 0)
                                   for i in range(2))
    _, ranks = convert(tmp_path, text, npus=2)
    names = [n.name for n in ranks[0]]
    assert names == ["p0.l0.fwd", "p0.l0.fwd.ALLGATHER", "p0.l1.fwd", "p0.l1.fwd.ALLGATHER", "p0.l1.ig",
                     "p0.l1.ig.ALLREDUCE", "p0.l1.wg", "p0.l0.ig", "p0.l0.wg"]
    assert parents(ranks[0], "p0.l0.ig") == {"p0.l1.wg", "p0.l1.ig.ALLREDUCE"}


def test_micro_benchmark_and_customized(tmp_path):
    _, ranks = convert(tmp_path, "MICRO\n1\nconv1 -1 5 NONE 0 5 NONE 0 5 ALLREDUCE 1048576 5\n", npus=4,
                       passes=3, update_time=False)
    assert [n.name for n in ranks[2]] == ["p0.conv1.wg.ALLREDUCE", "p1.conv1.wg.ALLREDUCE",
                                          "p2.conv1.wg.ALLREDUCE"]
    assert all(not n.data_deps and not n.ctrl_deps for n in ranks[2])
    text = ("HYBRID_CUSTOMIZED\n3\n"
            + layer("a", 1000, "ALLGATHER", 64, 1000, "REDUCESCATTER", 64, 1000, "ALLREDUCE", 64, 0, "HYBRID_MODEL_DATA")
            + layer("b", 1000, "NONE", 0, 1000, "NONE", 0, 1000, "ALLREDUCE", 64, 0, "DATA")
            + layer("c", 1000, "ALLGATHER", 64, 1000, "REDUCESCATTER", 64, 1000, "ALLREDUCE", 64, 0, "MODEL"))
    report, ranks = convert(tmp_path, text, npus=4, first_dim_npus=2)
    pg = {n.name: NodeView(n).str("pg_name", "world") for n in ranks[1] if n.type == pb.COMM_COLL_NODE}
    assert pg == {"p0.a.fwd.ALLGATHER": "stride1", "p0.c.fwd.ALLGATHER": "world",
                  "p0.c.ig.REDUCESCATTER": "world", "p0.b.wg.ALLREDUCE": "world",
                  "p0.a.wg.ALLREDUCE": "block0"}
    assert any("layer 'c' weight-gradient ALLREDUCE not run: the MODEL policy" in n for n in report.notes)


def test_comm_sizes_are_each_ranks_input_as_astra_sim_reads_them(tmp_path):
    """ASTRA-sim 1.0's Layer passes a column's size (x --comm-scale) straight to
    generate_all_gather / generate_reduce_scatter, whose ring runs N-1 steps of the whole size
    (all-gather) or of size/N (reduce-scatter): comm_size is each rank's input
    (docs/collectives.md), so the column is copied unchanged."""
    text = "MODEL\n2\n" + layer("l0", 1000, "ALLGATHER", 4096) + layer("l1", 1000, ig=1000, ig_comm="REDUCESCATTER",
                                                                        ig_size=4096)
    _, ranks = convert(tmp_path, text, npus=4, comm_scale=2.0)
    sizes = {n.name: (NodeView(n).int("comm_type"), NodeView(n).int("comm_size"))
             for n in ranks[0] if n.type == pb.COMM_COLL_NODE}
    assert sizes == {"p0.l0.fwd.ALLGATHER": (pb.ALL_GATHER, 8192), "p0.l1.ig.REDUCESCATTER": (pb.REDUCE_SCATTER, 8192)}
    results = simulate(manifest(str(tmp_path / "out" / "t"), ring_network(4), system={}))
    sent = 3 * 8192 + 3 * 8192 // 4
    for row in results["ranks"]:
        assert (row["bytes_sent"] if "bytes_sent" in row else row["native"]["bytes_sent"]) == sent


def test_durations_round_to_microseconds_and_keep_exact_ns(tmp_path):
    text = "DATA\n1\n" + layer("l0", 1499, ig=7, wg=2500, wg_comm="ALLREDUCE", wg_size=64)
    report, ranks = convert(tmp_path, text, npus=2, compute_scale=2.0)
    comp = {n.name: NodeView(n) for n in ranks[0] if n.type == pb.COMP_NODE}
    assert (comp["p0.l0.fwd"].int("duration_ns"), comp["p0.l0.fwd"].duration_micros) == (2998, 3)
    assert (comp["p0.l0.wg"].int("duration_ns"), comp["p0.l0.wg"].duration_micros) == (5000, 5)
    assert report.compute_ns == 2998 + 5000 and report.compute_replay_ns == 8000
    _, ranks = convert(tmp_path, "DATA\n1\n" + layer("l0", 300, wg=0, wg_comm="ALLREDUCE", wg_size=64), npus=2)
    fwd = NodeView(by_name(ranks[0])["p0.l0.fwd"])
    assert (fwd.duration_micros, fwd.int("duration_ns")) == (0, 300)
    assert "p0.l0.wg" not in by_name(ranks[0])        # 0 cycles: ASTRA-sim does not wait


def test_conversion_is_deterministic(tmp_path):
    path = workload_file(tmp_path, "HYBRID_TRANSFORMER model_parallel_NPU_group: 2\n2\n"
                         + layer("a", 1000, "ALLREDUCE", 64, 1000, "ALLREDUCE", 64, 1000, "ALLREDUCE", 64, 5)
                         + layer("b", 2000, "NONE", 0, 1000, "NONE", 0, 1000, "ALLREDUCE", 64, 5))
    outputs = []
    for out in ("x", "y"):
        result = CliRunner().invoke(convert_text, [str(path), "--num-npus", "4", "--num-passes", "2",
                                                   "--output", str(tmp_path / out / "t")])
        assert result.exit_code == 0, result.output
        outputs.append([(tmp_path / out / f"t.{r}.et").read_bytes() for r in range(4)])
    assert outputs[0] == outputs[1]
    assert "wrote" in result.output and "groups: block<i>" in result.output


# Every ASTRA-sim 1.0 example workload -----------------------------------------------------------------
EXPECTED_COLLECTIVES = {
    # per NPU and pass, from each file's columns and its policy's loop
    "Resnet50_DataParallel.txt": 54,
    "microAllReduce.txt": 1,
    "microAllToAll.txt": 1,
    "DLRM_HybridParallel.txt": 9,          # embedding fwd + ig all-to-all, 7 MLP gradient all-reduces
    "MLP_ModelParallel.txt": 11,           # 6 forward all-gathers, 5 input-gradient all-reduces
}


@pytest.mark.parametrize("name", ["DLRM_HybridParallel.txt", "MLP_HybridParallel_Data_Model.txt",
                                  "MLP_HybridParallel_Model_Data.txt", "MLP_ModelParallel.txt",
                                  "Resnet50_DataParallel.txt", "Transformer_HybridParallel.txt",
                                  "Transformer_HybridParallel_Fwd_In_Bckwd.txt", "microAllReduce.txt",
                                  "microAllToAll.txt", "sample_per_layer_parallel_HybridCustomized.txt"])
def test_astra_sim_examples_convert_and_simulate(ref_traces, tmp_path, name):
    source = ASTRA_TEXT / name
    result = CliRunner().invoke(convert_text, [str(source), "--num-npus", "8", "--num-passes", "2",
                                               "--output", str(tmp_path / "t")])
    assert result.exit_code == 0, result.output
    traces = [read_trace(tmp_path / f"t.{r}.et").nodes for r in range(8)]
    colls = [sum(n.type == pb.COMM_COLL_NODE for n in nodes) for nodes in traces]
    assert len(set(colls)) == 1 and colls[0] > 0
    if name in EXPECTED_COLLECTIVES:
        assert colls[0] == 2 * EXPECTED_COLLECTIVES[name]
    results = simulate(manifest(str(tmp_path / "t"), ring_network(8), system={}))
    assert results["finish_ns"] > 0
    assert all(row["finish_ns"] > 0 for row in results["ranks"])
    comp_ns = sum(NodeView(n).int("duration_ns") for n in traces[0]
                  if n.type == pb.COMP_NODE and not NodeView(n).is_cpu_op)
    assert results["finish_ns"] >= comp_ns * 0.9     # rounding to µs moves it by a few % at most
