"""GPT-OSS as Megatron-Core trains it (issue 34): the presets' published sizes, sliding-window
attention's FLOPs in closed form (a window as long as the sequence is causal attention), sinks,
the biases' kernels, selective recomputation of layernorm and moe_act, Megatron-Bridge's FLOPs
counts, a folded run equal to an unfolded one, a dense job's echo unchanged, the validation rules."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from chakra_core.et.attrs import NodeView
from chakra_core.jobs.attention_variants import SINK_FORWARD_OPS, mean_keys, windowed_flops
from chakra_core.jobs.flops import BRIDGE_V030, formulas, model_flops
from chakra_core.jobs.models import preset
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.spec import JobSpec
from chakra_core.schema import pb
from tests.simhelpers import changed_job, job_folded_and_unfolded

PROFILE = "h100-hgx-ndr400"
SMALL = {"layers": 4, "hidden": 512, "ffn_hidden": 512, "heads": 8, "kv_heads": 2, "kv_channels": 64, "vocab": 8000,
         "mlp": "clamped-swiglu", "bias": True, "window": 128, "window_attn_skip_freq": 2, "attention_sinks": True,
         "num_experts": 8, "topk": 2, "moe_ffn_hidden": 512}
"""GPT-OSS's shape in small: alternating windowed and full layers, sinks, biased clamped experts."""
DENSE = {"layers": 4, "hidden": 512, "ffn_hidden": 1408, "heads": 8, "kv_heads": 4, "vocab": 8000}
RECOMPUTE = {"recompute": "selective", "recompute_modules": ["layernorm", "moe_act"]}


def job(model: dict[str, Any] | str = "small", tp: int = 1, pp: int = 1, dp: int = 1, cp: int = 1, ep: int = 1,
        etp: int | None = 1, seq: int = 1024, microbatches: int = 2, **training: Any) -> JobSpec:
    parallel: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "ep": ep, **({"etp": etp} if etp else {})}
    return JobSpec.model_validate({
        "name": "gptoss", "model": SMALL if model == "small" else model, "parallel": parallel,
        "training": {"seq": seq, "global_batch": microbatches * dp, "micro_batch": 1, **training},
        "cluster": {"gpus": tp * pp * cp * dp, "profile": PROFILE}})


def nodes_of(spec: JobSpec, rank: int = 0) -> list[pb.Node]:
    return RankProgram(spec, Placement(spec, 8), rank).build()


def computed(nodes: list[pb.Node]) -> dict[str, NodeView]:
    return {n.name: NodeView(n) for n in nodes if n.type == pb.COMP_NODE}


def test_presets_give_the_model_cards_sizes():
    """OpenAI's model card (arXiv 2508.10925, Table 1): 116.83B and 20.91B parameters, 5.13B and
    3.61B active; the card's active count leaves out the input embedding (a lookup)."""
    for name, total, active in (("gpt-oss-120b", 116.83e9, 5.13e9), ("gpt-oss-20b", 20.91e9, 3.61e9)):
        m = preset(name)
        assert m.params() == pytest.approx(total, rel=0.01), name
        assert m.active_params() - m.vocab * m.hidden == pytest.approx(active, rel=0.01), name


@settings(max_examples=100, deadline=None)
@given(seq=st.integers(1, 600), window=st.integers(1, 600))
def test_windowed_flops_count_the_band_as_the_causal_convention_does(seq, window):
    """The causal kernels count s^2 / 2 pairs: every pair below the diagonal and half of it. A
    window keeps the pairs at distance < w, the diagonal still half: brute force agrees, and a
    window as long as the sequence is the causal count."""
    w = min(window, seq)
    below = sum(min(i, w - 1) for i in range(seq))   # pairs at distance 1 ... w - 1
    assert windowed_flops(1, seq, seq, 1, w) == 4 * (2 * below + seq) // 2
    assert windowed_flops(3, seq, seq, 64, seq) == 4 * 3 * seq * seq * 64 // 2
    assert mean_keys(seq, window) == pytest.approx((below + seq / 2) / seq)


def test_windowed_layers_run_the_band_and_full_layers_the_causal_kernel():
    """Layers 1, 3 (1-based) windowed, 2, 4 full (window_attn_skip_freq 2); the sinks add their
    softmax term; at seq <= window the kernels are those of full attention."""
    s, a, d = 1024, 8, 64
    views = computed(nodes_of(job()))
    for layer in range(4):
        node = views[f"mb0.L{layer}.attention"]
        pairs = (128 * (2 * s - 128 + 1) - s) // 2 if layer % 2 == 0 else s * s // 2
        assert node.int("num_ops") == 4 * a * d * pairs + a * s * SINK_FORWARD_OPS
        assert node.has("attn_window") == (layer % 2 == 0)
    short = computed(nodes_of(job(seq=128)))
    plain = computed(nodes_of(job({**SMALL, "window": None, "window_attn_skip_freq": None}, seq=128)))
    for layer in range(4):
        for name in (f"mb0.L{layer}.attention", f"mb0.L{layer}.attention.bwd"):
            assert short[name].pb.attr == plain[name].pb.attr


def test_megatron_bridge_counts_the_windows_as_the_kernels_run_them():
    """Megatron's count is 3x the forward attention FLOPs (fwd + bwd): what the windows take off
    the formula is 3x what they take off the kernels. Megatron-Bridge 0.3.0 counts no window."""
    windowed, full = job(), job({**SMALL, "window": None, "window_attn_skip_freq": None})
    kernels = {name: sum(v.int("num_ops") for n, v in computed(nodes_of(spec)).items()
                         if n.startswith("mb0.") and n.endswith(".attention"))
               for name, spec in (("windowed", windowed), ("full", full))}
    mbs = windowed.training.global_batch
    saved = model_flops(full, "megatron_bridge") - model_flops(windowed, "megatron_bridge")
    assert saved == pytest.approx(3 * mbs * (kernels["full"] - kernels["windowed"]), rel=1e-9)
    assert model_flops(windowed, BRIDGE_V030) == model_flops(full, BRIDGE_V030)
    assert BRIDGE_V030 in formulas(windowed) and BRIDGE_V030 not in formulas(job(DENSE, etp=None))


def test_megatron_bridge_030_formula_for_gpt_oss_120b():
    """flop_utils.transformer_flops at Megatron-Bridge v0.3.0 for GPT-OSS 120B: quick_gelu is not
    F.silu, so each routed expert counts two GEMMs; attention s / 2 on every layer."""
    spec = job("gpt-oss-120b", pp=4, dp=16, ep=8, seq=4096, microbatches=80)
    B, s, L, h, a, g, d, F, k, V = 1280, 4096, 36, 2880, 64, 8, 64, 2880, 4, 201088
    attention = 12 * L * h * h * ((1 + g / a + s / h / 2) * (d * a / h))
    expected = B * s * (12 * L * h * (F * k * 1) + attention + 6 * h * V)
    assert model_flops(spec, BRIDGE_V030) == pytest.approx(expected, rel=1e-12)
    gated = B * s * 6 * L * h * F * k    # the third GEMM megatron_bridge counts
    assert model_flops(spec, "megatron_bridge") < model_flops(spec, BRIDGE_V030) + gated
    # Megatron-Bridge v0.3.0 docs/performance-summary.md, DGX-H100: this run at 5,993 tokens/s/GPU
    # and 163 Model TFLOP/s/GPU; the count per token reproduces the published rate
    assert 5993 * model_flops(spec, BRIDGE_V030) / (B * s) / 1e12 == pytest.approx(163, abs=0.5)


def test_biases_run_as_megatron_runs_them():
    """QKV and fc1 biases live in TE's GEMM epilogues (no kernel); the output projection's bias is
    its own add (unfused bias-dropout-add); fc2's is scaled by the probabilities, added to the
    local experts' tokens and concatenated: each pass over every received token."""
    spec = job(dp=4, ep=4)
    views = computed(nodes_of(spec))
    received = 1024 * 2 * 4 // 8 * 2    # ep x t x topk / experts per local expert, 2 local experts
    for kind in ("scale", "add", "cat"):
        assert views[f"mb0.L0.moe.fc2_bias.{kind}"].int("num_ops") == received * 512
    assert {"mb0.L0.proj_bias", "mb0.L0.proj_bias.bwd", "mb0.L0.moe.router_bias.bwd"} <= set(views)
    assert "mb0.L0.qkv_bias" not in views and "mb0.L0.moe.fc1_bias" not in views
    unbiased = list(computed(nodes_of(job({**SMALL, "bias": False}, dp=4, ep=4, etp=None))))
    assert not [n for n in unbiased if "bias" in n]


def test_recompute_modules_drop_and_recompute_the_norm_and_the_activation():
    """layernorm: a MoE layer's pre-MLP norm again at the start of its backward; moe_act: the
    clamps and the activation again before fc2's backward; the forward keeps neither output."""
    from chakra_sim_memory_hbm.tensors import parse_tensors
    spec = JobSpec.model_validate({**job(**RECOMPUTE).model_dump(mode="json"), "tensors": True})
    nodes = nodes_of(spec)
    recomputed = [n.name for n in nodes if n.type == pb.COMP_NODE and NodeView(n).str("step_part") == "recompute"]
    assert recomputed[:5] == ["mb0.L3.norm2", "mb0.L3.moe.act_clamp_gate", "mb0.L3.moe.act_clamp_linear",
                              "mb0.L3.moe.act_clamp_cat", "mb0.L3.moe.activation"]
    assert len(recomputed) == 5 * 4 * 2   # per MoE layer and micro-batch
    forward = {n.name: n for n in nodes if NodeView(n).str("step_part") == "forward"}
    assert not parse_tensors(forward["mb0.L0.moe.activation"].outputs.values)
    assert not parse_tensors(forward["mb0.L0.moe.router"].inputs.values)
    plain = {n.name: n for n in nodes_of(JobSpec.model_validate({**job().model_dump(mode="json"), "tensors": True}))}
    assert parse_tensors(plain["mb0.L0.moe.activation"].outputs.values)


def test_a_folded_run_equals_every_rank_simulated(tmp_path):
    spec = job(tp=2, pp=2, dp=2, ep=2, microbatches=4, **RECOMPUTE).model_dump(mode="json")
    finish = job_folded_and_unfolded(spec, tmp_path)
    assert finish["auto"] == finish["off"]


def test_a_dense_job_echoes_no_new_keys():
    dumped = job(DENSE, etp=None).model_dump(mode="json")
    assert not {"window", "window_attn_skip_freq", "attention_sinks"} & set(dumped["model"])
    assert "recompute_modules" not in dumped["training"]


@pytest.mark.parametrize(("changes", "message"), [
    ({"parallel": {"tp": 2, "etp": 2}, "cluster": {"gpus": 2}}, "model.bias with a mixture of experts needs parallel.etp 1"),
    ({"parallel": {"cp": 2}, "cluster": {"gpus": 2}}, "model.window with parallel.cp > 1 needs"),
    ({"parallel": {"cp": 2, "cp_comm_type": "allgather"}, "cluster": {"gpus": 2}},
     "model.attention_sinks with parallel.cp > 1 needs parallel.cp_comm_type a2a"),
    ({"training": {"recompute_modules": ["moe_act"]}}, "training.recompute_modules needs recompute: selective"),
    ({"training": {"precision": "fp8", **RECOMPUTE}}, "recompute_modules layernorm, moe_act with precision fp8"),
    ({"model": {**SMALL, "num_experts": None, "topk": None, "moe_ffn_hidden": None}}, "mlp clamped-swiglu is modelled"),
    ({"model": {**SMALL, "window": None}}, "window_attn_skip_freq needs window"),
])
def test_validation_names_the_key(changes, message):
    data = changed_job({"name": "gptoss", "model": SMALL, "parallel": {},
                        "training": {"seq": 1024, "global_batch": 4}, "cluster": {"gpus": 1, "profile": PROFILE}}, changes)
    with pytest.raises(ValueError, match=message):
        JobSpec.model_validate(data)
