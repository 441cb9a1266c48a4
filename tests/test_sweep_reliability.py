"""Sweeps on shared machines: the output folder's lock, per-point timeouts and failures of any
kind, every point validated before the first runs, SIGINT/SIGTERM, Ray on 127.0.0.1 only.

The signal tests run `chakra-sim sweep` in a subprocess with its own TMPDIR, so that whatever
it or its workers leave behind in the temp folder is theirs and visible."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from chakra_core.cli import main
from chakra_core.errors import ManifestError
from chakra_core.sweep import load_sweep, run_sweep
from chakra_core.output_lock import LOCK_NAME, OutputLock, OutputLockedError
from chakra_core.sweep.run import run_local
from chakra_core.sweep.task import PointOutcome, PointTask, Status
from tests.sweep_processes import descendants, finished_points, gzip_traces, running, table_without_wall

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "examples" / "allreduce_8npu.yaml"
CHAKRA_SIM = [sys.executable, "-m", "chakra_core.cli"]


def write_sweep(folder: Path, body: dict) -> Path:
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": str(BASE), "output": {"dir": "out"}, **body}, sort_keys=False))
    return path


def wait_until(condition, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def leftovers(*folders: Path) -> list[str]:
    """Temporary files (and the lock) left in an output folder, or anything in a temp folder."""
    found = []
    for folder in folders:
        for path in folder.rglob("*"):
            if folder.name == "tmp" or path.name.endswith(".tmp") or path.name == LOCK_NAME:
                found.append(str(path))
    return found


# The output folder's lock ------------------------------------------------------------------------
def test_a_second_writer_fails_at_once_naming_the_folder_and_the_holder(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"network.bandwidth[0]": [50]}})
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from chakra_core.output_lock import OutputLock
        with OutputLock(Path({str(out)!r})):
            print("locked", flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        started = time.monotonic()
        done = CliRunner().invoke(main, ["sweep", str(path), "--quiet"])
        assert time.monotonic() - started < 5   # at once, not after waiting
        assert done.exit_code == 2, done.output
        assert f"output folder {out} is in use by another run (process {holder.pid}: -c)" in done.output
        assert "Traceback" not in done.output
        assert not (out / "points").exists()
    finally:
        holder.kill()   # as kill -9 would: the kernel drops the lock with the process
        holder.wait()
    assert (out / LOCK_NAME).exists()   # left behind by the killed holder, but not locked
    assert CliRunner().invoke(main, ["sweep", str(path), "--quiet"]).exit_code == 0
    assert not (out / LOCK_NAME).exists()   # a run that ends removes its lock file


def test_the_lock_is_held_once_per_folder_and_released_with_its_block(tmp_path):
    with OutputLock(tmp_path):
        with pytest.raises(OutputLockedError, match=rf"process {os.getpid()}"):
            OutputLock(tmp_path).acquire()   # a second holder, even in the same process
    with OutputLock(tmp_path):
        pass


def test_kill_9_of_a_sweep_leaves_no_worker_and_no_stale_lock(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"network.bandwidth[0]": list(range(10, 210))}})
    out = tmp_path / "out"
    sweep = subprocess.Popen([*CHAKRA_SIM, "sweep", str(path), "--workers", "2", "--quiet"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: finished_points(out) >= 3, 60, "the first points")
        children = descendants(sweep.pid)
    finally:
        sweep.kill()
        sweep.wait()
    assert len(children) >= 2
    wait_until(lambda: not any(running(pid) for pid in children), 10, "the workers to die with the sweep")
    (out / ".sweep.csv.k9stale.tmp").write_text("a temporary file a kill -9 left")
    resumed = run_sweep(load_sweep(path), workers=2)
    assert resumed.skipped >= 3 and resumed.failed == 0 and resumed.skipped + resumed.ran == 200
    assert leftovers(out) == []


# Failures of any kind, timeouts ------------------------------------------------------------------
@dataclass(frozen=True)
class Misbehaving(PointTask):
    do: str = "ok"
    report: str = ""


def _misbehave(task: Misbehaving) -> PointOutcome:
    """Point i does the i-th thing a point can do wrong (or right)."""
    what = task.do
    if what == "hang":
        # A temp file and a child process of its own: the kill must take both.
        Path(task.report).write_text(json.dumps({
            "temp": tempfile.mkdtemp(prefix="hung-point-"),
            "child": subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]).pid}))
        time.sleep(60)
    if what == "exit":
        sys.exit(3)
    if what == "interrupt":
        raise KeyboardInterrupt
    if what == "error":
        raise ValueError("bad value\nsecond line")
    if what == "die":
        os._exit(7)
    return PointOutcome(task.index, task.id, Status.OK)


def test_exceptions_of_any_kind_and_timeouts_fail_their_point_alone(tmp_path):
    report = tmp_path / "hung.json"
    kinds = ["ok", "exit", "interrupt", "hang", "error", "die", "ok"]
    tasks = [Misbehaving(i, str(i), do=kind, report=str(report)) for i, kind in enumerate(kinds)]
    outcomes = []
    started = time.monotonic()
    run_local(tasks, 2, outcomes.append, function=_misbehave, timeout=1.5)
    assert time.monotonic() - started < 15
    errors = {o.index: (o.status.value, o.error) for o in outcomes}
    assert errors == {
        0: ("ok", None),
        1: ("failed", "SystemExit: 3"),
        2: ("failed", "KeyboardInterrupt"),
        3: ("failed", "timed out after 1.5 s"),
        4: ("failed", "ValueError: bad value"),
        5: ("failed", errors[5][1]),
        6: ("ok", None)}
    assert errors[5][1].startswith("a worker process died (exit status 7) while running this point")
    assert "Traceback" in next(o for o in outcomes if o.index == 1).detail
    hung = json.loads(report.read_text())
    assert not running(hung["child"])        # the hung point's own process was killed with it
    assert not Path(hung["temp"]).exists()   # and its temp folder removed with the pool's


@pytest.mark.parametrize("guarded", [False, True])
def test_workers_that_die_as_they_start_stop_the_pool_and_an_unguarded_script_is_named(tmp_path, guarded):
    """A script that starts a pool at its top level starts it again in every (spawned) worker,
    which dies: the error names the script and the guard it lacks; a guarded script whose
    workers die for another reason is not blamed."""
    body = textwrap.dedent("""\
        import functools, os
        from chakra_core.sweep.pool import PoolError, run_pool
        from chakra_core.sweep.task import PointTask

        def start():
            try:
                run_pool([PointTask(0, "p0")], 1, print, print, warm=functools.partial(os._exit, 3) if GUARDED else None)
            except PoolError as exc:
                print("POOL:", exc)
        """)
    script = tmp_path / "start_pool.py"
    script.write_text(f"GUARDED = {guarded}\n{body}" + ('if __name__ == "__main__":\n    start()\n' if guarded else "start()\n"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    said = next(line for line in done.stdout.splitlines() if line.startswith("POOL:"))
    assert "worker processes die as they start" in said
    if guarded:
        assert "(exit status 3)" in said and "__main__" not in said
    else:
        assert f"each worker imports {script} again" in said and 'if __name__ == "__main__":' in said


def test_the_timeout_comes_from_the_sweep_file_or_the_command_line(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"network.bandwidth[0]": [50, 100]}, "timeout": 30})
    assert load_sweep(path).timeout == 30
    # A real point takes milliseconds: far more than 0.0001 s.
    done = CliRunner().invoke(main, ["sweep", str(path), "--timeout", "0.0001", "--quiet", "--workers", "1"])
    assert done.exit_code == 1, done.output
    assert "point 0 (" in done.output and "failed: timed out after 0.0001 s" in done.output
    record = json.loads(next((tmp_path / "out" / "points").glob("*/point.json")).read_text())
    assert record["status"] == "failed" and record["error"] == "timed out after 0.0001 s"
    assert CliRunner().invoke(main, ["sweep", str(path), "--quiet"]).exit_code == 0   # 30 s is plenty


@pytest.mark.parametrize("value", [0, -1, "10s", True, float("inf")])
def test_a_bad_timeout_is_a_problem_of_the_sweep_file(tmp_path, value):
    path = write_sweep(tmp_path, {"grid": {"network.bandwidth[0]": [50]}, "timeout": value})
    # .inf is refused by the config reader itself (not a finite number), the rest by the sweep's check
    with pytest.raises(ManifestError, match=r"sweep.yaml: timeout: (expected a positive number of seconds|"
                                            r"inf is not a finite number)"):
        load_sweep(path)


# Validation before the first point -----------------------------------------------------------------
def test_every_point_is_validated_before_any_runs(tmp_path):
    path = write_sweep(tmp_path, {
        "grid": {"network.bandwidth[0]": [50, -1, -2], "compute.plugin": ["replay", "nope"]},
        "points": [{"network.topology": ["Ring"]}, {"network.topology": ["Torus"]}]})
    done = CliRunner().invoke(main, ["sweep", str(path)])
    assert done.exit_code == 2, done.output
    lines = done.output.splitlines()
    assert lines[0] == "error: invalid configuration (3 problems):"
    # Each problem once, with the points it hits; in the order of the first point hit.
    assert lines[1].startswith(f"  {path}: points 1, 3, 5, 7, 9, 11 (6 points): compute.plugin: "
                               "no compute plugin named 'nope'")
    assert lines[2] == (f"  {path}: points 2, 3, 4, 5, 8, 9, 10, 11 (8 points): network.bandwidth[0]: "
                        "Input should be greater than 0")
    assert lines[3] == (f"  {path}: points 6, 7, 8, 9, 10, 11 (6 points): network.topology[0]: "
                        "Input should be 'Ring', 'FullyConnected' or 'Switch'")
    assert not (tmp_path / "out").exists()   # nothing ran, nothing was written


def test_a_single_bad_point_is_named_with_its_values(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"network.bandwidth[0]": [50, -1, 100]}})
    with pytest.raises(ManifestError) as caught:
        run_sweep(load_sweep(path))
    assert caught.value.problems == [(f"{path}: point 1 (network.bandwidth[0]=-1): network.bandwidth[0]",
                                      "Input should be greater than 0")]


# Signals ------------------------------------------------------------------------------------------
def _start_sweep(path: Path, temp: Path, *extra: str) -> subprocess.Popen:
    temp.mkdir(exist_ok=True)
    return subprocess.Popen([*CHAKRA_SIM, "sweep", str(path), "--workers", "2", "--quiet", *extra],
                            env={**os.environ, "TMPDIR": str(temp)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_workers_removes_temp_files_and_the_sweep_resumes(tmp_path, signum, status):
    # gzip traces: each point's worker decompresses them into a temp folder as it runs.
    values = list(range(10, 410))   # enough points that a loaded machine signals the sweep before its end
    path = write_sweep(tmp_path, {"grid": {"workload.trace": [gzip_traces(tmp_path / "gz")],
                                           "network.bandwidth[0]": values}})
    out, temp = tmp_path / "out", tmp_path / "tmp"
    sweep = _start_sweep(path, temp)
    try:
        wait_until(lambda: finished_points(out) >= 5, 60, "the first points")
        workers = descendants(sweep.pid)
        # Meanwhile, a second sweep into the same folder is refused.
        second = subprocess.run([*CHAKRA_SIM, "sweep", str(path), "--quiet"], capture_output=True, text=True)
        assert second.returncode == 2
        assert f"output folder {out} is in use by another run (process {sweep.pid}: " in second.stderr
        if signum == signal.SIGINT:
            os.killpg(sweep.pid, signal.SIGINT)   # Ctrl-C: to the terminal's whole process group
        else:
            sweep.send_signal(signal.SIGTERM)
        _, stderr = sweep.communicate(timeout=30)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode == status, stderr
    assert f"interrupted by {signal.Signals(signum).name}: finished points are kept" in stderr
    assert "Traceback" not in stderr
    assert len(workers) >= 2
    wait_until(lambda: not any(running(pid) for pid in workers), 5, "every worker to stop")
    assert leftovers(out, temp) == []
    done = finished_points(out)
    assert 5 <= done < len(values)
    if signum == signal.SIGINT:
        return
    # Resumed, the sweep ends with the table an uninterrupted run writes.
    resumed = _start_sweep(path, temp)
    assert resumed.wait(timeout=120) == 0, resumed.stderr.read() if resumed.stderr else ""
    whole = _start_sweep(path, temp, "--out", str(tmp_path / "whole"))
    assert whole.wait(timeout=120) == 0
    for process in (resumed, whole):
        process.stdout.close()
        process.stderr.close()
    assert table_without_wall(out) == table_without_wall(tmp_path / "whole")
    assert leftovers(out, temp) == []


# Ray ----------------------------------------------------------------------------------------------
RAY_SCRIPT = f"import sys; sys.path.insert(0, {str(ROOT)!r})\n" + """
import json, os, sys, time
from pathlib import Path
from chakra_core.sweep.run import run_ray
from chakra_core.sweep.task import PointOutcome, PointTask, Status
from tests.sweep_processes import descendants

def listening(pids):
    # Listening TCP sockets (state 0A) of these processes: their local addresses.
    sockets = {}
    for table, family in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":
                sockets[fields[9]] = fields[1].split(":")[0]
    found = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in sockets:
                    found.add(sockets[target[8:-1]])
        except OSError:
            continue
    return sorted(found)

def point(task):
    time.sleep(task.data["sleep"])
    return PointOutcome(task.index, task.id, Status.OK, wall_s=task.data["sleep"])

outcomes, addresses = [], []
def on_outcome(outcome):
    if not addresses:   # while the instance runs
        addresses.extend(listening(descendants(os.getpid())))
    outcomes.append([outcome.index, outcome.status.value, outcome.error])

tasks = [PointTask(0, "a", {"sleep": 0.0}), PointTask(1, "b", {"sleep": 600})]
run_ray(tasks, 2, None, on_outcome, function=point, timeout=40)   # room for Ray's workers to start on a loaded machine
print(json.dumps({"outcomes": outcomes, "addresses": addresses}))
"""


def test_the_local_ray_instance_listens_on_loopback_only_and_times_points_out(tmp_path):
    pytest.importorskip("ray")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", RAY_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["outcomes"] == [[0, "ok", None], [1, "failed", "timed out after 40 s"]]
    # /proc/net/tcp writes addresses in hex, in the host's byte order: 0100007F is 127.0.0.1
    # (and 0000000000000000FFFF00000100007F the same as an IPv6-mapped address).
    assert report["addresses"], "no listening socket found: the check would prove nothing"
    assert set(report["addresses"]) <= {"0100007F", "0000000000000000FFFF00000100007F"}, report["addresses"]
