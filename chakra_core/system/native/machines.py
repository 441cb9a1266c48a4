"""Member state machines of ASTRA-sim's native collective algorithms.

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
"""

from __future__ import annotations

from collections import deque
from math import log2
from typing import Any, Callable

from chakra_core.contract.algorithm import PhaseContext
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

    def __init__(self, ctx: PhaseContext, pos: int, schedule):
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

    def _finish(self, _arg=None) -> None:
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

    def on_receive(self, _arg=None) -> None:
        self.total_received += 1
        self.insert_packet()

    def on_general(self, _arg=None) -> None:
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

    def _bundle(self, arg) -> None:
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

    def on_general(self, _arg=None) -> None:
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


class DoubleBinaryTreeMember:
    """ASTRA-sim's double-binary-tree all-reduce: reduce up a binary tree, broadcast down.

    Chunks alternate between two trees (root = highest id, root = lowest id).
    Every message carries the whole chunk. ASTRA-sim runs this algorithm for
    any collective type (its all-reduce timing); so do we, for compatibility.
    """

    LEAF, INTERMEDIATE, ROOT = range(3)

    def __init__(self, ctx: PhaseContext, pos: int, data_size: int, parent: int,
                 left: int, right: int):
        self.ctx, self.io, self.pos = ctx, ctx.io, pos
        self.size = data_size
        self.parent, self.left, self.right = parent, left, right
        if parent < 0:
            self.kind = self.ROOT
        elif left < 0 and right < 0:
            self.kind = self.LEAF
        else:
            self.kind = self.INTERMEDIATE
        self.state = "begin"
        self.reductions = 0

    def _bundle(self, processed: bool) -> None:
        self.io.after(self.ctx.endpoint_delay, self._bundle_done, processed)

    def _bundle_done(self, processed: bool) -> None:
        if processed:
            self.io.after(self.ctx.reduce_delay(self.size), self.run, "general")
        else:
            self.run("general")

    def start(self) -> None:
        self.run("init")

    def _received(self, _arg=None) -> None:
        self.run("received")

    def run(self, event: str) -> None:
        io, kind, state = self.io, self.kind, self.state
        if kind == self.LEAF:
            if state == "begin":
                self._bundle(False)
                self.state = "sending_to_parent"
            elif state == "sending_to_parent":
                io.send(self.pos, self.parent, self.size)
                io.recv(self.pos, self.parent, self._received, None)
                self.state = "waiting_parent"
            elif state == "waiting_parent":
                self._bundle(False)
                self.state = "end"
            elif state == "end":
                io.finish(self.pos)
                self.state = "done"
        elif kind == self.INTERMEDIATE:
            if state == "begin":
                self.state = "waiting_two"
                io.recv(self.pos, self.left, self._received, None)
                io.recv(self.pos, self.right, self._received, None)
            elif state == "waiting_two" and event == "received":
                self._bundle(True)
                self.state = "waiting_one"
            elif state == "waiting_one" and event == "received":
                self._bundle(True)
                self.state = "sending_to_parent"
            elif self.reductions < 1 and event == "general":
                self.reductions += 1
            elif state == "sending_to_parent":
                self.state = "waiting_parent"
                io.send(self.pos, self.parent, self.size)
                io.recv(self.pos, self.parent, self._received, None)
            elif state == "waiting_parent" and event == "received":
                self._bundle(True)
                self.state = "sending_to_children"
            elif state == "sending_to_children":
                io.send(self.pos, self.left, self.size)
                io.send(self.pos, self.right, self.size)
                io.finish(self.pos)
                self.state = "done"
        else:  # root: one child
            child = self.left if self.left >= 0 else self.right
            if state == "begin":
                self.state = "waiting_one"
                io.recv(self.pos, child, self._received, None)
            elif state == "waiting_one":
                self._bundle(True)
                self.state = "sending_to_children"
            elif state == "sending_to_children":
                io.send(self.pos, child, self.size)
                io.finish(self.pos)
                self.state = "done"


def binary_tree(count: int, root_max: bool) -> dict[int, tuple[int, int, int]]:
    """ASTRA-sim's BinaryTree over positions 0..count-1: {pos: (parent, left, right)}, -1 = none.

    A full tree of depth d-1 hangs off a root that has one child; positions are
    assigned in-order, so the root gets the highest position (root_max) or the lowest.
    """
    depth, tmp = 1, count
    while tmp > 1:
        depth += 1
        tmp //= 2
    nodes: list[list[int]] = []   # [parent, left, right] by node index

    def make(parent: int, levels: int) -> int:
        index = len(nodes)
        nodes.append([parent, -1, -1])
        if levels > 1:
            nodes[index][1] = make(index, levels - 1)
            nodes[index][2] = make(index, levels - 1)
        return index

    root = len(nodes)
    nodes.append([-1, -1, -1])
    child = make(root, depth - 1)
    nodes[root][2 if not root_max else 1] = child
    position: dict[int, int] = {}
    counter = 0

    def in_order(index: int) -> None:
        nonlocal counter
        _, left, right = nodes[index]
        if left >= 0:
            in_order(left)
        position[index] = counter
        counter += 1
        if right >= 0:
            in_order(right)

    in_order(root)
    tree = {}
    for index, (parent, left, right) in enumerate(nodes):
        tree[position[index]] = (position[parent] if parent >= 0 else -1,
                                 position[left] if left >= 0 else -1,
                                 position[right] if right >= 0 else -1)
    return tree


class RootedMember:
    """Rooted collectives (broadcast, reduce, gather, scatter), which ASTRA-sim does not run.

    `chain` passes data along the ring from (broadcast, scatter) or towards
    (reduce, gather) the root; `star` sends directly between the root and
    every member. Same cost rules as the other algorithms: a message costs
    the endpoint delay at each end, and a reduced one the reduction delay.
    Sizes: broadcast and reduce move the whole buffer; gather and scatter move
    `piece` bytes per member (accumulated or split along a chain).

    A member's part ends when its last message has been delivered, not when
    it was posted: otherwise the next chunk (or the next collective) would put
    its bytes on the same link at once, and on a contention-free network N
    back-to-back broadcasts would cost hardly more than one.
    """

    def __init__(self, ctx: PhaseContext, pos: int, comm_type: int, piece: int, root: int, star: bool):
        self.ctx, self.io, self.pos = ctx, ctx.io, pos
        self.comm_type, self.piece, self.root, self.star = comm_type, piece, root, star
        n = ctx.n
        self.rel = (pos - root) % n            # distance from the root along the ring
        self.outward = comm_type in (pb.BROADCAST, pb.SCATTER)
        self.reduces = comm_type == pb.REDUCE
        self.pending = 0

    def _member(self, rel: int) -> int:
        return (self.root + rel) % self.ctx.n

    def _size(self, rel_sender: int) -> int:
        """Bytes a chain message sent by the member at distance rel_sender carries."""
        n = self.ctx.n
        if self.comm_type == pb.GATHER:
            return self.piece * (n - rel_sender)
        if self.comm_type == pb.SCATTER:
            return self.piece * (n - 1 - rel_sender)
        return self.piece

    def start(self) -> None:
        n, io, E = self.ctx.n, self.io, self.ctx.endpoint_delay
        if self.star:
            if self.rel == 0:
                if self.outward:
                    io.after(E, self._star_send)
                else:
                    self.pending = n - 1
                    for rel in range(1, n):
                        io.recv(self.pos, self._member(rel), self._processed, None)
            elif self.outward:
                io.recv(self.pos, self.root, self._processed, None)
                self.pending = 1
            else:
                io.after(E, self._send_and_finish, self.root)
            return
        if self.outward:
            if self.rel == 0:
                io.after(E, self._send_and_finish, self._member(1))
            else:
                self.pending = 1
                io.recv(self.pos, self._member(self.rel - 1), self._processed, None)
        else:
            if self.rel == n - 1:
                io.after(E, self._send_and_finish, self._member(n - 2))
            else:
                self.pending = 1
                io.recv(self.pos, self._member(self.rel + 1), self._processed, None)

    def _star_send(self, _arg=None) -> None:
        self.pending = self.ctx.n - 1
        for rel in range(1, self.ctx.n):
            self.io.send(self.pos, self._member(rel), self.piece, self._delivered)

    def _send_and_finish(self, dst: int) -> None:
        self.pending = 1
        self.io.send(self.pos, dst, self.piece if self.star else self._size(self.rel), self._delivered)

    def _delivered(self, _arg=None) -> None:
        self.pending -= 1
        if not self.pending:
            self.io.finish(self.pos)

    def _processed(self, _arg=None) -> None:
        delay = self.ctx.endpoint_delay
        if self.reduces:
            delay += self.ctx.reduce_delay(self.piece)
        self.io.after(delay, self._after_receive)

    def _after_receive(self, _arg=None) -> None:
        self.pending -= 1
        if self.pending:
            return
        n = self.ctx.n
        if self.star or (self.outward and self.rel == n - 1) or (not self.outward and self.rel == 0):
            self.io.finish(self.pos)
        elif self.outward:
            self._send_and_finish(self._member(self.rel + 1))
        else:
            self._send_and_finish(self._member(self.rel - 1))
