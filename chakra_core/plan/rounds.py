"""The plan's simulations: rounds of layouts chosen by their bound, run as one sweep that grows.

Round k is the next `batch` layouts, lowest bound first, whose bound is below the step a layout
must beat to enter the top K: the K-th best step of rounds 1 .. k - 1 (`search` step 4). Its
layouts can be known before those rounds end: the K-th best step they can give is at least the
K-th smallest of the steps already simulated and the bounds of the layouts still running (a
layout's step is never below its bound; one that fails gives none). A layout whose bound is below
that is in round k whatever the running ones give, so it starts at once, on a worker that would
otherwise wait for a round's slowest layout; the rest of the round is chosen when rounds 1 .. k - 1
have ended. Every round is one sweep that grows (`chakra_core.sweep.run_sweep`'s `grow`), run by
one pool of workers. The layouts simulated, and in which round, are exactly those of rounds each
chosen after the one before ended: they depend on `batch`, never on the executor, the number of
workers or which layout finished first.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from chakra_core.json_types import JsonObject
from chakra_core.plan.ranking import kth_best, kth_smallest, standing
from chakra_core.plan.status import FAILED, SIMULATED
from chakra_core.report.document import Results
from chakra_core.sweep.run import WAIT, Execution, PointReport, Wait, run_sweep
from chakra_core.sweep.spec import Sweep, build_sweep
from chakra_core.sweep.task import Status

if TYPE_CHECKING:
    from chakra_core.plan.search import Candidate, Plan

METRIC = "training.step_time_s"


class Queue(Protocol):
    def pop(self, limit: float) -> Candidate | None: ...

    def exhausted(self) -> bool: ...


class Rounds:
    """Chooses the rounds and records what their layouts' runs found (see the module docstring)."""

    def __init__(self, given: list[Candidate], queue: Queue, top: int, batch: int, plan: Plan,
                 say: Callable[[str], None]):
        self.given, self.queue, self.top, self.batch, self.plan, self.say = given, queue, top, batch, plan, say
        self.rounds: list[list[Candidate]] = []
        self.closed = True                     # the last round has all its layouts
        self.handed = 0                        # the last round's layouts handed out
        self.chosen: list[Candidate] = []
        self.finished: set[int] = set()        # ids of the candidates whose run ended
        self.started: list[float] = []         # each round's start (monotonic), for its pace

    def choose(self) -> list[Candidate] | Wait | None:
        """Layouts to simulate now: the next round's first ones, or the rest of the open round;
        WAIT while which is not known until a running layout ends; None: no layout left can
        enter the top K."""
        if self.closed:
            self.rounds.append(list(self.given) if not self.rounds else [])   # the given layouts first
            self.closed, self.handed = False, 0
            self.started.append(time.monotonic())
        round_ = self.rounds[-1]
        before = [c for earlier in self.rounds[:-1] for c in earlier]
        known = all(id(c) in self.finished for c in before)
        kth = kth_best(before, self.top) if known else kth_smallest(   # else the least it can be
            [c.step_s for c in before if c.step_s is not None] + [c.bound_s for c in before if id(c) not in self.finished],
            self.top)
        while len(round_) < self.batch:
            following = self.queue.pop(kth)
            if following is None:
                break
            round_.append(following)
        if len(round_) == self.batch or known or self.queue.exhausted():
            self.closed = True
            if not round_:   # no layout left can enter the top K
                self.rounds.pop()
                self.plan.rounds = len(self.rounds)
                return None
            self.say(f"round {len(self.rounds)}: simulating {len(round_)} layout(s), "
                     f"{len(self.chosen) - self.handed + len(round_):,} in all so far; "
                     + ("no layout is known yet" if kth == math.inf else
                        f"a layout needs a step under {kth:.3f} s to enter the {self.top} fastest" if known else
                        f"chosen as the rounds before it end: a layout with a bound under {kth:.3f} s is in"))
            if all(id(c) in self.finished for c in round_):   # its layouts ended before it closed
                self.say(standing([c for c in self.chosen if id(c) in self.finished], self.top))
        new, self.handed = round_[self.handed:], len(round_)
        self.chosen.extend(new)
        self.plan.rounds = len(self.rounds)
        return new if new or self.closed else WAIT

    def ended(self, candidate: Candidate, report: PointReport, folder: Path, memory_checked: bool) -> None:
        """Record a layout's run (its results read from its point's folder) and say it."""
        candidate.point = str(folder)
        if report.status is Status.OK:
            results = Results.from_json(json.loads((folder / "results.json").read_text(encoding="utf-8")))
            candidate.status, candidate.training = SIMULATED, results.training
            if memory_checked:   # a memory layer that follows tensors (MemoryModel.peak_memory_bytes)
                candidate.simulated_memory = results.peak_memory_bytes
        else:
            candidate.status, candidate.error = FAILED, str(report.error)
        self.finished.add(id(candidate))
        number = next(i for i, round_ in enumerate(self.rounds) if any(c is candidate for c in round_))
        round_ = self.rounds[number]
        done = sum(id(c) in self.finished for c in round_)
        what = ("read back from an earlier plan" if report.skipped else
                f"{report.wall_s or 0.0:.1f} s" if report.status is Status.OK else f"failed: {report.error}")
        left = (time.monotonic() - self.started[number]) / done * (len(round_) - done)   # the round's pace so far
        eta = f"; about {left:.0f} s left in round {number + 1}" if done < len(round_) else ""
        whole = self.closed or number < len(self.rounds) - 1   # the round has all its layouts
        self.say(f"  {done} of {len(round_)}{'' if whole else ' so far'} (round {number + 1}): "
                 f"{candidate.layout.label()}: {what}{eta}")
        if done == len(round_) and whole:
            self.say(standing([c for c in self.chosen if id(c) in self.finished], self.top))


def simulate_rounds(manifest: Mapping[str, Any], base_dir: Path, out_dir: Path, rounds: Rounds, plan: Plan,
                    execution: Execution) -> None:
    """Every round, as one sweep of the job manifest with each chosen layout's keys set, its runs
    in `out_dir` (resumable: a layout an earlier plan simulated is read back)."""
    first = rounds.choose()
    if not isinstance(first, list):
        return

    def sweep_of(chosen: list[Candidate]) -> Sweep:
        data: JsonObject = {"base": dict(manifest), "points": [c.layout.overrides() for c in chosen],
                            "metric": METRIC, "output": {"dir": str(out_dir)}, "job_traces": execution.job_traces}
        return build_sweep(data, base_dir, "plan", name="plan")

    current = sweep_of(rounds.chosen)

    def grow() -> Sweep | Wait | None:
        nonlocal current
        following = rounds.choose()
        if not isinstance(following, list):
            return following
        current = sweep_of(rounds.chosen)
        return current

    def report(point: PointReport) -> None:
        candidate = rounds.chosen[point.point.index]
        rounds.ended(candidate, point, current.point_dir(point.point), plan.memory_checked)
        if execution.on_point is not None:
            execution.on_point(point)

    outcome = run_sweep(current, execution.executor, execution.workers, execution.address, execution.force,
                        on_point=report, timeout=execution.timeout, grow=grow)
    plan.simulated += outcome.ran
    plan.warnings.extend(w for w in outcome.warnings if w not in plan.warnings)
