"""`chakra-sim plan` in the terminal: what it says while it works, the rows it shows, a job no
layout of which fits, and a narrow terminal."""

from __future__ import annotations

import csv
import re

import yaml
from click.testing import CliRunner

from chakra_core.cli import main
from tests.test_plan import manifest


def _plan(tmp_path, data, *args, env=None):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(data))
    return CliRunner().invoke(main, ["plan", str(job), "--micro-batches", "1,2", "--out", str(tmp_path / "plan"),
                                     "-j", "1", *args], env=env)


def test_progress_names_each_round_and_reports_a_layout_once(tmp_path):
    result = _plan(tmp_path, manifest(), "--top", "2", "--batch", "1")
    assert result.exit_code == 0, result.output
    assert re.search(r"\d+ layouts, \d+ fit in [\d.]+ GiB per GPU", result.output)
    rounds = re.findall(r"round (\d+): simulating (\d+) layout", result.output)
    assert len(rounds) >= 2 and all(count == "1" for _, count in rounds)
    reported = re.findall(r"^  1 of 1 \(round \d+\): (.+): [\d.]+ s$", result.output, re.M)
    assert len(reported) == len(rounds) and len(set(reported)) == len(reported)   # never read back again
    assert "no layout is known yet" in result.output and "to enter the 2 fastest" in result.output
    # the ranking so far after each round, its last the table's first rows
    standings = re.findall(r"^  fastest so far: 1\. (.+?) ([\d.]+) s(?:; 2\. (.+?) ([\d.]+) s)?", result.output, re.M)
    assert len(standings) == len(rounds)
    steps = [float(first) for _, first, _, _ in standings]
    assert all(later <= earlier for earlier, later in zip(steps, steps[1:]))   # the best never gets worse
    rows = [row for row in csv.DictReader((tmp_path / "plan" / "plan.csv").open()) if row["status"] == "simulated"]
    assert standings[-1][0] == rows[0]["layout"] and standings[-1][2] == rows[1]["layout"]


def test_top_shows_that_many_rows_and_says_where_the_others_are(tmp_path):
    result = _plan(tmp_path, manifest(), "--top", "1", "--batch", "3")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((tmp_path / "plan" / "plan.csv").open()))
    simulated = [row for row in rows if row["status"] == "simulated"]
    assert len(simulated) == 3
    table_rows = re.findall(r"^│\s*(\d+)\s*│", result.output, re.M)
    assert table_rows == ["1"]
    assert "2 more simulated layout(s) in plan.csv (--top 1 shows the 1 fastest)" in result.output
    assert re.search(r"^  1 of 3 \(round 1\): .+: [\d.]+ s; about \d+ s left in round 1$", result.output, re.M)
    assert re.search(r"^  3 of 3 \(round 1\): .+: [\d.]+ s$", result.output, re.M)


def test_a_simulated_layouts_traces_are_removed_unless_kept(tmp_path):
    """A layout's generated traces (gigabytes for a large model) go once it is simulated; its results
    stay, and a second plan reads them back. --keep-traces keeps them."""
    for folder in ("dropped", "kept"):
        (tmp_path / folder).mkdir()
    dropped = _plan(tmp_path / "dropped", manifest(), "--top", "1", "--batch", "2")
    assert dropped.exit_code == 0, dropped.output
    points = tmp_path / "dropped" / "plan" / "simulations" / "points"
    assert list(points.glob("*/results.json")) and not list(points.rglob("*.et"))
    table = (tmp_path / "dropped" / "plan" / "plan.csv").read_text()
    again = _plan(tmp_path / "dropped", manifest(), "--top", "1", "--batch", "2")
    assert again.exit_code == 0 and "read back from an earlier plan" in again.output, again.output
    assert (tmp_path / "dropped" / "plan" / "plan.csv").read_text() == table
    kept = _plan(tmp_path / "kept", manifest(), "--top", "1", "--batch", "2", "--keep-traces")
    assert kept.exit_code == 0, kept.output
    assert list((tmp_path / "kept" / "plan" / "simulations" / "points").rglob("*.et"))


def test_a_job_no_layout_of_which_fits_is_an_error_that_writes_nothing(tmp_path):
    result = _plan(tmp_path, manifest(gpus=2, model="llama3-70b", global_batch=8), "--top", "1")
    assert result.exit_code == 2, result.output   # an input the plan cannot satisfy, as every CliError
    assert re.search(r"error: no layout fits in memory: the smallest, .+, needs [\d.]+ GiB per GPU with its "
                     r"reserve, [\d.]+ GiB usable", result.output)
    assert not (tmp_path / "plan" / "plan.csv").exists()


def test_at_80_columns_a_layout_stays_on_one_line(tmp_path):
    result = _plan(tmp_path, manifest(), "--top", "1", "--batch", "1", "-q", env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    best = next(csv.DictReader((tmp_path / "plan" / "plan.csv").open()))["layout"]
    assert best in result.output


def test_a_cluster_files_mistake_names_the_cluster_file(tmp_path):
    cluster = tmp_path / "c0.yaml"
    cluster.write_text("cluster: {gpus: 0, profile: h100-hgx-ndr400}\n")
    result = _plan(tmp_path, manifest(), "--cluster", str(cluster))
    assert result.exit_code == 2
    assert f"{cluster}: cluster.gpus: Input should be greater than 0" in result.output
