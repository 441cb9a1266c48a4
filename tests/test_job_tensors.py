"""Generated training steps that list their tensors (`job.tensors`, chakra_core.jobs.tensors): the
`hbm` memory layer's simulated peak of each pipeline stage equals the plan's prediction
(chakra_core.plan.memory), every storage dies by the end of the step, and traces without the
option carry no operand lists."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chakra_core import run
from chakra_core.et.io import iter_trace
from chakra_core.hardware.profiles import load_profile
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.spec import JobSpec
from chakra_core.plan.memory import memory_by_stage
from chakra_sim_memory_hbm.tensors import parse_tensors

PROFILE = "h100-hgx-ndr400"
MODEL = {"layers": 8, "hidden": 512, "ffn_hidden": 1408, "heads": 8, "kv_heads": 4, "vocab": 8000}
GPT = {**MODEL, "mlp": "gelu", "norm": "layernorm", "position": "learned", "tied_embeddings": True, "bias": True,
       "kv_heads": None, "ffn_hidden": 2048}
TOLERANCE = 0.002
"""The generator counts a layer's norm weights as split by TP (they are replicated): a few bytes per
layer of difference in model state, at most 0.1% at these sizes."""


def job(model: dict[str, Any], gpus: int, parallel: dict[str, Any], **training: Any) -> dict[str, Any]:
    return {"name": "m", "model": model, "parallel": parallel, "tensors": True,
            "training": {"seq": 512, "global_batch": 8, **training}, "cluster": {"gpus": gpus, "profile": PROFILE}}


def simulate(tmp_path: Path, data: dict[str, Any], fold: str = "off", timeline: bool = False) -> dict[str, Any]:
    manifest = {"job": copy.deepcopy(data), "workload": {"fold": fold},
                "output": {"dir": str(tmp_path / f"out-{fold}"), "timeline": timeline},
                "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}, "memory": {"plugin": "hbm"}}
    return run.simulate(run.load(manifest, base_dir=tmp_path)).document


def peaks_by_stage(data: dict[str, Any], results: dict[str, Any]) -> dict[int, int]:
    place = Placement(JobSpec.model_validate(data), 8)
    peaks: dict[int, int] = {}
    for row in results["ranks"]:
        peak = row["hbm"]["peak_memory_bytes"]
        if peak is not None:
            stage = place.coord(row["rank"]).pp
            peaks[stage] = max(peaks.get(stage, 0), peak)
    return peaks


def assert_agree(data: dict[str, Any], results: dict[str, Any]) -> None:
    simulated = peaks_by_stage(data, results)
    architecture = load_profile(data["cluster"]["profile"]).gpu.architecture
    for estimate in memory_by_stage(JobSpec.model_validate(data), architecture):
        assert simulated[estimate.stage] == pytest.approx(estimate.total, rel=TOLERANCE), estimate


CASES = {
    "tp-pp-vp-cp": job(MODEL, 16, {"tp": 2, "pp": 2, "vp": 2, "cp": 2}, global_batch=8),
    "fp8-full-recompute": job(MODEL, 8, {"tp": 2, "pp": 4}, precision="fp8", recompute="full"),
    "gpt-unfused-dropout": job(GPT, 8, {"tp": 2, "pp": 2}, attention="unfused", dropout=0.1),
    "selective-no-dist-opt": job(GPT, 4, {"tp": 1, "pp": 2}, attention="unfused", recompute="selective",
                                 distributed_optimizer=False, grad_reduce_dtype="bf16", micro_batch=2),
    "megatron-fsdp-zero3": job(MODEL, 8, {"tp": 2}, use_megatron_fsdp=True, suggested_communication_unit_size=2),
    "mxfp8-blackwell": {**job(MODEL, 8, {"tp": 2, "pp": 4}, precision="fp8", fp8_recipe="mxfp8"),
                        "cluster": {"gpus": 8, "profile": "b200-sxm-hgx"}},
    "nvfp4-blackwell": {**job(MODEL, 8, {"tp": 2, "pp": 4}, precision="nvfp4"),
                        "cluster": {"gpus": 8, "profile": "b200-sxm-hgx"}},
    "fp8-params-current": job(MODEL, 16, {"tp": 2, "pp": 2, "vp": 2}, precision="fp8", fp8_recipe="current",
                              fp8_param_gather=True, global_batch=8),
    "fp8-params-delayed-no-overlap": job(GPT, 8, {"tp": 2}, precision="fp8", fp8_param_gather=True,
                                         overlap_param_gather=False),
    "fp8-current-blackwell": {**job(MODEL, 8, {"tp": 2, "pp": 2}, precision="fp8", fp8_recipe="current"),
                              "cluster": {"gpus": 8, "profile": "b200-sxm-hgx"}},
    "fp8-params-fsdp-blackwell": {**job(MODEL, 8, {"tp": 2}, precision="fp8", fp8_recipe="current",
                                        fp8_param_gather=True, use_megatron_fsdp=True),
                                  "cluster": {"gpus": 8, "profile": "b200-sxm-hgx"}},
    "mxfp8-params-blackwell": {**job(MODEL, 8, {"tp": 2, "pp": 2}, precision="fp8", fp8_recipe="mxfp8",
                                     fp8_param_gather=True, global_batch=8),
                               "cluster": {"gpus": 8, "profile": "b200-sxm-hgx"}},
}


@pytest.mark.parametrize("name", list(CASES))
def test_hbm_peak_of_each_stage_is_the_plans_prediction(tmp_path: Path, name: str) -> None:
    data = CASES[name]
    results = simulate(tmp_path, data)
    assert_agree(data, results)
    # every storage is released by the end of the step: each rank's series ends at 0 B
    series = results["layers"]["memory"]["summary"]["memory_series"]
    assert series and all(points[-1][1] == 0 for points in series.values())


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2, 4]), vp=st.sampled_from([1, 2]),
       micro_batch=st.sampled_from([1, 2]), recompute=st.sampled_from(["none", "full"]),
       recompute_layers=st.sampled_from([None, 1]), precision=st.sampled_from(["bf16", "fp8", "fp8 params"]),
       dist=st.booleans(), gpt=st.booleans())
def test_any_layout_agrees(tmp_path_factory: pytest.TempPathFactory, tp: int, pp: int, vp: int, micro_batch: int,
                           recompute: str, recompute_layers: int | None, precision: str, dist: bool,
                           gpt: bool) -> None:
    vp = vp if pp > 1 else 1
    parallel = {"tp": tp, "pp": pp, **({"vp": vp} if vp > 1 else {})}
    params = precision == "fp8 params"   # fp8 parameters need the distributed optimizer
    training: dict[str, Any] = {"micro_batch": micro_batch, "recompute": recompute, "precision": precision[:4].strip(),
                                "distributed_optimizer": dist or params, "global_batch": 8 * micro_batch,
                                **({"fp8_param_gather": True, "fp8_recipe": "current"} if params else {})}
    if recompute == "full" and recompute_layers:
        training["recompute_layers"] = recompute_layers
    data = job(GPT if gpt else MODEL, tp * pp * 2, parallel, **training)
    assert_agree(data, simulate(tmp_path_factory.mktemp("any"), data))


def test_folded_run_gives_the_unfolded_peaks(tmp_path: Path) -> None:
    data = CASES["tp-pp-vp-cp"]
    folded, unfolded = simulate(tmp_path, data, fold="auto"), simulate(tmp_path, data, fold="off")
    assert folded["folding"]["folded"]
    assert peaks_by_stage(data, folded) == peaks_by_stage(data, unfolded)
    assert (folded["layers"]["memory"]["summary"]["peak_memory_bytes"]
            == unfolded["layers"]["memory"]["summary"]["peak_memory_bytes"])


def test_tensors_are_chakra_ioinfo_and_off_by_default(tmp_path: Path) -> None:
    data = CASES["fp8-full-recompute"]
    simulate(tmp_path, data)
    simulate(tmp_path / "plain", {**data, "tensors": False})

    def listed(folder: Path) -> list[tuple[int, int, int, int, int, str]]:
        found = []
        for path in sorted(folder.glob("out-off/traces/*.et")):
            _, nodes = iter_trace(path)
            for _, node in nodes:
                found += parse_tensors(node.inputs.values) + parse_tensors(node.outputs.values)
        return found

    tensors = listed(tmp_path)
    assert tensors and all(t[0] == t[1] and t[2] == 0 and t[3] > 0 and t[4] in (1, 2, 4, 8) and t[5] == "cuda:0"
                           for t in tensors)
    assert listed(tmp_path / "plain") == []
