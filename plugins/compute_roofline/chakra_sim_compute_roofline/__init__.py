"""Roofline compute model (`plugin: roofline`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chakra_core import hookimpl
from chakra_sim_compute_roofline.model import RooflineCompute, RooflineConfig

if TYPE_CHECKING:
    from chakra_core.contract.registry import ComputeRegistry

__all__ = ["RooflineCompute", "RooflineConfig"]


@hookimpl
def chakra_sim_register_compute(registry: ComputeRegistry) -> None:
    registry.add(RooflineCompute)
