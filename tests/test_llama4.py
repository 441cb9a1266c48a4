"""Llama 4 as Megatron-Bridge trains it (issue 34): the presets' sizes, MoE blocks on every
step-th layer (Maverick) and dense MLPs between, chunked attention's kernels and Megatron's FLOPs
count of them, a folded run equal to an unfolded one, the validation rules."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from chakra_core.jobs.attention_variants import attention_chunks, chunked_mean_keys
from chakra_core.jobs.flops import model_flops
from chakra_core.jobs.models import ModelSpec, preset
from chakra_core.jobs.spec import JobSpec
from tests.simhelpers import changed_job, job_folded_and_unfolded
from tests.test_gpt_oss import computed, nodes_of

PROFILE = "h100-hgx-ndr400"
SMALL = {"layers": 4, "hidden": 512, "ffn_hidden": 1024, "heads": 8, "kv_heads": 2, "vocab": 8000,
         "attention_chunk": 256, "num_experts": 8, "topk": 1, "moe_ffn_hidden": 512, "shared_expert_ffn": 512,
         "moe_layer_step": 2, "router_score_function": "sigmoid"}
"""Maverick's shape in small: MoE blocks on layers 2 and 4 (1-based), a shared expert, chunks of 256."""


def job(model: dict[str, Any] | str = "small", tp: int = 1, pp: int = 1, dp: int = 1, cp: int = 1, ep: int = 1,
        seq: int = 1024, microbatches: int = 2, **training: Any) -> JobSpec:
    return JobSpec.model_validate({
        "name": "llama4", "model": SMALL if model == "small" else model,
        "parallel": {"tp": tp, "pp": pp, "cp": cp, "ep": ep},
        "training": {"seq": seq, "global_batch": microbatches * dp, "micro_batch": 1, **training},
        "cluster": {"gpus": tp * pp * cp * dp, "profile": PROFILE}})


def test_presets_count_the_providers_shapes():
    """Closed form from Megatron-Bridge's Llama4 providers (v0.3.0): per layer the attention
    (40 query heads and 8 key/value heads of 128 around hidden 5120) and two RMSNorms; a MoE layer's
    routed experts (three 5120 x 8192 GEMMs each), shared expert and router; Maverick's other
    layers a SwiGLU MLP of 16384; untied embeddings of the padded 202,048 tokens. Meta's cards:
    17B active, 400B (Maverick) and 109B (Scout, rounded; the text model counts 107.8B). Scout's QK
    norms are counted as qk_layernorm's weights (2 x 128 a layer), which Megatron's L2Norm has not."""
    h, vocab = 5120, 202112                                   # 202,048 padded to 128
    attention, norms = h * (40 + 2 * 8) * 128 + 40 * 128 * h, 2 * h
    expert = 3 * h * 8192
    for name, experts, moe_layers in (("llama4-scout", 16, 48), ("llama4-maverick", 128, 24)):
        m = preset(name)
        dense_layers = 48 - moe_layers
        total = (48 * (attention + norms) + moe_layers * ((experts + 1) * expert + h * experts)
                 + dense_layers * 3 * h * 16384 + 2 * vocab * h + h + (48 * 2 * 128 if experts == 16 else 0))
        assert m.params() == total, name
        assert m.moe_layers == moe_layers
        assert m.active_params() == pytest.approx(17.2e9, rel=0.01), name
    assert preset("llama4-maverick").params() == pytest.approx(400e9, rel=0.01)
    assert preset("llama4-scout").params() == pytest.approx(109e9, rel=0.02)


def test_every_step_th_layer_has_the_moe_block_and_the_others_a_dense_mlp():
    """moe_layer_step 2: HF Llama 4's moe_layers = range(1, L, 2), Megatron-Bridge's [0, 1] x 24."""
    m = ModelSpec.model_validate(SMALL)
    assert [m.is_moe_layer(layer) for layer in range(4)] == [False, True, False, True]
    assert (m.first_moe_layer, m.moe_layers) == (1, 2)
    views = computed(nodes_of(job(ep=2, dp=2)))
    for layer in range(4):
        moe = layer % 2 == 1
        assert (f"mb0.L{layer}.moe.router" in views) == moe
        assert (f"mb0.L{layer}.shared.fc1" in views) == moe
        assert (f"mb0.L{layer}.fc1" in views) == (not moe)


@settings(max_examples=60, deadline=None)
@given(seq=st.integers(1, 2000), chunk=st.integers(1, 700))
def test_chunked_mean_keys_is_the_causal_count_of_each_chunk(seq, chunk):
    """Brute force: a query attends to the keys of its chunk up to itself, the diagonal half (the
    causal convention); a chunk at least as long as the sequence is plain causal attention."""
    pairs = sum(i % chunk + 0.5 for i in range(seq))
    assert chunked_mean_keys(seq, chunk) == pytest.approx(pairs / seq)
    assert attention_chunks(ModelSpec.model_validate({**SMALL, "attention_chunk": chunk}), seq) == (
        1 if seq <= chunk else -(-seq // chunk))


def test_chunked_attention_runs_one_kernel_over_the_chunks():
    """Megatron-Bridge's chunkify: [seq, b] becomes [chunk, chunks x b], padded; one causal kernel of
    `chunk` tokens per chunk, forward and backward; at most one chunk, the kernels of full attention."""
    s, chunk, a, d = 1000, 256, 8, 64
    views = computed(nodes_of(job(seq=s)))
    chunks = 4                                                # 1000 tokens padded to 4 x 256
    for name in ("mb0.L0.attention", "mb0.L3.attention.bwd"):
        node = views[name]
        assert (node.int("attn_batch"), node.int("attn_seq_q"), node.int("attn_seq_kv")) == (a * chunks, chunk, chunk)
        causal = 4 * a * chunks * chunk * chunk * d // 2
        assert node.int("num_ops") == (causal * 5 // 2 if name.endswith("bwd") else causal)
    short = computed(nodes_of(job(seq=chunk)))
    plain = computed(nodes_of(job({**SMALL, "attention_chunk": None}, seq=chunk)))
    for name in ("mb0.L0.attention", "mb0.L0.attention.bwd"):
        assert short[name].pb.attr == plain[name].pb.attr


def test_megatron_count_takes_off_what_the_chunks_take_off_the_kernels():
    """Megatron's count is 3x the forward attention FLOPs: chunking takes 3x off the formula what
    it takes off the forward kernels (whole chunks, so no padding), and the rate reported never
    counts keys the kernels skip."""
    chunked, full = job(seq=1024), job({**SMALL, "attention_chunk": None}, seq=1024)
    kernels = {name: sum(v.int("num_ops") for n, v in computed(nodes_of(spec)).items()
                         if n.startswith("mb0.") and n.endswith(".attention"))
               for name, spec in (("chunked", chunked), ("full", full))}
    saved = model_flops(full, "megatron_bridge") - model_flops(chunked, "megatron_bridge")
    assert saved == pytest.approx(3 * chunked.training.global_batch * (kernels["full"] - kernels["chunked"]),
                                  rel=1e-9)
    assert model_flops(chunked, "nemo") == model_flops(full, "nemo")   # NeMo's formula counts s^2 whatever


def test_a_folded_run_equals_every_rank_simulated(tmp_path):
    spec = job(tp=2, pp=2, dp=2, ep=2, microbatches=4).model_dump(mode="json")
    finish = job_folded_and_unfolded(spec, tmp_path)
    assert finish["auto"] == finish["off"]


@pytest.mark.parametrize(("changes", "message"), [
    ({"parallel": {"cp": 2}, "cluster": {"gpus": 2}}, "model.attention_chunk .* with parallel.cp > 1 is not modelled"),
    ({"training": {"seq": 1024, "global_batch": 4, "attention": "unfused"}}, "attention_chunk needs the fused"),
    ({"model": {**SMALL, "dense_layers_first": 1}}, "dense_layers_first and moe_layer_step"),
    ({"model": {**SMALL, "moe_layer_step": 5}}, "moe_layer_step 5 leaves no MoE layer of the 4 layers"),
    ({"model": {**SMALL, "window": 128}}, "attention_chunk .* goes with neither window"),
    ({"model": {**SMALL, "num_experts": None, "topk": None, "moe_ffn_hidden": None, "shared_expert_ffn": None,
                "router_score_function": None}}, "moe_layer_step describe a mixture of experts"),
])
def test_validation_names_the_key(changes, message):
    data = changed_job({"name": "llama4", "model": SMALL, "parallel": {},
                        "training": {"seq": 1024, "global_batch": 4}, "cluster": {"gpus": 1, "profile": PROFILE}}, changes)
    with pytest.raises(ValueError, match=message):
        JobSpec.model_validate(data)


def test_context_parallel_within_one_chunk_is_accepted():
    assert job(cp=2, seq=256).parallel.cp == 2
