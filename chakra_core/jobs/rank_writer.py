"""Writing a job's rank files, in forked worker processes when more than one may run.

A rank's program is built and written without looking at any other rank's, and its file holds
the same bytes whichever process writes it, so `write_ranks` shares the ranks out over worker
processes forked from this one (the job, its placement and `on_program` are already in their
memory: nothing is pickled but rank numbers, `on_program`'s answers and the indexes below).
Generating a job's traces takes a quarter to a third of a run of it, indexing them an eighth
(docs/performance.md): with `index_files`, a worker indexes each file it wrote as the run will
(TraceIndex), and the run takes what it found (feeder/written.py). A job writes them so for a
folded run, whose files are its classes' representatives, each a program of its own and each
opened: every index made is used, and none waits longer than the files take to open (an unfolded
run's data-parallel replicas have the same bytes, one index serves them all, and so many made
apart would only fill memory). The event loop that follows runs in one process, so
the workers are gone before it starts.

Forked only on Linux, from a process that may have children (not a pool's daemon worker, such as
`chakra-sim sweep`'s and `plan`'s, which already use the cores); elsewhere, or with one worker
or one rank, the ranks are written here. A rank whose worker raised is written again here, so
that its error is raised as it is without workers (not every exception survives pickling); if a
worker dies (the out-of-memory killer), the ranks not yet in hand are written here too."""

from __future__ import annotations

import multiprocessing
import signal
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from chakra_core.cores import usable_cores
from chakra_core.et.io import write_trace
from chakra_core.feeder.streaming import IndexArrays, TraceIndex
from chakra_core.jobs.fsdp import rank_program
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.spec import JobSpec
from chakra_core.schema import pb

GenerationProgress = Callable[[int, int], None]
"""Told (ranks written, ranks) after each rank's trace is written."""


@dataclass(frozen=True)
class RankFilesTask:
    """What writing one rank's file needs: the job, where each rank's file goes (`paths`), and
    what to say of each rank's program once written (`on_program`, its answer kept per rank)."""

    job: JobSpec
    placement: Placement
    meta: pb.GlobalMetadata
    paths: dict[int, Path]
    compress: bool = False
    on_program: Callable[[int, RankProgram], Any] | None = None
    index_files: bool = False
    """Whether a worker also indexes each file it wrote, for the run (feeder/written.py)."""

    def write(self, rank: int) -> Any:
        program = rank_program(self.job, self.placement, rank)
        write_trace(self.paths[rank], self.meta, program.build(), compress=self.compress)
        return None if self.on_program is None else self.on_program(rank, program)

    def index(self, rank: int) -> IndexArrays | None:
        """What indexing the rank's file as a training job's run does finds (None when that
        fails or warns: the run indexes it again and says why, naming the file where it is then)."""
        if self.compress or not self.index_files:
            return None
        try:
            index = TraceIndex(self.paths[rank], 1)   # the options a job's run indexes with: the defaults
        except Exception:
            return None
        try:
            return None if index.warnings else index.found()
        finally:
            index.close()


_TASK: RankFilesTask | None = None
"""The task of the pool being forked (set in the parent just before, read by the workers)."""


def _worker_signals() -> None:
    """A worker leaves Ctrl-C to the parent, which stops the pool, and dies of a SIGTERM whatever
    handler it inherited (Ray's and a sweep's do not end a process). It writes nothing to stdout
    or stderr, whose locks a thread of the parent (a progress bar's) may have held as it forked:
    its errors go back to the parent, and warnings are not shown (the generator gives none)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    warnings.simplefilter("ignore")


def _in_worker(rank: int) -> tuple[bool, Any, IndexArrays | None]:
    assert _TASK is not None, "a rank writer's worker runs in a process forked by write_ranks"
    try:
        answer = _TASK.write(rank)
    except Exception:   # written again in the parent, which raises it as it is
        return False, None, None
    return True, answer, _TASK.index(rank)


DEFAULT_MOST_WORKERS = 8
"""At most this many workers unless asked: each holds one rank's program in memory while it writes
it (1.9 GB for a rank of Llama 3.1 405B's unfolded step of 768 micro-batches on 256 H100), where
one process held one at a time."""


def default_workers() -> int:
    """The cores this process may run on, at most DEFAULT_MOST_WORKERS."""
    return min(usable_cores(), DEFAULT_MOST_WORKERS)


def can_fork_workers() -> bool:
    return sys.platform.startswith("linux") and not multiprocessing.current_process().daemon


def write_ranks(task: RankFilesTask, ranks: Sequence[int], workers: int = 1,
                progress: GenerationProgress | None = None) -> tuple[dict[int, Any], dict[int, IndexArrays]]:
    """Write every rank's file (`workers` processes at most): `on_program`'s answer per rank, and
    what indexing each file found where a worker indexed it (feeder/written.py)."""
    answers: dict[int, Any] = {}
    found: dict[int, IndexArrays] = {}
    workers = min(workers, len(ranks))
    if workers < 2 or not can_fork_workers():
        for done, rank in enumerate(ranks, start=1):
            answers[rank] = task.write(rank)
            if progress is not None:
                progress(done, len(ranks))
        return answers, found
    global _TASK
    _TASK = task
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=_worker_signals)
    done = 0
    try:
        try:
            for rank, (wrote, answer, index) in zip(ranks, pool.map(_in_worker, ranks)):
                answers[rank] = answer if wrote else task.write(rank)
                if index is not None:
                    found[rank] = index
                done += 1
                if progress is not None:
                    progress(done, len(ranks))
        except BrokenProcessPool:   # a worker died (out of memory, killed): the ranks left, here
            for rank in ranks[done:]:
                answers[rank] = task.write(rank)
                done += 1
                if progress is not None:
                    progress(done, len(ranks))
    finally:   # the ranks in hand finish; none is started (Ctrl-C, an error: in the parent)
        pool.shutdown(wait=True, cancel_futures=True)
        _TASK = None
    return answers, found
