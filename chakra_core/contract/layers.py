"""The interfaces plugins implement, one per layer: compute, memory, system (network: network.py).

A plugin class subclasses one of `ComputeModel`, `MemoryModel`, `NetworkModel`
or `SystemLayer` and declares three class attributes:

- `name`: what users write after `plugin:` in a manifest section;
- `fidelity`: one line telling users what the model does and does not capture;
- `Config`: a pydantic model of the manifest section (the `plugin` key removed).

The engine creates the selected class once per run, as `cls(config, context)`,
and from then on calls its methods directly: no hook dispatch in the hot loop.
`context` (a `LayerContext`) gives the number of ranks, the event scheduler, the
run's inputs and the already-built layers this one may depend on (memory is
built first, then compute, network and system), so a roofline compute model can
read the memory layer's bandwidth instead of a copy of it.

Units, everywhere: time in integer nanoseconds, sizes in bytes, bandwidth in
GB/s as each layer documents (network: GB = 2^30 bytes, like ASTRA-sim's
network files; memory and compute: GB = 10^9 bytes).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Hashable, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from chakra_core.contract.time_folding import FoldView

from chakra_core.comm.collectives import CollectiveCall
from chakra_core.contract.inputs import NO_LOAD, GpuLoad, LayerContext, ValidationInputs
from chakra_core.et.attrs import NodeView
from chakra_core.json_types import JsonObject

LAYERS = ("system", "compute", "memory", "network")
"""The layers a manifest configures, in the order results list them."""

LayerName = Literal["system", "compute", "memory", "network"]

ProblemList = list[tuple[tuple[str | int, ...], str]]
"""(key path, reason) pairs, e.g. ((\"all-reduce-implementation\", 1), \"unknown algorithm 'x'\")."""

TerminalTable = tuple[str, list[str], list[list[str]]]
"""(title, column names, rows of already formatted strings)."""


class PluginConfig(BaseModel):
    """Base for plugin Config models: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


AstraModel = Literal["roofline", "remote-memory", "congestion-unaware", "congestion-aware"]


@dataclass(frozen=True)
class AstraEquivalent:
    """Which of ASTRA-sim's models an implementation stands for, so that ASTRA-sim's own inputs
    select it (the core names no plugin):

    - "roofline" (compute): a system JSON with `roofline-enabled: 1` and no compute section;
    - "remote-memory" (memory): `--astra-memory` with a memory-type other than
      NO_MEMORY_EXPANSION;
    - "congestion-unaware" / "congestion-aware" (network): `--astra-network` without
      `--network` takes the congestion-unaware one.

    `system_keys` maps ASTRA-sim system JSON keys to this class's Config keys: the system file
    fills them when the layer's own section does not (`{"peak-perf": "peak_tflops"}`).
    """

    model: AstraModel
    system_keys: Mapping[str, str] = field(default_factory=dict)


class LayerModel(ABC):
    """Common part of every layer implementation."""

    layer: ClassVar[str]
    name: ClassVar[str]
    fidelity: ClassVar[str]
    Config: ClassVar[type[BaseModel]] = PluginConfig
    astra_sim: ClassVar[AstraEquivalent | None] = None
    """Set when the class implements one of ASTRA-sim's models (see `AstraEquivalent`)."""

    fold_safe: bool = False
    """True when the layer may be run for one representative of each class of equivalent ranks:
    its answers for a rank depend only on the rank's own trace and on what the other layers tell
    it, not on the rank's number, and its run statistics weigh each simulated rank by
    `context.inputs.rank_weights[rank]` (ranks it stands for) when the run is folded. A layer
    may set it per instance. Leave it False when unsure: the run then simulates every rank."""

    time_fold_safe: bool = False
    """True when the layer may take part in a folded-in-time run (chakra_core.contract.time_folding):
    its state at an instant is a function of the operations in flight (their nodes, start times and
    order) and of its own pending events, and what it remembers of finished operations changes no
    later answer; `time_fold_state` returns whatever else of its state can tell two instants apart,
    and `advance_statistics` carries its statistics forward. Leave it False when unsure: the run
    then simulates every micro-batch."""

    def __init__(self, config: Any, context: LayerContext):
        self.config = config
        self.context = context

    def time_fold_state(self, now: int, view: FoldView) -> Hashable:
        """The layer's state at `now` beyond its pending events, in a form equal at two instants
        exactly when the layer will behave the same from each: times relative to `now`, node ids
        through `view.relabel(rank, node_id)`."""
        return ()

    def statistics_snapshot(self) -> object:
        """The counters behind `summary` and `rank_summary` now (a time-folded run takes two)."""
        return None

    def advance_statistics(self, periods: int, before: object, after: object) -> None:
        """Add `periods` times what the counters gained from snapshot `before` to `after`, as the
        periods a folded-in-time run left out would have (called after the run, before `finish`)."""

    def time_fold_refusal(self, start_ns: int, before: object, after: object) -> str:
        """After the run, why the instants whose states `time_fold_state` found equal, the period
        between them beginning at `start_ns` (snapshots `before` and `after`), are not alike after
        all ("" when they are): for state that may differ at the two instants without changing what
        follows, as long as what followed the first shows it did not matter."""
        return ""

    @classmethod
    def config_problems(cls, config: Any, inputs: ValidationInputs) -> ProblemList:
        """Checks that need more than the Config model (run by `chakra-sim validate` too).

        Return (key path tuple, reason) pairs, e.g. (("all-reduce-implementation", 1),
        "unknown algorithm 'x'"). `inputs` holds the manifest's folder and the registered
        collective algorithms.
        """
        return []

    def finish(self) -> None:
        """Called once when the run is over, before any statistics are read (in the order the
        layers were built: memory, compute, network, system); report leftovers with context.warn."""

    def summary(self) -> JsonObject:
        """Run-level statistics for results.json (JSON-serialisable)."""
        return {}

    def rank_summary(self, rank: int) -> JsonObject:
        """Per-rank statistics, stored in that rank's entry of results.json under the plugin's `name`."""
        return {}

    def terminal_tables(self) -> list[TerminalTable]:
        """Small tables (title, column names, rows of strings) for the terminal summary,
        e.g. the hottest links; also kept in results.json under the layer's "highlights"."""
        return []


class ComputeModel(LayerModel):
    """Times COMP nodes."""

    layer = "compute"

    @abstractmethod
    def compute_time_ns(self, rank: int, node: NodeView) -> int | None:
        """Duration of a compute node in ns, or None to replay the trace's duration_micros."""

    retimes: bool = False
    """True when a kernel's time depends on communication that starts beside it while it runs
    (`LayerContext.gpu_load`): with a system layer that reports its operations' starts, the engine
    then calls `retime` at each start and moves the kernels' ends it returns. A class attribute an
    instance may override in `__init__`."""

    def retime(self, rank: int) -> list[tuple[int, int]]:
        """Communication has just started on `rank` (`LayerContext.comm_start` is set, so this is
        called at every start): (node id, new end in ns, >= now) for each of the rank's kernels in
        flight whose end moves. Default: none."""
        return []

    def alone_time_ns(self, node: NodeView) -> int | None:
        """The node's duration with the GPU to itself and the host ahead of it: a lower bound on
        what `compute_time_ns` answers in any run (`chakra-sim plan`'s bound uses it). Default:
        `compute_time_ns` on rank 0, for models whose answer depends on the node alone."""
        return self.compute_time_ns(0, node)

    def rate_ceiling_flops(self) -> float | None:
        """The highest rate, in FLOP/s, at which this model runs any kernel, or None if it does not
        bound one (replayed durations). No step can achieve more model FLOP/s per GPU than this:
        a training job's report checks its own figure against it."""
        return None

    def matmul_ceiling_flops(self, dtype: str) -> float | None:
        """The highest FLOP/s at which this model times any matrix multiplication of `dtype`, or
        None if it does not say: `chakra-sim plan`'s step bound then counts the profile's dense peak
        (which a model's rate must not exceed for the bound to hold)."""
        return None

    def attention_ceiling_flops(self, dtype: str, backward: bool) -> float | None:
        """The highest FLOP/s at which this model times a fused (causal) attention kernel's forward
        or backward pass in `dtype`, or None if it does not say: `chakra-sim plan`'s step bound then
        counts such a kernel at the matmul ceiling of the job's activations."""
        return None


class MemoryModel(LayerModel):
    """Times MEM_LOAD/MEM_STORE nodes and tells compute models the memory bandwidth."""

    layer = "memory"

    @abstractmethod
    def bandwidth_gbps(self, rank: int) -> float:
        """Local memory bandwidth of `rank` in GB/s (10^9 bytes/s), for roofline models."""

    @abstractmethod
    def access(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        """Start a MEM_LOAD_NODE or MEM_STORE_NODE; call `done(node.id)` when it completes.

        Use `context.scheduler` to complete later; accesses may overlap.
        """

    tracks_tensors: bool = False
    """Set True to be told about every node's issue and completion (`node_issued`,
    `node_completed`), e.g. to allocate and free the tensors it produces and consumes. A class
    attribute an instance may override in `__init__`; checked once per run, so models that leave
    it False cost nothing per node. Such a model reports the most bytes any rank had in use by
    `peak_memory_bytes()`."""

    def peak_memory_bytes(self) -> int | None:
        """With tracks_tensors: the most bytes any rank had in use (None when the trace lists no
        tensor). The results carry it (the memory layer's `summary.peak_memory_bytes`, written by
        the core) and `chakra-sim plan` sets each layout's simulated peak from it."""
        return None

    def node_issued(self, rank: int, node: NodeView, now: int) -> None:
        """Any node starts on `rank` (only if tracks_tensors). May raise SimulationError (OOM)."""

    def node_completed(self, rank: int, node: NodeView, now: int) -> None:
        """Any node finished on `rank` (only if tracks_tensors)."""


class SystemLayer(LayerModel):
    """Turns communication nodes into network traffic (collective algorithms, p2p matching)."""

    layer = "system"

    collectives_start_waiting: ClassVar[bool] = False
    """True if the layer calls `context.comm_waiting(rank, node_id, False)` for every collective
    once the peers it waits for have joined. The engine then counts each collective as waiting
    for peers from the moment it is issued, and the layer need not say so for each one."""

    needs_network: ClassVar[bool] = True
    """False if the layer times all communication itself; the manifest may then leave out `network`."""

    mirrors_folded_traffic: bool = False
    """True when, in a folded run, the layer sends the network every message its simulated ranks
    stand for (theirs and their class mates'), so that the network carries the whole traffic and
    need not be `fold_safe` itself. A class attribute an instance may override in `__init__`."""

    @abstractmethod
    def issue_collective(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        """Start a COMM_COLL_NODE on `rank`; call `done(node.id)` when it completes there."""

    @abstractmethod
    def issue_send(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        """Start a COMM_SEND_NODE; call `done(node.id)` when the send completes."""

    @abstractmethod
    def issue_recv(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        """Post a COMM_RECV_NODE; call `done(node.id)` when the matching message arrived."""

    @classmethod
    def collective_call(cls, rank: int, node: NodeView, warn: Callable[[str], None]) -> CollectiveCall | None:
        """How this layer reads a collective node (type, size, group), for `chakra-sim validate`,
        which matches the k-th collective of each group across its members as a run would.
        None (the default): the layer does not match collectives per group; validate skips that
        check. Raise SimulationError for a node the layer would refuse."""
        return None

    def define_groups(self, rank: int, node: NodeView) -> None:
        """A METADATA node may define communicator groups; default: ignore it."""

    def waits(self, rank: int) -> list[str]:
        """What `rank` still waits for (used in deadlock reports)."""
        return []

    @classmethod
    def communicator_memory_bytes(cls, config: Any, base_dir: Path) -> int:
        """Optional: the GPU memory one communicator (process group) of this layer holds on each of
        its GPUs, e.g. NCCL's channel buffers; `chakra-sim plan` reserves it for each group a
        layout's GPU is in, beside the predicted peak. `config` is the layer's Config, `base_dir`
        the manifest's folder. Default 0: the layer holds none."""
        return 0

    def idle_collective_ns(self, comm_type: int, size: int, members: Sequence[int]) -> int | None:
        """Optional: a lower bound on a collective's duration in any run of this layer (e.g. its
        time with nothing else in flight), for `chakra-sim plan`'s bound; None: unknown (0)."""
        return None

    def on_idle(self) -> bool:
        """Called when the event queue drains with work left; return True if events were scheduled.

        Lets a system layer resolve its own waits (e.g. break a scheduling cycle) before the
        engine declares a deadlock.
        """
        return False

    def gpu_load(self, rank: int) -> GpuLoad:
        """What the communication kernels this layer has in flight on `rank` hold now (thread blocks,
        HBM traffic); a compute model times kernels that start beside them with what is left
        (`LayerContext.gpu_load`). Default: nothing, as for communication that runs off the GPU's SMs."""
        return NO_LOAD

    reports_comm_starts: bool = False
    """True when this layer calls `LayerContext.comm_started(rank)` whenever one of its operations
    starts holding what `gpu_load(rank)` counts, so that a compute model can re-time the kernels it
    has in flight (`ComputeModel.retimes`)."""

    def traffic(self, rank: int) -> tuple[int, int] | None:
        """(bytes `rank` injected into the network, bytes it received), or None if not counted.

        Reported as each rank's `bytes_sent` / `bytes_received` in results.json.
        """
        return None


RESERVED_NAMES = frozenset({
    "rank", "finish_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "gpu_compute_ns", "cpu_compute_ns",
    "memory_ns", "exposed_network_ns", "waiting_ns", "idle_ns", "bytes_sent", "bytes_received",
    "comm_bytes_by_type", "node_counts", "plugins", "layers", "ranks", "manifest", "warnings",
})
"""Keys of results.json a layer's name may not take: a layer's per-rank output goes under its name."""
