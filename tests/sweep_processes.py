"""What sweep tests and benchmarks/sweep_interrupt.py look at from outside a sweep: the processes it
started (read from /proc), its finished points, its table without the wall-time column, and the
example's traces gzip-compressed (so that every point's worker decompresses them into a temp folder).

Import it as `from tests.sweep_processes import ...` (the benchmark puts the repository on sys.path).
"""

from __future__ import annotations

import gzip
from pathlib import Path

TRACES = Path(__file__).resolve().parents[1] / "examples" / "traces" / "all_reduce_8npus_1MB"


def descendants(pid: int) -> set[int]:
    """Every process below `pid`, from each /proc/<pid>/stat's parent field."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def finished_points(out: Path) -> int:
    return len(list(out.glob("points/*/point.json")))


def table_without_wall(out: Path) -> bytes:
    """sweep.csv but its last column, wall_s: the only one that differs between runs."""
    lines = (out / "sweep.csv").read_bytes().splitlines(keepends=True)
    assert lines[0].rstrip().endswith(b",wall_s")
    return b"".join(line.rsplit(b",", 1)[0] + b"\n" for line in lines)


def gzip_traces(folder: Path) -> str:
    """The example's traces gzip-compressed into `folder` (created); their prefix."""
    folder.mkdir()
    for rank in range(8):
        data = (TRACES / f"all_reduce.{rank}.et").read_bytes()
        (folder / f"all_reduce.{rank}.et").write_bytes(gzip.compress(data, mtime=0))
    return str(folder / "all_reduce")
