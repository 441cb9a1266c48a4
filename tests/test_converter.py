"""The PyTorch converter (`chakra-sim convert pytorch`): host traces of every schema, Kineto
linking, FLOPs and communication attributes, dependencies, determinism, and simulations of the
converted traces. Tests on ../shared/ref-traces/pytorch skip when it is absent; the HTA pair in
tests/data/pytorch always runs."""

from __future__ import annotations

import functools
import gzip
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from chakra_core.errors import SimulationError
from chakra_core.et.attrs import NodeView
from chakra_core.et.io import read_trace, write_trace
from chakra_core.feeder import open_feeder
from chakra_core.schema import pb
from chakra_core.comm.groups import ProcessGroupEntry, parse_pg_list
from chakra_core.tools.pytorch import Conversion, ConversionError, convert
from chakra_core.tools.pytorch.cli import convert_pytorch
from chakra_core.tools.pytorch.deps import Dependencies
from chakra_core.tools.pytorch.host import HostOp, Operands
from chakra_core.tools.pytorch.kineto import load_kineto_trace
from chakra_core.tools.pytorch.link import link_cpu
from chakra_core.tools.pytorch.host import load_host_trace
from chakra_core.tools.pytorch.flops import estimate
from tests.helpers import REF_PYTORCH, REF_PYTORCH_PAIRS, drain
from tests.simhelpers import manifest, ring_network, simulate

DATA = Path(__file__).resolve().parent / "data" / "pytorch"
HTA_HOST, HTA_KINETO = DATA / "benchmark_simple_add_et.json.gz", DATA / "benchmark_simple_add_trace.json.gz"
PAIRS = REF_PYTORCH_PAIRS
DLRM = PAIRS[2:4]
SELFGEN = PAIRS[4:6]


def _top_level_key(path: Path) -> str | None:
    """'nodes' for a host trace, 'traceEvents' for a Kineto trace, from the file's first MiB
    (both put that key near the start), so collecting the tests stays fast."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as handle:
        head = handle.read(1 << 20)
    found = {key: head.find(f'"{key}"'.encode()) for key in ("nodes", "traceEvents")}
    found = {key: pos for key, pos in found.items() if pos >= 0}
    return min(found, key=found.get) if found else None


def _ref_files(key: str) -> list[Path]:
    if not REF_PYTORCH.is_dir():
        return []
    return sorted(p for p in REF_PYTORCH.rglob("*") if p.name.endswith((".json", ".json.gz"))
                  and _top_level_key(p) == key)


def _params(paths: list, ids) -> list:
    if not paths:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{REF_PYTORCH} not found"))]
    return [pytest.param(p, id=i) for p, i in zip(paths, ids)]


HOST_TRACES = _ref_files("nodes")
KINETO_TRACES = _ref_files("traceEvents")


UNRECORDED_RANK = {"selfgen-cpu/host.0.json.gz": 0, "selfgen-cpu/host.1.json.gz": 1}
"""Host traces of multi-rank jobs that do not record their rank (their Kineto traces do)."""


@functools.lru_cache(maxsize=None)
def converted(host: Path, kineto: Path | None = None) -> Conversion:
    """A reference conversion, shared by the tests that only read it (big traces convert once)."""
    rank = None
    if kineto is None and host.is_relative_to(REF_PYTORCH):
        rank = UNRECORDED_RANK.get(host.relative_to(REF_PYTORCH).as_posix())
    return convert(host, kineto, rank)


def write_as(result: Conversion, prefix: Path, rank: int) -> Path:
    """Write a conversion as another rank's file (a rank-1 trace simulated as a run of one)."""
    path = Path(f"{prefix}.{rank}.et")
    write_trace(path, result.metadata, result.nodes)
    return path


def _comm_nodes(nodes):
    return [n for n in nodes if n.type in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)]


def _check_graph(path: Path) -> None:
    """The feeder accepts the file (ids unique, every parent exists, no cycle) and drains it."""
    feeder = open_feeder(path, missing_parents="error")
    try:
        assert len(drain(feeder)) == feeder.num_nodes
    finally:
        feeder.close()


# Synthetic host traces ------------------------------------------------------------------------
def T(tensor_id: int, storage: int, shape: list[int], dtype: str = "float", device: str = "cuda:0"):
    """A tensor operand: (value, shape, type) in schema 1.1 form."""
    size = {"float": 4, "long": 8, "c10::Half": 2}[dtype]
    return [tensor_id, storage, 0, math.prod(shape), size, device], shape, f"Tensor({dtype})"


def V(value, kind: str):
    return value, [], kind


def node(node_id: int, name: str, parent: int, inputs=(), outputs=(), **attrs) -> dict:
    attrs = {"rf_id": node_id, "tid": 1, **attrs}
    return {"id": node_id, "name": name, "ctrl_deps": parent,
            "inputs": {"values": [i[0] for i in inputs], "shapes": [i[1] for i in inputs],
                       "types": [i[2] for i in inputs]},
            "outputs": {"values": [o[0] for o in outputs], "shapes": [o[1] for o in outputs],
                        "types": [o[2] for o in outputs]},
            "attrs": [{"name": k, "type": "string" if isinstance(v, str) else "uint64", "value": v}
                      for k, v in attrs.items()]}


ROOTS = [node(1, "[pytorch|profiler|execution_trace|process]", 1, tid=0),
         node(2, "[pytorch|profiler|execution_trace|thread]", 1)]


def host_doc(nodes: list[dict], schema: str = "1.1.1-chakra.0.0.4") -> dict:
    return {"schema": schema, "pid": 7, "time": "2024-01-01 00:00:00", "start_ts": 0, "finish_ts": 1,
            "nodes": ROOTS + nodes}


def write_json(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc))
    return path


def pg_init(node_id: int, groups: list[dict]) -> dict:
    return node(node_id, "## process_group:init ##", 2, [V(json.dumps(groups), "String")], tid=1)


def allreduce(node_id: int, tensor_id: int, storage: int, numel: int, pg: str = "0", rank: int = 0) -> list[dict]:
    """c10d::allreduce_ -> record_param_comms (schema 1.1 attrs) -> nccl:all_reduce."""
    t = T(tensor_id, storage, [numel])
    tensors = ([t[0]], [t[1]], "GenericList[Tensor(float)]")
    return [node(node_id, "c10d::allreduce_", 2, [tensors, V("<Object>", "Object")], [tensors]),
            node(node_id + 1, "record_param_comms", node_id, [tensors, V(1, "Int"), V([pg, ""], "Tuple[String,String]"),
                                                               V(rank, "Int"), V("allreduce", "String")],
                 [tensors], collective_name="allreduce", dtype="Float", in_msg_nelems=numel,
                 out_msg_nelems=numel, pg_name=pg),
            node(node_id + 2, "nccl:all_reduce", node_id + 1, [t])]


# Reference traces -----------------------------------------------------------------------------
@pytest.mark.parametrize("host", _params(HOST_TRACES, [p.relative_to(REF_PYTORCH).as_posix() for p in HOST_TRACES]))
def test_every_reference_host_trace_converts_host_only(host, tmp_path):
    result = converted(host)
    summary = result.summary
    assert summary.warnings == []
    assert sum(summary.nodes.values()) == len(result.nodes) > 0
    assert summary.units == sum(n.type != pb.METADATA_NODE and NodeView(n).raw("op_type") != "kernel"
                                for n in result.nodes)
    path = result.write(tmp_path / "trace")
    assert path.name == f"trace.{summary.rank}.et"
    assert read_trace(path).nodes == result.nodes
    _check_graph(path)


def test_every_kineto_reference_trace_is_in_a_pair(ref_traces):
    assert {p.relative_to(REF_PYTORCH).as_posix() for p in KINETO_TRACES} == {k for _, k in PAIRS}


@pytest.mark.parametrize("pair", _params(PAIRS if REF_PYTORCH.is_dir() else [], [h for h, _ in PAIRS]))
def test_every_reference_pair_converts_linked(pair, tmp_path):
    host, kineto = (REF_PYTORCH / p for p in pair)
    result = converted(host, kineto)
    summary = result.summary
    assert summary.warnings == []
    assert summary.linked >= 0.99 * summary.units, (summary.linked, summary.units)
    assert summary.cpu_micros > 0
    has_kernels = bool(load_kineto_trace(kineto).gpu)
    assert (summary.gpu_linked > 0) == has_kernels
    assert (summary.gpu_micros > 0) == has_kernels
    _check_graph(result.write(tmp_path / "trace"))


@pytest.mark.parametrize("linked", [False, True], ids=["host-only", "linked"])
def test_dlrm_has_5_all_to_all_and_3_all_reduce_per_rank_and_simulates_on_2_npus(ref_traces, tmp_path, linked):
    sizes = []
    for rank, (host, kineto) in enumerate(DLRM):
        result = converted(ref_traces / "pytorch" / host, ref_traces / "pytorch" / kineto if linked else None)
        assert result.rank == rank
        assert result.summary.collectives == {"ALL_REDUCE": 3, "ALL_TO_ALL": 5}
        comm = _comm_nodes(result.nodes)
        assert [NodeView(n).int("comm_type") for n in comm] == [6, 6, 6, 6, 0, 6, 0, 0]
        assert all(not NodeView(n).is_cpu_op and not NodeView(n).has("pg_name") for n in comm)
        if linked:   # durations and start times measured by Kineto, on the NCCL stream
            assert all(n.name.startswith("ncclKernel") and n.duration_micros > 0 and n.start_time_micros > 0
                       for n in comm)
        sizes.append([NodeView(n).int("comm_size") for n in comm])
        # all_to_allv records its 8 pieces (an 8-rank job; one uneven: 96 ... 1,664 floats): kept
        a2av = [NodeView(n) for n in comm if NodeView(n).has("comm_send_splits")]
        assert len(a2av) == 4 and all(len(v.raw("comm_send_splits")) == 8 == len(v.raw("comm_recv_splits"))
                                      and sum(v.raw("comm_send_splits")) == v.int("comm_size") for v in a2av)
        result.write(tmp_path / "dlrm")
    assert sizes[0] == sizes[1]
    assert sizes[0][4] == 394241 * 4          # all-reduce of 394,241 floats
    # split evenly among the 2 ranks simulated here, with a warning
    results = simulate(manifest(str(tmp_path / "dlrm"), ring_network(2)))
    assert results["finish_ns"] > 0 and results["warnings"] == [
        "all-to-alls among all ranks carry 8 pieces (comm_send_splits) but run among 2 ranks here: their "
        "comm_size is split evenly"]
    for rank in results["ranks"]:
        assert rank["native"]["collectives"] == 8
        assert set(rank["comm_bytes_by_type"]) == {"ALL_REDUCE", "ALL_TO_ALL"}
    if linked:   # replayed compute: the GPU nodes take their measured time
        assert results["ranks"][0]["compute_ns"] == 1_000 * converted(
            *(ref_traces / "pytorch" / p for p in DLRM[0])).summary.gpu_micros


@pytest.mark.parametrize("linked", [False, True], ids=["host-only", "linked"])
def test_selfgen_cpu_pair_simulates_on_2_npus(ref_traces, tmp_path, linked):
    for host, kineto in SELFGEN:
        rank = int(host.split(".")[1])
        result = convert(ref_traces / "pytorch" / host, ref_traces / "pytorch" / kineto if linked else None,
                         rank=rank)
        assert result.summary.collectives == {"ALL_REDUCE": 10}
        result.write(tmp_path / "cpu")
    results = simulate(manifest(str(tmp_path / "cpu"), ring_network(2)))
    assert [r["native"]["collectives"] for r in results["ranks"]] == [10, 10]
    if linked:   # gloo runs its collectives on CPU threads: comm nodes carry those durations
        comm = _comm_nodes(read_trace(tmp_path / "cpu.0.et").nodes)
        assert all(n.name == "c10d::allreduce_" and n.duration_micros > 0 for n in comm)


SINGLE_RANK = ["chakra-tests/1.0.2-chakra.0.0.4.json", "param/pt2_et.json",
               "param/1.0.3-chakra.0.0.4/resnet_1gpu_et.json.gz",
               "param/1.1.0-chakra.0.0.4/resnet_2gpu_et.json.gz", "param/hf_GPT2_et.json.gz",
               "param/linear_et.json.gz"]


@pytest.mark.parametrize("host", SINGLE_RANK)
def test_single_rank_conversions_simulate_on_one_npu(ref_traces, tmp_path, host):
    """A group of one rank completes its collectives at once, so any rank's trace runs alone."""
    result = converted(ref_traces / "pytorch" / host)
    write_as(result, tmp_path / "one", 0)   # the 2-GPU ResNet trace is rank 1's: run it alone
    results = simulate(manifest(str(tmp_path / "one"), ring_network(1),
                                compute={"plugin": "roofline", "peak_tflops": 100,
                                         "memory_bandwidth_gbps": 1000}))
    rank = results["ranks"][0]
    assert rank["native"]["collectives"] == len(_comm_nodes(result.nodes))
    assert sum(rank["node_counts"].values()) == len(result.nodes)
    if result.summary.num_ops > 1e9:   # the roofline times GPU nodes from their num_ops
        assert rank["compute_ns"] >= result.summary.num_ops / 100e12 * 1e9 * 0.99


def test_gpt2_converts(ref_traces):
    # Its conversion time is a benchmark figure: benchmarks/converter_table.py --timing.
    assert len(converted(ref_traces / "pytorch" / "param/hf_GPT2_et.json.gz").nodes) > 10_000


def test_resnet_flops_match_the_model(ref_traces):
    """3 steps of ResNet-50 at batch 32: forward ~8.2 GFLOP per image, backward twice that."""
    summary = converted(ref_traces / "pytorch" / "param/1.0.3-chakra.0.0.4/resnet_1gpu_et.json.gz").summary
    assert 3 * 32 * 3 * 7.5e9 < summary.num_ops < 3 * 32 * 3 * 8.6e9


def test_order_linking_agrees_with_record_function_ids(ref_traces):
    """selfgen-cpu's Kineto traces carry `Record function id`: hide it, link by order, compare."""
    for host_path, kineto_path in SELFGEN:
        host = load_host_trace(ref_traces / "pytorch" / host_path)
        kineto = load_kineto_trace(ref_traces / "pytorch" / kineto_path)
        truth = {h: e.index for h, e in link_cpu(host, kineto).event_of.items()}
        assert len(truth) == sum(1 for op in host.ops.values()
                                 if not op.name.startswith(("[pytorch", "## process_group")))
        for event in kineto.cpu:
            event.rf_id = None
        by_order = link_cpu(host, kineto)
        assert by_order.by_rf_id == 0
        assert {h: e.index for h, e in by_order.event_of.items()} == truth


def test_linking_picks_the_host_iteration_in_a_longer_kineto_trace(ref_traces):
    """linear's Kineto trace holds ~40 iterations, its host trace one: links stay in one window
    and every linked parent encloses its linked children."""
    host = load_host_trace(ref_traces / "pytorch" / "param/linear_et.json.gz")
    links = link_cpu(host, load_kineto_trace(ref_traces / "pytorch" / "param/linear_kineto.json.gz"))
    for op_id, event in links.event_of.items():
        parent = links.event_of.get(host.ops[op_id].parent)
        if parent is not None and host.ops[op_id].parent != op_id:
            assert parent.ts <= event.ts and event.end <= parent.end + 1
    starts = sorted(e.ts for e in links.event_of.values())
    assert starts[-1] - starts[0] < 30_000   # µs: one iteration, not the 2 s trace


# In-repo fixture ------------------------------------------------------------------------------
def test_hta_pair_links_every_op_and_kernel(tmp_path):
    result = convert(HTA_HOST, HTA_KINETO)
    summary = result.summary
    assert (summary.units, summary.linked, summary.gpu_events, summary.gpu_linked) == (16, 16, 4, 4)
    kernels = [n for n in result.nodes if NodeView(n).raw("op_type") == "kernel"]
    assert len(kernels) == 4 and all(not NodeView(n).is_cpu_op and n.duration_micros > 0 for n in kernels)
    by_id = {n.id: n for n in result.nodes}
    for kernel in kernels:   # each kernel depends on the CPU op that launched it
        launchers = [by_id[p] for p in kernel.ctrl_deps if NodeView(by_id[p]).is_cpu_op]
        assert [n.name for n in launchers] in (["aten::uniform_"], ["aten::add"])
    add = [n for n in kernels if "vectorized_elementwise" in n.name]
    assert [NodeView(n).int("num_ops") for n in add] == [65536, 65536]   # 256x256 adds
    # the kernels carry the data type their launching operator's float tensors say (for
    # per-data-type peaks), since their operands stay on the host node
    assert [NodeView(n).str("dtype") for n in add] == ["fp32", "fp32"]
    result.write(tmp_path / "hta")
    results = simulate(manifest(str(tmp_path / "hta"), ring_network(1)))
    assert results["ranks"][0]["compute_ns"] == 1000 * summary.gpu_micros


def test_converting_twice_is_byte_identical(tmp_path):
    for name, args in (("host", (HTA_HOST,)), ("linked", (HTA_HOST, HTA_KINETO))):
        first = convert(*args).write(tmp_path / "a" / name)
        second = convert(*args).write(tmp_path / "b" / name)
        assert first.read_bytes() == second.read_bytes()


def test_reference_conversions_are_byte_identical(ref_traces, tmp_path):
    for host, kineto in DLRM[:1] + SELFGEN[:1]:
        paths = [convert(ref_traces / "pytorch" / host, ref_traces / "pytorch" / kineto).write(tmp_path / d / "t")
                 for d in "ab"]
        assert paths[0].read_bytes() == paths[1].read_bytes()


# Units, FLOPs, tensors ------------------------------------------------------------------------
def op(name: str, inputs=(), outputs=(), schema: str = "") -> HostOp:
    return HostOp(1, name, None, Operands([i[0] for i in inputs], [i[1] for i in inputs], [i[2] for i in inputs]),
                  Operands([o[0] for o in outputs], [o[1] for o in outputs], [o[2] for o in outputs]),
                  {"op_schema": schema})


@pytest.mark.parametrize("name, inputs, outputs, expected", [
    ("aten::mm", [T(1, 1, [64, 32]), T(2, 2, [32, 16])], [], 2 * 64 * 16 * 32),
    ("aten::addmm", [T(1, 1, [16]), T(2, 2, [64, 32]), T(3, 3, [32, 16])], [], 2 * 64 * 16 * 32),
    ("aten::bmm", [T(1, 1, [4, 64, 32]), T(2, 2, [4, 32, 16])], [], 2 * 4 * 64 * 16 * 32),
    ("aten::baddbmm", [T(1, 1, [4, 64, 16]), T(2, 2, [4, 64, 32]), T(3, 3, [4, 32, 16])], [], 2 * 4 * 64 * 16 * 32),
    ("aten::matmul", [T(1, 1, [8, 1, 64, 32]), T(2, 2, [3, 32, 16])], [], 2 * 8 * 3 * 64 * 16 * 32),
    ("aten::matmul", [T(1, 1, [32]), T(2, 2, [32, 16])], [], 2 * 16 * 32),
    ("aten::linear", [T(1, 1, [2, 10, 32]), T(2, 2, [16, 32]), T(3, 3, [16])], [], 2 * 20 * 16 * 32),
    ("aten::conv2d", [T(1, 1, [8, 3, 32, 32]), T(2, 2, [16, 3, 3, 3]), V("<None>", "None"), V([1, 1], "GenericList[Int,Int]"),
                      V([1, 1], "GenericList[Int,Int]"), V([1, 1], "GenericList[Int,Int]"), V(1, "Int")],
     [], 2 * 8 * 32 * 32 * 16 * 3 * 3 * 3),
    ("aten::cudnn_convolution", [T(1, 1, [8, 4, 32, 32]), T(2, 2, [16, 2, 3, 3])], [T(3, 3, [8, 16, 16, 16])],
     2 * 8 * 16 * 16 * 16 * 2 * 3 * 3),
    ("aten::convolution_backward", [T(1, 1, [8, 16, 16, 16]), T(2, 2, [8, 4, 32, 32]), T(3, 3, [16, 4, 3, 3]),
                                    V([0], "GenericList[Int]"), V([2, 2], ""), V([1, 1], ""), V([1, 1], ""),
                                    V(False, "Bool"), V([0, 0], ""), V(1, "Int"), V([False, True, False], "")],
     [], 2 * 8 * 16 * 16 * 16 * 4 * 3 * 3),
    ("aten::add", [T(1, 1, [256, 256]), T(2, 2, [256, 256])], [T(3, 3, [256, 256])], 65536),
])
def test_flop_formulas(name, inputs, outputs, expected):
    estimate_ = estimate(op(name, inputs, outputs))
    assert estimate_.num_ops == expected and estimate_.problem is None


def test_unusable_shapes_give_a_warning_naming_the_node(tmp_path):
    bad_mm = node(3, "aten::mm", 2, [T(4, 4, [3]), T(5, 5, [3, 2])], [T(6, 6, [2])])
    result = convert(write_json(tmp_path / "et.json", host_doc([bad_mm])))
    assert len(result.summary.warnings) == 1
    assert "node 3 ('aten::mm')" in result.summary.warnings[0] and "no FLOP estimate" in result.summary.warnings[0]
    (mm,) = result.nodes
    assert not NodeView(mm).has("num_ops") and NodeView(mm).int("tensor_size") == (3 + 6 + 2) * 4


def test_leaf_operators_carry_the_work_once(tmp_path):
    """aten::linear -> aten::t (-> transpose -> as_strided) + aten::addmm: linear is represented
    by its children; t only re-views (one unit with its subtree); addmm has the FLOPs."""
    x, w, b, y = T(10, 10, [64, 32]), T(11, 11, [16, 32]), T(12, 12, [16]), T(13, 13, [64, 16])
    wt = T(14, 11, [32, 16])
    nodes = [node(3, "aten::linear", 2, [x, w, b], [y]),
             node(4, "aten::t", 3, [w], [wt]), node(5, "aten::transpose", 4, [w], [wt]),
             node(6, "aten::as_strided", 5, [w], [wt]),
             node(7, "aten::addmm", 3, [b, x, wt], [y], op_schema="aten::addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor"),
             node(8, "aten::relu_", 2, [y], [y]),
             node(9, "aten::sum", 2, [y], [T(15, 15, [])])]
    result = convert(write_json(tmp_path / "et.json", host_doc(nodes)))
    assert [n.name for n in result.nodes] == ["aten::t", "aten::addmm", "aten::relu_", "aten::sum"]
    t, addmm, relu, total = result.nodes
    assert NodeView(t).is_cpu_op and not NodeView(t).has("num_ops")     # a view: no device work
    assert not NodeView(addmm).is_cpu_op and NodeView(addmm).int("num_ops") == 2 * 64 * 16 * 32
    assert result.summary.num_ops == 2 * 64 * 16 * 32 + 64 * 16 + 64 * 16
    assert NodeView(addmm).raw("op_schema").startswith("aten::addmm(")
    assert json.loads(addmm.inputs.values.replace("'", '"'))[1] == x[0]   # Chakra's tensor 6-lists
    # program order on the thread, and relu_ (in place) is what sum reads
    assert list(addmm.ctrl_deps) == [t.id] and list(relu.data_deps) == [addmm.id]
    assert list(total.data_deps) == [relu.id]


def test_data_dependencies_cross_threads_and_follow_in_place_writes(tmp_path):
    a, b = T(20, 20, [128]), T(21, 21, [128])
    nodes = [node(3, "aten::add", 2, [a, a], [b]),
             node(4, "[pytorch|profiler|execution_trace|thread]", 1, tid=2),
             node(5, "aten::mul_", 4, [a, b], [a], tid=2,
                  op_schema="aten::mul_.Tensor(Tensor(a!) self, Tensor other) -> Tensor(a!)"),
             node(6, "aten::neg", 2, [a], [T(22, 22, [128])])]
    result = convert(write_json(tmp_path / "et.json", host_doc(nodes)))
    add, mul, neg = result.nodes
    assert list(mul.data_deps) == [add.id] and list(mul.ctrl_deps) == []    # other thread
    assert list(neg.data_deps) == [mul.id] and list(neg.ctrl_deps) == [add.id]


# Communication --------------------------------------------------------------------------------
def test_collective_attributes_and_process_groups(tmp_path):
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [], "group_size": 2},
              {"pg_name": "7", "ranks": [0, 1], "group_size": 2}]
    nodes = [pg_init(3, groups), *allreduce(10, 30, 31, 1000), *allreduce(20, 40, 41, 24, pg="7"),
             node(25, "aten::mul", 2, [T(30, 31, [1000])], [T(32, 32, [1000])]),
             *allreduce(30, 50, 51, 8)]
    result = convert(write_json(tmp_path / "et.json", host_doc(nodes)))
    meta, first, second, mul, third = result.nodes
    assert meta.type == pb.METADATA_NODE and meta.id == 0
    assert parse_pg_list(meta.inputs.values) == [ProcessGroupEntry("0", ()), ProcessGroupEntry("7", ())]
    for comm, size, pg in ((first, 4000, "0"), (second, 96, "7")):
        view = NodeView(comm)
        assert comm.type == pb.COMM_COLL_NODE and comm.name == "c10d::allreduce_"
        assert (view.int("comm_type"), view.int("comm_size"), view.str("pg_name")) == (pb.ALL_REDUCE, size, pg)
        assert comm.attr[[a.name for a in comm.attr].index("comm_size")].WhichOneof("value") == "uint64_val"
    assert list(third.ctrl_deps) == [first.id, mul.id]    # collectives of a group keep their order
    assert list(second.ctrl_deps) == [meta.id]            # another group; the thread does not wait
    assert list(mul.data_deps) == [first.id]              # reads the all-reduced buffer
    assert result.rank == 0                               # from record_param_comms
    assert [n.name for n in result.nodes].count("nccl:all_reduce") == 0


# comm_size: one meaning per collective type (docs/collectives.md) -----------------------------
def test_all_gather_comm_size_is_each_ranks_input(ref_traces):
    """chakra-tests 1.0.2: 10 all-gathers of one float on 2 ranks; the gathered output is 8 B,
    each rank's input (what ASTRA-sim's and chakra-sim's all-gather size means) 4 B."""
    result = converted(ref_traces / "pytorch" / "chakra-tests/1.0.2-chakra.0.0.4.json")
    comm = _comm_nodes(result.nodes)
    assert [(NodeView(n).int("comm_type"), NodeView(n).int("comm_size")) for n in comm] == [(pb.ALL_GATHER, 4)] * 10
    assert result.summary.warnings == []


def test_a_converted_all_gather_moves_n_minus_1_inputs_per_rank_on_a_ring(ref_traces, tmp_path):
    """Both ranks of the 1.0.2 all-gathers (the trace is rank 0's; both record the same calls):
    a ring all-gather sends (N-1) x input = 4 B per rank and collective, 40 B for the 10."""
    result = converted(ref_traces / "pytorch" / "chakra-tests/1.0.2-chakra.0.0.4.json")
    for rank in (0, 1):
        write_as(result, tmp_path / "ag", rank)
    results = simulate(manifest(str(tmp_path / "ag"), ring_network(2), system={}))
    for row in results["ranks"]:
        assert row["comm_bytes_by_type"] == {"ALL_GATHER": 40}
        assert (row["bytes_sent"], row["bytes_received"]) == (40, 40)


def F(numel: int, tensor_id: int):
    """A float tensor operand of `numel` elements on its own storage."""
    return T(tensor_id, tensor_id, [numel])


def tensor_list(*operands):
    return [o[0] for o in operands], [o[1] for o in operands], "GenericList[Tensor(float)]"


def nested_list(*operands):
    """One list of tensors inside a list (`Tensor[][]`, e.g. allgather_'s outputs)."""
    return [[o[0] for o in operands]], [[o[1] for o in operands]], "GenericList[GenericList[Tensor(float)]]"


def rpc(node_id: int, parent: int, name: str, inputs, outputs, **attrs) -> dict:
    """record_param_comms of rank 0 in group "0" of 2 ranks (schema 1.1 operands)."""
    return node(node_id, "record_param_comms", parent,
                [inputs, V(1, "Int"), V(["0", ""], "Tuple[String,String]"), V(0, "Int"), V(name, "String"),
                 V([], "GenericList[]"), V([], "GenericList[]"), V(0, "Int"), V(1, "Int"), V(2, "Int")],
                [outputs], **attrs)


SIZE_CASES = {
    # record_param_comms attributes: in_msg_nelems is the input, whatever the type
    "reduce_scatter, in/out_msg_nelems": (
        [node(3, "c10d::reduce_scatter_", 2, [tensor_list(F(100, 1)), tensor_list(F(100, 2), F(100, 3))]),
         rpc(4, 3, "reduce_scatter", tensor_list(F(100, 2), F(100, 3)), tensor_list(F(100, 1)),
             collective_name="reduce_scatter", dtype="Float", in_msg_nelems=200, out_msg_nelems=100, pg_size=2)],
        pb.REDUCE_SCATTER, 800),
    "uneven all_to_allv: the send buffer": (
        [node(3, "c10d::alltoall_base_", 2, [F(500, 1), F(300, 2)]),
         rpc(4, 3, "all_to_allv", F(300, 2), F(500, 1), collective_name="all_to_allv", dtype="Float",
             in_msg_nelems=300, out_msg_nelems=500, in_split_size="[100, 200]", out_split_size="[250, 250]",
             pg_size=2)],
        pb.ALL_TO_ALL, 1200),
    "all_gather, record_param_comms tensors (schema 1.0.2)": (
        [node(3, "c10d::allgather_", 2, [nested_list(F(16, 1), F(16, 2)), tensor_list(F(16, 3))]),
         rpc(4, 3, "all_gather", tensor_list(F(16, 3)), nested_list(F(16, 1), F(16, 2)))],
        pb.ALL_GATHER, 64),
    "_allgather_base_ operands (output, input)": (
        [node(3, "c10d::_allgather_base_", 2, [F(32, 1), F(16, 2)], [F(32, 1)])], pb.ALL_GATHER, 64),
    "_reduce_scatter_base_ operands (output, input)": (
        [node(3, "c10d::_reduce_scatter_base_", 2, [F(16, 1), F(32, 2)], [F(16, 1)])], pb.REDUCE_SCATTER, 128),
    "allgather_into_tensor_coalesced_ operands": (
        [node(3, "c10d::allgather_into_tensor_coalesced_", 2,
              [tensor_list(F(32, 1), F(64, 2)), tensor_list(F(16, 3), F(32, 4))])], pb.ALL_GATHER, 192),
    "functional all_gather_into_tensor (input first)": (
        [node(3, "_c10d_functional::all_gather_into_tensor", 2, [F(16, 1), V(2, "Int"), V("0", "String")],
              [F(32, 2)])], pb.ALL_GATHER, 64),
    "functional reduce_scatter_tensor (input first)": (
        [node(3, "_c10d_functional::reduce_scatter_tensor", 2,
              [F(32, 1), V("sum", "String"), V(2, "Int"), V("0", "String")], [F(16, 2)])], pb.REDUCE_SCATTER, 128),
    "all_gather with only the output: the group's size divides it": (
        [pg_init(3, [{"pg_name": "0", "ranks": [], "group_size": 2}]),
         node(4, "c10d::allgather_", 2, [nested_list(F(16, 1), F(16, 2)), V([], "GenericList[]")])],
        pb.ALL_GATHER, 64),
    "scatter: the piece each rank receives": (
        [node(3, "c10d::scatter_", 2, [tensor_list(F(16, 1)), nested_list(F(16, 2), F(16, 3)),
                                       V("<Object>", "Object"), V(0, "Int")])], pb.SCATTER, 64),
    "gather: each rank's contribution": (
        [node(3, "c10d::gather_", 2, [nested_list(F(16, 1), F(16, 2)), tensor_list(F(16, 3)),
                                      V("<Object>", "Object"), V(0, "Int")])], pb.GATHER, 64),
    "barrier: no data": (
        [node(3, "c10d::barrier", 2, [F(1, 1)], [F(1, 1)])], pb.BARRIER, 0),
}


@pytest.mark.parametrize("case", list(SIZE_CASES))
def test_comm_size_follows_one_rule_per_collective_type(tmp_path, case):
    nodes, comm_type, size = SIZE_CASES[case]
    result = convert(write_json(tmp_path / "et.json", host_doc(nodes)), rank=0)
    (comm,) = _comm_nodes(result.nodes)
    assert (NodeView(comm).int("comm_type"), NodeView(comm).int("comm_size")) == (comm_type, size)
    assert result.summary.warnings == []


def test_an_underivable_comm_size_is_a_warning(tmp_path):
    """Only an all-gather's output, no group size anywhere: comm_size is the output, flagged."""
    nodes = [node(3, "c10d::allgather_", 2, [nested_list(F(16, 1), F(16, 2)), V([], "GenericList[]")])]
    result = convert(write_json(tmp_path / "et.json", host_doc(nodes)), rank=0)
    assert NodeView(_comm_nodes(result.nodes)[0]).int("comm_size") == 128
    (warning,) = result.summary.warnings
    assert "node 3 ('c10d::allgather_')" in warning and "only the output buffer (128 B)" in warning


def test_a_backend_scope_recorded_elsewhere_shadows_its_collective(tmp_path):
    """gloo records `gloo:all_reduce` from its worker thread under whatever scope was open,
    here an autograd scope, with an unrelated child: it is the all-reduce's, not a second one."""
    buffer = T(30, 31, [1024], device="cpu")
    tensors = ([buffer[0]], [buffer[1]], "GenericList[Tensor(float)]")
    nodes = [node(3, "c10d::allreduce_", 2, [tensors], [tensors]),
             node(4, "autograd::engine::evaluate_function: ReluBackward0", 2),
             node(5, "gloo:all_reduce", 4, [buffer]),
             node(6, "aten::threshold_backward", 5, [T(40, 41, [8], device="cpu")], [T(42, 43, [8], device="cpu")])]
    result = convert(write_json(tmp_path / "et.json", host_doc(nodes)), rank=0)
    assert [n.name for n in result.nodes] == ["c10d::allreduce_", "aten::threshold_backward"]
    assert result.summary.collectives == {"ALL_REDUCE": 1}
    assert NodeView(result.nodes[0]).int("comm_size") == 4096


def test_groups_spanning_an_8_rank_job_run_among_the_ranks_present(tmp_path):
    """Both ranks of an 8-rank job with a world group listing 0..7, a subgroup {0,1} and one
    {0,2,4,6}: world groups are written as 'every rank' and unused groups are left out, so 2
    ranks simulate; a collective in a group whose other members were not converted stops the
    simulation with a clear error."""
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": list(range(8)), "group_size": 8},
              {"pg_name": "1", "ranks": [0, 1], "group_size": 2},
              {"pg_name": "2", "ranks": [0, 2, 4, 6], "group_size": 4}]
    for rank in (0, 1):
        nodes = [pg_init(3, groups), *allreduce(10, 30, 31, 256, rank=rank),
                 *allreduce(20, 40, 41, 64, pg="1", rank=rank)]
        result = convert(write_json(tmp_path / f"et{rank}.json", host_doc(nodes)))
        assert result.rank == rank
        assert parse_pg_list(result.nodes[0].inputs.values) == [
            ProcessGroupEntry("0", ()), ProcessGroupEntry("1", (0, 1))]
        assert any("span the whole job (8 ranks)" in note for note in result.summary.notes)
        assert any("group(s) 2 defined but not used" in note for note in result.summary.notes)
        result.write(tmp_path / "job")
    results = simulate(manifest(str(tmp_path / "job"), ring_network(2)))
    assert [r["native"]["collectives"] for r in results["ranks"]] == [2, 2]
    with pytest.raises(SimulationError, match=r"communicator group '2' .* names rank\(s\) \[2, 4, 6\]"):
        nodes = [pg_init(3, groups), *allreduce(10, 30, 31, 256, pg="2")]
        for rank in (0, 1):
            write_as(convert(write_json(tmp_path / "sub.json", host_doc(nodes))), tmp_path / "sub", rank)
        simulate(manifest(str(tmp_path / "sub"), ring_network(2)))


def test_send_and_recv_become_point_to_point_nodes(tmp_path):
    buffer = T(30, 31, [512])
    tensors = ([buffer[0]], [buffer[1]], "GenericList[Tensor(float)]")
    sender = [node(3, "c10d::send", 2, [tensors, V("<Object>", "Object"), V(1, "Int"), V(5, "Int")])]
    receiver = [node(3, "c10d::recv_", 2, [tensors, V("<Object>", "Object"), V(0, "Int"), V(5, "Int")], [tensors])]
    for rank, nodes in enumerate((sender, receiver)):
        result = convert(write_json(tmp_path / f"p2p{rank}.json", host_doc(nodes)), rank=rank)
        (p2p,) = result.nodes
        view = NodeView(p2p)
        assert p2p.type == (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)[rank]
        assert (view.int("comm_src"), view.int("comm_dst"), view.int("comm_tag"), view.int("comm_size")) == (0, 1, 5, 2048)
        result.write(tmp_path / "p2p")
    results = simulate(manifest(str(tmp_path / "p2p"), ring_network(2)))
    assert results["ranks"][0]["comm_bytes_by_type"] == {"SEND": 2048}
    assert results["ranks"][1]["comm_bytes_by_type"] == {"RECV": 2048}


# Kineto, cycles -------------------------------------------------------------------------------
def kineto_doc(events: list[dict], **top) -> dict:
    return {"schemaVersion": 1, "traceEvents": events, **top}


def cpu_event(name, ts, dur, ext, tid=100):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"External id": ext}}


def launch(kernel: str, ts: float, start: float, dur: float, corr: int, stream: int = 7, tid: int = 100):
    return [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid, "ts": ts,
             "dur": 2, "args": {"correlation": corr, "External id": corr}},
            {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": stream, "ts": start, "dur": dur,
             "args": {"correlation": corr, "stream": stream, "External id": corr}}]


def test_a_dependency_cycle_is_broken_with_a_warning_naming_the_nodes(tmp_path):
    """Kernel k2 of the op that reads a's output started on the stream before a's kernel k1:
    data (k1 -> k2) and stream order (k2 -> k1) form a cycle; the edge closing it is dropped."""
    x, y = T(30, 30, [64]), T(31, 31, [64])
    host = write_json(tmp_path / "et.json", host_doc([node(3, "aten::neg", 2, [x], [y]),
                                                      node(4, "aten::exp", 2, [y], [T(32, 32, [64])])]))
    kineto = write_json(tmp_path / "kineto.json", kineto_doc(
        [cpu_event("aten::neg", 10, 10, 1), cpu_event("aten::exp", 30, 10, 2)]
        + launch("k1", 12, 100, 5, 900) + launch("k2", 32, 50, 5, 901)))
    result = convert(host, kineto)
    assert result.summary.cycles_broken == 1
    (warning,) = result.summary.warnings
    assert "dependency cycle broken" in warning and "(k1)" in warning and "(k2)" in warning
    for _ in range(2):   # and deterministically so
        assert convert(host, kineto).nodes == result.nodes
    _check_graph(result.write(tmp_path / "cycle"))


def test_dependencies_break_cycles_in_node_id_order():
    deps = Dependencies()
    for _ in range(4):
        deps.add_node()
    deps.control(1, 0)
    deps.datum(2, 1)
    deps.control(0, 2)       # closes 0 -> 1 -> 2 -> 0
    deps.datum(3, 3)         # self edge ignored
    deps.control(3, 2)
    deps.datum(3, 2)         # both kinds: kept once, as data
    (broken,) = deps.break_cycles()
    assert broken.dropped == (0, 2) and broken.cycle == (0, 1, 2)
    assert [deps.final(n) for n in range(4)] == [([], []), ([0], []), ([], [1]), ([], [2])]
    assert deps.edge_counts() == (1, 2)


def test_kineto_rank_and_process_groups_are_used(tmp_path):
    nodes = [node(3, "aten::neg", 2, [T(1, 1, [4])], [T(2, 2, [4])]), *allreduce(10, 2, 2, 4),
             *allreduce(20, 2, 2, 4, pg="5")]
    host = write_json(tmp_path / "et.json", host_doc(nodes))
    kineto = write_json(tmp_path / "k.json", kineto_doc(
        [cpu_event("aten::neg", 10, 10, 1)],
        distributedInfo={"rank": 3, "world_size": 4, "pg_config": [{"pg_name": "0", "ranks": [0, 1, 2, 3]},
                                                                   {"pg_name": "5", "ranks": [2, 3]}]}))
    result = convert(host, kineto, rank=3)
    assert result.rank == 3
    warnings = "\n".join(result.summary.warnings)
    assert "(record_param_comms) says rank 0 but" in warnings
    assert parse_pg_list(result.nodes[0].inputs.values) == [ProcessGroupEntry("0", ()),
                                                             ProcessGroupEntry("5", (2, 3))]
    (neg,) = [n for n in result.nodes if n.name == "aten::neg"]
    assert (neg.duration_micros, neg.start_time_micros) == (10, 10)
    assert (result.summary.linked, result.summary.units) == (1, 3)
    assert result.write(tmp_path / "out").name == "out.3.et"


def test_a_trace_without_its_rank_needs_rank(ref_traces, tmp_path):
    """selfgen-cpu's host traces record no rank (their Kineto traces do): no guessing rank 0."""
    host = ref_traces / "pytorch" / "selfgen-cpu/host.1.json.gz"
    with pytest.raises(ConversionError, match=r"host.1.json.gz: the trace is one rank of a 2-rank job but "
                                              r"does not say which .*give it with --rank N"):
        convert(host)
    assert convert(host, rank=1).rank == 1
    result = CliRunner().invoke(convert_pytorch, [str(host), "-o", str(tmp_path / "t")])
    assert result.exit_code == 2 and "--rank N" in result.output and "Traceback" not in result.output
    assert not list(tmp_path.iterdir())


def test_rank_contradicting_the_trace_is_an_error(ref_traces, tmp_path):
    host = ref_traces / "pytorch" / "param/dlrm/dlrm_eg_1.json"
    with pytest.raises(ConversionError, match=r"--rank 0 contradicts .*dlrm_eg_1.json \(record_param_comms\), "
                                              r"which says rank 1"):
        convert(host, rank=0)
    assert convert(host, rank=1).rank == 1
    nodes = [*allreduce(10, 30, 31, 8)]
    kineto = write_json(tmp_path / "k.json", kineto_doc([], distributedInfo={"rank": 3, "world_size": 4}))
    with pytest.raises(ConversionError, match=r"--rank 1 contradicts .*k.json \(distributedInfo.rank\)"):
        convert(write_json(tmp_path / "et.json", host_doc(nodes)), kineto, rank=1)


def test_a_trace_without_communication_is_a_one_rank_job(tmp_path):
    result = convert(write_json(tmp_path / "et.json", host_doc([node(3, "aten::neg", 2, [T(1, 1, [4])],
                                                                     [T(2, 2, [4])])])))
    assert result.rank == 0
    assert any("records no rank and no communication" in note for note in result.summary.notes)


def test_a_kineto_trace_of_another_run_is_flagged(tmp_path):
    kineto = write_json(tmp_path / "k.json", kineto_doc([cpu_event("aten::conv2d", 10, 10, 1)]))
    summary = convert(HTA_HOST, kineto).summary
    assert summary.linked == 0
    assert any("only 0 of 16 host operators found in the Kineto trace" in w for w in summary.warnings)


# Malformed inputs -----------------------------------------------------------------------------
def test_truncated_json_is_a_clear_error(tmp_path):
    text = json.dumps(host_doc([node(3, "aten::neg", 2)]))
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ConversionError, match=r"cut.json: the host execution trace is not valid JSON.*truncated"):
        convert(path)
    gz = tmp_path / "cut.json.gz"
    gz.write_bytes(gzip.compress(text.encode())[:-20])
    with pytest.raises(ConversionError, match="corrupt or truncated gzip"):
        convert(gz)


def test_missing_nodes_is_a_clear_error(tmp_path):
    with pytest.raises(ConversionError, match="no 'nodes' key"):
        convert(write_json(tmp_path / "et.json", {"schema": "1.1.1-chakra.0.0.4"}))
    with pytest.raises(ConversionError, match="is this a Kineto trace"):
        convert(HTA_KINETO)
    with pytest.raises(ConversionError, match="'traceEvents' list"):
        convert(HTA_HOST, HTA_HOST)


def test_bad_nodes_are_skipped_with_warnings_naming_them(tmp_path):
    nodes = [node(3, "aten::neg", 2, [T(1, 1, [4])], [T(2, 2, [4])]),
             {"name": "aten::exp", "ctrl_deps": 2},                        # no id
             {"id": 5, "ctrl_deps": 2, "inputs": {"values": [1], "shapes": [], "types": []}},   # no name
             node(6, "aten::relu", 99),                                  # parent not in the trace
             node(3, "aten::sigmoid", 2)]                                # duplicate id
    result = convert(write_json(tmp_path / "et.json", host_doc(nodes)))
    warnings = "\n".join(result.summary.warnings)
    assert "nodes[3] ('aten::exp') has no integer 'id'" in warnings
    assert "node 5 has no 'name'" in warnings
    assert "node 5 (''): inputs have 1 values but 0 shapes" in warnings
    assert "node 6 ('aten::relu'): parent 99 is not in the trace" in warnings
    assert "duplicate id 3 ('aten::sigmoid'" in warnings
    assert [n.name for n in result.nodes] == ["aten::neg", "", "aten::relu"]


def test_schemas_old_and_unknown_newer(tmp_path):
    old = {"schema": "1.0.1", "nodes": [
        {"id": 1, "name": "[pytorch|profiler|execution_graph|process]", "parent": 1},
        {"id": 2, "name": "[pytorch|profiler|execution_graph|thread]", "parent": 1, "tid": 1},
        {"id": 3, "name": "aten::mm", "parent": 2, "rf_id": 1, "tid": 1, "op_schema": "",
         "inputs": [[1, 1, 0, 6, 4, "cuda:0"], [2, 2, 0, 6, 4, "cuda:0"]], "input_shapes": [[2, 3], [3, 2]],
         "input_types": ["Tensor(float)", "Tensor(float)"], "outputs": [[3, 3, 0, 4, 4, "cuda:0"]],
         "output_shapes": [[2, 2]], "output_types": ["Tensor(float)"]}]}
    result = convert(write_json(tmp_path / "old.json", old))
    assert result.summary.warnings == []
    (mm,) = result.nodes
    assert NodeView(mm).int("num_ops") == 24 and NodeView(mm).int("tensor_size") == 64
    newer = host_doc([node(3, "aten::mm", 2, [T(1, 1, [2, 3]), T(2, 2, [3, 2])], [T(3, 3, [2, 2])])],
                     schema="1.3.0-chakra.0.0.5")
    result = convert(write_json(tmp_path / "new.json", newer))
    (warning,) = result.summary.warnings
    assert "schema '1.3.0-chakra.0.0.5' is newer" in warning
    assert NodeView(result.nodes[0]).int("num_ops") == 24


# Command line ---------------------------------------------------------------------------------
def test_cli_converts_and_prints_a_summary(tmp_path):
    result = CliRunner().invoke(convert_pytorch, [str(HTA_HOST), "--kineto", str(HTA_KINETO),
                                                  "--output", str(tmp_path / "out" / "hta")])
    assert result.exit_code == 0, result.output
    assert "rank 0: 20 nodes (16 COMP_NODE (cpu), 4 COMP_NODE (gpu))" in result.output
    assert "linked: 16 of 16 host ops" in result.output and "4 of 4 GPU events" in result.output
    assert "communication: none" in result.output
    assert (tmp_path / "out" / "hta.0.et").is_file()


def test_cli_rank_option_names_the_file(tmp_path):
    result = CliRunner().invoke(convert_pytorch, [str(HTA_HOST), "-o", str(tmp_path / "t"), "--rank", "5"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "t.5.et").is_file()


def test_cli_malformed_input_exits_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "1.0.1", "nodes": [')
    result = CliRunner().invoke(convert_pytorch, [str(bad), "-o", str(tmp_path / "t")])
    assert result.exit_code == 2
    assert "error:" in result.output and "bad.json" in result.output and "truncated" in result.output
    assert "Traceback" not in result.output
    missing = CliRunner().invoke(convert_pytorch, [str(tmp_path / "nope.json"), "-o", str(tmp_path / "t")])
    assert missing.exit_code == 2 and "cannot read the host execution trace" in missing.output


# Waits for the device -----------------------------------------------------------------------
def sync_call(name: str, ts: float, dur: float, corr: int, tid: int = 100) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def test_a_blocking_call_keeps_only_its_own_cost(tmp_path):
    """aten::exp launches a 400 us kernel; aten::item then blocks in cudaStreamSynchronize until
    it ends (at 510) and returns 5 us later. The wait (110 -> 510) leaves the CPU node; the
    dependency on the kernel re-creates it, so the run still takes the kernel's time."""
    x, y = T(30, 30, [64]), T(31, 31, [64])
    host = write_json(tmp_path / "et.json", host_doc([node(3, "aten::exp", 2, [x], [y]),
                                                      node(4, "aten::item", 2, [y], [])]))
    kineto = write_json(tmp_path / "kineto.json", kineto_doc(
        [cpu_event("aten::exp", 100, 8, 1), cpu_event("aten::item", 108, 409, 2)]
        + launch("k", 102, 110, 400, 900) + [sync_call("cudaStreamSynchronize", 110, 405, 901)]))
    result = convert(host, kineto)
    assert result.summary.waits_removed == 1 and result.summary.wait_removed_micros == 400
    item = next(n for n in result.nodes if n.name == "aten::item")
    kernel = next(n for n in result.nodes if n.name == "k")
    assert item.duration_micros == 9
    assert kernel.id in item.data_deps
    prefix = tmp_path / "sync"
    result.write(prefix)
    finish = simulate(manifest(str(prefix), ring_network(1)))["finish_ns"]
    # exp (8 us) launches the kernel (400 us); item (9 us) waits for it: 408 + 9 us, not 408 + 409.
    assert finish == (8 + 400 + 9) * 1000


def test_a_pageable_async_copy_is_a_wait_and_a_truly_async_one_is_not(tmp_path):
    def copy(call_dur: float) -> Conversion:
        host = write_json(tmp_path / "et.json", host_doc([node(3, "aten::copy_", 2, [T(30, 30, [64])],
                                                               [T(31, 31, [64], device="cpu")])]))
        kineto = write_json(tmp_path / "kineto.json", kineto_doc(
            [cpu_event("aten::copy_", 100, call_dur + 4, 1), sync_call("cudaMemcpyAsync", 101, call_dur, 900),
             {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": 0, "tid": 7,
              "ts": 102, "dur": 50, "args": {"correlation": 900, "stream": 7}}]))
        return convert(host, kineto)

    assert copy(60).summary.wait_removed_micros == 51       # returned after its copy ended at 152
    assert copy(3).summary.waits_removed == 0               # returned at 104, before the copy ended


def test_dlrm_waits_for_the_all_to_all_are_not_replayed_as_cpu_work(ref_traces):
    (host0, kineto0), (host1, kineto1) = DLRM
    rank1 = converted(ref_traces / "pytorch" / host1, ref_traces / "pytorch" / kineto1).summary
    rank0 = converted(ref_traces / "pytorch" / host0, ref_traces / "pytorch" / kineto0).summary
    assert (rank0.waits_removed, rank0.wait_removed_micros) == (10, 1_982)
    assert (rank1.waits_removed, rank1.wait_removed_micros) == (10, 7_457)   # 6,555 us in one aten::copy_
    assert rank1.cpu_micros == 6_059                       # was 13,516 with the waits


def test_the_sample_output_in_the_docs_is_what_the_converter_prints(tmp_path):
    root = Path(__file__).resolve().parents[1]
    dlrm = root / "examples" / "pytorch" / "dlrm"
    result = CliRunner().invoke(convert_pytorch, [
        str(dlrm / "dlrm_eg_0.json.gz"), "--kineto", str(dlrm / "worker0_step_12.1694128201545.pt.trace.json.gz"),
        "--output", str(tmp_path / "dlrm")])
    assert result.exit_code == 0, result.output
    printed = result.output.replace(str(tmp_path / "dlrm"), "traces/dlrm")
    assert f"```\n{printed}```" in (root / "docs" / "converter.md").read_text(encoding="utf-8"), \
        "docs/converter.md: paste the converter's output again:\n" + printed


def test_an_uneven_all_to_all_keeps_its_pieces(tmp_path):
    """all_to_all_single with split sizes: record_param_comms' in_split_size / out_split_size
    (elements per member) become comm_send_splits / comm_recv_splits in bytes; their sum is the
    send buffer, comm_size. Pieces that do not add up to it are left out, with a warning."""
    nodes, _, _ = SIZE_CASES["uneven all_to_allv: the send buffer"]
    comm = NodeView(_comm_nodes(convert(write_json(tmp_path / "et.json", host_doc(nodes)), rank=0).nodes)[0])
    assert (comm.raw("comm_send_splits"), comm.raw("comm_recv_splits")) == ([400, 800], [1000, 1000])
    assert sum(comm.raw("comm_send_splits")) == comm.int("comm_size")
    bad = [nodes[0], rpc(4, 3, "all_to_allv", F(300, 2), F(500, 1), collective_name="all_to_allv", dtype="Float",
                         in_msg_nelems=300, out_msg_nelems=500, in_split_size="[100, 100]",
                         out_split_size="[250, 250]", pg_size=2)]
    result = convert(write_json(tmp_path / "bad.json", host_doc(bad)), rank=0)
    assert not NodeView(_comm_nodes(result.nodes)[0]).has("comm_send_splits")
    (warning,) = result.summary.warnings
    assert "split sizes (2 pieces summing to 800 B) do not describe its send buffer of 1,200 B" in warning
