"""Timing a step schedule among its members: closed form or message by message.

Both executors implement the same semantics, ASTRA-sim's for its native
collectives (read from its Ring/PacketBundle/MemBus code and checked against
its numbers):

- a member that starts the run at time s sends its first messages at
  s + E (E = endpoint delay);
- in step k it posts its receives when it sends; a receive completes at the
  later of the message's arrival and the post;
- when all its step-k receives are complete, it spends E, plus the reduction
  delay R(bytes) if step k reduces, then sends step k+1 (or finishes).

So member i finishes at recv_K(i) + E + R_K. The closed form needs only
`message_delay(src, dst, bytes)` and is exact for contention-free networks;
the message-level executor goes through `NetworkModel.send` and is what
congestion-aware backends get. A property test checks they agree.
"""

from __future__ import annotations

from typing import Callable, Sequence

from chakra_core.system.algorithms import StepSchedule


def closed_form_finishes(schedule: StepSchedule, members: Sequence[int], starts: Sequence[int],
                         delay: Callable[[int, int, int], int], endpoint_delay: int,
                         reduce_delay: Callable[[int], int]) -> list[int]:
    """Finish time of each member (aligned with `members`) on a contention-free network."""
    n = schedule.n
    step_bytes, reduces, send_to = schedule.step_bytes, schedule.reduces, schedule.send_to
    extra = [endpoint_delay + (reduce_delay(b) if r else 0) for b, r in zip(step_bytes, reduces)]
    if schedule.uniform:
        uniform_delays = _uniform_ring_delays(schedule, members, delay)
        if uniform_delays is not None and min(starts) == max(starts):
            # Everyone starts together and every hop costs the same: all finish together.
            total = starts[0] + endpoint_delay
            for k, b in enumerate(step_bytes):
                total += uniform_delays[b] + extra[k]
            return [total] * n

    cache: dict[tuple[int, int, int], int] = {}

    def hop(i: int, j: int, b: int) -> int:
        key = (i, j, b)
        value = cache.get(key)
        if value is None:
            value = cache[key] = delay(members[i], members[j], b)
        return value

    send_t = [s + endpoint_delay for s in starts]
    for k, b in enumerate(step_bytes):
        recv_t = list(send_t)          # receives are posted when the member sends
        for i in range(n):
            t = send_t[i]
            for j in send_to(i, k):
                arrival = t + hop(i, j, b)
                if arrival > recv_t[j]:
                    recv_t[j] = arrival
        e = extra[k]
        send_t = [t + e for t in recv_t]
    return send_t


def _uniform_ring_delays(schedule: StepSchedule, members: Sequence[int],
                         delay: Callable[[int, int, int], int]) -> dict[int, int] | None:
    """{bytes: delay} if every member's hop costs the same for each message size, else None."""
    result: dict[int, int] = {}
    n = schedule.n
    for b in set(schedule.step_bytes):
        values = {delay(members[i], members[schedule.send_to(i, 0)[0]], b) for i in range(n)}
        if len(values) != 1:
            return None
        result[b] = values.pop()
    return result


class MessageLevelRun:
    """Runs a step schedule through `network.send`, member by member, as events.

    Members may start at different times; each progresses on its own.
    `on_member_done(pos, time)` is called when member `pos` finishes.
    """

    __slots__ = ("schedule", "members", "network", "scheduler", "endpoint_delay", "reduce_delay",
                 "on_member_done", "step", "posted", "arrived", "_receivers")

    def __init__(self, schedule: StepSchedule, members: Sequence[int], network, scheduler,
                 endpoint_delay: int, reduce_delay: Callable[[int], int],
                 on_member_done: Callable[[int, int], None]):
        self.schedule, self.members = schedule, list(members)
        self.network, self.scheduler = network, scheduler
        self.endpoint_delay, self.reduce_delay = endpoint_delay, reduce_delay
        self.on_member_done = on_member_done
        n = schedule.n
        self.step = [-1] * n                 # step each member is in (-1: not started)
        self.posted = [False] * n            # has member posted its receives for its step
        # arrived[pos][k]: messages of step k that reached pos; expected counts below
        self.arrived: list[dict[int, int]] = [dict() for _ in range(n)]
        self._receivers = self._expected_receives()

    def _expected_receives(self) -> list[list[int]]:
        schedule = self.schedule
        counts = [[0] * schedule.steps for _ in range(schedule.n)]
        for k in range(schedule.steps):
            for i in range(schedule.n):
                for j in schedule.send_to(i, k):
                    counts[j][k] += 1
        return counts

    def start(self, pos: int) -> None:
        """Member `pos` starts the run now."""
        self.scheduler.schedule(self.endpoint_delay, self._send_step, (pos, 0))

    def _send_step(self, arg: tuple[int, int]) -> None:
        pos, k = arg
        self.step[pos] = k
        size = self.schedule.step_bytes[k]
        src = self.members[pos]
        for peer in self.schedule.send_to(pos, k):
            self.network.send(src, self.members[peer], size, self._arrival, (peer, k))
        self.posted[pos] = True
        self._try_advance(pos)

    def _arrival(self, arg: tuple[int, int]) -> None:
        pos, k = arg
        got = self.arrived[pos]
        got[k] = got.get(k, 0) + 1
        self._try_advance(pos)

    def _try_advance(self, pos: int) -> None:
        k = self.step[pos]
        if k < 0 or not self.posted[pos]:
            return
        if self.arrived[pos].get(k, 0) < self._receivers[pos][k]:
            return
        self.posted[pos] = False
        self.arrived[pos].pop(k, None)
        size = self.schedule.step_bytes[k]
        wait = self.endpoint_delay + (self.reduce_delay(size) if self.schedule.reduces[k] else 0)
        if k + 1 < self.schedule.steps:
            self.scheduler.schedule(wait, self._send_step, (pos, k + 1))
        else:
            self.scheduler.schedule(wait, self._finish, pos)

    def _finish(self, pos: int) -> None:
        self.on_member_done(pos, self.scheduler.now)
