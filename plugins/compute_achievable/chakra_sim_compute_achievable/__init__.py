"""Achievable-throughput compute model (`plugin: achievable`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chakra_core import hookimpl
from chakra_sim_compute_achievable.config import AchievableConfig
from chakra_sim_compute_achievable.model import AchievableCompute
from chakra_sim_compute_achievable.section import KEY, AchievableSpec, AttentionCurve, below_peak, measured_for

if TYPE_CHECKING:
    from chakra_core.contract.registry import ComputeRegistry, ProfileSectionRegistry

__all__ = ["AchievableCompute", "AchievableConfig", "AchievableSpec", "AttentionCurve"]


@hookimpl
def chakra_sim_register_compute(registry: ComputeRegistry) -> None:
    registry.add(AchievableCompute)


@hookimpl
def chakra_sim_register_profile_sections(registry: ProfileSectionRegistry) -> None:
    registry.add(KEY, AchievableSpec, check=below_peak, rates=measured_for)
