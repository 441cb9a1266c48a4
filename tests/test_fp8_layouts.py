"""Transformer Engine's fp8 copies by GPU generation (chakra_core.jobs.fp8.fp8_transposes): with
delayed and current scaling a Hopper GPU keeps each fp8 tensor and its transpose, a Blackwell GPU
the tensor alone (non-TN fp8 GEMMs); MXFP8 keeps two copies on both. Casts write what is kept, fp8
parameters are not transposed on Blackwell, and memory (the generator's tensor ledger and the
plan's model alike) falls by exactly one byte per linear weight."""

from __future__ import annotations

from typing import Any

import pytest

from chakra_core.jobs.fp8 import fp8_transposes
from chakra_core.jobs.fsdp import rank_program
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.spec import JobSpec
from chakra_core.plan.memory import predict_memory
from chakra_core.schema import pb

MODEL = {"layers": 2, "hidden": 512, "ffn_hidden": 1408, "heads": 8, "kv_heads": 4, "vocab": 8000}
LINEAR_PER_LAYER = 512 * (8 + 2 * 4) * 64 + 8 * 64 * 512 + 3 * 512 * 1408   # QKV, projection, fc1 (two halves), fc2


def job(recipe: str = "current", **training: Any) -> JobSpec:
    return JobSpec.model_validate({
        "name": "layouts", "model": dict(MODEL),
        "training": {"seq": 512, "global_batch": 8, "precision": "fp8", "fp8_recipe": recipe, **training},
        "cluster": {"gpus": 8, "profile": "h100-hgx-ndr400"}})


def build(spec: JobSpec, architecture: str) -> list[pb.Node]:
    return rank_program(spec, Placement(spec, 8, architecture), 0).build()


def written(nodes: list[pb.Node], suffix: str) -> dict[str, int]:
    """tensor_size of the compute nodes whose names end with `suffix`, by name."""
    return {n.name: next(a.uint64_val for a in n.attr if a.name == "tensor_size")
            for n in nodes if n.type == pb.COMP_NODE and n.name.endswith(suffix)}


def test_only_data_centre_blackwell_runs_fp8_gemms_in_every_layout():
    assert [fp8_transposes(a) for a in ("volta", "ampere", "hopper", "blackwell")] == [True, True, True, False]


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_a_blackwell_cast_writes_one_fp8_copy_instead_of_two(recipe):
    hopper, blackwell = (written(build(job(recipe), a), ".cast_fp8") for a in ("hopper", "blackwell"))
    assert hopper and hopper.keys() == blackwell.keys()
    for name, size in hopper.items():
        elements = size // 4              # read 2 B, write 1 B twice
        assert size == 4 * elements and blackwell[name] == 3 * elements, name


def test_mxfp8_keeps_both_copies_on_blackwell():
    spec = job("mxfp8")
    assert written(build(spec, "hopper"), ".cast_fp8") == written(build(spec, "blackwell"), ".cast_fp8")
    assert predict_memory(spec, "hopper") == predict_memory(spec, "blackwell")


def test_fp8_parameters_are_not_transposed_on_blackwell():
    spec = job(fp8_param_gather=True)
    assert len(written(build(spec, "hopper"), ".transpose")) == 2      # each layer's weights, once per step
    assert written(build(spec, "blackwell"), ".transpose") == {}


@pytest.mark.parametrize("fp8_param_gather", [False, True])
def test_blackwell_holds_one_byte_less_per_linear_weight(fp8_param_gather):
    """The transposes (the generated tensors agree with this model: tests/test_job_tensors.py)."""
    spec = job(fp8_param_gather=fp8_param_gather)
    hopper, blackwell = predict_memory(spec, "hopper"), predict_memory(spec, "blackwell")
    assert hopper.weights - blackwell.weights == 2 * LINEAR_PER_LAYER
    assert (hopper.activations, hopper.optimizer) == (blackwell.activations, blackwell.optimizer)


def test_bf16_does_not_depend_on_the_generation():
    spec = job(precision="bf16", fp8_recipe="delayed")
    assert predict_memory(spec, "hopper") == predict_memory(spec, "blackwell")
    assert [n.SerializeToString() for n in build(spec, "hopper")] == \
        [n.SerializeToString() for n in build(spec, "blackwell")]
