"""Point-to-point messages: COMM_SEND / COMM_RECV matched by (src, dst, tag).

Semantics follow ASTRA-sim's analytical frontend: a send injects its message
when issued and completes when the message arrives at the destination; a
receive completes at the later of its post and the message's arrival. Sends
and receives with the same (src, dst, tag) match in issue order. A message
nobody receives is reported at the end of the run (rank, peer, tag, size); a
receive that never gets its message shows up in the deadlock report.

With the rendezvous protocol (ASTRA-sim's --rendezvous-protocol), a receive
first sends an 8 KiB control message to the sender; the data leaves only once
both the send is issued and that control message has arrived, so a send never
completes before its receiver is ready.

For the time breakdown, a receive waits for its peer until the matching send
is issued, and a rendezvous send until the matching receive is posted; after
that their time is network time.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Protocol

from chakra_core.errors import SimulationError
from chakra_core.et.attrs import NodeView


class P2PNetwork(Protocol):
    """What point-to-point messages travel through: a network layer, or a system layer's own
    timing (`npus_count`, `send`)."""

    npus_count: int

    def send(self, src: int, dst: int, size: int, on_arrival: Callable[[Any], None], arg: Any = None) -> None: ...


class P2PScheduler(Protocol):
    def schedule(self, delay: int, callback: Callable[[Any], None], arg: Any = None) -> None: ...


RENDEZVOUS_BYTES = 8192

Key = tuple[int, int, int]
"""(src, dst, tag): sends and receives with the same key match in order."""
Done = Callable[[int], None]


class PointToPoint:
    """Sends and receives of every rank, matched by (src, dst, tag) (see the module docstring)."""

    def __init__(self, network: P2PNetwork, scheduler: P2PScheduler, warn: Callable[[str], None], bytes_sent: list[int],
                 bytes_received: list[int], rendezvous: bool = False,
                 waiting: Callable[[int, int, bool], None] | None = None,
                 fold: Callable[[int, int, int], tuple[int, int]] | None = None):
        self.network, self.scheduler, self.warn = network, scheduler, warn
        self.fold = fold
        """Folded runs: (src, dst, size) -> the (src, dst) the message is matched as."""
        self.bytes_sent, self.bytes_received = bytes_sent, bytes_received
        self.waiting = waiting or (lambda rank, node_id, flag: None)
        # (src, dst, tag) -> sends issued that no receive has claimed yet (negative: receives
        # posted that no send has claimed), and the nodes waiting for their peer, in order.
        self._balance: dict[Key, int] = {}
        self._blocked: dict[Key, deque[tuple[int, int]]] = {}
        self.rendezvous = rendezvous
        # rendezvous: (src, dst, tag) -> control messages arrived at the sender / sends waiting
        self._clear_to_send: dict[Key, int] = {}
        self._held: dict[Key, deque[tuple[int, int, Done]]] = {}
        # (src, dst, tag) -> arrived messages [(size, send node id)]
        self._arrived: dict[Key, deque[tuple[int, int]]] = {}
        # (src, dst, tag) -> posted receives [(node id, size, done)]
        self._posted: dict[Key, deque[tuple[int, int, Done]]] = {}

    @staticmethod
    def _endpoints(rank: int, node: NodeView, sending: bool) -> tuple[int, int, int, int]:
        size = node.int("comm_size")
        tag = node.int("comm_tag", 0)
        if sending:
            src, dst = node.int("comm_src", rank), node.int("comm_dst")
            if src != rank:
                raise SimulationError(f"rank {rank}, COMM_SEND node {node.id}: comm_src is {src}; "
                                      "a send must be issued by its source rank")
        else:
            src, dst = node.int("comm_src"), node.int("comm_dst", rank)
            if dst != rank:
                raise SimulationError(f"rank {rank}, COMM_RECV node {node.id}: comm_dst is {dst}; "
                                      "a receive must be issued by its destination rank")
        return src, dst, tag, size

    def send(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        src, dst, tag, size = self._endpoints(rank, node, sending=True)
        if not 0 <= dst < self.network.npus_count or dst == src:
            raise SimulationError(f"rank {rank}, COMM_SEND node {node.id}: invalid destination {dst}")
        if self.fold is None:
            key = (src, dst, tag)
        else:   # the receive this send is matched with is its destination's representative's
            key = self.fold(src, dst, size) + (tag,)
        self._pair_up(key, +1, src, node.id)
        if self.rendezvous:
            cleared = self._clear_to_send.get(key, 0)
            if not cleared:
                self._held.setdefault(key, deque()).append((size, node.id, done))
                return
            self._clear_to_send[key] = cleared - 1
        self._inject(key, size, node.id, done, src, dst)

    def _inject(self, key: Key, size: int, send_id: int, done: Done, src: int | None = None,
                dst: int | None = None) -> None:
        src = key[0] if src is None else src
        self.bytes_sent[src] += size
        self.network.send(src, key[1] if dst is None else dst, size, self._arrive, (key, size, send_id, done))

    def _control_arrived(self, key: Key) -> None:
        self.bytes_received[key[0]] += RENDEZVOUS_BYTES
        held = self._held.get(key)
        if held:
            size, send_id, done = held.popleft()
            self._inject(key, size, send_id, done)
        else:
            self._clear_to_send[key] = self._clear_to_send.get(key, 0) + 1

    def _arrive(self, arg: tuple[Key, int, int, Done]) -> None:
        key, size, send_id, done = arg
        self.bytes_received[key[1]] += size
        done(send_id)
        posted = self._posted.get(key)
        if posted:
            recv_id, recv_size, recv_done = posted.popleft()
            self._check_size(key, size, recv_size, recv_id)
            recv_done(recv_id)
        else:
            self._arrived.setdefault(key, deque()).append((size, send_id))

    def recv(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        src, dst, tag, size = self._endpoints(rank, node, sending=False)
        key = (src, dst, tag)
        self._pair_up(key, -1, dst, node.id)
        if self.rendezvous:
            self.bytes_sent[dst] += RENDEZVOUS_BYTES
            self.network.send(dst, src, RENDEZVOUS_BYTES, self._control_arrived, key)
        arrived = self._arrived.get(key)
        if arrived:
            sent_size, _ = arrived.popleft()
            self._check_size(key, sent_size, size, node.id)
            # Complete in a fresh event at the same time, never inside the issuing call.
            self.scheduler.schedule(0, done, node.id)
        else:
            self._posted.setdefault(key, deque()).append((node.id, size, done))

    def _pair_up(self, key: Key, side: int, rank: int, node_id: int) -> None:
        """Time breakdown: release the oldest peer waiting on the other side, or wait (a receive,
        or a rendezvous send) until the other side is issued. `side` is +1 for a send, -1 for a
        receive."""
        balance = self._balance.get(key, 0)
        if balance * side < 0:     # the other side is ahead: pair with its oldest node
            blocked = self._blocked.get(key)
            if blocked:
                peer_rank, peer_node = blocked.popleft()
                self.waiting(peer_rank, peer_node, False)
        elif side < 0 or self.rendezvous:
            self._blocked.setdefault(key, deque()).append((rank, node_id))
            self.waiting(rank, node_id, True)
        self._balance[key] = balance + side

    def _check_size(self, key: Key, sent: int, expected: int, recv_id: int) -> None:
        if sent != expected:
            src, dst, tag = key
            self.warn(f"rank {dst}, COMM_RECV node {recv_id}: expects {expected} B from rank {src} "
                      f"(tag {tag}) but the matching send carries {sent} B")

    def waits(self, rank: int) -> list[str]:
        out = []
        for (src, dst, tag), held in self._held.items():
            if src == rank:
                for size, send_id, _ in held:
                    out.append(f"COMM_SEND node {send_id}: rendezvous send of {size} B to rank {dst} "
                               f"with tag {tag} waits for the receiver to post its receive")
        for (src, dst, tag), posted in self._posted.items():
            if dst == rank:
                for recv_id, size, _ in posted:
                    out.append(f"COMM_RECV node {recv_id}: waits for {size} B from rank {src} "
                               f"with tag {tag}; no matching send was issued")
        return out

    def warn_unmatched(self) -> None:
        """At the end of a run: a warning for every send nobody received."""
        for row in self.unmatched_sends():
            self.warn(f"rank {row['rank']}: COMM_SEND node {row['node']} of {row['size']} B "
                      f"to rank {row['peer']} (tag {row['tag']}) was never received")

    def unmatched_sends(self) -> list[dict[str, int]]:
        rows = []
        for (src, dst, tag), arrived in sorted(self._arrived.items()):
            for size, send_id in arrived:
                rows.append({"rank": src, "peer": dst, "tag": tag, "size": size, "node": send_id})
        return rows
