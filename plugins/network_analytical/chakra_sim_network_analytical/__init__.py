"""Congestion-unaware analytical network backend (`plugin: analytical`)."""

from __future__ import annotations

from chakra_core import hookimpl
from chakra_sim_network_analytical.model import AnalyticalNetwork, AnalyticalNetworkConfig

__all__ = ["AnalyticalNetwork", "AnalyticalNetworkConfig"]


@hookimpl
def chakra_sim_register_network(registry):
    registry.add(AnalyticalNetwork)
