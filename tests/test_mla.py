"""Multi-head latent attention, multi-token prediction, QK norms and custom pipeline layouts (issue 34):
the DeepSeek-V3 preset's sizes against its model card, MLA's kernels at their shapes and TP splits
with FLOPs in closed form, the trace's FLOPs against Megatron-Core's formula, MTP adding exactly its
layer's kernels on the last stage, a folded run equal to an unfolded one, the validation rules, and
dense jobs echoing none of the new keys."""

from __future__ import annotations

from typing import Any

import pytest

from chakra_core.et.attrs import NodeView
from chakra_core.jobs.flops import formulas, model_flops
from chakra_core.jobs.layout import expand, mtp_layers_in
from chakra_core.jobs.models import preset
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.spec import JobSpec
from chakra_core.schema import pb
from tests.simhelpers import job_folded_and_unfolded

PROFILE = "h100-hgx-ndr400"
MLA = {"layers": 4, "hidden": 512, "ffn_hidden": 1408, "heads": 8, "vocab": 8000, "q_lora_rank": 192,
       "kv_lora_rank": 128, "qk_head_dim": 64, "qk_pos_emb_head_dim": 32, "v_head_dim": 64, "qk_layernorm": True}
MOE = {"num_experts": 8, "topk": 2, "moe_ffn_hidden": 256, "shared_expert_ffn": 256, "dense_layers_first": 1}
NEW_KEYS = {"q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "qk_layernorm",
            "mtp_num_layers", "make_vocab_size_divisible_by", "router_score_function", "router_groups",
            "router_group_topk", "router_expert_bias"}


def job(model: dict[str, Any] | str, tp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1, seq: int = 1024,
        microbatches: int = 2, layout: str | None = None, **training: Any) -> JobSpec:
    parallel: dict[str, Any] = {"tp": tp, "pp": pp, "ep": ep, **({"etp": 1} if ep > 1 else {})}
    if layout is not None:
        parallel["pipeline_layout"] = layout
    return JobSpec.model_validate({
        "name": "mla", "model": model, "parallel": parallel,
        "training": {"seq": seq, "global_batch": microbatches * dp, "micro_batch": 1, **training},
        "cluster": {"gpus": tp * pp * dp, "profile": PROFILE}})


def nodes_of(spec: JobSpec, rank: int) -> list[pb.Node]:
    return RankProgram(spec, Placement(spec, 8), rank).build()


def by_name(nodes: list[pb.Node]) -> dict[str, NodeView]:
    return {n.name: NodeView(n) for n in nodes}


def gemm_shape(view: NodeView) -> tuple[int, int, int]:
    return view.int("gemm_m"), view.int("gemm_k"), view.int("gemm_n")


# Sizes ---------------------------------------------------------------------------------------------------
def test_deepseek_v3_has_its_published_sizes():
    """671B parameters without the MTP module, 11.5B in it, 685B with its copies of the embedding and
    output head as the Hugging Face checkpoint counts them (README_WEIGHTS.md at deepseek-ai/DeepSeek-V3
    9b4e978; the model card). Activated: the card says 37B; counting the embedding, the output layer,
    attention, the dense MLPs and 8 routed + 1 shared expert per MoE layer gives 37.55B (1.5% more:
    the card rounds, and README_WEIGHTS.md's 36.7B "including" both embeddings is 2.3% less)."""
    m = preset("deepseek-v3")
    assert m.params() == pytest.approx(671e9, rel=0.01)
    assert m.mtp_params() == pytest.approx(11.5e9, rel=0.01)
    assert m.params() + m.mtp_params() + 2 * m.vocab * m.hidden == pytest.approx(685e9, rel=0.01)
    assert m.active_params() == pytest.approx(37e9, rel=0.02)
    assert m.padded_vocab(2) == 130560   # Megatron-Bridge pads to 1280 x TP


def test_qwen3_presets_normalize_queries_and_keys_and_keep_their_sizes():
    for name, total in (("qwen3-30b-a3b", 30.5e9), ("qwen3-235b-a22b", 235e9)):
        m = preset(name)
        assert m.qk_layernorm and m.params() == pytest.approx(total, rel=0.01)


# Latent attention's kernels ---------------------------------------------------------------------------------
@pytest.mark.parametrize("q_lora", [192, None])
def test_latent_attention_kernels_have_their_shapes_tp_splits_and_flops(q_lora):
    """TP 2, sequence parallel: the down-projections on the rank's own tokens with the whole weight,
    the up-projections and the output projection split over the heads, the latents and the rope keys
    all-gathered, core attention with q.k over nope + rope and p.v over v."""
    model = {**MLA, "q_lora_rank": q_lora}
    spec = job(model, tp=2)
    views = by_name(nodes_of(spec, 0))
    h, s, a, t = 512, 1024, 8 // 2, 1024 // 2
    nope, rope, v, kv_lora = 64, 32, 64, 128
    dqk = nope + rope
    p = "mb0.L0."
    assert gemm_shape(views[p + "kv_down"]) == (t, h, kv_lora + rope)
    if q_lora:
        assert gemm_shape(views[p + "q_down"]) == (t, h, q_lora)
        assert gemm_shape(views[p + "q_up"]) == (s, q_lora, a * dqk)
        assert views[p + "q_up.tp_all_gather"].int("comm_size") == t * q_lora * 2
        assert views[p + "q_norm"].int("num_ops") == 4 * t * q_lora
    else:
        assert p + "q_down" not in views
        assert gemm_shape(views[p + "q_proj"]) == (s, h, a * dqk)
    assert gemm_shape(views[p + "kv_up"]) == (s, kv_lora, a * (nope + v))
    assert gemm_shape(views[p + "proj"]) == (s, a * v, h)
    assert views[p + "kv_up.tp_all_gather"].int("comm_size") == t * kv_lora * 2
    assert views[p + "k_pos_emb.tp_all_gather"].int("comm_size") == t * rope * 2
    assert p + "qkv.tp_all_gather" not in views   # no gather of the h-wide hidden state
    forward, backward = views[p + "attention"], views[p + "attention.bwd"]
    pairs = a * s * s // 2   # causal: half the score matrix
    assert forward.int("num_ops") == 2 * pairs * (dqk + v)
    assert backward.int("num_ops") == 2 * pairs * (3 * dqk + 2 * v)
    assert forward.int("attn_head_dim") == dqk and forward.int("attn_head_dim_v") == v
    assert forward.int("tensor_size") == 2 * a * s * (dqk + v) * 2   # q, k of dqk; v, o of dv
    for name in ("kv_down", "kv_up", "proj"):   # the backward mirrors each GEMM
        m, k, n = gemm_shape(views[p + name])
        assert gemm_shape(views[p + name + ".dgrad"]) == (m, n, k)
        wm, wk, wn = gemm_shape(views[p + name + ".wgrad"])
        assert wk == m and {wm, wn} == {k, n}


def test_the_trace_runs_megatron_cores_flops():
    """TP 1, one stage, dense latent attention with MTP: three times the forward GEMMs and core
    attention of the trace is Megatron-Core's num_floating_point_operations, less what that formula
    counts for the norms (one multiply-add per latent element, 3h per MTP layer)."""
    model = {**MLA, "mtp_num_layers": 1}
    spec = job(model, microbatches=2)
    forward = sum(NodeView(n).int("num_ops") for n in nodes_of(spec, 0)
                  if n.type == pb.COMP_NODE and NodeView(n).str("step_part") == "forward"
                  and NodeView(n).str("kernel") in ("gemm", "attention"))
    tokens, layers = 2 * 1024, 4 + 1
    norms = 6 * tokens * (layers * (192 + 128) + 3 * 512)
    assert 3 * forward == model_flops(spec, "megatron_bridge") - norms
    assert formulas(spec) == ("megatron_bridge",)
    with pytest.raises(ValueError, match="counts no latent attention"):
        model_flops(spec, "nemo")


def test_the_achievable_layer_times_latent_attention_by_its_flops():
    """An attention node takes its FLOPs at FlashAttention's rate for its pass and sequence: q.k of
    96 and p.v of 64 take (96 + 64) / (2 x 128) of a head-size-128 kernel's time, less the gap."""
    from chakra_core import LayerContext, RunInputs
    from chakra_core.hardware.profiles import load_profile
    from chakra_core.testing import EventQueue
    from chakra_sim_compute_achievable import AchievableCompute, AchievableConfig
    from chakra_sim_compute_achievable.effects import AchievableEffects
    from chakra_sim_compute_achievable.section import AchievableSpec

    bare = {name: False for name in AchievableEffects.model_fields}
    compute = AchievableCompute(AchievableConfig(profile="h100-sxm-hgx", effects=bare),
                                LayerContext(num_ranks=1, scheduler=EventQueue(), inputs=RunInputs()))
    gap = load_profile("h100-sxm-hgx").section("gpu.achievable", AchievableSpec).kernel_gap_us.value * 1e3

    def attention(model: dict[str, Any], backward: bool) -> NodeView:
        name = "mb0.L0.attention" + (".bwd" if backward else "")
        return next(NodeView(n) for n in nodes_of(job(model, seq=4096, microbatches=1), 0) if n.name == name)
    standard = {"layers": 4, "hidden": 512, "ffn_hidden": 1408, "heads": 8, "kv_channels": 128, "vocab": 8000}
    for backward, share in ((False, (96 + 64) / 256), (True, (3 * 96 + 2 * 64) / (5 * 128))):
        latent, uniform = attention(MLA, backward), attention(standard, backward)
        assert latent.int("num_ops") / uniform.int("num_ops") == pytest.approx(share)
        times = [compute.compute_time_ns(0, node) - gap for node in (latent, uniform)]
        assert times[0] / times[1] == pytest.approx(share, rel=1e-3)


# Multi-token prediction ---------------------------------------------------------------------------------------
def _work(nodes: list[pb.Node]) -> list[tuple[str, str, int]]:
    """The forward and backward compute kernels: (name, kind, FLOPs)."""
    out = []
    for node in nodes:
        view = NodeView(node)
        if node.type == pb.COMP_NODE and view.str("step_part") in ("forward", "backward"):
            out.append((node.name, view.str("kernel"), view.int("num_ops")))
    return out


def test_mtp_adds_exactly_its_layers_kernels_on_the_last_stage():
    """PP 2: the first stage runs what it ran without MTP (its only new work: the embedding gradient's
    all-reduce with the last stage, which now holds a copy); the last stage runs every kernel it ran
    before, plus the MTP layer's: its embedding, norms, eh_proj, a transformer layer with the very
    kernels of the last decoder layer (a MoE layer), its final norm, and one more output layer."""
    model = {**MLA, **MOE}
    plain, with_mtp = job(model, tp=2, pp=2, ep=2), job({**model, "mtp_num_layers": 1}, tp=2, pp=2, ep=2)
    first = [n.name for n in nodes_of(with_mtp, 0)]
    assert [n for n in first if n != "grads.embedding_all_reduce"] == [n.name for n in nodes_of(plain, 0)]
    assert "grads.embedding_all_reduce" in first
    before, after = _work(nodes_of(plain, 2)), _work(nodes_of(with_mtp, 2))
    added = [kernel for kernel in after if ".mtp" in kernel[0]]
    assert [kernel for kernel in after if ".mtp" not in kernel[0]] == before
    for mb in range(2):
        layer = [(name.split("layer.", 1)[1], kind, ops) for name, kind, ops in added
                 if name.startswith(f"mb{mb}.mtp0.layer.")]
        last = [(name.split(".L3.", 1)[1], kind, ops) for name, kind, ops in before if name.startswith(f"mb{mb}.L3.")]
        assert layer == last
        rest = {name.split(".", 1)[1] for name, _, _ in added if name.startswith(f"mb{mb}.mtp")
                and ".layer." not in name}
        assert rest == {"mtp0.embedding", "mtp0.enorm", "mtp0.hnorm", "mtp0.concat", "mtp0.eh_proj",
                        "mtp0.eh_proj.regroup", "mtp0.final_norm", "mtp.concat_hidden", "mtp0.lm_head",
                        "mtp0.cross_entropy", "mtp0.acceptance_argmax", "mtp0.cross_entropy.bwd",
                        "mtp0.lm_head.dgrad", "mtp0.lm_head.wgrad", "mtp0.final_norm.bwd",
                        "mtp0.eh_proj.bwd.regroup", "mtp0.eh_proj.dgrad", "mtp0.eh_proj.wgrad", "mtp0.enorm.bwd",
                        "mtp0.hnorm.bwd", "mtp0.embedding.bwd", "mtp0.hidden_grad_add"}


def test_pipeline_layouts_place_layers_as_megatron_does():
    """DeepSeek-V3's published layout over PP 8: the embedding and one layer first, two layers in each
    of the next 30 virtual stages, the MTP layer and the loss last; virtual stage i is pipeline rank
    i mod 8's chunk i div 8."""
    spec = job("deepseek-v3", tp=2, pp=8, dp=8, ep=16, seq=4096, microbatches=8, layout="Et|(tt|)*30mL")
    assert spec.vp == 4 and len(expand("Et|(tt|)*30mL")) == 32
    placed = [layer for chunk in range(4) for stage in range(8) for layer in spec.chunk_layers(stage, chunk)]
    assert placed == list(range(61))
    assert spec.chunk_layers(0, 0) == [0] and spec.chunk_layers(1, 0) == [1, 2] and spec.chunk_layers(7, 3) == []
    assert [mtp_layers_in(spec, stage, 3) for stage in range(8)] == [0] * 7 + [1]
    assert "pipeline_layout" not in job(MLA).model_dump()["parallel"]


@pytest.mark.parametrize("overlap", [False, True])
def test_a_folded_run_equals_every_rank_simulated(tmp_path, overlap):
    """Latent attention, MoE with the expert bias, MTP, a custom layout, fp8, and the combined EP
    overlap schedule with delayed weight gradients (MTP layers run whole in the head's passes):
    folding still holds."""
    model = {**MLA, **MOE, "mtp_num_layers": 1, "router_expert_bias": True, "router_score_function": "sigmoid",
             "router_groups": 4, "router_group_topk": 2}
    spec = job(model, tp=2, pp=2, dp=2, ep=2, microbatches=4, layout="Et|t|t|tmL", precision="fp8",
               fp8_recipe="current").model_dump(mode="json")
    if overlap:
        spec["parallel"].update(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True)
    finish = job_folded_and_unfolded(spec, tmp_path)
    assert finish["auto"] == finish["off"]


# QK norms and the router's expert bias ---------------------------------------------------------------------
def test_qk_layernorm_normalizes_each_head_and_reduces_its_weights_over_tp():
    dense = {"layers": 2, "hidden": 512, "ffn_hidden": 1408, "heads": 8, "kv_heads": 4, "vocab": 8000}
    plain, normed = nodes_of(job(dense, tp=2), 0), nodes_of(job({**dense, "qk_layernorm": True}, tp=2), 0)
    views = by_name(normed)
    n, d = 1024, 64
    assert views["mb0.L0.q_norm"].int("num_ops") == 4 * n * 4 * d      # 4 query heads here
    assert views["mb0.L0.k_norm"].int("num_ops") == 4 * n * 2 * d      # 2 key heads here
    assert "mb0.L0.q_norm.bwd" in views and "mb0.L0.k_norm.bwd" in views
    reduce = [by_name(nodes)["grads.tp_norm_all_reduce"].int("comm_size") for nodes in (plain, normed)]
    assert reduce[1] - reduce[0] == 2 * 2 * d * 4   # two layers' q and k norm weights, fp32 gradients


def test_the_expert_bias_counts_tokens_and_all_reduces_them_over_the_stage():
    model = {**MLA, **MOE, "router_expert_bias": True}
    nodes = by_name(nodes_of(job(model, tp=2, dp=2, ep=2), 0))
    assert nodes["mb0.L1.moe.tokens_per_expert"].int("num_ops") == 512 * 8
    assert nodes["grads.expert_bias_all_reduce"].int("comm_size") == 3 * 8 * 4   # 3 MoE layers, fp32
    assert "mb0.L0.moe.tokens_per_expert" not in nodes   # the first layer is dense


# Validation and echo ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("model", "parallel", "message"), [
    ({**MLA, "kv_heads": 4}, {}, "latent attention has a key and value per head"),
    ({**MLA, "kv_lora_rank": None}, {}, "describe multi-head latent attention: give kv_lora_rank too"),
    ({**MLA, **MOE, "router_groups": 3, "router_group_topk": 2}, {}, "router_groups 3 must divide num_experts 8"),
    ({**MLA, **MOE, "router_groups": 4}, {}, "router_groups and router_group_topk go together"),
    (MLA, {"tp": 2, "sp": False}, "parallel.sp false with tp > 1 and latent attention"),
    (MLA, {"pp": 2, "pipeline_layout": "Et|ttL"}, "holds 3 transformer layers"),
    ({**MLA, "mtp_num_layers": 1}, {"pp": 2, "pipeline_layout": "Etmt|ttL"}, "in the virtual stage of the loss"),
    (MLA, {"pp": 2, "vp": 2, "pipeline_layout": "Et|ttt|L"}, "not a multiple of pp 2"),
    (MLA, {"pp": 2, "vp": 4, "pipeline_layout": "Et|tt|t|L"}, "parallel.vp 4 with a pipeline_layout of 4 virtual"),
    (MLA, {"pp": 2, "pipeline_layout": "Et|tt|tX|L"}, "unknown layer character"),
])
def test_validation_names_the_key(model, parallel, message):
    gpus = parallel.get("tp", 1) * parallel.get("pp", 1)
    with pytest.raises(ValueError, match=message):
        JobSpec.model_validate({"name": "mla", "model": model, "parallel": parallel,
                                "training": {"seq": 1024, "global_batch": 4}, "cluster": {"gpus": gpus, "profile": PROFILE}})


def test_dense_and_earlier_jobs_echo_no_new_keys():
    """results.json and the trace cache's digest echo the job: models and layouts written before latent
    attention, MTP and layouts existed echo what they echoed then (OPTIONAL_KEYS); a model that sets
    the keys echoes them."""
    for model in ({"layers": 2, "hidden": 512, "ffn_hidden": 1408, "heads": 8, "vocab": 8000}, "llama3-8b",
                  "mixtral-8x7b"):
        dumped = job(model).model_dump(mode="json")
        assert not NEW_KEYS & set(dumped["model"]) and "pipeline_layout" not in dumped["parallel"]
    echoed = job("deepseek-v3", tp=2, pp=8, dp=8, ep=16, seq=4096, microbatches=8,
                 layout="Et|(tt|)*30mL").model_dump(mode="json")
    assert NEW_KEYS <= set(echoed["model"]) and echoed["parallel"]["pipeline_layout"] == "Et|(tt|)*30mL"
