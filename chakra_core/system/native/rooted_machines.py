"""Member state machine of the rooted collectives (broadcast, reduce, gather, scatter).

ASTRA-sim does not run these; they follow the cost rules of the member state
machines that reproduce, behaviourally, ASTRA-sim's native collective
algorithms (astra-sim/system/astraccl/native_collectives, MIT licence; see
machines.py): a message costs the endpoint delay at each end, and a reduced
one the reduction delay.

A member talks only to its `PhaseIO` (runner.py); `ctx` holds what all
members of a phase share (see machines.py).
"""

from __future__ import annotations

from chakra_core.contract.algorithm import PhaseContext
from chakra_core.schema import pb


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

    def _star_send(self, _arg: object = None) -> None:
        self.pending = self.ctx.n - 1
        for rel in range(1, self.ctx.n):
            self.io.send(self.pos, self._member(rel), self.piece, self._delivered)

    def _send_and_finish(self, dst: int) -> None:
        self.pending = 1
        self.io.send(self.pos, dst, self.piece if self.star else self._size(self.rel), self._delivered)

    def _delivered(self, _arg: object = None) -> None:
        self.pending -= 1
        if not self.pending:
            self.io.finish(self.pos)

    def _processed(self, _arg: object = None) -> None:
        delay = self.ctx.endpoint_delay
        if self.reduces:
            delay += self.ctx.reduce_delay(self.piece)
        self.io.after(delay, self._after_receive)

    def _after_receive(self, _arg: object = None) -> None:
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
