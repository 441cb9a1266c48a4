"""fp8 parameters (`training.fp8_param_gather`, chakra_core.jobs.fp8_params): the parameter
all-gathers move the linear weights in fp8 and the rest in bf16, in closed form; the forward casts no
weights and each gathered weight is transposed once (distributed optimizer: once per step; Megatron-
FSDP: at each backward); the optimizer writes the fp8 weights after its amax all-reduce; memory never
grows; the settings Megatron refuses are refused."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from chakra_core.jobs.fsdp import rank_program
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.spec import JobSpec
from chakra_core.plan.memory import predict_memory
from chakra_core.schema import pb

PROFILE = "h100-hgx-ndr400"
MODEL = {"layers": 4, "hidden": 512, "ffn_hidden": 1408, "heads": 8, "kv_heads": 4, "vocab": 8000}


def job(gpus: int = 8, parallel: dict[str, Any] | None = None, model: dict[str, Any] | None = None,
        **training: Any) -> dict[str, Any]:
    return {"name": "fp8p", "model": model or dict(MODEL), "parallel": parallel or {},
            "training": {"seq": 512, "global_batch": 16, "precision": "fp8", "fp8_recipe": "current",
                         "fp8_param_gather": True, **training},
            "cluster": {"gpus": gpus, "profile": PROFILE}}


def nodes(data: dict[str, Any], rank: int = 0) -> list[pb.Node]:
    spec = JobSpec.model_validate(data)
    return rank_program(spec, Placement(spec, 8), rank).build()


def attrs(node: pb.Node) -> dict[str, Any]:
    return {a.name: a for a in node.attr}


def gathered(data: dict[str, Any]) -> int:
    """Bytes rank 0's parameter all-gathers send per step."""
    return sum(attrs(n)["comm_size"].int64_val for n in nodes(data) if n.type == pb.COMM_COLL_NODE and
               attrs(n)["comm_type"].int64_val == pb.ALL_GATHER and attrs(n)["step_part"].string_val == "dp")


def linear_per_layer(tp: int) -> int:
    """QKV (8 query heads and 4 key/value heads of 64), projection, SwiGLU fc1 (two halves) and fc2."""
    h, f, d = 512, 1408, 64
    return (h * (8 + 2 * 4) * d + 8 * d * h + 3 * h * f) // tp


def shard(n: int, parts: int) -> int:
    return -(-n // parts)


@settings(max_examples=15, deadline=None)
@given(tp=st.sampled_from([1, 2]), dp=st.sampled_from([2, 4]), overlap=st.booleans(), micro=st.integers(1, 3))
def test_the_distributed_optimizer_gathers_fp8_weights_in_one_byte(tp, dp, overlap, micro):
    """One bucket per stage (below Megatron's bucket size): its shard of fp8 weights at 1 B and of
    the other parameters at 2 B, once per step whatever the micro-batches."""
    data = job(tp * dp, {"tp": tp}, global_batch=dp * micro, overlap_param_gather=overlap)
    spec = JobSpec.model_validate(data)
    m = spec.shape
    params = 4 * m.layer_params_on(tp) + m.padded_vocab(tp) // tp * 512 * 2 + 512
    linear = 4 * linear_per_layer(tp)
    assert gathered(data) == shard(linear, dp) + 2 * shard(params - linear, dp)
    assert gathered({**data, "training": {**data["training"], "fp8_param_gather": False}}) == 2 * shard(params, dp)


@settings(max_examples=10, deadline=None)
@given(dp=st.sampled_from([2, 4]), micro=st.integers(1, 3), layers=st.integers(1, 4))
def test_megatron_fsdp_gathers_each_layer_in_fp8_twice_per_micro_batch(dp, micro, layers):
    data = job(dp, {}, model={**MODEL, "layers": layers}, global_batch=dp * micro, use_megatron_fsdp=True)
    spec = JobSpec.model_validate(data)
    m, h = spec.shape, 512
    unit, linear = m.layer_params_on(1), linear_per_layer(1)
    outside = 2 * m.padded_vocab(1) * h + h
    per_layer = shard(linear, dp) + 2 * shard(unit - linear, dp)
    assert gathered(data) == 2 * shard(outside, dp) + micro * 2 * layers * per_layer   # outside units: once, bf16


def test_no_weight_is_cast_in_the_forward_and_each_is_transposed_after_its_gather():
    names = [n.name for n in nodes(job(global_batch=32))]
    assert not [n for n in names if n.endswith("weights.cast_fp8") or n.endswith("weights.amax")]
    assert sorted(n for n in names if n.endswith("weights.transpose")) == [f"L{i}.weights.transpose" for i in range(4)]
    fsdp = [n.name for n in nodes(job(global_batch=32, use_megatron_fsdp=True))]
    transposes = [n for n in fsdp if n.endswith("weights.transpose")]
    assert len(transposes) == 4 * 4 and all(n.startswith("mb") for n in transposes)   # 4 micro-batches x 4 layers
    plain = [n.name for n in nodes(job(global_batch=32, fp8_param_gather=False))]
    assert len([n for n in plain if n.endswith("weights.cast_fp8")]) == 4


@pytest.mark.parametrize("recipe", ["current", "delayed"])
def test_the_optimizer_writes_the_fp8_weights_after_reducing_their_amaxes(recipe):
    found = nodes(job(fp8_recipe=recipe))
    names = [n.name for n in found]
    assert ("optimizer.fp8_params.amax" in names) == (recipe == "current")
    reduce = next(n for n in found if n.name == "optimizer.fp8_params.amax_all_reduce")
    assert attrs(reduce)["comm_size"].int64_val == 4 * 4 * 4      # 4 weights per layer, 4 layers, fp32
    cast = next(n for n in found if n.name == "optimizer.fp8_params.cast")
    assert names.index("optimizer.adam") < names.index(reduce.name) < names.index(cast.name)
    # the shard of the fp8 weights this rank updates: read fp32, write fp8
    assert attrs(cast)["tensor_size"].uint64_val == 5 * shard(4 * linear_per_layer(1), 8)


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2]), recipe=st.sampled_from(["current", "delayed"]),
       fsdp=st.booleans(), grads=st.sampled_from(["fp32", "bf16"]))
def test_fp8_parameters_never_take_more_memory(tp, pp, recipe, fsdp, grads):
    """Without a 16-bit copy of the linear weights, every part is at most what it was; the weights
    hold exactly the 2 B per linear weight less (distributed optimizer)."""
    if fsdp and pp > 1:
        pp = 1
    data = job(8, {"tp": tp, "pp": pp}, fp8_recipe=recipe, grad_reduce_dtype=grads, use_megatron_fsdp=fsdp)
    with_params = predict_memory(JobSpec.model_validate(data))
    without = predict_memory(JobSpec.model_validate({**data, "training": {**data["training"],
                                                                           "fp8_param_gather": False}}))
    assert with_params.total < without.total
    for part, value in with_params.parts().items():
        assert value <= without.parts()[part], part
    if not fsdp:
        layers = 4 // pp
        assert without.weights - with_params.weights == 2 * layers * linear_per_layer(tp)


@pytest.mark.parametrize("training, message", [
    ({"precision": "bf16"}, "fp8_param_gather needs precision fp8"),
    ({"distributed_optimizer": False}, "needs the distributed optimizer or Megatron-FSDP"),
    ({"fp8_recipe": "mxfp8", "use_megatron_fsdp": True}, "mxfp8 under Megatron-FSDP"),
])
def test_refused_settings_say_why(training, message):
    data = job(**training)
    if training.get("fp8_recipe") == "mxfp8":
        data["cluster"]["profile"] = "b200-sxm-hgx"
    with pytest.raises(ValidationError, match=message):
        JobSpec.model_validate(data)


def test_without_the_setting_the_echo_is_as_before():
    data = job(fp8_param_gather=False)
    assert "fp8_param_gather" not in JobSpec.model_validate(data).model_dump(mode="json")["training"]
    assert JobSpec.model_validate(job()).model_dump(mode="json")["training"]["fp8_param_gather"] is True
