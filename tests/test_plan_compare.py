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
from chakra_core.hardware.profiles import builtin_profiles, load_profile
from chakra_core.plan.compare import best_simulated, comparison_rows, describe_versus, per_million_tokens, price_for
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


def test_energy_and_cost_per_million_tokens(two_gpus):
    (label_a, a), (label_b, b) = two_gpus
    assert a.power_w == b.power_w == 700     # H100 and H200 SXM: 700 W each
    prices = {"h100-hgx-ndr400": 2.0, label_b: 3.5}
    rows = comparison_rows(two_gpus, prices)
    for row in rows:   # GPU-hours times the power (kWh) or the price (USD)
        assert row["kwh_per_million_tokens"] == pytest.approx(row["gpu_hours_per_million_tokens"] * 0.7)
        assert row["usd_per_million_tokens"] == pytest.approx(row["gpu_hours_per_million_tokens"]
                                                              * row["usd_per_gpu_hour"])
    assert [row["usd_per_gpu_hour"] for row in rows] == [2.0, 3.5]
    # one power for both: energy follows the GPU-hours; the cost the prices too
    assert rows[1]["energy_vs_first"] == pytest.approx(rows[1]["gpu_hours_vs_first"])
    assert rows[1]["cost_vs_first"] == pytest.approx(rows[1]["gpu_hours_vs_first"] * 3.5 / 2.0)
    sentence = describe_versus(rows[1], rows[0])
    assert sentence is not None and "the energy per token at the GPUs' maximum power (700 W against 700 W)" in sentence
    assert "the cost per token ($3.50 against $2.00 per GPU-hour)" in sentence
    # no price: no cost; a profile without a power: no energy, and no ratio against it
    plain = comparison_rows(two_gpus)
    assert plain[1]["usd_per_million_tokens"] is None and plain[1]["cost_vs_first"] is None
    unpowered = dataclasses.replace(a, power_w=None)
    rows = comparison_rows([(label_a, unpowered), (label_b, b)])
    assert rows[0]["kwh_per_million_tokens"] is None and rows[1]["energy_vs_first"] is None
    assert per_million_tokens(best_simulated(unpowered)[1], unpowered.power_w, 1.0)["usd_per_million_tokens"] == \
        pytest.approx(rows[0]["gpu_hours_per_million_tokens"])


def test_a_price_is_given_per_label_per_value_or_for_all():
    prices = {"job.cluster.gpus=64": 1.0, "128": 2.0, "": 3.0}
    assert price_for(prices, "job.cluster.gpus=64") == 1.0
    assert price_for(prices, "job.cluster.gpus=128") == 2.0
    assert price_for(prices, "job.cluster.gpus=256") == 3.0 and price_for(prices, None) == 3.0
    assert price_for({}, "job.cluster.gpus=64") is None


@pytest.mark.parametrize("name", builtin_profiles())
def test_every_shipped_profile_states_its_gpus_power(name):
    power = load_profile(name).gpu.power_w
    assert power is not None and power.source and 300 <= power.value <= 1400


def test_vary_writes_the_comparison(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest()))
    out = tmp_path / "p"
    result = CliRunner().invoke(main, ["plan", str(job), "--top", "1", "--batch", "2", "--micro-batches", "1",
                                       "--out", str(out), "-j", "1",
                                       "--vary", "job.cluster.profile=h100-hgx-ndr400,h200-hgx-ndr400",
                                       "--price", "h100-hgx-ndr400=2.5", "--price", "h200-hgx-ndr400=3"])
    assert result.exit_code == 0, result.output
    assert "the best layout per value of job.cluster.profile" in result.output
    assert "job.cluster.profile=h200-hgx-ndr400: the best step is" in result.output
    assert "the GPU-hours per token" in result.output and "the cost per token ($3.00 against $2.50" in result.output
    assert "per million tokens, the best layout (energy: every GPU at its maximum power" in result.output
    assert "USD per GPU-hour" in result.output and "kWh" in result.output
    assert result.output.count("per million tokens, the best layout:") == 2     # each value's own line
    rows = list(csv.DictReader((out / "comparison.csv").open()))
    assert [float(r["usd_per_gpu_hour"]) for r in rows] == [2.5, 3.0]
    assert all(math.isclose(float(r["usd_per_million_tokens"]), float(r["gpu_hours_per_million_tokens"])
                            * float(r["usd_per_gpu_hour"]), rel_tol=1e-9) for r in rows)
    assert [r["value"] for r in rows] == ["job.cluster.profile=h100-hgx-ndr400", "job.cluster.profile=h200-hgx-ndr400"]
    per_value = [json.loads((out / r["value"] / "plan.json").read_text())["rows"][0] for r in rows]
    assert [float(r["step_s"]) for r in rows] == [v["step_s"] for v in per_value]
    data = json.loads((out / "comparison.json").read_text())
    assert data["reference"] == rows[0]["value"]
    assert math.isclose(data["rows"][1]["step_vs_first"], per_value[1]["step_s"] / per_value[0]["step_s"])


@pytest.mark.parametrize("price, why", [("h999-unknown=2", "'h999-unknown' is not a --vary value; the values are"),
                                        ("h100-hgx-ndr400=-1", "a positive price per GPU-hour"),
                                        ("abc", "a positive price per GPU-hour")])
def test_a_bad_price_is_refused_before_planning(tmp_path, price, why):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest()))
    result = CliRunner().invoke(main, ["plan", str(job), "--out", str(tmp_path / "p"), "--price", price,
                                       "--vary", "job.cluster.profile=h100-hgx-ndr400,h200-hgx-ndr400"])
    assert result.exit_code == 2 and why in result.output and f"--price {price}" in result.output
    assert not (tmp_path / "p").exists()


def test_one_plan_prints_its_cost_and_energy(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest()))
    result = CliRunner().invoke(main, ["plan", str(job), "--top", "1", "--batch", "2", "--micro-batches", "1",
                                       "--out", str(tmp_path / "p"), "-j", "1", "--price", "2"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("per million tokens, the best layout:"))
    hours = json.loads((tmp_path / "p" / "plan.json").read_text())["rows"][0]
    assert "kWh with every GPU at its maximum power (700 W" in line and "at $2.00 per GPU-hour" in line
    assert hours["step_s"] > 0


def test_a_power_inherited_for_another_gpu_is_warned_of_and_used(tmp_path):
    # another part's name, nothing restated: its rates are warned of, the H100's 700 W too
    (tmp_path / "renamed.yaml").write_text("extends: h100-hgx-ndr400\ndescription: renamed\n"
                                           "gpu:\n  model: H100 (what-if)\n")
    job = manifest()
    job["job"]["cluster"]["profile"] = str(tmp_path / "renamed.yaml")
    found = plan(job, tmp_path, tmp_path / "p", PlanOptions(top=1, batch=2, search=TIGHT), Execution(workers=1))
    assert any(w.startswith("gpu.power_w = 700 inherited from h100-hgx-ndr400") and "gpu.model changed" in w
               for w in found.warnings)
    best = best_simulated(found)
    assert found.power_w == 700 and best is not None
    assert per_million_tokens(best[1], found.power_w)["kwh_per_million_tokens"] is not None
