"""Local HBM and ASTRA-sim remote-memory model with tensor capacity tracking (`plugin: hbm`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chakra_core import hookimpl
from chakra_sim_memory_hbm.config import HBMConfig
from chakra_sim_memory_hbm.model import HBMMemory

if TYPE_CHECKING:
    from chakra_core.contract.registry import MemoryRegistry

__all__ = ["HBMConfig", "HBMMemory"]


@hookimpl
def chakra_sim_register_memory(registry: MemoryRegistry) -> None:
    registry.add(HBMMemory)

