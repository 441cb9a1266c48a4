"""The workload driver: issues one rank's nodes as their dependencies resolve.

It keeps, per hardware resource ("slot"), a min-heap of ready node ids and a
count of operations in flight. Whenever something finishes it issues every
ready node whose slot has room, smallest id first across slots: ASTRA-sim's
`issue_dep_free_nodes` order. Default capacities are ASTRA-sim's: one CPU
operation, one GPU kernel and one communication operation in flight; memory
loads/stores share the communication slot; receives, metadata and skipped
nodes take no slot.

Per-rank time (all integer ns). Every instant from 0 to the rank's finish
goes to exactly one category, the first that applies, so the six sum to
`finish_ns` exactly:
- gpu_compute_ns: a GPU compute node runs;
- cpu_compute_ns: a CPU node (is_cpu_op) runs, and no GPU node;
- memory_ns: a memory load/store is in flight, and no compute;
- exposed_network_ns: a collective, send or receive has its data in the
  network (all its peers have joined), and nothing above runs;
- waiting_ns: communication is in flight but waits for peers that have not
  issued their side yet (skew, pipeline bubbles), and nothing above runs;
- idle_ns: nothing in flight.
The system layer says when a communication node waits for peers
(`LayerContext.comm_waiting`); without word from it, communication counts
as network time. Overlapping totals are kept too: compute_ns (summed GPU
node durations as re-timed beside communication, ASTRA-sim's "GPU ops"),
comm_ns (time with any communication in flight) and exposed_comm_ns (exposed
network + waiting: comparable to ASTRA-sim's "exposed communication").
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any, Callable

from chakra_core.et.duration import replay_time_ns
from chakra_core.errors import SimulationError
from chakra_core.limits import TIME_NS
from chakra_core.et.attrs import NodeView
from chakra_core.feeder.base import CPU_FLAG, GraphFeeder
from chakra_core.schema import pb

if TYPE_CHECKING:
    from chakra_core.engine.simulation import Simulation

Interval = tuple[int, int, str, str, str, int, int, tuple[int, ...]]
"""A finished node, as timelines read it: (rank, node id, name, node type, slot, start ns, end ns,
parent ids)."""

SLOT_CPU, SLOT_GPU, SLOT_COMM, SLOT_MEM, SLOT_FREE = range(5)
SLOT_NAMES = ("cpu", "gpu", "comm", "memory", "unlimited")
_SLOTS = range(len(SLOT_NAMES))
UNLIMITED = 1 << 62

# Accounting categories of in-flight operations; the breakdown takes the first active one of
# BREAKDOWN (CAT_NONE nodes finish at once and count nowhere).
CAT_NONE, CAT_GPU, CAT_CPU, CAT_MEM, CAT_NET, CAT_WAIT = range(6)
BREAKDOWN = ("gpu_compute_ns", "cpu_compute_ns", "memory_ns", "exposed_network_ns", "waiting_ns",
             "idle_ns")
"""Per-rank time categories, in priority order; they sum to the rank's finish time."""

STEP_PARTS = ("forward", "backward", "recompute", "optimizer", "tp", "cp", "ep", "dp", "pp", "other")
"""Values of a node's `step_part` attribute (generated jobs write it; absent or unknown: other).
With RunSpec.step_parts, each breakdown category is split by the step part of the first
active node's part in this order."""
_PART_INDEX = {name: index for index, name in enumerate(STEP_PARTS)}
_OTHER_PART = len(STEP_PARTS) - 1


def step_part(node: NodeView) -> int:
    """The node's step part (STEP_PARTS index)."""
    return _PART_INDEX.get(node.str("step_part", "other"), _OTHER_PART)


def slot_table(memory_shares_comm: bool) -> dict[int, int]:
    """Node kind (NodeType | CPU_FLAG) -> slot index."""
    table = {}
    for node_type in pb.NodeType.values():
        for cpu in (0, CPU_FLAG):
            kind = node_type | cpu
            if node_type == pb.COMP_NODE:
                slot = SLOT_CPU if cpu else SLOT_GPU
            elif node_type == pb.COMM_COLL_NODE:
                slot = SLOT_CPU if cpu else SLOT_COMM
            elif node_type == pb.COMM_SEND_NODE:
                slot = SLOT_COMM
            elif node_type in (pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE):
                slot = SLOT_COMM if memory_shares_comm else SLOT_MEM
            else:
                slot = SLOT_FREE
            table[kind] = slot
    return table


class RankDriver:
    """Issues and completes the nodes of one rank (see module docstring)."""

    # Slots: these attributes are read for every node of every rank.
    __slots__ = ("rank", "feeder", "sim", "queue", "compute", "memory", "system", "_limit",
                 "in_use", "ready", "slots", "inflight", "remaining", "finish_ns", "_pumping", "_observer",
                 "_intervals", "_tensor_tracker", "_reporting", "_collective_category", "compute_ns",
                 "comm_ns", "time", "_active", "_last", "_type_counts", "comm_bytes",
                 "replayed_host_collectives", "_parts_on", "_part_active", "_part_time", "_max_ns", "_part_of",
                 "_kernels")

    def __init__(self, rank: int, feeder: GraphFeeder, sim: "Simulation",
                 capacities: list[int | None], slots: dict[int, int]):
        self.rank = rank
        self.feeder = feeder
        self.sim = sim
        self.queue = sim.queue
        self.compute = sim.compute
        self.memory = sim.memory
        self.system = sim.system
        self._limit = [UNLIMITED if c is None else c for c in capacities]   # per slot
        self._max_ns = TIME_NS.value()
        self.in_use = [0] * len(SLOT_NAMES)
        self.ready: list[list[int]] = [[] for _ in SLOT_NAMES]
        self.slots = slots
        self.inflight: dict[int, tuple[int, int, int]] = {}   # node id -> (slot, category, start)
        self.remaining = feeder.num_nodes
        self.finish_ns: int | None = None if self.remaining else 0
        self._pumping = False
        self._observer: Callable[..., None] | None = sim.node_observer
        self._intervals: list[Interval] | None = sim.intervals
        memory = sim.memory
        self._tensor_tracker = memory if memory is not None and memory.tracks_tensors else None
        self._reporting = (self._observer is not None or self._intervals is not None
                           or self._tensor_tracker is not None)
        self._collective_category = CAT_WAIT if getattr(self.system, "collectives_start_waiting",
                                                        False) else CAT_NET
        # accounting
        self.compute_ns = self.comm_ns = 0
        self.time = [0] * len(BREAKDOWN)    # ns per BREAKDOWN category
        self._active = [0] * 6              # in flight per category
        self._last = 0
        self._type_counts: dict[int, int] = {}
        self.comm_bytes: dict[str, int] = {}
        self.replayed_host_collectives = 0
        self._parts_on = sim.spec.step_parts
        self._part_of = sim.part_of
        self._part_active = [[0] * len(STEP_PARTS) for _ in range(6)]   # per category, per part
        self._part_time = [[0] * len(STEP_PARTS) for _ in range(6)]
        # kernels re-timed as communication starts beside them: node id -> (end, callback, arg) of its event
        self._kernels: dict[int, tuple[int, Callable[[Any], None], Any]] | None = {} if sim.context.comm_start else None

    # Issue -----------------------------------------------------------------------------------
    def start(self) -> None:
        self.pump()

    def pump(self) -> None:
        """Move newly issuable nodes into slot heaps and issue all that fit."""
        if self._pumping:
            return
        self._pumping = True
        try:
            ready, slots = self.ready, self.slots
            feeder = self.feeder
            if feeder.pending:
                for kind, node_id in feeder.pop_ready():
                    heappush(ready[slots[kind]], node_id)
            limit, in_use = self._limit, self.in_use
            while True:   # complete() pushes the children it frees straight into `ready`
                best = -1
                best_id = 0
                for slot in _SLOTS:
                    heap = ready[slot]
                    if heap and in_use[slot] < limit[slot] and (best < 0 or heap[0] < best_id):
                        best, best_id = slot, heap[0]
                if best < 0:
                    # A feeder whose finish() leaves freed children for pop_ready (the memory
                    # feeder) has more for us when a node completed at once inside this loop.
                    if not feeder.pending:
                        return
                    fresh = feeder.pop_ready()
                    if not fresh:
                        return
                    for kind, node_id in fresh:
                        heappush(ready[slots[kind]], node_id)
                    continue
                heappop(ready[best])
                self._issue(best_id, best)
        finally:
            self._pumping = False

    def _account(self) -> None:
        now = self.queue.now
        elapsed = now - self._last
        if elapsed:
            active = self._active
            if active[CAT_NET] or active[CAT_WAIT]:
                self.comm_ns += elapsed
            # categories CAT_GPU.. are BREAKDOWN indexes 0..4; idle is 5
            for category in (CAT_GPU, CAT_CPU, CAT_MEM, CAT_NET, CAT_WAIT):
                if active[category]:
                    self.time[category - 1] += elapsed
                    if self._parts_on:
                        parts = self._part_active[category]
                        first = next((i for i, n in enumerate(parts) if n), _OTHER_PART)
                        self._part_time[category][first] += elapsed
                    break
            else:
                self.time[5] += elapsed
            self._last = now

    def comm_waiting(self, node_id: int, waiting: bool) -> None:
        """The system layer says whether communication node `node_id` waits for peers."""
        entry = self.inflight.get(node_id)
        if entry is None or entry[1] not in (CAT_NET, CAT_WAIT):
            return   # finished already, or not communication (nothing to reclassify)
        category = CAT_WAIT if waiting else CAT_NET
        if entry[1] != category:
            self._account()
            self._active[entry[1]] -= 1
            self._active[category] += 1
            self.inflight[node_id] = (entry[0], category, entry[2])
            if self._parts_on:
                part = self._part_of(self.feeder.lookup_node(node_id))
                self._part_active[entry[1]][part] -= 1
                self._part_active[category][part] += 1

    def breakdown(self) -> dict[str, int]:
        """The six exclusive time categories (they sum to finish_ns)."""
        return dict(zip(BREAKDOWN, self.time))

    def parts(self) -> dict[str, dict[str, int]] | None:
        """With step parts on: each category of `breakdown` split by step part (idle is not)."""
        if not self._parts_on:
            return None
        return {BREAKDOWN[category - 1]: {STEP_PARTS[i]: t for i, t in enumerate(times) if t}
                for category, times in enumerate(self._part_time) if category}

    def _issue(self, node_id: int, slot: int) -> None:
        node = self.feeder.lookup_node(node_id)
        node_type = node.pb.type
        if self._tensor_tracker is not None:
            self._tensor_tracker.node_issued(self.rank, node, self.queue.now)
        counts = self._type_counts
        counts[node_type] = counts.get(node_type, 0) + 1
        self.in_use[slot] += 1
        now = self.queue.now
        rank = self.rank
        if node_type == _COMP or (node_type == _COLL and slot == SLOT_CPU):
            if node_type == _COMP:
                duration = self.compute.compute_time_ns(rank, node)
            else:  # host-side launch of a collective (CPU op): its kernel is a separate node
                duration = None
                self.replayed_host_collectives += 1
            if duration is None:
                duration = replay_time_ns(node)
            elif duration.__class__ is not int or duration < 0:
                raise SimulationError(
                    f"compute plugin '{self.compute.name}' returned {duration!r} for rank {rank} "
                    f"node {node_id}; durations must be non-negative ints (ns)")
            if slot == SLOT_CPU:
                category = CAT_CPU
            else:
                category = CAT_GPU
                self.compute_ns += duration
            if now != self._last:
                self._account()
            self._active[category] += 1
            # The engine itself completes compute nodes: their bookkeeping rides on the event
            # instead of the in-flight table that layers' completions go through.
            if self._parts_on:
                part = self._part_of(node)
                self._part_active[category][part] += 1
                callback: Callable[[Any], None] = self._computed_part
                arg: Any = (node_id, slot, category, now, part)
            else:
                callback, arg = self._computed, (node_id, slot, category, now)
            self.queue.schedule(duration, callback, arg)
            if self._kernels is not None and category == CAT_GPU:
                self._kernels[node_id] = (now + duration, callback, arg)
        elif node_type == _COLL:
            self._begin(node_id, slot, self._collective_category, now)
            memo = node.memo
            counted = memo.get(_COMM_BYTES)
            if counted is None:
                counted = memo[_COMM_BYTES] = (_COLL_NAMES.get(node.int("comm_type", -1), "UNKNOWN"),
                                               node.int("comm_size", 0))
            coll_name, size = counted
            self.comm_bytes[coll_name] = self.comm_bytes.get(coll_name, 0) + size
            self.system.issue_collective(rank, node, self.complete)
        elif node_type == pb.COMM_SEND_NODE:
            self._begin(node_id, slot, CAT_NET, now)
            self.comm_bytes["SEND"] = self.comm_bytes.get("SEND", 0) + node.int("comm_size", 0)
            self.system.issue_send(rank, node, self.complete)
        elif node_type == pb.COMM_RECV_NODE:
            self._begin(node_id, slot, CAT_NET, now)
            self.comm_bytes["RECV"] = self.comm_bytes.get("RECV", 0) + node.int("comm_size", 0)
            self.system.issue_recv(rank, node, self.complete)
        elif node_type in (pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE):
            if self.memory is None:
                raise SimulationError(
                    f"rank {rank}, node {node_id} ({node.name!r}) is a {node.type_name} but no memory "
                    "model is selected: add a `memory:` section (e.g. `plugin: hbm`) to the manifest, "
                    "or give --astra-memory a remote-memory file other than NO_MEMORY_EXPANSION "
                    "(which, as in ASTRA-sim, has no model for memory nodes)")
            self._begin(node_id, slot, CAT_MEM, now)
            self.memory.access(rank, node, self.complete)
        else:
            if node_type == pb.METADATA_NODE:
                self.system.define_groups(rank, node)
            self._begin(node_id, slot, CAT_NONE, now)
            self.complete(node_id)

    def move_kernels(self, moved: list[tuple[int, int]]) -> None:
        """The compute model re-timed kernels in flight: (node id, new end) each (ComputeModel.retime)."""
        kernels, queue = self._kernels or {}, self.queue   # set whenever the engine re-times kernels
        for node_id, end in moved:
            entry = kernels.get(node_id)
            if entry is not None and entry[0] != end and entry[0] > queue.now:   # not ended, nor ending now
                if end < queue.now:
                    raise SimulationError(f"compute plugin '{self.compute.name}' moved rank {self.rank}'s node "
                                          f"{node_id} to end at {end} ns, before now ({queue.now} ns)")
                queue.cancel(*entry)
                queue.schedule_at(end, entry[1], entry[2])
                self.compute_ns += end - entry[0]
                kernels[node_id] = (end, entry[1], entry[2])

    @property
    def node_counts(self) -> dict[str, int]:
        """Nodes issued, by type name."""
        return {_TYPE_NAMES.get(t, str(t)): n for t, n in self._type_counts.items()}

    def _begin(self, node_id: int, slot: int, category: int, now: int) -> None:
        if category:
            if now != self._last:
                self._account()
            self._active[category] += 1
            if self._parts_on:
                self._part_active[category][self._part_of(self.feeder.lookup_node(node_id))] += 1
        self.inflight[node_id] = (slot, category, now)

    # Completion -------------------------------------------------------------------------------
    def complete(self, node_id: int) -> None:
        """Called by the engine or a layer when a node has finished on this rank."""
        try:
            slot, category, start = self.inflight.pop(node_id)
        except KeyError:
            raise SimulationError(f"rank {self.rank}: node {node_id} completed twice or was never "
                                  "issued (a layer called its completion callback wrongly)") from None
        if self._parts_on and category:
            if self.queue.now != self._last:
                self._account()
            self._part_active[category][self._part_of(self.feeder.lookup_node(node_id))] -= 1
        self._computed((node_id, slot, category, start))

    def _computed_part(self, arg: tuple[int, int, int, int, int]) -> None:
        """A compute node of a run split by step part finished (time so far is accounted to the
        parts in flight before it leaves them)."""
        if self.queue.now != self._last:
            self._account()
        self._part_active[arg[2]][arg[4]] -= 1
        self._computed(arg[:4])

    def _computed(self, arg: tuple[int, int, int, int]) -> None:
        """A node finished (the engine completes compute nodes here directly)."""
        node_id, slot, category, start = arg
        if self._kernels is not None:
            self._kernels.pop(node_id, None)
        if self.queue.now > self._max_ns:   # no hardware takes this long: a trace or model error
            raise SimulationError(f"rank {self.rank}, node {node_id} ({self.feeder.lookup_node(node_id).name!r}) "
                                  f"would finish at {self.queue.now:,} ns (started at {start:,} ns); "
                                  f"{TIME_NS.hint()}")
        if category:
            if self.queue.now != self._last:
                self._account()
            self._active[category] -= 1
        self.in_use[slot] -= 1
        if self._reporting:
            self._report(node_id, slot, start)
        freed = self.feeder.finish(node_id)
        if freed:
            ready, slots = self.ready, self.slots
            for kind, child in freed:
                heappush(ready[slots[kind]], child)
        self.remaining -= 1
        if self.remaining == 0:
            self.finish_ns = self.queue.now
            self._account()
            self.sim.rank_finished(self.rank)
        else:
            self.pump()

    def _report(self, node_id: int, slot: int, start: int) -> None:
        """Per-node consumers: the memory layer's tensor tracking, the timeline, observer hooks."""
        node = self.feeder.lookup_node(node_id)
        now = self.queue.now
        if self._tensor_tracker is not None:
            self._tensor_tracker.node_completed(self.rank, node, now)
        if self._intervals is not None:
            pb_node = node.pb
            self._intervals.append((self.rank, node_id, pb_node.name, _TYPE_NAMES.get(pb_node.type, "?"),
                                    SLOT_NAMES[slot], start, now,
                                    tuple(pb_node.data_deps) + tuple(pb_node.ctrl_deps)))
        if self._observer is not None:
            self._observer(rank=self.rank, node=node, start_ns=start, end_ns=now)

    # Reporting --------------------------------------------------------------------------------
    def waits(self) -> list[str]:
        """What this rank is stuck on (deadlock report)."""
        out = []
        for node_id, (slot, category, start) in sorted(self.inflight.items()):
            node = self.feeder.lookup_node(node_id)
            if category not in (CAT_NET, CAT_WAIT):
                out.append(f"node {node_id} ({node.name!r}, {node.type_name}) in flight since {start} ns")
        out.extend(self.system.waits(self.rank))
        blocked = sum(len(h) for h in self.ready)
        if blocked:
            first = min(h[0] for h in self.ready if h)
            out.append(f"{blocked} ready node(s) wait for a busy resource (first: node {first})")
        return out


_TYPE_NAMES = {value: name for name, value in pb.NodeType.items()}
_COLL_NAMES = {value: name for name, value in pb.CollectiveCommType.items()}
_COMP, _COLL = pb.COMP_NODE, pb.COMM_COLL_NODE
_COMM_BYTES = object()
"""NodeView.memo key of a collective's (type name, comm_size) for the per-type byte counts."""
