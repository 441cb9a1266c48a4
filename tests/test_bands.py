"""Error bands (chakra_core.jobs.bands): the closest class of published runs with enough runs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from chakra_core.jobs.bands import (MIN_RUNS, PublishedRun, band_of, error_band, precision_class, published_runs,
                                    scale_class, uncompared)
from chakra_core.jobs.spec import JobSpec

ROOT = Path(__file__).resolve().parents[1]


def _runs() -> tuple[PublishedRun, ...]:
    rows = [("h", "H100 SXM5 80GB", "hopper", "fp8", 8, 0.9), ("h", "H100 SXM5 80GB", "hopper", "fp8", 16, 0.8),
            ("h", "H100 SXM5 80GB", "hopper", "fp8", 64, 1.1), ("h", "H100 SXM5 80GB", "hopper", "bf16", 1024, 0.95),
            ("a", "A100 SXM4 80GB", "ampere", "fp16", 128, 1.2), ("a", "A100 SXM4 80GB", "ampere", "fp16", 512, 1.0),
            ("a", "A100 SXM4 80GB", "ampere", "fp16", 3072, 0.7)]
    return tuple(PublishedRun(f"{tag}{i}", model, arch, precision, gpus, ratio)
                 for i, (tag, model, arch, precision, gpus, ratio) in enumerate(rows))


def test_the_closest_class_with_enough_runs_sets_the_band():
    band = error_band("H100 SXM5 80GB", "hopper", "fp8", 32, _runs())
    assert band is not None and band.runs == MIN_RUNS and band.scope == "dense models, H100 SXM5 80GB, 8-bit, up to 64 GPUs"
    logs = [math.log(r) for r in (0.9, 0.8, 1.1)]
    assert band.geomean_error == pytest.approx(math.exp(sum(abs(x) for x in logs) / 3) - 1)
    assert band.mean_signed_error == pytest.approx(math.exp(sum(logs) / 3) - 1)
    assert band.worst_error == pytest.approx(1 / 0.8 - 1)     # 20% too fast counts as the geomean counts it
    assert band.worst_error >= band.geomean_error


def test_the_worst_is_never_below_the_geomean():
    for ratios in ((0.9,), (0.5, 0.9), (1.1, 0.95), (0.8, 0.8, 0.8)):
        geomean, _, worst = band_of([PublishedRun("", "", "", "", 1, r) for r in ratios])
        assert worst >= geomean - 1e-12


def test_fewer_runs_widen_the_class_and_say_so():
    assert error_band("H100 SXM5 80GB", "hopper", "bf16", 2048, _runs()).scope == "dense models, H100 SXM5 80GB"
    assert error_band("A100 SXM4 80GB", "ampere", "fp16", 64, _runs()).scope == "dense models, A100 SXM4 80GB, 16-bit"
    h200 = error_band("H200 SXM 141GB", "hopper", "bf16", 8, _runs())
    assert h200.runs == 4 and "none of the H200" in h200.scope
    blackwell = error_band("B200", "blackwell", "fp8", 8, _runs())
    assert blackwell.runs == 7 and "none of a blackwell GPU" in blackwell.scope


def test_a_mixture_of_experts_takes_the_band_of_mixtures_of_experts():
    """The model errs differently on them: a MoE job is not given the dense runs' band, nor a dense
    job the MoE runs' (with too few of a kind, every run)."""
    moe = [PublishedRun(f"m{i}", "H100 SXM5 80GB", "hopper", "fp8", 16 * (i + 1), ratio, moe=True)
           for i, ratio in enumerate((0.4, 0.8, 0.75))]
    runs = (*_runs(), *moe)
    band = error_band("H100 SXM5 80GB", "hopper", "fp8", 32, runs, moe=True)
    assert band.scope == "mixtures of experts, H100 SXM5 80GB, 8-bit, up to 64 GPUs" and band.runs == 3
    assert band.mean_signed_error < -0.3 and band.worst_error == pytest.approx(1.5)
    dense = error_band("H100 SXM5 80GB", "hopper", "fp8", 32, runs)
    assert dense.scope.startswith("dense models") and dense.worst_error < 0.3
    few = error_band("H100 SXM5 80GB", "hopper", "fp8", 32, _runs(), moe=True)
    assert few.scope == "(too few mixtures of experts: every run)" and few.runs == len(_runs())


def test_no_published_runs_no_band():
    assert error_band("H100 SXM5 80GB", "hopper", "fp8", 8, ()) is None
    assert scale_class(64) == "up to 64 GPUs" and scale_class(65) == "65 to 1,024 GPUs"


def test_the_shipped_runs_name_known_gpus_and_positive_ratios():
    for run in published_runs():
        assert run.ratio > 0 and run.gpus > 0 and run.precision in ("fp8", "nvfp4", "bf16", "fp16")


def test_nvfp4_is_a_class_of_its_own():
    """An NVFP4 job is not given the band of 8-bit runs: its own class, or wider when too few."""
    assert precision_class("nvfp4") == "4-bit" and precision_class("fp8") == "8-bit"
    runs = _runs() + tuple(PublishedRun("", "B200", "blackwell", "nvfp4", 64, r) for r in (0.9, 0.95, 1.05))
    band = error_band("B200", "blackwell", "nvfp4", 64, runs)
    assert band is not None and band.runs == 3 and band.scope == "dense models, B200, 4-bit, up to 64 GPUs"
    assert "8-bit" not in error_band("B200", "blackwell", "nvfp4", 64, _runs()).scope


def test_settings_no_published_run_uses_are_named_with_the_band():
    """A zero-bubble, a2a+p2p or hybrid-sharding job's band says that no compared run uses them; the
    published runs (benchmarks/data/training-runs.yaml) indeed use none, so adding one that does
    fails here until `uncompared` is updated."""
    runs = yaml.safe_load((ROOT / "benchmarks" / "data" / "training-runs.yaml").read_text())["runs"]
    for run in runs:
        settings = [s for setting in run.get("settings", []) for s in (setting.get("parallel", {}),
                                                                       setting.get("training", {}))]
        assert all(s.get("schedule", "1f1b") == "1f1b" and s.get("cp_comm_type") != "a2a+p2p"
                   and s.get("num_distributed_optimizer_instances", 1) == 1 for s in settings), run["id"]
    base = {"name": "b", "model": "llama3-8b", "training": {"seq": 4096, "global_batch": 8},
            "cluster": {"gpus": 8, "profile": "h100-hgx-ndr400"}}
    assert uncompared(JobSpec.model_validate({**base, "parallel": {"tp": 8}})) == ()
    zb = JobSpec.model_validate({**base, "parallel": {"tp": 2, "pp": 4, "schedule": "zb-h1"},
                                 "training": {**base["training"], "overlap_grad_reduce": False}})
    assert uncompared(zb) == ("parallel.schedule zb-h1",)
    band = error_band("H100 SXM5 80GB", "hopper", "bf16", 8, runs=_runs(), not_covered=uncompared(zb))
    assert band is not None and band.to_json()["not_covered"] == ["parallel.schedule zb-h1"]
    plain = error_band("H100 SXM5 80GB", "hopper", "bf16", 8, runs=_runs())
    assert plain is not None and "not_covered" not in plain.to_json()


def test_each_published_run_is_counted_once():
    """A measurement listed twice (two copies of one table under one id, as the 26.06 405B H100 run
    was) would weigh twice in every class's geomean: ids are unique, and no two compared runs share
    the GPU, scale, model, batch and measured step."""
    runs = yaml.safe_load((ROOT / "benchmarks" / "data" / "training-runs.yaml").read_text())["runs"]
    ids = [run["id"] for run in runs]
    assert len(ids) == len(set(ids))
    compared = [run for run in runs if run.get("verified") and not run.get("excluded")]
    keys = [(run["gpu"], run["gpus"], run["model"], run["seq"], run["gbs"], run["precision"],
             run["measured"]["step_time_s"]) for run in compared]
    assert len(keys) == len(set(keys))
    assert len({run.id for run in published_runs()}) == len(published_runs())
