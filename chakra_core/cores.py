"""The cores this process may run on: what its default worker counts start from.

`os.cpu_count()` counts the machine's cores; a process confined to fewer (a container's cpuset,
a batch scheduler's allocation, `taskset`) may run on only those, and a pool sized by the machine
would put several workers on each of them. Linux says which through the process's affinity;
elsewhere the machine's count is all there is.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """How many cores this process may run on (at least 1)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1
