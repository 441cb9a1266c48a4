"""Time folding: a run of fewer repetitions of a periodic trace, and how many it leaves out.

A training step repeats: once a pipeline is full, every micro-batch (every `pp` micro-batches
with interleaving) runs the nodes of the one before, with the same durations and the same
contention. A generated job then writes the traces of a step with `periods` fewer repetitions
(`microbatches_simulated` instead of `microbatches`) and says, per simulated rank, where its
trace repeats: the nodes [first, end) are whole periods of `nodes` nodes each, node n + nodes
doing what node n does (names and micro-batch numbers aside), and so do the nodes from `end` up to
`reach` (found node for node: the generator compares each with the one a period before it), which
a step with more periods holds unchanged.

The engine (chakra_core.engine.time_folding) watches the run for an instant t2 at which the
whole simulation is where it was at an earlier instant t1, one period on: every rank's
unfinished, ready and in-flight nodes (with their start times) and every pending event shifted
by `nodes` ids and by t2 - t1 ns. From t2 on, the run then repeats what followed t1, so a step
with one more period takes t2 - t1 ns longer and adds to every counter what [t1, t2) added; by
induction, `periods` more add `periods` times as much. The result equals the unfolded run's to
the nanosecond, not approximately. A run may settle into a cycle of several periods (a pipeline's
stages taking turns to wait): the instants are then `cycle` periods apart, and `periods` must be a
multiple of it. When no such instant comes, the run starts over on traces that keep more
periods in steady state (`retry`: to see a longer cycle, or with the periods left out a multiple
of the cycle it saw), and when that cannot help (a straggler, a layer whose state is not
periodic), on the whole step's traces.

What a layer must guarantee to take part (`LayerModel.time_fold_safe`): its state at an instant
is a function of the operations in flight on the simulated ranks (their nodes, when they started,
in what order) and of its own pending events; nothing it remembers of finished operations changes
a later answer. `time_fold_state` returns what else of its state can tell two instants apart
(a layer with more than its events in flight), `time_fold_refusal` rejects after the run two
instants it let pass as alike when what followed shows they were not, and
`statistics_snapshot` / `advance_statistics` carry its summary's counters forward by whole periods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol

from chakra_core.json_types import JsonObject


@dataclass(frozen=True)
class RankPeriods:
    """Where one simulated rank's trace repeats: node ids [first, end), `nodes` per period; up to
    `reach` (default `end`), the nodes after them still do what the nodes a period before do."""

    first: int
    end: int
    nodes: int
    reach: int | None = None

    @property
    def alike_below(self) -> int:
        """Nodes below this id are the same in a step with more periods (end, or reach)."""
        return self.end if self.reach is None else max(self.end, self.reach)


@dataclass
class TimeFolding:
    """A periodic trace's repetitions, as a generated job hands them to the engine."""

    periods: int
    """Periods the traces leave out; the run's results are extrapolated by this many."""
    microbatches: int
    """Micro-batches per step of the job."""
    microbatches_simulated: int
    """Micro-batches in the traces (microbatches - periods x microbatches_per_period)."""
    microbatches_per_period: int
    ranks: dict[int, RankPeriods] = field(default_factory=dict)
    """Simulated rank -> where its trace repeats."""
    full_traces: Callable[[], list[str]] | None = None
    """Writes the whole step's traces (when the run cannot fold in time) and returns the trace
    file of every rank, as RunSpec.trace_files lists them."""
    steady_periods: int = 0
    """Periods every simulated rank spends inside its repeating nodes at once in these traces."""
    retry: Callable[[int], "tuple[TimeFolding, list[str]] | None"] | None = None
    """retry(cycle), when no instant repeated: the same step folded again, with the periods left
    out a multiple of `cycle` (the cycle the run repeated with, which they were not), or for
    cycle 0 with more steady periods (to see a longer cycle), and its traces (written) as
    RunSpec.trace_files lists them; None where no other try can help or it would simulate too
    much of the step to be worth making before the whole of it."""

    def describe(self) -> str:
        return (f"{self.microbatches_simulated} of {self.microbatches} micro-batches simulated, "
                f"{self.periods} period(s) of {self.microbatches_per_period} folded")


@dataclass(frozen=True)
class TimeFoldResult:
    """What a run says of folding in time (results.json's `folding.time`)."""

    folded: bool
    reason: str = ""
    """Not folded: why every micro-batch was simulated."""
    periods: int = 0
    """Folded: the periods left out, carried forward."""
    cycle_periods: int = 0
    """Periods after which the run was found to repeat."""
    cycle_ns: int = 0
    """How long those take."""
    microbatches_per_period: int = 0
    microbatches_simulated: int = 0
    microbatches: int = 0

    def to_json(self) -> JsonObject:
        if not self.folded:
            return {"folded": False, "reason": self.reason}
        return {"folded": True, "periods": self.periods, "cycle_periods": self.cycle_periods,
                "cycle_ns": self.cycle_ns, "microbatches_per_period": self.microbatches_per_period,
                "microbatches_simulated": self.microbatches_simulated, "microbatches": self.microbatches}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TimeFoldResult:
        return cls(**data)


def unsafe_layers(layers: Iterable[tuple[str, str, bool]]) -> str:
    """Why layers, as (layer, plugin name, time_fold_safe), cannot fold in time ("" when all may)."""
    unsafe = [f"{layer} plugin '{name}'" for layer, name, safe in layers if not safe]
    return f"{', '.join(unsafe)} cannot promise a periodic state (time_fold_safe is false)" if unsafe else ""


class FoldView(Protocol):
    """What a layer's `time_fold_state` may ask of the run at the instant it is asked."""

    def relabel(self, rank: int, node_id: int) -> int:
        """The node's id counted from the rank's lowest unfinished node (equal for a node and its
        counterpart a period on)."""

    def part(self, rank: int, node_id: int) -> str:
        """Where the node lies in the rank's trace: "before" its repeating nodes (the warm-up),
        among them ("repeats": below RankPeriods.alike_below), or "after" them (the cool-down, the
        optimizer). A node outside the repeats is the same node at every instant, where `relabel`
        would number it anew."""
