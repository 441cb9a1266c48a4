"""SIGINT and SIGTERM during a sweep: an exception at a safe point, never a half-done step.

While a sweep runs, both signals raise `Interrupted` (a KeyboardInterrupt, so code that
already cleans up after Ctrl-C does so after SIGTERM too) in the main thread. Inside
`held()` — writing a point's files, starting or stopping a worker — the signal waits
until the block ends, so the sweep never stops with a point half recorded or a worker
started but not yet known to the pool (which would then be left running).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from types import FrameType
from typing import Any, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """The sweep was stopped by a signal; `exit_status` is the shell's 128 + its number."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_status = 128 + signum


class StopSignals:
    """Turn SIGINT and SIGTERM into `Interrupted` for the duration of a `with` block (main
    thread only: elsewhere handlers cannot be set, and the block does nothing)."""

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}
        self._depth = 0
        self._pending: int | None = None

    def install(self) -> None:
        """Set the handlers (again: ray.init replaces SIGTERM's)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            previous = signal.signal(signum, self._handle)
            if previous is not self._handle:
                self._previous.setdefault(signum, previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._depth:
            self._pending = self._pending or signum
        else:
            raise Interrupted(signum)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth and self._pending is not None:
                signum, self._pending = self._pending, None
                raise Interrupted(signum)

    def __enter__(self) -> "StopSignals":
        global _ACTIVE
        self.install()
        _ACTIVE = self
        return self

    def __exit__(self, *exc_info: object) -> None:
        global _ACTIVE
        _ACTIVE = None
        for signum, previous in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()


_ACTIVE: StopSignals | None = None


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM during the block, when a sweep's StopSignals is active."""
    if _ACTIVE is None:
        yield
    else:
        with _ACTIVE.held():
            yield


def reinstall() -> None:
    """Put the sweep's handlers back after a library replaced them."""
    if _ACTIVE is not None:
        _ACTIVE.install()
