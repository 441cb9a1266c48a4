"""The plan's rounds (chakra_core.plan.rounds): a round's first layouts start while earlier rounds
still run, yet the layouts simulated, round by round, are those of rounds each chosen after the
one before ended, whatever the number of workers and the order the layouts end in."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from chakra_core.plan.rounds import Rounds
from chakra_core.sweep.run import WAIT


@dataclass(order=True)
class _Layout:
    number: int

    def label(self) -> str:
        return f"L{self.number}"


@dataclass
class _Candidate:
    layout: _Layout
    bound_s: float
    result: float | None            # its step once simulated (None: its run fails)
    step_s: float | None = None
    memory: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(total=0))


class _Queue:
    """Layouts by bound, as search._Queue hands them out."""

    def __init__(self, candidates: list[_Candidate]):
        self.left = sorted(candidates, key=lambda c: (c.bound_s, c.layout))

    def pop(self, limit: float) -> _Candidate | None:
        return self.left.pop(0) if self.left and self.left[0].bound_s < limit else None

    def exhausted(self) -> bool:
        return not self.left


def _candidates(draws: list[tuple[float, float, bool]]) -> list[_Candidate]:
    return [_Candidate(_Layout(i), bound, None if fails else bound * (1 + extra))
            for i, (bound, extra, fails) in enumerate(draws)]


def _end(rounds: Rounds, candidate: _Candidate) -> None:
    candidate.step_s = candidate.result
    rounds.finished.add(id(candidate))


def _rounds(candidates: list[_Candidate], top: int, batch: int) -> Rounds:
    return Rounds([], _Queue(candidates), top, batch, SimpleNamespace(rounds=0), lambda line: None)


def _one_round_after_another(candidates: list[_Candidate], top: int, batch: int) -> list[list[int]]:
    rounds = _rounds(candidates, top, batch)
    while (chosen := rounds.choose()) is not None:
        assert chosen is not WAIT   # every earlier layout has ended: the round is known
        for candidate in chosen:
            _end(rounds, candidate)
    return [[c.layout.number for c in round_] for round_ in rounds.rounds]


def _with_workers(candidates: list[_Candidate], top: int, batch: int, workers: int, order: st.DataObject) -> list[list[int]]:
    """As the sweep's pool runs them: more layouts asked for whenever none waits for a worker, one
    running layout (drawn) ends at a time."""
    rounds = _rounds(candidates, top, batch)
    pending: deque[_Candidate] = deque()
    running: list[_Candidate] = []
    asking = True
    while True:
        while asking and not pending:
            chosen = rounds.choose()
            if chosen is None:
                asking = False
            elif chosen is WAIT:
                assert running, "waiting with nothing running: no layout would ever end"
                break
            else:
                pending.extend(chosen)
        while pending and len(running) < workers:
            running.append(pending.popleft())
        if not running:
            break
        _end(rounds, running.pop(order.draw(st.integers(0, len(running) - 1))))
    assert not asking and not pending
    return [[c.layout.number for c in round_] for round_ in rounds.rounds]


layouts = st.lists(st.tuples(st.floats(1.0, 2.0), st.floats(0.0, 0.5), st.booleans()), max_size=24)


@settings(max_examples=200, deadline=None)
@given(draws=layouts, top=st.integers(1, 5), batch=st.integers(1, 5), workers=st.integers(1, 4), order=st.data())
def test_the_layouts_simulated_do_not_depend_on_workers_or_the_order_runs_end(draws, top, batch, workers, order):
    reference = _one_round_after_another(_candidates(draws), top, batch)
    assert _with_workers(_candidates(draws), top, batch, workers, order) == reference


@settings(max_examples=100, deadline=None)
@given(draws=layouts, top=st.integers(1, 5), batch=st.integers(1, 5))
def test_no_layout_left_out_can_enter_the_top(draws, top, batch):
    candidates = _candidates(draws)
    chosen = {n for round_ in _one_round_after_another(candidates, top, batch) for n in round_}
    steps = sorted(c.result for c in candidates if c.layout.number in chosen and c.result is not None)
    kth = steps[top - 1] if len(steps) >= top else float("inf")
    assert all(c.bound_s >= kth for c in candidates if c.layout.number not in chosen)


def test_a_round_starts_before_the_one_before_it_ends():
    """Rounds of two for the 3 fastest: the second round is known while the first runs (two steps
    cannot end the top 3), the third waits for them and is empty (no bound under the 3rd best)."""
    candidates = _candidates([(1.0, 0.1, False), (1.0, 0.1, False), (1.01, 0.1, False), (1.02, 0.1, False),
                              (3.0, 0.0, False)])
    rounds = _rounds(candidates, top=3, batch=2)
    assert rounds.choose() == candidates[:2]
    assert rounds.choose() == candidates[2:4]   # chosen before any layout has ended
    _end(rounds, candidates[0])
    assert rounds.choose() is WAIT               # the 3rd best may still be as low as 1.01
    for candidate in candidates[1:4]:
        _end(rounds, candidate)
    assert rounds.choose() is None               # the 3rd best is 1.111: the 3.0 layout cannot enter
    assert [len(round_) for round_ in rounds.rounds] == [2, 2]
