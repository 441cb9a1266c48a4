"""The ranking of the layouts a plan has simulated so far: the step a layout must beat to enter
the top K (below it, a layout's bound still lets it in: it is simulated), and the standing the
plan says after each round, so that a long plan shows its table as it improves."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chakra_core.plan.search import Candidate


def standing(chosen: list[Candidate], top: int) -> str:
    """The ranking so far, said after each round: the fastest three, and where the `top` fastest
    end once that many are known."""
    # ties broken as Plan.ranked breaks them, so that the last standing is the table's order
    ranked = sorted((c for c in chosen if c.step_s is not None),
                    key=lambda c: (c.step_s, c.bound_s, c.memory.total, c.layout))
    if not ranked:
        return "  fastest so far: none (every layout simulated so far failed)"
    shown = "; ".join(f"{i + 1}. {c.layout.label()} {c.step_s:.3f} s" for i, c in enumerate(ranked[:3]))
    kth = f"; the {top} fastest end at {ranked[top - 1].step_s:.3f} s" if top > 3 and len(ranked) >= top else ""
    return f"  fastest so far: {shown}{kth}"


def kth_best(chosen: list[Candidate], top: int) -> float:
    """The `top`-th fastest step simulated so far (infinite until that many are known)."""
    return kth_smallest([c.step_s for c in chosen if c.step_s is not None], top)


def kth_smallest(values: list[float], top: int) -> float:
    """The `top`-th smallest of `values` (infinite when there are fewer)."""
    return sorted(values)[top - 1] if len(values) >= top else math.inf
