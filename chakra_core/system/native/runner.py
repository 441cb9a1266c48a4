"""Running one phase's member state machines: in isolation, or on the real network.

An algorithm's members (see `chakra_core.system.native.machines`,
`tree_machines` and `rooted_machines`) talk to the world
through a `PhaseIO`: send a message, post a receive, wait, finish. Two
implementations:

- `IsolatedPhase`: for contention-free networks. When the last member has
  started, the whole phase is simulated on a private event heap using
  `message_delay`, and each member's finish time comes back. A phase's
  timing depends only on its members' start times then, so this is exact,
  and it keeps the global event queue free of per-message events.
- `NetworkPhase`: messages go through `NetworkModel.send` and the global
  scheduler, for backends where traffic contends.

Both follow ASTRA-sim's frontend semantics: a send completes when its message
arrives; a receive completes at the later of the arrival and the post;
messages between the same two members match in order. A member that must not
move on before its own message is delivered (a rooted collective's sender)
passes `delivered` to `send`.
"""

from __future__ import annotations

from heapq import heappop, heappush
from itertools import count
from typing import Any, Callable, Sequence

from chakra_core.contract.inputs import Scheduler
from chakra_core.contract.network import NetworkModel

_Callback = Callable[[Any], None]


class PhaseIO:
    """What a member state machine may do. `pos` is a member's position in the phase.

    Subclasses provide time (`now`, `after`), message injection (`send`, which
    must call `_arrive((src, dst, size))` on delivery, or `_arrive_then` when
    the sender asked to hear of it) and `finish`; matching of messages to
    receives, and counting bytes sent and received per member, are shared.
    """

    _mail: _Mailboxes
    bytes_sent: list[int]
    bytes_received: list[int]

    def send(self, src: int, dst: int, size: int,
             delivered: Callable[[Any], None] | None = None) -> None:
        """Send `size` bytes; call `delivered(None)` (if given) once they have arrived at `dst`."""
        raise NotImplementedError

    def after(self, delay: int, callback: Callable[[Any], None], arg: Any = None) -> None:
        raise NotImplementedError

    def finish(self, pos: int) -> None:
        raise NotImplementedError

    def recv(self, dst: int, src: int, callback: Callable[[Any], None], arg: Any) -> None:
        """Post a receive at `dst` for the next message from `src`; call callback(arg) when it completes."""
        if self._mail.on_post((src, dst), callback, arg):
            self.after(0, callback, arg)   # already arrived: complete in a fresh event, now

    def _arrive(self, message: tuple[int, int, int]) -> None:
        src, dst, size = message
        self.bytes_received[dst] += size
        matched = self._mail.on_arrival((src, dst))
        if matched is not None:
            callback, arg = matched
            callback(arg)

    def _arrive_then(self, arg: tuple[tuple[int, int, int], Callable[[Any], None]]) -> None:
        message, delivered = arg
        self._arrive(message)
        delivered(None)


class _Mailboxes:
    """Per (src, dst) FIFO matching of arrived messages and posted receives.

    Posted receives are kept in short lists (usually one entry): a deque per
    pair costs ~600 bytes, which an all-to-all on 1,000 NPUs multiplies by a million.
    """

    __slots__ = ("arrived", "posted")

    def __init__(self) -> None:
        self.arrived: dict[tuple[int, int], int] = {}
        self.posted: dict[tuple[int, int], list[tuple[_Callback, Any]]] = {}

    def on_arrival(self, key: tuple[int, int]) -> tuple[_Callback, Any] | None:
        waiting = self.posted.get(key)
        if waiting:
            entry = waiting.pop(0)
            if not waiting:
                del self.posted[key]
            return entry
        self.arrived[key] = self.arrived.get(key, 0) + 1
        return None

    def on_post(self, key: tuple[int, int], callback: _Callback, arg: Any) -> bool:
        """True if a message was already there (the receive completes now)."""
        waiting = self.arrived.get(key, 0)
        if waiting:
            if waiting == 1:
                del self.arrived[key]
            else:
                self.arrived[key] = waiting - 1
            return True
        posted = self.posted.get(key)
        if posted is None:
            self.posted[key] = [(callback, arg)]
        else:
            posted.append((callback, arg))
        return False


class IsolatedPhase(PhaseIO):
    """Simulate a phase alone, on a private heap (contention-free networks)."""

    def __init__(self, ranks: Sequence[int], delay: Callable[[int, int, int], int],
                 record_pairs: bool = False):
        self.ranks = ranks
        self.delay = delay
        self.pairs: set[tuple[int, int]] | None = set() if record_pairs else None
        """(sender, receiver) positions of every message, with record_pairs."""
        self.now = 0
        self._heap: list[tuple[int, int, _Callback, Any]] = []
        self._seq = count()
        self._mail = _Mailboxes()
        self.finishes: dict[int, int] = {}
        self.bytes_sent = [0] * len(ranks)
        self.bytes_received = [0] * len(ranks)

    def after(self, delay: int, callback: _Callback, arg: Any = None) -> None:
        heappush(self._heap, (self.now + delay, next(self._seq), callback, arg))

    def send(self, src: int, dst: int, size: int, delivered: _Callback | None = None) -> None:
        self.bytes_sent[src] += size
        if self.pairs is not None:
            self.pairs.add((src, dst))
        delay = self.delay(self.ranks[src], self.ranks[dst], size)
        if delivered is None:
            self.after(delay, self._arrive, (src, dst, size))
        else:
            self.after(delay, self._arrive_then, ((src, dst, size), delivered))

    def finish(self, pos: int) -> None:
        self.finishes[pos] = self.now

    def release(self) -> None:
        """Drop references to the members (their callbacks) so no reference cycle outlives the run."""
        self._mail = _Mailboxes()
        self._heap.clear()

    def run(self, starts: Sequence[int], start_member: Callable[[int], None]) -> dict[int, int]:
        """Start member i at starts[i]; run to the end; return {position: finish time}."""
        for pos in sorted(range(len(starts)), key=lambda p: (starts[p], p)):
            heappush(self._heap, (starts[pos], next(self._seq), start_member, pos))
        heap = self._heap
        while heap:
            time, _, callback, arg = heappop(heap)
            self.now = time
            callback(arg)
        return self.finishes


class NetworkPhase(PhaseIO):
    """Run a phase on the global scheduler through the network backend."""

    def __init__(self, ranks: Sequence[int], network: NetworkModel, scheduler: Scheduler,
                 on_finish: Callable[[int], None]):
        self.ranks, self.network, self.scheduler = ranks, network, scheduler
        self._on_finish = on_finish
        self._mail = _Mailboxes()
        self.bytes_sent = [0] * len(ranks)
        self.bytes_received = [0] * len(ranks)

    @property
    def now(self) -> int:
        return self.scheduler.now

    def after(self, delay: int, callback: _Callback, arg: Any = None) -> None:
        self.scheduler.schedule(delay, callback, arg)

    def send(self, src: int, dst: int, size: int, delivered: _Callback | None = None) -> None:
        self.bytes_sent[src] += size
        if delivered is None:
            self.network.send(self.ranks[src], self.ranks[dst], size, self._arrive, (src, dst, size))
        else:
            self.network.send(self.ranks[src], self.ranks[dst], size, self._arrive_then,
                              ((src, dst, size), delivered))

    def finish(self, pos: int) -> None:
        self._on_finish(pos)
