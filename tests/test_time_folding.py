"""Time folding (chakra_core.contract.time_folding): a step simulated with fewer micro-batches and
carried forward by whole periods gives the unfolded step's results to the nanosecond; the traces
kept differ from the whole step's only by whole periods; a run whose state does not repeat, or
a layer that cannot promise it, falls back to the whole step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from chakra_core import hookimpl, run
from chakra_core.contract import ComputeRegistry
from chakra_core.engine.time_folding import NO_REPEAT
from chakra_core.jobs import expand, time_fold
from chakra_core.jobs.fsdp import rank_program
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.spec import JobSpec
from chakra_core.jobs.time_fold import (COMPARED_FIELDS, FEWEST_STEADY_PERIODS, REACH_NODES, STEADY_PERIODS,
                                        period_microbatches, rank_periods, reach, reduced_job, simulated_microbatches,
                                        steady_periods, tensor_steady_periods)
from chakra_core.plugins import make_plugin_host
from chakra_core.schema import pb
from chakra_sim_compute_achievable.model import AchievableCompute

PROFILE = "h100-hgx-ndr400"
MODEL = {"layers": 8, "hidden": 1024, "ffn_hidden": 2816, "heads": 16, "kv_heads": 4, "vocab": 32000}
MOE = {**MODEL, "num_experts": 8, "topk": 2, "moe_ffn_hidden": 512}


def job(tp: int = 1, pp: int = 2, vp: int = 1, gpus: int = 4, microbatches: int = 16, **training: Any) -> dict[str, Any]:
    dp = gpus // (tp * pp)
    return {"name": "t", "model": dict(MODEL), "parallel": {"tp": tp, "pp": pp, "vp": vp},
            "training": {"seq": 1024, "global_batch": microbatches * dp, "micro_batch": 1} | training,
            "cluster": {"gpus": gpus, "profile": PROFILE}}


NO_HOST = {"compute": {"plugin": "achievable", "effects": {"host_launch": False}}}
"""Without the host's launches: a small model's host stays within reach of its GPU for most of a
short step, which no period repeats (AchievableCompute.time_fold_state), so these runs would fall
back; the effect is on in the runs of real sizes below."""


def simulate(tmp_path: Path, data: dict[str, Any], fold_time: str, host: Any = None, **layers: Any) -> dict[str, Any]:
    out = tmp_path / f"out-{fold_time}-{len(list(tmp_path.iterdir()))}"
    manifest = {"job": data, "workload": {"fold_time": fold_time}, "output": {"dir": str(out)},
                "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}, **layers}
    return run.simulate(run.load(manifest, host, base_dir=tmp_path), host).document


def same_step(folded: dict[str, Any], whole: dict[str, Any]) -> None:
    """Every rank's row (finish, time categories and their split, bytes, node counts, layer
    statistics) and the training section are equal, as are the event count and the layers'
    integer statistics."""
    assert folded["ranks"] == whole["ranks"]
    assert folded["training"] == whole["training"]
    assert folded["finish_ns"] == whole["finish_ns"]
    assert folded["events"] == whole["events"]
    assert folded["layers"]["system"] == whole["layers"]["system"]


# The traces kept ------------------------------------------------------------------------------------
def _canonical(node: pb.Node, shift_ids: int, shift_tags: int, first: int) -> bytes:
    """The node without its name, its id and later dependencies moved by `shift_ids` and its p2p
    tag by `shift_tags`; dependencies before the repeating nodes (`first`) stay."""
    copy = pb.Node()
    copy.CopyFrom(node)
    copy.name = ""
    copy.id += shift_ids
    for deps in (copy.data_deps, copy.ctrl_deps):
        moved = [d + shift_ids if d >= first else d for d in deps]
        del deps[:]
        deps.extend(moved)
    for attr in copy.attr:
        if attr.name == "comm_tag":
            attr.int64_val += shift_tags
    return copy.SerializeToString(deterministic=True)


def assert_whole_periods_inserted(base: JobSpec, extra: int) -> None:
    """For every rank, the traces of one more period than those kept (plus `extra` periods) hold
    the kept traces' nodes up to the end of their repeating nodes, then one period like the last
    before it, then the kept traces' rest, a period's nodes (and micro-batches) on. What the
    engine proves of the kept step's run then holds of the longer one
    (chakra_core.contract.time_folding)."""
    kept, why = simulated_microbatches(base)
    assert not why and kept < base.microbatches
    per_period = period_microbatches(base)
    kept += per_period * extra
    short, long = reduced_job(base, kept), reduced_job(base, kept + per_period)
    placement = Placement(short, 8)
    tags = 2 * base.vp * per_period      # p2p tags a period takes
    for rank in placement.representatives:
        program = rank_program(short, placement, rank)
        nodes = program.build()
        span = rank_periods(short, program.stage, program.step_starts)
        assert span is not None
        longer = rank_program(long, Placement(long, 8), rank).build()
        assert len(longer) == len(nodes) + span.nodes
        # the same nodes up to where the kept trace stops repeating (reach: past `end` where the
        # nodes after the repeating ones still do what those a period before them do)
        alike = reach(nodes, span)
        assert span.end <= alike <= span.end + min(span.nodes, REACH_NODES)
        assert [n.SerializeToString(deterministic=True) for n in longer[:alike]] == \
            [n.SerializeToString(deterministic=True) for n in nodes[:alike]]
        for i in range(span.end, len(nodes) + span.nodes):   # the period inserted, then the rest a period on
            assert _canonical(longer[i], 0, 0, span.first) == _canonical(nodes[i - span.nodes], span.nodes, tags,
                                                                         span.first)


def test_reach_compares_every_field_of_a_node():
    """A new Node field must be placed: compared as it is, or moved a period on (time_fold._alike)."""
    assert set(pb.Node.DESCRIPTOR.fields_by_name) == {"id", "name", "data_deps", "ctrl_deps", "attr", *COMPARED_FIELDS}


@settings(max_examples=20, deadline=None)
@given(pp=st.sampled_from([1, 2, 4]), vp=st.sampled_from([1, 2]), tp=st.sampled_from([1, 2]),
       extra=st.integers(0, 3), recompute=st.sampled_from(["none", "full", "selective"]),
       precision=st.sampled_from(["bf16", "fp8"]))
def test_a_longer_step_is_the_kept_one_with_whole_periods_inserted(pp, vp, tp, extra, recompute, precision):
    if vp > 1 and pp == 1:
        vp = 1
    c = 1 if vp == 1 else pp
    assert_whole_periods_inserted(JobSpec.model_validate(job(tp=tp, pp=pp, vp=vp, gpus=tp * pp * 2,
                                                             microbatches=64 * c, recompute=recompute,
                                                             precision=precision)), extra)


@settings(max_examples=8, deadline=None)
@given(pp=st.sampled_from([1, 2, 4]), extra=st.integers(0, 2), precision=st.sampled_from(["bf16", "fp8"]),
       recompute=st.sampled_from(["none", "selective"]))
def test_the_combined_schedule_repeats_node_for_node(pp, extra, precision, recompute):
    """The same for a mixture of experts under the combined 1F1B schedule
    (overlap_moe_expert_parallel_comm, delayed weight gradients), whose steady state is one merged
    forward-and-backward step per pair and whose warm-up has one forward more."""
    vp = 1 if pp == 1 else 2
    data = job(pp=pp, vp=vp, gpus=pp * 4, microbatches=64 * (1 if vp == 1 else pp), precision=precision,
               recompute=recompute)
    data["model"] = dict(MOE)
    data["parallel"] |= {"ep": 2, "overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True}
    assert_whole_periods_inserted(JobSpec.model_validate(data), extra)


# The run ---------------------------------------------------------------------------------------------
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pp=st.sampled_from([1, 2, 4]), vp=st.sampled_from([1, 2]), tp=st.sampled_from([1, 2]),
       microbatches=st.integers(14, 40), recompute=st.sampled_from(["none", "full"]),
       precision=st.sampled_from(["bf16", "fp8"]), overlap=st.booleans())
def test_folded_in_time_equals_every_micro_batch_simulated(tmp_path, pp, vp, tp, microbatches, recompute,
                                                          precision, overlap):
    if vp > 1 and pp == 1:
        vp = 1
    c = 1 if vp == 1 else pp
    data = job(tp=tp, pp=pp, vp=vp, gpus=tp * pp * 2, microbatches=c * (microbatches // c + 8),
               recompute=recompute, precision=precision, overlap_grad_reduce=overlap, overlap_param_gather=overlap)
    folded, whole = simulate(tmp_path, data, "auto", **NO_HOST), simulate(tmp_path, data, "off", **NO_HOST)
    same_step(folded, whole)
    assert "time" not in whole["folding"]
    assert folded["folding"]["time"]["folded"], folded["folding"]["time"]


def test_two_steady_periods_where_four_would_fold_nothing(tmp_path):
    """Interleaved over 2 stages, a period is 2 micro-batches: with 16 of them, 4 steady periods
    leave none out and 2 leave 2 out, and that fold is exact; with 40, the first try keeps 4."""
    data = job(pp=2, vp=2, gpus=4, microbatches=16)
    spec = JobSpec.model_validate(data)
    assert simulated_microbatches(spec, STEADY_PERIODS)[1] and steady_periods(spec) == FEWEST_STEADY_PERIODS
    assert simulated_microbatches(spec) == (12, "")
    folded, whole = simulate(tmp_path, data, "auto", **NO_HOST), simulate(tmp_path, data, "off", **NO_HOST)
    same_step(folded, whole)
    assert folded["folding"]["time"]["microbatches_simulated"] == 12, folded["folding"]["time"]
    assert steady_periods(JobSpec.model_validate(job(pp=2, vp=2, gpus=4, microbatches=40))) == STEADY_PERIODS


KINDS = {
    "context parallel": ({"cp": 2}, {}, None),
    "sequence parallel and TP overlap": ({"tp": 2, "tp_comm_overlap": True}, {}, None),
    "mixture of experts, EP 2, skewed routing": ({"ep": 2}, {"routing": {"zipf": 1.0}}, MOE),
    "mixture of experts, combined 1F1B schedule": ({"vp": 2, "ep": 2, "overlap_moe_expert_parallel_comm": True,
                                                    "delay_wgrad_compute": True}, {"precision": "fp8"}, MOE),
    "Megatron-FSDP (ZeRO-3)": ({"pp": 1}, {"use_megatron_fsdp": True,
                                           "data_parallel_sharding_strategy": "optim_grads_params"}, None),
    "parameter gathers from the step's start (Megatron-Core 0.8)": ({}, {"param_gather_start": "step_start"}, None),
}


@pytest.mark.parametrize("kind", KINDS)
def test_other_jobs_fold_in_time_exactly(tmp_path, kind):
    parallel, training, model = KINDS[kind]
    data = job(pp=2, gpus=8, microbatches=24, **training)
    data["parallel"] = {**data["parallel"], **parallel}
    data["training"]["global_batch"] = 24 * 8 // (data["parallel"].get("tp", 1) * data["parallel"]["pp"]
                                                  * data["parallel"].get("cp", 1))
    if model is not None:
        data["model"] = model
    folded, whole = simulate(tmp_path, data, "auto", **NO_HOST), simulate(tmp_path, data, "off", **NO_HOST)
    same_step(folded, whole)
    assert folded["folding"]["time"]["folded"], folded["folding"]["time"]


@pytest.mark.parametrize("lifetime", ["trace", "issued"])
def test_memory_followed_tensor_by_tensor_folds_in_time_exactly(tmp_path, lifetime):
    """The hbm model following every storage: peaks, allocations and the bytes-in-use series
    (bounded to 64 points, so it coarsens over the whole step) equal the whole step's."""
    data = job(pp=2, vp=2, gpus=8, microbatches=24, precision="fp8") | {"tensors": True}
    memory = {"memory": {"plugin": "hbm", "lifetime": lifetime, "series_points": 64}}
    folded, whole = simulate(tmp_path, data, "auto", **NO_HOST, **memory), simulate(tmp_path, data, "off", **NO_HOST, **memory)
    assert folded["folding"]["time"]["folded"], folded["folding"]["time"]
    same_step(folded, whole)
    assert folded["layers"]["memory"] == whole["layers"]["memory"]
    summary = whole["layers"]["memory"]["summary"]
    assert summary["peak_memory_bytes"] > 0 and summary["storage_allocations"] > 0
    assert all(2 < len(series) <= 64 for series in summary["memory_series"].values())


def test_listed_tensors_keep_the_steady_periods_their_activations_need(tmp_path, monkeypatch):
    """Without interleaving, the first stage's 7 warm-up activations over 8 stages are freed 7
    periods into the repeating nodes: with the tensors listed the first try keeps 9 steady periods
    (the looks 7 and 8 periods in, before the last period) and folds; 8 find no repeat (and another
    try would keep most of the step: it is simulated whole). Where the step is too short for the
    periods they need, it is simulated whole at once, without a try that cannot fold, and says why."""
    data = job(pp=8, gpus=16, microbatches=38) | {"tensors": True}
    spec = JobSpec.model_validate(data)
    assert tensor_steady_periods(spec) == steady_periods(spec) == 9
    assert tensor_steady_periods(spec.model_copy(update={"tensors": False})) == 0
    memory = {"memory": {"plugin": "hbm"}}
    folded, whole = simulate(tmp_path, data, "auto", **NO_HOST, **memory), simulate(tmp_path, data, "off", **NO_HOST, **memory)
    # exactly 9 steady periods, the first and last periods and the fill and drain of 8 stages
    assert folded["folding"]["time"]["microbatches_simulated"] == simulated_microbatches(spec)[0] == 9 + 2 + 7
    same_step(folded, whole)
    assert folded["layers"]["memory"] == whole["layers"]["memory"]
    short = job(pp=4, vp=2, gpus=8, microbatches=32) | {"tensors": True}
    kept, why = simulated_microbatches(JobSpec.model_validate(short))
    assert kept == 32 and "with the tensors listed a repeat needs 4 steady periods" in why
    assert simulated_microbatches(JobSpec.model_validate(short | {"tensors": False})) == (24, "")
    assert simulate(tmp_path, short, "auto", **NO_HOST, **memory)["folding"]["time"] == {"folded": False, "reason": why}
    for module in (expand, time_fold):
        monkeypatch.setattr(module, "steady_periods", lambda job: 8)
    fewer = simulate(tmp_path, job(pp=8, gpus=16, microbatches=39) | {"tensors": True}, "auto", **NO_HOST, **memory)
    assert simulated_microbatches(JobSpec.model_validate(job(pp=8, gpus=16, microbatches=39)), 8)[0] == 8 + 2 + 7
    assert not fewer["folding"]["time"]["folded"] and fewer["folding"]["time"]["reason"].startswith(NO_REPEAT[:40])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pp=st.sampled_from([2, 4, 8]), vp=st.sampled_from([1, 2]), microbatches=st.integers(10, 30),
       recompute=st.sampled_from(["none", "full"]), lifetime=st.sampled_from(["trace", "issued"]))
def test_memory_folded_in_time_equals_every_micro_batch_simulated(tmp_path, pp, vp, microbatches, recompute,
                                                                  lifetime):
    """Whatever the pipeline (warm-up activations living for most of the steady periods kept
    included: PP 8 with `lifetime: trace`), the hbm model's results folded in time are the whole
    step's; and a step that leaves micro-batches out folds at its first try, its traces keeping the
    steady periods the activations need (tensor_steady_periods)."""
    vp = 1 if pp == 8 else vp      # 8 layers
    c = 1 if vp == 1 else pp
    data = job(pp=pp, vp=vp, gpus=pp * 2, microbatches=c * (microbatches // c + 4), recompute=recompute) | {"tensors": True}
    memory = {"memory": {"plugin": "hbm", "lifetime": lifetime, "series_points": 48}}
    folded, whole = simulate(tmp_path, data, "auto", **NO_HOST, **memory), simulate(tmp_path, data, "off", **NO_HOST, **memory)
    same_step(folded, whole)
    assert folded["layers"]["memory"] == whole["layers"]["memory"]
    kept, _ = simulated_microbatches(JobSpec.model_validate(data))
    assert kept == data["training"]["global_batch"] // 2 or folded["folding"]["time"].get("microbatches_simulated") == kept


def test_activation_offload_through_the_memory_layer_folds_in_time_exactly(tmp_path):
    """Offload's copies are memory accesses the hbm model times: instants with one in flight
    match no other, and the step still folds between them."""
    data = job(pp=1, gpus=2, microbatches=24, cpu_offloading_num_layers=1) | {"tensors": True}
    memory = {"memory": {"plugin": "hbm"}}
    folded, whole = simulate(tmp_path, data, "auto", **NO_HOST, **memory), simulate(tmp_path, data, "off", **NO_HOST, **memory)
    assert folded["folding"]["time"]["folded"], folded["folding"]["time"]
    same_step(folded, whole)
    assert folded["layers"]["memory"] == whole["layers"]["memory"]
    assert whole["layers"]["memory"]["summary"]["accesses"] > 0


def test_running_out_of_memory_after_the_period_began_gets_the_whole_step(tmp_path):
    """The warning names a time of the run that was simulated: the run is simulated whole."""
    data = job(pp=2, gpus=4, microbatches=24) | {"tensors": True}
    memory = {"memory": {"plugin": "hbm", "capacity_gib": 0.5, "oom": "warn"}}
    folded, whole = simulate(tmp_path, data, "auto", **NO_HOST, **memory), simulate(tmp_path, data, "off", **NO_HOST, **memory)
    assert not folded["folding"]["time"]["folded"] and "ran out of memory" in folded["folding"]["time"]["reason"]
    same_step(folded, whole)
    assert folded["layers"]["memory"] == whole["layers"]["memory"] and whole["layers"]["memory"]["summary"]["oom_ranks"]


def test_a_pipeline_folds_in_time_and_says_so(tmp_path):
    """Llama 3 8B with every compute effect on, the host's launches included: the host falls so
    far behind that it can no longer hold a kernel back, and the step repeats from there."""
    data = job(tp=2, pp=4, vp=2, gpus=16, microbatches=64, precision="fp8", seq=2048)
    data["model"] = "llama3-8b"
    folded, whole = simulate(tmp_path, data, "auto"), simulate(tmp_path, data, "off")
    time = folded["folding"]["time"]
    assert time["folded"] and time["microbatches"] == 64 and time["microbatches_per_period"] == 4
    assert time["microbatches_simulated"] + time["periods"] * 4 == 64 and time["cycle_ns"] > 0
    assert time["periods"] % time["cycle_periods"] == 0
    same_step(folded, whole)
    assert folded["layers"]["compute"]["summary"]["kinds"].keys() == whole["layers"]["compute"]["summary"]["kinds"].keys()
    for kind, figures in folded["layers"]["compute"]["summary"]["kinds"].items():
        other = whole["layers"]["compute"]["summary"]["kinds"][kind]
        assert figures["count"] == other["count"] and figures["time_ns"] == other["time_ns"]
        assert abs(figures["flops"] - other["flops"]) <= 1e-9 * other["flops"]   # float sums, in another order


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
def test_a_host_that_waits_for_its_gpu_in_every_moe_layer_folds_in_time(tmp_path, dispatcher):
    """Dropless routing syncs the host with its GPU in every MoE layer (host_sync) and the experts'
    per-expert launches hold kernels back after it: the host's lead is then exact and repeats, so
    the step folds, to the nanosecond, with the host's launches on."""
    data = job(pp=2, gpus=8, microbatches=48, precision="fp8", fp8_recipe="current")
    data["model"] = dict(MOE)
    data["parallel"] |= {"ep": 4, "moe_token_dispatcher": dispatcher}
    folded, whole = simulate(tmp_path, data, "auto"), simulate(tmp_path, data, "off")
    assert folded["folding"]["time"]["folded"], folded["folding"]["time"]
    same_step(folded, whole)
    without = simulate(tmp_path, data, "off", compute={"plugin": "achievable", "effects": {"host_launch": False}})
    assert whole["finish_ns"] > without["finish_ns"]   # the syncs and launches cost time


def test_too_few_micro_batches_simulate_every_one_and_say_so(tmp_path):
    document = simulate(tmp_path, job(pp=4, gpus=8, microbatches=8), "auto")
    assert document["folding"]["time"] == {"folded": False, "reason": "8 micro-batch(es): too few to repeat (time "
                                           "folding keeps 9 and folds from 2 periods of 1 left out)"}


def test_a_congested_network_is_not_folded_in_time_and_says_why(tmp_path):
    """The congestion network's link queues carry their backlog from one message to the next."""
    data = job(pp=2, gpus=16, microbatches=24)
    network = {**NO_HOST, "network": {"plugin": "congestion", "topology": ["Switch"], "npus_count": [16],
                                      "bandwidth": [50], "latency": [500]}}
    folded, whole = simulate(tmp_path, data, "auto", **network), simulate(tmp_path, data, "off", **network)
    reason = folded["folding"]["time"]["reason"]
    assert "network plugin 'congestion'" in reason and "system plugin 'nccl'" not in reason
    same_step(folded, whole)


# Falling back -------------------------------------------------------------------------------------
def test_a_layer_that_cannot_promise_a_periodic_state_gets_the_whole_step(tmp_path):
    """nccl with a network layer leaves the flows to it, whose state it cannot vouch for: the run
    simulates the whole step's traces, written when it learns so, and says why."""
    data = job(pp=2, gpus=16, microbatches=24)
    network = {**NO_HOST, "network": {"plugin": "analytical", "topology": ["Switch"], "npus_count": [16], "bandwidth": [50],
                           "latency": [500]}}
    folded, whole = simulate(tmp_path, data, "auto", **network), simulate(tmp_path, data, "off", **network)
    assert folded["folding"]["time"]["folded"] is False
    assert "system plugin 'nccl'" in folded["folding"]["time"]["reason"]
    same_step(folded, whole)


def test_a_layer_that_refuses_as_built_reads_the_whole_steps_traces(tmp_path):
    """hbm with a per-node memory expansion refuses once built (its instance is not time_fold_safe):
    the layers are built again on the whole step's traces, so its pre-pass counts the references of
    the traces that run (it read the fewer micro-batches' files before: another peak, more
    allocations)."""
    data = job(pp=2, gpus=8, microbatches=24) | {"tensors": True}
    memory = {**NO_HOST, "memory": {"plugin": "hbm", "memory-type": "PER_NODE_MEMORY_EXPANSION", "remote-mem-bw": 100,
                                    "num-npus-per-node": 8}}
    folded, whole = (simulate(tmp_path, data, fold_time, **memory, workload={"fold": "off", "fold_time": fold_time})
                     for fold_time in ("auto", "off"))   # nor can it stand one rank for another
    assert "memory plugin 'hbm'" in folded["folding"]["time"]["reason"]
    same_step(folded, whole)
    assert folded["layers"]["memory"] == whole["layers"]["memory"]


class _Heating(AchievableCompute):
    """A straggler: rank 0's GPU gets slower with every kernel (a clock that throttles as it heats),
    which no period repeats."""

    name = "heating"
    time_fold_safe = True

    def __init__(self, config: Any, context: Any):
        super().__init__(config, context)
        self.kernels = 0

    def compute_time_ns(self, rank, node):
        duration = super().compute_time_ns(rank, node)
        if rank == 0 and duration is not None:
            self.kernels += 1
            duration += self.kernels // 4
        return duration


class _HeatingPlugin:
    @hookimpl
    def chakra_sim_register_compute(self, registry: ComputeRegistry) -> None:
        registry.add(_Heating)


def test_a_straggler_that_never_repeats_falls_back_to_every_micro_batch(tmp_path):
    host = make_plugin_host(extra_plugins=[("heating", _HeatingPlugin())])
    data = job(pp=2, gpus=4, microbatches=24)
    compute = {"compute": {"plugin": "heating", "effects": {"host_launch": False}}}
    folded, whole = simulate(tmp_path, data, "auto", host, **compute), simulate(tmp_path, data, "off", host, **compute)
    time = folded["folding"]["time"]
    assert time["folded"] is False and "no instant" in time["reason"]
    # the reason names what kept changing: the straggler (rank 0), the stage that waits for it and
    # the compute layer, whose kernels in flight beside communication (sharing.py) shift with them
    assert ("what kept changing from one period to the next: ranks 0 and 2 and the compute layer 'heating';"
            in time["reason"])
    same_step(folded, whole)


class _Watched(_Heating):
    """The straggler, recording the highest node of rank 0 each run (each try builds its own layer)."""

    name = "watched"
    highest: list[int] = []

    def __init__(self, config: Any, context: Any):
        super().__init__(config, context)
        _Watched.highest.append(-1)

    def compute_time_ns(self, rank, node):
        if rank == 0:
            _Watched.highest[-1] = max(_Watched.highest[-1], node.id)
        return super().compute_time_ns(rank, node)


class _WatchedPlugin:
    @hookimpl
    def chakra_sim_register_compute(self, registry: ComputeRegistry) -> None:
        registry.add(_Watched)


def test_a_try_that_cannot_fold_stops_at_its_last_instant_that_could_repeat(tmp_path):
    """The try gives up at its last look that could repeat an earlier one, not a period later."""
    _Watched.highest.clear()
    host = make_plugin_host(extra_plugins=[("watched", _WatchedPlugin())])
    data = job(pp=2, gpus=4, microbatches=24)
    folded = simulate(tmp_path, data, "auto", host, compute={"plugin": "watched", "effects": {"host_launch": False}})
    assert folded["folding"]["time"]["folded"] is False
    spans = json.loads(next(tmp_path.glob("out-*/traces/time-folded/t.periods.json")).read_text())
    first, end, nodes, alike = spans["0"]
    runs = [highest for highest in _Watched.highest if highest >= 0]   # (a layer built only to check it)
    assert end - first >= 2 * nodes and len(runs) == 2   # the try, then the whole step
    # the last look that can repeat an earlier one: at `end` where the nodes after it are alike
    # too, else a period before
    last = end if alike > end else end - nodes
    assert last <= runs[0] < last + nodes


def test_a_pipeline_that_repeats_every_six_periods_folds_on_another_try(tmp_path):
    """Llama 3.1 405B's width over 6 layers on PP 8, CP 2, TP 8 (its H100 layout without
    interleaving): the stages take turns to wait and the step repeats every 6 micro-batches, which
    4 steady periods cannot show. The run starts over with 16 (it sees the cycle, but the 38
    periods left out are not a multiple of it), then with 36 left out, and folds: the same step
    as every micro-batch simulated."""
    data = {"name": "six", "model": {"layers": 6, "hidden": 16384, "ffn_hidden": 53248, "heads": 128, "kv_heads": 8,
                                     "vocab": 128256, "max_seq": 8192},
            "parallel": {"tp": 8, "pp": 8, "cp": 2, "tp_comm_overlap": True, "account_for_embedding_and_loss": True},
            "training": {"seq": 8192, "global_batch": 64, "precision": "fp8", "fp8_recipe": "current",
                         "fp8_param_gather": True, "grad_reduce_dtype": "bf16"},
            "cluster": {"gpus": 128, "profile": PROFILE}}
    folded, whole = simulate(tmp_path, data, "auto"), simulate(tmp_path, data, "off")
    time = folded["folding"]["time"]
    assert time["folded"] and time["cycle_periods"] == 6 and time["periods"] == 36
    assert time["microbatches_simulated"] == 28 and time["microbatches"] == 64
    same_step(folded, whole)
    tries = [w for w in folded["warnings"] if "started over" in w]
    assert any("16 steady periods are kept" in w for w in tries)
    assert any("it repeats every 6 periods, so 36 periods are left out" in w for w in tries)


def test_another_try_at_folding_is_made_only_where_it_can_help(tmp_path):
    """The first try's traces (4 steady periods) offer a longer one, then one whose periods left
    out are a multiple of the cycle seen; a longer try offers no longer one; a step whose retry
    would simulate more than half its micro-batches offers none."""
    from chakra_core.jobs.expand import expand_job
    from chakra_core.jobs.time_fold import RETRY_STEADY_PERIODS, STEADY_PERIODS

    data = job(pp=2, gpus=4, microbatches=200)
    expanded = expand_job({"job": data}, tmp_path, "job.yaml", str(tmp_path / "out"))
    first = expanded.time_folding
    assert first is not None and first.steady_periods == STEADY_PERIODS and first.retry is not None
    longer = first.retry(0)
    assert longer is not None and longer[0].steady_periods == RETRY_STEADY_PERIODS
    assert longer[0].periods % 2 == 0 and longer[0].microbatches_simulated > first.microbatches_simulated
    assert len(longer[1]) == 4 and all(Path(path).exists() for path in longer[1])
    sixes = longer[0].retry(6) if longer[0].retry else None
    assert sixes is not None and sixes[0].periods % 6 == 0 and sixes[0].steady_periods == RETRY_STEADY_PERIODS
    assert longer[0].retry is not None and longer[0].retry(0) is None
    assert expanded.lock is not None
    expanded.lock.release()
    few = expand_job({"job": job(pp=2, gpus=4, microbatches=36)}, tmp_path / "few", "job.yaml",
                     str(tmp_path / "few" / "out"))
    assert few.time_folding is not None and few.time_folding.retry is not None
    assert few.time_folding.retry(0) is None      # 16 steady periods would keep 20, more than half of 36
    assert few.lock is not None
    few.lock.release()


@pytest.mark.parametrize("steady,multiple", [(4, 2), (16, 2), (16, 6), (16, 5)])
def test_the_periods_left_out_are_a_multiple_of_the_cycle_asked(steady, multiple):
    spec = JobSpec.model_validate(job(pp=8, gpus=8, microbatches=200))
    kept, note = simulated_microbatches(spec, steady, multiple)
    left_out = spec.microbatches - kept
    assert note == "" and left_out % multiple == 0 and left_out > 0
    assert kept >= (steady + 2) + 7      # the steady periods and the pipeline's fill and drain


def test_fold_time_is_checked(tmp_path):
    from chakra_core.errors import ManifestError

    with pytest.raises(ManifestError, match="workload.fold_time"):
        simulate(tmp_path, job(), "sometimes")


def test_results_say_what_time_folding_did_and_reload(tmp_path):
    from chakra_core.report.document import Results

    document = simulate(tmp_path, job(pp=2, gpus=4, microbatches=24), "auto", **NO_HOST)
    assert document["folding"]["time"]["folded"]
    assert Results.from_json(json.loads(json.dumps(document))).to_json()["folding"] == document["folding"]


# The engine's part, on traces written by hand ------------------------------------------------------
def _loop(iterations: int, rank: int) -> list[pb.Node]:
    """A metadata-free trace: `iterations` times (compute, all-reduce, compute) chained, and a
    final all-reduce; rank 1's compute is slower, so rank 0 waits in every collective."""
    from chakra_core.testing import collective, comp

    nodes, last = [], None
    for i in range(iterations):
        base = 3 * i
        nodes.append(comp(base, 40 + 25 * rank, deps=[] if last is None else [last]))
        nodes.append(collective(base + 1, pb.ALL_REDUCE, 1 << 20, deps=[base]))
        nodes.append(comp(base + 2, 15, deps=[base + 1]))
        last = base + 2
    nodes.append(collective(3 * iterations, pb.ALL_REDUCE, 4 << 20, deps=[last]))
    return nodes


def _hand_runs(tmp_path: Path) -> tuple[dict[str, Any], Any, str]:
    """The unfolded run of 32 iterations, the configuration of the 12-iteration traces and the
    32-iteration traces' prefix."""
    from chakra_core.testing import manifest, write_ranks

    system = {"plugin": "nccl", "profile": PROFILE}
    short = write_ranks(tmp_path / "short", [_loop(12, rank) for rank in range(2)])
    long = write_ranks(tmp_path / "long", [_loop(32, rank) for rank in range(2)])
    whole = run.simulate(run.load(manifest(long, None, compute={"plugin": "replay"}) | {"system": system},
                                  base_dir=tmp_path)).document
    return whole, run.load(manifest(short, None, compute={"plugin": "replay"}) | {"system": system},
                           base_dir=tmp_path), long


def test_the_engine_folds_any_periodic_trace_it_is_told_of(tmp_path):
    """chakra_core.engine.time_folding on traces that are not a job's: told that nodes [3, 3 x 11)
    repeat every 3 nodes, a run of 12 iterations carried forward by 20 periods equals the run of
    32 iterations in every rank's row."""
    from chakra_core.contract.time_folding import RankPeriods, TimeFolding

    whole, config, long = _hand_runs(tmp_path)
    config.spec.time_folding = TimeFolding(20, 32, 12, 1, {rank: RankPeriods(3, 33, 3) for rank in range(2)},
                                           lambda: [f"{long}.{rank}.et" for rank in range(2)])
    folded = run.simulate(config).document
    assert folded["folding"]["time"]["folded"] and folded["folding"]["time"]["cycle_ns"] > 0
    assert folded["ranks"] == whole["ranks"] and folded["finish_ns"] == whole["finish_ns"]
    assert folded["events"] == whole["events"]


def test_the_engine_falls_back_when_told_a_wrong_period(tmp_path):
    """Told that rank 1's nodes repeat every 6 nodes while they repeat every 3, the engine finds no
    instant that repeats and simulates the whole traces instead: the same rows."""
    from chakra_core.contract.time_folding import RankPeriods, TimeFolding

    whole, config, long = _hand_runs(tmp_path)
    config.spec.time_folding = TimeFolding(20, 32, 12, 1, {0: RankPeriods(3, 33, 3), 1: RankPeriods(3, 33, 6)},
                                           lambda: [f"{long}.{rank}.et" for rank in range(2)])
    folded = run.simulate(config).document
    assert folded["folding"]["time"]["folded"] is False
    assert folded["ranks"] == whole["ranks"] and folded["events"] == whole["events"]
