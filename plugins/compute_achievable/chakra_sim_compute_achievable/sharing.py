"""Kernels re-timed as communication starts beside them (compute.effects comm_sms and comm_hbm,
with a system layer that reports its operations' starts: `LayerContext.comm_start`).

A compute kernel runs its thread blocks in waves. A communication kernel launched beside it gets
SMs as the kernel's resident blocks retire (NCCL launches one block per channel), and its copies
take HBM bandwidth. So a kernel's work left runs at the share the GPU leaves it from the
operation's start on, not at the share it started with: over dt ns under a load at which the
whole kernel takes D ns, dt / D of its work is done. As for a kernel that starts beside them, the
SMs come back when the first operation in flight is expected to end (its issue plus its time
alone; `GpuLoad.until_ns`), after which the rest runs at the kernel's own pace; an operation past
that time (waiting for its peers) holds them to the kernel's end. A kernel that starts a ns before
a collective is thus timed as one that starts a ns after (to within a ns), whatever order the two
reach the simulator in within an instant. What a kernel's end depends on stays its own rank's
issues (not when peers arrive): a pipeline's stages are not coupled through it, so a periodic
step's state still repeats (time folding compares it, `state`; the work left is a float, the same
bits for the same changes at the same times relative to the kernel's start). Before the kernel's
own start (a launch it waits for, host.py) nothing of it is done.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Hashable

from chakra_core import FoldView


def until_first_end(loaded: float, alone: float, until_ns: int | None, now: int) -> tuple[int, int | None]:
    """A kernel's time from `now` under the load it runs beside (`loaded` ns for its work) up to
    when the first of those operations is expected to end (`until_ns`), the rest of its work alone
    (`alone` ns for the same work); wholly loaded when one of them waits for peers (its end
    unknown) or is overdue. With how long of it runs loaded (None: all of it)."""
    shared = None if until_ns is None else until_ns - now
    if shared is None or shared <= 0 or shared >= loaded:
        return int(math.ceil(loaded)), None
    return shared + int(math.ceil((1 - shared / loaded) * alone)), shared


class Running:
    """A modelled kernel in flight: since when its current share runs (at first its start, after
    the host's launch), the share of its work left then, its whole time under that load and alone,
    when it goes back to its own pace (None: never), and its end."""

    __slots__ = ("work", "weight", "since", "left", "whole", "alone", "switch", "end")

    def __init__(self, work: Any, weight: int, begins: int, whole: int, alone: int, switch: int | None, end: int):
        self.work, self.weight, self.since, self.left = work, weight, begins, 1.0
        self.whole, self.alone, self.switch, self.end = max(1, whole), max(1, alone), switch, end

    def done(self, now: int) -> float:
        """The share of its work done from `since` to `now`."""
        if self.switch is None or now <= self.switch:
            return (now - self.since) / self.whole
        return (self.switch - self.since) / self.whole + (now - self.switch) / self.alone

    def retimed(self, now: int, whole: int, until_ns: int | None) -> int:
        """Its end when an operation starts now, under whose load the whole kernel takes `whole` ns
        until the first operation in flight is expected to end (`until_ns`)."""
        if now > self.since:
            self.left = max(0.0, self.left - self.done(now))
            self.since = now
        self.whole = max(1, whole)
        took, shared = until_first_end(self.left * whole, self.left * self.alone, until_ns, self.since)
        self.switch = None if shared is None else self.since + shared
        return self.since + took


_KEPT = 8
"""Kernels a rank keeps before dropping those ended as the next starts (a check per kernel costs more)."""


class KernelsInFlight:
    """Per rank, its modelled kernels in flight by node id (those ended are dropped as
    communication starts, or as kernels start once it keeps _KEPT)."""

    def __init__(self) -> None:
        self.ranks: dict[int, dict[int, Running]] = {}

    def add(self, rank: int, node_id: int, kernel: Running, now: int) -> None:
        kernels = self.ranks.get(rank)
        if kernels is None:
            kernels = self.ranks[rank] = {}
        elif len(kernels) >= _KEPT:
            self._drop_ended(kernels, now)
        kernels[node_id] = kernel

    def retime(self, rank: int, now: int, whole_under: Callable[[Running], int],
               until_ns: int | None) -> list[tuple[int, Running, int]]:
        """(node id, kernel, its old end) for each kernel on `rank` whose end moves now that its
        whole time is `whole_under(kernel)` until `until_ns`; the kernels hold their new ends."""
        kernels = self.ranks.get(rank)
        if not kernels:
            return []
        self._drop_ended(kernels, now)
        moved = []
        for node_id, kernel in kernels.items():
            old = kernel.end
            kernel.end = max(now, kernel.retimed(now, whole_under(kernel), until_ns))
            if kernel.end != old:
                moved.append((node_id, kernel, old))
        return moved

    @staticmethod
    def _drop_ended(kernels: dict[int, Running], now: int) -> None:
        for node_id in [n for n, kernel in kernels.items() if kernel.end <= now]:
            del kernels[node_id]

    def state(self, now: int, view: FoldView) -> Hashable:
        """The kernels running after `now`, relative to it (node ids through `view.relabel`)."""
        return tuple((rank, tuple(sorted((view.relabel(rank, node_id), k.since - now, k.left, k.whole,
                                          None if k.switch is None else k.switch - now, k.end - now)
                                         for node_id, k in kernels.items() if k.end > now)))
                     for rank, kernels in sorted(self.ranks.items()))
