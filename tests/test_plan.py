"""`chakra-sim plan`: the search, what it writes, resuming, and bad input."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from chakra_core.cli import main
from chakra_core.errors import ManifestError
from chakra_core.jobs.bands import ErrorBand
from chakra_core.plan.layouts import Layout
from chakra_core.plan.search import PRUNED, SIMULATED, TOO_BIG, PlanOptions, plan
from chakra_core.sweep.run import Execution

SMALL_MODEL = {"layers": 8, "hidden": 1024, "ffn_hidden": 2816, "heads": 16, "kv_heads": 4, "vocab": 32000}
PROFILE = "h100-hgx-ndr400"


def manifest(gpus: int = 16, model: Any = None, **training: Any) -> dict[str, Any]:
    return {"job": {"name": "t", "model": model or dict(SMALL_MODEL),
                    "training": {"seq": 2048, "global_batch": 32, **training},
                    "cluster": {"gpus": gpus, "profile": PROFILE}},
            "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}


SEARCH = {"micro_batches": (1, 2), "recompute": ("none", "full"), "distributed_optimizer": (True,), "max_cp": 1}


def test_the_top_layouts_are_simulated_and_the_rest_pruned_by_their_bound(tmp_path):
    found = plan(manifest(), tmp_path, tmp_path / "out",
                 PlanOptions(top=2, batch=2, search=SEARCH), Execution(workers=1))
    ranked = found.ranked()
    simulated = [c for c in ranked if c.status == SIMULATED]
    assert len(simulated) >= 2 and found.simulated == len(simulated) and found.reused == 0
    times = [c.step_s for c in simulated]
    assert times == sorted(times)
    # every pruned layout's bound is at least the 2nd best simulated step: it cannot enter the top 2
    assert all(c.bound_s >= times[1] for c in ranked if c.status == PRUNED)
    # and every simulated layout's bound is below its simulated step
    assert all(c.bound_s <= (c.step_s or 0) for c in simulated)
    counts = found.counts()
    assert counts["enumerated"] == counts["simulated"] + counts["pruned"] + counts["does not fit"] + counts["failed"]


def test_layouts_that_do_not_fit_say_what_overflows(tmp_path):
    found = plan(manifest(gpus=8, model="llama3-70b", global_batch=16, seq=4096), tmp_path, tmp_path / "out",
                 PlanOptions(top=1, batch=2, search={**SEARCH, "recompute": ("full",)}), Execution(workers=1))
    too_big = [c for c in found.candidates if c.status == TOO_BIG]
    assert too_big
    assert all("GiB" in (c.overflow or "") and c.memory.total + c.reserve.total > found.usable_bytes
               for c in too_big)
    assert all(c.memory.total + c.reserve.total <= found.usable_bytes for c in found.candidates
               if c.status != TOO_BIG)


def test_a_given_layout_is_simulated_whatever_its_bound(tmp_path):
    slow = Layout(tp=1, pp=2, vp=1, cp=1, dp=8, micro_batch=1, recompute="full", distributed_optimizer=True)
    found = plan(manifest(), tmp_path, tmp_path / "out",
                 PlanOptions(top=1, batch=1, search=SEARCH, include=(slow,)), Execution(workers=1))
    assert next(c for c in found.candidates if c.layout == slow).status == SIMULATED


def test_memory_is_checked_by_the_manifests_memory_layer(tmp_path):
    checked = plan({**manifest(), "memory": {"plugin": "hbm"}}, tmp_path, tmp_path / "out",
                   PlanOptions(top=2, batch=2, search=SEARCH), Execution(workers=1))
    simulated = [c for c in checked.candidates if c.status == SIMULATED]
    assert checked.memory_checked and simulated
    # the hbm layer's peak for the layout's traces is the prediction (the generator's norm weights aside)
    assert all(c.memory_check is not None and abs(c.memory_check) < 0.002 for c in simulated)
    row = next(r for r in checked.rows() if r["status"] == SIMULATED)
    assert row["memory_simulated_gib"] == pytest.approx(row["memory_gib"], rel=0.002)
    unchecked = plan(manifest(), tmp_path, tmp_path / "plain",
                     PlanOptions(top=2, batch=2, search=SEARCH), Execution(workers=1))
    assert not unchecked.memory_checked and any("no memory layer" in w for w in unchecked.warnings)
    assert all(c.simulated_memory is None for c in unchecked.candidates)
    # listing tensors changes no step time
    assert [c.step_s for c in unchecked.ranked()] == [c.step_s for c in checked.ranked()]


def test_cli_writes_the_table_resumes_and_gives_the_same_answer(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest()))
    out = tmp_path / "plan"
    args = ["plan", str(job), "--top", "2", "--batch", "2", "--micro-batches", "1,2", "--out", str(out), "-j", "1"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "layouts:" in first.output and "pruned by their bound" in first.output
    assert "memory is not checked" in first.output and "simulated GiB" not in first.output
    for name in ("plan.csv", "plan.parquet", "plan.json", "pareto.png", "breakdown.png"):
        assert (out / name).stat().st_size > 0
    rows = list(csv.DictReader((out / "plan.csv").open()))
    assert rows[0]["rank"] == "1" and rows[0]["status"] == SIMULATED
    # the roles on the network, as the simulated placement says (16 GPUs: two nodes)
    placed = json.loads((Path(rows[0]["point"]) / "results.json").read_text())["training"]["placement"]
    assert rows[0]["across_domains"].split() == [g["group"] for g in placed if g["nodes"] > 1]
    table = (out / "plan.csv").read_text()
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0, again.output
    assert "0 now" in again.output     # every simulation read back
    assert (out / "plan.csv").read_text() == table
    data = json.loads((out / "plan.json").read_text())
    assert data["counts"]["enumerated"] == len(data["rows"])


def test_vary_replans_per_value(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest()))
    result = CliRunner().invoke(main, ["plan", str(job), "--top", "1", "--batch", "2", "--micro-batches", "1",
                                       "--out", str(tmp_path / "p"), "-j", "1",
                                       "--vary", "job.cluster.profile=h100-hgx-ndr400,h200-hgx-ndr400"])
    assert result.exit_code == 0, result.output
    assert "the best layout per value" in result.output
    assert (tmp_path / "p" / "job.cluster.profile=h200-hgx-ndr400" / "plan.csv").exists()


@pytest.mark.parametrize("args, message", [
    (["--vary", "job.cluster.gpus"], "expected KEY=V1,V2"),
    (["--vary", "network.bandwidth=2x"], "has none at that key"),
    (["--micro-batches", "0,x"], "positive whole numbers"),
])
def test_bad_options_are_clear_errors(tmp_path, args, message):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest()))
    result = CliRunner().invoke(main, ["plan", str(job), "--out", str(tmp_path / "p"), *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_a_manifest_without_a_job_is_refused(tmp_path):
    with pytest.raises(ManifestError, match="plan searches the layouts of a training job"):
        plan({"workload": {"trace": "x"}}, tmp_path, tmp_path / "out")


def test_a_cluster_file_replaces_the_jobs_cluster(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest()))
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": {"gpus": 8, "profile": PROFILE}}))
    result = CliRunner().invoke(main, ["plan", str(job), "--cluster", str(cluster), "--top", "1", "--batch", "2",
                                       "--micro-batches", "1", "--out", str(tmp_path / "p"), "-j", "1"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((tmp_path / "p" / "plan.csv").open()))
    assert {int(r["tp"]) * int(r["pp"]) * int(r["cp"]) * int(r["dp"]) for r in rows} == {8}


def test_plan_files_are_deterministic(tmp_path):
    first = plan(manifest(), tmp_path, tmp_path / "a",
                 PlanOptions(top=1, batch=2, search=SEARCH), Execution(workers=1))
    second = plan(manifest(), tmp_path, tmp_path / "b",
                  PlanOptions(top=1, batch=2, search=SEARCH), Execution(workers=2))
    strip = [{k: v for k, v in row.items() if k != "point"} for row in first.rows()]
    assert strip == [{k: v for k, v in row.items() if k != "point"} for row in second.rows()]
    assert Path(first.rows()[0]["point"]).is_dir()


def test_local_and_ray_give_the_same_plan(tmp_path):
    ray = pytest.importorskip("ray")
    local = plan(manifest(), tmp_path, tmp_path / "local",
                 PlanOptions(top=1, batch=2, search=SEARCH), Execution(workers=2))
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        remote = plan(manifest(), tmp_path, tmp_path / "ray",
                      PlanOptions(top=1, batch=2, search=SEARCH), Execution(executor="ray"))
    finally:
        ray.shutdown()
    strip = [{k: v for k, v in row.items() if k != "point"} for row in local.rows()]
    assert strip == [{k: v for k, v in row.items() if k != "point"} for row in remote.rows()]
    assert remote.simulated == local.simulated > 0


def test_layouts_within_the_error_band_of_the_best_are_ties(tmp_path):
    """A simulated layout slower than the best by less than the model's error on published runs
    like the job is marked a tie (the rows, and so plan.csv/json and the terminal)."""
    found = plan(manifest(), tmp_path, tmp_path / "out",
                 PlanOptions(top=3, batch=3, search=SEARCH), Execution(workers=1))
    simulated = [c for c in found.ranked() if c.status == SIMULATED]
    assert len(simulated) >= 3
    best, third = simulated[0].step_s, simulated[2].step_s
    assert best is not None and third is not None and third > best
    band = (third / best - 1) * 0.99   # the third is just outside, the second (if slower) inside or equal
    for c in simulated:
        assert c.training is not None
        c.training = dataclasses.replace(c.training, error_band=ErrorBand("test", 3, band, -0.01, band))
    rows = {row["rank"]: row for row in found.rows() if row["rank"] is not None}
    assert rows[1]["vs_best"] == 0 and rows[1]["tie"]
    assert rows[2]["tie"] == (rows[2]["vs_best"] < band)
    assert rows[3]["tie"] is False and rows[3]["vs_best"] == pytest.approx(third / best - 1)
    assert found.error_band().geomean_error == band
