"""`chakra-sim generate`: collective microbenchmarks and the transformer front over `generate job`."""

from __future__ import annotations

import gzip
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
from chakra_core.tools.generate import (generate, microbenchmark_traces, transformer_job,
                                        write_microbenchmark)
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


# Transformer: a front over generate job ---------------------------------------------------------------------
SMALL = ["--layers", "4", "--hidden", "64", "--heads", "4", "--seq", "32", "--vocab", "256", "--batch", "8"]


def test_the_flags_map_to_a_gpt_job():
    job = transformer_job(layers=4, hidden=64, heads=4, seq=32, batch=16, vocab=256, dtype="fp16", dp=2, tp=2, pp=2,
                          sp=True, microbatches=4, dp_reduce="rs-ag", grad_dtype="bf16")
    assert job == {
        "model": {"layers": 4, "hidden": 64, "ffn_hidden": 256, "heads": 4, "vocab": 256, "max_seq": 32, "mlp": "gelu",
                  "norm": "layernorm", "position": "learned", "tied_embeddings": True, "bias": True},
        "parallel": {"tp": 2, "pp": 2, "sp": True},
        "training": {"seq": 32, "global_batch": 16, "micro_batch": 2, "precision": "fp16",
                     "distributed_optimizer": True, "grad_reduce_dtype": "bf16"},
        "cluster": {"gpus": 8, "profile": "h100-sxm-hgx"}, "tensors": True}
    plain = transformer_job(layers=4, hidden=64, heads=4, seq=32, batch=8, vocab=256, pp=2, ffn_hidden=100)
    assert plain["training"] == {"seq": 32, "global_batch": 8, "micro_batch": 4, "precision": "bf16",
                                 "distributed_optimizer": False}   # one micro-batch per stage; all-reduce
    assert plain["model"]["ffn_hidden"] == 100 and plain["parallel"] == {"tp": 1, "pp": 2, "sp": False}


@pytest.mark.parametrize("flags, options", [
    (["--dp", "2", "--tp", "2", "--pp", "2", "--sp", "--dp-reduce", "rs-ag"],
     ["--gpus", "8", "--tp", "2", "--pp", "2", "--sp", "--micro-batch", "2", "--distributed-optimizer"]),
    (["--dp", "2", "--pp", "2", "--microbatches", "4", "--dtype", "fp16", "--grad-dtype", "bf16"],
     ["--gpus", "4", "--pp", "2", "--micro-batch", "1", "--precision", "fp16", "--no-sp",
      "--no-distributed-optimizer", "--set", "training.grad_reduce_dtype=bf16"]),
])
def test_the_front_writes_what_generate_job_writes(tmp_path, flags, options):
    front = run_cli("transformer", *SMALL, *flags, "--output", str(tmp_path / "front" / "gpt"))
    assert front.exit_code == 0, front.output
    shape = {"layers": 4, "hidden": 64, "ffn_hidden": 256, "heads": 4, "vocab": 256, "max_seq": 32, "mlp": "gelu",
             "norm": "layernorm", "position": "learned", "tied_embeddings": True, "bias": True}
    (tmp_path / "gpt.yaml").write_text(yaml.safe_dump(shape))
    job = run_cli("job", "--model-file", str(tmp_path / "gpt.yaml"), "--profile", "h100-sxm-hgx", "--seq", "32",
                  "--global-batch", "8", "--set", "tensors=true", *options, "--output", str(tmp_path / "job" / "gpt"))
    assert job.exit_code == 0, job.output
    assert front.output.replace(str(tmp_path / "front"), str(tmp_path / "job")) == job.output
    fronts = sorted((tmp_path / "front").glob("gpt.*.et"))
    assert len(fronts) == int(options[1])
    for path in fronts:
        assert path.read_bytes() == (tmp_path / "job" / path.name).read_bytes()
    assert any(node.outputs.values for node in read_trace(fronts[0]).nodes)   # tensors listed, as before


def test_the_front_compresses_and_is_deterministic(tmp_path):
    for out in ("a", "b"):
        assert run_cli("transformer", *SMALL, "--tp", "2", "--output", str(tmp_path / out / "gpt")).exit_code == 0
    result = run_cli("transformer", *SMALL, "--tp", "2", "--compress", "--output", str(tmp_path / "z" / "gpt"))
    assert result.exit_code == 0, result.output
    for rank in (0, 1):
        plain = (tmp_path / "a" / f"gpt.{rank}.et").read_bytes()
        assert plain == (tmp_path / "b" / f"gpt.{rank}.et").read_bytes()
        assert gzip.decompress((tmp_path / "z" / f"gpt.{rank}.et").read_bytes()) == plain


@pytest.mark.parametrize("args, message", [
    (["--schedule", "gpipe"], "Megatron-LM has no GPipe schedule"),
    (["--dtype", "fp32"], "bf16 or fp16"),
    (["--grad-dtype", "fp16"], "fp32 (Megatron's default) or bf16"),
    (["--peak-tflops", "312"], "the traces carry no duration estimates"),
    (["--mem-bw-gbps", "2039"], "compute layer times their kernels"),
    (["--heads", "3"], "hidden 64 is not divisible by heads 3"),
    (["--tp", "8"], "tp 8 must divide the attention heads (4)"),
    (["--pp", "3", "--batch", "9"], "layers 4 are not divisible by pp x vp = 3"),
    (["--dp", "2", "--pp", "2", "--batch", "6"], "--batch 6 is not divisible by --dp 2 x 2 micro-batches"),
    (["--sp", "--tp", "4", "--seq", "6"], "seq / cp = 6 divisible by tp 4"),
    (["--layers", "0"], "--layers"),
])
def test_bad_or_refused_flags_say_what_to_use(tmp_path, args, message):
    base = dict(zip(SMALL[::2], SMALL[1::2]))
    flags: list[str] = []
    for i, arg in enumerate(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            base[arg] = args[i + 1]
        elif arg.startswith("--"):
            flags.append(arg)
    result = run_cli("transformer", *[x for kv in base.items() for x in kv], *flags, "--output", str(tmp_path / "g"))
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output and not list(tmp_path.glob("g*"))


def test_the_fronts_traces_simulate_with_roofline_hbm_and_a_network(tmp_path):
    assert run_cli("transformer", *SMALL, "--dp", "2", "--tp", "2", "--pp", "2", "--sp",
                   "--output", str(tmp_path / "gpt")).exit_code == 0
    data = manifest(str(tmp_path / "gpt"), ring_network(8), system={},
                    compute={"plugin": "roofline", "peak_tflops": 100},
                    memory={"plugin": "hbm", "bandwidth_gbps": 1500})
    host = make_plugin_host()
    results = simulate_run(load_config(data, host, base_dir=tmp_path, name="test"), host).document
    assert results["warnings"] == []
    assert results["layers"]["system"]["summary"]["unmatched_sends"] == []
    assert results["layers"]["memory"]["summary"]["ranks_without_tensors"] == []
    for rank, nodes in enumerate(load(tmp_path / "gpt", 8)):
        sends = sum(n.type == pb.COMM_SEND_NODE for n in nodes)
        assert results["ranks"][rank]["node_counts"].get("COMM_SEND_NODE", 0) == sends
