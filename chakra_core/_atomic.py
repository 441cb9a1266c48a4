"""Atomic file output: results and traces are never left half-written.

Everything chakra-sim writes goes to a temporary file in the destination folder
first and is renamed over the target only once complete, so an interrupted run
(Ctrl-C, a crash, a full disk) leaves the previous file intact. `AtomicFiles`
does the same for a set of files that belong together (results.json,
results.csv, timeline.json, breakdown.png): all are written first, then all are renamed.

Temporary files come from `mkstemp`, which creates them with mode 0600; they
are given the permissions a plain `open()` would (0666 minus the umask) before
the rename, so outputs are as readable as any other file the user creates.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import IO, Any, Iterator


def _umask() -> int:
    # The only portable way to read the umask is to set it and put it back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _temp_sibling(target: Path) -> tuple[int, str]:
    """An open temporary file next to `target`, with the mode a new file would get."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.chmod(tmp_name, 0o666 & ~_umask())
    except BaseException:
        os.close(fd)
        os.unlink(tmp_name)
        raise
    return fd, tmp_name


@contextlib.contextmanager
def _written(fd: int, tmp_name: str, mode: str, encoding: str | None) -> Iterator[IO[Any]]:
    """Write through `fd` and flush it to disk; remove the temporary file on any failure."""
    try:
        with os.fdopen(fd, mode, encoding=encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], mode: str = "w", encoding: str | None = None) -> Iterator[IO[Any]]:
    """Open a temporary sibling of `path` for writing; rename it over `path` on success."""
    target = Path(path)
    fd, tmp_name = _temp_sibling(target)
    with _written(fd, tmp_name, mode, encoding) as handle:
        yield handle
    try:
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_output(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_output(path, "wb") as handle:
        handle.write(data)


class AtomicFiles:
    """Files that replace their targets together, once every one of them is written.

        with AtomicFiles() as files:
            files.write_text(out / "results.json", text)
            files.write_text(out / "results.csv", csv_text)
            files.write_bytes(out / "breakdown.png", png)
            files.commit()

    Leaving the block without `commit()` (an exception, Ctrl-C) removes the
    temporary files and leaves every target as it was. `commit()` holds Ctrl-C
    back while it renames, so the set is not left half old, half new; a Ctrl-C
    held back sets `interrupted` instead, for the caller to act on once done.
    """

    def __init__(self) -> None:
        self._staged: list[tuple[str, Path]] = []
        self.interrupted = False

    def write_text(self, path: str | os.PathLike[str], text: str) -> None:
        self._stage(path, "w", "utf-8", text)

    def write_bytes(self, path: str | os.PathLike[str], data: bytes) -> None:
        self._stage(path, "wb", None, data)

    def _stage(self, path: str | os.PathLike[str], mode: str, encoding: str | None, contents: str | bytes) -> None:
        with self.open(path, mode, encoding) as handle:
            handle.write(contents)

    @contextlib.contextmanager
    def open(self, path: str | os.PathLike[str], mode: str = "w", encoding: str | None = None) -> Iterator[IO[Any]]:
        """A handle to write one of the files through, for contents too large to hold at once."""
        target = Path(path)
        fd, tmp_name = _temp_sibling(target)
        self._staged.append((tmp_name, target))
        with _written(fd, tmp_name, mode, encoding) as handle:
            yield handle

    def commit(self) -> list[Path]:
        """Rename every staged file over its target; return the targets."""
        with sigint_held() as received:
            done = []
            for tmp_name, target in self._staged:
                os.replace(tmp_name, target)
                done.append(target)
            self._staged = []
        self.interrupted = bool(received)
        return done

    def discard(self) -> None:
        for tmp_name, _ in self._staged:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_name)
        self._staged = []

    def __enter__(self) -> "AtomicFiles":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.discard()


@contextlib.contextmanager
def sigint_held() -> Iterator[list[int]]:
    """Hold SIGINT during the block; yields the list it appends a held signal to."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received   # signal handlers can only be set from the main thread
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield received
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
