"""Closed-form timing on claimed links: the bookkeeping both link models share.

Where a link carries the messages of one sender only, a FIFO queue serves
them in the order that sender sent them, and a max-min fair link gives each
the whole link while they do not overlap: their times need no events. The
system layer `claim`s a collective's links (each remembers the one sender that
may use it this way), then has the link model time its messages at once
(`transfer`, `transfer_uniform`: FifoLinks and FairClosedForm). Message-by-
message traffic on such a link while closed-form traffic is still pending on
it would have to be served in between; that cannot happen after the fact, so
the links report it (`on_shared`) and the network asks for a restart knowing
the link is shared (see CongestionNetwork).
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterable, Protocol


class LinkStats:
    __slots__ = ("bytes", "busy", "peak", "messages")

    def __init__(self, count: int) -> None:
        self.bytes = [0] * count
        self.busy = [0.0] * count
        self.peak = [0] * count
        self.messages = [0] * count


_Saved = tuple[float, int, float, int, int, float, float, "deque[float] | None"]
"""A link's state as the journal saved it: free_at, bytes, busy, messages, peak, cf_last, cf_until,
cf_departs (ClaimedLinks._note)."""

FREE, SHARED = -1, -2
"""`ClaimedLinks.owner` values besides a sender's NPU number."""

GROUP_BASE = 1 << 40
"""`owner` of links claimed for a collective's flows: GROUP_BASE + the claim's number."""


class SharedLinkHint:
    """What a restarted run learned: these links carry more than one sender's traffic."""

    def __init__(self, links: frozenset[int]) -> None:
        self.links = links


class _Steps(Protocol):
    """A link model's timing of claimed collectives as steps (FlowSteps, FifoSteps): rolled back
    with the links."""

    def checkpoint(self) -> None: ...

    def rollback(self) -> None: ...

    def commit(self) -> None: ...


class ClaimedLinks:
    """Claims, the closed-form state of every link, and a journal to roll it back."""

    flow_steps: _Steps | None

    def __init__(self, count: int, shared: Iterable[int], on_shared: Callable[[frozenset[int]], None] | None,
                 stats: LinkStats | None = None) -> None:
        self.on_shared = on_shared or (lambda links: None)
        """Told when closed-form traffic was timed on links that turn out to carry other traffic
        (or to serve it out of order): what was timed is wrong and the run must start over."""
        self.stats = stats or LinkStats(count)
        self.free_at: list[float] = [0] * count    # ints when storing and forwarding
        # The one sender whose closed-form messages a link carries (FREE, SHARED), claims not yet
        # timed, when the last closed-form message leaves it, where that message arrived at it,
        # and when the closed-form messages still on it leave.
        self.owner = [FREE] * count
        for link in shared:
            self.owner[link] = SHARED
        self.pending = [0] * count
        self.cf_until: list[float] = [0] * count
        self.cf_last: list[float] = [0] * count
        self.cf_departs: dict[int, deque[float]] = {}
        self._journal: dict[int, _Saved] | None = None
        self.flow_steps = None      # once a collective is claimed as steps (claim_group)
        self._groups = 0

    def _share(self, link: int, now: int) -> None:
        """From now on `link` carries message-by-message traffic too. Closed-form traffic still
        to come on it would have been served in between: that run must start over."""
        if self.owner[link] >= 0 and (self.pending[link] or self.cf_until[link] > now):
            self.on_shared(frozenset({link}))
        self.owner[link] = SHARED

    def claim(self, routes: Iterable[tuple[int, tuple[int, ...]]]) -> list[int] | None:
        """Claim the links of (sender, route) pairs for closed-form messages; the claimed links,
        or None (nothing claimed) when a link is shared or another sender's."""
        owner = self.owner
        wanted: dict[int, int] = {}
        for sender, route in routes:
            for link in route:
                holder = wanted.setdefault(link, sender)
                if holder != sender or owner[link] == SHARED or (owner[link] >= 0 and owner[link] != sender):
                    return None
        for link, sender in wanted.items():
            owner[link] = sender
            self.pending[link] += 1
        return list(wanted)

    def _grant_group(self, links: list[int]) -> list[int]:
        """Claim `links` for one collective's steps (their checks passed): a token above every
        sender's NPU number as their owner."""
        token = GROUP_BASE + self._groups
        self._groups += 1
        owner, pending = self.owner, self.pending
        for link in links:
            owner[link] = token
            pending[link] += 1
        return links

    def release(self, links: Iterable[int]) -> None:
        """A claim's messages are all timed."""
        for link in links:
            self.pending[link] -= 1

    def checkpoint(self) -> None:
        """Remember every link's state as first changed from now on, until rollback/commit."""
        self._journal = {}
        if self.flow_steps is not None:
            self.flow_steps.checkpoint()

    def _note(self, link: int) -> None:
        journal = self._journal
        if journal is not None and link not in journal:
            stats = self.stats
            departs = self.cf_departs.get(link)
            journal[link] = (self.free_at[link], stats.bytes[link], stats.busy[link], stats.messages[link],
                             stats.peak[link], self.cf_last[link], self.cf_until[link],
                             None if departs is None else deque(departs))

    def rollback(self) -> None:
        stats = self.stats
        for link, saved in (self._journal or {}).items():
            (self.free_at[link], stats.bytes[link], stats.busy[link], stats.messages[link],
             stats.peak[link], self.cf_last[link], self.cf_until[link], departs) = saved
            if departs is None:
                self.cf_departs.pop(link, None)
            else:
                self.cf_departs[link] = departs
        self._journal = None
        if self.flow_steps is not None:
            self.flow_steps.rollback()

    def commit(self) -> None:
        self._journal = None
        if self.flow_steps is not None:
            self.flow_steps.commit()
