"""The hbm model's bytes-in-use series carried forward by whole periods (time_fold.SeriesLog):
the series of the run simulated, rebuilt, equals that of the whole run, however it coarsened.
(The model's state and statistics in whole runs: tests/test_time_folding.py.)"""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from chakra_sim_memory_hbm.tensors import MemorySeries, RankTensors
from chakra_sim_memory_hbm.time_fold import SeriesLog

changes = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 1000)), max_size=12)


def _timed(steps: list[tuple[int, int]], start: int) -> list[tuple[int, int]]:
    """Changes at increasing times from `start` (each step: the gap since the previous, the value)."""
    out, time = [], start
    for gap, value in steps:
        time += gap
        out.append((time, value))
    return out


@settings(max_examples=150, deadline=None)
@given(before=changes, period=changes, after=changes, periods=st.integers(0, 5), points=st.integers(4, 24),
       logged_from=st.integers(0, 3))
def test_a_rebuilt_series_is_the_whole_runs(before, period, after, periods, points, logged_from):
    t1 = 1000
    head = _timed(before, 0)
    t1 = max([t1, *(t for t, _ in head)])
    cycle = _timed(period, t1 + 1)
    t2 = max([t1 + 1, *(t for t, _ in cycle)])
    span = t2 - t1
    tail = _timed(after, t2 + 1)
    whole = MemorySeries(points)
    for time, value in head + [(t + k * span, v) for k in range(periods + 1) for t, v in cycle] + \
            [(t + periods * span, v) for t, v in tail]:
        whole.change(time, value)
    # the run simulated: logging began at the first snapshot (within the head), then t1, t2
    tensors = RankTensors(0, points)
    log = SeriesLog()
    start = min(logged_from, len(head))
    for time, value in head[:start]:
        tensors.series.change(time, value)
    log.start(tensors)
    for time, value in head[start:]:
        tensors.series.change(time, value)
    first = len(tensors.series.log or ())
    for time, value in cycle:
        tensors.series.change(time, value)
    second = len(tensors.series.log or ())
    for time, value in tail:
        tensors.series.change(time, value)
    log.rebuild(tensors, periods, span, first, second)
    assert tensors.series.export() == whole.export()
    assert (tensors.series.width, tensors.series.level) == (whole.width, whole.level)
