"""Congestion-aware, link-level network backend (`plugin: congestion`)."""

from __future__ import annotations

from chakra_core import hookimpl
from chakra_sim_network_congestion.model import CongestionConfig, CongestionNetwork

__all__ = ["CongestionConfig", "CongestionNetwork"]


@hookimpl
def chakra_sim_register_network(registry):
    registry.add(CongestionNetwork)
