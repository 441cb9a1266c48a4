"""Congestion-aware, link-level network backend (`plugin: congestion`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chakra_core import hookimpl
from chakra_sim_network_congestion.model import CongestionConfig, CongestionNetwork

if TYPE_CHECKING:
    from chakra_core.contract.registry import NetworkRegistry

__all__ = ["CongestionConfig", "CongestionNetwork"]


@hookimpl
def chakra_sim_register_network(registry: NetworkRegistry) -> None:
    registry.add(CongestionNetwork)
