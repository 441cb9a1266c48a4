"""A job's rank files written in worker processes (chakra_core.jobs.rank_writer): the same bytes
and the same answers as written here, and a rank's error raised as it is without workers."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from pathlib import Path

import pytest

from chakra_core import run
from chakra_core.feeder import written
from chakra_core.feeder.library import TraceLibrary
from chakra_core.feeder.streaming import TraceIndex
from chakra_core.jobs.expand import write_job
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.spec import JobSpec
from tests.test_jobs import job

JOB_RUN_OPTIONS = (TraceLibrary().missing_parents, TraceLibrary().dependencies)
"""The index options a job's run opens its traces with (TraceLibrary's defaults)."""

forks = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")


class RankRefused(Exception):
    """An error whose constructor takes what pickling does not give back (it would not cross
    from a worker as it is)."""

    def __init__(self, rank: int, why: str):
        super().__init__(f"rank {rank}: {why}")
        self.rank = rank


def _spec() -> JobSpec:
    return JobSpec.model_validate(job(parallel={"tp": 2, "pp": 4, "vp": 2, "cp": 1},
                                      cluster={"gpus": 16, "profile": "h100-hgx-ndr400"}))


def _files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


@forks
def test_workers_write_the_same_bytes_and_answers(tmp_path: Path) -> None:
    spec = _spec()
    placement = Placement(spec, 8)
    said: dict[int, dict[int, tuple[int, int]]] = {1: {}, 3: {}}
    for workers in (1, 3):
        write_job(spec, placement, tmp_path / str(workers) / "t", answers=said[workers], workers=workers,
                  on_program=lambda rank, program: (rank, len(program.stream.nodes)))
    assert _files(tmp_path / "1") == _files(tmp_path / "3")
    assert said[1] == said[3] and sorted(said[3]) == list(range(16))
    assert all(count > 0 for _, count in said[3].values())


@forks
def test_a_ranks_error_in_a_worker_is_raised_as_it_is(tmp_path: Path) -> None:
    spec = _spec()

    def refuse(rank: int, program: RankProgram) -> None:
        if rank == 5:
            raise RankRefused(rank, "no")

    with pytest.raises(RankRefused, match="rank 5: no"):
        write_job(spec, Placement(spec, 8), tmp_path / "t", on_program=refuse, workers=2)
    assert not list(tmp_path.glob("t.*.et"))   # nothing half-written in place


@forks
def test_the_workers_stop_whatever_sigterm_handler_the_parent_has(tmp_path: Path) -> None:
    """Ray's and a sweep's SIGTERM handlers do not end a process: forked workers that kept one
    would never leave when the pool stops them after an error (the run would hang)."""
    spec = _spec()

    def refuse(rank: int, program: RankProgram) -> None:
        if rank == 3:
            raise RankRefused(rank, "no")

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    signal.alarm(120)   # a hang fails the test instead of the suite
    try:
        with pytest.raises(RankRefused):
            write_job(spec, Placement(spec, 8), tmp_path / "t", on_program=refuse, workers=2)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGTERM, previous)
    assert multiprocessing.active_children() == []


def _dies_in_a_worker(rank: int, program: RankProgram) -> int:
    if rank == 5 and multiprocessing.current_process().name != "MainProcess":
        os._exit(9)   # as the kernel's out-of-memory killer would end it
    return rank


@forks
def test_a_worker_that_dies_leaves_its_ranks_to_the_parent(tmp_path: Path) -> None:
    spec = _spec()
    placement = Placement(spec, 8)
    said: dict[int, dict[int, int]] = {1: {}, 2: {}}
    for workers in (1, 2):
        write_job(spec, placement, tmp_path / str(workers) / "t", on_program=_dies_in_a_worker, answers=said[workers],
                  workers=workers)
    assert _files(tmp_path / "1") == _files(tmp_path / "2") and said[1] == said[2]


@forks
def test_a_time_folded_job_gives_the_same_results_with_workers(tmp_path: Path) -> None:
    manifest = {"job": job(parallel={"tp": 2, "pp": 4, "vp": 1, "cp": 1}, training={"seq": 2048, "global_batch": 64},
                           cluster={"gpus": 16, "profile": "h100-hgx-ndr400"}),
                "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
    results = {}
    for workers in (1, 2):
        out = tmp_path / str(workers)
        document = run.simulate(run.load(manifest, base_dir=tmp_path, out_dir=out, workers=workers)).document
        results[workers] = (document["ranks"], document["training"], document["folding"])
        assert (out / "traces" / "time-folded" / "t.periods.json").exists()
    assert results[1] == results[2] and results[1][2]["time"]["folded"]
    assert _files(tmp_path / "1" / "traces" / "time-folded") == _files(tmp_path / "2" / "traces" / "time-folded")


@forks
def test_the_workers_indexes_are_what_indexing_the_files_finds_and_taken_once(tmp_path: Path) -> None:
    spec = _spec()
    placement = Placement(spec, 8)
    paths = write_job(spec, placement, tmp_path / "t", placement.representatives, workers=2, index_files=True)
    assert len(paths) == 4   # one per stage
    for path in paths[:-1]:
        found = written.take(path, JOB_RUN_OPTIONS)
        assert found is not None and found == TraceIndex(path).found()
        assert written.take(path, JOB_RUN_OPTIONS) is None   # once
    with paths[-1].open("ab") as handle:   # a file changed since it was indexed is indexed again
        handle.write(b"\x00")
    assert written.take(paths[-1], JOB_RUN_OPTIONS) is None
    written.forget_all()


@forks
def test_a_run_opens_the_workers_indexes_only_for_its_own_options(tmp_path: Path) -> None:
    spec = _spec()
    placement = Placement(spec, 8)
    paths = write_job(spec, placement, tmp_path / "t", placement.representatives, workers=2, index_files=True)
    other = TraceLibrary(dependencies="data")
    other.open(paths[0])   # other options: indexed again, the worker's index stays for the run
    assert written.take(paths[0], JOB_RUN_OPTIONS) is not None
    library = TraceLibrary()
    feeder = library.open(paths[1])
    assert written.take(paths[1], JOB_RUN_OPTIONS) is None and feeder.num_nodes > 0
    written.forget_all()


@forks
def test_a_job_runs_files_are_indexed_by_the_workers_only_when_folded(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """An unfolded run's files (every rank's): replicas of the same bytes share one index in the
    run, so none is made apart for each."""
    indexed: list[Path] = []
    remember = written.remember
    monkeypatch.setattr(written, "remember", lambda path, *rest: (indexed.append(Path(path)), remember(path, *rest)))
    data = job(parallel={"tp": 2, "pp": 4, "vp": 2, "cp": 1}, cluster={"gpus": 16, "profile": "h100-hgx-ndr400"})
    for fold, files in (("auto", 4), ("off", 0)):
        manifest = {"job": data, "workload": {"fold": fold, "fold_time": "off"}, "compute": {"plugin": "achievable"},
                    "system": {"plugin": "nccl"}}
        run.load(manifest, base_dir=tmp_path, out_dir=tmp_path / fold, workers=2)
        assert len(indexed) == files, fold   # one per stage folded
        indexed.clear()
        written.forget_all()
