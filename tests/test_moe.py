"""Mixture-of-experts jobs (issue 34): tokens conserved through dispatch and combine, the all-to-alls'
bytes in closed form, one expert with top-1 routing is the dense MLP, the expert groups as
Megatron's expert RankGenerator lays them, every collective of an expert group matched, a folded
run equal to an unfolded one, the validation rules, a dense job's echo unchanged."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chakra_core import run
from chakra_core.et.attrs import NodeView
from chakra_core.jobs.flops import model_flops
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.spec import JobSpec
from chakra_core.schema import pb
from tests.simhelpers import changed_job, job_folded_and_unfolded

DENSE = {"layers": 4, "hidden": 512, "ffn_hidden": 1408, "heads": 8, "kv_heads": 4, "vocab": 8000}
MOE = {**DENSE, "num_experts": 8, "topk": 2, "moe_ffn_hidden": 512}
PROFILE = "h100-hgx-ndr400"


def job(model: dict[str, Any] | None = None, tp: int = 1, pp: int = 1, dp: int = 1, cp: int = 1, ep: int = 1,
        etp: int | None = None, seq: int = 1024, microbatches: int = 2, **training: Any) -> JobSpec:
    parallel: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "ep": ep}
    if etp is not None:
        parallel["etp"] = etp
    return JobSpec.model_validate({
        "name": "moe", "model": model or MOE, "parallel": parallel,
        "training": {"seq": seq, "global_batch": microbatches * dp, "micro_batch": 1, **training},
        "cluster": {"gpus": tp * pp * cp * dp, "profile": PROFILE}})


def nodes_of(spec: JobSpec, rank: int) -> list[pb.Node]:
    return RankProgram(spec, Placement(spec, 8), rank).build()


def moe_layers_here(spec: JobSpec, stage: int) -> int:
    return sum(1 for chunk in range(spec.vp) for layer in spec.chunk_layers(stage, chunk)
               if spec.shape.is_moe_layer(layer))


def routed(spec: JobSpec) -> int:
    """Token copies a rank routes per micro-batch: its sequence-parallel share x topk."""
    p = spec.parallel
    return spec.training.seq // p.cp // p.tp * spec.shape.router_topk


def collectives(nodes: list[pb.Node], part: str | None = None) -> list[NodeView]:
    views = [NodeView(n) for n in nodes if n.type == pb.COMM_COLL_NODE]
    return [v for v in views if part is None or v.str("step_part") == part]


layouts = st.fixed_dictionaries({
    "tp": st.sampled_from([1, 2]), "cp": st.sampled_from([1, 2]), "dp": st.sampled_from([1, 2, 4]),
    "ep": st.sampled_from([1, 2, 4]), "etp": st.sampled_from([None, 1]), "topk": st.sampled_from([1, 2, 4]),
    "shared": st.sampled_from([0, 1024]), "dense_first": st.sampled_from([0, 1]),
})


def _layout_job(layout: dict[str, Any]) -> JobSpec | None:
    etp = layout["etp"] or layout["tp"]
    if (layout["tp"] * layout["cp"] * layout["dp"]) % (layout["ep"] * etp):
        return None
    model = {**MOE, "topk": layout["topk"], "shared_expert_ffn": layout["shared"],
             "dense_layers_first": layout["dense_first"]}
    return job(model, tp=layout["tp"], cp=layout["cp"], dp=layout["dp"], ep=layout["ep"], etp=layout["etp"])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts)
def test_tokens_are_conserved_through_dispatch_experts_and_combine(layout):
    """Over a pipeline stage, the experts compute every routed token copy once per expert-TP
    shard (balanced routing drops none), each all-to-all moves the same buffer on every member of
    its EP group (what the group sends is what it receives) and combine returns what dispatch sent."""
    spec = _layout_job(layout)
    if spec is None:
        return
    layers = moe_layers_here(spec, 0)
    computed = 0
    for rank in range(spec.cluster.gpus):
        nodes = nodes_of(spec, rank)
        for node in nodes:
            view = NodeView(node)
            if node.type == pb.COMP_NODE and node.name.endswith("moe.fc1"):
                computed += view.int("gemm_m") * view.int("gemm_batch")
        a2a = [v for v in collectives(nodes, "ep") if v.int("comm_type") == pb.ALL_TO_ALL]
        tokens = [v.int("comm_size") for v in a2a if not v.pb.name.endswith("_probs")]
        assert tokens == [routed(spec) * spec.shape.hidden * 2] * len(tokens)   # dispatch == combine
    etp = spec.parallel.expert_tp
    stage_tokens = spec.dp * spec.training.seq * spec.microbatches   # every replica's micro-batches
    assert computed == etp * stage_tokens * spec.shape.router_topk * layers


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts)
def test_balanced_all_to_all_bytes_equal_the_closed_form(layout):
    """Per MoE layer and micro-batch: four token all-to-alls (dispatch, combine and their
    backwards) of t x topk x h bf16 and two of the probabilities (t x topk bf16), t the rank's
    sequence-parallel tokens; with etp > 1 the same buffers all-gathered and reduce-scattered; the
    forward's token counts gathered once."""
    spec = _layout_job(layout)
    if spec is None:
        return
    views = collectives(nodes_of(spec, 0), "ep")
    sizes: Counter[int] = Counter()
    counts = 0
    for v in views:
        if v.name.endswith(".counts_all_gather"):
            counts += v.int("comm_size")
        else:
            sizes[v.int("comm_type")] += v.int("comm_size")
    per = spec.microbatches * moe_layers_here(spec, 0)
    h, r, ep, etp = spec.shape.hidden, routed(spec), spec.parallel.ep, spec.parallel.expert_tp
    # the forward's token counts (int64 per expert), gathered over expert TP x EP before the all-to-all
    assert counts == (per * spec.shape.num_experts * 8 if ep * etp > 1 else 0)
    assert sizes[pb.ALL_TO_ALL] == (per * (4 * r * h * 2 + 2 * r * 2) if ep > 1 else 0)
    assert sizes[pb.ALL_GATHER] == (per * (2 * r * h * 2 + r * 2) if etp > 1 else 0)
    assert sizes[pb.REDUCE_SCATTER] == (per * etp * (2 * r * h * 2 + r * 2) if etp > 1 else 0)


@pytest.mark.parametrize("tp", [1, 2])
def test_one_expert_with_top1_is_the_dense_mlp(tmp_path, tp):
    """num_experts 1, topk 1, moe_ffn_hidden = ffn_hidden: the expert GEMMs are the dense MLP's
    (same shapes and FLOPs), the model FLOPs are the dense model's (Megatron does not count the
    router); the step adds only the router, its top-k and the permutations (no EP, no expert TP
    collectives beyond the dense MLP's: with etp = tp the dispatcher's all-gather and reduce-scatter
    take the places of the MLP's sequence-parallel ones)."""
    one = {**DENSE, "num_experts": 1, "topk": 1}
    dense, moe = job(DENSE, tp=tp), job(one, tp=tp)
    assert model_flops(moe, "megatron_bridge") == model_flops(dense, "megatron_bridge")

    def gemms(spec: JobSpec, marks: tuple[str, ...]) -> list[tuple[str, int, int, int, int, int]]:
        out = []
        for node in nodes_of(spec, 0):
            view = NodeView(node)
            if node.type == pb.COMP_NODE and view.str("kernel") == "gemm" and any(m in node.name for m in marks):
                suffix = node.name.split(".")[-1] if node.name.endswith(("dgrad", "wgrad")) else "fwd"
                out.append((node.name.split(".fc")[1][0] + suffix, view.int("gemm_m"), view.int("gemm_n"),
                            view.int("gemm_k"), view.int("gemm_batch"), view.int("num_ops")))
        return out
    assert gemms(moe, (".moe.fc1", ".moe.fc2")) == gemms(dense, (".fc1", ".fc2"))
    steps = {}
    for name, spec in (("dense", dense), ("moe", moe)):
        data = {"job": spec.model_dump(mode="json"), "output": {"dir": str(tmp_path / name)},
                "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
        steps[name] = run.simulate(run.load(data, base_dir=tmp_path)).results.training
    assert steps["moe"] is not None and steps["dense"] is not None
    extra = steps["moe"].step_time_s / steps["dense"].step_time_s - 1
    assert 0 < extra < 0.25, extra   # the router, top-k and permutations: a few small kernels per layer


def test_expert_groups_follow_megatrons_expert_rank_generator():
    """Order tp-ep-dp over each stage's ranks with etp as the tensor size (parallel_state.py):
    16 ranks, tp 2, pp 2, dp 4, ep 4, etp 1: a stage of 8 ranks holds 2 EP groups of 4 consecutive
    ranks and edp pairs 4 apart."""
    spec = job(MOE, tp=2, pp=2, dp=4, ep=4, etp=1)
    groups = Placement(spec, 8).groups(13)
    assert groups["ep"] == (12, 13, 14, 15) and groups["edp"] == (9, 13) and "etp" not in groups
    groups = Placement(job(MOE, tp=2, dp=4, ep=2), 8).groups(5)   # etp defaults to tp
    assert groups["etp"] == (4, 5) and groups["ep"] == (5, 7) and groups["edp"] == (1, 5)


def test_every_expert_collective_meets_the_same_collective_on_every_member():
    spec = job(MOE, tp=2, pp=2, dp=4, ep=2)
    placement = Placement(spec, 8)
    seen: dict[tuple[int, ...], set[tuple[tuple[int, int], ...]]] = defaultdict(set)
    for rank in range(spec.cluster.gpus):
        groups = placement.groups(rank)
        names = {Placement.group_name(role, members): members for role, members in groups.items()}
        calls: dict[tuple[int, ...], list[tuple[int, int]]] = defaultdict(list)
        for view in collectives(nodes_of(spec, rank)):
            members = names[view.str("pg_name")]
            calls[members].append((view.int("comm_type"), view.int("comm_size")))
        for members, sequence in calls.items():
            seen[members].add(tuple(sequence))
    assert seen and all(len(sequences) == 1 for sequences in seen.values())


@pytest.mark.parametrize("etp", [None, 1])
def test_a_folded_run_equals_every_rank_simulated(tmp_path, etp):
    spec = job({**MOE, "shared_expert_ffn": 1024, "dense_layers_first": 1}, tp=2, pp=2, dp=2, ep=2, etp=etp,
               microbatches=4).model_dump(mode="json")
    finish = job_folded_and_unfolded(spec, tmp_path)
    assert finish["auto"] == finish["off"]


def test_expert_gradients_reduce_over_the_expert_data_parallel_group():
    """Dense buckets over dp x cp, expert buckets over edp (Megatron's expert_parallel_buffers),
    each reduced once, their sizes the dense and expert parameters of the stage."""
    spec = job(MOE, tp=2, dp=4, ep=2, etp=1)
    program = RankProgram(spec, Placement(spec, 8), 0)
    nodes = program.build()
    reductions = {v.pb.name: v for v in collectives(nodes, "dp") if v.pb.name.startswith("grads.")}
    dense = sum(v.int("comm_size") for name, v in reductions.items() if name.startswith("grads.dp_"))
    expert = sum(v.int("comm_size") for name, v in reductions.items() if name.startswith("grads.edp_"))
    assert dense == sum(size for _, size in program.plan_buckets()) * 4
    experts_here = 8 // 2 * 3 * 512 * 512   # 4 local experts of a gated 512-wide FFN, no expert TP
    assert expert == 4 * experts_here * 4   # 4 MoE layers, fp32 gradients
    assert {v.str("pg_name") for name, v in reductions.items() if name.startswith("grads.edp_")} == {"edp0"}


def test_the_step_split_shows_the_dispatcher(tmp_path):
    """A small MoE job through run.simulate (achievable compute, nccl): the split gains exposed_ep
    and still sums to the step; the rates use the MoE FLOPs; placement lists the expert groups."""
    spec = job({**MOE, "shared_expert_ffn": 1024}, tp=2, dp=4, ep=4, etp=1, microbatches=2)
    data = {"job": spec.model_dump(mode="json"), "output": {"dir": str(tmp_path)},
            "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
    step = run.simulate(run.load(data, base_dir=tmp_path)).results.training
    assert step is not None
    assert step.breakdown_s["exposed_ep"] > 0
    assert sum(step.breakdown_s.values()) == pytest.approx(step.step_time_s, rel=1e-9)
    assert set(step.tflops_per_gpu_by_formula) == {"nemo", "megatron_bridge"}
    assert {row.group for row in step.placement} >= {"ep", "edp"}


@pytest.mark.parametrize(("changes", "message"), [
    ({"parallel": {"ep": 3}, "cluster": {"gpus": 3}}, "parallel.ep 3 must divide model.num_experts 8"),
    ({"parallel": {"ep": 4, "tp": 2}, "cluster": {"gpus": 4}},
     r"parallel.ep x parallel.etp = 4 x 2 must divide a pipeline stage's tp x cp x dp = 4 ranks"),
    ({"model": {**MOE, "topk": 9}}, "topk 9 is more than num_experts 8"),
    ({"model": {**DENSE, "topk": 2}}, "topk describe a mixture of experts: give num_experts too"),
    ({"model": DENSE, "parallel": {"ep": 2}, "cluster": {"gpus": 2}}, "parallel.ep 2 needs a mixture of experts"),
    ({"model": {**MOE, "dense_layers_first": 4}}, "dense_layers_first 4 leaves no MoE layer"),
    ({"parallel": {"tp": 2, "sp": False}, "cluster": {"gpus": 2}}, "parallel.sp false with tp > 1"),
    ({"parallel": {"etp": 3}, "cluster": {"gpus": 3}}, "parallel.etp 3 must divide model.moe_ffn_hidden 512"),
])
def test_validation_names_the_key(changes, message):
    data = changed_job({"name": "moe", "model": MOE, "parallel": {},
                        "training": {"seq": 1024, "global_batch": 4}, "cluster": {"gpus": 1, "profile": PROFILE}}, changes)
    with pytest.raises(ValueError, match=message):
        JobSpec.model_validate(data)


def test_a_dense_job_echoes_no_expert_keys():
    """results.json echoes the job and its layout: a dense one's keys are those before MoE."""
    dumped = job(DENSE).model_dump(mode="json")
    assert not {"ep", "etp"} & set(dumped["parallel"])
    assert not {"num_experts", "topk", "moe_ffn_hidden", "shared_expert_ffn", "dense_layers_first",
                "capacity_factor", "kv_channels"} & set(dumped["model"])


def test_presets_give_their_published_sizes():
    """Total and active parameters of the MoE presets as their model cards give them (within 1%:
    the cards round)."""
    from chakra_core.jobs.models import preset
    published = {"mixtral-8x7b": (46.7e9, 12.9e9), "mixtral-8x22b": (141e9, 39e9),
                 "qwen3-30b-a3b": (30.5e9, 3.3e9), "qwen3-235b-a22b": (235e9, 22e9)}
    for name, (total, active) in published.items():
        m = preset(name)
        assert m.params() == pytest.approx(total, rel=0.01), name
        assert m.active_params() == pytest.approx(active, rel=0.03), name



def test_tensors_list_the_expert_weights_and_the_dispatched_tokens():
    """With tensors: true, the model state holds every MoE layer's routed experts (weights, main
    gradients, optimizer shards over edp) and each MoE layer keeps its dispatched tokens (fc1's
    input) for the backward."""
    from chakra_sim_memory_hbm.tensors import parse_tensors
    data = job(MOE, dp=4, ep=2, etp=1).model_dump(mode="json")
    spec = JobSpec.model_validate({**data, "tensors": True})
    nodes = nodes_of(spec, 0)

    def sizes(text: str) -> list[int]:
        return [elements * width for _, _, _, elements, width, _ in parse_tensors(text)]
    state = [size for node in nodes[:2] for size in sizes(node.outputs.values)]
    experts_here = 8 // 2 * 3 * 512 * 512 * MOE["layers"]   # 4 local experts per layer, gated 512 FFN
    assert experts_here * 2 in state and experts_here * 4 in state        # bf16 weights, fp32 main gradients
    assert experts_here // 2 * 4 in state                                 # an fp32 optimizer shard over edp 2
    fc1 = next(n for n in nodes if n.name.endswith("L0.moe.fc1"))
    assert routed(spec) * MOE["hidden"] * 2 in sizes(fc1.inputs.values)


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_fp8_experts_are_quantized_and_the_router_stays_bf16(tmp_path, recipe):
    """Transformer Engine's GroupedLinear runs the experts in fp8 (their inputs cast first, as no
    fused norm wrote them); the router is a plain linear in bf16; the step simulates."""
    spec = job({**MOE, "shared_expert_ffn": 1024}, tp=2, dp=2, ep=2, precision="fp8", fp8_recipe=recipe)
    nodes = nodes_of(spec, 0)
    names = [n.name for n in nodes]
    dtype = {n.name: NodeView(n).str("dtype") for n in nodes if n.type == pb.COMP_NODE}
    assert dtype["mb0.L0.moe.fc1"] == dtype["mb0.L0.moe.fc2.dgrad"] == "fp8"
    assert dtype["mb0.L0.moe.router"] == "bf16"
    assert "mb0.L0.moe.fc1.cast_fp8" in names and names.index("mb0.L0.moe.fc1.cast_fp8") < names.index("mb0.L0.moe.fc1")
    data = {"job": spec.model_dump(mode="json"), "output": {"dir": str(tmp_path)},
            "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
    step = run.simulate(run.load(data, base_dir=tmp_path)).results.training
    assert step is not None and step.step_time_s > 0
