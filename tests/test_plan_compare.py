"""`plan --vary`'s comparison (chakra_core.plan.compare): each value's best against the first's."""

from __future__ import annotations

import csv
import dataclasses
import json
import math

import pytest
import yaml
from click.testing import CliRunner

from chakra_core.cli import main
from chakra_core.jobs.bands import ErrorBand
from chakra_core.plan.compare import comparison_rows, describe_versus
from chakra_core.plan.search import SIMULATED, PlanOptions, plan
from chakra_core.sweep.run import Execution
from tests.test_plan import SEARCH, manifest

TIGHT = {**SEARCH, "recompute": ("none",)}


@pytest.fixture(scope="module")
def two_gpus(tmp_path_factory):
    """The same small job planned on H100 and on H200."""
    tmp = tmp_path_factory.mktemp("compare")
    plans = []
    for profile in ("h100-hgx-ndr400", "h200-hgx-ndr400"):
        job = manifest()
        job["job"]["cluster"]["profile"] = profile
        plans.append((f"job.cluster.profile={profile}",
                      plan(job, tmp, tmp / profile, PlanOptions(top=1, batch=2, search=TIGHT), Execution(workers=1))))
    return plans


def best_step(found):
    return next(c for c in found.ranked() if c.status == SIMULATED).training


def test_each_value_against_the_first(two_gpus):
    rows = comparison_rows(two_gpus)
    first, second = (best_step(found) for _, found in two_gpus)
    assert rows[0]["step_vs_first"] == 1.0 and rows[0]["gpu_hours_vs_first"] == 1.0
    assert rows[0]["bias_vs_first"] is None and rows[0]["tie_with_first"] is None   # the reference itself
    assert rows[1]["step_s"] == second.step_time_s
    assert rows[1]["step_vs_first"] == pytest.approx(second.step_time_s / first.step_time_s)
    # GPU-hours per million tokens from the throughput: the same GPUs, so the step's ratio
    assert rows[1]["gpu_hours_per_million_tokens"] == pytest.approx(1e6 / (second.tokens_per_s_per_gpu * 3600))
    assert rows[1]["gpu_hours_vs_first"] == pytest.approx(rows[1]["step_vs_first"])
    assert rows[1]["gpus"] == 16 and rows[1]["best_layout"]
    # the roles whose groups leave a node: exactly those the simulated placement puts on the network
    assert rows[1]["across_domains"].split() == [g.group for g in second.placement if g.nodes > 1]


def test_bias_from_the_classes_signed_errors(two_gpus):
    (label_a, a), (label_b, b) = two_gpus
    slow = ErrorBand("H100 class", 10, 0.05, 0.04, 0.1)
    fast = ErrorBand("H200 class", 10, 0.12, -0.10, 0.2)

    def with_band(found, band):
        best = next(c for c in found.ranked() if c.status == SIMULATED)
        best.training = dataclasses.replace(best.training, error_band=band)
        return found

    rows = comparison_rows([(label_a, with_band(a, slow)), (label_b, with_band(b, fast))])
    assert rows[1]["bias_vs_first"] == pytest.approx(0.90 / 1.04 - 1)
    assert rows[1]["tie_with_first"] == (abs(rows[1]["step_vs_first"] - 1) < 0.12)
    sentence = describe_versus(rows[1], rows[0])
    assert sentence is not None and "GPU-hours per token" in sentence and "-10.0% H200 class" in sentence
    # one class for both: its bias cancels in the ratio
    same = comparison_rows([(label_a, with_band(a, slow)), (label_b, with_band(b, slow))])
    assert same[1]["bias_vs_first"] == 0.0
    assert describe_versus(same[0], same[0]) is None


def test_vary_writes_the_comparison(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest()))
    out = tmp_path / "p"
    result = CliRunner().invoke(main, ["plan", str(job), "--top", "1", "--batch", "2", "--micro-batches", "1",
                                       "--out", str(out), "-j", "1",
                                       "--vary", "job.cluster.profile=h100-hgx-ndr400,h200-hgx-ndr400"])
    assert result.exit_code == 0, result.output
    assert "the best layout per value of job.cluster.profile" in result.output
    assert "job.cluster.profile=h200-hgx-ndr400: the best step is" in result.output
    assert "the GPU-hours per token" in result.output
    rows = list(csv.DictReader((out / "comparison.csv").open()))
    assert [r["value"] for r in rows] == ["job.cluster.profile=h100-hgx-ndr400", "job.cluster.profile=h200-hgx-ndr400"]
    per_value = [json.loads((out / r["value"] / "plan.json").read_text())["rows"][0] for r in rows]
    assert [float(r["step_s"]) for r in rows] == [v["step_s"] for v in per_value]
    data = json.loads((out / "comparison.json").read_text())
    assert data["reference"] == rows[0]["value"]
    assert math.isclose(data["rows"][1]["step_vs_first"], per_value[1]["step_s"] / per_value[0]["step_s"])
