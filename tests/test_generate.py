"""`chakra-sim generate`: collective microbenchmarks and Megatron-style transformer traces."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from chakra_core.et.attrs import NodeView
from chakra_core.et.io import read_trace
from chakra_core.run import load as load_config
from chakra_core.run import simulate as simulate_run
from chakra_core.plugins import make_plugin_host
from chakra_core.schema import pb
from chakra_core.tools.generate import (GeneratorError, TransformerConfig, generate, microbenchmark_traces,
                                        transformer_traces, write_microbenchmark, write_transformer)
from tests.helpers import REF_TRACES
from tests.simhelpers import hop_ns, manifest, ring_network, simulate

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run_cli(*args: str):
    return CliRunner().invoke(generate, list(args))


def load(prefix: Path, npus: int) -> list[list[pb.Node]]:
    return [read_trace(f"{prefix}.{rank}.et").nodes for rank in range(npus)]


# Microbenchmarks ------------------------------------------------------------------------------------------
def test_all_reduce_matches_astra_sim_files_and_its_64440_ns(tmp_path):
    result = run_cli("microbenchmark", "--collective", "all_reduce", "--size", "1048576", "--npus", "8",
                     "--output", str(tmp_path / "all_reduce"))
    assert result.exit_code == 0, result.output
    shipped = EXAMPLES / "traces" / "all_reduce_8npus_1MB"
    for rank in range(8):
        assert (tmp_path / f"all_reduce.{rank}.et").read_bytes() == \
            (shipped / f"all_reduce.{rank}.et").read_bytes()
    # the settings of examples/allreduce_8npu.yaml, run on the generated files
    data = yaml.safe_load((EXAMPLES / "allreduce_8npu.yaml").read_text())
    data["workload"]["trace"] = str(tmp_path / "all_reduce")
    data.pop("output", None)
    results = simulate(data, base_dir=EXAMPLES)
    assert results["finish_ns"] == 64440
    assert [row["finish_ns"] for row in results["ranks"]] == [64440] * 8


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter", "all_to_all"])
@pytest.mark.parametrize("npus", [4, 8, 16])
def test_collectives_match_astra_sim_microbenchmarks(ref_traces, tmp_path, collective, npus):
    write_microbenchmark(tmp_path / collective, collective, 1 << 20, npus)
    reference = REF_TRACES / "astra-microbenchmarks" / collective / f"{npus}npus_1MB"
    for rank in range(npus):
        assert (tmp_path / f"{collective}.{rank}.et").read_bytes() == \
            (reference / f"{collective}.{rank}.et").read_bytes()


@pytest.mark.parametrize("collective, comm_type", [
    ("all_reduce", pb.ALL_REDUCE), ("all_gather", pb.ALL_GATHER), ("reduce_scatter", pb.REDUCE_SCATTER),
    ("all_to_all", pb.ALL_TO_ALL), ("broadcast", pb.BROADCAST), ("reduce", pb.REDUCE),
    ("gather", pb.GATHER), ("scatter", pb.SCATTER), ("barrier", pb.BARRIER)])
def test_every_collective_generates_and_simulates(tmp_path, collective, comm_type):
    args = ["microbenchmark", "--collective", collective, "--npus", "4", "--iterations", "3",
            "--root", "2", "--output", str(tmp_path / "c")]
    if collective != "barrier":
        args += ["--size", "65536"]
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    ranks = load(tmp_path / "c", 4)
    for rank, nodes in enumerate(ranks):
        assert [n.id for n in nodes] == [rank, 4 + rank, 8 + rank]
        assert [list(n.data_deps) for n in nodes] == [[], [rank], [4 + rank]]
        for node in nodes:
            view = NodeView(node)
            assert node.type == pb.COMM_COLL_NODE and not view.is_cpu_op
            assert view.int("comm_type") == comm_type
            assert view.int("comm_size") == (0 if collective == "barrier" else 65536)
            assert view.int("root_rank", None) == (2 if collective in ("broadcast", "reduce", "gather",
                                                                        "scatter") else None)
    iterations = 3
    results = simulate(manifest(str(tmp_path / "c"), ring_network(4), system={}))
    assert results["finish_ns"] > 0
    assert [row["node_counts"] for row in results["ranks"]] == [{"COMM_COLL_NODE": iterations}] * 4
    assert [row["native"]["collectives"] for row in results["ranks"]] == [iterations] * 4


ROOTED_COLLECTIVES = ("broadcast", "reduce", "gather", "scatter")


@pytest.mark.parametrize("collective", ROOTED_COLLECTIVES)
def test_repeated_rooted_collectives_simulate(tmp_path, collective):
    write_microbenchmark(tmp_path / "c", collective, 65536, 4, iterations=2, root=0)
    results = simulate(manifest(str(tmp_path / "c"), ring_network(4), system={}))
    assert [row["native"]["collectives"] for row in results["ranks"]] == [2] * 4


def test_send_recv_patterns(tmp_path):
    def messages(nodes, node_type):
        return sorted((NodeView(n).int("comm_src"), NodeView(n).int("comm_dst"), NodeView(n).int("comm_tag"))
                      for n in nodes if n.type == node_type)

    ring = microbenchmark_traces("send_recv", 4096, 4, iterations=2)
    assert messages(ring[1], pb.COMM_SEND_NODE) == [(1, 2, 0), (1, 2, 1)]
    assert messages(ring[1], pb.COMM_RECV_NODE) == [(0, 1, 0), (0, 1, 1)]
    second_send = [n for n in ring[1] if n.name == "send.1.0.to2"][0]
    assert sorted(second_send.data_deps) == [0, 1]       # after the first iteration's send and receive
    shifted = microbenchmark_traces("send_recv", 4096, 4, pattern="ring", shift=-1)
    assert messages(shifted[1], pb.COMM_SEND_NODE) == [(1, 0, 0)]
    pairs = microbenchmark_traces("send_recv", 4096, 4, pattern="pairwise")
    assert messages(pairs[2], pb.COMM_SEND_NODE) == [(2, 3, 0)]
    assert messages(pairs[2], pb.COMM_RECV_NODE) == [(3, 2, 0)]
    every = microbenchmark_traces("send_recv", 4096, 4, pattern="all-pairs")
    assert messages(every[0], pb.COMM_SEND_NODE) == [(0, 1, 0), (0, 2, 1), (0, 3, 2)]
    assert messages(every[0], pb.COMM_RECV_NODE) == [(1, 0, 2), (2, 0, 1), (3, 0, 0)]


@pytest.mark.parametrize("pattern, hops", [("ring", 1), ("pairwise", 1)])
def test_send_recv_simulates_to_one_message_time(tmp_path, pattern, hops):
    size = 1 << 20
    write_microbenchmark(tmp_path / "p", "send_recv", size, 8, pattern=pattern)
    results = simulate(manifest(str(tmp_path / "p"), ring_network(8), system={}))
    assert results["finish_ns"] == hop_ns(size, hops=hops)
    assert results["layers"]["system"]["summary"]["unmatched_sends"] == []
    write_microbenchmark(tmp_path / "q", "send_recv", size, 8, pattern="all-pairs", iterations=2)
    results = simulate(manifest(str(tmp_path / "q"), ring_network(8), system={}))
    assert results["layers"]["system"]["summary"]["unmatched_sends"] == []
    # 2 iterations x 7 rounds, each as slow as its farthest message (4 hops on the 8-ring)
    farthest = [min(k, 8 - k) for k in range(1, 8)]
    assert results["finish_ns"] == 2 * sum(hop_ns(size, hops=h) for h in farthest)


@pytest.mark.parametrize("args, message", [
    (["--collective", "all_reduce", "--npus", "4"], "all_reduce needs --size BYTES"),
    (["--collective", "barrier", "--size", "8", "--npus", "4"], "a barrier moves no data: drop --size 8"),
    (["--collective", "broadcast", "--size", "8", "--npus", "4", "--root", "4"], "--root 4 is not a rank"),
    (["--collective", "send_recv", "--size", "8", "--npus", "5", "--pattern", "pairwise"],
     "needs an even number of NPUs"),
    (["--collective", "send_recv", "--size", "8", "--npus", "4", "--shift", "4"], "to itself"),
])
def test_microbenchmark_errors(tmp_path, args, message):
    result = run_cli("microbenchmark", *args, "--output", str(tmp_path / "x"))
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("collective, sent", [
    # ring, N = 4, --size 4096 (docs/collectives.md): all-gather N-1 steps of the whole input;
    # reduce-scatter N-1 steps of input/N; all-reduce both; all-to-all N(N-1)/2 steps of input/N
    ("all_gather", 3 * 4096), ("reduce_scatter", 3 * 1024), ("all_reduce", 6 * 1024), ("all_to_all", 6 * 1024)])
def test_microbenchmark_size_is_each_ranks_input(tmp_path, collective, sent):
    write_microbenchmark(tmp_path / "c", collective, 4096, 4)
    assert {NodeView(n).int("comm_size") for nodes in load(tmp_path / "c", 4) for n in nodes} == {4096}
    results = simulate(manifest(str(tmp_path / "c"), ring_network(4), system={}))
    assert [(r["bytes_sent"], r["bytes_received"]) for r in results["ranks"]] == [(sent, sent)] * 4


def test_microbenchmark_is_deterministic(tmp_path):
    for out in ("a", "b"):
        write_microbenchmark(tmp_path / out / "p", "send_recv", 512, 6, iterations=3, pattern="all-pairs")
    assert [(tmp_path / "a" / f"p.{r}.et").read_bytes() for r in range(6)] == \
        [(tmp_path / "b" / f"p.{r}.et").read_bytes() for r in range(6)]


# Transformer: FLOPs -------------------------------------------------------------------------------------
def comp_nodes(ranks):
    """The kernels (COMP nodes with num_ops; not the 0 ns model_state node)."""
    for nodes in ranks:
        for node in nodes:
            if node.type == pb.COMP_NODE and NodeView(node).has("num_ops"):
                yield NodeView(node)


@pytest.mark.parametrize("sp", [False, True])
def test_flops_match_the_exact_formula_and_6PT(sp):
    L, h, a, s, B, V, f = 4, 256, 8, 128, 16, 1024, 1024
    dp, tp, pp, M = 2, 2, 2, 4
    cfg = TransformerConfig(layers=L, hidden=h, heads=a, seq=s, batch=B, vocab=V, dtype="bf16", dp=dp, tp=tp,
                            pp=pp, sp=sp, microbatches=M)
    ranks = transformer_traces(cfg)
    assert len(ranks) == dp * tp * pp
    ops = Counter()
    for view in comp_nodes(ranks):
        ops[view.str("kernel")] += view.int("num_ops")
    T = B * s                                       # tokens per iteration
    # matrix multiplications, forward per token: QKV 6h^2, projection 2h^2, MLP 2hf + 2fh,
    # attention scores and context 2sh each; LM head 2hV. Backward = 2 x forward.
    matmul = 3 * T * (L * (8 * h * h + 4 * h * f + 4 * s * h) + 2 * h * V)
    assert ops["gemm"] + ops["bmm"] == matmul
    assert ops["bmm"] == 3 * T * L * 4 * s * h
    # 6 x parameters x tokens: per layer QKV, proj, fc1, fc2 (+ biases), 2 layer norms; tied
    # embedding; final layer norm. The difference is the attention term s/(6h) less the bias and
    # layer-norm parameters, which do no matmul work: +7.3 % here (s / 6h = 8.3 %).
    params = L * (4 * h * h + 2 * h * f + 9 * h + f) + V * h + 2 * h
    six_pt = 6 * params * T
    assert abs(matmul / six_pt - 1) < 0.10
    assert matmul / six_pt - 1 == pytest.approx(
        (3 * T * L * 4 * s * h - 6 * T * (L * (9 * h + f) + 2 * h)) / six_pt, rel=1e-12)
    # elementwise kernels: one op per element; layer norms, residuals and the embedding run on every
    # TP rank for the whole sequence without SP, on a 1/tp shard with SP
    n = T                                           # summed over micro-batches and replicas
    replicas = 1 if sp else tp
    per_layer = 4 * replicas * n * h + a * s * n + n * f    # ln1, ln2, 2 residuals; softmax; gelu
    elementwise = 2 * (L * per_layer + replicas * n * h + n * V)   # + final LN, cross entropy; x2 bwd
    assert ops["elementwise"] == elementwise
    assert ops["embedding"] == 2 * tp * n * h
    # optimizer: 10 ops per parameter each rank holds (TP-replicated ones count on every rank)
    per_layer_rank = (3 * h * h + 3 * h) // tp + h * h // tp + h + (h * f + f) // tp + f * h // tp + h + 4 * h
    stage0 = L // pp * per_layer_rank + V // tp * h
    stage1 = L // pp * per_layer_rank + 2 * h + V // tp * h
    assert ops["optimizer"] == 10 * dp * tp * (stage0 + stage1)


def test_single_gpu_flops_without_pipeline_or_tensor_parallelism():
    L, h, a, s, B, V = 2, 64, 4, 32, 3, 100
    cfg = TransformerConfig(layers=L, hidden=h, heads=a, seq=s, batch=B, vocab=V, dtype="fp32")
    ranks = transformer_traces(cfg)
    assert len(ranks) == 1
    assert not [n for n in ranks[0] if n.type in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE,
                                                  pb.METADATA_NODE)]
    gemm = sum(v.int("num_ops") for v in comp_nodes(ranks) if v.str("kernel") in ("gemm", "bmm"))
    f = 4 * h
    assert gemm == 3 * B * s * (L * (8 * h * h + 4 * h * f + 4 * s * h) + 2 * h * V)
    qkv = NodeView([n for n in ranks[0] if n.name == "mb0.L1.qkv"][0])
    # [B*s, h] x [h, 3h] in fp32: 2mkn FLOPs; both operands and the result move once
    assert qkv.int("num_ops") == 2 * (B * s) * h * 3 * h
    assert qkv.int("tensor_size") == (B * s * h + h * 3 * h + B * s * 3 * h) * 4


# Transformer: communication volumes -------------------------------------------------------------------------
SMALL = dict(layers=2, hidden=8, heads=2, seq=4, batch=4, vocab=16, dtype="fp16", dp=2, tp=2, pp=2,
             microbatches=2)


def comm_summary(nodes: list[pb.Node]) -> Counter:
    """(kind, group family or peer, bytes) -> count for one rank."""
    groups = {}
    for node in nodes:
        if node.type == pb.METADATA_NODE:
            groups = {g["pg_name"]: g["ranks"] for g in json.loads(node.inputs.values)}
    out = Counter()
    for node in nodes:
        view = NodeView(node)
        if node.type == pb.COMM_COLL_NODE:
            name = view.str("pg_name")
            family = name.rstrip("0123456789")
            out[(pb.CollectiveCommType.Name(view.int("comm_type")), family, tuple(groups[name]),
                 view.int("comm_size"))] += 1
        elif node.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
            out[(pb.NodeType.Name(node.type), view.int("comm_src"), view.int("comm_dst"),
                 view.int("comm_size"))] += 1
    return out


def test_communication_volumes_without_sequence_parallelism():
    # L=2 h=8 a=2 s=4 V=16 f=32, fp16; dp=tp=pp=2, 2 micro-batches of b=1 sequence: n = 4 tokens.
    # Rank 0 = stage 0 / replica 0 / tp 0; rank 4 = stage 1 / replica 0 / tp 0.
    # Activation n*h*2 B = 64 B. Parameters per rank and layer: QKV (3*64+24)/2 = 108, proj 64/2 + 8
    # = 40, fc1 (256+32)/2 = 144, fc2 256/2 + 8 = 136, layer norms 32: 460. Embedding shard 16/2*8 = 64.
    ranks = transformer_traces(TransformerConfig(**SMALL))
    assert comm_summary(ranks[0]) == Counter({
        # per micro-batch: embedding + 2 forward (proj, fc2) + 2 backward (qkv, fc1) all-reduces
        ("ALL_REDUCE", "tp", (0, 1), 64): 10,
        ("ALL_REDUCE", "emb", (0, 4), 128): 1,        # tied embedding gradients, 64 params
        ("ALL_REDUCE", "dp", (0, 2), 1048): 1,        # (460 + 64) params x 2 B
        ("COMM_SEND_NODE", 0, 4, 64): 2,              # activations of 2 micro-batches
        ("COMM_RECV_NODE", 4, 0, 64): 2,              # their gradients
    })
    assert comm_summary(ranks[4]) == Counter({
        # per micro-batch: 2 forward + 2 backward layer all-reduces + the LM head's backward one
        ("ALL_REDUCE", "tp", (4, 5), 64): 10,
        ("ALL_REDUCE", "tp", (4, 5), 16): 6,          # cross entropy: max, target, sum (fp32 x n)
        ("ALL_REDUCE", "emb", (0, 4), 128): 1,
        ("ALL_REDUCE", "dp", (4, 6), 1080): 1,        # (460 + final LN 16 + embedding copy 64) x 2 B
        ("COMM_RECV_NODE", 0, 4, 64): 2,
        ("COMM_SEND_NODE", 4, 0, 64): 2,
    })
    # the same volumes in every replica and TP rank of a stage
    assert comm_summary(ranks[3])[("ALL_REDUCE", "dp", (1, 3), 1048)] == 1
    assert comm_summary(ranks[7])[("ALL_REDUCE", "emb", (3, 7), 128)] == 1


def test_communication_volumes_with_sequence_parallelism_and_distributed_optimizer():
    ranks = transformer_traces(TransformerConfig(**SMALL, sp=True, dp_reduce="rs-ag"))
    # reduce-scatter inputs are n*h*2 = 64 B, all-gather inputs the 1/tp shard: 32 B
    assert comm_summary(ranks[0]) == Counter({
        # per micro-batch: embedding, proj, fc2 forward; qkv, fc1 backward
        ("REDUCE_SCATTER", "tp", (0, 1), 64): 10,
        # per micro-batch: ln1, ln2 forward; fc2 and proj output gradients, fc1 and qkv input
        # re-gathers for the weight gradients, embedding backward
        ("ALL_GATHER", "tp", (0, 1), 32): 14,
        ("ALL_REDUCE", "tp", (0, 1), 96): 1,          # layer-norm + row biases: 6h params x 2 B
        ("ALL_REDUCE", "emb", (0, 4), 128): 1,
        ("REDUCE_SCATTER", "dp", (0, 2), 1048): 1,    # 524 params (even) x 2 B
        ("ALL_GATHER", "dp", (0, 2), 524): 1,         # the updated half: 262 params x 2 B
        ("COMM_SEND_NODE", 0, 4, 32): 2,
        ("COMM_RECV_NODE", 4, 0, 32): 2,
    })
    assert comm_summary(ranks[4]) == Counter({
        ("REDUCE_SCATTER", "tp", (4, 5), 64): 10,     # proj, fc2 forward; qkv, fc1, lm head backward
        ("ALL_GATHER", "tp", (4, 5), 32): 16,         # ln1, ln2, final LN; 4 per layer; lm head re-gather
        ("ALL_REDUCE", "tp", (4, 5), 16): 6,
        ("ALL_REDUCE", "tp", (4, 5), 128): 1,         # (6h + final LN 2h) x 2 B
        ("ALL_REDUCE", "emb", (0, 4), 128): 1,
        ("REDUCE_SCATTER", "dp", (4, 6), 1080): 1,
        ("ALL_GATHER", "dp", (4, 6), 540): 1,
        ("COMM_RECV_NODE", 0, 4, 32): 2,
        ("COMM_SEND_NODE", 4, 0, 32): 2,
    })


def test_pipeline_schedules_order_micro_batches():
    cfg = TransformerConfig(**{**SMALL, "microbatches": 4, "dp": 1, "tp": 1, "batch": 4})

    def order(nodes):
        out = []
        for node in nodes:
            if node.name.endswith(".L0.ln1") or node.name.endswith(".L1.ln1"):
                out.append(("F", int(node.name[2:node.name.index(".")])))
            elif node.name.endswith(".ln1.bwd"):
                out.append(("B", int(node.name[2:node.name.index(".")])))
        return out

    one_f_one_b = transformer_traces(cfg)
    # stage 0 of 2: one warm-up forward, then alternate, then the last backward
    assert order(one_f_one_b[0]) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2),
                                     ("B", 3)]
    assert order(one_f_one_b[1]) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3),
                                     ("B", 3)]
    gpipe = transformer_traces(TransformerConfig(**{**SMALL, "microbatches": 4, "dp": 1, "tp": 1, "batch": 4,
                                                    "schedule": "gpipe"}))
    assert order(gpipe[0]) == [("F", m) for m in range(4)] + [("B", m) for m in range(4)]


# Transformer: simulation with every bundled plugin -----------------------------------------------------------
def roofline_ns(num_ops: int, tensor_size: int, peak_tflops: float, bandwidth_gbps: float) -> int:
    perf = min(peak_tflops * 1e12, bandwidth_gbps * 1e9 * num_ops / tensor_size)
    return int(num_ops / perf * 1e9)


@pytest.mark.parametrize("options", [
    dict(), dict(sp=True), dict(schedule="gpipe"), dict(dp_reduce="rs-ag", sp=True),
    dict(microbatches=4, batch=8, grad_dtype="fp32")])
def test_transformer_simulates_with_roofline_hbm_and_analytical(tmp_path, options):
    cfg = TransformerConfig(**{**SMALL, **options, "hidden": 64, "heads": 4, "seq": 32, "vocab": 256})
    write_transformer(tmp_path / "gpt", cfg)
    data = manifest(str(tmp_path / "gpt"), ring_network(8), system={},
                    compute={"plugin": "roofline", "peak_tflops": 100},
                    memory={"plugin": "hbm", "bandwidth_gbps": 1500})
    host = make_plugin_host()
    results = simulate_run(load_config(data, host, base_dir=tmp_path, name="test"), host).document
    assert results["warnings"] == []
    assert results["layers"]["compute"]["plugin"] == "roofline"
    assert results["layers"]["memory"]["plugin"] == "hbm"
    traces = load(tmp_path / "gpt", 8)
    for rank, nodes in enumerate(traces):
        # the roofline timed every generated kernel from num_ops / tensor_size (bandwidth from hbm)
        expected = sum(roofline_ns(v.int("num_ops"), v.int("tensor_size"), 100, 1500)
                       for v in comp_nodes([nodes]))
        assert results["ranks"][rank]["compute_ns"] == expected
        sends = sum(n.type == pb.COMM_SEND_NODE for n in nodes)
        assert results["ranks"][rank]["node_counts"].get("COMM_SEND_NODE", 0) == sends
        assert results["ranks"][rank]["finish_ns"] > expected
    assert results["layers"]["system"]["summary"]["unmatched_sends"] == []


@pytest.mark.parametrize("network", ["analytical", "congestion"])
def test_transformer_simulates_on_every_network_backend(tmp_path, network):
    host = make_plugin_host()
    if not any(row.layer == "network" and row.name == network and row.status == "ok"
               for row in host.listing(include_builtins=True)):
        pytest.skip(f"network plugin '{network}' is not installed")
    cfg = TransformerConfig(**{**SMALL, "hidden": 64, "heads": 4, "seq": 32, "vocab": 256, "sp": True})
    write_transformer(tmp_path / "gpt", cfg)
    net = {**ring_network(8), "plugin": network}
    data = manifest(str(tmp_path / "gpt"), net, system={}, compute={"plugin": "roofline", "peak_tflops": 100},
                    memory={"plugin": "hbm", "bandwidth_gbps": 1500})
    results = simulate_run(load_config(data, host, base_dir=tmp_path, name="test"), host).document
    assert results["layers"]["network"]["plugin"] == network
    assert results["warnings"] == [] and results["layers"]["system"]["summary"]["unmatched_sends"] == []
    colls = sum(n.type == pb.COMM_COLL_NODE for n in load(tmp_path / "gpt", 8)[0])
    assert results["ranks"][0]["native"]["collectives"] == colls


# Transformer: tensors and peak memory -------------------------------------------------------------------------
def peak_memory(tmp_path: Path, cfg: TransformerConfig) -> list[int]:
    """Each rank's peak from the hbm memory model (storage lifetimes over the whole trace)."""
    write_transformer(tmp_path / "gpt", cfg)
    results = simulate(manifest(str(tmp_path / "gpt"), ring_network(cfg.world), memory={"plugin": "hbm"}))
    assert results["warnings"] == []
    assert results["layers"]["memory"]["summary"]["ranks_without_tensors"] == []
    return [row["hbm"]["peak_memory_bytes"] for row in results["ranks"]]


def test_generated_gpt_peak_memory_matches_a_hand_count(tmp_path):
    """One GPU, 1 layer, h = 8, 2 heads, s = 4, one sequence (n = 4 tokens), V = 16, f = 32, bf16.

    Model state, live all iteration: 1,016 parameters (layer: QKV 3*64+24, proj 64+8, fc1 256+32,
    fc2 256+8, two layer norms 32 = 872; embedding 16*8 = 128; final layer norm 16) x (2 B weight
    + 2 B gradient + 12 B of Adam's fp32 master weight and moments) = 16,256 B.
    Activations the backward pass reads (2 B per element): layer input, ln1 output, context, x1,
    ln2 output, layer output, final LN output (nh = 32 each), QKV (3nh = 96), attention
    probabilities (b a s^2 = 32), fc1 and GELU outputs (nf = 128 each): 608 elements, 1,216 B.
    The peak is at the cross entropy: it reads the logits (nV = 64 elements, 128 B) and writes
    the fp32 softmax it keeps for its backward (256 B): 16,256 + 1,216 + 384 = 17,856 B."""
    cfg = TransformerConfig(layers=1, hidden=8, heads=2, seq=4, batch=1, vocab=16, dtype="bf16")
    h, n, f, V, b, a, s, e = 8, 4, 32, 16, 1, 2, 4, 2
    params = (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 4 * h + V * h + 2 * h
    assert params == cfg.model_params() == 1016
    state = params * (e + e + 12)
    saved = e * (7 * n * h + 3 * n * h + b * a * s * s + 2 * n * f)
    loss = e * n * V + 4 * n * V
    assert (state, saved, loss) == (16_256, 1_216, 384)
    assert peak_memory(tmp_path, cfg) == [state + saved + loss]
    model_state = transformer_traces(cfg)[0][0]
    assert model_state.name == "model_state" and model_state.duration_micros == 0
    assert "[1, 1, 0, 1016, 2, 'cuda:0']" in model_state.outputs.values   # the weight buffer


def test_pipeline_schedule_and_distributed_optimizer_move_the_peak_as_expected(tmp_path):
    """Stage 0 of 2 (one layer), 4 micro-batches of one sequence: n = 32 tokens, h = 64, a = 4,
    s = 32, f = 256, bf16. A micro-batch leaves 8nh + b a s^2 + 2nf = 36,864 elements (73,728 B)
    for its backward pass; 1F1B keeps pp - stage = 2 micro-batches in flight, GPipe all 4."""
    base = dict(layers=2, hidden=64, heads=4, seq=32, batch=4, vocab=256, dtype="bf16", pp=2, microbatches=4)
    one_f_one_b = peak_memory(tmp_path / "1f1b", TransformerConfig(**base))
    gpipe = peak_memory(tmp_path / "gpipe", TransformerConfig(**base, schedule="gpipe"))
    per_micro_batch = 2 * (8 * 32 * 64 + 1 * 4 * 32 * 32 + 2 * 32 * 256)
    assert per_micro_batch == 73_728
    assert gpipe[0] - one_f_one_b[0] == (4 - 2) * per_micro_batch
    # the distributed optimizer keeps Adam's 12 B per parameter for 1/dp of them
    plain = TransformerConfig(**{**base, "pp": 1, "dp": 2, "batch": 2, "microbatches": 1})
    sharded = TransformerConfig(**{**base, "pp": 1, "dp": 2, "batch": 2, "microbatches": 1, "dp_reduce": "rs-ag"})
    params = plain.stage_params_per_rank(0)
    assert params % 2 == 0
    assert [p - q for p, q in zip(peak_memory(tmp_path / "plain", plain),
                                  peak_memory(tmp_path / "sharded", sharded))] == [12 * params // 2] * 2


def test_transformer_output_is_deterministic_and_cli_reports(tmp_path):
    args = ["transformer", "--layers", "4", "--hidden", "64", "--heads", "4", "--seq", "16", "--batch", "8",
            "--vocab", "128", "--dtype", "bf16", "--dp", "2", "--tp", "2", "--pp", "2", "--sp"]
    outputs = []
    for out in ("a", "b"):
        result = run_cli(*args, "--output", str(tmp_path / out / "gpt"))
        assert result.exit_code == 0, result.output
        outputs.append([(tmp_path / out / f"gpt.{r}.et").read_bytes() for r in range(8)])
    assert outputs[0] == outputs[1]
    assert "8 ranks (dp 2 x tp 2 x pp 2, sp)" in result.output
    meta = read_trace(tmp_path / "a" / "gpt.0.et").metadata
    assert {a.name: a for a in meta.attr}["microbatches"].int64_val == 2


@pytest.mark.parametrize("args, message", [
    (["--heads", "3"], "--hidden 64 is not divisible by --heads 3"),
    (["--tp", "3", "--heads", "6", "--hidden", "66"], "--vocab 128 is not divisible by --tp 3"),
    (["--pp", "3"], "--layers 4 is not divisible by --pp 3"),
    (["--batch", "6", "--dp", "2"], "--batch 6 is not divisible by --dp 2 x 2 micro-batches"),
    (["--sp", "--tp", "4", "--seq", "6"], "--sp needs --seq 6 divisible by --tp 4"),
])
def test_transformer_configuration_errors(tmp_path, args, message):
    base = {"--layers": "4", "--hidden": "64", "--heads": "4", "--seq": "16", "--batch": "8",
            "--vocab": "128", "--pp": "2"}
    flags = []
    for i, arg in enumerate(args):
        if arg.startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            base[arg] = args[i + 1]
        elif arg.startswith("--") and (i + 1 == len(args) or args[i + 1].startswith("--")):
            flags.append(arg)
    cli = ["transformer"] + [x for kv in base.items() for x in kv] + flags + ["--output", str(tmp_path / "g")]
    result = run_cli(*cli)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    with pytest.raises(GeneratorError):
        TransformerConfig(layers=4, hidden=64, heads=3, seq=16, batch=8, vocab=128).check()
