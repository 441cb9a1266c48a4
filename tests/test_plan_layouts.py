"""The layouts `chakra-sim plan` searches (chakra_core.plan.layouts): every valid one exactly once,
the invalid ones counted by reason, and a step-time bound the simulation never beats."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from chakra_core import run
from chakra_core.hardware.profiles import load_profile
from chakra_core.jobs.flops import model_flops
from chakra_core.jobs.spec import JobSpec
from chakra_core.plan.layouts import (GPUS_NOT_DIVISIBLE, OUTSIDE_NODE, RECOMPUTE, Layout, enumerate_layouts,
                                      job_with, lower_bound_s)

SMALL_MODEL = {"layers": 8, "hidden": 1024, "ffn_hidden": 2816, "heads": 16, "kv_heads": 4, "vocab": 32000}
PROFILE = "h100-hgx-ndr400"


def job(gpus: int = 16, seq: int = 2048, global_batch: int = 32, model: Any = None, **training: Any) -> dict[str, Any]:
    return {"name": "t", "model": model or dict(SMALL_MODEL), "parallel": {"tp_comm_overlap": False},
            "training": {"seq": seq, "global_batch": global_batch, **training},
            "cluster": {"gpus": gpus, "profile": PROFILE}}


def check(enumeration: Any, data: dict[str, Any], gpus_per_node: int) -> None:
    """What holds for every enumeration: valid, complete in count, unique, sorted, inside a node."""
    layouts = enumeration.layouts
    assert len(set(layouts)) == len(layouts)
    assert layouts == sorted(layouts)
    assert len(layouts) + sum(enumeration.rejected.values()) == enumeration.tried
    for layout in layouts:
        spec = job_with(data, layout)
        p = spec.parallel
        assert (p.tp, p.pp, spec.vp, p.cp, spec.dp) == (layout.tp, layout.pp, layout.vp, layout.cp, layout.dp)
        assert layout.dp * layout.tp * layout.pp * layout.cp == data["cluster"]["gpus"]
        assert layout.tp <= gpus_per_node


# Enumeration ----------------------------------------------------------------------------------------
def test_a_small_case_counted_by_hand():
    # 8 GPUs, 4 layers, 8 heads / 2 KV heads, global batch 8, micro-batches 1 and 2, cp 1 or 2.
    # Grid: tp, pp in {1,2,4,8}; vp {1} but {1,2} for pp 2 (pp 8 leaves vp 1 for JobSpec to reject);
    # 4 x (1+2+1+1) x 2 cp x 2 mb = 80. tp pp cp > 8 in 38 of them; tp 4 and 8 split no 2 KV heads
    # (8 + 2 left); pp 8 > 4 layers (2); tp=pp=cp=1 has dp 8 x mb 2 > 8 (1); pp 2 vp 2 with dp 4 and
    # mb 2 leaves 1 micro-batch, not a multiple of pp (1). 80 - 52 = 28 valid.
    model = {"layers": 4, "hidden": 512, "ffn_hidden": 1024, "heads": 8, "kv_heads": 2, "vocab": 1000}
    data = job(gpus=8, seq=1024, global_batch=8, model=model)
    found = enumerate_layouts(data, 8, micro_batches=(1, 2), recompute=("none",), distributed_optimizer=(True,),
                              max_cp=2)
    assert found.tried == 80 and len(found.layouts) == 28
    assert found.rejected == {GPUS_NOT_DIVISIBLE: 38, "tp does not divide the heads": 10,
                              "layers not divisible by pp x vp": 2,
                              "global batch not divisible by dp x micro-batch": 1,
                              "interleaving needs micro-batches divisible by pp": 1}
    check(found, data, 8)
    # two GPUs per node: tp 4 and 8 leave the node, their whole subtrees (2 x 5 x 2 x 2) counted
    # before anything else is looked at
    narrow = enumerate_layouts(data, 2, micro_batches=(1, 2), recompute=("none",), distributed_optimizer=(True,),
                               max_cp=2)
    assert narrow.rejected[OUTSIDE_NODE] == 40 and "tp does not divide the heads" not in narrow.rejected
    assert narrow.tried == found.tried
    assert narrow.layouts == found.layouts
    # every recomputation and optimizer choice multiplies the valid layouts
    full = enumerate_layouts(data, 8, micro_batches=(1, 2), max_cp=2)
    assert len(full.layouts) == 28 * len(RECOMPUTE) * 2 and full.tried == 80 * 6
    assert full.layouts == enumerate_layouts(data, 8, micro_batches=(1, 2), max_cp=2).layouts


def test_the_job_keeps_its_other_settings_and_overrides_set_only_the_layout():
    data = job(precision="fp8", dropout=0.1)
    data["parallel"] = {"tp_comm_overlap": True, "account_for_embedding_and_loss": True}
    found = enumerate_layouts(data, 8, micro_batches=(1,), recompute=("full",), distributed_optimizer=(False,))
    check(found, data, 8)
    interleaved = next(lay for lay in found.layouts if lay.vp > 1)
    flat = next(lay for lay in found.layouts if lay.vp == 1)
    assert flat.overrides()["job.parallel.vp"] is None and interleaved.overrides()["job.parallel.vp"] == interleaved.vp
    assert set(flat.overrides()) == {"job.parallel.tp", "job.parallel.pp", "job.parallel.vp", "job.parallel.cp",
                                     "job.training.micro_batch", "job.training.recompute",
                                     "job.training.distributed_optimizer"}
    spec = job_with(data, interleaved)
    assert spec.parallel.tp_comm_overlap and spec.parallel.account_for_embedding_and_loss
    assert (spec.training.precision, spec.training.dropout, spec.training.recompute) == ("fp8", 0.1, "full")
    assert spec.training.distributed_optimizer is False
    # (layers + 2) / pp / vp whole: 10 slots
    assert all(10 % (lay.pp * lay.vp) == 0 for lay in found.layouts)
    assert Layout(4, 8, 5, 1, 32, 1, "selective", True).label() == "TP4 PP8 VP5 CP1 DP32 MB1 selective dist-opt"
    with pytest.raises(ValidationError):
        job_with(data, Layout(3, 1, 1, 1, 5, 1, "none", True))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpus=st.sampled_from([4, 6, 8, 12, 16, 24]), layers=st.integers(2, 12), heads=st.sampled_from([4, 6, 8, 12]),
       batch=st.sampled_from([4, 6, 8, 16, 24]), seq=st.sampled_from([256, 384, 512]), gpn=st.sampled_from([2, 4, 8]),
       embedding=st.booleans())
def test_every_valid_layout_is_found_once(gpus, layers, heads, batch, seq, gpn, embedding):
    model = {"layers": layers, "hidden": 64 * heads, "ffn_hidden": 128 * heads, "heads": heads, "vocab": 1000}
    data = job(gpus=gpus, seq=seq, global_batch=batch, model=model)
    data["parallel"]["account_for_embedding_and_loss"] = embedding
    options = {"micro_batches": (1, 2), "recompute": ("none",), "distributed_optimizer": (True,), "max_cp": 4}
    found = enumerate_layouts(data, gpn, **options)
    check(found, data, gpn)
    # brute force over a wider grid (any pp, any vp up to the layers + 2), JobSpec deciding
    expected = set()
    for tp in range(1, min(gpus, gpn) + 1):
        for pp in range(1, gpus + 1):
            for vp in range(1, layers + 3):
                for cp in (1, 2, 4):
                    if gpus % (tp * pp * cp):   # JobSpec's first check; skipped to keep the test fast
                        continue
                    for mb in (1, 2):
                        dp = gpus // (tp * pp * cp)
                        layout = Layout(tp, pp, vp, cp, dp, mb, "none", True)
                        try:
                            job_with(data, layout)
                        except ValidationError:
                            continue
                        expected.add(layout)
    assert set(found.layouts) == expected


def test_llama3_70b_on_1024_gpus_enumerates_fast():
    data = {"name": "llama", "model": "llama3-70b",
            "training": {"seq": 8192, "global_batch": 2048, "precision": "bf16"}, "cluster": {"gpus": 1024, "profile": PROFILE}}
    started = time.perf_counter()
    found = enumerate_layouts(data, load_profile(PROFILE).gpus_per_node)
    elapsed = time.perf_counter() - started
    print(f"\nllama3-70b / 1,024 GPUs: {found.tried} tried, {len(found.layouts)} valid in {elapsed:.3f} s; "
          f"rejected {found.rejected}")
    assert elapsed < 10
    assert len(found.layouts) > 1000 and len(found.layouts) + sum(found.rejected.values()) == found.tried
    assert Layout(8, 4, 5, 1, 32, 1, "selective", True) in found.layouts
    assert all(lay.tp <= 8 and 80 % (lay.pp * lay.vp) == 0 for lay in found.layouts)


# The lower bound ------------------------------------------------------------------------------------
def achievable() -> Any:
    """The `achievable` compute model on PROFILE: the rates plan's bound takes from it."""
    from chakra_core.contract.inputs import LayerContext, RunInputs
    from chakra_core.engine.events import EventQueue
    from chakra_sim_compute_achievable import AchievableCompute, AchievableConfig

    context = LayerContext(num_ranks=1, scheduler=EventQueue(), inputs=RunInputs(base_dir=Path(".")))
    return AchievableCompute(AchievableConfig(profile=PROFILE), context)


def simulated_step(tmp_path: Path, data: dict[str, Any], layout: Layout) -> float:
    job_data = job_with(data, layout).model_dump(mode="json")
    manifest = {"job": job_data, "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"},
                "output": {"dir": str(tmp_path / "out")}}
    return float(run.simulate(run.load(manifest, base_dir=tmp_path)).document["training"]["step_time_s"])


BOUND_CASES = {
    "tp2-pp2": (job(), Layout(2, 2, 1, 1, 4, 1, "none", True)),
    "interleaved-full-recompute": (job(), Layout(1, 4, 2, 1, 4, 2, "full", False)),
    "cp2-interleaved-32-gpus": (job(gpus=32, seq=4096, global_batch=64), Layout(4, 2, 2, 2, 2, 1, "selective", True)),
    "fp8-pp4-full": (job(precision="fp8"), Layout(2, 4, 1, 1, 2, 1, "full", True)),
    # first and last chunk a layer short: unequal stages
    "embedding-and-loss-pp2-vp5": ({**job(), "parallel": {"account_for_embedding_and_loss": True}},
                                   Layout(1, 2, 5, 1, 8, 1, "none", True)),
}


@pytest.mark.parametrize("case", sorted(BOUND_CASES))
def test_the_bound_is_never_above_the_simulated_step(tmp_path, case):
    data, layout = BOUND_CASES[case]
    spec = job_with(data, layout)
    bound = lower_bound_s(spec, load_profile(PROFILE), achievable())
    step = simulated_step(tmp_path, data, layout)
    print(f"\n{case}: bound {bound * 1e3:.3f} ms, simulated {step * 1e3:.3f} ms, ratio {bound / step:.3f}")
    assert 0 < bound <= step


def test_the_bound_is_close_with_a_real_model(tmp_path):
    data = job(model="llama3-8b", seq=8192, global_batch=32)
    layout = Layout(2, 2, 1, 1, 4, 1, "selective", True)
    bound = lower_bound_s(job_with(data, layout), load_profile(PROFILE), achievable())
    step = simulated_step(tmp_path, data, layout)
    print(f"\nllama3-8b {layout.label()}: bound {bound:.3f} s, simulated {step:.3f} s, ratio {bound / step:.3f}")
    assert 0.5 * step < bound <= step


def test_the_bound_is_at_least_the_flops_at_the_mamf_times_the_bubble():
    # the brief form: model FLOPs (causal attention, padded vocabulary) per GPU at the MAMF, times
    # 1F1B's bubble factor; the stage-by-stage bound counts attention at slower rates and the
    # output layer on the last stage
    profile, compute = load_profile(PROFILE), achievable()
    data = job(gpus=32, seq=4096, global_batch=64)
    found = enumerate_layouts(data, 8)
    assert found.layouts
    for layout in found.layouts:
        spec = job_with(data, layout)
        mamf = compute.achievable.matmul_tflops["bf16"].value * 1e12
        flops = model_flops(spec, "megatron_bridge") / 32
        simple = flops / mamf * (1 + (layout.pp - 1) / (spec.microbatches * layout.vp))
        assert lower_bound_s(spec, profile, compute) >= simple * (1 - 1e-9), layout.label()


def test_a_compute_model_that_names_no_ceiling_bounds_at_the_peak():
    spec = job_with(job(), Layout(2, 2, 1, 1, 4, 1, "none", True))
    profile = load_profile(PROFILE)
    assert 0 < lower_bound_s(spec, profile) < lower_bound_s(spec, profile, achievable())
    assert isinstance(spec, JobSpec)
