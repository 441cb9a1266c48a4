"""Packet-level network backend on ns-3 (`plugin: ns3`); needs `pip install ns3`.

Importing this package does not load ns-3: the first run on `ns3` does (about 2 s).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chakra_core import hookimpl
from chakra_sim_network_ns3.model import Ns3Config, Ns3Network

if TYPE_CHECKING:
    from chakra_core.contract.registry import NetworkRegistry

__all__ = ["Ns3Config", "Ns3Network"]


@hookimpl
def chakra_sim_register_network(registry: NetworkRegistry) -> None:
    registry.add(Ns3Network)
