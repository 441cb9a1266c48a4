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

from chakra_core.contract.algorithm import StepSchedule

UniformCache = dict[tuple[int, int, int], tuple[Sequence[int], StepSchedule, int | None]]
"""`closed_form_finishes`' cache: (id(members), id(schedule), endpoint delay) -> (members,
schedule, duration of the run when all start together, None when its hops differ)."""


def closed_form_finishes(schedule: StepSchedule, members: Sequence[int], starts: Sequence[int],
                         delay: Callable[[int, int, int], int], endpoint_delay: int,
                         reduce_delay: Callable[[int], int], cache: UniformCache | None = None) -> list[int]:
    """Finish time of each member (aligned with `members`) on a contention-free network.

    `cache` (a dict the caller keeps for the whole run) remembers which rings have one delay
    for all their hops; `members` and `schedule` must then be objects the caller keeps alive,
    as their ids are the key.
    """
    n = schedule.n
    if schedule.uniform and min(starts) == max(starts):
        if cache is None:
            duration = _uniform_duration(schedule, members, delay, endpoint_delay, reduce_delay)
        else:
            key = (id(members), id(schedule), endpoint_delay)
            hit = cache.get(key)
            if hit is None or hit[0] is not members or hit[1] is not schedule:
                hit = cache[key] = (members, schedule, _uniform_duration(schedule, members, delay,
                                                                         endpoint_delay, reduce_delay))
            duration = hit[2]
        if duration is not None:
            # Everyone starts together and every hop costs the same: all finish together.
            return [starts[0] + duration] * n

    hops: dict[tuple[int, int, int], int] = {}

    def arrival(i: int, j: int, b: int, t: int) -> int:
        key = (i, j, b)
        value = hops.get(key)
        if value is None:
            value = hops[key] = delay(members[i], members[j], b)
        return t + value

    return _recurrence(schedule, starts, arrival, endpoint_delay, reduce_delay)


def closed_form_transfers(schedule: StepSchedule, members: Sequence[int], starts: Sequence[int],
                          transfer: Callable[[int, int, int, int], int], endpoint_delay: int,
                          reduce_delay: Callable[[int], int]) -> list[int]:
    """`closed_form_finishes` where a message's arrival depends on what went before it on its
    links: `transfer(src, dst, bytes, send_time)` times each message, in each sender's order."""
    return _recurrence(schedule, starts,
                       lambda i, j, b, t: transfer(members[i], members[j], b, t),
                       endpoint_delay, reduce_delay)


def flow_finishes(schedule: StepSchedule, members: Sequence[int], starts: Sequence[int],
                  transfer_flows: Callable[[Sequence[int], Sequence[int], int, Sequence[int]], list[int]],
                  endpoint_delay: int, reduce_delay: Callable[[int], int]) -> list[int]:
    """The step recurrence of the module docstring on a flow-level network: each step's messages
    are one set of flows (`FlowNetwork.transfer_flows`, which returns each position's receive
    completion). `schedule.offsets` must be given."""
    offsets = schedule.offsets
    assert offsets is not None
    send_t = [s + endpoint_delay for s in starts]
    for k, (b, reduces) in enumerate(zip(schedule.step_bytes, schedule.reduces)):
        recv_t = transfer_flows(members, offsets(k), b, send_t)
        extra = endpoint_delay + (reduce_delay(b) if reduces else 0)
        send_t = [t + extra for t in recv_t]
    return send_t


def _recurrence(schedule: StepSchedule, starts: Sequence[int], arrival: Callable[[int, int, int, int], int],
                endpoint_delay: int, reduce_delay: Callable[[int], int]) -> list[int]:
    """The step recurrence of the module docstring; `arrival(i, j, bytes, send_time)` is when
    the message from position i reaches position j."""
    n = schedule.n
    send_to = schedule.send_to
    send_t = [s + endpoint_delay for s in starts]
    for k, (b, reduces) in enumerate(zip(schedule.step_bytes, schedule.reduces)):
        recv_t = list(send_t)          # receives are posted when the member sends
        for i in range(n):
            t = send_t[i]
            for j in send_to(i, k):
                arrived = arrival(i, j, b, t)
                if arrived > recv_t[j]:
                    recv_t[j] = arrived
        extra = endpoint_delay + (reduce_delay(b) if reduces else 0)
        send_t = [t + extra for t in recv_t]
    return send_t


def uniform_send_times(schedule: StepSchedule, delays: dict[int, int], start: int, endpoint_delay: int,
                       reduce_delay: Callable[[int], int]) -> tuple[list[int], int]:
    """When every member sends each step of a uniform schedule, all starting at `start` with
    hops of `delays` ({bytes: delay}); and when they all finish."""
    send_times, t = [], start + endpoint_delay
    for b, reduces in zip(schedule.step_bytes, schedule.reduces):
        send_times.append(t)
        t += delays[b] + endpoint_delay + (reduce_delay(b) if reduces else 0)
    return send_times, t


def _uniform_duration(schedule: StepSchedule, members: Sequence[int], delay: Callable[[int, int, int], int],
                      endpoint_delay: int, reduce_delay: Callable[[int], int]) -> int | None:
    """How long a uniform schedule takes when all members start together and every hop of a
    message size costs the same; None when hops differ."""
    delays = uniform_delays(schedule, members, delay)
    if delays is None:
        return None
    return uniform_send_times(schedule, delays, 0, endpoint_delay, reduce_delay)[1]


def uniform_delays(schedule: StepSchedule, members: Sequence[int],
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
