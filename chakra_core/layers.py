"""The interfaces plugins implement, one per layer: compute, memory, network, system.

A plugin class subclasses one of `ComputeModel`, `MemoryModel`, `NetworkModel`
or `SystemLayer` and declares three class attributes:

- `name`: what users write after `plugin:` in a manifest section;
- `fidelity`: one line telling users what the model does and does not capture;
- `Config`: a pydantic model of the manifest section (the `plugin` key removed).

The engine creates the selected class once per run, as `cls(config, context)`,
and from then on calls its methods directly: no hook dispatch in the hot loop.
`context` (a `LayerContext`) gives the number of ranks, the event scheduler and
the already-built layers this one may depend on (memory is built first, then
compute, network and system), so a roofline compute model can read the memory
layer's bandwidth instead of a copy of it.

Units, everywhere: time in integer nanoseconds, sizes in bytes, bandwidth in
GB/s as each layer documents (network: GB = 2^30 bytes, like ASTRA-sim's
network files; memory and compute: GB = 10^9 bytes).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Protocol, Sequence

from pydantic import BaseModel, ConfigDict

from chakra_core.et.attrs import NodeView

LAYERS = ("system", "compute", "memory", "network")


class Scheduler(Protocol):
    """The engine's clock and event queue, as layers see it."""

    @property
    def now(self) -> int:
        """Current simulated time in ns."""

    def schedule(self, delay: int, callback: Callable[[Any], None], arg: Any = None) -> None:
        """Call `callback(arg)` `delay` ns from now (delay >= 0, an int)."""

    def schedule_at(self, time: int, callback: Callable[[Any], None], arg: Any = None) -> None:
        """Call `callback(arg)` at absolute time `time` (>= now)."""


@dataclass
class LayerContext:
    """What a layer receives when the engine builds it."""

    num_ranks: int
    scheduler: Scheduler
    base_dir: Path = Path(".")
    """Folder of the manifest: resolve relative paths in a plugin's config against it."""
    memory: "MemoryModel | None" = None
    compute: "ComputeModel | None" = None
    network: "NetworkModel | None" = None
    warnings: list[str] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)
    """Run-wide inputs a layer may use: `comm_groups` ({name: [ranks]}), `algorithms` (registered
    collective algorithms), `trace_files` (one path per rank), `dependencies` ("all" or "data")."""

    comm_state: Callable[[int, int, bool], None] | None = None
    comm_release: Callable[[Iterable[tuple[int, int]]], None] | None = None
    """Set by the engine; system layers call `comm_waiting` / `comm_released` rather than these."""

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

    def comm_released(self, nodes: Iterable[tuple[int, int]]) -> None:
        """`comm_waiting(rank, node_id, False)` for every (rank, node_id) pair, in one call."""
        if self.comm_release is not None:
            self.comm_release(nodes)


class PluginConfig(BaseModel):
    """Base for plugin Config models: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class LayerModel(ABC):
    """Common part of every layer implementation."""

    layer: ClassVar[str]
    name: ClassVar[str]
    fidelity: ClassVar[str]
    Config: ClassVar[type[BaseModel]] = PluginConfig

    fold_safe: ClassVar[bool] = False
    """True when the layer may be run for one representative of each class of equivalent ranks
    (see chakra_core.fold): its answers for a rank depend only on the rank's own trace and on
    what the other layers tell it, not on the rank's number, and its run statistics weigh each
    simulated rank by `context.extras["rank_weights"][rank]` (ranks it stands for) when that is
    given. A layer may set it per instance. Leave it False when unsure: the run then simulates
    every rank."""

    def __init__(self, config: BaseModel, context: LayerContext):
        self.config = config
        self.context = context

    @classmethod
    def config_problems(cls, config: BaseModel, extras: dict[str, Any]) -> list[tuple[tuple, str]]:
        """Checks that need more than the Config model (run by `chakra-sim validate` too).

        Return (key path tuple, reason) pairs, e.g. (("all-reduce-implementation", 1),
        "unknown algorithm 'x'"). `extras` holds run-wide inputs such as "algorithms".
        """
        return []

    def finish(self) -> None:
        """Called once when the run is over, before any statistics are read (in the order the
        layers were built: memory, compute, network, system); report leftovers with context.warn."""

    def summary(self) -> dict[str, Any]:
        """Run-level statistics for results.json (JSON-serialisable)."""
        return {}

    def rank_summary(self, rank: int) -> dict[str, Any]:
        """Per-rank statistics, stored in that rank's entry of results.json under the plugin's `name`."""
        return {}

    def terminal_tables(self) -> list[tuple[str, list[str], list[list[str]]]]:
        """Small tables (title, column names, rows of strings) for the terminal summary,
        e.g. the hottest links; also kept in results.json under the layer's "highlights"."""
        return []


class ComputeModel(LayerModel):
    """Times COMP nodes."""

    layer = "compute"

    @abstractmethod
    def compute_time_ns(self, rank: int, node: NodeView) -> int | None:
        """Duration of a compute node in ns, or None to replay the trace's duration_micros."""


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

    tracks_tensors: ClassVar[bool] = False
    """Set True to be told about every node's issue and completion (`node_issued`,
    `node_completed`), e.g. to allocate and free the tensors it produces and consumes.
    Checked once per run; models that leave it False cost nothing per node."""

    def node_issued(self, rank: int, node: NodeView, now: int) -> None:
        """Any node starts on `rank` (only if tracks_tensors). May raise SimulationError (OOM)."""

    def node_completed(self, rank: int, node: NodeView, now: int) -> None:
        """Any node finished on `rank` (only if tracks_tensors)."""


@dataclass(frozen=True)
class Dimension:
    """One dimension of a multi-dimensional network (ASTRA-sim network YAML semantics)."""

    topology: str        # "Ring", "FullyConnected" or "Switch"
    npus: int
    bandwidth_gbps: float  # GB/s with GB = 2^30 bytes
    latency_ns: float


class NetworkModel(LayerModel):
    """Moves messages between NPUs."""

    layer = "network"

    contention_free: ClassVar[bool] = False
    """True when a message's delay depends only on (src, dst, size), never on other traffic.
    The system layer then times collectives in closed form via `message_delay`."""

    npus_count: int
    dims: tuple[Dimension, ...]

    @abstractmethod
    def send(self, src: int, dst: int, size: int, on_arrival: Callable[[Any], None], arg: Any = None) -> None:
        """Inject `size` bytes from `src` to `dst` now; call `on_arrival(arg)` when they arrive."""

    def message_delay(self, src: int, dst: int, size: int) -> int:
        """Delay of one message on an idle network (required when contention_free)."""
        raise NotImplementedError(f"network plugin '{self.name}' does not offer message_delay")

    # Closed-form timing where traffic is shared only in places (optional) --------------------------
    closed_form: bool = False
    """True (per instance) when a network that is not contention-free can still time some
    traffic without events: the system layer `claim`s the (src, dst) pairs of a collective; if
    the network can promise that nothing else will share their links, it times the messages with
    `transfer` / `transfer_uniform` when asked, in the order each sender sends them."""

    def claim(self, pairs: Iterable[tuple[int, int]]) -> object | None:
        """Reserve the links of these pairs for closed-form messages: a token for `release`, or
        None (nothing reserved) when some of them may carry other traffic."""
        return None

    def release(self, token: object) -> None:
        """Every message of a claim has been timed."""

    def transfer(self, src: int, dst: int, size: int, send_time: int) -> int:
        """Arrival time of a claimed message sent at `send_time` (>= now), as the network would
        deliver it; the links' state and statistics change as its hops would change them."""
        raise NotImplementedError(f"network plugin '{self.name}' has no closed form")

    def transfer_uniform(self, pairs: Sequence[tuple[int, int]], step_bytes: Sequence[int],
                         send_times: Sequence[int]) -> bool:
        """Every pair sends step k's message of step_bytes[k] at send_times[k]. If none of them
        can wait anywhere (each arrives in `message_delay`), record them all and return True;
        else change nothing and return False."""
        return False

    def checkpoint(self) -> None:
        """Start remembering what closed-form transfers change, for `rollback`."""

    def rollback(self) -> None:
        """Undo every closed-form transfer since `checkpoint`."""

    def commit(self) -> None:
        """Keep them (stop remembering)."""

    def dim_of(self, src: int, dst: int) -> int:
        """The dimension a src -> dst message travels in: the first where their coordinates differ.

        Coordinates as ASTRA-sim numbers NPUs: dimension 0 varies fastest.
        """
        stride = 1
        for index, dim in enumerate(self.dims):
            if (src // stride) % dim.npus != (dst // stride) % dim.npus:
                return index
            stride *= dim.npus
        raise ValueError(f"src and dst are the same NPU ({src})")


class SystemLayer(LayerModel):
    """Turns communication nodes into network traffic (collective algorithms, p2p matching)."""

    layer = "system"

    collectives_start_waiting: ClassVar[bool] = False
    """True if the layer calls `context.comm_waiting(rank, node_id, False)` for every collective
    once the peers it waits for have joined. The engine then counts each collective as waiting
    for peers from the moment it is issued, and the layer need not say so for each one."""

    needs_network: ClassVar[bool] = True
    """False if the layer times all communication itself; the manifest may then leave out `network`."""

    @abstractmethod
    def issue_collective(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        """Start a COMM_COLL_NODE on `rank`; call `done(node.id)` when it completes there."""

    @abstractmethod
    def issue_send(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        """Start a COMM_SEND_NODE; call `done(node.id)` when the send completes."""

    @abstractmethod
    def issue_recv(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        """Post a COMM_RECV_NODE; call `done(node.id)` when the matching message arrived."""

    def define_groups(self, rank: int, node: NodeView) -> None:
        """A METADATA node may define communicator groups; default: ignore it."""

    def waits(self, rank: int) -> list[str]:
        """What `rank` still waits for (used in deadlock reports)."""
        return []

    def on_idle(self) -> bool:
        """Called when the event queue drains with work left; return True if events were scheduled.

        Lets a system layer resolve its own waits (e.g. break a scheduling cycle) before the
        engine declares a deadlock.
        """
        return False

    def traffic(self, rank: int) -> tuple[int, int] | None:
        """(bytes `rank` injected into the network, bytes it received), or None if not counted.

        Reported as each rank's `bytes_sent` / `bytes_received` in results.json.
        """
        return None


class Registry:
    """Typed registry handed to `chakra_sim_register_<layer>` hooks.

    `add(cls)` checks the class against its layer's interface and rejects a
    name already taken, naming both providers.
    """

    def __init__(self, layer: str, base: type[LayerModel]):
        self.layer, self.base = layer, base
        self.classes: dict[str, type[LayerModel]] = {}
        self.owners: dict[str, str] = {}
        self.algorithms: dict[str, type] = {}
        self.current_owner = "<unknown>"

    def add(self, cls: type[LayerModel]) -> type[LayerModel]:
        """Register an implementation class of this registry's layer; returns it."""
        from chakra_core.errors import PluginError

        owner = self.current_owner
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise PluginError(f"plugin '{owner}' registered {cls!r} as a {self.layer} model, "
                              f"but it does not subclass chakra_core.layers.{self.base.__name__}")
        for attr in ("name", "fidelity"):
            if not isinstance(getattr(cls, attr, None), str) or not getattr(cls, attr):
                raise PluginError(f"plugin '{owner}': {cls.__qualname__} needs a non-empty "
                                  f"string class attribute '{attr}'")
        config = getattr(cls, "Config", None)
        if not (isinstance(config, type) and issubclass(config, BaseModel)):
            raise PluginError(f"plugin '{owner}': {cls.__qualname__}.Config must be a pydantic model")
        if cls.name in RESERVED_NAMES:
            raise PluginError(f"plugin '{owner}': {cls.__qualname__}.name '{cls.name}' is a key of "
                              "chakra-sim's own results; choose another name")
        if cls.name in self.classes:
            raise PluginError(f"{self.layer} model name '{cls.name}' is registered twice: "
                              f"by '{self.owners[cls.name]}' and by '{owner}'")
        self.classes[cls.name] = cls
        self.owners[cls.name] = owner
        return cls

    def add_algorithm(self, cls: type) -> type:
        """Register a collective algorithm class (system registry only; see chakra_core.system)."""
        from chakra_core.errors import PluginError

        if self.layer != "system":
            raise PluginError(f"plugin '{self.current_owner}': algorithms register with the system registry")
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin '{self.current_owner}': algorithm {cls!r} needs a 'name'")
        if name in self.algorithms:
            raise PluginError(f"collective algorithm '{name}' is registered twice: by "
                              f"'{self.owners.get('algorithm:' + name)}' and by '{self.current_owner}'")
        self.algorithms[name] = cls
        self.owners["algorithm:" + name] = self.current_owner
        return cls


RESERVED_NAMES = frozenset({
    "rank", "finish_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "gpu_compute_ns", "cpu_compute_ns",
    "memory_ns", "exposed_network_ns", "waiting_ns", "idle_ns", "bytes_sent", "bytes_received",
    "comm_bytes_by_type", "node_counts", "plugins", "layers", "ranks", "manifest", "warnings",
})
"""Keys of results.json a layer's name may not take: a layer's per-rank output goes under its name."""

LAYER_BASES: dict[str, type[LayerModel]] = {
    "compute": ComputeModel, "memory": MemoryModel, "network": NetworkModel, "system": SystemLayer,
}
