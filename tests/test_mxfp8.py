"""The MXFP8 recipe (`fp8_recipe: mxfp8`): one cast per quantized tensor with its block scales, no
amax work, MXFP8 GEMMs at the profile's mxfp8 rate, and a clear error off Blackwell."""

from __future__ import annotations

from typing import Any

import pytest

from chakra_core import run
from chakra_core.errors import ManifestError
from chakra_core.et.attrs import NodeView
from chakra_core.jobs.fp8 import MX_BLOCK, quantized_bytes
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.spec import JobSpec
from chakra_core.schema import pb

MODEL = {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096, "vocab": 32000}


def job_data(recipe: str, profile: str = "b200-sxm-hgx", tp: int = 2, **model: Any) -> dict[str, Any]:
    return {"name": "mx", "model": {**MODEL, **model}, "parallel": {"tp": tp},
            "training": {"seq": 2048, "global_batch": 2, "micro_batch": 1, "precision": "fp8", "fp8_recipe": recipe},
            "cluster": {"gpus": tp, "profile": profile}}


def kernels(recipe: str) -> dict[str, NodeView]:
    spec = JobSpec.model_validate(job_data(recipe))
    return {n.name: NodeView(n) for n in RankProgram(spec, Placement(spec, 8), 0).build() if n.type == pb.COMP_NODE}


def test_mxfp8_casts_once_per_tensor_with_its_scales_and_takes_no_amax():
    mx, current = kernels("mxfp8"), kernels("current")
    assert not [name for name in mx if name.endswith((".amax", ".scale"))]
    assert [name for name in current if name.endswith(".amax")]
    casts = [name for name in mx if name.endswith(".cast_fp8")]
    assert casts and sorted(casts) == sorted(name for name in current if name.endswith(".cast_fp8"))
    for name in casts:     # the same tensor read in bf16; both fp8 copies written with a scale per 32
        elements = mx[name].int("num_ops")
        assert elements == current[name].int("num_ops")
        assert mx[name].int("tensor_size") - current[name].int("tensor_size") == 2 * -(-elements // MX_BLOCK)
    # every fp8 GEMM runs as MXFP8, reading its operands' scales too
    gemms = [name for name, node in mx.items() if node.str("dtype") == "mxfp8"]
    assert gemms and all(current[name].str("dtype") == "fp8" for name in gemms)
    assert all(mx[name].int("tensor_size") > current[name].int("tensor_size") for name in gemms)
    # under delayed scaling the norm writes the fp8 copy itself; under MXFP8 it writes bf16, cast after
    delayed = kernels("delayed")
    norms = [name for name in mx if "norm" in name and name + ".cast_fp8" in mx]
    assert norms and not any(name + ".cast_fp8" in delayed for name in norms)


@pytest.mark.parametrize("elements", [1, 31, 32, 33, 4096, 4097])
def test_an_mxfp8_tensor_carries_a_scale_byte_per_32_elements(elements):
    assert quantized_bytes(elements, "fp8") == elements
    assert quantized_bytes(elements, "mxfp8") == elements + -(-elements // 32)


def test_mxfp8_off_blackwell_is_refused_at_its_key(tmp_path):
    data = {"job": job_data("mxfp8", profile="h100-hgx-ndr400"), "output": {"dir": str(tmp_path)},
            "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
    with pytest.raises(ManifestError) as caught:
        run.load(data, base_dir=tmp_path)
    assert "job.training.fp8_recipe" in str(caught.value) and "Blackwell" in str(caught.value)
    assert not list(tmp_path.rglob("*.et"))      # refused before a trace is written


def test_an_mxfp8_step_simulates_and_counts_mfu_against_the_mxfp8_peak(tmp_path):
    steps = {}
    for recipe in ("mxfp8", "current"):
        data = {"job": job_data(recipe), "output": {"dir": str(tmp_path / recipe)},
                "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
        step = run.simulate(run.load(data, base_dir=tmp_path)).results.training
        assert step is not None and step.step_time_s > 0
        steps[recipe] = step
    # the same model FLOPs; B200's mxfp8 peak is its fp8 peak, so MFU follows the step time
    assert steps["mxfp8"].model_tflops_per_step == steps["current"].model_tflops_per_step
    ratio = steps["mxfp8"].mfu / steps["current"].mfu
    assert ratio == pytest.approx(steps["current"].step_time_s / steps["mxfp8"].step_time_s, rel=1e-9)
