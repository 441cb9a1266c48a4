"""Tensor lifetimes from Chakra IOInfo strings: bytes in use per rank, peak, out-of-memory.

Chakra's PyTorch converter writes a node's operands into `inputs.values` and
`outputs.values` as Python-literal text: nested lists holding scalars,
strings ('<None>', '<Object>', 'cuda:0'), booleans and tensors. A tensor is
the 6-list

    [tensor_id, storage_id, offset, num_elements, element_size, device]

(offset and num_elements count elements). Memory belongs to *storages*: a
storage is identified by its id and is as large as the furthest byte any
tensor shows of it, max((offset + num_elements) x element_size).

`storages_of(node)` finds the tensors with one regular expression that also
consumes quoted strings, so a bracket inside a string is never taken for a
tensor; anything else in the text (numbers, nesting, malformed pieces) is
skipped. No `eval`.

Lifetime rule (per rank, storages of device tensors only):

- a storage is allocated when the first node that references it (as input
  or output) is issued;
- it is released when the last node that references it has completed.

"Last" needs the future. With `lifetime: trace` the model reads the rank's
trace file once, lazily (when the rank issues its first node with device
tensors), and counts the nodes referencing each storage; a storage is
released when that count of completions is reached. This is exact for the
trace. With `lifetime: issued` (or when the trace file is not known) there is
no pre-pass: a storage is released as soon as no node issued so far and
still running references it. That frees tensors between distant uses
(weights, activations kept for the backward pass) and re-allocates them at
the next use, so it reports a lower bound of the `trace` figure.

`tensor_nodes` narrows "nodes" to CPU operations (PyTorch's allocator: the
host allocates and frees, kernels run behind) or to the other nodes.
See docs/memory.md for the figures and limits.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from chakra_core import NodeView, SimulationError, iter_trace

_QUOTED = r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""
_INT = r"\s*(\d+)\s*,"
_TOKENS = re.compile(r"\[" + _INT * 5 + r"\s*(" + _QUOTED + r")\s*\]|" + _QUOTED)

HOST_DEVICES = frozenset({"cpu", "meta", ""})
"""Devices whose tensors are not in the accelerator's memory ('' marks an undefined tensor)."""


def parse_tensors(text: str) -> list[tuple[int, int, int, int, int, str]]:
    """Every tensor 6-list in an IOInfo `values` string, in order of appearance."""
    if "[" not in text:
        return []
    listed = _tensor_list(text)
    if listed is not None:
        return listed
    return [(int(a), int(b), int(c), int(d), int(e), quoted[1:-1])
            for a, b, c, d, e, quoted in _TOKENS.findall(text) if a]


def _tensor_list(text: str) -> list[tuple[int, int, int, int, int, str]] | None:
    """The tensors of a string that is only a list of them, written as the converter and the job
    generator write it ("[[1, 1, 0, 8, 2, 'cuda:0'], [...]]"), read by splitting (1.3-1.7x as fast
    as the expression, which reads every string); None for any other text."""
    if not (text.startswith("[[") and text.endswith("']]")):
        return None
    found = []
    for piece in text[2:-2].split("], ["):
        parts = piece.split(", ")
        if len(parts) != 6:
            return None
        a, b, c, d, e, device = parts
        name = device[1:-1]
        if (len(device) < 2 or device[0] != "'" or device[-1] != "'" or "'" in name or "[" in name
                or "]" in name or "\\" in name
                or not (a.isdecimal() and b.isdecimal() and c.isdecimal() and d.isdecimal() and e.isdecimal())):
            return None
        found.append((int(a), int(b), int(c), int(d), int(e), name))
    return found


class StorageParser:
    """IOInfo text -> (storage id, bytes seen) pairs, with a bounded cache of parsed strings.

    Converted traces repeat the same strings (an operator, its nested calls and its
    kernel list the same operands): on Chakra's test trace 7,328 strings hold 2,342
    distinct ones. The cache is cleared when it holds `cache_size` strings.
    """

    __slots__ = ("count_host", "cache_size", "_cache")

    def __init__(self, count_host: bool = False, cache_size: int = 4096):
        self.count_host = count_host
        self.cache_size = cache_size
        self._cache: dict[str, tuple[tuple[int, int], ...]] = {}

    def text(self, text: str) -> tuple[tuple[int, int], ...]:
        """Storages of one IOInfo string, each once (largest extent), in first-seen order."""
        cached = self._cache.get(text)
        if cached is not None:
            return cached
        seen: dict[int, int] = {}
        count_host = self.count_host
        for _, storage, offset, elements, element_size, device in parse_tensors(text):
            size = (offset + elements) * element_size
            if size == 0 or (not count_host and device.split(":", 1)[0].lower() in HOST_DEVICES):
                continue
            if seen.get(storage, -1) < size:
                seen[storage] = size
        result = tuple(seen.items())
        if len(self._cache) >= self.cache_size:
            self._cache.clear()
        self._cache[text] = result
        return result

    def node(self, node: NodeView) -> tuple[tuple[int, int], ...]:
        """Storages a node references through its inputs and outputs, each once."""
        pb_node = node.pb
        inputs = pb_node.inputs.values
        outputs = pb_node.outputs.values
        if not outputs:
            return self.text(inputs) if inputs else ()
        if not inputs:
            return self.text(outputs)
        first, second = self.text(inputs), self.text(outputs)
        if not first:
            return second
        if not second:
            return first
        seen = dict(first)
        for storage, size in second:
            if seen.get(storage, -1) < size:
                seen[storage] = size
        return tuple(seen.items())


_PARSERS = {False: StorageParser(False), True: StorageParser(True)}


def storages_of(node: NodeView, count_host: bool = False) -> tuple[tuple[int, int], ...]:
    """(storage id, bytes seen) of the storages a node references, each once, in first-seen order.

    Host tensors (device 'cpu'), 'meta' tensors and empty tensors are left out unless `count_host`
    (which still leaves out empty ones).
    """
    return _PARSERS[bool(count_host)].node(node)


NODE_KINDS = ("all", "cpu", "gpu")


def node_filter(kind: str) -> Callable[[NodeView], bool] | None:
    """Which nodes' tensors count: all (None), CPU operations only, or all but CPU operations."""
    if kind == "cpu":
        return lambda node: node.is_cpu_op
    if kind == "gpu":
        return lambda node: not node.is_cpu_op
    if kind != "all":
        raise ValueError(f"tensor_nodes must be one of {', '.join(NODE_KINDS)}, not {kind!r}")
    return None


def reference_counts(path: str | Path, count_host: bool = False,
                     keep: Callable[[NodeView], bool] | None = None) -> dict[int, list[int]]:
    """Pre-pass over one rank's trace: storage id -> [nodes referencing it, largest size seen,
    the last of those nodes' ids] (that node's completion frees it; folding in time reads it).

    `keep(node)` selects the nodes that count (default: all).
    """
    plan: dict[int, list[int]] = {}
    parser = _PARSERS[bool(count_host)]
    _, nodes = iter_trace(path)
    try:
        for _, pb_node in nodes:
            view = NodeView(pb_node)
            if keep is not None and not keep(view):
                continue
            for storage, size in parser.node(view):
                entry = plan.get(storage)
                if entry is None:
                    plan[storage] = [1, size, view.id]
                else:
                    entry[0] += 1
                    if size > entry[1]:
                        entry[1] = size
                    if view.id > entry[2]:
                        entry[2] = view.id
    finally:
        close = getattr(nodes, "close", None)
        if close is not None:
            close()
    return plan


class MemorySeries:
    """Bytes in use over time, bounded to `max_points` points by max-preserving bucketing.

    The series is a step function: a point [t, v] holds from t until the next point.
    Time is cut into buckets of `width` ns (width starts at 1 and doubles whenever the
    series would exceed its bound); a bucket's point has the largest number of bytes in
    use at any moment of the bucket (changes that cancel out within one ns included),
    and once a bucket is over, the level it ended at gets its own point, from the time
    it was reached. So the series never under-states memory, its maximum is the peak,
    its last point is the final level, and at width 1 ns it is exact.
    """

    __slots__ = ("max_points", "width", "points", "level", "last_time", "ns_max", "log")

    def __init__(self, max_points: int):
        if max_points < 4:
            raise ValueError("a memory series needs at least 4 points")
        self.max_points = max_points
        self.width = 1
        self.points: list[list[int]] = []   # [time ns, bytes]; the last one is the open bucket
        self.level = 0                      # bytes in use now
        self.last_time = -1                 # time of the last change
        self.ns_max = 0                     # the most bytes in use during that ns
        self.log: list[tuple[int, int]] | None = None
        """Every change once set to a list (a folded-in-time run: time_fold.py replays them)."""

    def change(self, time: int, value: int) -> None:
        """Bytes in use become `value` at `time` (times never decrease)."""
        if self.log is not None:
            self.log.append((time, value))
        ns_max = value if time != self.last_time or value > self.ns_max else self.ns_max
        self._record(time, value)
        self.level, self.last_time, self.ns_max = value, time, ns_max
        if len(self.points) > self.max_points - 1:   # keep one point for the final level
            self._coarsen()

    def _settled(self) -> int:
        """From when the current level holds without a spike above it: the last change's ns or the next."""
        return self.last_time if self.ns_max == self.level else self.last_time + 1

    def _record(self, time: int, value: int) -> None:
        width = self.width
        start = time - time % width
        points = self.points
        if points:
            last = points[-1]
            if last[0] == start:
                if value > last[1]:
                    last[1] = value
                return
            if self.level != last[1]:
                settled = self._settled()
                if settled < start:
                    points.append([settled, self.level])
        points.append([start, max(value, self.level) if time > start else value])

    def _coarsen(self) -> None:
        """Double the bucket width until the points fit in half the bound (max of each bucket)."""
        state = self.level, self.last_time, self.ns_max
        while len(self.points) > self.max_points // 2:
            old = self.points
            self.width *= 2
            self.points, self.level, self.last_time, self.ns_max = [], 0, -1, 0
            for time, value in old:          # the step function so far, replayed as changes
                self._record(time, value)
                self.level = self.ns_max = value
                self.last_time = time
        self.level, self.last_time, self.ns_max = state

    def copy(self) -> MemorySeries:
        """The series as it stands (without its log)."""
        twin = MemorySeries(self.max_points)
        twin.width, twin.level, twin.last_time, twin.ns_max = self.width, self.level, self.last_time, self.ns_max
        twin.points = [list(point) for point in self.points]
        return twin

    def export(self) -> list[list[int]]:
        """The points, consecutive equal values merged, ending at the current level."""
        out: list[list[int]] = []
        for time, value in self.points:
            if not out or out[-1][1] != value:
                out.append([time, value])
        if out and self.level != self.points[-1][1]:
            out.append([self._settled(), self.level])
        return out


class RankTensors:
    """Live storages of one rank and what they add up to."""

    __slots__ = ("rank", "live", "pending", "plan", "planned", "in_use", "peak", "peak_ns", "series",
                 "allocations")

    def __init__(self, rank: int, series_points: int):
        self.rank = rank
        # storage -> [bytes, nodes still to complete, 1 when those are the issued ones (no plan),
        # the last node referencing it (-1: unknown), the node that allocated it, nodes that
        # reference it in all]
        self.live: dict[int, list[int]] = {}
        self.pending: dict[int, tuple[tuple[int, int], ...]] = {}   # node id -> its storages, issued
        self.plan: dict[int, list[int]] | None = None
        self.planned = False
        self.in_use = 0
        self.peak = 0
        self.peak_ns = 0
        self.series = MemorySeries(series_points)
        self.allocations = 0


class TensorTracker:
    """Per-rank storage lifetimes (see module docstring) with a capacity check.

    `trace_file(rank)` returns the rank's trace path or None; it is asked once per rank,
    when the rank issues its first node with device tensors (`lifetime: trace` only).
    `on_oom(rank, node, short, in_use)` is called when an allocation leaves more bytes in use
    than `capacity` (None: unlimited).
    """

    def __init__(self, num_ranks: int, lifetime: str, count_host: bool, capacity: int | None,
                 series_points: int, trace_file: Callable[[int], Path | None],
                 on_oom: Callable[[int, NodeView, int, int], None], nodes: str = "all"):
        self.lifetime = lifetime
        self.keep = node_filter(nodes)
        self.count_host = count_host
        self.capacity = capacity
        self.trace_file = trace_file
        self.on_oom = on_oom
        self.ranks = [RankTensors(rank, series_points) for rank in range(num_ranks)]
        self.unplanned_ranks: list[int] = []
        self._parse = _PARSERS[bool(count_host)].node

    def _plan(self, state: RankTensors) -> None:
        state.planned = True
        if self.lifetime != "trace":
            return
        path = self.trace_file(state.rank)
        if path is None:
            self.unplanned_ranks.append(state.rank)
            return
        try:
            state.plan = reference_counts(path, self.count_host, self.keep)
        except OSError as exc:
            raise SimulationError(f"memory plugin 'hbm': cannot read {path} to find when rank "
                                  f"{state.rank}'s tensors die: {exc}") from None

    def issued(self, rank: int, node: NodeView, now: int) -> None:
        storages = self._parse(node)
        if not storages or (self.keep is not None and not self.keep(node)):
            return
        state = self.ranks[rank]
        if not state.planned:
            self._plan(state)
        state.pending[node.id] = storages
        live, plan = state.live, state.plan
        grown = 0
        for storage, size in storages:
            entry = live.get(storage)
            if entry is None:
                planned = plan.pop(storage, None) if plan is not None else None
                if planned is not None:          # lives until all its referencing nodes complete
                    entry = [max(planned[1], size), planned[0], 0, planned[2], node.id, planned[0]]
                else:                            # lives while issued nodes that reference it run
                    entry = [size, 1, 1, -1, node.id, 1]
                live[storage] = entry
                grown += entry[0]
                state.allocations += 1
            else:
                if size > entry[0]:
                    grown += size - entry[0]
                    entry[0] = size
                if entry[2]:
                    entry[1] += 1
        if grown:
            state.in_use += grown
            state.series.change(now, state.in_use)
            if state.in_use > state.peak:
                state.peak, state.peak_ns = state.in_use, now
            capacity = self.capacity
            if capacity is not None and state.in_use > capacity:
                self.on_oom(rank, node, state.in_use - capacity, state.in_use)

    def completed(self, rank: int, node: NodeView, now: int) -> None:
        state = self.ranks[rank]
        if not state.pending:
            return
        storages = state.pending.pop(node.id, None)
        if storages is None:
            return
        live = state.live
        freed = 0
        for storage, _ in storages:
            entry = live[storage]
            entry[1] -= 1
            if entry[1] <= 0:
                freed += entry[0]
                del live[storage]
        if freed:
            state.in_use -= freed
            state.series.change(now, state.in_use)
