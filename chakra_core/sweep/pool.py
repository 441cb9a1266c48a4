"""The local executor: a pool of worker processes, one point at a time each.

Not concurrent.futures' pool, because a sweep needs to know which process runs which
point: to stop a point that outlives its timeout (kill that worker, start another),
and to blame a dead worker's point alone. Each worker:

- is a fresh (spawned) Python process that loads the plugins before it says it is
  ready, so a point's timeout does not count the start-up;
- leads its own process group, so killing the group also kills any process a point
  started (the folding pass's own pool), and a Ctrl-C on the terminal reaches only
  the sweep's process, which stops the workers itself;
- is killed by the kernel if the sweep's process dies (Linux), so even kill -9 of the
  sweep leaves no worker running;
- writes its temporary files (a gzip trace's decompressed copy ...) in a folder of the
  pool's, removed with the pool: a killed worker cannot clean up after itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Callable

from chakra_core.errors import ChakraSimError
from chakra_core.sweep.stop import held
from chakra_core.sweep.task import PointOutcome, PointTask

TEMP_PREFIX = "chakra-sim-sweep-"
_PR_SET_PDEATHSIG = 1
_START_FAILURES = 3
"""Workers that may die before ever being ready before the pool gives up."""


class PoolError(ChakraSimError):
    """The worker processes cannot start."""


def describe_exception(exc: BaseException) -> str:
    """'SystemExit: 3', 'KeyboardInterrupt', 'ValueError: bad value': one line for a table."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


# The worker's side -------------------------------------------------------------------------------
def _serve(conn: Connection, function: Callable[[PointTask], PointOutcome], warm: Callable[[], object] | None,
           temp_dir: str) -> None:
    """A worker's life: get ready, then run tasks until told to stop (None) or the pipe closes."""
    with contextlib.suppress(OSError):
        os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    os.environ["TMPDIR"] = temp_dir   # for processes a point starts
    tempfile.tempdir = temp_dir
    if warm is not None:
        warm()
    conn.send(("ready", None))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        started = time.perf_counter()
        try:
            outcome = function(task)
        except BaseException as exc:   # SystemExit and KeyboardInterrupt too: the point fails, not the pool
            outcome = PointOutcome.failed(task, describe_exception(exc), traceback.format_exc(),
                                          time.perf_counter() - started)
        try:
            conn.send(("done", outcome))
        except Exception as exc:   # an outcome that cannot be pickled
            failure = PointOutcome.failed(task, f"cannot send the point's outcome: {describe_exception(exc)}")
            conn.send(("done", failure))


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:   # the parent died before prctl
            os._exit(1)


# The pool's side ---------------------------------------------------------------------------------
@dataclass
class _Worker:
    process: BaseProcess
    conn: Connection
    ready: bool = False
    task: PointTask | None = None
    started: float = 0.0


def _unguarded_script() -> str:
    """What to say of the parent's script when workers die as they start: each worker is spawned
    and imports it again, running its top-level code, so a script that starts a sweep or a plan
    outside `if __name__ == "__main__":` starts it again in every worker, which fails ("" when the
    parent is no such script: an interactive session, `python -m`, or a script that names
    `__name__` anywhere, taken for guarded: the hint is only said where it cannot mislead)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or getattr(main, "__spec__", None) is not None:
        return ""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if "__name__" in Path(path).read_text(encoding="utf-8"):
            return ""
    return (f"; each worker imports {path} again: a script that starts a sweep or a plan must start it "
            'under `if __name__ == "__main__":`')


def _exit_text(process: BaseProcess) -> str:
    code = process.exitcode
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


Refill = Callable[[], list[PointTask] | None]
"""More tasks for a pool with none waiting: a list (empty: none yet, asked again once a point
ends), or None: no more."""


def run_pool(tasks: list[PointTask], workers: int, on_outcome: Callable[[PointOutcome], None],
             function: Callable[[PointTask], PointOutcome], timeout: float | None = None,
             warm: Callable[[], object] | None = None, refill: Refill | None = None) -> None:
    """Run `function` on each task in `workers` processes; call `on_outcome` as each ends, and
    `refill` (when given) whenever no task waits for a worker: the same workers run what it adds.

    A point running longer than `timeout` seconds is killed with its worker (and whatever it
    started) and fails with "timed out after N s"; a worker that dies fails its point alone;
    both workers are replaced. An exception here (Interrupted by SIGINT or SIGTERM ...) kills
    every worker and removes their temporary files before it propagates.
    """
    pool = _Pool(function, warm, timeout, workers)
    try:
        pool.add(tasks)
        while True:
            if refill is not None and not pool.pending:
                more = refill()
                if more is None:
                    refill = None
                else:
                    pool.add(more)
            if not pool.busy():
                break
            pool.feed()
            pool.wait()
            ended = pool.collect(time.monotonic())
            pool.feed()   # before recording: writing a point's files takes this process milliseconds
            for outcome in sorted(ended, key=lambda o: o.index):
                with held():   # a point's files are written whole or not at all
                    on_outcome(outcome)
    finally:
        pool.close()


class _Pool:
    """The worker processes of one run_pool call and the tasks not yet sent to them."""

    def __init__(self, function: Callable[[PointTask], PointOutcome], warm: Callable[[], object] | None,
                 timeout: float | None, workers: int) -> None:
        self.pending: deque[PointTask] = deque()
        self.function, self.warm, self.timeout, self.most = function, warm, timeout, workers
        self.context = multiprocessing.get_context("spawn")   # fork would copy the progress bar's thread and locks
        remove_abandoned_temp_dirs()
        self.temp_dir = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}pid{os.getpid()}-")
        self.workers: list[_Worker] = []
        self.start_failures = 0

    def start(self) -> None:
        with held():   # a worker started but not in `workers` would outlive an interrupt
            ours, theirs = self.context.Pipe()
            process = self.context.Process(target=_serve, args=(theirs, self.function, self.warm, self.temp_dir),
                                           daemon=True, name="chakra-sim sweep worker")
            process.start()
            self.workers.append(_Worker(process, ours))
            theirs.close()   # else the pipe never reports the worker's death

    def add(self, tasks: list[PointTask]) -> None:
        """Queue tasks, with as many workers as can run them (at most the pool's number)."""
        self.pending.extend(tasks)
        running = sum(w.task is not None for w in self.workers)
        while len(self.workers) < min(self.most, running + len(self.pending)):
            self.start()

    def retire(self, worker: _Worker) -> None:
        with held():
            _kill(worker)
            self.workers.remove(worker)

    def busy(self) -> bool:
        return bool(self.workers) and (bool(self.pending) or any(w.task is not None for w in self.workers))

    def feed(self) -> None:
        """Send the next tasks to the ready, idle workers."""
        for worker in self.workers:
            if worker.ready and worker.task is None and self.pending:
                worker.task, worker.started = self.pending.popleft(), time.monotonic()
                try:
                    worker.conn.send(worker.task)
                except OSError:
                    pass   # it died: its sentinel says so in collect

    def wait(self) -> None:
        """Until a worker says something or dies, or the first running point's timeout."""
        deadlines = [w.started + self.timeout for w in self.workers if w.task is not None and self.timeout is not None]
        wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        wait([*(w.conn for w in self.workers), *(w.process.sentinel for w in self.workers)], wait_s)

    def collect(self, now: float) -> list[PointOutcome]:
        """The points that ended: answered, lost with their worker, or past their timeout."""
        ended = []
        for worker in list(self.workers):
            outcome = self._check(worker, now)
            if outcome is not None:
                ended.append(outcome)
        return ended

    def _check(self, worker: _Worker, now: float) -> PointOutcome | None:
        message: tuple[str, PointOutcome | None] | None = None
        if worker.conn.poll():
            try:
                message = worker.conn.recv()
            except (EOFError, OSError):
                message = None
        if message is not None:
            kind, outcome = message
            if kind == "ready":
                worker.ready = True
                return None
            worker.task = None
            return outcome
        if not worker.process.is_alive() or worker.conn.closed:
            return self._lost(worker, now)
        if worker.task is not None and self.timeout is not None and now - worker.started >= self.timeout:
            task = worker.task
            self.retire(worker)
            self._replace()
            return PointOutcome.timed_out(task, self.timeout, now - worker.started)
        return None

    def _lost(self, worker: _Worker, now: float) -> PointOutcome | None:
        """A worker that died: its point fails; one that dies before it is ready, three times, stops the pool."""
        task, was_ready = worker.task, worker.ready
        worker.process.join()
        how = _exit_text(worker.process)
        self.retire(worker)
        outcome = None
        if task is not None:
            outcome = PointOutcome.failed(task, f"a worker process died ({how}) while running this point: "
                                                "killed, out of memory, or a crash in native code; run the "
                                                "sweep again to retry it", wall_s=now - worker.started)
        elif not was_ready:
            self.start_failures += 1
            if self.start_failures >= _START_FAILURES:
                raise PoolError(f"the sweep's worker processes die as they start ({how}); "
                                f"run one point with `chakra-sim run` to see why{_unguarded_script()}")
        self._replace()
        return outcome

    def _replace(self) -> None:
        if self.pending:
            self.start()

    def close(self) -> None:
        """Stop every worker (idle ones exit by themselves) and remove their temporary files."""
        with held():
            for worker in self.workers:
                with contextlib.suppress(OSError):
                    worker.conn.send(None)
            for worker in self.workers:
                _kill(worker, grace_s=0.5 if worker.task is None else 0.0)
            self.workers.clear()
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def remove_abandoned_temp_dirs() -> None:
    """Remove the temporary folders of sweeps that were killed (kill -9 leaves them): those whose
    name carries a process id that no longer runs. A live process with a reused id keeps its
    folder; folders named before the id was in the name are left alone (their owner is unknown)."""
    pattern = re.compile(re.escape(TEMP_PREFIX) + r"pid(\d+)-")
    with contextlib.suppress(OSError), os.scandir(tempfile.gettempdir()) as entries:
        for entry in entries:
            match = pattern.match(entry.name)
            if match is None or not entry.is_dir(follow_symlinks=False) or _alive(int(match.group(1))):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's process
        return True
    return True


def _kill(worker: _Worker, grace_s: float = 0.0) -> None:
    """Stop a worker and every process in its group (what its point started)."""
    process = worker.process
    if grace_s:
        process.join(grace_s)
    if process.pid is not None:
        # The group is the worker's own (it called setpgrp): its id is the worker's pid, which
        # no other process can hold until the worker is reaped below.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(OSError, ValueError):
        process.kill()
    process.join()
    worker.conn.close()
