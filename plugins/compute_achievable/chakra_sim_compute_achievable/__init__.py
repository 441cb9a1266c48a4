"""Achievable-throughput compute model (`plugin: achievable`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chakra_core import hookimpl
from chakra_sim_compute_achievable.config import AchievableConfig
from chakra_sim_compute_achievable.model import AchievableCompute

if TYPE_CHECKING:
    from chakra_core.contract.registry import ComputeRegistry

__all__ = ["AchievableCompute", "AchievableConfig"]


@hookimpl
def chakra_sim_register_compute(registry: ComputeRegistry) -> None:
    registry.add(AchievableCompute)
