"""What the plan found out about a layout."""

from __future__ import annotations

from enum import Enum


class LayoutStatus(str, Enum):
    """What the plan found out about a layout, written as its value in the table."""

    SIMULATED = "simulated"
    FAILED = "failed"
    PRUNED = "pruned"
    TOO_BIG = "does not fit"


SIMULATED, FAILED = LayoutStatus.SIMULATED, LayoutStatus.FAILED
PRUNED, TOO_BIG = LayoutStatus.PRUNED, LayoutStatus.TOO_BIG
