"""What a layer receives when the engine builds it: the clock, the run's inputs, its neighbours.

`LayerContext` is handed to every layer as `cls(config, context)`. It holds the
scheduler (the engine's clock and event queue), the layers built before this
one (memory, then compute, network, system), the run-wide inputs as a typed
`RunInputs`, and the few calls a layer makes back into the engine: `warn`,
`comm_waiting` / `comm_released` (for the time breakdown) and `request_restart`, and
`gpu_load`: what the communication in flight on a GPU takes from its compute kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Mapping, Protocol, Sequence

from chakra_core.contract.folding import Folding

if TYPE_CHECKING:
    from chakra_core.contract.algorithm import CollectiveAlgorithm
    from chakra_core.contract.layers import ComputeModel, MemoryModel
    from chakra_core.contract.network import NetworkModel


class Scheduler(Protocol):
    """The engine's clock and event queue, as layers see it."""

    @property
    def now(self) -> int:
        """Current simulated time in ns."""

    def schedule(self, delay: int, callback: Callable[[Any], None], arg: Any = None) -> None:
        """Call `callback(arg)` `delay` ns from now (delay >= 0, an int)."""

    def schedule_at(self, time: int, callback: Callable[[Any], None], arg: Any = None) -> None:
        """Call `callback(arg)` at absolute time `time` (>= now)."""


@dataclass(frozen=True)
class GpuLoad:
    """What the communication kernels in flight on one GPU hold at an instant, so that a compute
    model can time a kernel that starts beside them (`LayerContext.gpu_load`)."""

    ctas: int = 0
    """Thread blocks of communication kernels resident now: each occupies one SM that compute
    kernels cannot use (NCCL runs one per channel; Transformer Engine's userbuffers `num_sm`)."""
    hbm_gbps: float = 0.0
    """HBM traffic their copies and reductions make, GB/s (10^9 B/s)."""
    until_ns: int | None = None
    """When the first of them ends (after which a kernel runs with the whole GPU again, to a first
    approximation); None when one of them waits for peers and its end is not known yet."""


NO_LOAD = GpuLoad()


@dataclass(frozen=True)
class ValidationInputs:
    """What `LayerModel.config_problems` may consult besides the layer's own Config."""

    base_dir: Path = Path(".")
    """Folder of the manifest: resolve relative paths in a plugin's config against it."""
    algorithms: Mapping[str, type["CollectiveAlgorithm"]] = field(default_factory=dict)
    """Collective algorithms registered with the system registry, by name."""


@dataclass(frozen=True)
class RunInputs:
    """Run-wide inputs, the same for every layer of a run (and for every restart of it)."""

    trace_files: Sequence[Path] = ()
    """One trace file per rank, in rank order."""
    comm_groups: Mapping[str, Sequence[int]] = field(default_factory=dict)
    """Communicator groups from the manifest or an ASTRA-sim comm-group file: {name: [ranks]}."""
    dependencies: Literal["all", "data"] = "all"
    """Which dependencies the feeders follow ("data": control dependencies ignored)."""
    comm_capacity: int | None = 1
    """Collectives and sends a rank may have in flight at once (`resources.comm`; None: unlimited)."""
    algorithms: Mapping[str, type["CollectiveAlgorithm"]] = field(default_factory=dict)
    """Collective algorithms registered with the system registry, by name."""
    base_dir: Path = Path(".")
    """Folder of the manifest: resolve relative paths in a plugin's config against it."""
    folding: Folding | None = None
    """Set when one rank is simulated per class of equivalent ranks (see `LayerModel.fold_safe`)."""
    restart_hints: tuple[object, ...] = ()
    """What earlier attempts of this run learned (see `LayerContext.request_restart`), oldest first."""
    closed_form: bool = True
    """False on a run's last attempt after restarts: every layer times everything event by event."""

    @property
    def rank_weights(self) -> Mapping[int, int]:
        """Folded runs: simulated rank -> the ranks it stands for (empty when not folded)."""
        folding = self.folding
        if folding is None:
            return {}
        return {rep: folding.weight(rep) for rep in folding.representatives}

    def hints(self, kind: type[Any]) -> list[Any]:
        """The restart hints of one type, oldest first."""
        return [hint for hint in self.restart_hints if isinstance(hint, kind)]


@dataclass(frozen=True)
class Unfold:
    """A restart hint: simulate every rank (what folding assumed proved wrong)."""

    reason: str

    def __str__(self) -> str:
        return self.reason


@dataclass(frozen=True)
class RestartRequest:
    """A layer's request to start the run over (see `LayerContext.request_restart`)."""

    reason: str
    hint: object


@dataclass
class LayerContext:
    """What a layer receives when the engine builds it."""

    num_ranks: int
    scheduler: Scheduler
    inputs: RunInputs = field(default_factory=RunInputs)
    memory: "MemoryModel | None" = None
    compute: "ComputeModel | None" = None
    network: "NetworkModel | None" = None
    warnings: list[str] = field(default_factory=list)
    restart: RestartRequest | None = None
    """The first restart a layer asked for in this attempt (set by `request_restart`)."""

    gpu_load: Callable[[int], GpuLoad] = lambda rank: NO_LOAD
    """Set by the engine to the system layer's `SystemLayer.gpu_load` once that is built: what the
    communication in flight on `rank` takes from compute kernels now (compute models call it)."""
    comm_start: Callable[[int], None] | None = None
    """Set by the engine when the system layer reports its operations' starts
    (`SystemLayer.reports_comm_starts`) and the compute model re-times kernels in flight
    (`ComputeModel.retimes`): the system layer calls `comm_started(rank)` whenever an operation
    starts holding what `gpu_load(rank)` counts, and the engine moves the ends `ComputeModel.retime`
    gives."""
    comm_state: Callable[[int, int, bool], None] | None = None
    comm_release: Callable[[Iterable[tuple[int, int]]], None] | None = None
    stop: Callable[[], None] | None = None
    """Set by the engine; layers call `comm_waiting`, `comm_released`, `request_restart`."""

    @property
    def base_dir(self) -> Path:
        """Folder of the manifest (`inputs.base_dir`)."""
        return self.inputs.base_dir

    def warn(self, message: str) -> None:
        """Record a warning: shown after the run and written to results.json."""
        if message not in self.warnings:
            self.warnings.append(message)

    def comm_waiting(self, rank: int, node_id: int, waiting: bool) -> None:
        """For system layers: communication node `node_id` on `rank` waits for peers (True) that
        have not issued their side yet, or no longer does (False).

        Only the per-rank time breakdown uses it: waiting time is skew and pipeline bubbles,
        the rest of a node's time in flight is network time. A system layer that never calls
        it has all its communication counted as network time. Unknown or finished nodes are
        ignored.
        """
        if self.comm_state is not None:
            self.comm_state(rank, node_id, waiting)

    def comm_started(self, rank: int) -> None:
        """For system layers that report their operations' starts: an operation has just started
        holding part of `rank`'s GPU (`gpu_load(rank)` counts it now)."""
        if self.comm_start is not None:
            self.comm_start(rank)

    def comm_released(self, nodes: Iterable[tuple[int, int]]) -> None:
        """`comm_waiting(rank, node_id, False)` for every (rank, node_id) pair, in one call."""
        if self.comm_release is not None:
            self.comm_release(nodes)

    def request_restart(self, reason: str, hint: object) -> None:
        """Ask the engine to start the run over: something this layer already timed proved wrong
        (links it timed in closed form carry other traffic after all; ranks it folded differ).

        The engine stops the event loop once the current event's callback returns, discards
        the attempt, and builds every layer again with `hint` appended to
        `inputs.restart_hints`; `reason` becomes a warning of the run. Only the first request
        of an attempt counts. The caller returns normally: whatever it computes after the
        request is thrown away (and an error raised in the same event is superseded by the
        restart: if it is real, the next attempt raises it again).
        """
        if self.restart is None:
            self.restart = RestartRequest(reason, hint)
            if self.stop is not None:
                self.stop()
