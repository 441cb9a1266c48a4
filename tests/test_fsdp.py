"""Megatron-FSDP (`use_megatron_fsdp`, chakra_core.jobs.sharding / jobs.fsdp / plan.fsdp_memory):
the bytes ZeRO-3 gathers and reduce-scatters per step in closed form, memory never growing with
sharding where Megatron-FSDP's buffers stay small (and the cases where they do not), the settings
Megatron refuses or that are not modelled, and a simulated step end to end."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from chakra_core import run
from chakra_core.errors import ManifestError
from chakra_core.jobs.fsdp import ShardedRankProgram, rank_program
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.spec import DTYPE_BYTES, JobSpec
from chakra_core.plan.memory import predict_memory
from chakra_core.schema import pb

PROFILE = "h100-hgx-ndr400"
MODEL = {"layers": 4, "hidden": 512, "ffn_hidden": 1408, "heads": 8, "kv_heads": 4, "vocab": 8000}
STRATEGIES = ["no_shard", "optim", "optim_grads", "optim_grads_params"]


def job(model: Any = None, gpus: int = 4, parallel: dict[str, Any] | None = None, **training: Any) -> dict[str, Any]:
    return {"name": "fsdp", "model": model or dict(MODEL), "parallel": parallel or {},
            "training": {"seq": 512, "global_batch": 8, "use_megatron_fsdp": True, **training},
            "cluster": {"gpus": gpus, "profile": PROFILE}}


def collectives(data: dict[str, Any], rank: int = 0) -> list[tuple[str, int, int]]:
    """(name, comm_type, comm_size) of the rank's Megatron-FSDP collectives."""
    spec = JobSpec.model_validate(data)
    out = []
    for node in rank_program(spec, Placement(spec, 8), rank).build():
        if node.type == pb.COMM_COLL_NODE and ".fsdp." in f".{node.name}":
            attrs = {a.name: a for a in node.attr}
            out.append((node.name, attrs["comm_type"].int64_val, attrs["comm_size"].int64_val))
    return out


def shard(params: int, n: int) -> int:
    return -(-params // n)


# Bytes -------------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(layers=st.integers(1, 6), hidden=st.sampled_from([256, 512]), tp=st.sampled_from([1, 2]),
       dp=st.sampled_from([2, 4]), micro=st.integers(1, 4), grads=st.sampled_from(["fp32", "bf16"]),
       tied=st.booleans(), one_bucket=st.booleans())
def test_zero3_moves_the_closed_form_bytes(layers, hidden, tp, dp, micro, grads, tied, one_bucket):
    """Per rank and step, with optim_grads_params: every bucket is reduce-scattered once per
    micro-batch, the whole bucket in grad_reduce_dtype (m x the gradient bytes); the modules outside
    units (embedding, final norm, output layer: one bucket below the DDP bucket size) are gathered
    once, their shard in bf16. Each layer's shard is gathered twice per micro-batch: before its
    forward, and before its backward, which the final norm's forward pre-hook prefetches (with
    Megatron-FSDP's default 1e9-element unit the prefetch window spans these models). With a window
    of one bucket (suggested_communication_unit_size 2) the backward's first gather frees what the
    final norm prefetched, so the first layer is gathered a third time (two layers or more)."""
    model = {"layers": layers, "hidden": hidden, "ffn_hidden": 3 * hidden, "heads": 8, "kv_heads": 4, "vocab": 8000,
             "tied_embeddings": tied}
    data = job(model, tp * dp, {"tp": tp}, global_batch=dp * micro, grad_reduce_dtype=grads,
               **({"suggested_communication_unit_size": 2} if one_bucket else {}))
    spec = JobSpec.model_validate(data)
    m, h = spec.shape, hidden
    vocab_h = m.padded_vocab(tp) // tp * h
    unit = m.layer_params_on(tp)
    outside = vocab_h + (0 if tied else vocab_h) + h
    found = collectives(data)
    gathered = sum(size for name, kind, size in found if kind == pb.ALL_GATHER)
    reduced = sum(size for name, kind, size in found if kind == pb.REDUCE_SCATTER)
    extra = unit if one_bucket and layers >= 2 else 0
    assert gathered == 2 * shard(outside, dp) + micro * (2 * layers * 2 * shard(unit, dp) + 2 * shard(extra, dp))
    assert reduced == micro * (outside + layers * unit) * DTYPE_BYTES[grads]
    assert {kind for _, kind, _ in found} == {pb.ALL_GATHER, pb.REDUCE_SCATTER}


def test_the_strategies_communicate_as_megatron_fsdp_does():
    """no_shard all-reduces on the last micro-batch and gathers nothing; optim reduce-scatters on the
    last micro-batch and gathers each bucket once a step; optim_grads reduce-scatters every
    micro-batch; experts' buckets go over the expert data-parallel group."""
    counts = {}
    for strategy in STRATEGIES:
        found = collectives(job(global_batch=12, data_parallel_sharding_strategy=strategy))
        counts[strategy] = {kind: sum(1 for _, k, _ in found if k == kind)
                            for kind in (pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.ALL_REDUCE)}
    buckets = 1 + MODEL["layers"]     # the modules outside units, then one per layer
    assert counts["no_shard"] == {pb.ALL_GATHER: 0, pb.REDUCE_SCATTER: 0, pb.ALL_REDUCE: 1}
    assert counts["optim"] == {pb.ALL_GATHER: buckets, pb.REDUCE_SCATTER: buckets, pb.ALL_REDUCE: 0}
    assert counts["optim_grads"] == {pb.ALL_GATHER: buckets, pb.REDUCE_SCATTER: 3 * buckets, pb.ALL_REDUCE: 0}
    moe = {**MODEL, "num_experts": 8, "topk": 2, "moe_ffn_hidden": 512}
    spec = JobSpec.model_validate(job(moe, 8, {"ep": 4}))
    program = ShardedRankProgram(spec, Placement(spec, 8), 0)
    program.build()
    groups = {node.name: next(a.string_val for a in node.attr if a.name == "pg_name") for node in program.stream.nodes
              if node.type == pb.COMM_COLL_NODE and ".fsdp." in f".{node.name}"}
    assert groups["fsdp.all_gather.L0.experts"] == "edp0" and groups["fsdp.all_gather.L0"] == "dp_cp0"


def test_without_the_setting_the_program_and_echo_are_as_before():
    plain = job()
    del plain["training"]["use_megatron_fsdp"]
    spec = JobSpec.model_validate(plain)
    assert type(rank_program(spec, Placement(spec, 8), 0)) is RankProgram
    assert not {"use_megatron_fsdp", "data_parallel_sharding_strategy",
                "suggested_communication_unit_size"} & set(spec.model_dump()["training"])


# Memory ------------------------------------------------------------------------------------------
def totals(data: dict[str, Any]) -> list[int]:
    return [predict_memory(JobSpec.model_validate(
        {**data, "training": {**data["training"], "data_parallel_sharding_strategy": s}})).total for s in STRATEGIES]


@settings(max_examples=30, deadline=None)
@given(layers=st.sampled_from([4, 8, 16]), hidden=st.sampled_from([256, 1024]), vocab=st.sampled_from([8000, 64000]),
       dp=st.sampled_from([2, 4, 8]), tp=st.sampled_from([1, 2]), seq=st.sampled_from([256, 2048]),
       micro_batch=st.sampled_from([1, 2]), grads=st.sampled_from(["fp32", "bf16"]))
def test_sharding_never_increases_memory_when_the_buffers_stay_small(layers, hidden, vocab, dp, tp, seq,
                                                                     micro_batch, grads):
    """no_shard >= optim >= optim_grads >= optim_grads_params per GPU, when Megatron-FSDP's transient
    buffers stay small: suggested_communication_unit_size one layer (a bucket prefetched, a layer's
    gradients queued) and the layers outweighing the modules outside units, which optim_grads_params
    keeps gathered besides their shard (units x (N - 1) >= 2 N x outside)."""
    model = {"layers": layers, "hidden": hidden, "ffn_hidden": 3 * hidden, "heads": 8, "kv_heads": 4, "vocab": vocab}
    data = job(model, tp * dp, {"tp": tp}, seq=seq, global_batch=4 * dp * micro_batch, micro_batch=micro_batch,
               grad_reduce_dtype=grads)
    spec = JobSpec.model_validate(data)
    buckets = ShardedRankProgram(spec, Placement(spec, 8), 0).fsdp_buckets
    units, outside = (sum(b.params for b in buckets if b.in_unit == inside) for inside in (True, False))
    if units * (dp - 1) < 2 * dp * outside:
        return
    data["training"]["suggested_communication_unit_size"] = max(b.params for b in buckets if b.in_unit)
    memory = totals(data)
    assert memory == sorted(memory, reverse=True), memory


def test_megatron_fsdps_default_buffers_can_outweigh_what_sharding_saves():
    """With the default unit (1e9 elements) a small model's step holds every layer's unsharded
    gradient until its backward ends and ZeRO-3 prefetches every layer at the final norm: here
    ZeRO-2 needs more than ZeRO-1, and ZeRO-3 more than ZeRO-2 (Megatron-FSDP's mechanism, not a
    modelling artefact: the hbm layer's peak equals these predictions, test_fsdp_peak_is_the_prediction)."""
    data = job({**MODEL, "layers": 2, "hidden": 256, "ffn_hidden": 768}, 2, seq=256, global_batch=8)
    no_shard, optim, optim_grads, zero3 = totals(data)
    assert no_shard > optim < optim_grads < zero3


# Rules -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("training, parallel, model, message", [
    ({"use_megatron_fsdp": False, "data_parallel_sharding_strategy": "optim"}, {}, {},
     "training.data_parallel_sharding_strategy needs training.use_megatron_fsdp"),
    ({"distributed_optimizer": False}, {}, {}, "runs the distributed optimizer"),
    ({"data_parallel_sharding_strategy": "optim_grads", "overlap_grad_reduce": False}, {}, {},
     "Megatron-FSDP forces overlap_grad_reduce on"),
    ({"overlap_param_gather": False}, {}, {}, "Megatron-FSDP forces overlap_param_gather on"),
    ({}, {"pp": 2}, {}, "use_megatron_fsdp with parallel.pp > 1 is not modelled"),
    ({"recompute": "full"}, {}, {}, "recompute full with optim_grads_params"),
    ({}, {}, {"mtp_num_layers": 1}, "model.mtp_num_layers is not modelled"),
    ({}, {"ep": 4, "pp": 2, "vp": 2, "overlap_moe_expert_parallel_comm": True},
     {"num_experts": 8, "topk": 2, "moe_ffn_hidden": 512}, "overlap_moe_expert_parallel_comm"),
])
def test_refused_settings_say_why(training, parallel, model, message):
    with pytest.raises(ValidationError, match=message):
        JobSpec.model_validate(job({**MODEL, **model}, 8, parallel, **training))


def test_a_refusal_names_the_key_in_a_manifest(tmp_path):
    with pytest.raises(ManifestError) as caught:
        run.load({"job": job(overlap_param_gather=False), "compute": {"plugin": "achievable"},
                  "system": {"plugin": "nccl"}, "output": {"dir": str(tmp_path)}}, base_dir=tmp_path)
    assert "job" in str(caught.value) and "Megatron-FSDP forces overlap_param_gather on" in str(caught.value)


# A simulated step ---------------------------------------------------------------------------------
def simulate(tmp_path: Path, data: dict[str, Any], memory: bool = False) -> dict[str, Any]:
    manifest = {"job": copy.deepcopy(data), "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"},
                "output": {"dir": str(tmp_path)}, **({"memory": {"plugin": "hbm"}} if memory else {})}
    return run.simulate(run.load(manifest, base_dir=tmp_path)).document


def test_a_zero3_step_runs_end_to_end(tmp_path):
    """Through chakra_core.run with achievable compute and NCCL: the step takes longer than the same
    job's ZeRO-1 (two gathers of every layer per micro-batch instead of one per step, on 2 nodes),
    the data-parallel part of it shows, and the layout is echoed."""
    data = job(model="llama3-8b", gpus=16, parallel={"tp": 2}, seq=1024, global_batch=16)
    zero3 = simulate(tmp_path / "zero3", data)
    zero1 = simulate(tmp_path / "zero1", {**data, "training": {**data["training"],
                                                               "data_parallel_sharding_strategy": "optim"}})
    step = zero3["training"]["step_time_s"]
    assert 0 < zero1["training"]["step_time_s"] < step
    assert zero3["training"]["breakdown_s"]


FSDP_MEMORY_CASES = {
    "zero3-default-window": job(),
    "zero3-one-bucket-window-tp2-cp2-fp8": job(gpus=8, parallel={"tp": 2, "cp": 2}, precision="fp8",
                                               global_batch=16, suggested_communication_unit_size=2),
    "zero3-bf16-grads-dropout-mbs2": job(grad_reduce_dtype="bf16", micro_batch=2, global_batch=16, dropout=0.1,
                                         suggested_communication_unit_size=5_000_000),
    "zero2-full-recompute": job(gpus=4, data_parallel_sharding_strategy="optim_grads", recompute="full",
                                suggested_communication_unit_size=3_000_000),
    "zero1-no-overlap": job(data_parallel_sharding_strategy="optim", overlap_grad_reduce=False,
                            overlap_param_gather=False),
    "no-shard": job(data_parallel_sharding_strategy="no_shard"),
    "zero3-fp8-params-tp2-cp2": job(gpus=8, parallel={"tp": 2, "cp": 2}, precision="fp8", fp8_recipe="current",
                                    fp8_param_gather=True, global_batch=16, suggested_communication_unit_size=2),
    "zero3-fp8-params-moe": job({**MODEL, "num_experts": 8, "topk": 2, "moe_ffn_hidden": 512}, 8, {"ep": 4},
                                precision="fp8", fp8_param_gather=True, global_batch=16),
}


@pytest.mark.parametrize("case", sorted(FSDP_MEMORY_CASES))
def test_fsdp_peak_is_the_prediction(tmp_path, case):
    """The hbm layer following the traces' tensors (gathered buckets, unsharded gradients, sharded
    state) peaks at plan.memory's prediction, exactly."""
    data = {**FSDP_MEMORY_CASES[case], "tensors": True}
    document = simulate(tmp_path, data, memory=True)
    assert document["layers"]["memory"]["summary"]["peak_memory_bytes"] == predict_memory(
        JobSpec.model_validate(data)).total


# Hybrid sharding (HSDP) ----------------------------------------------------------------------------
@pytest.mark.parametrize("replicas, tp, cp", [(2, 1, 1), (4, 2, 1), (2, 1, 2)])
def test_hsdp_groups_are_megatrons_partial_data_parallel_groups(replicas, tp, cp):
    """parallel_state.py: the intra-instance group is the i-th consecutive block of the dp x cp group's
    ranks; the inter-instance group joins the ranks at one place of every block."""
    data = job(gpus=16, parallel={"tp": tp, "cp": cp}, global_batch=16, num_distributed_optimizer_instances=replicas)
    full = Placement(JobSpec.model_validate({**data, "training": {**data["training"],
                                                                  "num_distributed_optimizer_instances": 1}}), 8)
    placement = Placement(JobSpec.model_validate(data), 8)
    for rank in range(16):
        ranks = list(full.groups(rank)["dp_cp"])
        block = len(ranks) // replicas
        blocks = [ranks[i * block:(i + 1) * block] for i in range(replicas)]
        groups = placement.groups(rank)
        assert list(groups["dp_cp"]) in blocks and rank in groups["dp_cp"]
        assert list(groups["dp_outer"]) == [b[blocks[ranks.index(rank) // block].index(rank)] for b in blocks]


@settings(max_examples=15, deadline=None)
@given(layers=st.integers(1, 4), replicas=st.sampled_from([2, 4]), micro=st.integers(1, 3),
       strategy=st.sampled_from(["optim", "optim_grads", "optim_grads_params"]),
       grads=st.sampled_from(["fp32", "bf16"]))
def test_hsdp_moves_the_closed_form_bytes(layers, replicas, micro, strategy, grads):
    """Per rank and step: gathers and reduce-scatters as without replicas over the block of dp / R ranks;
    once a step each bucket's reduced gradient is all-reduced across the replicas: its shard with
    sharded gradients, the whole bucket with optim."""
    model = {**MODEL, "layers": layers}
    dp = 8
    data = job(model, dp, global_batch=dp * micro, grad_reduce_dtype=grads, data_parallel_sharding_strategy=strategy,
               num_distributed_optimizer_instances=replicas)
    plain = job(model, dp // replicas, global_batch=dp // replicas * micro, grad_reduce_dtype=grads,
                data_parallel_sharding_strategy=strategy)
    found, alone = collectives(data), collectives(plain)
    assert [(n, k, s) for n, k, s in found if k != pb.ALL_REDUCE] == alone
    spec = JobSpec.model_validate(data)
    vocab_h = spec.shape.padded_vocab(1) * spec.shape.hidden
    buckets = [2 * vocab_h + spec.shape.hidden] + [spec.shape.layer_params_on(1)] * layers
    block = dp // replicas
    sharded = strategy != "optim"
    expected = sum((shard(b, block) if sharded else b) * DTYPE_BYTES[grads] for b in buckets)
    outer = [(n, s) for n, k, s in found if k == pb.ALL_REDUCE]
    assert all(".outer_all_reduce." in n for n, _ in outer)
    assert sum(s for _, s in outer) == expected


@pytest.mark.parametrize("strategy", ["optim", "optim_grads_params"])
def test_hsdp_peak_is_the_prediction(tmp_path, strategy):
    data = {**job(gpus=8, global_batch=16, data_parallel_sharding_strategy=strategy,
                  num_distributed_optimizer_instances=2), "tensors": True}
    document = simulate(tmp_path, data, memory=True)
    assert document["layers"]["memory"]["summary"]["peak_memory_bytes"] == predict_memory(
        JobSpec.model_validate(data)).total


def test_hsdp_inside_a_node_gathers_over_nvlink(tmp_path):
    """ZeRO-3 over 16 GPUs of two nodes gathers every layer over the network; with two replicas of one
    node each the gathers stay on NVLink and only the last micro-batch's shards cross the network."""
    full = simulate(tmp_path / "full", job(gpus=16, global_batch=32))
    hybrid = simulate(tmp_path / "hsdp", job(gpus=16, global_batch=32, num_distributed_optimizer_instances=2))
    assert hybrid["training"]["step_time_s"] < full["training"]["step_time_s"]


@pytest.mark.parametrize("training, message", [
    ({"num_distributed_optimizer_instances": 3}, "must divide dp x cp = 4"),
    ({"num_distributed_optimizer_instances": 2, "data_parallel_sharding_strategy": "no_shard"}, "no_shard"),
    ({"num_distributed_optimizer_instances": 2, "use_megatron_fsdp": False}, "partial distributed optimizer"),
])
def test_what_hsdp_refuses(training, message):
    with pytest.raises(ValidationError, match=message):
        JobSpec.model_validate(job(**training))
