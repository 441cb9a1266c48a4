"""A collective's step as one set of flows, solved at once (the fair mode's flow level).

A step of a collective (a ring step, an all-to-all round: every member sends
to the members at some offsets) is a set of flows that start together, or at
the send times of their members, on links claimed for the collective, so no
other traffic shares them. `FlowSteps.step` times them as a fluid model
exactly as `FairLinks` would one flow at a time: max-min fair rates for all
active flows at once (`fairshare.water_fill`, vectorised over the flow-link
incidence), time advanced to the next completion or start, rates re-solved for
the flows left; a flow's bytes arrive `sum of its links' latencies` after its
last byte left. Only the epochs cost Python steps: a balanced step (a ring, an
all-to-all routed D-mod-k on a fat-tree) is one water-filling round and one
epoch, whatever the number of flows.

Flows of one step must not meet the previous traffic of the collective on a
link (a member may start its next step while a slower flow it sent is still
on the way), and their rates may change at most MAX_EPOCHS times: otherwise
`step` reports the step's links, and the network asks for a restart with them
timed message by message.

Per-link statistics are kept here in numpy arrays (bytes, messages, busy
time, peak concurrent flows) and added to FairLinks' in the summary.
"""

from __future__ import annotations

import numpy as np

from chakra_sim_network_congestion.fairshare import _renumber, _segments, water_fill

MAX_EPOCHS = 64
"""Epochs (rate changes) a step may take. Each costs a pass over the step's flows, a flow timed
one by one about as much as 100 such passes per route entry: beyond this, flow by flow is
cheaper (a hash-routed all-to-all has thousands of distinct rates), and `step` gives up."""


class TooManyEpochs(Exception):
    """A step's flows change rates too often to be worth timing at once."""


class FlowSteps:
    """Times steps of flows on claimed links and keeps their per-link statistics."""

    def __init__(self, bandwidth: list[float], latency: list[float]) -> None:
        self.capacity = np.asarray(bandwidth, dtype=np.float64)
        self.latency = np.asarray(latency, dtype=np.float64)
        count = len(bandwidth)
        self.bytes = np.zeros(count, dtype=np.int64)
        self.messages = np.zeros(count, dtype=np.int64)
        self.busy = np.zeros(count, dtype=np.float64)
        self.peak = np.zeros(count, dtype=np.int64)
        self.free_at = np.zeros(count, dtype=np.float64)
        """When the last flow timed here leaves each link."""
        self._saved: tuple[np.ndarray, ...] | None = None

    def step(self, flow_start: np.ndarray, flow_links: np.ndarray, starts: np.ndarray,
             size: int) -> tuple[np.ndarray, np.ndarray]:
        """Flows f over flow_links[flow_start[f]:flow_start[f + 1]], each of `size` bytes, sent at
        starts[f] (whole ns). Returns (arrival of each flow in whole ns, the links on which a flow
        would meet one timed before it: empty when there is none)."""
        flows = len(starts)
        lengths = np.diff(flow_start)
        entry_flow = np.repeat(np.arange(flows), lengths)
        begin = starts.astype(np.float64)
        latency = np.bincount(entry_flow, weights=self.latency[flow_links], minlength=flows)
        clash = np.unique(flow_links[self.free_at[flow_links] > begin[entry_flow]])
        crossings = np.bincount(flow_links, minlength=len(self.capacity))
        self.messages += crossings
        if size == 0:
            self.peak[flow_links] = np.maximum(self.peak[flow_links], 1)
            return starts + latency.astype(np.int64), clash
        try:
            finish = self._fluid(flow_start, flow_links, begin, float(size))
        except TooManyEpochs:
            self.messages -= crossings
            return starts, np.unique(flow_links)     # time them flow by flow (after a restart)
        self.bytes += crossings * size
        np.maximum.at(self.free_at, flow_links, finish[entry_flow])
        return starts + (latency + (finish - begin)).astype(np.int64), clash

    def _fluid(self, flow_start: np.ndarray, flow_links: np.ndarray, begin: np.ndarray,
               size: float) -> np.ndarray:
        """When each flow's last byte leaves its source: max-min fair sharing among the flows
        started and not finished, re-solved at every start and completion. As in FairLinks,
        time moves in whole ns: a flow leaves its links at the ns its last byte leaves (floor)
        and the others' rates change then; a flow's remaining bytes are brought up to date
        only when its rate changes."""
        flows = len(begin)
        finish = np.empty(flows, dtype=np.float64)
        remaining = np.full(flows, size)
        rate = np.zeros(flows, dtype=np.float64)
        since = begin.copy()
        order = np.argsort(begin, kind="stable")
        start_times = begin[order]
        started = 0            # flows of `order` started so far
        active = np.empty(0, dtype=np.int64)
        now = float(start_times[0])
        width = len(self.capacity)
        epochs = 0
        while started < flows or len(active):
            if started < flows and start_times[started] <= now:
                upto = int(np.searchsorted(start_times, now, side="right"))
                active = np.concatenate([active, order[started:upto]])
                started = upto
            if not len(active):
                now = float(start_times[started])
                continue
            if len(active) == flows:   # all of them, in order: the incidence as it is
                links, local, local_start = np.arange(width), flow_links, flow_start
                active = np.arange(flows)
            else:
                links, local = _renumber(flow_links[_segments(flow_start, active)], width)
                local_start = np.zeros(len(active) + 1, dtype=np.intp)
                np.cumsum(np.diff(flow_start)[active], out=local_start[1:])
            rates = water_fill(self.capacity[links], local_start, local)
            epochs += 1
            if epochs + (len(np.unique(rates)) if epochs == 1 else 0) > MAX_EPOCHS:
                raise TooManyEpochs
            changed = rates != rate[active]
            moved = active[changed]
            remaining[moved] -= rate[moved] * (now - since[moved])
            since[moved] = now
            rate[moved] = rates[changed]
            ends = since[active] + np.maximum(remaining[active], 0.0) / rate[active]
            leave = np.maximum(np.floor(ends), now)      # the ns each flow leaves its links
            then = float(leave.min())
            if started < flows and start_times[started] < then:
                then = float(start_times[started])
            load = np.bincount(local, minlength=len(links))
            self.busy[links[load > 0]] += then - now     # with every flow active, `links` is every link
            np.maximum(self.peak[links], load, out=load)
            self.peak[links] = load
            done = leave <= then
            finish[active[done]] = ends[done]
            active = active[~done]
            now = then
        return finish

    # Rolling back a collective's timing (see ClaimedLinks.checkpoint) ------------------------------
    def checkpoint(self) -> None:
        self._saved = (self.bytes.copy(), self.messages.copy(), self.busy.copy(), self.peak.copy(),
                       self.free_at.copy())

    def rollback(self) -> None:
        if self._saved is not None:
            self.bytes, self.messages, self.busy, self.peak, self.free_at = self._saved
        self._saved = None

    def commit(self) -> None:
        self._saved = None
