"""`chakra-sim plan` on mixtures of experts (issue 34): EP and ETP searched as Megatron's MoE
parallel folding allows, expert memory sharded as Megatron shards it (closed forms, the hbm
layer's simulated peak equal to the prediction), bounds never above the simulated step, marked
layouts ranked, and a dense job's plan as it was."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from chakra_core import run
from chakra_core.cli import main
from chakra_core.errors import ManifestError
from chakra_core.hardware.profiles import load_profile
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.spec import JobSpec
from chakra_core.plan.compute_bound import ComputeBound
from chakra_core.plan.expert_memory import moe_layer_params, routed_copies
from chakra_core.plan.headroom import communicators
from chakra_core.plan.layouts import (EP_NOT_DIVIDING, HYBRIDEP_DOMAINS, NOT_FOLDING, Layout, enumerate_layouts,
                                      job_with, lower_bound_s)
from chakra_core.plan.marks import job_layout, parse_mark
from chakra_core.plan.memory import layer_activations, memory_by_stage, predict_memory
from chakra_core.plan.search import SIMULATED, PlanOptions, plan
from chakra_core.plugins import make_plugin_host
from chakra_core.sweep.run import Execution
from tests.test_plan_layouts import achievable

PROFILE = "h100-hgx-ndr400"
DENSE = {"layers": 4, "hidden": 512, "ffn_hidden": 1408, "heads": 8, "kv_heads": 4, "vocab": 8000}
MOE = {**DENSE, "num_experts": 8, "topk": 2, "moe_ffn_hidden": 512}


def job(model: Any = None, gpus: int = 16, seq: int = 1024, global_batch: int = 32,
        parallel: dict[str, Any] | None = None, **training: Any) -> dict[str, Any]:
    return {"name": "moe", "model": model or dict(MOE), "parallel": {**(parallel or {})},
            "training": {"seq": seq, "global_batch": global_batch, **training},
            "cluster": {"gpus": gpus, "profile": PROFILE}}


def manifest(data: dict[str, Any], memory: bool = False) -> dict[str, Any]:
    return {"job": data, "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"},
            **({"memory": {"plugin": "hbm"}} if memory else {})}


def spec_of(model: Any = None, gpus: int = 16, **parallel: Any) -> JobSpec:
    training = {k: parallel.pop(k) for k in ("precision", "recompute", "distributed_optimizer", "micro_batch",
                                             "grad_reduce_dtype") if k in parallel}
    return JobSpec.model_validate(job(model, gpus, parallel=parallel, **training))


# Enumeration ----------------------------------------------------------------------------------------
def test_ep_and_etp_follow_megatrons_moe_folding():
    """ep divides the experts, ep x etp divides each stage's tp x cp x dp ranks, etp is tp or 1; every
    combination considered is a layout or counted under the reason JobSpec (or the skipped subtree) gives."""
    data = job()
    found = enumerate_layouts(data, 8, micro_batches=(1,), recompute=("none",), distributed_optimizer=(True,),
                              max_cp=2)
    assert found.layouts and all(lay.moe for lay in found.layouts)
    assert len(found.layouts) + sum(found.rejected.values()) == found.tried
    for lay in found.layouts:
        assert 8 % lay.ep == 0 and (lay.tp * lay.cp * lay.dp) % (lay.ep * lay.etp) == 0   # type: ignore[operator]
        assert lay.etp in (lay.tp, 1) and lay.edp * lay.ep * lay.etp == lay.tp * lay.cp * lay.dp
        spec = job_with(data, lay)
        assert (spec.parallel.ep, spec.parallel.expert_tp) == (lay.ep, lay.etp)
    assert {lay.ep for lay in found.layouts} == {1, 2, 4, 8}
    assert any(lay.etp == 1 < lay.tp for lay in found.layouts) and any(lay.etp == lay.tp > 1 for lay in found.layouts)
    assert found.rejected[NOT_FOLDING] > 0
    # the search's own limits: given expert sizes only, ep outside the experts' divisors counted
    limited = enumerate_layouts(data, 8, micro_batches=(1,), recompute=("none",), distributed_optimizer=(True,),
                                max_cp=2, ep=(2, 3), etp=(None,))
    assert {lay.ep for lay in limited.layouts} == {2} and all(lay.etp == lay.tp for lay in limited.layouts)
    assert limited.rejected[EP_NOT_DIVIDING] > 0 and len(limited.layouts) + sum(limited.rejected.values()) == limited.tried


def test_hybridep_layouts_whose_ep_does_not_split_into_nvlink_domains_are_rejected_not_simulated():
    """HybridEP lays an EP group over NVLink domains of min(ep, GPUs per node) ranks; a layout whose
    ep is not a multiple of the domain would fail at expansion, so the search counts it rejected."""
    data = job({**MOE, "num_experts": 24}, gpus=24, global_batch=48,
               parallel={"moe_token_dispatcher": "flex", "moe_flex_backend": "hybridep"})
    found = enumerate_layouts(data, 8, micro_batches=(1,), recompute=("none",), distributed_optimizer=(True,),
                              max_cp=1, ep=(3, 6, 8, 12, 24), etp=(1,))
    assert {lay.ep for lay in found.layouts} == {3, 6, 8, 24}
    assert found.rejected[HYBRIDEP_DOMAINS] > 0
    assert len(found.layouts) + sum(found.rejected.values()) == found.tried


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpus=st.sampled_from([4, 8, 12, 16]), experts=st.sampled_from([2, 4, 6, 8]),
       expert_ffn=st.sampled_from([256, 384]), layers=st.sampled_from([2, 4]), gpn=st.sampled_from([4, 8]))
def test_every_valid_expert_layout_is_found_once(gpus, experts, expert_ffn, layers, gpn):
    model = {**MOE, "layers": layers, "num_experts": experts, "moe_ffn_hidden": expert_ffn}
    data = job(model, gpus=gpus, global_batch=24, seq=768)
    options = {"micro_batches": (1,), "recompute": ("none",), "distributed_optimizer": (True,), "max_cp": 2}
    found = enumerate_layouts(data, gpn, **options)
    assert len(set(found.layouts)) == len(found.layouts) == len(found.specs)
    expected = set()
    dense = {k: v for k, v in model.items() if k not in ("num_experts", "topk", "moe_ffn_hidden")}
    for lay in enumerate_layouts({**data, "model": dense}, gpn, **options).layouts:   # the dense grid
        for ep in range(1, experts + 1):
            for etp in {lay.tp, 1}:
                candidate = Layout(*list(vars(lay).values())[:8], ep, etp)
                try:
                    job_with(data, candidate)
                except ValidationError:
                    continue
                expected.add(candidate)
    assert set(found.layouts) == expected


def test_a_dense_job_enumerates_as_before_whatever_the_expert_options():
    data = job(DENSE)
    plain = enumerate_layouts(data, 8, micro_batches=(1, 2), max_cp=2)
    assert plain.layouts == enumerate_layouts(data, 8, micro_batches=(1, 2), max_cp=2, ep=(2, 4), etp=(1,)).layouts
    assert all(not lay.moe and lay.ep == 1 for lay in plain.layouts)
    lay = plain.layouts[0]
    assert "EP" not in lay.label() and "job.parallel.ep" not in lay.overrides()
    assert Layout(2, 8, 4, 1, 16, 1, "none", True, 32, 1).label() == "TP2 PP8 VP4 CP1 DP16 EP32 ETP1 MB1 none dist-opt"
    assert communicators(Layout(2, 8, 4, 1, 16, 1, "none", True)) == 3
    # TP, DP, PP; then ETP (1: none), EP and EDP (2 x 16 / 32 = 1: none)
    assert communicators(Layout(2, 8, 4, 1, 16, 1, "none", True, 32, 1)) == 4
    assert communicators(Layout(2, 8, 4, 1, 16, 1, "none", True, 8, 2)) == 6


# Memory ---------------------------------------------------------------------------------------------
def test_expert_state_is_split_over_ep_x_etp_and_its_optimizer_over_edp():
    h, e, f = MOE["hidden"], MOE["num_experts"], MOE["moe_ffn_hidden"]
    spec = spec_of(tp=2, ep=4, etp=1)       # 16 GPUs: dp 8; edp = 2 x 8 / (4 x 1) = 4
    block = moe_layer_params(spec)
    assert block.experts == e // 4 * 3 * h * f
    assert block.dense == spec.shape.layer_params_on(2) - 3 * h * MOE["ffn_hidden"] // 2 + h * e
    replicated = spec_of(tp=2, ep=4, etp=1, distributed_optimizer=False)
    [stage], [unsharded] = memory_by_stage(spec), memory_by_stage(replicated)
    params, experts = stage.weights // 2, MOE["layers"] * block.experts
    assert stage.gradients == 4 * params                     # fp32 main gradients, never sharded
    assert unsharded.optimizer == 12 * params
    assert stage.optimizer == -(-(params - experts) * 12 // 8) + -(-experts * 12 // 4)   # dp x cp 8, edp 4
    # with etp = tp, each expert's FFN is split over TP too
    assert moe_layer_params(spec_of(tp=2, ep=4)).experts == block.experts // 2


def test_moe_activations_per_routed_copy():
    """Per token copy the experts compute: the dispatched token (h), fc1's two halves (2F / etp) and the
    activation's output (F / etp), bf16; k copies per token sent, etp times as many received."""
    h, f, e = MOE["hidden"], MOE["moe_ffn_hidden"], MOE["num_experts"]
    spec = spec_of(tp=2, ep=2, etp=1)
    tokens = 1024 // 2                                       # the sequence-parallel share
    assert routed_copies(spec) == tokens * 2
    dense = spec_of(DENSE, tp=2)
    n = 1024
    attention_and_norms = layer_activations(dense) - n * 2 * h // 2 - n * (2 * 2 * 1408 + 2 * 1408) // 2 - 0
    router = tokens * (2 * h + 3 * e)
    experts = routed_copies(spec) * 2 * (h + 2 * f + f)
    assert layer_activations(spec, moe=True) == attention_and_norms + router + experts
    assert routed_copies(spec_of(tp=2, ep=2, etp=2)) == 2 * tokens * 2
    fp8 = spec_of(tp=2, ep=2, etp=1, precision="fp8")
    assert layer_activations(fp8, moe=True) - layer_activations(fp8) == \
        tokens * (2 * h + 3 * e) - tokens * h + routed_copies(fp8) * (h + 2 * 2 * f + f) - n * (2 * 2 * 1408 + 1408) // 2


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2]), cp=st.sampled_from([1, 2]), etp=st.sampled_from([None, 1]),
       experts=st.sampled_from([4, 8, 16]), topk=st.sampled_from([1, 2, 4]), shared=st.sampled_from([0, 1024]),
       dist=st.booleans(), fp8=st.booleans(), pp=st.sampled_from([1, 2]))
def test_more_ep_never_increases_memory_per_gpu(tp, cp, etp, experts, topk, shared, dist, fp8, pp):
    """Doubling ep halves the local experts: their weights and gradients fall, their optimizer state
    stays (it is sharded over edp = ranks / (ep etp): the stage's ranks whatever ep), and no
    activation grows (each expert's share of the routed copies rounds up to fewer tokens)."""
    model = {**MOE, "num_experts": experts, "topk": min(topk, experts), "shared_expert_ffn": shared}
    gpus = 32 * pp
    previous = None
    for ep in (1, 2, 4, 8, 16):
        if experts % ep or (gpus // pp) % (ep * (etp or tp)):
            continue
        spec = JobSpec.model_validate(job(model, gpus, parallel={"tp": tp, "cp": cp, "pp": pp, "ep": ep, "etp": etp},
                                          global_batch=64, distributed_optimizer=dist,
                                          precision="fp8" if fp8 else "bf16"))
        stages = memory_by_stage(spec)
        expert_state = moe_layer_params(spec).experts
        now = (expert_state, [(e.weights, e.gradients, e.optimizer, e.activations, e.total) for e in stages])
        if previous is not None:
            assert now[0] * 2 == previous[0]
            for (w, g, o, a, total), (w0, g0, o0, a0, total0) in zip(now[1], previous[1]):
                assert w < w0 and g < g0 and o <= o0 + 1 and a <= a0 and total < total0
        previous = now


MEMORY_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    # model keys, parallel, training
    "tp2-pp2-ep2": ({}, {"tp": 2, "pp": 2, "ep": 2}, {}),
    "interleaved-fp8-shared-dense-first-etp1": ({"shared_expert_ffn": 1024, "dense_layers_first": 1},
                                                {"tp": 2, "pp": 2, "vp": 2, "ep": 4, "etp": 1},
                                                {"precision": "fp8", "global_batch": 16}),
    "cp2-full-recompute-bf16-grads": ({}, {"pp": 2, "cp": 2, "ep": 8},
                                      {"recompute": "full", "grad_reduce_dtype": "bf16", "seq": 2048, "global_batch": 8}),
    "zipf-routing-qk-norms": ({"qk_layernorm": True}, {"tp": 2, "pp": 2, "ep": 4, "etp": 1}, {"routing": {"zipf": 1.0}}),
    "recompute-layernorm-moe-act-ep-overlap": ({"shared_expert_ffn": 512},
                                               {"tp": 2, "pp": 2, "vp": 2, "ep": 4, "etp": 1,
                                                "overlap_moe_expert_parallel_comm": True},
                                               {"recompute": "selective", "recompute_modules": ["layernorm", "moe_act"]}),
    "shared-expert-overlap": ({"shared_expert_ffn": 512}, {"tp": 2, "pp": 2, "ep": 4, "moe_shared_expert_overlap": True},
                              {}),
    "gpt-oss-clamped-swiglu-biases-flex": ({"mlp": "clamped-swiglu", "bias": True, "attention_sinks": True},
                                           {"tp": 2, "pp": 2, "ep": 4, "etp": 1, "moe_token_dispatcher": "flex"}, {}),
    # the allgather dispatcher keeps its local experts' columns of the gathered map (t x etp x E bools)
    "allgather-tp2-ep4-etp2": ({"shared_expert_ffn": 512},
                               {"tp": 2, "pp": 2, "ep": 4, "moe_token_dispatcher": "allgather"}, {}),
    "allgather-zipf-etp1-fp8": ({}, {"tp": 2, "pp": 2, "ep": 4, "etp": 1, "moe_token_dispatcher": "allgather"},
                                {"routing": {"zipf": 1.0}, "precision": "fp8"}),
    # Megatron-FSDP: expert buckets sharded, gathered and reduce-scattered over the expert data-parallel group
    "fsdp-zero3-tp2-ep4-etp1": ({}, {"tp": 2, "ep": 4, "etp": 1}, {"use_megatron_fsdp": True}),
    "fsdp-zero2-shared-experts-layer-unit": ({"shared_expert_ffn": 512, "dense_layers_first": 1}, {"ep": 2},
                                             {"use_megatron_fsdp": True, "data_parallel_sharding_strategy": "optim_grads",
                                              "suggested_communication_unit_size": 3_000_000}),
    # Llama 4 Maverick in small: MoE blocks on every other layer, a shared expert, chunked attention
    "llama4-moe-every-2nd-layer-chunked-attention": ({"moe_layer_step": 2, "shared_expert_ffn": 512, "topk": 1,
                                                      "attention_chunk": 512, "router_score_function": "sigmoid"},
                                                     {"tp": 2, "pp": 2, "vp": 2, "ep": 4, "etp": 1}, {}),
}


@pytest.mark.parametrize("case", sorted(MEMORY_CASES))
def test_the_hbm_layers_peak_is_the_prediction(tmp_path, case):
    """The memory layer following the generated traces' tensors peaks at the predicted bytes, exactly:
    balanced and skewed routing, Qwen3's QK norms, selective recomputation of the MoE modules, the
    overlaps, the flex and allgather dispatchers, GPT-OSS's clamped SwiGLU and biases, Megatron-FSDP,
    Llama 4's MoE blocks on every other layer and chunked attention."""
    model, parallel, training = MEMORY_CASES[case]
    data = {**job({**MOE, **model}, 16, parallel=parallel, **{"global_batch": 32, **training}), "tensors": True}
    predicted = predict_memory(JobSpec.model_validate(data)).total
    document = run.simulate(run.load({**manifest(data, memory=True), "output": {"dir": str(tmp_path)}},
                                     base_dir=tmp_path)).document
    assert document["layers"]["memory"]["summary"]["peak_memory_bytes"] == predicted


# Bounds ---------------------------------------------------------------------------------------------
def _simulated(tmp_path: Path, data: dict[str, Any], layout: Layout) -> float:
    spec = job_with(data, layout).model_dump(mode="json")
    document = run.simulate(run.load({**manifest(spec), "output": {"dir": str(tmp_path / layout.label())}},
                                     base_dir=tmp_path)).document
    return float(document["training"]["step_time_s"])


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(index=st.integers(0, 10_000), topk=st.sampled_from([1, 2, 4]), shared=st.sampled_from([0, 512]),
       dense=st.sampled_from(["none", "first", "every-2nd"]), precision=st.sampled_from(["bf16", "fp8"]))
def test_the_bounds_are_never_above_the_simulated_step(tmp_path, index, topk, shared, dense, precision):
    pattern = {"first": {"dense_layers_first": 1}, "every-2nd": {"moe_layer_step": 2}}.get(dense, {})
    model = {**MOE, "topk": topk, "shared_expert_ffn": shared, **pattern}
    data = job(model, 16, global_batch=16, precision=precision)
    found = enumerate_layouts(data, 8, micro_batches=(1, 2), recompute=("none", "full"), max_cp=2)
    layout = found.layouts[index % len(found.layouts)]
    spec = found.specs[layout]
    tight = ComputeBound(manifest(data), tmp_path, make_plugin_host(), PROFILE, 8, 16, "hopper")
    step = _simulated(tmp_path, data, layout)
    loose, close = lower_bound_s(spec, load_profile(PROFILE), achievable()), tight.bound_s(spec)
    assert 0 < loose <= step and 0 < close <= step, (layout.label(), loose, close, step)


@pytest.mark.parametrize("parallel", [{"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True},
                                      {"moe_token_dispatcher": "flex"}, {"moe_token_dispatcher": "allgather"}])
def test_the_bounds_stay_below_the_step_with_the_ep_overlap_and_deepep(tmp_path, parallel):
    """With the EP all-to-all overlap the dispatch and combine may hide behind another micro-batch's
    compute, so the compute-model bound counts them 0 (it would pass the step at EP 16 otherwise)."""
    model = {**MOE, "layers": 8, "hidden": 1024, "num_experts": 16, "topk": 4, "moe_ffn_hidden": 1024}
    data = job(model, 32, seq=2048, parallel=parallel)
    tight = ComputeBound(manifest(data), tmp_path, make_plugin_host(), PROFILE, 8, 32, "hopper")
    for layout in (Layout(1, 2, 2, 1, 16, 1, "none", True, 16, 1), Layout(1, 1, 1, 1, 32, 1, "none", True, 16, 1)):
        spec = job_with(data, layout)
        step = _simulated(tmp_path, data, layout)
        assert 0 < lower_bound_s(spec, load_profile(PROFILE), achievable()) <= tight.bound_s(spec) <= step


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(index=st.integers(0, 10_000), topk=st.sampled_from([2, 4]), micro=st.sampled_from([1, 2]))
def test_the_bounds_with_the_ep_overlap_are_never_above_the_simulated_step(tmp_path, index, topk, micro):
    """Layouts of a job with the combined 1F1B all-to-all overlap (EP inside and across nodes,
    pipelines with interleaving): the all-to-alls a stage runs one after another bound its step."""
    model = {**MOE, "layers": 8, "hidden": 1024, "num_experts": 16, "topk": topk, "moe_ffn_hidden": 1024}
    data = job(model, 32, seq=2048, global_batch=32,
               parallel={"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True})
    found = enumerate_layouts(data, 8, micro_batches=(micro,), recompute=("none",), max_cp=1)
    layout = found.layouts[index % len(found.layouts)]
    tight = ComputeBound(manifest(data), tmp_path, make_plugin_host(), PROFILE, 8, 32, "hopper")
    step = _simulated(tmp_path, data, layout)
    assert 0 < tight.bound_s(found.specs[layout]) <= step, (layout.label(), step)


def test_the_all_to_alls_of_an_overlapped_expert_layer_bound_its_step(tmp_path):
    """EP 32 over four nodes: the compute bound alone is far below the step, the all-to-alls are not."""
    model = {**MOE, "layers": 8, "hidden": 1024, "num_experts": 32, "topk": 8, "moe_ffn_hidden": 512}
    data = job(model, 32, seq=4096, parallel={"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True})
    layout = Layout(1, 1, 1, 1, 32, 1, "none", True, 32, 1)
    spec = job_with(data, layout)
    tight = ComputeBound(manifest(data), tmp_path, make_plugin_host(), PROFILE, 8, 32, "hopper")
    pieces = tight._pieces(spec, Placement(spec, 8), 0)
    ep_forward, ep_backward = pieces.moe_ep
    assert ep_forward > 0 and ep_backward > 0
    all_to_alls = spec.microbatches * 8 * (ep_forward + ep_backward)
    compute = spec.microbatches * 8 * sum(pieces.moe)
    assert all_to_alls > compute     # this layout's step is set by its all-to-alls
    assert all_to_alls <= tight.bound_s(spec) <= _simulated(tmp_path, data, layout)


def test_one_expert_with_top1_bounds_as_the_dense_mlp_plus_the_router():
    """num_experts 1, topk 1, moe_ffn_hidden = ffn_hidden, etp = tp: the expert GEMMs are the dense
    MLP's, so the FLOP bound adds only the router's bf16 GEMMs (t x h x 1, forward and backward)."""
    one = {**DENSE, "num_experts": 1, "topk": 1}
    profile, compute = load_profile(PROFILE), achievable()
    layout = Layout(2, 2, 1, 1, 4, 1, "none", True)
    dense = lower_bound_s(job_with(job(DENSE), layout), profile, compute)
    moe_spec = job_with(job(one), Layout(2, 2, 1, 1, 4, 1, "none", True, 1, 2))
    router = 3 * 2 * (1024 // 2) * DENSE["hidden"] * 1 / (compute.matmul_ceiling_flops("bf16") or 1.0)
    # the busiest stage's layers, every micro-batch (32 / dp 4 = 8); the fill adds its first chunk's
    layers = DENSE["layers"] // 2
    assert lower_bound_s(moe_spec, profile, compute) - dense == pytest.approx(router * layers * (8 + 1), rel=1e-6)


# Marks and the table --------------------------------------------------------------------------------
def test_a_mark_is_the_jobs_layout_or_keys_over_it():
    data = job(parallel={"tp": 2, "pp": 2, "ep": 4, "etp": 1})
    assert parse_mark("job", data) == Layout(2, 2, 1, 1, 4, 1, "none", True, 4, 1)
    assert parse_mark("tp=1,ep=8,mb=2,dist_opt=false", data) == Layout(1, 2, 1, 1, 8, 2, "none", False, 8, 1)
    assert job_layout(JobSpec.model_validate(job(DENSE))) == Layout(1, 1, 1, 1, 16, 1, "none", True)
    with pytest.raises(ManifestError, match="must divide model.num_experts"):
        parse_mark("ep=3", data)
    with pytest.raises(ManifestError, match="KEY=VALUE"):
        parse_mark("experts=4", data)


def test_plan_ranks_a_marked_layout_and_shows_expert_sizes(tmp_path):
    data = job(parallel={"tp": 2, "pp": 2, "ep": 4, "etp": 1})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest(data)))
    out = tmp_path / "plan"
    result = CliRunner().invoke(main, ["plan", str(path), "--top", "1", "--micro-batches", "1", "--ep", "1,4",
                                       "--mark", "job", "--out", str(out), "-j", "1"])
    assert result.exit_code == 0, result.output
    marked = "TP2 PP2 VP1 CP1 DP4 EP4 ETP1 MB1 none dist-opt"
    assert f"marked {marked}: #" in result.output and "simulated" in result.output
    rows = list(csv.DictReader((out / "plan.csv").open()))
    assert list(rows[0])[6:10] == ["dp", "ep", "etp", "edp"]
    assert {row["ep"] for row in rows} == {"1", "4"}
    mine = next(row for row in rows if row["layout"] == marked)
    assert mine["status"] == SIMULATED and int(mine["edp"]) == 2
    summary = json.loads((out / "plan.json").read_text())
    assert summary["marked"][0]["layout"] == marked and summary["settings"]["ep"] == [1, 4]
    assert summary["marked"][0]["rank"] == int(mine["rank"])
    assert all(float(row["bound_s"]) <= float(row["step_s"]) for row in rows if row["status"] == SIMULATED)


def test_a_dense_plans_table_has_no_expert_columns(tmp_path):
    found = plan(manifest(job(DENSE)), tmp_path, tmp_path / "out",
                 PlanOptions(top=1, batch=2, search={"micro_batches": (1,), "recompute": ("none",),
                                                     "distributed_optimizer": (True,), "max_cp": 1}),
                 Execution(workers=1))
    assert not found.headroom.moe and "EP" not in found.headroom.describe()
    assert all("ep" not in row and "EP" not in str(row["layout"]) for row in found.rows())


def test_a_relative_routing_histogram_is_read_beside_the_manifest(tmp_path, monkeypatch):
    """plan validates every layout's job again: a histogram file named relative to the manifest
    is found from any working folder."""
    folder = tmp_path / "jobs"
    folder.mkdir()
    (folder / "tokens.txt").write_text("\n".join(str(v) for v in (40, 30, 10, 10, 4, 3, 2, 1)))
    data = job(parallel={"tp": 1, "pp": 1, "ep": 4, "etp": 1}, routing={"histogram": "tokens.txt"})
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(manifest(data)))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "plan"
    result = CliRunner().invoke(main, ["plan", str(path), "--top", "1", "--micro-batches", "1", "--ep", "4",
                                       "--out", str(out), "-j", "1"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((out / "plan.csv").open()))
    assert any(row["status"] == SIMULATED for row in rows)
