"""One writer per output folder: an flock on a lock file inside it (a sweep's, a plan's, a run's).

The kernel drops an flock when the process holding it exits, however it exits
(kill -9 included), so a lock is never stale: a lock file left by a killed run
is simply locked again by the next one. While the lock is held the file names
the holder (its pid and command line) for the message a second writer gets.
Released cleanly, the file is removed; a writer that opens it just before the
removal finds, once it holds the lock, that the path now names another file (or
none) and tries again, so two writers never both hold "the" lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from pathlib import Path
from types import TracebackType

from chakra_core.errors import ChakraSimError

LOCK_NAME = ".chakra-sim.lock"


class OutputLockedError(ChakraSimError):
    """Another process is writing the same output folder."""


class OutputLock:
    """Hold `folder`'s lock for the duration of a `with` block; raise OutputLockedError at once
    when another process holds it."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.path = folder / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise OutputLockedError(
                    f"output folder {self.folder} is in use by another run ({holder}); wait for it to "
                    "finish or give another output folder") from None
            except BaseException:
                os.close(fd)
                raise
            if _same_file(fd, self.path):
                break
            os.close(fd)   # the holder removed it as we opened it: lock the file now at the path
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {' '.join(sys.argv) or sys.executable}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        # Removed while still locked, so no writer can lock this file after it is gone.
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self._fd)
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __del__(self) -> None:   # a caller that drops its RunConfig lets the folder go
        self.release()

    def __enter__(self) -> "OutputLock":
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        named = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _read_holder(fd: int) -> str:
    """'process 1234: chakra-sim sweep big.yaml', or what can be said without the file's text."""
    try:
        text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    pid, _, command = text.partition(" ")
    if not pid.isdigit():   # locked a moment ago, not yet written
        return "a process that has just started"
    return f"process {pid}: {command}" if command else f"process {pid}"
