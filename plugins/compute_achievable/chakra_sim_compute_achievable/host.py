"""The host's kernel launches (compute.effects.host_launch): the host launches one kernel per
`host_launch_us` without waiting for the GPU, so a kernel cannot start before the host has
launched it; only kernels shorter than a launch wait.

- A node that stands for several kernels (`launches`: a grouped GEMM's cuBLAS call per expert,
  a quantization per expert) takes that many launches; its last kernel cannot start before the
  last launch, its first before the first.
- A node the host waits for (`host_sync`: a copy to the host and its synchronization, as a
  dropless mixture of experts does to size its all-to-all) leaves the host idle until the node
  ends: from then on the host launches again from that instant, with no lead.

Time is kept in integer picoseconds, so the host's state is exact and repeats in a periodic step.

Folding in time (chakra_core.contract.time_folding). How far the host is ahead of the GPU (its
lead: launched - now) is history. Without synchronizations it falls by a period's kernels x launch
- the period at every period, so two instants never hold the same lead: a host behind (lead <= 0)
holds no kernel back until it catches up, and two instants with the host behind are alike if, from
the earlier one to the end of the run, no kernel of that rank waited for the host and the later
one's host is no further ahead: then the host holds nothing back from either, in a step of any
length. A host that synchronizes starts over at each synchronization, so its exact lead (and
when a pending synchronization takes effect) repeats and is compared as it is."""

from __future__ import annotations

from typing import Hashable

_PS = 1000   # picoseconds per ns


class HostLaunches:
    """Per rank, when its host has launched its last kernel (ps)."""

    def __init__(self, launch_s: float):
        self.launch_ps = round(launch_s * 1e12)
        self.ready: dict[int, int] = {}
        self.synced: dict[int, int] = {}
        """Ranks whose host has waited for its GPU, and when the last wait ends (ns)."""
        self.first_sync_ns: dict[int, int] = {}
        """When each of those ranks' first wait was known: from then on its lead is compared exactly."""
        self.last_wait_ns: dict[int, int] = {}
        """Per rank, when a kernel last waited for its launch."""

    def delayed(self, rank: int, now_ns: int, duration: int, launches: int = 1, sync: bool = False) -> int:
        """The node's duration counted from now, its waits for its `launches` included; `sync`:
        the host waits for its end."""
        now = now_ns * _PS
        ready = self.ready.get(rank, 0)
        resumed = self.synced.get(rank, -1) * _PS
        if now >= resumed > ready:
            ready = resumed   # the host waited until then (a kernel starting before was launched before)
        first = ready + self.launch_ps
        last = ready + launches * self.launch_ps
        self.ready[rank] = last
        # the node's kernels share its time; each starts when the one before ends and it was launched
        end = max(now + duration * _PS, first + duration * _PS, last + duration * _PS // launches)
        if end > now + duration * _PS:
            self.last_wait_ns[rank] = now_ns
            duration = -(-(end - now) // _PS)
        if sync:
            self.synced[rank] = now_ns + duration
            self.first_sync_ns.setdefault(rank, now_ns)
        return duration

    def leads(self, now: int) -> dict[int, tuple[int, int]]:
        """Per rank, the host's lead (ps) and how long until it resumes after a wait (ns, or -1)."""
        return {rank: (launched - now * _PS, self.synced[rank] - now if rank in self.synced else -1)
                for rank, launched in self.ready.items()}

    def time_fold_state(self, now: int) -> Hashable:
        """Each rank's exact lead, or "behind" for a host that never waited (module docstring)."""
        return tuple((rank, "behind" if lead <= 0 and rank not in self.synced else (lead, resume))
                     for rank, (lead, resume) in sorted(self.leads(now).items()))

    def time_fold_refusal(self, start_ns: int, before: dict[int, tuple[int, int]],
                          after: dict[int, tuple[int, int]]) -> str:
        """Why two instants whose hosts were behind are not alike ("" when they are)."""
        for rank, (lead, _) in before.items():
            if self.first_sync_ns.get(rank, start_ns + 1) <= start_ns:   # compared exactly from the start
                continue
            waited = self.last_wait_ns.get(rank, -1)
            if waited >= start_ns:
                return f"a kernel of rank {rank} waited for the host's launch at {waited:,} ns, after the period began"
            if after.get(rank, (0, -1))[0] > lead:
                return "a host gained on its GPU over the period"
        return ""
