"""Roofline compute model (`plugin: roofline`)."""

from __future__ import annotations

from chakra_core import hookimpl
from chakra_sim_compute_roofline.model import RooflineCompute, RooflineConfig

__all__ = ["RooflineCompute", "RooflineConfig"]


@hookimpl
def chakra_sim_register_compute(registry):
    registry.add(RooflineCompute)
