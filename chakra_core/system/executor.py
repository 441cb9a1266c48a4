"""Timing a symmetric step schedule in closed form (contention-free networks).

The semantics are ASTRA-sim's for its ring (read from its Ring/PacketBundle/
MemBus code and checked against its numbers), the same as the member state
machines in machines.py execute message by message:

- a member that starts the run at time s sends its first messages at
  s + E (E = endpoint delay);
- in step k it posts its receives when it sends; a receive completes at the
  later of the message's arrival and the post;
- when all its step-k receives are complete, it spends E, plus the reduction
  delay R(bytes) if step k reduces, then sends step k+1 (or finishes).

So member i finishes at recv_K(i) + E + R_K. The closed form needs only
`message_delay(src, dst, bytes)` and is exact for contention-free networks;
property tests check it against the state machines run message by message.
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
