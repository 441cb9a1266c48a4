"""Chrome-trace / Perfetto timeline of a simulation (timeline.json; open it in ui.perfetto.dev).

Input: the intervals a run records with `timeline` (chakra_core.run), one
per finished node: (rank, node id, name, node type, slot, start ns, end ns,
parent ids), and the results document.

Layout of the JSON (Trace Event Format, object form):

- one process per rank (`pid` = rank, named "rank <r>");
- one thread lane per resource slot: compute (cpu), compute (gpu),
  communication, memory, other (receives, metadata and other nodes that hold
  no resource). Nodes that overlap on one slot (a slot with capacity above
  one, or the unlimited "other" slot) go to extra lanes "<lane> #2", "#3"...,
  so slices on a lane never overlap;
- a complete event ("X") per node: `ts` and `dur` in µs as floats, so the
  simulator's integer ns survive exactly (ns / 1000); `args` holds the node
  id, node type and the exact start/end ns;
- flow arrows ("s" -> "f") from each parent to its child when both are in the
  timeline, at most `max_flows` of them (the earliest children first); the
  `metadata` object says how many there were and how many were left out;
- counter events ("C", "memory in use", bytes) when the memory layer's summary
  holds `memory_series` = {"<rank>": [[time_ns, bytes_in_use], ...]}.

Output is deterministic: the same intervals and results give the same bytes.
"""

from __future__ import annotations

import heapq
import json
import os
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from chakra_core._atomic import atomic_write_text
from chakra_core.errors import ChakraSimError
from chakra_core.json_types import JsonObject
from chakra_core.report.document import Results

DEFAULT_MAX_FLOWS = 20000

LANES = {
    "cpu": (1, "compute (cpu)"),
    "gpu": (2, "compute (gpu)"),
    "comm": (3, "communication"),
    "memory": (4, "memory"),
    "unlimited": (5, "other"),
}
"""Slot name -> (lane number, lane name). Lane n's tids are n*1000 + overlap index."""

COUNTER_NAME = "memory in use"


def _us(ns: int) -> float:
    return ns / 1000


def _tid(lane: int, sub: int) -> int:
    return lane * 1000 + sub


def _lane_of(slot: str) -> tuple[int, str]:
    return LANES.get(slot, (6, slot))


@dataclass(frozen=True)
class TimelineCounts:
    """What a timeline holds, for the command's summary line (also in the document's metadata)."""

    slices: int
    flows_total: int
    flows_shown: int
    max_flows: int
    memory_counters: int

    @property
    def flows_dropped(self) -> int:
        return self.flows_total - self.flows_shown


@dataclass(frozen=True)
class Timeline:
    """A built timeline: its Chrome-trace events and counts."""

    events: list[JsonObject]
    counts: TimelineCounts
    finish_ns: int
    num_ranks: int
    version: str

    def to_json(self) -> JsonObject:
        """The Chrome-trace document (a dict ready for json.dumps); see the module docstring."""
        counts = self.counts
        return {"traceEvents": self.events, "displayTimeUnit": "ns", "metadata": {
            "generator": "chakra-sim timeline",
            "chakra_sim_version": self.version,
            "finish_ns": self.finish_ns,
            "num_ranks": self.num_ranks,
            "time_unit": "ts and dur are microseconds with nanosecond precision",
            "slices": counts.slices,
            "flows": {"total": counts.flows_total, "shown": counts.flows_shown, "cap": counts.max_flows,
                      "dropped": counts.flows_dropped},
            "memory_counters": counts.memory_counters,
        }}


def build_timeline(intervals: Iterable[Sequence[Any]], results: Results,
                   max_flows: int = DEFAULT_MAX_FLOWS) -> JsonObject:
    """The Chrome-trace document (a dict ready for json.dumps); see the module docstring."""
    return timeline(intervals, results, max_flows).to_json()


def timeline(intervals: Iterable[Sequence[Any]], results: Results, max_flows: int = DEFAULT_MAX_FLOWS) -> Timeline:
    """The timeline of a run's finished nodes (`intervals`) and results."""
    rows = sorted((int(r[0]), int(r[5]), int(r[6]), int(r[1]), str(r[2]), str(r[3]), str(r[4]),
                   tuple(r[7])) for r in intervals)
    ranks = sorted({rank.rank for rank in results.ranks} | {row[0] for row in rows})
    events: list[JsonObject] = []
    for rank in ranks:
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})

    # Lanes: interval partitioning per (rank, slot), so slices on one tid never overlap.
    placed: dict[tuple[int, int], tuple[int, int, int]] = {}    # (rank, node id) -> (tid, start, end)
    lanes_used: set[tuple[int, int, int]] = set()                # (rank, lane, sub)
    slices: list[JsonObject] = []
    busy: dict[tuple[int, str], list[tuple[int, int]]] = {}
    free: dict[tuple[int, str], list[int]] = {}
    count: dict[tuple[int, str], int] = {}
    for rank, start, end, node_id, name, type_name, slot, _ in rows:
        key = (rank, slot)
        heap, idle = busy.setdefault(key, []), free.setdefault(key, [])
        while heap and heap[0][0] <= start:
            heapq.heappush(idle, heapq.heappop(heap)[1])
        if idle:
            sub = heapq.heappop(idle)
        else:
            sub = count.get(key, 0)
            count[key] = sub + 1
        heapq.heappush(heap, (end, sub))
        lane = _lane_of(slot)[0]
        tid = _tid(lane, sub)
        lanes_used.add((rank, lane, sub))
        placed[(rank, node_id)] = (tid, start, end)
        slices.append({"ph": "X", "name": name or f"node {node_id}", "cat": type_name, "pid": rank,
                       "tid": tid, "ts": _us(start), "dur": _us(end - start),
                       "args": {"node_id": node_id, "type": type_name, "slot": slot,
                                "start_ns": start, "end_ns": end}})
    lane_names = {number: label for number, label in LANES.values()}
    for slot in sorted({row[6] for row in rows} - set(LANES)):
        lane_names[_lane_of(slot)[0]] = slot
    for rank, lane, sub in sorted(lanes_used):
        label = lane_names[lane] + (f" #{sub + 1}" if sub else "")
        tid = _tid(lane, sub)
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": label}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                       "args": {"sort_index": tid}})
    events.extend(slices)

    # Dependencies as flow arrows, earliest children first, capped.
    candidates = []
    for rank, start, end, node_id, _, _, _, parents in rows:
        for parent in sorted(set(parents)):
            if (rank, parent) in placed:
                candidates.append((start, rank, node_id, parent))
    candidates.sort()
    shown = candidates[:max(0, max_flows)]
    for flow_id, (_, rank, child, parent) in enumerate(shown, start=1):
        p_tid, p_start, p_end = placed[(rank, parent)]
        c_tid, c_start, c_end = placed[(rank, child)]
        # bind both ends inside their slices (midpoints), never on a boundary shared with a neighbour
        events.append({"ph": "s", "name": "dependency", "cat": "dependency", "id": flow_id, "pid": rank,
                       "tid": p_tid, "ts": _us(p_start + p_end) / 2})
        events.append({"ph": "f", "bp": "e", "name": "dependency", "cat": "dependency", "id": flow_id,
                       "pid": rank, "tid": c_tid, "ts": _us(c_start + c_end) / 2})

    counters = _memory_counters(results)
    events.extend(counters)
    counts = TimelineCounts(len(slices), len(candidates), len(shown), max_flows, len(counters))
    return Timeline(events, counts, results.finish_ns, len(ranks), results.version)


def _memory_counters(results: Results) -> list[JsonObject]:
    memory = results.layers.get("memory")
    series = None if memory is None else memory.summary.get("memory_series")
    if not series:
        return []
    if not isinstance(series, dict):
        raise ChakraSimError("results: layers.memory.summary.memory_series must map ranks to "
                             "[[time_ns, bytes_in_use], ...]")
    out: list[JsonObject] = []
    for rank_key in sorted(series, key=lambda k: int(k)):
        for point in series[rank_key]:
            try:
                time_ns, in_use = (int(v) for v in point)
            except (TypeError, ValueError):
                raise ChakraSimError(f"results: memory_series[{rank_key!r}] holds {point!r}; expected "
                                     "[time_ns, bytes_in_use] pairs") from None
            out.append({"ph": "C", "name": COUNTER_NAME, "pid": int(rank_key), "tid": 0, "ts": _us(time_ns),
                        "args": {"bytes": in_use}})
    return out


def timeline_json(doc: JsonObject) -> str:
    return json.dumps(doc, separators=(",", ":")) + "\n"


def write_timeline(intervals: Iterable[Sequence[Any]], results: Results, path: str | os.PathLike[str],
                   max_flows: int = DEFAULT_MAX_FLOWS) -> TimelineCounts:
    """Build the timeline and write it atomically to `path`; return what it holds."""
    built = timeline(intervals, results, max_flows)
    atomic_write_text(path, timeline_json(built.to_json()))
    return built.counts
