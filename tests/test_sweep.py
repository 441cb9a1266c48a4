"""`chakra-sim sweep`: the sweep file, key paths, resuming, the table and plot, both executors."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from chakra_core.cli import main
from chakra_core.errors import ManifestError
from chakra_core.config.manifest import format_loc
from chakra_core.sweep import load_sweep, parse_key_path, run_sweep, set_key_path
from chakra_core.sweep.run import WALL_COLUMN, SweepError, run_local
from chakra_core.sweep.task import PointOutcome, PointTask, Status
from chakra_core.sweep.paths import KeyPathError, Metric
from chakra_core.sweep.spec import build_sweep

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "examples" / "allreduce_8npu.yaml"
TRACES = ROOT / "examples" / "traces" / "all_reduce_8npus_1MB"


def write_sweep(folder: Path, body: dict, name: str = "sweep.yaml") -> Path:
    body = {"base": str(BASE), "output": {"dir": "out"}, **body}
    path = folder / name
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def broken_traces(folder: Path) -> Path:
    """Trace files that pass validation (they exist) but fail when read: a point failing as it runs."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(8):
        (folder / f"all_reduce.{rank}.et").write_bytes(b"\xff\xff\xff")
    return folder / "all_reduce"


BROKEN_ERROR = "all_reduce.0.et: at byte 0: file ends inside a length prefix (truncated file)"


def sweep_cli(*args: str):
    return CliRunner().invoke(main, ["sweep", *map(str, args)])


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


# Key paths ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["network.bandwidth[0]", "system.preferred-dataset-splits",
                                  "network.generator.k", "workload.comm_groups.tp[2][1]"])
def test_key_paths_are_the_manifest_errors_own(text):
    assert format_loc(parse_key_path(text)) == text


@pytest.mark.parametrize("text", ["", "network..bandwidth", "network.bandwidth[-1]", "network.bandwidth[x]",
                                  ".network", "network.", "network bandwidth", "[0]", 5])
def test_bad_key_paths_are_refused(text):
    with pytest.raises(KeyPathError, match="not a key path"):
        parse_key_path(text)


def test_setting_a_key_path_creates_mapping_keys_but_never_list_items():
    data = {"network": {"bandwidth": [50, 100], "plugin": "analytical"}}
    set_key_path(data, ("network", "bandwidth", 1), 200)
    set_key_path(data, ("memory", "remote", "latency_ns"), 7)
    assert data == {"network": {"bandwidth": [50, 200], "plugin": "analytical"},
                    "memory": {"remote": {"latency_ns": 7}}}
    with pytest.raises(KeyPathError, match=r"index 2 out of range: network.bandwidth has 2 items"):
        set_key_path(data, ("network", "bandwidth", 2), 1)
    with pytest.raises(KeyPathError, match=r"network.latency is not in the base manifest"):
        set_key_path(data, ("network", "latency", 0), 1)
    with pytest.raises(KeyPathError, match=r"network.plugin is a str \('analytical'\), not a mapping"):
        set_key_path(data, ("network", "plugin", "name"), "x")
    with pytest.raises(KeyPathError, match=r"network is a mapping, not a list"):
        set_key_path(data, ("network", 0), 1)


def test_a_value_is_copied_into_each_point():
    value = [1, 2]
    data: dict = {}
    set_key_path(data, ("network", "bandwidth"), value)
    value.append(3)
    assert data["network"]["bandwidth"] == [1, 2]


# Expansion ------------------------------------------------------------------------------------
INLINE_BASE = {"workload": {"trace": "t"}, "network": {"plugin": "analytical", "bandwidth": [1]}}


def test_grid_is_a_product_in_the_order_written_and_points_vary_slowest(tmp_path):
    sweep = build_sweep({"base": INLINE_BASE,
                         "grid": {"network.bandwidth[0]": [10, 20], "system.preferred-dataset-splits": [1, 4, 16]},
                         "points": [{"network.plugin": "analytical"}, {"network.plugin": "congestion"}]},
                        tmp_path, "s.yaml")
    assert sweep.keys == ["network.bandwidth[0]", "system.preferred-dataset-splits", "network.plugin"]
    assert [tuple(p.overrides.values()) for p in sweep.points[:4]] == [
        ("analytical", 10, 1), ("analytical", 10, 4), ("analytical", 10, 16), ("analytical", 20, 1)]
    assert len(sweep.points) == 12 and sweep.points[6].overrides["network.plugin"] == "congestion"
    assert [p.index for p in sweep.points] == list(range(12))
    last = sweep.points[-1].data
    assert last["network"] == {"plugin": "congestion", "bandwidth": [20]}
    assert last["system"] == {"preferred-dataset-splits": 16}
    assert len({p.id for p in sweep.points}) == 12
    # Default plot: the first grid key on x, every other swept key splitting the lines.
    assert (sweep.plot.x, sweep.plot.series) == ("network.bandwidth[0]",
                                                 ["system.preferred-dataset-splits", "network.plugin"])
    chosen = build_sweep({"base": INLINE_BASE,
                          "grid": {"network.bandwidth[0]": [10, 20], "system.preferred-dataset-splits": [1, 4]},
                          "points": [{"network.plugin": "analytical"}, {"network.plugin": "congestion"}],
                          "plot": {"x": "system.preferred-dataset-splits", "series": "network.plugin"}},
                         tmp_path, "s.yaml")
    # The chosen series first; the key left over splits the lines too.
    assert chosen.plot.series == ["network.plugin", "network.bandwidth[0]"]


def test_point_ids_follow_the_overrides_not_the_position(tmp_path):
    base = {"workload": {"trace": "t"}, "network": {"plugin": "analytical", "bandwidth": [1]}}
    small = build_sweep({"base": base, "grid": {"network.bandwidth[0]": [10, 20]}}, tmp_path, "s.yaml")
    large = build_sweep({"base": base, "grid": {"network.bandwidth[0]": [5, 10, 20]}}, tmp_path, "s.yaml")
    assert [p.id for p in small.points] == [p.id for p in large.points[1:]]
    assert [p.fingerprint for p in small.points] == [p.fingerprint for p in large.points[1:]]
    changed = build_sweep({"base": {**base, "compute": {"plugin": "replay"}},
                           "grid": {"network.bandwidth[0]": [10, 20]}}, tmp_path, "s.yaml")
    assert [p.id for p in changed.points] == [p.id for p in small.points]
    assert not {p.fingerprint for p in changed.points} & {p.fingerprint for p in small.points}


def test_metric_paths_and_aggregates():
    results = {"finish_ns": 30, "layers": {"network": {"summary": {"links": [{"bytes": 5}]}}},
               "ranks": [{"exposed_comm_ns": 10, "hbm": {"peak": 3}}, {"exposed_comm_ns": 20, "hbm": {"peak": 4}}]}
    assert Metric.parse("finish_ns").value(results) == 30
    assert Metric.parse("layers.network.summary.links[0].bytes").value(results) == 5
    assert Metric.parse("max(exposed_comm_ns)").value(results) == 20
    assert Metric.parse("mean(exposed_comm_ns)").value(results) == 15.0
    assert Metric.parse("sum( hbm.peak )").value(results) == 7
    with pytest.raises(KeyPathError, match=r"the results have no ranks\[0\].nope"):
        Metric.parse("min(nope)").value(results)
    with pytest.raises(KeyPathError, match="is a mapping, not a number"):
        Metric.parse("layers.network").value(results)
    with pytest.raises(KeyPathError, match="unknown aggregate 'median'"):
        Metric.parse("median(finish_ns)")


# A bad sweep file: exit status 2, nothing run ----------------------------------------------------
@pytest.mark.parametrize("body, where, reason", [
    ({"grid": {"network.bandwidth]0[": [1]}}, "grid", "not a key path: 'network.bandwidth]0['"),
    ({"grid": {"network.bandwidth[0]": [1]}, "grids": {}}, "grids", "unknown key"),
    ({"grid": {"network.bandwidth[3]": [1, 2]}}, "grid: network.bandwidth[3]",
     "index 3 out of range: network.bandwidth has 1 item"),
    ({"grid": {"netwrk.bandwidth": [[1]]}}, "grid: netwrk.bandwidth", "unknown manifest section 'netwrk'"),
    ({"grid": {"network.bandwidth[0]": 50}}, "grid: network.bandwidth[0]", "expected a list of values"),
    ({"grid": {"network.bandwidth[0]": []}}, "grid: network.bandwidth[0]", "empty list"),
    ({"grid": {"network.bandwidth[0]": [1]}, "points": [{"network.bandwidth[0]": 2}]},
     "points[0]: network.bandwidth[0]", "also in grid"),
    ({"points": [{"network.plugin": "analytical"}, {"network.plugin": "analytical"}]}, "points",
     "point 1 (network.plugin=\"analytical\") repeats point 0"),
    ({"grid": {"output.dir": ["a"]}}, "grid: output.dir", "the sweep chooses each point's output folder"),
    ({"grid": {"network.bandwidth[0]": [1]}, "metric": "max(finish_ns"}, "metric", "not a key path"),
    ({"grid": {"network.bandwidth[0]": [1]}, "plot": {"x": "network.latency[0]"}}, "plot.x",
     "'network.latency[0]' is not a swept key"),
    ({"base": "nowhere.yaml", "grid": {"network.bandwidth[0]": [1]}}, "base", "nowhere.yaml: file not found"),
    ({"grid": {}}, "(top level)", "nothing to sweep"),
    ({"grid": {"network.bandwidth[0]": [1]}, "job_traces": "delete"}, "job_traces", "expected keep or drop"),
])
def test_a_bad_sweep_file_names_the_file_the_key_and_the_reason(tmp_path, body, where, reason):
    path = write_sweep(tmp_path, body)
    done = sweep_cli(path)
    assert done.exit_code == 2, done.output
    assert f"{path}: {where}: " in done.output and reason in done.output, done.output
    assert not (tmp_path / "out").exists()


def test_every_problem_is_reported_at_once(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"network.bandwidth[5]": [1], "network.x..y": [1]},
                                  "metric": "avg(finish_ns)", "colour": "red"})
    with pytest.raises(ManifestError) as caught:
        load_sweep(path)
    wheres = [loc.split(": ", 1)[1] for loc, _ in caught.value.problems]
    assert sorted(wheres) == ["colour", "grid", "grid: network.bandwidth[5]", "metric"]


def test_executor_options_are_checked(tmp_path, monkeypatch):
    path = write_sweep(tmp_path, {"grid": {"network.bandwidth[0]": [50]}})
    done = sweep_cli(path, "--address", "localhost:6379")
    assert done.exit_code == 2 and "--address names a Ray cluster" in done.output
    monkeypatch.setitem(sys.modules, "ray", None)   # as if Ray were not installed
    with pytest.raises(SweepError, match=r"pip install 'chakra-sim\[ray\]'"):
        run_sweep(load_sweep(path), executor="ray")


# Running ------------------------------------------------------------------------------------------
def test_relative_paths_resolve_against_the_base_manifest(tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("results"))
    other = tmp_path / "examples" / "traces" / "copy"
    shutil.copytree(TRACES, other)
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    path = sweeps / "s.yaml"
    path.write_text(yaml.safe_dump({
        "base": "../examples/allreduce_8npu.yaml",
        "grid": {"workload.trace": ["traces/all_reduce_8npus_1MB/all_reduce", "traces/copy/all_reduce"]}}))
    result = run_sweep(load_sweep(path), workers=1)
    assert [row["finish_ns"] for row in result.rows] == [64440, 64440]
    # output.dir defaults to results/<sweep name> beside the sweep file
    assert (sweeps / "results" / "s" / "sweep.csv").is_file()
    echoed = json.loads((sweeps / "results" / "s" / "points" / result.rows[1]["id"] / "results.json").read_text())
    assert echoed["manifest"]["workload"]["trace"] == str(other / "all_reduce")


def test_a_failing_point_is_recorded_and_the_others_run(tmp_path):
    broken = broken_traces(tmp_path / "broken")
    path = write_sweep(tmp_path, {"grid": {"workload.trace": [str(TRACES / "all_reduce"), str(broken)],
                                           "network.bandwidth[0]": [50, 100]}})
    done = sweep_cli(path, "--workers", "2")
    assert done.exit_code == 1, done.output
    rows = read_csv(tmp_path / "out" / "sweep.csv")
    assert [r["status"] for r in rows] == ["ok", "ok", "failed", "failed"]
    assert [r["finish_ns"] for r in rows] == ["64440", "47360", "", ""]
    assert rows[2]["error"] == f"{tmp_path}/broken/{BROKEN_ERROR}"
    record = json.loads((tmp_path / "out" / "points" / rows[2]["id"] / "point.json").read_text())
    assert record["status"] == "failed" and "truncated file" in record["detail"]
    assert "4 points: 2 ok, 2 failed" in done.output


def test_the_default_pool_has_a_worker_per_usable_core_and_no_more_than_points(tmp_path, monkeypatch):
    """Without --workers, a process confined to some cores (a container, a batch job) starts as many
    workers as it may use, not the machine's count (chakra_core.cores)."""
    import chakra_core.sweep.run as sweep_run

    started: list[int] = []
    monkeypatch.setattr(sweep_run, "usable_cores", lambda: 3)
    monkeypatch.setattr(sweep_run, "run_local", lambda tasks, workers, *args, **kwargs: started.append(workers))
    for values, workers in (([50, 100, 200, 400, 800], 3), ([50, 100], 2)):
        path = write_sweep(tmp_path, {"grid": {"network.bandwidth[0]": values}, "output": {"dir": f"out{workers}"}})
        sweep_cli(path)
        assert started.pop() == workers


def test_resume_skips_finished_points_and_reruns_failed_ones(tmp_path):
    later = tmp_path / "later"   # unreadable traces there for now: its points fail
    traces = [str(TRACES / "all_reduce"), str(broken_traces(later))]
    path = write_sweep(tmp_path, {"grid": {"workload.trace": traces,
                                           "network.latency[0]": [100, 500]}})
    first = run_sweep(load_sweep(path), workers=2)
    assert (first.ran, first.skipped) == (4, 0)
    assert [r["status"] for r in first.rows] == ["ok", "ok", "failed", "failed"]
    ok_record = tmp_path / "out" / "points" / first.rows[0]["id"] / "point.json"
    stamp = ok_record.stat().st_mtime_ns

    shutil.copytree(TRACES, later, dirs_exist_ok=True)
    second = run_sweep(load_sweep(path), workers=2)
    assert (second.ran, second.skipped) == (2, 2)
    assert ok_record.stat().st_mtime_ns == stamp
    assert [r["status"] for r in second.rows] == ["ok"] * 4
    assert [r["finish_ns"] for r in second.rows[2:]] == [r["finish_ns"] for r in second.rows[:2]]
    assert _without_wall(second.rows[:2]) == _without_wall(first.rows[:2])

    assert run_sweep(load_sweep(path)).ran == 0
    forced = run_sweep(load_sweep(path), workers=2, force=True)
    assert (forced.ran, forced.skipped) == (4, 0) and ok_record.stat().st_mtime_ns != stamp


def test_a_changed_base_manifest_reruns_its_points(tmp_path):
    base = yaml.safe_load(BASE.read_text())
    base["workload"]["trace"] = str(TRACES / "all_reduce")
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    path = write_sweep(tmp_path, {"base": "base.yaml", "grid": {"network.bandwidth[0]": [50, 100]}})
    assert run_sweep(load_sweep(path), workers=1).ran == 2
    base["network"]["latency"] = [100]
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    again = run_sweep(load_sweep(path), workers=1)
    assert (again.ran, again.skipped) == (2, 0)
    assert [r["finish_ns"] for r in again.rows] == [42040, 24960]   # latency 100 ns, 4 splits


def _lose_point_one(task: PointTask) -> PointOutcome:
    """A worker that dies on point 1 (as a crash in native code or the OOM killer would)."""
    if task.index == 1:
        os._exit(3)
    return PointOutcome(task.index, task.id, Status.OK)


def test_a_dead_worker_fails_its_point_and_the_pool_goes_on():
    outcomes = []
    run_local([PointTask(i, str(i)) for i in range(4)], 1, outcomes.append, function=_lose_point_one)
    assert [(o.index, o.status) for o in outcomes] == [(0, Status.OK), (1, Status.FAILED), (2, Status.OK), (3, Status.OK)]
    assert "a worker process died" in outcomes[1].error


def test_a_killed_sweeps_temporary_folder_is_removed_by_the_next(tmp_path, monkeypatch):
    """kill -9 leaves a pool's temporary folder behind; the next pool removes those whose process is
    gone, and keeps a live process's and any whose owner it cannot tell."""
    import tempfile

    from chakra_core.sweep.pool import TEMP_PREFIX, remove_abandoned_temp_dirs
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    abandoned = tmp_path / f"{TEMP_PREFIX}pid{int(ended.stdout)}-a1b2"
    (abandoned / "decompressed").mkdir(parents=True)
    (abandoned / "decompressed" / "trace.0.et").write_bytes(b"x" * 100)
    live = tmp_path / f"{TEMP_PREFIX}pid{os.getpid()}-c3d4"
    unknown = tmp_path / f"{TEMP_PREFIX}e5f6"
    live.mkdir()
    unknown.mkdir()
    remove_abandoned_temp_dirs()
    assert not abandoned.exists() and live.exists() and unknown.exists()
    outcomes: list[PointOutcome] = []
    run_local([PointTask(0, "0")], 1, outcomes.append, function=_lose_point_one)   # a pool's own goes when it ends
    assert outcomes[0].status == Status.OK
    assert sorted(tmp_path.iterdir()) == sorted([live, unknown])


# Outputs ---------------------------------------------------------------------------------------
def test_csv_and_parquet_hold_the_same_table_and_the_png_is_drawn(tmp_path):
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    path = write_sweep(tmp_path, {"grid": {"network.bandwidth[0]": [25, 50.5],
                                           "network.topology": [["Ring"], ["Switch"]]},
                                  "points": [{"system.all-reduce-implementation": ["ring"]},
                                             {"system.all-reduce-implementation": ["direct"],
                                              "workload.trace": str(broken_traces(tmp_path / "broken"))}],
                                  "metric": "max(exposed_comm_ns)"})
    result = run_sweep(load_sweep(path), workers=2)
    assert [r["status"] for r in result.rows] == ["ok"] * 4 + ["failed"] * 4
    out = tmp_path / "out"
    parquet = pq.read_table(out / "sweep.parquet")
    assert parquet.column_names == result.columns
    assert parquet.column_names[:6] == ["point", "id", "network.bandwidth[0]", "network.topology",
                                        "system.all-reduce-implementation", "workload.trace"]
    types = {f.name: str(f.type) for f in parquet.schema}
    assert types["network.bandwidth[0]"] == "double" and types["network.topology"] == "string"
    assert types["error"] == "string" and types["finish_ns"] == "int64" and types["mean(waiting_ns)"] == "double"
    assert parquet.column("network.topology").to_pylist()[:2] == ['["Ring"]', '["Switch"]']
    assert parquet.column("workload.trace").to_pylist() == [None] * 4 + [str(tmp_path / "broken" / "all_reduce")] * 4
    options = pacsv.ConvertOptions(column_types=parquet.schema, strings_can_be_null=True)
    assert pacsv.read_csv(out / "sweep.csv", convert_options=options).equals(parquet)
    assert parquet.column("max(exposed_comm_ns)").to_pylist()[:4] == [
        max(r["exposed_comm_ns"] for r in json.loads((out / "points" / i / "results.json").read_text())["ranks"])
        for i in parquet.column("id").to_pylist()[:4]]

    png = (out / "sweep.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_a_metric_missing_from_the_results_is_a_warning_not_a_failure(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"network.bandwidth[0]": [50]}, "metric": "mean(hbm.peak_memory_bytes)"})
    done = sweep_cli(path, "--quiet")
    assert done.exit_code == 0, done.output
    assert "metric mean(hbm.peak_memory_bytes): the results have no ranks[0].hbm" in done.output
    assert "no plot" in done.output and not (tmp_path / "out" / "sweep.png").exists()
    assert read_csv(tmp_path / "out" / "sweep.csv")[0]["mean(hbm.peak_memory_bytes)"] == ""


def test_run_does_not_import_the_sweep_dependencies(tmp_path):
    code = ("import sys\nfrom chakra_core.cli import main\n"
            f"main(['run', {str(BASE)!r}, '--out', {str(tmp_path)!r}, '-q'], standalone_mode=False)\n"
            "print(sorted(m for m in ('matplotlib', 'pyarrow', 'ray') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().endswith("[]"), done.stdout


# Local pool and Ray agree ------------------------------------------------------------------------
GRID_24 = {"network.bandwidth[0]": [25, 50, 100], "network.latency[0]": [100, 500],
           "system.preferred-dataset-splits": [1, 4], "network.plugin": ["analytical", "congestion"]}


def _without_wall(rows):
    return [{k: v for k, v in row.items() if k != WALL_COLUMN} for row in rows]


def test_24_points_give_identical_tables_on_the_local_pool_and_on_ray(tmp_path):
    ray = pytest.importorskip("ray")
    path = write_sweep(tmp_path, {"grid": GRID_24})
    done = sweep_cli(path, "--out", tmp_path / "local", "--workers", "2", "--quiet")
    assert done.exit_code == 0, done.output
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        remote = run_sweep(load_sweep(path, tmp_path / "ray"), executor="ray")
    finally:
        ray.shutdown()
    assert remote.ran == 24
    local = load_sweep(path, tmp_path / "local")
    resumed = run_sweep(local)   # every point done: the rows come back from the files
    assert resumed.skipped == 24
    assert _without_wall(remote.rows) == _without_wall(resumed.rows)
    assert len({row["finish_ns"] for row in remote.rows}) > 10   # the keys do change the results
    local_csv, ray_csv = read_csv(tmp_path / "local" / "sweep.csv"), read_csv(tmp_path / "ray" / "sweep.csv")
    assert _without_wall(local_csv) == _without_wall(ray_csv)
    for point in local.points:   # results.json too, but for the folder it names
        texts = [(tmp_path / side / "points" / point.id / "results.json").read_text()
                 .replace(str(tmp_path / side), "OUT") for side in ("local", "ray")]
        assert texts[0] == texts[1]


def test_the_ray_executor_starts_and_stops_its_own_local_instance(tmp_path):
    ray = pytest.importorskip("ray")
    broken = broken_traces(tmp_path / "broken")
    path = write_sweep(tmp_path, {"grid": {"workload.trace": [str(TRACES / "all_reduce"), str(broken)]}})
    done = sweep_cli(path, "--executor", "ray", "--workers", "1", "--quiet")
    assert done.exit_code == 1, done.output
    assert "point 1 (" in done.output and BROKEN_ERROR in done.output
    assert [r["finish_ns"] for r in read_csv(tmp_path / "out" / "sweep.csv")] == ["64440", ""]
    assert not ray.is_initialized()


def test_the_plot_gives_units_and_shows_one_element_lists_as_their_value(tmp_path):
    from chakra_core.sweep.table import key_unit, plot_figure

    sweep = build_sweep({"base": INLINE_BASE,
                         "grid": {"network.bandwidth": [[50], [100]], "network.latency": [[500], [500, 700]]}},
                        tmp_path, "s.yaml", name="bw")
    rows = [{"status": "ok", "finish_ns": 40_000 + 1000 * i, **p.overrides} for i, p in enumerate(sweep.points)]
    figure = plot_figure(sweep, rows)
    axes = figure.axes[0]
    assert axes.get_xlabel() == "network.bandwidth (GB/s)"
    assert axes.get_ylabel() == "finish (µs)"
    assert axes.get_title() == "bw: finish (µs) vs network.bandwidth (GB/s)"
    assert [tick.get_text() for tick in axes.get_xticklabels()] == ["50", "100"]     # not "[50]"
    legend = axes.get_legend()
    assert legend.get_title().get_text() == "network.latency (ns)"
    assert [text.get_text() for text in legend.get_texts()] == ["500", "500, 700"]
    assert [key_unit(k) for k in ("network.bandwidth[0]", "system.local-mem-bw", "network.latency[1]",
                                  "system.preferred-dataset-splits", "compute.peak_tflops")] == [
        "GB/s", "GB/s", "ns", None, "TFLOP/s"]


def test_a_long_legend_title_goes_beside_the_axes_a_key_per_line(tmp_path):
    """Series keys that would make a legend wider than the axes (plan's nine) go beside them, one
    key per line, rather than collapsing the axes (matplotlib's constrained layout warns)."""
    import warnings

    from chakra_core.sweep.table import plot_figure, plot_png

    sweep = build_sweep({"base": INLINE_BASE,
                         "grid": {"network.bandwidth[0]": [10, 20], "system.preferred-dataset-splits": [1, 4],
                                  "system.local-mem-bw": [50], "system.endpoint-delay": [10]}},
                        tmp_path, "s.yaml", name="wide")
    assert len(", ".join(sweep.plot.series)) > 60 and len(sweep.points) == 4
    rows = [{"status": "ok", "finish_ns": 40_000 + 1000 * i, **p.overrides} for i, p in enumerate(sweep.points)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plot_png(sweep, rows)
    figure = plot_figure(sweep, rows)
    assert figure.axes[0].get_legend() is None and len(figure.legends) == 1
    assert figure.legends[0].get_title().get_text().count("\n") == len(sweep.plot.series) - 1


def test_a_sweep_that_grows_runs_every_point_once_on_the_same_workers_and_resumes(tmp_path):
    """`grow` (plan's rounds) adds points while the sweep runs: each runs once, the table has every
    point's row in order, a bad added point stops the sweep naming it, a second run of the same
    growth reads every point back, and `force` runs them all again."""
    bandwidths = [[50], [50, 100], [50, 100, 200], [50, 100, 200, 400]]

    def sweep_of(values: list[int]):
        return load_sweep(write_sweep(tmp_path, {"points": [{"network.bandwidth[0]": v} for v in values]}))

    def run(steps: list[list[int]], force: bool = False):
        left, seen = list(steps[1:]), []

        def grow():
            if not left:
                return None
            return sweep_of(left.pop(0))

        result = run_sweep(sweep_of(steps[0]), workers=2, grow=grow, on_point=lambda p: seen.append(p.point.index),
                           force=force)
        return result, seen

    first, seen = run(bandwidths)
    assert (first.ran, first.skipped) == (4, 0) and sorted(seen) == [0, 1, 2, 3]
    assert [row["network.bandwidth[0]"] for row in first.rows] == [50, 100, 200, 400]
    alone = run_sweep(load_sweep(write_sweep(tmp_path, {"points": [{"network.bandwidth[0]": 400}],
                                                        "output": {"dir": "alone"}}, "alone.yaml")))
    assert alone.ran == 1 and first.rows[3]["finish_ns"] == alone.rows[0]["finish_ns"]
    again, _ = run(bandwidths)
    assert (again.ran, again.skipped) == (0, 4)
    forced, _ = run(bandwidths, force=True)   # every point again, the added ones too
    assert (forced.ran, forced.skipped) == (4, 0)
    with pytest.raises(ManifestError, match="point 2"):
        run([[50], [50, 100], [50, 100, "fast"]])


def test_a_sweep_that_grows_on_ray_runs_its_points_in_batches_and_resumes(tmp_path, monkeypatch):
    """With the Ray executor the added points run once the batch before has ended; a second run
    whose first points are all read back still asks for the rest (Ray replaced by the points run
    here, in order: the batching is what is tested)."""
    import chakra_core.sweep.run as sweep_run

    batches: list[list[int]] = []

    def in_process(tasks, workers, address, on_outcome, function, timeout=None):
        batches.append([task.index for task in tasks])
        for task in tasks:
            on_outcome(function(task))

    monkeypatch.setattr(sweep_run, "run_ray", in_process)

    def run(steps: list[list[int]]):
        left = list(steps[1:])

        def sweep_of(values: list[int]):
            return load_sweep(write_sweep(tmp_path, {"points": [{"network.bandwidth[0]": v} for v in values]}))

        return run_sweep(sweep_of(steps[0]), executor="ray", grow=lambda: sweep_of(left.pop(0)) if left else None)

    first = run([[50], [50, 100], [50, 100, 200]])
    assert batches == [[0], [1], [2]] and first.ran == 3
    batches.clear()
    again = run([[50], [50, 100], [50, 100, 200], [50, 100, 200, 400]])
    assert batches == [[3]] and (again.ran, again.skipped) == (1, 3)
    assert [row["network.bandwidth[0]"] for row in again.rows] == [50, 100, 200, 400]
