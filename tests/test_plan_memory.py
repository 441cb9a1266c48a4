"""The peak-memory predictor of `chakra-sim plan` (chakra_core.plan.memory): Korthikanti et al.'s
per-layer counts, Megatron-LM's bytes per parameter, and how memory moves with the layout."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chakra_core.jobs.spec import JobSpec
from chakra_core.plan.memory import (GIB, MemoryEstimate, layer_activations, memory_by_stage, overflow,
                                     predict_memory)

# GPT-3 175B's layer (Korthikanti et al. 2022, the model of their Table 2: 4h MLP, no GQA, dropout)
GPT = {"layers": 8, "hidden": 12288, "ffn_hidden": 49152, "heads": 96, "vocab": 51200, "mlp": "gelu",
       "norm": "layernorm", "position": "learned", "tied_embeddings": True, "bias": True}
LLAMA = {"layers": 16, "hidden": 2048, "ffn_hidden": 5632, "heads": 16, "kv_heads": 4, "vocab": 32000}


def spec(model: Any = None, gpus: int = 8, seq: int = 2048, global_batch: int = 64,
         micro_batch: int = 1, **settings_: Any) -> JobSpec:
    """A job; keyword arguments named like Parallel's fields go there, the rest to Training."""
    parallel_keys = {"tp", "pp", "vp", "cp", "sp", "account_for_embedding_and_loss"}
    parallel = {k: v for k, v in settings_.items() if k in parallel_keys}
    training = {k: v for k, v in settings_.items() if k not in parallel_keys}
    return JobSpec.model_validate({
        "model": model or LLAMA, "parallel": parallel,
        "training": {"seq": seq, "global_batch": global_batch, "micro_batch": micro_batch, **training},
        "cluster": {"gpus": gpus, "profile": "h100-sxm-hgx"}})


# Korthikanti et al., sec. 4 / Table 2 --------------------------------------------------------------
@pytest.mark.parametrize("b", [1, 2])
def test_gpt_layer_is_34_sbh_plus_the_scores(b: int) -> None:
    s, h, a = 2048, GPT["hidden"], GPT["heads"]
    job = spec(GPT, gpus=1, seq=s, micro_batch=b, global_batch=b, dropout=0.1, attention="unfused")
    assert layer_activations(job) == s * b * h * (34 + 5 * a * s // h)
    for cheaper in ({"recompute": "selective"}, {"attention": "flash"}):
        job = spec(GPT, gpus=1, seq=s, micro_batch=b, global_batch=b, dropout=0.1,
                   **{"attention": "unfused", **cheaper})
        assert layer_activations(job) == 34 * s * b * h


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_and_sequence_parallel_rows_of_table_2(t: int) -> None:
    s, b, h, a = 2048, 1, GPT["hidden"], GPT["heads"]
    common = {"gpus": t, "seq": s, "tp": t, "dropout": 0.1, "attention": "unfused"}
    tp_only = spec(GPT, sp=False, **common)
    assert layer_activations(tp_only) * t == s * b * h * (10 * t + 24 + 5 * a * s // h)
    assert layer_activations(spec(GPT, **common)) * t == s * b * h * (34 + 5 * a * s // h)
    assert layer_activations(spec(GPT, recompute="selective", **common)) * t == 34 * s * b * h
    assert layer_activations(tp_only, recomputed=True) == 2 * s * b * h
    assert layer_activations(spec(GPT, **common), recomputed=True) * t == 2 * s * b * h


def test_swiglu_and_gqa_terms() -> None:
    s, h, f, d = 1024, LLAMA["hidden"], LLAMA["ffn_hidden"], LLAMA["hidden"] // LLAMA["heads"]
    swiglu = layer_activations(spec(LLAMA, gpus=1, seq=s))
    # the gated activation keeps both halves of the first GEMM's output: F more elements per token
    assert swiglu - layer_activations(spec({**LLAMA, "mlp": "gelu"}, gpus=1, seq=s)) == 2 * s * f
    # K and V shrink with the key/value heads
    mha = layer_activations(spec({**LLAMA, "kv_heads": 16}, gpus=1, seq=s))
    assert mha - swiglu == 2 * 2 * s * (16 - 4) * d
    # no dropout: norm inputs and the two whole GEMM inputs 8h; Q, K, V; attention output; 2F + F
    assert swiglu == s * (8 * h + 2 * (16 + 2 * 4) * d + 2 * 16 * d + 2 * 2 * f + 2 * f)


def test_context_parallel_counts_the_sequence_per_rank() -> None:
    one = layer_activations(spec(LLAMA, gpus=2, seq=4096))
    assert layer_activations(spec(LLAMA, gpus=2, seq=4096, cp=2)) * 2 == one


# Megatron-LM's distributed optimizer table --------------------------------------------------------
def bytes_per_param(job: JobSpec) -> float:
    e = memory_by_stage(job)[0]
    return (e.weights + e.gradients + e.optimizer) / (e.weights / 2)


@pytest.mark.parametrize("d", [2, 8, 64])
def test_bytes_per_parameter_18_and_6_plus_12_over_d(d: int) -> None:
    assert bytes_per_param(spec(gpus=d, distributed_optimizer=False)) == 18
    assert bytes_per_param(spec(gpus=d)) == pytest.approx(6 + 12 / d, rel=1e-6)
    # float16 gradients: 20 and 4 + 16/d (the optimizer keeps an fp32 copy of its shard)
    assert bytes_per_param(spec(gpus=d, distributed_optimizer=False, grad_reduce_dtype="bf16")) == 20
    assert bytes_per_param(spec(gpus=d, grad_reduce_dtype="bf16")) == pytest.approx(4 + 16 / d, rel=1e-6)


def test_fp8_adds_weight_copies_and_saves_activations() -> None:
    bf16, fp8 = predict_memory(spec(gpus=1)), predict_memory(spec(gpus=1, precision="fp8"))
    assert fp8.weights > bf16.weights and fp8.gradients == bf16.gradients and fp8.optimizer == bf16.optimizer
    assert fp8.activations < bf16.activations


# How memory moves with the layout -----------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(st.sampled_from([1, 2]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]),
       st.sampled_from(["none", "selective", "full"]))
def test_memory_falls_when_tp_pp_or_dp_grow(tp: int, pp: int, dp: int, recompute: str) -> None:
    def total(tp: int, pp: int, dp: int) -> int:
        return predict_memory(spec(gpus=tp * pp * dp, tp=tp, pp=pp, recompute=recompute)).total
    base = total(tp, pp, dp)
    assert total(2 * tp, pp, dp) < base
    assert total(tp, 2 * pp, dp) < base
    assert total(tp, pp, 2 * dp) < base     # the distributed optimizer shards over dp


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 2]), st.sampled_from([1, 2, 4]), st.sampled_from(["flash", "unfused"]),
       st.sampled_from([0.0, 0.1]))
def test_full_recompute_below_selective_at_most_none(tp: int, pp: int, attention: str, dropout: float) -> None:
    def peak(recompute: str) -> int:
        return predict_memory(spec(gpus=tp * pp, tp=tp, pp=pp, attention=attention, dropout=dropout,
                                   recompute=recompute)).activations
    assert peak("full") < peak("selective") <= peak("none")
    if attention == "unfused":
        assert peak("selective") < peak("none")


def test_recompute_layers_between_none_and_full() -> None:
    peaks = [predict_memory(spec(gpus=2, pp=2, recompute="full", recompute_layers=n)).activations
             for n in (1, 4, 8)]
    assert predict_memory(spec(gpus=2, pp=2)).activations > peaks[0] > peaks[1] > peaks[2]
    assert peaks[2] == predict_memory(spec(gpus=2, pp=2, recompute="full")).activations


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2]),
       st.booleans(), st.sampled_from(["none", "selective", "full"]))
def test_totals_sum_the_parts(tp: int, pp: int, cp: int, dist: bool, recompute: str) -> None:
    for e in memory_by_stage(spec(gpus=tp * pp * cp * 2, tp=tp, pp=pp, cp=cp, seq=4096,
                                  distributed_optimizer=dist, recompute=recompute)):
        assert list(e.parts()) == ["weights", "gradients", "optimizer", "activations", "buffers"]
        assert e.total == sum(e.parts().values()) and min(e.parts().values()) >= 0


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_first_stage_peaks_in_plain_1f1b(pp: int) -> None:
    stages = memory_by_stage(spec(gpus=pp, pp=pp))
    assert predict_memory(spec(gpus=pp, pp=pp)).stage == 0
    # it holds pp micro-batches, the last stage one
    per_mb = layer_activations(spec(gpus=pp, pp=pp)) * LLAMA["layers"] // pp
    assert stages[0].activations > pp * per_mb > stages[-1].activations >= per_mb


def test_fewer_micro_batches_than_stages_are_all_in_flight() -> None:
    few, many = (memory_by_stage(spec(gpus=4, pp=4, global_batch=m))[0].activations for m in (2, 64))
    per_mb = layer_activations(spec(gpus=4, pp=4)) * LLAMA["layers"] // 4
    assert few < many and few == pytest.approx(2 * per_mb, rel=1e-3)


@pytest.mark.parametrize("pp,vp", [(2, 2), (4, 2), (4, 4)])
def test_interleaving_holds_1_plus_pp_minus_1_over_pp_vp_times_more(pp: int, vp: int) -> None:
    model = {**LLAMA, "layers": 32}
    plain = memory_by_stage(spec(model, gpus=pp, pp=pp, global_batch=8 * pp))[0].activations
    inter = memory_by_stage(spec(model, gpus=pp, pp=pp, vp=vp, global_batch=8 * pp))[0].activations
    assert inter / plain == pytest.approx(1 + (pp - 1) / (pp * vp), rel=1e-3)


def test_last_stage_holds_the_logits_and_fp32_softmax() -> None:
    job = spec(gpus=2, pp=2)
    v, n = job.shape.padded_vocab(1), job.training.seq
    stage = memory_by_stage(job)[1]
    layers = layer_activations(job) * LLAMA["layers"] // 2
    # final norm and output layer inputs, fp32 softmax kept, bf16 logits on top while they exist
    assert stage.activations == layers + 2 * 2 * n * LLAMA["hidden"] + 4 * n * v + 2 * n * v


# overflow -------------------------------------------------------------------------------------------
def test_overflow_names_the_excess_and_the_biggest_parts() -> None:
    e = MemoryEstimate(stage=0, weights=int(10.1 * GIB), gradients=int(9.4 * GIB), optimizer=int(21.9 * GIB),
                       activations=int(51.0 * GIB), buffers=0)
    assert overflow(e, e.total) is None and overflow(e, 200 * GIB) is None
    line = overflow(e, 80 * GIB)
    assert line == ("needs 92.4 GiB of 80.0 GiB (12.4 GiB over): activations 51.0 GiB, optimizer 21.9 GiB, "
                    "weights 10.1 GiB, gradients 9.4 GiB")
    assert "buffers" not in line and "\n" not in line
    # with a reserve beside the peak (chakra_core.plan.headroom): the need counts it
    assert overflow(e, e.total + GIB, reserve_bytes=GIB) is None
    assert overflow(e, 93 * GIB, reserve_bytes=2 * GIB) == (
        "needs 92.4 GiB + 2.0 GiB reserve of 93.0 GiB (1.4 GiB over): activations 51.0 GiB, optimizer 21.9 GiB, "
        "weights 10.1 GiB, gradients 9.4 GiB")


def test_a_big_job_overflows_an_80_gib_gpu() -> None:
    job = spec("llama3-70b", gpus=8, seq=8192, global_batch=8, tp=8)
    line = overflow(predict_memory(job), 80 * GIB)
    assert line is not None and line.startswith("needs ") and "GiB over): " in line
