"""Member state machines of ASTRA-sim's native collective algorithms: the ring family
(ring, direct, halving-doubling, which share `RingMember`'s packet pipeline) and the
generic `StepMember` that runs any `StepSchedule`.

Each class reproduces, behaviourally, one algorithm of ASTRA-sim's system
layer (astra-sim/system/astraccl/native_collectives, MIT licence): its step
counts, message sizes, which received messages are reduced, and its packet
pipeline (a received message costs the endpoint delay, plus the reduction
delay when it is reduced, before it can be forwarded). Matching those
mechanics is what lets ASTRA-sim's users get its numbers here; comments say
where a rule comes from.

A member talks only to its `PhaseIO` (runner.py). `ctx` holds what all
members of a phase share: the I/O, the number of members, the endpoint delay
(`E`) and the reduction delay function.

The double binary tree is in tree_machines.py, the rooted collectives (which
ASTRA-sim does not run) in rooted_machines.py.
"""

from __future__ import annotations

from collections import deque
from math import log2

from chakra_core.contract.algorithm import PhaseContext, StepSchedule
from chakra_core.schema import pb

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL = (
    pb.ALL_REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.ALL_TO_ALL)


class _Packet:
    __slots__ = ("dest", "src", "size")

    def __init__(self, dest: int, src: int, size: int):
        self.dest, self.src, self.size = dest, src, size


class StepMember:
    """Generic member for any `StepSchedule` (symmetric synchronous steps).

    Sends step k's messages E after the previous step completed (or after its
    start), completes step k when all its step-k messages have arrived, then
    spends E (+ the reduction delay if step k reduces). Algorithms that only
    define `step_schedule` run with these members on any network.
    """

    def __init__(self, ctx: PhaseContext, pos: int, schedule: StepSchedule):
        self.ctx, self.io, self.pos, self.schedule = ctx, ctx.io, pos, schedule
        n, steps = schedule.n, schedule.steps
        # incoming[k]: the member sending each message this member receives in step k
        self.incoming = [[i for i in range(n) for _ in range(schedule.send_to(i, k).count(pos))]
                         for k in range(steps)]
        self.arrived = [0] * steps
        self.step = -1

    def start(self) -> None:
        if self.schedule.steps == 0:
            self.io.finish(self.pos)
            return
        self.io.after(self.ctx.endpoint_delay, self._send, 0)

    def _send(self, k: int) -> None:
        self.step = k
        size = self.schedule.step_bytes[k]
        for peer in self.schedule.send_to(self.pos, k):
            self.io.send(self.pos, peer, size)
        for sender in self.incoming[k]:
            self.io.recv(self.pos, sender, self._arrive, k)
        self._check(k)

    def _arrive(self, k: int) -> None:
        self.arrived[k] += 1
        self._check(k)

    def _check(self, k: int) -> None:
        if self.step != k or self.arrived[k] < len(self.incoming[k]):
            return
        self.step = -2 - k  # step k complete; ignore further checks
        wait = self.ctx.endpoint_delay
        if self.schedule.reduces[k]:
            wait += self.ctx.reduce_delay(self.schedule.step_bytes[k])
        if k + 1 < self.schedule.steps:
            self.io.after(wait, self._send, k + 1)
        else:
            self.io.after(wait, self._finish)

    def _finish(self, _arg: object = None) -> None:
        self.io.finish(self.pos)


class RingMember:
    """ASTRA-sim's Ring: one message in flight per member, forwarded on receipt.

    The first message of a round is injected locally ("zero latency"); the
    next n-1 come from the ring and, in reduce-scatter and the first round of
    all-reduce, are reduced before being forwarded.
    """

    def __init__(self, ctx: PhaseContext, pos: int, comm_type: int, data_size: int):
        self.ctx, self.io, self.pos, self.n = ctx, ctx.io, pos, ctx.n
        self.comm_type = comm_type
        n = self.n
        self.parallel_reduce = 1
        if comm_type == ALL_REDUCE:
            self.stream_count = 2 * (n - 1)
        elif comm_type == ALL_TO_ALL:
            self.stream_count = (n - 1) * n // 2
        else:
            self.stream_count = n - 1
        if comm_type in (ALL_REDUCE, REDUCE_SCATTER, ALL_TO_ALL):
            self.msg_size = data_size // n
        else:
            self.msg_size = data_size
        self.curr_receiver = self.receiver(pos)
        self.curr_sender = self.sender(pos)
        self.free_packets = 0
        self.zero_latency = 0
        self.non_zero_latency = 0
        self.toggle = False
        self.total_received = 0
        self.remained_per_message = 1
        self.packets: deque[_Packet] = deque()
        self.done = False

    # ring geometry (clockwise: position + 1)
    def receiver(self, pos: int) -> int:
        return (pos + 1) % self.n

    def sender(self, pos: int) -> int:
        return (pos - 1) % self.n

    def non_zero_latency_packets(self) -> int:
        return (self.n - 1) * self.parallel_reduce

    # events
    def start(self) -> None:
        for _ in range(self.parallel_reduce):
            self.insert_packet()

    def on_receive(self, _arg: object = None) -> None:
        self.total_received += 1
        self.insert_packet()

    def on_general(self, _arg: object = None) -> None:
        self.free_packets += 1
        self.ready()
        self.iteratable()

    # packet pipeline
    def insert_packet(self) -> None:
        if self.zero_latency == 0 and self.non_zero_latency == 0:
            self.zero_latency = self.parallel_reduce
            self.non_zero_latency = self.non_zero_latency_packets()
            self.toggle = not self.toggle
        packet = _Packet(self.curr_receiver, self.curr_sender, self.msg_size)
        self.packets.append(packet)
        if self.zero_latency > 0:
            processed = False
            self.zero_latency -= 1
        elif self.non_zero_latency > 0:
            processed = self.comm_type == REDUCE_SCATTER or (self.comm_type == ALL_REDUCE and self.toggle)
            self.non_zero_latency -= 1
        else:
            raise AssertionError("ring member injected a packet it has no budget for")
        self.process_max_count(processed)

    def process_max_count(self, processed: bool) -> None:
        self.release(processed, self.msg_size)

    def release(self, processed: bool, size: int) -> None:
        """PacketBundle: the endpoint (memory bus) delay, then the reduction if any, then General."""
        self.io.after(self.ctx.endpoint_delay, self._bundle, (processed, size))

    def _bundle(self, arg: tuple[bool, int]) -> None:
        processed, size = arg
        if processed:
            self.io.after(self.ctx.reduce_delay(size), self.on_general)
        else:
            self.on_general()

    def ready(self) -> bool:
        if not self.packets or self.stream_count == 0 or self.free_packets == 0:
            return False
        packet = self.packets.popleft()
        self.io.send(self.pos, packet.dest, self.send_size(packet))
        self.io.recv(self.pos, packet.src, self.on_receive, None)
        if self.remained_per_message > 0:
            self.remained_per_message -= 1
        if self.remained_per_message == 0 and self.stream_count > 0:
            self.stream_count -= 1
            if self.stream_count > 0:
                self.remained_per_message = 1
        self.free_packets -= 1
        return True

    def send_size(self, packet: _Packet) -> int:
        return self.msg_size

    def iteratable(self) -> None:
        if self.stream_count == 0 and self.free_packets == self.parallel_reduce and not self.done:
            self.done = True
            self.io.finish(self.pos)


class DirectMember(RingMember):
    """ASTRA-sim's "direct" (its AllToAll class): up to `window` messages in flight to distinct peers.

    All-reduce runs as a reduce-scatter to every peer, then, once all n-1
    pieces have arrived, an all-gather to every peer.
    """

    def __init__(self, ctx: PhaseContext, pos: int, comm_type: int, data_size: int, window: int = -1):
        super().__init__(ctx, pos, comm_type, data_size)
        n = self.n
        self.middle_point = n - 1
        self.parallel_reduce = n - 1 if window < 0 else min(window, n - 1)
        if comm_type == ALL_TO_ALL:
            self.stream_count = n - 1

    def non_zero_latency_packets(self) -> int:
        # ASTRA-sim: a network dimension receives one round per window, a group's ring all of them.
        if self.ctx.local:
            return (self.n - 1) * self.parallel_reduce
        return self.parallel_reduce

    def process_max_count(self, processed: bool) -> None:
        self.release(processed, self.msg_size)
        self.curr_receiver = self.receiver(self.curr_receiver)
        if self.curr_receiver == self.pos:
            self.curr_receiver = self.receiver(self.curr_receiver)
        self.curr_sender = self.sender(self.curr_sender)
        if self.curr_sender == self.pos:
            self.curr_sender = self.sender(self.curr_sender)

    def on_general(self, _arg: object = None) -> None:
        self.free_packets += 1
        if self.comm_type == ALL_REDUCE and self.stream_count <= self.middle_point:
            if self.total_received < self.middle_point:
                return
            for _ in range(self.parallel_reduce):
                self.ready()
        else:
            self.ready()
        self.iteratable()


class HalvingDoublingMember(RingMember):
    """ASTRA-sim's halving-doubling: log2(n) exchanges with partners at distance 1, 2, 4, ...

    Reduce-scatter halves the message each step; all-gather starts at distance
    n/2 with the whole chunk and doubles it; all-reduce does both.
    """

    rank_offset: float
    """Distance to the partner: an int until multiplied by `multiplier` (then a float)."""
    multiplier: float

    def __init__(self, ctx: PhaseContext, pos: int, comm_type: int, data_size: int):
        if comm_type == ALL_TO_ALL:
            raise ValueError("halving-doubling does not implement ALL_TO_ALL")
        super().__init__(ctx, pos, comm_type, data_size)
        n = self.n
        steps = int(log2(n))
        self.stream_count = 2 * steps if comm_type == ALL_REDUCE else steps
        if comm_type == ALL_GATHER:
            self.msg_size, self.rank_offset, self.multiplier = data_size, n // 2, 0.5
        else:
            self.msg_size, self.rank_offset, self.multiplier = data_size // 2, 1, 2.0
        self._set_partner()

    def _direction(self) -> int:
        if self.rank_offset == 0:
            return 1
        return 1 if (self.pos // self.rank_offset) % 2 == 0 else -1

    def _set_partner(self) -> None:
        partner = (self.pos + self._direction() * int(self.rank_offset)) % self.n
        self.curr_receiver = self.curr_sender = partner

    def non_zero_latency_packets(self) -> int:
        return int(log2(self.n)) - 1 * self.parallel_reduce

    def process_max_count(self, processed: bool) -> None:
        self.release(processed, self.msg_size)
        # The packet just queued keeps its size; the next one uses the new distance and size.
        self.rank_offset *= self.multiplier
        self.msg_size = int(self.msg_size / self.multiplier)
        if self.rank_offset == self.n and self.comm_type == ALL_REDUCE:
            self.multiplier = 0.5
            self.rank_offset *= self.multiplier
            self.msg_size = int(self.msg_size / self.multiplier)
        self._set_partner()

    def send_size(self, packet: _Packet) -> int:
        return packet.size
