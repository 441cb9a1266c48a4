"""Congestion-unaware analytical network backend (`plugin: analytical`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chakra_core import hookimpl
from chakra_sim_network_analytical.model import AnalyticalNetwork, AnalyticalNetworkConfig

if TYPE_CHECKING:
    from chakra_core.contract.registry import NetworkRegistry

__all__ = ["AnalyticalNetwork", "AnalyticalNetworkConfig"]


@hookimpl
def chakra_sim_register_network(registry: NetworkRegistry) -> None:
    registry.add(AnalyticalNetwork)
