"""The host's kernel launches (compute.effects.host_launch): the host launches one kernel per
`host_launch_us` without waiting for the GPU, so a kernel cannot start before the host has
launched it; only kernels shorter than a launch wait.

Folding in time (chakra_core.contract.time_folding). How far the host is ahead of the GPU (its
lead: launched - now) is history: in steady state it falls by a period's kernels x launch - the
period at every period, so two instants never hold the same lead. A host behind (lead <= 0) holds
no kernel back until it catches up; two instants with the host behind are alike if, from the
earlier one to the end of the run, no kernel waited for the host and the later one's host is no
further ahead: then the host holds nothing back from either, in a step of any length."""

from __future__ import annotations

import math
from typing import Hashable


class HostLaunches:
    """Per rank, when its host has launched its next kernel (s)."""

    def __init__(self, launch_s: float):
        self.launch_s = launch_s
        self.ready: dict[int, float] = {}
        self.last_wait_ns = -1
        """When a kernel last waited for its launch (-1: never)."""

    def delayed(self, rank: int, now_ns: int, duration: int) -> int:
        """The kernel's duration counted from now, its wait for the launch included."""
        now = now_ns * 1e-9
        launched = self.ready.get(rank, 0.0) + self.launch_s
        self.ready[rank] = launched
        wait = launched - now
        if wait > 0:
            self.last_wait_ns = now_ns
            return duration + int(math.ceil(wait * 1e9))
        return duration

    def leads(self, now: int) -> dict[int, float]:
        return {rank: launched - now * 1e-9 for rank, launched in self.ready.items()}

    def time_fold_state(self, now: int) -> Hashable:
        """Each rank's lead, or "behind" (see the module docstring)."""
        return tuple((rank, "behind" if lead <= 0 else lead) for rank, lead in sorted(self.leads(now).items()))

    def time_fold_refusal(self, start_ns: int, before: dict[int, float], after: dict[int, float]) -> str:
        """Why two instants whose hosts were behind are not alike ("" when they are)."""
        if self.last_wait_ns >= start_ns:
            return f"a kernel waited for the host's launch at {self.last_wait_ns:,} ns, after the period began"
        if any(after.get(rank, 0.0) > lead for rank, lead in before.items()):
            return "a host gained on its GPU over the period"
        return ""
