"""Linking a host trace with its Kineto trace: which measured event is which host scope.

CPU scopes, in two passes:

1. by record-function id: Kineto's `Record function id` equals the host `rf_id` (PyTorch 2.1
   and later); the names must agree too;
2. by order, for the rest: per host thread, scopes in id order (start order) form a sequence of
   names; per Kineto thread, CPU events sorted by (start, longest first, External id) form
   another. Each host thread is paired with the Kineto thread where its sequence fits best (a
   greedy in-order match from every plausible starting event, so a Kineto trace covering more
   iterations than the host trace picks the matching window), then the two sequences are
   aligned with difflib's longest-matching-blocks algorithm, which tolerates scopes present on
   one side only (`ProfilerStep#N`, profiler warm-up).

GPU work (kernels, memcpy, memset) belongs to the CPU scope that launched it: the GPU event's
`correlation` names a runtime call (`cudaLaunchKernel`...), and the innermost CPU event
enclosing that call in time on its thread is the launcher (going up to the nearest enclosing
event that is linked to a host scope). When no runtime call carries the correlation, the GPU
event's `External id` names the launching CPU event directly (newer Kineto). Blocking
runtime calls (`cudaDeviceSynchronize`, `cudaStreamSynchronize`, blocking `cudaMemcpy`, an
"async" copy that did not return before its copy finished) are attributed the same way, with
the time each waited for the GPU (`Blocking`): the converter takes it out of the waiting
operator's duration, since the simulation re-creates the wait through the dependency.
"""

from __future__ import annotations

import bisect
import difflib
from dataclasses import dataclass, field
from typing import cast

from chakra_core.tools.pytorch.host import HostOp, HostTrace
from chakra_core.tools.pytorch.kineto import ASYNC_COPY_CALLS, SYNC_CALLS, Event, KinetoTrace
from chakra_core.tools.pytorch.units import WRAPPER

_LOOKAHEAD = 24
_HEADS = 8          # host names considered for anchoring a thread's sequence
_PREFIX = 64        # host names scoring every candidate start
_FINALISTS = 8      # candidate starts scored on the whole sequence


@dataclass
class CpuLinks:
    event_of: dict[int, Event] = field(default_factory=dict)
    """Host id -> its Kineto CPU event."""
    by_rf_id: int = 0
    by_order: int = 0
    threads: dict[int, str] = field(default_factory=dict)
    """Host thread -> Kineto thread paired by the order pass."""


@dataclass(slots=True)
class Launch:
    event: Event
    host_id: int | None       # the host scope that launched it (None: not linked)
    launch_ts: float          # when the runtime call started (the event's own ts if unknown)


@dataclass(slots=True)
class Blocking:
    """A linked runtime call that returned only once GPU work was done."""

    host_id: int
    ts: float       # start of the call
    call: str
    wait: float     # µs from the call's start to the last GPU completion inside it (0: none)


@dataclass
class GpuLinks:
    launches: list[Launch]
    blocking: list[Blocking]
    """Every linked blocking call, by (host id, start)."""


def link_cpu(host: HostTrace, kineto: KinetoTrace) -> CpuLinks:
    links = CpuLinks()
    candidates = [op for op in host.ops.values() if not WRAPPER.match(op.name)]
    used: set[int] = set()
    if kineto.has_record_function_ids:
        by_rf = {e.rf_id: e for e in kineto.cpu if e.rf_id is not None}
        for op in candidates:
            event = by_rf.get(op.rf_id) if op.rf_id is not None else None
            if event is not None and event.name == op.name:
                links.event_of[op.id] = event
                used.add(event.index)
        links.by_rf_id = len(links.event_of)
    host_threads: dict[int, list[HostOp]] = {}
    for op in candidates:
        if op.id not in links.event_of:
            host_threads.setdefault(op.tid if op.tid is not None else 0, []).append(op)
    kineto_threads: dict[str, list[Event]] = {}
    for event in kineto.cpu:
        if event.index not in used:
            kineto_threads.setdefault(event.tid, []).append(event)
    for events in kineto_threads.values():
        events.sort(key=_start_order)
    _pair_and_align(host_threads, kineto_threads, links)
    # Scopes the host trace puts on one thread but that ran on others (a backend's worker
    # threads): align what is left, in id order, with the unpaired Kineto threads' events merged
    # in start order.
    leftover = [op for ops in host_threads.values() for op in ops if op.id not in links.event_of]
    paired = set(links.threads.values())
    spare = [e for tid, events in kineto_threads.items() if tid not in paired for e in events]
    if leftover and spare:
        spare.sort(key=_start_order)
        _pair_and_align({-1: sorted(leftover, key=lambda op: op.id)}, {"*": spare}, links)
        links.threads.pop(-1, None)
    return links


def _start_order(event: Event) -> tuple[float, float, int, int]:
    """Start time, enclosing scopes first, then creation order."""
    return event.ts, -event.dur, event.ext_id if event.ext_id is not None else 0, event.index


def _pair_and_align(host_threads: dict[int, list[HostOp]], kineto_threads: dict[str, list[Event]],
                    links: CpuLinks) -> None:
    scores = []
    kineto_names = {k_tid: [e.name for e in events] for k_tid, events in kineto_threads.items()}
    kineto_positions = {k_tid: _positions(names) for k_tid, names in kineto_names.items()}
    for h_tid, ops in host_threads.items():
        names = [op.name for op in ops]
        for k_tid in kineto_threads:
            score, start = _best_start(names, kineto_names[k_tid], kineto_positions[k_tid])
            if score:
                scores.append((-score, h_tid, k_tid, start))
    taken_h, taken_k = set(), set()
    for _, h_tid, k_tid, start in sorted(scores):
        if h_tid in taken_h or k_tid in taken_k:
            continue
        taken_h.add(h_tid)
        taken_k.add(k_tid)
        links.threads[h_tid] = k_tid
        ops, events = host_threads[h_tid], kineto_threads[k_tid]
        window = events[start:start + 2 * len(ops) + 64]
        matcher = difflib.SequenceMatcher(None, [op.name for op in ops],
                                          kineto_names[k_tid][start:start + len(window)], autojunk=False)
        for block in matcher.get_matching_blocks():
            for offset in range(block.size):
                links.event_of[ops[block.a + offset].id] = window[block.b + offset]
                links.by_order += 1


def _positions(names: list[str]) -> dict[str, list[int]]:
    """name -> its positions in `names`, ascending."""
    positions: dict[str, list[int]] = {}
    for pos, name in enumerate(names):
        positions.setdefault(name, []).append(pos)
    return positions


def _best_start(host: list[str], kineto: list[str], positions: dict[str, list[int]]) -> tuple[int, int]:
    """(matches, start) of the best greedy in-order match of `host` in `kineto` (first best);
    `positions` is `_positions(kineto)`.

    Candidate starts are the occurrences of the rarest of the host's first names; each is scored
    on a prefix of the host sequence and the best few on all of it.
    """
    if not host or not kineto:
        return 0, 0
    heads = [(len(positions[name]), offset, name) for offset, name in enumerate(host[:_HEADS])
             if name in positions]
    if not heads:
        return 0, 0
    _, offset, name = min(heads)
    starts = sorted({max(0, pos - offset) for pos in positions[name]})
    prefix = host[:_PREFIX]
    ranked = sorted(starts, key=lambda start: (-_greedy(prefix, kineto, start, 0), start))
    best, best_start = 0, 0
    for start in sorted(ranked[:_FINALISTS]):
        matched = _greedy(host, kineto, start, best)
        if matched > best:
            best, best_start = matched, start
    return best, best_start


def _greedy(host: list[str], kineto: list[str], start: int, beat: int) -> int:
    """Host names found in order in `kineto` from `start`, each within a lookahead window
    (stops early once `beat` cannot be exceeded)."""
    matched, pos, total, end = 0, start, len(host), len(kineto)
    for done, name in enumerate(host):
        if matched + (total - done) <= beat:
            break
        try:
            found = kineto.index(name, pos, min(end, pos + _LOOKAHEAD))
        except ValueError:
            continue
        matched += 1
        pos = found + 1
    return matched


def link_gpu(kineto: KinetoTrace, cpu: CpuLinks) -> GpuLinks:
    host_of = {event.index: host_id for host_id, event in cpu.event_of.items()}
    by_thread: dict[str, list[Event]] = {}
    for event in kineto.cpu:
        by_thread.setdefault(event.tid, []).append(event)
    calls: dict[str, list[Event]] = {}
    for runtime_call in kineto.runtime:
        calls.setdefault(runtime_call.tid, []).append(runtime_call)
    launcher: dict[int, int | None] = {}      # runtime event index -> host id
    for tid in sorted(set(by_thread) | set(calls)):
        _attribute_calls(by_thread.get(tid, []), calls.get(tid, []), host_of, launcher)
    by_correlation = {call.correlation: call for call in kineto.runtime if call.correlation is not None}
    by_ext = {event.ext_id: event for event in kineto.cpu if event.ext_id is not None}
    launches = []
    for gpu in sorted(kineto.gpu, key=lambda e: (e.ts, e.index)):
        call = by_correlation.get(gpu.correlation) if gpu.correlation is not None else None
        if call is not None:
            launches.append(Launch(gpu, launcher.get(call.index), call.ts))
            continue
        owner = by_ext.get(gpu.ext_id) if gpu.ext_id is not None else None
        launches.append(Launch(gpu, host_of.get(owner.index) if owner else None, gpu.ts))
    ends = sorted(gpu.end for gpu in kineto.gpu)
    # launcher[call.index] is an int: the condition keeps only those
    blocking = [Blocking(cast(int, launcher[call.index]), call.ts, call.name, device_wait(call, ends))
                for call in blocking_calls(kineto) if launcher.get(call.index) is not None]
    return GpuLinks(launches, sorted(blocking, key=lambda b: (b.host_id, b.ts)))


def blocking_calls(kineto: KinetoTrace) -> list[Event]:
    """Runtime calls that return only once GPU work is done: the synchronisations of SYNC_CALLS,
    and an asynchronous copy whose own GPU copy ended before the call returned (a copy to or
    from pageable host memory is synchronous whatever its name says)."""
    copies = {gpu.correlation: gpu for gpu in kineto.gpu if gpu.correlation is not None}
    out = []
    for call in kineto.runtime:
        if call.name in SYNC_CALLS:
            out.append(call)
        elif call.name in ASYNC_COPY_CALLS:
            copy = copies.get(call.correlation) if call.correlation is not None else None
            if copy is not None and call.ts < copy.end <= call.end:
                out.append(call)
    return out


def device_wait(call: Event, gpu_ends: list[float]) -> float:
    """How long a blocking call waited: from its start to the last GPU completion inside it (the
    GPU work it waited for); what is left after that is the call's own cost."""
    position = bisect.bisect_right(gpu_ends, call.end) - 1
    if position < 0 or gpu_ends[position] <= call.ts:
        return 0.0
    return gpu_ends[position] - call.ts


def _attribute_calls(ops: list[Event], calls: list[Event], host_of: dict[int, int],
                     launcher: dict[int, int | None]) -> None:
    """For each runtime call on one thread, the host id of the innermost enclosing linked CPU event."""
    items = [(e.ts, 0, -e.dur, e.index, e) for e in ops] + [(c.ts, 1, -c.dur, c.index, c) for c in calls]
    items.sort(key=lambda item: item[:4])
    stack: list[tuple[Event, int | None]] = []     # open CPU events with their linked host id
    for ts, kind, _, _, event in items:
        # A scope ends where the next one starts; a call at a scope's very end is still inside it.
        while stack and (stack[-1][0].end <= ts if kind == 0 else stack[-1][0].end < ts):
            stack.pop()
        if kind == 0:
            linked = host_of.get(event.index)
            if linked is None and stack:
                linked = stack[-1][1]   # unlinked scopes inherit the nearest linked ancestor
            stack.append((event, linked))
        else:
            launcher[event.index] = stack[-1][1] if stack else None
