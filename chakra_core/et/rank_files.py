"""Writing the rank files PREFIX.<rank>.et of one trace: all of them, or none.

The files are written into a temporary folder next to the prefix (the same filesystem, so each
final rename is atomic), after the rank count was checked against the limit and the free inodes
of that filesystem; they move into place together at the end, Ctrl-C held back while they move.
Rank files of an earlier, larger trace under the same prefix (PREFIX.<r>.et or .et.gz for a rank
not written now) are removed in that same step: `run` and `analyze` never find a mix of two
traces. Any failure, Ctrl-C included, removes the temporary folder and leaves the previous files
as they were.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from types import TracebackType

from chakra_core._atomic import sigint_held
from chakra_core.errors import ChakraSimError
from chakra_core.limits import check_rank_count

_SPARE_INODES = 64
"""Inodes left free beyond the files written (temporary files, the folder itself)."""


def rank_path(prefix: str | os.PathLike[str], rank: int) -> Path:
    return Path(f"{os.fspath(prefix)}.{rank}.et")


def stale_rank_files(prefix: Path, keep: set[Path]) -> list[Path]:
    """PREFIX.<rank>.et / .et.gz files that are not in `keep`."""
    stale = []
    for suffix in (".et", ".et.gz"):
        for path in prefix.parent.glob(f"{prefix.name}.*{suffix}"):
            rank = path.name[len(prefix.name) + 1:-len(suffix)]
            if rank.isdigit() and path not in keep:
                stale.append(path)
    return sorted(stale)


class RankFiles:
    """The staging folder of one trace's rank files:

        with RankFiles(prefix, count=npus, what="--npus") as staged:
            for rank in ...:
                write_trace(staged.path(rank), meta, nodes)
            paths = staged.commit()
    """

    def __init__(self, prefix: str | os.PathLike[str], count: int | None = None, what: str = "ranks"):
        self.prefix = Path(prefix)
        folder = self.prefix.parent
        if count is not None:
            check_rank_count(count, what)
        self._made = [parent for parent in (folder, *folder.parents) if not parent.exists()]
        existing = folder.parents[len(self._made) - 1] if self._made else folder
        if count is not None and hasattr(os, "statvfs") and existing.is_dir():
            free = os.statvfs(existing).f_favail
            if 0 < free < count + _SPARE_INODES:   # 0: a filesystem that does not count them
                raise ChakraSimError(f"{folder}: {count:,} rank files need {count:,} inodes; the "
                                     f"filesystem has {free:,} free")
        folder.mkdir(parents=True, exist_ok=True)
        self._folder = Path(tempfile.mkdtemp(prefix=f".{self.prefix.name}.", suffix=".tmp", dir=folder))
        self._moves: list[tuple[Path, Path]] = []

    def path(self, rank: int, suffix: str = ".et") -> Path:
        """Where to write the rank's file now; it moves to PREFIX.<rank><suffix> on commit."""
        final = Path(f"{os.fspath(self.prefix)}.{rank}{suffix}")
        staged = self._folder / final.name
        self._moves.append((staged, final))
        return staged

    def commit(self) -> list[Path]:
        """Move every file into place and remove the stale ones; return the final paths."""
        finals = [final for _, final in self._moves]
        with sigint_held():
            for path in stale_rank_files(self.prefix, set(finals)):
                path.unlink(missing_ok=True)
            for staged, final in self._moves:
                os.replace(staged, final)
            self._moves = []
        return finals

    def __enter__(self) -> "RankFiles":
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        shutil.rmtree(self._folder, ignore_errors=True)
        if self._moves or kind is not None:   # not committed: the folders made for it go too
            for made in self._made:
                try:
                    made.rmdir()
                except OSError:
                    break
